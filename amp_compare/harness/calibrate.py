"""How steady the machine was: a short fixed CPU workload timed before the matrix, after every cell and after.

`check(when)` times a 256x256 float32 numpy matmul (20 products a round, 7 rounds, ~10-60 ms in all) in
the parent, before the matrix and after every cell, while no child runs, and returns one check: the median
round in milliseconds and the spread of its rounds. The manifest keeps every check (`calibrations`) and, as
before, the first and the last in its environment (`calibration_before_ms` / `calibration_after_ms`, with
their spreads).

`steadiness` judges the run from all of its checks, against nothing but themselves (no idle reference
of the CPU is needed): the machine was *busy* when the rounds of one check varied by more than UNSTEADY
(another process took the cores for part of it), and its speed *changed* when the checks' medians differ
by more than UNSTEADY between cells. Either marks every speed ratio of the run (harness/stats.py). A
slowdown that began and ended inside one cell, between two checks, is not seen: the sentence says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

SIZE = 256
REPS_PER_ROUND = 20
ROUNDS = 7
UNSTEADY = 0.25  # rounds of one check, or checks between cells, differing by more than this: not steady


def check(when: str) -> dict[str, object]:
    """One calibration: {"when", "ms" (median round), "spread" ((p90 - p10) / median of the rounds)}."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    b = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    a @ b  # warm the BLAS threads
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(REPS_PER_ROUND):
            a @ b
        rounds.append((time.perf_counter() - start) * 1e3)
    r = np.asarray(rounds)
    return {"when": when, "ms": round(float(np.median(r)), 3),
            "spread": round(float((np.percentile(r, 90) - np.percentile(r, 10)) / np.median(r)), 3)}


def environment_entries(first: dict, last: dict) -> dict[str, float]:
    """The first and the last check as the manifest's environment has always held them."""
    return {"calibration_before_ms": first["ms"], "calibration_before_spread": first["spread"],
            "calibration_after_ms": last["ms"], "calibration_after_spread": last["spread"]}


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
