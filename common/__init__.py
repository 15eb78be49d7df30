"""Framework-free half of amp-compare: config, data, records, runner, report, CLI."""
