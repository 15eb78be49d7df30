"""Measuring the hardware, not the loop: the step loops, the batch-size sweep and the bound verdict.

* `--step plain|tuned` (or `plain,tuned`, both side by side): plain is the tutorial loop, eager with the
  framework's default optimizer; tuned is what the framework offers to go fast: torch's fused optimizer
  (GradScaler's found_inf stays on the device) and torch.compile, in mode "reduce-overhead" (CUDA
  graphs) on a GPU and the default inductor mode on a CPU (CUDA graphs do not exist there); Keras
  jit_compile=True (XLA). plain is the default: it is the loop a user writes from the tutorials, so
  the default report answers "what does AMP give me", and tuned shows how much of that is the loop.
* `--batch-sizes 64,256,1024`: every cell at each batch size (the batch size joins the cell id).
* verdict per cell, from the measured numbers (`bound_verdicts`).
This module never imports a framework.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from amp_compare.contract.config import STEPS, ConfigError, RunConfig

TIMING_GAP = 0.10  # wall-time vs median-step throughput gap the report calls out
HOST_BOUND_GAIN = 1.2  # throughput rising more than this from one batch size to the next: fixed per-step cost
COMPUTE_BOUND_MFU = 0.5  # achieved FLOP/s at least half the measured matmul peak


def parse_batch_sizes(text: str | None) -> list[int]:
    if text is None:
        return []
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise ConfigError(f"--batch-sizes must be comma-separated positive integers (e.g. 64,256,1024), got {text!r}")
    return sorted(set(sizes))


def parse_steps(text: str) -> list[str]:
    steps = [s.strip() for s in str(text).split(",") if s.strip()]
    for step in steps or [""]:
        if step not in STEPS:
            raise ConfigError(f"unknown step {step!r} (valid: {', '.join(STEPS)}, or plain,tuned)")
    return list(dict.fromkeys(steps))


def expand_cells(cells: list[RunConfig], step: str, batch_sizes: str | None) -> list[RunConfig]:
    """The matrix times the step loops times the batch sizes (cli.plan_compare calls this)."""
    steps, sizes = parse_steps(step), parse_batch_sizes(batch_sizes)
    out = []
    for cfg in cells:
        for size in sizes or [cfg.batch_size]:
            for s in steps:
                out.append(dataclasses.replace(cfg, step=s, batch_size=size, batch_sweep=bool(sizes)))
    return out


def timing_note(wall: float, median: float) -> str:
    """The wall-time headline against the median-step figure: empty within TIMING_GAP, else what it means."""
    if not (np.isfinite(wall) and np.isfinite(median) and median > 0):
        return ""
    gap = 1 - wall / median
    if abs(gap) <= TIMING_GAP:
        return ""
    if gap > 0:
        return f"wall {gap:.0%} below median step: stalled steps (host syncs, allocator, GC, busy machine)"
    return f"wall {-gap:.0%} above median step: uneven step times (a noisy machine)"


def bound_verdicts(table: pd.DataFrame, keys: list[str]) -> pd.Series:
    """host-bound / compute-bound per row, from measured numbers only.

    With a larger batch size of the same cell measured: host-bound if its throughput rose by more than
    HOST_BOUND_GAIN (a per-step cost that does not grow with the batch dominated: Python, kernel
    launches, syncs), else compute-bound (the device's work per image sets the pace; that work may be
    math or memory traffic). The largest batch: compute-bound if throughput had already levelled off
    from the batch below it, or if MFU against the measured matmul peak reaches COMPUTE_BOUND_MFU;
    else "undetermined (run --batch-sizes)" (or a larger batch).
    """
    out = pd.Series("undetermined (run --batch-sizes)", index=table.index, dtype=object)
    group = [k for k in keys if k != "batch_size" and k in table]
    for _, g in table.groupby(group, sort=False, dropna=False) if group else [(None, table)]:
        g = g.sort_values("batch_size")
        thr = g["throughput_img_s"].to_numpy(dtype=float)
        for k, (i, row) in enumerate(g.iterrows()):
            if k + 1 < len(g) and thr[k] > 0 and np.isfinite(thr[k + 1]):
                out[i] = "host-bound" if thr[k + 1] / thr[k] > HOST_BOUND_GAIN else "compute-bound"
            elif k > 0 and thr[k - 1] > 0 and thr[k] / thr[k - 1] <= HOST_BOUND_GAIN:
                out[i] = "compute-bound"  # the largest batch, already past where throughput levelled off
            elif np.isfinite(row.get("mfu_measured", np.nan)) and row["mfu_measured"] >= COMPUTE_BOUND_MFU:
                out[i] = "compute-bound"
    return out
