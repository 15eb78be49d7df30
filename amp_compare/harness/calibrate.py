"""How steady the machine is: a short fixed CPU workload timed before and after the matrix.

`measure(when)` times a 256x256 float32 numpy matmul (repeated to ~a few ms a round) for a few
rounds and returns environment entries for the manifest: the median round in milliseconds and the
spread of the rounds. Comparing "before" with "after" shows whether the machine's speed changed
while the cells ran (another process started, a clock throttled); `drift` turns the two into one
number that harness/stats.py uses to mark every speed ratio of an unsteady run.
"""

from __future__ import annotations

import time

import numpy as np

SIZE = 256
REPS_PER_ROUND = 20
ROUNDS = 7


def measure(when: str) -> dict[str, float]:
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
    return {f"calibration_{when}_ms": round(float(np.median(r)), 3),
            f"calibration_{when}_spread": round(float((np.percentile(r, 90) - np.percentile(r, 10)) / np.median(r)), 3)}


def drift(environment: dict) -> float | None:
    """Relative change of the calibration between before and after the matrix (None: not measured)."""
    before, after = environment.get("calibration_before_ms"), environment.get("calibration_after_ms")
    if not before or not after:
        return None
    return abs(float(after) - float(before)) / min(float(after), float(before))


def describe(environment: dict) -> str | None:
    """One sentence on the calibration, or None when the run has none."""
    before, after = environment.get("calibration_before_ms"), environment.get("calibration_after_ms")
    if not before or not after:
        return None
    change = drift(environment)
    spread = max(float(environment.get("calibration_before_spread", 0)),
                 float(environment.get("calibration_after_spread", 0)))
    verdict = ("the machine's speed changed during the run, so speed ratios are unreliable"
               if change is not None and change > 0.25 else "the machine's speed held steady")
    return (f"Machine steadiness: a fixed {SIZE}×{SIZE} matmul calibration took {float(before):.1f} ms before the "
            f"matrix and {float(after):.1f} ms after ({change:.0%} apart; rounds within {spread:.0%}): {verdict}.")
