"""The numbers a reader sees first: one table and a few sentences, computed from the records.

`summary_table` and `findings` are pure functions of the run table; the HTML report, the
Markdown summary and the terminal table all call them, so the three always agree.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from common.config import display_order
from common.config import framework_label as _label
from common.env import cpu_half_precision_verdict
from common.perf import bound_verdicts, timing_note

GROUP = ["framework", "model", "dataset", "precision"]
LOOP = ["step_loop", "batch_size"]  # plain/tuned step and batch size: a cell's fp32 is at the same two
MIB = 2**20


def ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"] if "status" in runs else runs.iloc[0:0]


def _q(p: float):
    return lambda s: float(np.percentile(s, p))


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Medians over seeds per (machine x) framework x model x dataset x precision, with interquartile ranges
    and ratios to that framework's fp32. Accuracy changes are paired by seed before the median."""
    ok = with_loop_columns(ok_runs(runs).copy())
    group = (["machine"] if "machine" in ok else []) + GROUP[:-1] + LOOP + GROUP[-1:]
    cols = group + ["runs", "throughput_img_s", "throughput_q1", "throughput_q3", "speedup_vs_fp32",
                    "peak_memory_mib", "memory_change_vs_fp32", "val_accuracy", "accuracy_q1", "accuracy_q3",
                    "accuracy_change_pp", "accuracy_change_q1", "accuracy_change_q3", "skipped_steps",
                    *PERF_COLS]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    base_keys = [c for c in group if c != "precision"]
    fp32 = ok[ok["precision"] == "fp32"].set_index(base_keys + ["seed"])["final_val_accuracy"]
    paired = ok.set_index(base_keys + ["seed"]).index.map(lambda k: fp32.get(k, np.nan))
    ok["accuracy_change_pp"] = (ok["final_val_accuracy"].to_numpy() - np.asarray(paired, dtype=float)) * 100
    agg = ok.groupby(group, sort=False, dropna=False).agg(
        runs=("seed", "size"),
        throughput_img_s=("throughput_img_s", "median"),
        throughput_q1=("throughput_img_s", _q(25)),
        throughput_q3=("throughput_img_s", _q(75)),
        peak_memory_bytes=("peak_memory_bytes", "median"),
        val_accuracy=("final_val_accuracy", "median"),
        accuracy_q1=("final_val_accuracy", _q(25)),
        accuracy_q3=("final_val_accuracy", _q(75)),
        accuracy_change_pp=("accuracy_change_pp", "median"),
        accuracy_change_q1=("accuracy_change_pp", _q(25)),
        accuracy_change_q3=("accuracy_change_pp", _q(75)),
        skipped_steps=("skipped_steps", "median"),
        **{c: (c, "median") for c in PERF_MEDIANS},
        peak_dtype=("peak_dtype", "first"),
    ).reset_index()
    agg["peak_memory_mib"] = agg["peak_memory_bytes"] / MIB
    base = agg[agg["precision"] == "fp32"].set_index(base_keys)
    key = pd.MultiIndex.from_frame(agg[base_keys])

    def baseline(col: str) -> np.ndarray:
        return base[col].reindex(key).to_numpy(dtype=float) if not base.empty else np.full(len(agg), np.nan)

    agg["speedup_vs_fp32"] = agg["throughput_img_s"] / baseline("throughput_img_s")
    agg["memory_change_vs_fp32"] = agg["peak_memory_bytes"] / baseline("peak_memory_bytes") - 1.0
    agg["timing_note"] = [timing_note(w, m) for w, m in zip(agg["throughput_img_s"],
                                                             agg["median_step_throughput_img_s"])]
    agg["bound"] = bound_verdicts(agg, group)
    agg = agg.sort_values([*group[:-6], "model", "dataset", "step_loop", "batch_size", "framework", "precision"],
                          key=display_order)
    return agg[cols].reset_index(drop=True)


# Per-cell performance columns (issue 13): medians over seeds, from the run table (common/child.py).
PERF_MEDIANS = ["median_step_throughput_img_s", "compile_warmup_s", "flops_per_image", "achieved_flops",
                "peak_flops_measured", "peak_flops_table", "mfu_measured", "mfu_table"]
PERF_COLS = [*PERF_MEDIANS, "peak_dtype", "timing_note", "bound"]


def with_loop_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """step_loop and batch_size columns, and the performance columns, on runs recorded before them too."""
    if "step_loop" not in runs:
        runs["step_loop"] = runs["cfg_step"] if "cfg_step" in runs else "plain"
    runs["batch_size"] = runs["cfg_batch_size"] if "cfg_batch_size" in runs else np.nan
    for col in PERF_MEDIANS:
        if col not in runs:
            runs[col] = np.nan
    if "peak_dtype" not in runs:
        runs["peak_dtype"] = ""
    return runs


def formatted_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The summary table as display strings (HTML, Markdown and terminal use this one)."""
    def fmt(value, spec, suffix=""):
        return "n/a" if value is None or not np.isfinite(value) else f"{value:{spec}}{suffix}"

    def spread(r, median, q1, q3, spec, scale=1.0, suffix=""):
        text = fmt(median * scale, spec, suffix)
        if r.runs > 1 and np.isfinite(q1) and np.isfinite(q3):
            text += f" [{q1 * scale:{spec}}–{q3 * scale:{spec}}]"
        return text

    rows = []
    multi = "machine" in table and table["machine"].nunique() > 1
    for r in table.itertuples():
        rows.append({
            **({"Machine": r.machine} if multi else {}),
            "Framework": _label(r.framework),
            "Model": r.model,
            "Dataset": r.dataset,
            "Step": r.step_loop,
            "Batch": fmt(r.batch_size, ".0f"),
            "Precision": r.precision,
            "Runs": str(r.runs),
            "Images/s": spread(r, r.throughput_img_s, r.throughput_q1, r.throughput_q3, ",.0f"),
            "Images/s (median step)": fmt(r.median_step_throughput_img_s, ",.0f"),
            "Speed vs fp32": fmt(r.speedup_vs_fp32, ".2f", "×"),
            "Peak memory (MiB)": fmt(r.peak_memory_mib, ",.1f"),
            "Memory vs fp32": fmt(r.memory_change_vs_fp32 * 100, "+.0f", "%"),
            "Val. accuracy": spread(r, r.val_accuracy, r.accuracy_q1, r.accuracy_q3, ".1f", 100, "%"),
            "Δ accuracy vs fp32": spread(r, r.accuracy_change_pp, r.accuracy_change_q1, r.accuracy_change_q3,
                                         "+.1f", 1, " pp"),
            "Skipped steps": fmt(r.skipped_steps, ".0f"),
            "GFLOP/image": fmt(r.flops_per_image / 1e9, ".3g"),
            "Achieved TFLOP/s": fmt(r.achieved_flops / 1e12, ".3g"),
            "Peak TFLOP/s (measured)": fmt(r.peak_flops_measured / 1e12, ".3g") + f" {r.peak_dtype}".rstrip(),
            "MFU": fmt(r.mfu_measured * 100, ".1f", "%"),
            **({"MFU (data-sheet peak)": fmt(r.mfu_table * 100, ".1f", "%")}
               if table["mfu_table"].notna().any() else {}),
            "Bound": r.bound,
            "Compile/warm-up (s)": fmt(r.compile_warmup_s, ".2f"),
            "Timing note": r.timing_note or "—",
        })
    return pd.DataFrame(rows)


def findings(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict) -> list[str]:
    """Three to six sentences, each built from measured numbers of this run."""
    table = summary_table(runs)
    out: list[str] = []
    if table.empty:
        return ["No cell finished, so there is nothing to compare yet; see the failed cells below."]
    # Speed, per framework.
    for fw, group in table.groupby("framework", sort=False):
        mixed = group[group["precision"] != "fp32"]
        fp32 = group[group["precision"] == "fp32"]
        if mixed.empty or fp32.empty:
            continue
        parts = [f"{r.precision} at {r.speedup_vs_fp32:.2f}× ({r.throughput_img_s:,.0f} images/s)"
                 for r in mixed.itertuples()]
        out.append(f"{_label(fw)}: against fp32's {fp32['throughput_img_s'].iloc[0]:,.0f} images/s, "
                   f"{' and '.join(parts)}.")
    slower = table[(table["precision"] != "fp32") & (table["speedup_vs_fp32"] < 1)]
    devices = set(runs.get("cfg_device", pd.Series(dtype=str)).dropna())
    one_machine = "machine" not in runs or runs["machine"].nunique() <= 1
    if not slower.empty and devices == {"cpu"} and one_machine:
        out.append(f"Mixed precision was slower than fp32 in {len(slower)} of "
                   f"{int((table['precision'] != 'fp32').sum())} mixed cells. "
                   + cpu_half_precision_verdict(environment))
    # Memory.
    mem = table[(table["precision"] != "fp32") & table["memory_change_vs_fp32"].notna()]
    if not mem.empty:
        kinds = ", ".join(sorted(set(ok_runs(runs)["memory_kind"].dropna())))
        parts = [f"{_label(r.framework)} {r.precision} {r.memory_change_vs_fp32:+.0%}" for r in mem.itertuples()]
        out.append(f"Peak memory against fp32 ({kinds}): {', '.join(parts)}.")
    # Accuracy.
    acc = table[(table["precision"] != "fp32") & table["accuracy_change_pp"].notna()]
    if not acc.empty:
        worst = acc.loc[acc["accuracy_change_pp"].abs().idxmax()]
        if abs(worst.accuracy_change_pp) < 1e-9:
            per_fw = ", ".join(f"{_label(r.framework)} {r.val_accuracy:.1%}"
                               for r in acc.drop_duplicates("framework").itertuples())
            out.append(f"Final validation accuracy was identical to fp32's in every mixed cell ({per_fw}): "
                       "on this task half precision cost no accuracy.")
        else:
            out.append(f"The largest accuracy change against fp32 was {worst.accuracy_change_pp:+.1f} percentage "
                       f"points ({_label(worst.framework)} {worst.precision}: {worst.val_accuracy:.1%}); "
                       f"every mixed cell was within {abs(worst.accuracy_change_pp):.1f} points of its fp32.")
    # Loss scaling.
    fp16 = steps[steps["precision"] == "fp16"] if not steps.empty else steps
    if not fp16.empty:
        parts = []
        for fw, g in fp16.groupby("framework", sort=False):
            last = g.sort_values("step")["loss_scale"].iloc[-1]
            parts.append(f"{_label(fw)} skipped {int(g['skipped'].sum())} of {len(g)} steps and ended at "
                         f"scale 2^{np.log2(last):.0f}")
        out.append("Dynamic loss scaling (fp16): " + "; ".join(parts) + ".")
    diverged = runs[runs["status"] == "diverged"] if "status" in runs else runs.iloc[0:0]
    for r in diverged.itertuples():
        out.insert(0, f"{_label(r.framework)} {r.precision} (seed {r.seed}) diverged: {r.error}.")
    return out[:6]
