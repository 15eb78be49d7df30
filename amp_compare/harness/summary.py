"""The numbers a reader sees first: one table and a few sentences, computed from the records.

`summary_table` and `findings` are pure functions of the run table; the HTML report, the
Markdown summary and the terminal table all call them, so the three always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract import records
from amp_compare.contract.config import display_order
from amp_compare.contract.config import framework_label as _label
from amp_compare.contract.env import cpu_half_precision_verdict
from amp_compare.harness import calibrate, stats
from amp_compare.harness import numerics_report as nr
from amp_compare.harness.perf import bound_verdicts, ceiling_sentences, timing_note, with_run_ceiling

GROUP = ["framework", "model", "dataset", "precision"]
LOOP = ["step_loop", "batch_size"]  # plain/tuned step and batch size: a cell's fp32 is at the same two
MIB = 2**20


def ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"] if "status" in runs else runs.iloc[0:0]


def _q(p: float):
    return lambda s: float(np.percentile(s, p))


def paired_fp32(ok: pd.DataFrame, column: str, base_keys: list[str]) -> np.ndarray:
    """Per row, `column` of the same framework's fp32 cell of the same seed, loop and batch size (NaN: none)."""
    keys = base_keys + ["seed"]
    fp32 = ok.loc[precisions.is_reference(ok["precision"]), keys + [column]].drop_duplicates(keys)
    merged = ok[keys].merge(fp32, on=keys, how="left")  # a left merge keeps ok's rows in order; NaN keys match
    return merged[column].to_numpy(float)


def paired_log_ratio(ok: pd.DataFrame, column: str, base_keys: list[str]) -> np.ndarray:
    """log(value / paired_fp32's) per row: the per-seed ratio every ratio of the report is built from (NaN
    without a positive pair)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(ok[column].to_numpy(float) / paired_fp32(ok, column, base_keys))
    return np.where(np.isfinite(out), out, np.nan)


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Medians over seeds per (machine x) framework x model x dataset x precision, with interquartile ranges,
    and ratios to that framework's fp32: the geometric mean over seeds of each seed's ratio (mixed over the
    fp32 cell of the same seed), the statistic stats.ratio_interval gives an interval for. Accuracy changes
    are paired by seed before the median."""
    ok = with_loop_columns(ok_runs(runs).copy())
    group = (["machine"] if "machine" in ok else []) + GROUP[:-1] + LOOP + GROUP[-1:]
    cols = group + ["runs", "throughput_img_s", "throughput_q1", "throughput_q3", "speedup_vs_fp32",
                    "peak_memory_mib", "memory_change_vs_fp32", "val_accuracy", "accuracy_q1", "accuracy_q3",
                    "accuracy_change_pp", "accuracy_change_q1", "accuracy_change_q3", "skipped_steps",
                    *PERF_COLS]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    base_keys = [c for c in group if c != "precision"]
    ok["accuracy_change_pp"] = 100 * (ok["final_val_accuracy"].to_numpy(float)
                                      - paired_fp32(ok, "final_val_accuracy", base_keys))
    ok["log_speed"] = paired_log_ratio(ok, "throughput_img_s", base_keys)
    ok["log_memory"] = paired_log_ratio(ok, "peak_memory_bytes", base_keys)
    agg = ok.groupby(group, sort=False, dropna=False).agg(
        runs=("seed", "size"),
        throughput_img_s=("throughput_img_s", "median"),
        throughput_q1=("throughput_img_s", _q(25)),
        throughput_q3=("throughput_img_s", _q(75)),
        log_speed=("log_speed", "mean"),
        peak_memory_bytes=("peak_memory_bytes", "median"),
        log_memory=("log_memory", "mean"),
        val_accuracy=("final_val_accuracy", "median"),
        accuracy_q1=("final_val_accuracy", _q(25)),
        accuracy_q3=("final_val_accuracy", _q(75)),
        accuracy_change_pp=("accuracy_change_pp", "median"),
        accuracy_change_q1=("accuracy_change_pp", _q(25)),
        accuracy_change_q3=("accuracy_change_pp", _q(75)),
        skipped_steps=("skipped_steps", "median"),
        **{c: (c, "median") for c in PERF_MEDIANS},
        ceiling_dtype=("ceiling_dtype", "first"),
    ).reset_index()
    agg["peak_memory_mib"] = agg["peak_memory_bytes"] / MIB
    agg["speedup_vs_fp32"] = np.exp(agg["log_speed"])
    agg["memory_change_vs_fp32"] = np.expm1(agg["log_memory"])
    # a mode without a loss scaler cannot skip a step: n/a, not 0
    agg.loc[~agg["precision"].map(lambda p: precisions.of(p).loss_scaling is not None), "skipped_steps"] = np.nan
    agg["timing_note"] = [timing_note(w, m) for w, m in zip(agg["throughput_img_s"],
                                                             agg["median_step_throughput_img_s"])]
    agg["bound"] = bound_verdicts(agg, group)
    agg = agg.sort_values([*group[:-6], "model", "dataset", "step_loop", "batch_size", "framework", "precision"],
                          key=display_order)
    return agg[cols].reset_index(drop=True)


# Per-cell performance columns (issue 13): medians over seeds, from the run table (kit/child.py); ceiling_flops
# is the run's one ceiling per device and dtype (harness/perf.py with_run_ceiling), MFU measured against it.
PERF_MEDIANS = ["median_step_throughput_img_s", "compile_warmup_s", "flops_per_image", "achieved_flops",
                "ceiling_flops", "ceiling_flops_table", "mfu_measured", "mfu_table"]
PERF_COLS = [*PERF_MEDIANS, "ceiling_dtype", "timing_note", "bound"]


def with_loop_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """step_loop and batch_size columns, the performance columns (MFU against the run's ceiling) and today's
    column names, on runs recorded before them too."""
    runs = with_run_ceiling(records.migrate(runs))
    if "step_loop" not in runs:
        runs["step_loop"] = runs["cfg_step"] if "cfg_step" in runs else "plain"
    runs["batch_size"] = runs["cfg_batch_size"] if "cfg_batch_size" in runs else np.nan
    for col in PERF_MEDIANS:
        if col not in runs:
            runs[col] = np.nan
    if "ceiling_dtype" not in runs:
        runs["ceiling_dtype"] = ""
    return runs


# formatted_summary's hardware-efficiency columns (issue 13): the report shows them in their own table in the
# Speed section (the summary table would not fit the page with them), summary.md keeps them in its one table.
HARDWARE_COLUMNS = ("GFLOP/image", "Achieved TFLOP/s", "Ceiling TFLOP/s (measured)", "MFU",
                    "MFU (data-sheet ceiling)", "Bound", "Compile/warm-up (s)", "Timing note")
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


def _fmt(value, spec, suffix=""):
    return "n/a" if value is None or not np.isfinite(value) else f"{value:{spec}}{suffix}"


def _spread(r, median, q1, q3, spec, scale=1.0, suffix=""):
    """A median with its interquartile range where there are several runs."""
    text = _fmt(median * scale, spec, suffix)
    if r.runs > 1 and np.isfinite(q1) and np.isfinite(q3):
        text += f" [{q1 * scale:{spec}}–{q3 * scale:{spec}}]"
    return text


def _mark(note) -> str:
    return " ⚠" if isinstance(note, str) and note else ""


def _hardware_cells(r, data_sheet: bool) -> dict:
    return {
        "GFLOP/image": _fmt(r.flops_per_image / 1e9, ".3g"),
        "Achieved TFLOP/s": _fmt(r.achieved_flops / 1e12, ".3g"),
        "Ceiling TFLOP/s (measured)": _fmt(r.ceiling_flops / 1e12, ".3g") + f" {r.ceiling_dtype or ''}".rstrip(),
        "MFU": _fmt(r.mfu_measured * 100, ".1f", "%") + (" ⚠" if r.mfu_measured > 1 else ""),
        **({"MFU (data-sheet ceiling)": _fmt(r.mfu_table * 100, ".1f", "%")} if data_sheet else {}),
        "Bound": r.bound,
        "Compile/warm-up (s)": _fmt(r.compile_warmup_s, ".2f"),
        "Timing note": r.timing_note or "—",
    }


def formatted_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The summary table as display strings (HTML, Markdown and terminal use this one)."""
    rows = []
    multi = "machine" in table and table["machine"].nunique() > 1
    data_sheet = bool(table["mfu_table"].notna().any()) if "mfu_table" in table else False
    for r in table.itertuples():
        rows.append({
            **({"Machine": r.machine} if multi else {}),
            "Framework": _label(r.framework), "Model": r.model, "Dataset": r.dataset, "Step": r.step_loop,
            "Batch": _fmt(r.batch_size, ".0f"), "Precision": r.precision, "Runs": str(r.runs),
            "Images/s": _spread(r, r.throughput_img_s, r.throughput_q1, r.throughput_q3, ",.0f"),
            "Images/s (median step)": _fmt(r.median_step_throughput_img_s, ",.0f"),
            "Speed vs fp32": _fmt(r.speedup_vs_fp32, ".2f", "×") + _mark(getattr(r, "speed_note", "")),
            "Peak memory (MiB)": _fmt(r.peak_memory_mib, ",.1f"),
            "Memory vs fp32": _fmt(r.memory_change_vs_fp32 * 100, "+.0f", "%") + _mark(getattr(r, "memory_note", "")),
            "Val. accuracy": _spread(r, r.val_accuracy, r.accuracy_q1, r.accuracy_q3, ".1f", 100, "%"),
            "Δ accuracy vs fp32": (short_accuracy_text(r)
                                   if hasattr(r, "p_value") and precisions.is_mixed(r.precision) else
                                   _spread(r, r.accuracy_change_pp, r.accuracy_change_q1, r.accuracy_change_q3,
                                           "+.1f", 1, " pp")),
            "Skipped steps": _fmt(r.skipped_steps, ".0f"),
            **_hardware_cells(r, data_sheet),
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


def _time_rows(group: pd.DataFrame, epochs: pd.DataFrame, target: float, machine: str) -> dict:
    """Per (framework, precision) of one model/dataset group: the median time to the target, how many seeds
    reached it, the epochs they reached it in, and for a mixed precision its ratio to the same framework's
    fp32 of the same seed (stats.ratio_interval over the seeds where both reached it)."""
    by_cell = dict(tuple(epochs[epochs["cell_id"].isin(set(group["cell_id"]))].groupby("cell_id")))
    empty = epochs.iloc[0:0]
    per_cell = {c: (stats.time_to_accuracy(by_cell.get(c, empty), target), stats.epoch_reached(by_cell.get(c, empty),
                                                                                             target))
                if np.isfinite(target) else (float("nan"), None) for c in group["cell_id"]}
    out = {}
    for (fw, prec), cells in group.groupby(["framework", "precision"], sort=False):
        times = [per_cell[c][0] for c in cells["cell_id"] if not np.isnan(per_cell[c][0])]
        finite = [t for t in times if np.isfinite(t)]
        reached_in = sorted({per_cell[c][1] for c in cells["cell_id"] if per_cell[c][1] is not None})
        row = {"time_to_target_s": float(np.median(times)) if times else float("nan"),
               "reached": f"{len(finite)}/{len(times)}", "reached_epochs": ",".join(map(str, reached_in))}
        fp32 = group[(group["framework"] == fw) & precisions.is_reference(group["precision"])]
        fp32_time = {r.seed: per_cell[r.cell_id][0] for r in fp32.itertuples()}
        logs = [np.log(per_cell[r.cell_id][0] / fp32_time[r.seed]) for r in cells.itertuples()
                if np.isfinite(fp32_time.get(r.seed, np.nan)) and np.isfinite(per_cell[r.cell_id][0])
                and fp32_time[r.seed] > 0 and per_cell[r.cell_id][0] > 0]
        if precisions.is_mixed(prec) and logs:
            res = stats.ratio_interval(logs)
            row.update(ttt_ratio=res["ratio"], ttt_low=res["low"], ttt_high=res["high"],
                       ttt_note=stats.ratio_verdict(res["ratio"], res["low"], res["high"], res["seeds"],
                                                    res["basis"], machine))
        out[(fw, prec)] = row
    return out


ACC_COLS = ["diff_pp", "ci_low", "ci_high", "p_value", "test", "seeds", "images"]
TIME_COLS = ["time_to_target_s", "reached", "reached_epochs", "ttt_ratio", "ttt_low", "ttt_high", "ttt_note"]


def accuracy_statistics(runs: pd.DataFrame, epochs: pd.DataFrame | None = None,
                        environment: dict | None = None) -> pd.DataFrame:
    """Per (machine x) model x dataset x framework x precision: the paired test against fp32, whether the run
    was too short to judge, and the time to the target accuracy with its ratio to fp32's. Rows in the summary
    table's order."""
    ok = with_loop_columns(ok_runs(runs).copy())
    cols = [*_keys(ok), "framework", "precision", *ACC_COLS, "too_short", "target", "target_basis", *TIME_COLS]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    keys = _keys(ok)
    tests = stats.accuracy_tests(ok, keys + ["framework"])
    epochs = epochs if epochs is not None and not epochs.empty else pd.DataFrame(columns=["cell_id"])
    epochs = epochs[epochs["cell_id"].isin(set(ok["cell_id"]))]
    machine = calibrate.unsteady_reason(environment or {})
    rows = []
    for key, group in ok.groupby(keys, sort=False, dropna=False):
        key = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        fp32 = group[precisions.is_reference(group["precision"])]
        fp32_epochs = epochs[epochs["cell_id"].isin(set(fp32["cell_id"]))]
        short = stats.too_short(fp32_epochs, key["dataset"]) if not fp32.empty else "no fp32 cell finished"
        target, basis = (_target(group, float(fp32["final_val_accuracy"].median())) if not fp32.empty
                         else (float("nan"), ""))
        times = _time_rows(group, epochs, target, machine)
        for (fw, prec), time_row in times.items():
            row = {**key, "framework": fw, "precision": prec, "too_short": short or "", "target": target,
                   "target_basis": basis, **time_row}
            match = tests
            for k, v in {**key, "framework": fw, "precision": prec}.items():
                match = match[_same(match[k], v)] if not match.empty else match
            if not match.empty:
                row.update(match.iloc[0][ACC_COLS].to_dict())
            rows.append(row)
    out = pd.DataFrame(rows).reindex(columns=cols)
    return out.sort_values([*keys, "framework", "precision"], key=display_order).reset_index(drop=True)


def _pairs(ok: pd.DataFrame, keys: list[str]):
    """(key, precision, [(fp32 row, mixed row) per seed]) for every mixed group of the run table."""
    for key, group in ok.groupby(keys, sort=False, dropna=False):
        fp32 = {r.seed: r for r in group[precisions.is_reference(group["precision"])].itertuples()}
        for prec, cells in group[precisions.is_mixed(group["precision"])].groupby("precision", sort=False):
            yield key, prec, [(fp32[r.seed], r) for r in cells.itertuples() if r.seed in fp32]


def _log_ratio(a: float, b: float) -> float:
    return float(np.log(b / a)) if a > 0 and b > 0 and np.isfinite(a) and np.isfinite(b) else float("nan")


def speed_statistics(runs: pd.DataFrame, steps: pd.DataFrame | None, environment: dict | None = None) -> pd.DataFrame:
    """Per mixed (machine x) model x dataset x framework x precision: the speed ratio's interval and verdict.
    The per-seed ratios are the run table's wall-time throughputs (what the summary shows); the steps give
    one seed its within-seed interval, the timed-step count and the step-time spread."""
    ok = with_loop_columns(ok_runs(runs).copy())
    keys = _keys(ok) + ["framework"]
    cols = [*keys, "precision", "speed_low", "speed_high", "speed_seeds", "speed_basis", "timed_steps",
            "spread_p90_p50", "speed_note"]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    timed = steps if steps is not None and "step_time_s" in steps else pd.DataFrame(columns=["cell_id", "step_time_s"])
    timed = timed[timed["cell_id"].isin(set(ok["cell_id"]))]
    timed = timed[~timed["warmup"].astype(bool)] if "warmup" in timed else timed
    by_cell = {c: g["step_time_s"].to_numpy(float) for c, g in timed.groupby("cell_id")}
    machine = calibrate.unsteady_reason(environment or {})
    rows = []
    for key, prec, pairs in _pairs(ok, keys):
        fp32 = [by_cell.get(a.cell_id, np.array([])) for a, _ in pairs]
        mixed = [by_cell.get(b.cell_id, np.array([])) for _, b in pairs]
        res = stats.speed_interval(fp32, mixed, [_log_ratio(a.throughput_img_s, b.throughput_img_s) for a, b in pairs])
        rows.append({**dict(zip(keys, key)), "precision": prec, "speed_low": res["low"], "speed_high": res["high"],
                     "speed_seeds": res["seeds"], "speed_basis": res["basis"], "timed_steps": res["timed_steps"],
                     "spread_p90_p50": stats.step_spread(fp32 + mixed),
                     "speed_note": stats.speed_verdict(res, machine)})
    return pd.DataFrame(rows).reindex(columns=cols) if rows else pd.DataFrame(columns=cols)


def memory_statistics(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mixed group: the peak-memory ratio's interval and verdict (stats.ratio_interval over the seeds'
    ratios; one seed has no within-seed replicate, so no interval)."""
    ok = with_loop_columns(ok_runs(runs).copy())
    keys = _keys(ok) + ["framework"]
    cols = [*keys, "precision", "memory_low", "memory_high", "memory_note"]
    rows = []
    for key, prec, pairs in _pairs(ok, keys) if not ok.empty else []:
        res = stats.ratio_interval([_log_ratio(a.peak_memory_bytes, b.peak_memory_bytes) for a, b in pairs])
        rows.append({**dict(zip(keys, key)), "precision": prec, "memory_low": res["low"] - 1,
                     "memory_high": res["high"] - 1,
                     "memory_note": stats.ratio_verdict(res["ratio"], res["low"], res["high"], res["seeds"],
                                                        as_change=True)})
    return pd.DataFrame(rows).reindex(columns=cols) if rows else pd.DataFrame(columns=cols)


def full_table(runs: pd.DataFrame, steps: pd.DataFrame | None = None, epochs: pd.DataFrame | None = None,
               environment: dict | None = None, accuracy: pd.DataFrame | None = None) -> pd.DataFrame:
    """summary_table with the ratios' intervals and the paired accuracy tests beside each row: the one
    aggregated table the summary, the findings and the accuracy section are all written from (`accuracy`:
    accuracy_statistics of the same records, where the caller has it already)."""
    table = summary_table(runs)
    if table.empty:
        return table
    keys = [c for c in ("machine", "model", "dataset", *LOOP, "framework", "precision") if c in table]
    out = table.merge(speed_statistics(runs, steps, environment), on=keys, how="left")
    out = out.merge(memory_statistics(runs), on=keys, how="left")
    accuracy = accuracy_statistics(runs, epochs, environment) if accuracy is None else accuracy
    out = out.merge(accuracy, on=keys, how="left")
    for col in ("speed_note", "memory_note", "ttt_note", "too_short", "speed_basis"):
        out[col] = out[col].astype(object).where(out[col].notna(), "")
    return out


def speed_text(r) -> str:
    """A mixed cell's speed ratio as the summary and findings show it: with its interval and, where the
    interval does not support it, why."""
    text = f"{r.speedup_vs_fp32:.2f}×"
    if np.isfinite(getattr(r, "speed_low", np.nan)):
        text += f" [{r.speed_low:.2f}–{r.speed_high:.2f}]"
    if getattr(r, "speed_note", ""):
        text += f" ⚠ {r.speed_note}"
    return text


def memory_text(r) -> str:
    """A mixed cell's peak-memory change against fp32 with its interval, ⚠ where that does not support it."""
    text = f"{r.memory_change_vs_fp32:+.0%}"
    if np.isfinite(getattr(r, "memory_low", np.nan)):
        text += f" [{r.memory_low:+.0%}, {r.memory_high:+.0%}]"
    return text + _mark(getattr(r, "memory_note", ""))


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
    text = f"{r.time_to_target_s:.1f} s" + (f" ({r.reached} seeds reached it)"
                                            if r.reached.split("/")[0] != r.reached.split("/")[1] else "")
    if np.isfinite(getattr(r, "ttt_ratio", np.nan)):
        interval = f" [{r.ttt_low:.2f}–{r.ttt_high:.2f}]" if np.isfinite(r.ttt_low) else ""
        text += f" ({r.ttt_ratio:.2f}× fp32's{interval}{_mark(r.ttt_note)})"
    return text


def _notes(notes, same: str = "1×") -> str:
    """The distinct ⚠ notes of a sentence's numbers, said once at its end (the intervals themselves are beside
    the numbers: "noisy" is said once, in words)."""
    noisy = f"noisy: a 95% interval wider than {stats.NOISY_WIDTH}× end to end, or including {same}"
    notes = list(dict.fromkeys(noisy if n.startswith("noisy") else n for n in notes if isinstance(n, str) and n))
    return f" ⚠: {'; '.join(notes)}." if notes else ""


@dataclass
class Groups:
    """The aggregated table cut into the groups every sentence is about (model/dataset, loop, machine)."""

    table: pd.DataFrame
    items: list  # [(key dict, rows of the group)]
    multi: set  # (model, dataset) pairs that ran on several machines: their sentences name it
    varying: set  # loop keys that take several values: sentences name them

    @classmethod
    def of(cls, table: pd.DataFrame) -> Groups:
        keys = [k for k in ("machine", "model", "dataset", *LOOP) if k in table]
        items = [(dict(zip(keys, k if isinstance(k, tuple) else (k,))), g)
                 for k, g in table.groupby(keys, sort=False, dropna=False)]
        return cls(table, items, named_machines(table), _varying(table))

    def label(self, key: dict) -> str:
        return _group_label(key, self.multi, self.varying)

    def per_framework(self):
        """(label, framework, its mixed rows, its fp32 rows) wherever a framework has both."""
        for key, group in self.items:
            for fw, g in group.groupby("framework", sort=False):
                mixed, fp32 = g[precisions.is_mixed(g["precision"])], g[precisions.is_reference(g["precision"])]
                if not mixed.empty and not fp32.empty:
                    yield self.label(key), fw, mixed, fp32


def interval_method(table: pd.DataFrame) -> str:
    """How this run's speed intervals were made, from the seeds it has (said, never assumed)."""
    mixed = table[precisions.is_mixed(table["precision"])]
    bases = set(mixed.get("speed_basis", pd.Series(dtype=str)).dropna()) - {""}
    seeds = sorted({int(n) for n in mixed.get("speed_seeds", pd.Series(dtype=float)).dropna()})
    parts = []
    if "seeds" in bases:
        several = [n for n in seeds if n > 1]
        parts.append(f"Student's t over the {'/'.join(map(str, several))} seeds' own ratios")
    if "steps" in bases:
        parts.append("batch means of one seed's timed steps (seed-to-seed spread unknown)")
    return "; ".join(parts)


def speed_findings(groups: Groups) -> list[str]:
    """Per model/dataset and framework: each mixed mode's speed against fp32, then what the ⚠ marks mean."""
    out = []
    for label, fw, mixed, fp32 in groups.per_framework():
        parts = [f"{r.precision} at {speed_text(r)} ({r.throughput_img_s:,.0f} images/s)" for r in mixed.itertuples()]
        out.append(f"{label}, {_label(fw)} ({_seeds(int(fp32['runs'].iloc[0]))}): against fp32's "
                   f"{fp32['throughput_img_s'].iloc[0]:,.0f} images/s, {'; '.join(parts)}.")
    table = groups.table
    is_mixed = precisions.is_mixed(table["precision"])
    if (table.loc[is_mixed, "speed_basis"] == "steps").any():
        out.append("With one seed a speed interval covers the step-to-step noise of that seed's two cells only: how "
                   "much the ratio varies from seed to seed is unknown (run --repeats 3 or more to measure it).")
    flagged = table[is_mixed & (table["speed_note"] != "")]
    if not flagged.empty:
        out.append(flagged_sentence(list(flagged["speed_note"]), int(is_mixed.sum()), interval_method(table)))
    return out


# What a ⚠ note starts with -> (its reason in a sentence, what to change).
NOTE_KINDS = {"too few": ("too few timed steps", "with more steps per cell"),
              "machine": ("a machine that was not steady", "on an idle machine"),
              "noisy": ("an interval too wide or including 1×", "with more --repeats"),
              "one seed": ("one seed and no interval", "with --repeats 3 or more"),
              "no ": ("no interval", "with more steps or --repeats")}


def flagged_sentence(notes: list[str], total: int, method: str) -> str:
    """How many speed ratios are marked ⚠, for which of the reasons that actually occurred, and what to do."""
    kinds: dict[str, int] = {}
    for note in notes:
        kind = next((k for k in NOTE_KINDS if note.startswith(k)), "")
        kinds[kind] = kinds.get(kind, 0) + 1
    reasons = ", ".join(f"{n} for {NOTE_KINDS[k][0] if k else 'other reasons'}" for k, n in kinds.items())
    advice = " and ".join(dict.fromkeys(NOTE_KINDS[k][1] for k in kinds if k))
    intervals = f" Their 95% intervals: {method}." if method else ""
    return (f"{len(notes)} of {total} speed ratios are marked ⚠, the run's evidence does not support them: "
            f"{reasons}.{intervals} Re-run {advice or 'with more --repeats'} to settle them.")


def machine_findings(groups: Groups, runs: pd.DataFrame, environment: dict) -> list[str]:
    """The machine's steadiness, mixed precision slower than fp32 on a CPU that emulates it, and MFU."""
    out = []
    steadiness = calibrate.describe(environment)
    if steadiness:
        out.append(steadiness)
    table = groups.table
    slower = table[precisions.is_mixed(table["precision"]) & (table["speedup_vs_fp32"] < 1)]
    devices = set(runs.get("cfg_device", pd.Series(dtype=str)).dropna())
    one_cpu = runs["cpu_model"].nunique() <= 1 if "cpu_model" in runs else "machine" not in runs
    if not slower.empty and devices == {"cpu"} and one_cpu:
        out.append(f"Mixed precision was slower than fp32 in {len(slower)} of "
                   f"{int(precisions.is_mixed(table['precision']).sum())} mixed cells. "
                   + cpu_half_precision_verdict(environment))
    if table["mfu_measured"].notna().any():
        out += ceiling_sentences(with_loop_columns(ok_runs(runs).copy()))
    return out + mfu_findings(table)


def memory_findings(groups: Groups, runs: pd.DataFrame) -> list[str]:
    kinds = ", ".join(sorted(set(ok_runs(runs)["memory_kind"].dropna())))
    out = []
    for key, group in groups.items:
        mem = group[precisions.is_mixed(group["precision"]) & group["memory_change_vs_fp32"].notna()]
        if not mem.empty:
            parts = [f"{_label(r.framework)} {r.precision} {memory_text(r)}" for r in mem.itertuples()]
            out.append(f"{groups.label(key)}, peak memory against fp32 ({kinds}; geometric mean over seeds, 95% "
                       f"interval): {', '.join(parts)}.{_notes(mem['memory_note'], 'no change')}")
    return out


def accuracy_findings(groups: Groups) -> list[str]:
    """The paired accuracy tests, or why the run cannot answer."""
    out = []
    for key, group in groups.items:
        label = groups.label(key)
        short = group["too_short"].iloc[0]
        if short:
            out.append(f"Accuracy cannot be compared from this run for {label}: {short}. Train longer "
                       "(more --epochs, no --steps-per-epoch cap) or on the real dataset before reading accuracy "
                       "differences.")
    for label, fw, mixed, fp32 in groups.per_framework():
        if mixed["too_short"].iloc[0]:
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
    return out


def time_findings(groups: Groups) -> list[str]:
    """Time to the target accuracy per cell, each mixed one against fp32's with its interval."""
    out = []
    for key, group in groups.items:
        if group["too_short"].iloc[0] or not np.isfinite(group["target"].iloc[0]):
            continue
        first = group.iloc[0]
        parts = [f"{_label(fw)} " + ", ".join(f"{r.precision} {_time_text(r)}" for r in g.itertuples())
                 for fw, g in group.groupby("framework", sort=False)]
        epochs = set(group["reached_epochs"].fillna(""))
        same = (f" Every cell reached it in the same epoch ({epochs.pop()}), so these times differ only as the "
                "training speed does." if len(epochs) == 1 and "," not in next(iter(epochs)) and next(iter(epochs))
                and all(r.split("/")[0] == r.split("/")[1] for r in group["reached"]) else "")
        out.append(f"{groups.label(key)}, training time to {first.target:.1%} validation accuracy "
                   f"({first.target_basis}; median over seeds, validation excluded): {'; '.join(parts)}."
                   f"{_notes(group['ttt_note'])}{same}")
    return out


def scaling_findings(groups: Groups, runs: pd.DataFrame, steps: pd.DataFrame) -> list[str]:
    """Dynamic loss scaling per model/dataset and framework (medians over seeds, the loss-scaling table's
    numbers), and whether the scale could have grown at all in a run this long."""
    ok = with_loop_columns(ok_runs(runs).copy())
    dynamic = precisions.names(loss_scaling="dynamic")
    if steps.empty or "precision" not in steps:
        return []
    fp16 = steps[steps["precision"].isin(dynamic) & steps["cell_id"].isin(set(ok["cell_id"]))]
    if fp16.empty:
        return []
    keys = [k for k in ("machine", "model", "dataset", *LOOP) if k in groups.table]
    fp16 = fp16.assign(**{k: fp16["cell_id"].map(ok.set_index("cell_id")[k]) for k in keys if k not in fp16})
    out = []
    for key, group in groups.items:
        sel = fp16
        for k, v in key.items():
            sel = sel[_same(sel[k], v)]
        parts = []
        for fw in group["framework"].drop_duplicates():
            cells = [g.sort_values("step") for _, g in sel[sel["framework"] == fw].groupby("cell_id")]
            if cells:
                skipped = float(np.median([g["skipped"].sum() for g in cells]))
                n = float(np.median([len(g) for g in cells]))
                last = float(np.median([g["loss_scale"].iloc[-1] for g in cells]))
                per_seed = ", median per seed" if len(cells) > 1 else ""
                parts.append(f"{_label(fw)} skipped {skipped:.0f} of {n:.0f} steps and ended at scale "
                             f"2^{np.log2(last):.0f} ({_seeds(len(cells))}{per_seed})")
        if parts:
            growth = nr.growth_sentence(ok[ok["cell_id"].isin(set(sel["cell_id"]))], sel)
            out.append(f"{groups.label(key)}, dynamic loss scaling (fp16): " + "; ".join(parts) + "."
                       + (f" {growth}" if growth else ""))
    return out


def findings(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict,
             epochs: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> list[str]:
    """Sentences built only from the aggregated table (full_table, computed here unless given) and the run's
    own records, in its order, each naming the model and dataset (and machine, where several) its numbers
    belong to and how many seeds they are over."""
    table = full_table(runs, steps, epochs, environment) if table is None else table
    if table.empty:
        return ["No cell finished, so there is nothing to compare yet; see the failed cells below."]
    groups = Groups.of(table)
    out = [*speed_findings(groups), *machine_findings(groups, runs, environment), *memory_findings(groups, runs),
           *accuracy_findings(groups), *time_findings(groups), *scaling_findings(groups, runs, steps)]
    diverged = runs[runs["status"] == "diverged"] if "status" in runs else runs.iloc[0:0]
    return [f"{r.model} on {r.dataset}, {_label(r.framework)} {r.precision} (seed {r.seed}) diverged: {r.error}."
            for r in diverged.itertuples()][::-1] + out


def mfu_findings(table: pd.DataFrame) -> list[str]:
    """What the MFU column is measured against where that is not the cell's own dtype, and any MFU over 100%
    (the measured matmul is then not the ceiling of the path the cell ran: the number is shown, flagged)."""
    out = []
    dtypes = table.get("ceiling_dtype", pd.Series(dtype=str)).fillna("")
    emulated = table[dtypes.str.contains("emulated")]
    if not emulated.empty:
        which = ", ".join(sorted(set(emulated["precision"])))
        out.append(f"MFU of the {which} cells is against the fp32 matmul ceiling: this CPU has no arithmetic for "
                   "their half format, so the frameworks convert to float32 and compute on the fp32 units.")
    over = table[table["mfu_measured"] > 1]
    if not over.empty:
        cells = ", ".join(f"{_label(r.framework)} {r.precision} batch {r.batch_size:.0f} ({r.mfu_measured:.0%})"
                          for r in over.itertuples())
        out.append(f"MFU above 100% in {len(over)} cell(s) ({cells}): the model trained faster than the matmul "
                   "measured as the ceiling, so that matmul is not the ceiling of the kernels these cells ran; "
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


LEGEND = ("Speed and memory against fp32 are geometric means over seeds of each seed's ratio to the fp32 cell of the "
          "same seed. ⚠ marks a ratio (speed, memory, time to target) the run cannot support: its 95% interval is "
          "too wide or includes 1×, it has none (one seed), too few steps were timed or the machine was not steady; "
          "or an accuracy change the run is too short to judge; the findings say which. [a, b] is a 95% interval "
          "of the paired accuracy change; (n.s.): no detectable difference (p ≥ 0.05 or the interval includes "
          "zero). n/a: not measured, or not applicable (a mode without a loss scaler skips no step).")
