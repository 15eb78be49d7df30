"""A paired accuracy change in words, under the name numerics.py calls it by: phrases.accuracy, the verdict's."""

from __future__ import annotations

from amp_compare.harness.report.phrases import accuracy as accuracy_text  # noqa: F401
