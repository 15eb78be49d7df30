"""The Memory words: a mixed precision's peak-memory difference against fp32, resolved only where every seed's paired
difference exceeds the larger max−min spread of fp32's and its own seeds (one seed: resolution unknown)."""

from __future__ import annotations

import numpy as np

MIB = 2**20


def _both(pairs) -> list[tuple[float, float]]:
    """(fp32, mixed) peak memory in bytes of the (fp32 row, mixed row) pairs that recorded both."""
    return [(a.peak_memory_bytes, b.peak_memory_bytes) for a, b in pairs
            if np.isfinite(a.peak_memory_bytes) and np.isfinite(b.peak_memory_bytes)]


def resolution_mib(pairs) -> float:
    """The larger max−min peak memory (MiB) of fp32's and the mixed precision's seeds; NaN under two pairs."""
    both = _both(pairs)
    return float(np.ptp(both, axis=0).max()) / MIB if len(both) >= 2 else float("nan")


def paired_difference_mib(pairs) -> float:
    """The median over seeds of mixed − fp32 peak memory (MiB)."""
    diffs = [(b - a) / MIB for a, b in _both(pairs)]
    return float(np.median(diffs)) if diffs else float("nan")


def weakest_difference_mib(pairs) -> float:
    """The seeds' paired difference (MiB) nearest 0, or 0 where they point both ways: what `resolved` judges."""
    diffs = [(b - a) / MIB for a, b in _both(pairs)]
    if not diffs:
        return float("nan")
    return 0.0 if min(diffs) < 0 < max(diffs) else min(diffs, key=abs)


def resolved(difference: float, resolution: float) -> float:
    """1.0 where a difference exceeds the run's resolution, 0.0 where not or unknown, NaN where none was measured."""
    return float("nan") if not np.isfinite(difference) else float(np.isfinite(resolution)
                                                                   and abs(difference) > resolution)


def unresolved(r) -> bool:
    """Whether a row of the full table measured a memory difference the run does not resolve."""
    known = getattr(r, "memory_resolved", float("nan"))
    return bool(np.isfinite(known) and known != 1.0)
