"""Where render.py imports it from: the findings' sentences live in numerics.py."""
from amp_compare.harness.report.numerics import finding_parts  # noqa: F401
