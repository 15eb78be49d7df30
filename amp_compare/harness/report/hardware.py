"""Measuring the hardware, not the loop: what the report says of the step loops, the batch-size sweep and the
bound verdict (the run side expands the matrix over them: harness/run/compare.py expand_cells).

* `--step plain|tuned` (or `plain,tuned`, both side by side): plain is the tutorial loop, eager with the
  framework's default optimizer; tuned is what the framework offers to go fast: torch's fused optimizer
  (GradScaler's found_inf stays on the device) and torch.compile, in mode "reduce-overhead" (CUDA
  graphs) on a GPU and the default inductor mode on a CPU (CUDA graphs do not exist there); Keras
  jit_compile=True (XLA). plain is the default: it is the loop a user writes from the tutorials, so
  the default report answers "what does AMP give me", and tuned shows how much of that is the loop.
* `--batch-sizes 64,256,1024`: every cell at each batch size (the batch size joins the cell id).
* verdict per cell, from the measured numbers (`bound_verdicts`), its rule named where no sweep ran.
* one FLOP/s ceiling per device and dtype for the whole run, both frameworks' MFU measured against it
  (`with_run_ceiling`, `ceiling_sentences`).
This module never imports a framework.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from amp_compare.contract.env import ARITHMETIC_FLAGS, AVX512_FOUNDATION
from amp_compare.contract.log_words import HALF_FALLBACK

TIMING_GAP = 0.10  # wall-time vs median-step throughput gap the report calls out
HOST_BOUND_GAIN = 1.2  # throughput rising more than this from one batch size to the next: fixed per-step cost
COMPUTE_BOUND_MFU = 0.5  # achieved FLOP/s at least half the run's measured matmul ceiling


def log_line_flags(text: str, flags: str) -> str:
    """The CPU's own flags to set beside a framework's log line that names an instruction set ("" for any other
    line): oneDNN's "supports DT_HALF only on platforms with AVX-512" is quoted as the framework's record of the
    path it took, and beside it which AVX-512 and float16-arithmetic flags this CPU lists, side by side, without
    reading into the line which of them it meant (no record says)."""
    if HALF_FALLBACK not in text:
        return ""
    listed = {f.strip() for f in str(flags or "").split(",")}
    family = (AVX512_FOUNDATION, *ARITHMETIC_FLAGS["float16"])
    has = [f for f in family if f in listed]
    lacks = [f for f in family if f not in listed]
    if not has:
        return f"beside it, this CPU's flags list none of {', '.join(lacks)}"
    return f"beside it, this CPU's flags list {', '.join(has)}" + (f" but not {' or '.join(lacks)}" if lacks else "")


def _text(table: pd.DataFrame, column: str) -> pd.Series:
    return table[column].fillna("").astype(str) if column in table else pd.Series("", index=table.index)


def on_fp32_ceiling(table: pd.DataFrame) -> pd.Series:
    """Which cells' half format is measured against the fp32 matmul's ceiling for want of its arithmetic here
    (kit/ceiling.ceiling_choice records it: ceiling_fp32_for set, no ceiling_isa_limit)."""
    return (_text(table, "ceiling_fp32_for") != "") & (_text(table, "ceiling_isa_limit") == "")


def ceiling_limits(table: pd.DataFrame) -> pd.Series:
    """Per cell, the variables that kept its half format from the frameworks ("ONEDNN_MAX_CPU_ISA=AVX2"), so that
    it is measured against the fp32 ceiling; "" where none did."""
    return _text(table, "ceiling_isa_limit")


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


MFU_RULE = f"MFU ≥ {COMPUTE_BOUND_MFU:.0%}, no --batch-sizes sweep"


def bound_verdicts(table: pd.DataFrame, keys: list[str]) -> pd.Series:
    """host-bound / compute-bound per row, from measured numbers only, each verdict naming its rule.

    With a larger batch size of the same cell measured: host-bound if its throughput rose by more than
    HOST_BOUND_GAIN (a per-step cost that does not grow with the batch dominated: Python, kernel
    launches, syncs), else compute-bound (the device's work per image sets the pace; that work may be
    math or memory traffic). The largest batch: compute-bound if throughput had already levelled off
    from the batch below it. Without a sweep the batch size says nothing: "compute-bound (MFU ≥ 50%, …)"
    where MFU against the run's ceiling reaches COMPUTE_BOUND_MFU (and no more than 100%: above it the matmul
    timed is not the path's ceiling), with that rule beside it, else "undetermined (…run --batch-sizes)".
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
            elif np.isfinite(row.get("mfu_measured", np.nan)) and row["mfu_measured"] > 1:
                # faster than the matmul timed as its ceiling: that matmul is not this path's ceiling, so no MFU rule
                out[i] = "undetermined (MFU above 100%: the ceiling is not this path's; run --batch-sizes)"
            elif np.isfinite(row.get("mfu_measured", np.nan)) and row["mfu_measured"] >= COMPUTE_BOUND_MFU:
                out[i] = f"compute-bound ({MFU_RULE})"
    return out


# ---- one FLOP/s ceiling per device and dtype, both frameworks measured against it ------------------------

def _ceiling_key(runs: pd.DataFrame) -> list[str]:
    return [k for k in ("machine", "device_name") if k in runs]


def _base_dtype(runs: pd.DataFrame) -> pd.Series:
    """The dtype of each cell's ceiling matmul: fp32 where its half format is measured against it."""
    return _text(runs, "ceiling_dtype").where(_text(runs, "ceiling_fp32_for") == "", "fp32")


def with_run_ceiling(runs: pd.DataFrame) -> pd.DataFrame:
    """Each cell's MFU against its run's ceiling: the best ceiling_flops_measured of any cell of the run (both
    frameworks, every precision) on the same device in the same ceiling dtype ("fp32 (no bf16 arithmetic)" is
    fp32). Each child times the same matmul size (kit/ceiling.py SIZES) in its own framework; the best of them
    is the one rate the device was seen to reach, so MFU compares the frameworks on one ceiling rather than
    each against its own matmul. Adds ceiling_flops; mfu_measured is recomputed from it."""
    runs = runs.copy()
    if "ceiling_dtype" in runs:
        runs["ceiling_dtype"] = runs["ceiling_dtype"].fillna("").astype(str)  # a cell without one prints nothing
    if "ceiling_flops_measured" not in runs or "ceiling_dtype" not in runs:
        runs["ceiling_flops"] = np.nan
        return runs
    base = _base_dtype(runs)
    keys = [runs[k].astype(str) for k in _ceiling_key(runs)] + [base]
    best = runs["ceiling_flops_measured"].astype(float).groupby(keys).transform("max")
    runs["ceiling_flops"] = best.where(base != "")
    if "achieved_flops" in runs:
        runs["mfu_measured"] = runs["achieved_flops"].astype(float) / runs["ceiling_flops"]
    return runs


def _three_digits(value: float) -> str:
    """Three significant digits, trailing zeros kept (0.190 beside 0.192, not 0.19)."""
    return f"{value:#.3g}".rstrip(".")


def ceiling_sentences(runs: pd.DataFrame) -> list[str]:
    """Per device and ceiling dtype: the run's ceiling, the matmul it came from and each framework's own best."""
    from amp_compare.contract.config import framework_label

    if "ceiling_flops_measured" not in runs or runs["ceiling_flops_measured"].notna().sum() == 0:
        return []
    runs = runs[runs["ceiling_flops_measured"].notna()].copy()
    runs["_dtype"] = _base_dtype(runs)
    out = []
    for key, g in runs.groupby([*_ceiling_key(runs), "_dtype"], sort=False):
        sizes = sorted({int(v) for v in g.get("ceiling_matmul_size", pd.Series(dtype=float)).dropna()})
        size = (f"{sizes[0]}×{sizes[0]} matmul" if len(sizes) == 1 else
                f"square matmul of {sizes[0]} to {sizes[-1]} (cells recorded before one size was fixed)" if sizes
                else "matmul")
        own = ", ".join(f"{framework_label(fw)} {_three_digits(f.max() / 1e12)}"
                        for fw, f in g.groupby("framework", sort=False)["ceiling_flops_measured"])
        device = f" on {key[-2]}" if len(key) > 1 and str(key[-2]) not in ("", "cpu") else ""
        # a cell may reuse an earlier cell's timing (kit/reuse.py): the same value, counted once
        timings = len(g.drop_duplicates(["framework", "ceiling_flops_measured"]))
        made = (f"of the run's {len(g)} timings of a {size}, one per cell" if timings == len(g) else
                f"of the run's {timings} timing{'s' if timings > 1 else ''} of a {size}, which its {len(g)} cells "
                "share")
        best = _three_digits(g["ceiling_flops_measured"].max() / 1e12)
        out.append(f"MFU is measured against one ceiling per device and dtype, the same for every framework: "
                   f"{key[-1]}{device} {best} TFLOP/s, the best {made} (each framework's own best: {own}).")
    return out
