"""The parent process: CLI, planning, runner, report. No child-side module imports this package."""
