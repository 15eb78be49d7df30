"""How steady the machine was: a short fixed CPU workload timed before the matrix, after every cell and after.

`check(when)` times a 256x256 float32 numpy matmul (20 products a round, 7 rounds, ~10-60 ms in all) in
the parent, before the matrix and after every cell, while no child runs, and returns one check: the median
round in milliseconds and the spread of its rounds. The manifest keeps every check (`calibrations`) and, as
before, the first and the last in its environment (`calibration_before_ms` / `calibration_after_ms`, with
their spreads).

The report judges the run's steadiness from these checks (harness/report/steadiness.py).
"""

from __future__ import annotations

import time

import numpy as np

from amp_compare.harness.common import REPS_PER_ROUND, ROUNDS, SIZE


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


