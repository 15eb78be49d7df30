"""The Memory words: a peak-memory difference against fp32 only where the run resolves it.

A peak-memory reading is noisy (on a CPU the process's resident memory above its baseline: the allocator and
the framework's workspaces move it by tens of MiB between identical cells), and a small baseline turns that
noise into ratios of +100% or more. The run measures its own resolution: cells that ran the same framework,
model, dataset, loop and precision with other seeds should use the same memory, so the largest spread among
them is what the run cannot tell apart. A mixed cell's difference from fp32 (the median over seeds of each
seed's mixed minus fp32, in MiB) smaller than that is said to be unresolved, not printed as a percentage.

A group run with one seed has no identical cells of its own: it takes the largest spread the same framework's
identical cells showed anywhere else in the run (the allocator's noise is the process's, not the model's), and
where the run has none at all its resolution is unknown and its difference unresolved too: one reading per
precision cannot tell a difference from noise (two default runs read one ViT's 2.6 MiB baseline as +120% and
-72%). `status` is the one rule; the verdict table (verdicts.MEMORY) and the figures say what it says.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MIB = 2**20


def resolution_mib(group: pd.DataFrame) -> float:
    """The largest max−min peak memory (MiB) among identical cells (one precision over its seeds) of one
    framework's comparison group; NaN where no precision ran two seeds with a reading."""
    spreads = [float(v.max() - v.min()) / MIB for _, v in group.groupby("precision")["peak_memory_bytes"]
               if v.notna().sum() >= 2]
    return max(spreads, default=float("nan"))


def resolutions(ok: pd.DataFrame, keys: list[str]) -> dict[tuple, tuple[float, str]]:
    """{group key: (resolution in MiB, where it was measured)} for every comparison group of the ok run table
    (`keys` ends in "framework"): the group's own identical cells, else the same framework's largest spread in the
    rest of the run ("other" basis), else NaN (no identical cells anywhere)."""
    own = {k if isinstance(k, tuple) else (k,): resolution_mib(g)
           for k, g in ok.groupby(keys, sort=False, dropna=False)} if not ok.empty else {}
    per_framework: dict[str, float] = {}
    for key, value in own.items():
        if np.isfinite(value):
            per_framework[key[-1]] = max(value, per_framework.get(key[-1], 0.0))
    return {key: (value, "own") if np.isfinite(value) else (per_framework.get(key[-1], float("nan")), "other")
            for key, value in own.items()}


def paired_difference_mib(pairs) -> float:
    """The median over seeds of mixed − fp32 peak memory (MiB), from (fp32 row, mixed row) pairs."""
    diffs = [(b.peak_memory_bytes - a.peak_memory_bytes) / MIB for a, b in pairs
             if np.isfinite(a.peak_memory_bytes) and np.isfinite(b.peak_memory_bytes)]
    return float(np.median(diffs)) if diffs else float("nan")


def resolved(difference: float, resolution: float) -> float:
    """The one rule: 1.0 where a difference exceeds the run's resolution, 0.0 where it does not or where the
    resolution is unknown (one seed and no identical cells anywhere in the run), NaN where no difference was
    measured (a float, so the column survives the table's merges as one dtype)."""
    if not np.isfinite(difference):
        return float("nan")
    return float(np.isfinite(resolution) and abs(difference) > resolution)


def status(r) -> str:
    """"resolved", "unresolved" or "" (nothing measured) for a row of the full table: every memory sentence,
    cell and bar label is chosen by this."""
    known = getattr(r, "memory_resolved", float("nan"))
    return "" if not np.isfinite(known) else "resolved" if known == 1.0 else "unresolved"


def unresolved(r) -> bool:
    return status(r) == "unresolved"
