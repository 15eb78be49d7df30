"""The numbers a reader sees first: one table and a few sentences, computed from the records.

`summary_table` and `findings` are pure functions of the run table; the HTML report, the
Markdown summary and the terminal table all call them, so the three always agree.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import display_order
from amp_compare.contract.config import framework_label as _label
from amp_compare.contract.env import cpu_half_precision_verdict
from amp_compare.harness import calibrate, stats
from amp_compare.harness.perf import bound_verdicts, timing_note

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
    fp32 = ok[precisions.is_reference(ok["precision"])].set_index(base_keys + ["seed"])["final_val_accuracy"]
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
    base = agg[precisions.is_reference(agg["precision"])].set_index(base_keys)
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


# Per-cell performance columns (issue 13): medians over seeds, from the run table (kit/child.py).
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


# formatted_summary's hardware-efficiency columns (issue 13): the report shows them in their own table in the
# Speed section (the summary table would not fit the page with them), summary.md keeps them in its one table.
HARDWARE_COLUMNS = ("GFLOP/image", "Achieved TFLOP/s", "Peak TFLOP/s (measured)", "MFU", "MFU (data-sheet peak)",
                    "Bound", "Compile/warm-up (s)", "Timing note")
IDENTITY_COLUMNS = ("Machine", "Framework", "Model", "Dataset", "Step", "Batch", "Precision")


def split_summary(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The formatted summary as (the summary table, the hardware-efficiency table, the loop text): both tables
    with the identity columns, less Step and Batch where every row has the same one (the loop text names it)."""
    # the median-step throughput sits with the timing note that compares it with the wall-time headline
    hardware = [c for c in ("Images/s (median step)", *HARDWARE_COLUMNS) if c in summary]
    constant = [c for c in ("Step", "Batch") if c in summary and summary[c].nunique() == 1]
    loop = {"Step": "{} step loop", "Batch": "batch size {}"}
    text = ", ".join(loop[c].format(summary[c].iloc[0]) for c in constant)
    identity = [c for c in IDENTITY_COLUMNS if c in summary and c not in constant]
    lean = [c for c in identity if c in ("Framework", "Precision") or summary[c].nunique() > 1]  # fits the page
    return summary.drop(columns=hardware + constant), summary[lean + hardware], text


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
            "Speed vs fp32": fmt(r.speedup_vs_fp32, ".2f", "×") + (" ⚠" if getattr(r, "speed_note", "") else ""),
            "Peak memory (MiB)": fmt(r.peak_memory_mib, ",.1f"),
            "Memory vs fp32": fmt(r.memory_change_vs_fp32 * 100, "+.0f", "%"),
            "Val. accuracy": spread(r, r.val_accuracy, r.accuracy_q1, r.accuracy_q3, ".1f", 100, "%"),
            "Δ accuracy vs fp32": (short_accuracy_text(r)
                                   if hasattr(r, "p_value") and precisions.is_mixed(r.precision) else
                                   spread(r, r.accuracy_change_pp, r.accuracy_change_q1, r.accuracy_change_q3,
                                          "+.1f", 1, " pp")),
            "Skipped steps": fmt(r.skipped_steps, ".0f"),
            "GFLOP/image": fmt(r.flops_per_image / 1e9, ".3g"),
            "Achieved TFLOP/s": fmt(r.achieved_flops / 1e12, ".3g"),
            "Peak TFLOP/s (measured)": fmt(r.peak_flops_measured / 1e12, ".3g") + f" {r.peak_dtype}".rstrip(),
            "MFU": fmt(r.mfu_measured * 100, ".1f", "%") + (" ⚠" if r.mfu_measured > 1 else ""),
            **({"MFU (data-sheet peak)": fmt(r.mfu_table * 100, ".1f", "%")}
               if table["mfu_table"].notna().any() else {}),
            "Bound": r.bound,
            "Compile/warm-up (s)": fmt(r.compile_warmup_s, ".2f"),
            "Timing note": r.timing_note or "—",
        })
    return pd.DataFrame(rows)


# ---- statistics per group, for the table, the findings and the report's accuracy section -------

def _keys(runs: pd.DataFrame) -> list[str]:
    """The identity of a comparison group: (machine,) model, dataset and, where recorded, the step loop and
    batch size (a fp32 cell is compared with the mixed cells of the same loop and batch size only)."""
    return (["machine"] if "machine" in runs else []) + ["model", "dataset"] + [k for k in LOOP if k in runs]


def _same(column: pd.Series, value) -> pd.Series:
    """column == value, with a missing value (e.g. a batch size older records lack) equal to itself."""
    return column.isna() if pd.isna(value) else column == value


def _varying(table: pd.DataFrame) -> set:
    """The loop keys (step loop, batch size) that take several values in a table: sentences must name them."""
    return {k for k in LOOP if k in table and table[k].nunique(dropna=False) > 1}


def named_machines(table: pd.DataFrame) -> set:
    """(model, dataset) pairs that ran on more than one machine (run folder): only their sentences need to
    name the machine."""
    if "machine" not in table or table.empty:
        return set()
    n = table.groupby(["model", "dataset"])["machine"].nunique()
    return set(n[n > 1].index)


def _group_label(key: dict, multi_machine, varying: set = frozenset()) -> str:
    text = f"{key['model']} on {key['dataset']}"
    if "step_loop" in varying and "step_loop" in key:
        text += f", {key['step_loop']} step"
    if "batch_size" in varying and "batch_size" in key:
        text += f", batch {key['batch_size']:.0f}"
    if isinstance(multi_machine, set):
        multi_machine = (key["model"], key["dataset"]) in multi_machine
    return text + (f" ({key['machine']})" if multi_machine and "machine" in key else "")


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def _target(ok: pd.DataFrame, fp32_final: float) -> tuple[float, str]:
    """The time-to-accuracy target of a model/dataset and how it was chosen."""
    given = ok["cfg_target_accuracy"].dropna() if "cfg_target_accuracy" in ok else pd.Series(dtype=float)
    if not given.empty:
        return float(given.iloc[0]), "--target-accuracy"
    return stats.TARGET_FRACTION * fp32_final, f"{stats.TARGET_FRACTION:.0%} of fp32's {fp32_final:.1%}"


def accuracy_statistics(runs: pd.DataFrame, epochs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (machine x) model x dataset x framework x precision: the paired test against fp32, whether the run
    was too short to judge, and the time to the target accuracy. Rows in the summary table's order."""
    ok = with_loop_columns(ok_runs(runs).copy())
    cols = [*_keys(ok), "framework", "precision", "diff_pp", "ci_low", "ci_high", "p_value", "test", "seeds",
            "images", "too_short", "target", "target_basis", "time_to_target_s", "reached"]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    keys = _keys(ok)
    tests = stats.accuracy_tests(ok, keys + ["framework"])
    epochs = epochs if epochs is not None and not epochs.empty else pd.DataFrame(columns=["cell_id"])
    epochs = epochs[epochs["cell_id"].isin(set(ok["cell_id"]))]
    rows = []
    for key, group in ok.groupby(keys, sort=False, dropna=False):
        key = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        fp32 = group[precisions.is_reference(group["precision"])]
        fp32_epochs = epochs[epochs["cell_id"].isin(set(fp32["cell_id"]))]
        short = stats.too_short(fp32_epochs, key["dataset"]) if not fp32.empty else "no fp32 cell finished"
        target, basis = (_target(group, float(fp32["final_val_accuracy"].median())) if not fp32.empty
                         else (float("nan"), ""))
        for (fw, prec), cells in group.groupby(["framework", "precision"], sort=False):
            times = [stats.time_to_accuracy(epochs[epochs["cell_id"] == c], target)
                     for c in cells["cell_id"]] if np.isfinite(target) else []
            times = [t for t in times if not np.isnan(t)]
            finite = [t for t in times if np.isfinite(t)]
            median = float(np.median(times)) if times else float("nan")
            row = {**key, "framework": fw, "precision": prec, "too_short": short or "", "target": target,
                   "target_basis": basis, "time_to_target_s": median, "reached": f"{len(finite)}/{len(times)}"}
            match = tests
            for k, v in {**key, "framework": fw, "precision": prec}.items():
                match = match[_same(match[k], v)] if not match.empty else match
            if not match.empty:
                row.update(match.iloc[0][["diff_pp", "ci_low", "ci_high", "p_value", "test", "seeds",
                                          "images"]].to_dict())
            rows.append(row)
    out = pd.DataFrame(rows).reindex(columns=cols)
    return out.sort_values([*keys, "framework", "precision"], key=display_order).reset_index(drop=True)


def speed_statistics(runs: pd.DataFrame, steps: pd.DataFrame | None, environment: dict | None = None) -> pd.DataFrame:
    """Per mixed (machine x) model x dataset x framework x precision: the speed ratio's interval and verdict."""
    ok = with_loop_columns(ok_runs(runs).copy())
    keys = _keys(ok) + ["framework"]
    cols = [*keys, "precision", "speed_low", "speed_high", "timed_steps", "spread_p90_p50", "speed_note"]
    if ok.empty or steps is None or steps.empty or "step_time_s" not in steps:
        return pd.DataFrame(columns=cols)
    timed = steps[steps["cell_id"].isin(set(ok["cell_id"]))]
    timed = timed[~timed["warmup"].astype(bool)] if "warmup" in timed else timed
    by_cell = {c: g["step_time_s"].to_numpy(float) for c, g in timed.groupby("cell_id")}
    drift = calibrate.drift(environment or {})
    rows = []
    for key, group in ok.groupby(keys, sort=False, dropna=False):
        fp32 = {r.seed: r.cell_id for r in group[precisions.is_reference(group["precision"])].itertuples()}
        for prec, cells in group[precisions.is_mixed(group["precision"])].groupby("precision", sort=False):
            pairs = [(by_cell.get(fp32[r.seed], np.array([])), by_cell.get(r.cell_id, np.array([])))
                     for r in cells.itertuples() if r.seed in fp32]
            res = stats.speed_interval([a for a, _ in pairs], [b for _, b in pairs])
            note = stats.speed_verdict(res["ratio"], res["low"], res["high"], res["timed_steps"], drift)
            rows.append({**dict(zip(keys, key)), "precision": prec, "speed_low": res["low"],
                         "speed_high": res["high"], "timed_steps": res["timed_steps"],
                         "spread_p90_p50": res["spread_p90_p50"], "speed_note": note})
    return pd.DataFrame(rows).reindex(columns=cols) if rows else pd.DataFrame(columns=cols)


def full_table(runs: pd.DataFrame, steps: pd.DataFrame | None = None, epochs: pd.DataFrame | None = None,
               environment: dict | None = None) -> pd.DataFrame:
    """summary_table with the speed intervals and the paired accuracy tests beside each row: the one
    aggregated table the summary, the findings and the accuracy section are all written from."""
    table = summary_table(runs)
    if table.empty:
        return table
    keys = [c for c in ("machine", "model", "dataset", *LOOP, "framework", "precision") if c in table]
    speed = speed_statistics(runs, steps, environment)
    acc = accuracy_statistics(runs, epochs)
    out = table.merge(speed, on=keys, how="left").merge(acc, on=keys, how="left")
    out["speed_note"] = out["speed_note"].fillna("")
    out["too_short"] = out["too_short"].fillna("")
    return out


def _interval(value: float, low: float, high: float, spec: str, sep: str = "–") -> str:
    return f"{value:{spec}} [{low:{spec}}{sep}{high:{spec}}]"


def speed_text(r) -> str:
    """A mixed cell's speed ratio as the summary and findings show it: with its interval and, where the
    interval does not support it, why."""
    text = f"{r.speedup_vs_fp32:.2f}×"
    if np.isfinite(getattr(r, "speed_low", np.nan)):
        text += f" [{r.speed_low:.2f}–{r.speed_high:.2f}]"
    if getattr(r, "speed_note", ""):
        text += f" ⚠ {r.speed_note}"
    return text


def accuracy_text(r) -> str:
    """A mixed cell's accuracy change, worded from its paired test: never a difference without its interval."""
    if getattr(r, "too_short", ""):
        return "not comparable (run too short)"
    p = getattr(r, "p_value", np.nan)
    if not np.isfinite(p):
        return "no paired test (no per-image results)"
    ptext = f"p = {p:.2g}"
    if not stats.detectable({"p_value": p, "ci_low": r.ci_low, "ci_high": r.ci_high}):
        return f"no detectable difference ({r.diff_pp:+.1f} pp [{r.ci_low:+.1f}, {r.ci_high:+.1f}], {ptext})"
    if r.diff_pp < 0:
        return f"lower by {-r.diff_pp:.1f} pp [{-r.ci_high:.1f}, {-r.ci_low:.1f}] ({ptext})"
    return f"higher by {r.diff_pp:.1f} pp [{r.ci_low:.1f}, {r.ci_high:.1f}] ({ptext})"


def short_accuracy_text(r) -> str:
    """The table's form of accuracy_text: the change with its interval, or why there is none."""
    if getattr(r, "too_short", ""):
        return "too short ⚠"  # the run is too short to judge (accuracy_text says so in words)
    if not np.isfinite(getattr(r, "p_value", np.nan)):
        return "n/a"
    mark = "" if stats.detectable({"p_value": r.p_value, "ci_low": r.ci_low, "ci_high": r.ci_high}) else " (n.s.)"
    return f"{r.diff_pp:+.1f} [{r.ci_low:+.1f}, {r.ci_high:+.1f}] pp{mark}"


def _time_text(r) -> str:
    if not np.isfinite(r.target) or r.reached.endswith("/0"):
        return "n/a"
    if not np.isfinite(r.time_to_target_s):
        return f"not reached ({r.reached} seeds reached it)"
    return f"{r.time_to_target_s:.1f} s" + (f" ({r.reached} seeds reached it)"
                                            if r.reached.split("/")[0] != r.reached.split("/")[1] else "")


def findings(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict,
             epochs: pd.DataFrame | None = None) -> list[str]:
    """Sentences built only from the aggregated table (full_table), in its order, each naming the model
    and dataset (and machine, where several) its numbers belong to and how many seeds they are over."""
    table = full_table(runs, steps, epochs, environment)
    if table.empty:
        return ["No cell finished, so there is nothing to compare yet; see the failed cells below."]
    out: list[str] = []
    multi = named_machines(table)
    varying = _varying(table)
    keys = [k for k in ("machine", "model", "dataset", *LOOP) if k in table]
    groups = [(dict(zip(keys, k if isinstance(k, tuple) else (k,))), g)
              for k, g in table.groupby(keys, sort=False, dropna=False)]
    # Speed, per model/dataset and framework.
    for key, group in groups:
        label = _group_label(key, multi, varying)
        for fw, g in group.groupby("framework", sort=False):
            mixed, fp32 = g[precisions.is_mixed(g["precision"])], g[precisions.is_reference(g["precision"])]
            if mixed.empty or fp32.empty:
                continue
            parts = [f"{r.precision} at {speed_text(r)} ({r.throughput_img_s:,.0f} images/s)"
                     for r in mixed.itertuples()]
            out.append(f"{label}, {_label(fw)} ({_seeds(int(fp32['runs'].iloc[0]))}): against fp32's "
                       f"{fp32['throughput_img_s'].iloc[0]:,.0f} images/s, {'; '.join(parts)}.")
    flagged = table[precisions.is_mixed(table["precision"]) & (table["speed_note"] != "")]
    if not flagged.empty:
        out.append(f"{len(flagged)} of {int(precisions.is_mixed(table['precision']).sum())} speed ratios are marked ⚠: "
                   "their 95% interval (block bootstrap over step times and seeds) is too wide, or too few steps "
                   "were timed, to support the ratio; re-run on an idle machine, with more steps or --repeats.")
    steadiness = calibrate.describe(environment)
    if steadiness:
        out.append(steadiness)
    slower = table[precisions.is_mixed(table["precision"]) & (table["speedup_vs_fp32"] < 1)]
    devices = set(runs.get("cfg_device", pd.Series(dtype=str)).dropna())
    one_cpu = runs["cpu_model"].nunique() <= 1 if "cpu_model" in runs else "machine" not in runs
    if not slower.empty and devices == {"cpu"} and one_cpu:
        out.append(f"Mixed precision was slower than fp32 in {len(slower)} of "
                   f"{int(precisions.is_mixed(table['precision']).sum())} mixed cells. "
                   + cpu_half_precision_verdict(environment))
    out += mfu_findings(table)
    # Memory.
    kinds = ", ".join(sorted(set(ok_runs(runs)["memory_kind"].dropna())))
    for key, group in groups:
        mem = group[precisions.is_mixed(group["precision"]) & group["memory_change_vs_fp32"].notna()]
        if not mem.empty:
            parts = [f"{_label(r.framework)} {r.precision} {r.memory_change_vs_fp32:+.0%}" for r in mem.itertuples()]
            out.append(f"{_group_label(key, multi, varying)}, peak memory against fp32 ({kinds}): {', '.join(parts)}.")
    # Accuracy: the paired tests, or why the run cannot answer.
    for key, group in groups:
        label = _group_label(key, multi, varying)
        short = group["too_short"].iloc[0]
        if short:
            out.append(f"Accuracy cannot be compared from this run for {label}: {short}. Train longer "
                       "(more --epochs, no --steps-per-epoch cap) or on the real dataset before reading accuracy "
                       "differences.")
            continue
        for fw, g in group.groupby("framework", sort=False):
            mixed, fp32 = g[precisions.is_mixed(g["precision"])], g[precisions.is_reference(g["precision"])]
            if mixed.empty or fp32.empty:
                continue
            tested = mixed[np.isfinite(mixed["p_value"].astype(float))]
            method = ""
            if not tested.empty:
                first = tested.iloc[0]
                method = (f"; McNemar's exact test on {int(first.images)} validation images" if first.seeds == 1 else
                          f"; paired bootstrap over {int(first.images)} validation images × {int(first.seeds)} seeds")
            parts = [f"{r.precision} {accuracy_text(r)}" for r in mixed.itertuples()]
            out.append(f"{label}, {_label(fw)} ({_seeds(int(fp32['runs'].iloc[0]))}): final validation accuracy "
                       f"against fp32's {fp32['val_accuracy'].iloc[0]:.1%}: {'; '.join(parts)}{method}.")
    # Time to accuracy.
    for key, group in groups:
        if group["too_short"].iloc[0] or not np.isfinite(group["target"].iloc[0]):
            continue
        first = group.iloc[0]
        parts = [f"{_label(fw)} " + ", ".join(f"{r.precision} {_time_text(r)}" for r in g.itertuples())
                 for fw, g in group.groupby("framework", sort=False)]
        out.append(f"{_group_label(key, multi, varying)}, training time to {first.target:.1%} validation accuracy "
                   f"({first.target_basis}; median over seeds, validation excluded): {'; '.join(parts)}.")
    # Loss scaling: per cell, medians over seeds (the loss-scaling table's numbers).
    fp16 = steps[steps["precision"].isin(precisions.names(loss_scaling="dynamic"))
                 & steps["cell_id"].isin(set(ok_runs(runs)["cell_id"]))] if not steps.empty else steps
    if not fp16.empty:
        runs_keys = with_loop_columns(ok_runs(runs).copy()).set_index("cell_id")
        fp16 = fp16.assign(**{k: fp16["cell_id"].map(runs_keys[k]) for k in keys if k not in fp16})
        for key, group in groups:
            sel = fp16
            for k, v in key.items():
                sel = sel[_same(sel[k], v)]
            parts = []
            for fw in group["framework"].drop_duplicates():
                cells = [g.sort_values("step") for _, g in sel[sel["framework"] == fw].groupby("cell_id")]
                if not cells:
                    continue
                skipped = float(np.median([g["skipped"].sum() for g in cells]))
                n = float(np.median([len(g) for g in cells]))
                last = float(np.median([g["loss_scale"].iloc[-1] for g in cells]))
                per_seed = ", median per seed" if len(cells) > 1 else ""
                parts.append(f"{_label(fw)} skipped {skipped:.0f} of {n:.0f} steps and ended at scale "
                             f"2^{np.log2(last):.0f} ({_seeds(len(cells))}{per_seed})")
            if parts:
                label = _group_label(key, multi, varying)
                out.append(f"{label}, dynamic loss scaling (fp16): " + "; ".join(parts) + ".")
    diverged = runs[runs["status"] == "diverged"] if "status" in runs else runs.iloc[0:0]
    for r in diverged.itertuples():
        out.insert(0, f"{r.model} on {r.dataset}, {_label(r.framework)} {r.precision} (seed {r.seed}) "
                      f"diverged: {r.error}.")
    return out


def mfu_findings(table: pd.DataFrame) -> list[str]:
    """What the MFU column is measured against where that is not the cell's own dtype, and any MFU over 100%
    (the measured matmul is then not the ceiling of the path the cell ran: the number is shown, flagged)."""
    out = []
    dtypes = table.get("peak_dtype", pd.Series(dtype=str)).fillna("")
    emulated = table[dtypes.str.contains("emulated")]
    if not emulated.empty:
        which = ", ".join(sorted(set(emulated["precision"])))
        out.append(f"MFU of the {which} cells is against the fp32 matmul peak: this CPU has no arithmetic for "
                   "their half format, so the frameworks convert to float32 and compute on the fp32 units.")
    over = table[table["mfu_measured"] > 1]
    if not over.empty:
        cells = ", ".join(f"{_label(r.framework)} {r.precision} batch {r.batch_size:.0f} ({r.mfu_measured:.0%})"
                          for r in over.itertuples())
        out.append(f"MFU above 100% in {len(over)} cell(s) ({cells}): the model trained faster than the matmul "
                   "measured as the peak, so that matmul is not the ceiling of the kernels these cells ran; "
                   "read their MFU as a ratio of two measured rates, not as a fraction of the hardware.")
    return out


def seed_counts_text(runs: pd.DataFrame) -> str:
    """How many seeds the medians are over, per model/dataset (and machine) where the groups differ."""
    ok = ok_runs(runs)
    if ok.empty:
        return ""
    keys = _keys(ok)
    counts = ok.groupby(keys, sort=False, dropna=False)["seed"].nunique()
    if counts.nunique() == 1:
        seeds = sorted(set(ok["seed"]))
        n = int(counts.iloc[0])
        return f"{_seeds(n)} ({', '.join(map(str, seeds))})" if n > 1 else f"one seed ({seeds[0]})"
    multi = named_machines(ok)
    return " and ".join(f"{_seeds(int(n))} for {_group_label(dict(zip(keys, k)), multi)}" for k, n in counts.items())


LEGEND = ("⚠ marks a speed ratio whose 95% interval is too wide to support it (or too few steps were timed), or an "
          "accuracy change the run is too short to judge; the findings say why. [a, b] is a 95% interval of the "
          "paired accuracy change; (n.s.): no detectable difference (p ≥ 0.05 or the interval includes zero).")
