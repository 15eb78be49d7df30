"""The Memory words: a mixed precision's peak-memory difference against fp32, resolved only where every seed's paired
difference exceeds the larger max−min spread of fp32's and its own seeds (one seed: resolution unknown)."""

from __future__ import annotations

import numpy as np

MIB = 2**20


def paired_difference(pairs) -> tuple[float, float, float]:
    """Of (fp32 row, mixed row) pairs: the median mixed − fp32 peak (MiB), the resolution (the larger max−min peak of
    either side's seeds; NaN under two pairs) and whether the difference is past it (1.0, 0.0; NaN: unmeasured)."""
    both = [(a.peak_memory_bytes, b.peak_memory_bytes) for a, b in pairs
            if np.isfinite(a.peak_memory_bytes) and np.isfinite(b.peak_memory_bytes)]
    resolution = float(np.ptp(both, axis=0).max()) / MIB if len(both) >= 2 else float("nan")
    if not (diffs := [(b - a) / MIB for a, b in both]):
        return float("nan"), resolution, float("nan")
    weakest = 0.0 if min(diffs) < 0 < max(diffs) else min(diffs, key=abs)
    return float(np.median(diffs)), resolution, float(np.isfinite(resolution) and abs(weakest) > resolution)
