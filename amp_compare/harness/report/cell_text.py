"""The ⚠ mark beside a ratio the run cannot support, and a paired accuracy change as phrases.accuracy words it."""

from __future__ import annotations

from amp_compare.harness.report.phrases import accuracy as accuracy_text  # noqa: F401  (its callers' name)


def mark(note) -> str:
    return " ⚠" if isinstance(note, str) and note else ""
