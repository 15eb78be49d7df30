"""The host-/compute-bound verdict and the one FLOP/s ceiling per device and dtype that both frameworks' MFU is
measured against. Framework-free."""

from __future__ import annotations

import numpy as np
import pandas as pd

from amp_compare.contract.config import framework_label

TIMING_GAP = 0.10  # wall-time vs median-step throughput gap the report calls out
HOST_BOUND_GAIN = 1.2  # throughput rising more than this from one batch size to the next: fixed per-step cost
COMPUTE_BOUND_MFU = 0.5  # achieved FLOP/s at least half the run's measured matmul ceiling
CEILING_KEYS = ("machine", "device_name")  # what a ceiling is per besides its dtype: the device (and machine, combined)


def _text(table: pd.DataFrame, column: str) -> pd.Series:
    if column not in table:
        return pd.Series("", index=table.index)
    return table[column].astype(object).where(table[column].notna(), "").astype(str)  # missing: "", never "nan"


def ceiling_marks(table: pd.DataFrame) -> tuple[bool, bool]:
    """(a cell on the fp32 ceiling for want of its half format's arithmetic, one under an instruction limit)."""
    limited = _text(table, "ceiling_isa_limit") != ""
    return bool(((_text(table, "ceiling_fp32_for") != "") & ~limited).any()), bool(limited.any())


def timing_note(wall: float, median: float) -> str:
    """The wall-time headline against the median-step figure: empty within TIMING_GAP, else what it means."""
    if not (np.isfinite(wall) and np.isfinite(median) and median > 0) or abs(gap := 1 - wall / median) <= TIMING_GAP:
        return ""
    if gap > 0:
        return f"wall {gap:.0%} below median step: stalled steps (host syncs, allocator, GC, busy machine)"
    return f"wall {-gap:.0%} above median step: uneven step times (a noisy machine)"


def bound_verdicts(table: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Per row: host- or compute-bound from how throughput moved with the batch size, else from MFU."""
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
            elif np.isfinite(mfu := row.get("mfu_measured", np.nan)) and mfu > 1:
                out[i] = "undetermined (MFU above 100%: the ceiling is not this path's; run --batch-sizes)"
            elif np.isfinite(mfu) and mfu >= COMPUTE_BOUND_MFU:
                out[i] = f"compute-bound (MFU ≥ {COMPUTE_BOUND_MFU:.0%}, no --batch-sizes sweep)"
    return out


def _base_dtype(runs: pd.DataFrame) -> pd.Series:
    """The dtype of each cell's ceiling matmul: fp32 where its half format is measured against it."""
    return _text(runs, "ceiling_dtype").where(_text(runs, "ceiling_fp32_for") == "", "fp32")


def with_run_ceiling(runs: pd.DataFrame) -> pd.DataFrame:
    """Adds ceiling_flops, the best ceiling_flops_measured per device and dtype, and mfu_measured."""
    runs = runs.copy()
    if "ceiling_dtype" in runs:
        runs["ceiling_dtype"] = runs["ceiling_dtype"].fillna("").astype(str)
    if "ceiling_flops_measured" not in runs or "ceiling_dtype" not in runs:
        runs["ceiling_flops"] = np.nan
        return runs
    base = _base_dtype(runs)
    keys = [runs[k].astype(str) for k in CEILING_KEYS if k in runs] + [base]
    best = runs["ceiling_flops_measured"].astype(float).groupby(keys).transform("max")
    runs["ceiling_flops"] = best.where(base != "")
    if "achieved_flops" in runs:
        runs["mfu_measured"] = runs["achieved_flops"].astype(float) / runs["ceiling_flops"]
    return runs


def _three_digits(value: float) -> str:
    return f"{value:#.3g}".rstrip(".")


def ceiling_clauses(runs: pd.DataFrame) -> list[str]:
    """Per device and ceiling dtype: the run's ceiling, the matmul it came from and each framework's own best."""
    if "ceiling_flops_measured" not in runs:
        return []
    runs = runs[runs["ceiling_flops_measured"].notna()]
    out = []
    for key, g in runs.groupby([*(k for k in CEILING_KEYS if k in runs), _base_dtype(runs)], sort=False):
        sizes = sorted({int(v) for v in g.get("ceiling_matmul_size", pd.Series(dtype=float)).dropna()})
        size = (f"{sizes[0]}×{sizes[0]} matmul" if len(sizes) == 1 else
                f"square matmul of {sizes[0]} to {sizes[-1]} (cells recorded before one size was fixed)" if sizes
                else "matmul")
        own = ", ".join(f"{framework_label(fw)} {_three_digits(f.max() / 1e12)}"
                        for fw, f in g.groupby("framework", sort=False)["ceiling_flops_measured"])
        device = f" on {key[-2]}" if len(key) > 1 and str(key[-2]) not in ("", "cpu") else ""
        timings = len(g.drop_duplicates(["framework", "ceiling_flops_measured"]))
        made = (f"of the run's {len(g)} timings of a {size}, one per cell" if timings == len(g) else
                f"of the run's {timings} timing{'s' if timings > 1 else ''} of a {size}, which its cells share")
        best = _three_digits(g["ceiling_flops_measured"].max() / 1e12)
        out.append(f"{key[-1]}{device} {best} TFLOP/s, the best {made} (each framework's own best: {own})")
    return out
