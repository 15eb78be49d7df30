"""How steady the machine was, judged from the calibration checks a run recorded (harness/run/calibrate.py
times them).

`steadiness` judges the run from all of its checks, against nothing but themselves (no idle reference
of the CPU is needed): the machine was *busy* when the rounds of one check varied by more than UNSTEADY
(another process took the cores for part of it), and its speed *changed* when the checks' medians differ
by more than UNSTEADY between cells. Either marks every speed ratio of the run (harness/report/stats.py). A
slowdown that began and ended inside one cell, between two checks, is not seen: the sentence says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from amp_compare.harness.common import SIZE, UNSTEADY


def checks_of(environment: dict) -> list[dict]:
    """Every check of a run: its `calibrations` list, or (runs recorded before it) the before/after pair."""
    listed = environment.get("calibrations")
    if isinstance(listed, list) and listed:
        return [c for c in listed if isinstance(c, dict) and c.get("ms")]
    out = []
    for when in ("before", "after"):
        if environment.get(f"calibration_{when}_ms"):
            out.append({"when": when, "ms": float(environment[f"calibration_{when}_ms"]),
                        "spread": float(environment.get(f"calibration_{when}_spread", 0) or 0)})
    return out


@dataclass
class Steadiness:
    checks: int
    low_ms: float
    high_ms: float
    change: float  # largest relative difference between checks' medians: high / low - 1
    spread: float  # largest spread of the rounds within one check
    unsteady: str  # "" when steady; else why, as ⚠ notes say it ("machine busy: …")
    sentence: str


def steadiness(environment: dict) -> Steadiness | None:
    """The run's steadiness from all of its checks (None: fewer than two checks recorded)."""
    checks = checks_of(environment)
    if len(checks) < 2:
        return None
    ms = np.array([float(c["ms"]) for c in checks])
    spread = max(float(c.get("spread", 0) or 0) for c in checks)
    change = float(ms.max() / ms.min() - 1)
    busy, changed = spread > UNSTEADY, change > UNSTEADY
    reasons = ([f"machine busy: rounds of one calibration varied by {spread:.0%}"] if busy else []) + \
              ([f"machine speed changed by {change:.0%} between cells"] if changed else [])
    listed = isinstance(environment.get("calibrations"), list) and environment["calibrations"]
    where = (f"{len(checks)} times, before the matrix and after each cell" if listed else
             "before and after the matrix")
    head = (f"Machine steadiness: a fixed {SIZE}×{SIZE} float32 matmul calibration, timed {where}, took "
            f"{ms.min():.1f}–{ms.max():.1f} ms")
    if busy or changed:
        what = " and ".join(([f"the machine was busy (the rounds of one calibration varied by {spread:.0%})"]
                             if busy else []) + ([f"its speed changed by {change:.0%} between cells"]
                                                 if changed else []))
        sentence = f"{head}: {what}, so every speed ratio and time to target of this run is marked ⚠."
    else:
        sentence = (f"{head}, within {change:.0%} of each other, the rounds of each within {spread:.0%}: the "
                    "machine's speed held steady at every check (a slowdown that came and went inside one "
                    "cell, between two checks, would not show here).")
    return Steadiness(len(checks), float(ms.min()), float(ms.max()), change, spread, "; ".join(reasons), sentence)


def unsteady_reason(environment: dict) -> str:
    """Why the machine was not steady ("" when it was, or when the run has no checks)."""
    s = steadiness(environment)
    return s.unsteady if s else ""


def describe(environment: dict) -> str | None:
    """One sentence on the machine's steadiness, or None when the run has fewer than two checks."""
    s = steadiness(environment)
    return s.sentence if s else None
