"""The Memory words: a peak-memory difference against fp32 only where the run resolves it.

A peak-memory reading is noisy (on a CPU the process's resident memory above its baseline: the allocator and
the framework's workspaces move it by tens of MiB between identical cells), and a small baseline turns that
noise into ratios of +100% or more. The run measures its own resolution: cells that ran the same framework,
model, dataset, loop and precision with other seeds should use the same memory, so the largest spread among
them is what the run cannot tell apart. A mixed cell's difference from fp32 (the median over seeds of each
seed's mixed minus fp32, in MiB) smaller than that is said to be unresolved, not printed as a percentage; one
seed has no identical cells, so its resolution is unknown (and its ratio has no interval: ⚠, as before).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from amp_compare.harness.report.cell_text import mark

MIB = 2**20


def resolution_mib(group: pd.DataFrame) -> float:
    """The largest max−min peak memory (MiB) among identical cells (one precision over its seeds) of one
    framework's comparison group; NaN where no precision ran two seeds with a reading."""
    spreads = [float(v.max() - v.min()) / MIB for _, v in group.groupby("precision")["peak_memory_bytes"]
               if v.notna().sum() >= 2]
    return max(spreads, default=float("nan"))


def paired_difference_mib(pairs) -> float:
    """The median over seeds of mixed − fp32 peak memory (MiB), from (fp32 row, mixed row) pairs."""
    diffs = [(b.peak_memory_bytes - a.peak_memory_bytes) / MIB for a, b in pairs
             if np.isfinite(a.peak_memory_bytes) and np.isfinite(b.peak_memory_bytes)]
    return float(np.median(diffs)) if diffs else float("nan")


def resolved(difference: float, resolution: float) -> float:
    """1.0 where a difference exceeds the run's resolution, 0.0 where it does not, NaN where the resolution is
    unknown (a float, so the column survives the table's merges as one dtype)."""
    if not (np.isfinite(difference) and np.isfinite(resolution)):
        return float("nan")
    return float(abs(difference) > resolution)


def unresolved(r) -> bool:
    return getattr(r, "memory_resolved", float("nan")) == 0.0


def below_resolution_text(resolution: float) -> str:
    return f"below what this run resolves: identical cells differed by up to {resolution:,.1f} MiB"


def cell_text(r) -> str:
    """The summary table's "Memory vs fp32" cell: the change (⚠ where its interval does not support it), or
    that it is unresolved and the resolution it is below."""
    if unresolved(r):
        return f"unresolved (< {r.memory_resolution_mib:,.1f} MiB)"
    change = r.memory_change_vs_fp32
    return ("n/a" if change is None or not np.isfinite(change)
            else f"{change * 100:+.0f}%") + mark(getattr(r, "memory_note", ""))


def finding_text(r) -> str:
    """A mixed cell's peak-memory change in a sentence: with its MiB and 95% interval where resolved."""
    if unresolved(r):
        return f"{r.memory_difference_mib:+,.1f} MiB, {below_resolution_text(r.memory_resolution_mib)}"
    text = f"{r.memory_change_vs_fp32:+.0%}"
    if np.isfinite(getattr(r, "memory_difference_mib", np.nan)):
        text += f" ({r.memory_difference_mib:+,.1f} MiB)"
    if np.isfinite(getattr(r, "memory_low", np.nan)):
        text += f" [95% t over {int(r.runs)} seeds: {r.memory_low:+.0%}, {r.memory_high:+.0%}]"
    return text + mark(getattr(r, "memory_note", ""))


LEGEND = ("Memory vs fp32 \"unresolved (< X MiB)\": the difference from fp32 is smaller than identical cells (the same "
          "framework, model and precision, other seeds) differed by in this run, so the run cannot tell it from "
          "noise.")
