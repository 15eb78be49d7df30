"""How steady the machine was, from the calibration checks a run recorded (harness/run/calibrate.py times
them): the sentence the report prints and the run-wide note for comparisons the per-seed judgement does not
cover. The judgement itself, robust to one hiccup and to a VM's own drift, is harness/report/drift.py.

Speed ratios are not marked from here: each is judged against the drift seen next to its own cells
(drift.seed_note, from tables.speed_statistics). A run-wide note (`unsteady_reason`) remains for what has no
pairing by seed: the data-parallel N vs 1 comparison. The spread of the rounds inside one check is no longer
a verdict: one 31 ms hiccup in 25 checks of 7 rounds said "busy" on every run of an idle VM.
"""

from __future__ import annotations

from amp_compare.harness.common import UNSTEADY
from amp_compare.harness.report import drift
from amp_compare.harness.report.drift import checks_of

__all__ = ["checks_of", "describe", "unsteady_reason"]


def unsteady_reason(environment: dict) -> str:
    """Why the machine was not steady over the whole run ("" when its level, hiccups set aside, stayed within
    UNSTEADY, or when the run has no checks)."""
    return drift.run_note(environment, UNSTEADY)


def describe(environment: dict) -> str | None:
    """One sentence on the machine's drift, or None when the run has fewer than two checks."""
    return drift.describe(environment)
