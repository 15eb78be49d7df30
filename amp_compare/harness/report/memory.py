"""The Memory words: a peak-memory difference against fp32 only where the run resolves it.

A mixed precision's resolution is the larger spread of the cells it is compared over: fp32's seeds and its own
(same framework, model, dataset, loop); its difference is resolved only where every seed's paired difference exceeds
it in the same direction, and the median of those differences is printed. One seed: resolution unknown."""

from __future__ import annotations

import numpy as np

MIB = 2**20


def resolution_mib(pairs) -> float:
    """The larger max−min peak memory (MiB) of fp32's and the mixed precision's seeds, over (fp32 row, mixed row)
    pairs with both readings; NaN under two such pairs."""
    both = [(a.peak_memory_bytes, b.peak_memory_bytes) for a, b in pairs
            if np.isfinite(a.peak_memory_bytes) and np.isfinite(b.peak_memory_bytes)]
    return float(np.ptp(both, axis=0).max()) / MIB if len(both) >= 2 else float("nan")


def paired_differences_mib(pairs) -> list[float]:
    """Each seed's mixed − fp32 peak memory (MiB), from (fp32 row, mixed row) pairs."""
    return [(b.peak_memory_bytes - a.peak_memory_bytes) / MIB for a, b in pairs
            if np.isfinite(a.peak_memory_bytes) and np.isfinite(b.peak_memory_bytes)]


def paired_difference_mib(pairs) -> float:
    """The median over seeds of mixed − fp32 peak memory (MiB), from (fp32 row, mixed row) pairs."""
    diffs = paired_differences_mib(pairs)
    return float(np.median(diffs)) if diffs else float("nan")


def weakest_difference_mib(pairs) -> float:
    """The seeds' paired difference nearest 0, or 0 where they point both ways: what `resolved` judges, so that one
    seed's difference cannot decide for the others."""
    diffs = paired_differences_mib(pairs)
    if not diffs:
        return float("nan")
    return 0.0 if min(diffs) < 0 < max(diffs) else min(diffs, key=abs)


def resolved(difference: float, resolution: float) -> float:
    """1.0 where a difference exceeds the run's resolution, 0.0 where not or unknown, NaN where none was measured."""
    if not np.isfinite(difference):
        return float("nan")
    return float(np.isfinite(resolution) and abs(difference) > resolution)


def unresolved(r) -> bool:
    """Whether a row of the full table measured a memory difference the run does not resolve."""
    known = getattr(r, "memory_resolved", float("nan"))
    return bool(np.isfinite(known) and known != 1.0)
