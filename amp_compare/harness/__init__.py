"""The parent process: run/ (command line, planning, runner) and report/ (reading records, rendering); report/
never imports run/, and no child-side module imports this package."""
