"""The summary table and the statistics beside it, pure functions of the run table that the HTML report,
summary.md, the terminal and the findings all read; a --find-max-batch search as one table, its cap in words."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract import records
from amp_compare.contract.config import display_order
from amp_compare.contract.config import framework_label as _label
from amp_compare.harness.common import DEFAULT_MODEL_SEEDS
from amp_compare.harness.report import fp8 as fp8_report
from amp_compare.harness.report import scaling, stats
from amp_compare.harness.report.hardware import bound_verdicts, timing_note, with_run_ceiling
from amp_compare.harness.report.stats import ok_runs
from amp_compare.kit.probe import format_size

LOOP = ["step_loop", "batch_size"]  # plain/tuned step and batch size: a cell's fp32 is at the same two
MIB = 2**20


def _spread_of(column: str, name: str, median: str | None = None) -> dict:
    """The named aggregations of a column's median (named `median`, else the column), quartiles and extremes."""
    return {median or column: (column, "median"), f"{name}_q1": (column, lambda s: float(np.percentile(s, 25))),
            f"{name}_q3": (column, lambda s: float(np.percentile(s, 75))), f"{name}_min": (column, "min"),
            f"{name}_max": (column, "max")}


def paired_log_ratio(ok: pd.DataFrame, column: str, base_keys: list[str]) -> np.ndarray:
    """Per row, log(value / that of its fp32 cell of the same seed and base_keys); NaN without a positive pair."""
    keys = base_keys + ["seed"]
    fp32 = ok.loc[precisions.is_reference(ok["precision"]), keys + [column]].drop_duplicates(keys)
    merged = ok[keys].merge(fp32, on=keys, how="left")  # a left merge keeps ok's rows in order; NaN keys match
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(ok[column].to_numpy(float) / merged[column].to_numpy(float))
    return np.where(np.isfinite(out), out, np.nan)


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Medians over seeds per (machine x) framework x model x dataset x loop x precision, ratios to fp32's."""
    ok = with_loop_columns(ok_runs(runs).copy())
    group = (["machine"] if "machine" in ok else []) + ["framework", "model", "dataset", *LOOP, "precision"]
    cols = group + ["runs", "throughput_img_s", "throughput_q1", "throughput_q3", "throughput_min", "throughput_max",
                    "speedup_vs_fp32", "speed_min", "speed_max", "accuracy_min", "accuracy_max", "peak_memory_mib",
                    "memory_change_vs_fp32", "val_accuracy", "accuracy_q1", "accuracy_q3", "skipped_steps", *PERF_COLS]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    base_keys = [c for c in group if c != "precision"]
    cut = stats.cut_groups(ok, group)  # a row with a cell the speed budget stopped: no accuracy nor peak memory (n/a)
    ok["final_val_accuracy"] = ok["final_val_accuracy"].where(~cut)
    ok["log_speed"] = paired_log_ratio(ok, "throughput_img_s", base_keys)
    ok["log_memory"] = np.where(cut, np.nan, paired_log_ratio(ok, "peak_memory_bytes", base_keys))
    ok["peak_memory_bytes"] = ok["peak_memory_bytes"].where(~cut)
    agg = ok.groupby(group, sort=False, dropna=False).agg(
        runs=("seed", "size"), **_spread_of("throughput_img_s", "throughput"),
        **_spread_of("final_val_accuracy", "accuracy", median="val_accuracy"),
        log_speed=("log_speed", "mean"), log_speed_min=("log_speed", "min"), log_speed_max=("log_speed", "max"),
        log_memory=("log_memory", "mean"), **{c: (c, "first") for c in CEILING_WHY},
        **{c: (c, "median") for c in ("peak_memory_bytes", "skipped_steps", *PERF_MEDIANS)}).reset_index()
    agg["peak_memory_mib"] = agg["peak_memory_bytes"] / MIB
    agg["speedup_vs_fp32"] = np.exp(agg["log_speed"])
    agg["speed_min"], agg["speed_max"] = np.exp(agg["log_speed_min"]), np.exp(agg["log_speed_max"])
    agg["memory_change_vs_fp32"] = np.expm1(agg["log_memory"])
    # a mode that cannot skip a step (no loss scaler, Keras' static one): n/a, not 0
    agg.loc[[scaling.cannot_skip(f, p) for f, p in zip(agg["framework"], agg["precision"])], "skipped_steps"] = np.nan
    agg["timing_note"] = list(map(timing_note, agg["throughput_img_s"], agg["median_step_throughput_img_s"]))
    agg["bound"] = bound_verdicts(agg, group)
    agg = agg.sort_values([*group[:-6], "model", "dataset", *LOOP, "framework", "precision"], key=display_order)
    return agg[cols].reset_index(drop=True)


# Per-cell performance columns, medians over seeds; ceiling_flops is the run's (hardware.with_run_ceiling).
PERF_MEDIANS = ["median_step_throughput_img_s", "compile_warmup_s", "flops_per_image", "achieved_flops",
                "ceiling_flops", "ceiling_flops_table", "mfu_measured", "mfu_table"]
CEILING_WHY = ["ceiling_dtype", "ceiling_fp32_for", "ceiling_isa_limit"]  # what the ceiling is and why (kit/ceiling.py)
PERF_COLS = [*PERF_MEDIANS, *CEILING_WHY, "timing_note", "bound"]


def with_loop_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs with today's column names, step_loop, batch_size and the performance columns, older records too."""
    runs = with_run_ceiling(records.migrate(runs))
    if "step_loop" not in runs:
        runs["step_loop"] = runs["cfg_step"] if "cfg_step" in runs else "plain"
    runs["batch_size"] = runs["cfg_batch_size"] if "cfg_batch_size" in runs else np.nan
    missing = {**dict.fromkeys(PERF_MEDIANS, np.nan), **dict.fromkeys(CEILING_WHY, "")}
    return runs.assign(**{c: v for c, v in missing.items() if c not in runs})


# formatted_summary's hardware-efficiency columns: their own table on the page, in the one table of summary.md.
HARDWARE_COLUMNS = ("GFLOP/image", "Achieved TFLOP/s", "Ceiling TFLOP/s (measured)", "MFU",
                    "MFU (data-sheet ceiling)", "Bound", "Warm-up steps' extra time (ms)", "Timing note")
IDENTITY_COLUMNS = ("Machine", "Framework", "Model", "Dataset", "Step", "Batch", "Precision")


def split_summary(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(the summary table, the hardware-efficiency table, the loop text: Step and Batch where constant)."""
    hardware = [c for c in HARDWARE_COLUMNS if c in summary]
    constant = [c for c in ("Step", "Batch") if c in summary and summary[c].nunique() == 1]
    loop = {"Step": "{} step loop", "Batch": "batch size {}"}
    text = ", ".join(loop[c].format(summary[c].iloc[0]) for c in constant)
    identity = [c for c in IDENTITY_COLUMNS if c in summary and c not in constant]
    lean = [c for c in identity if c in ("Framework", "Precision") or summary[c].nunique() > 1]  # fits the page
    p50 = [c for c in ("Images/s (median step)",) if c in summary]
    return summary.drop(columns=hardware + constant + p50), summary[lean + hardware], text


def milliseconds(seconds: float) -> str:
    """A duration in ms, with as many digits as a few-ms value needs (never "0.00 s")."""
    if seconds is None or not np.isfinite(seconds):
        return "n/a"
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def _fmt(value, spec, suffix=""):
    return "n/a" if value is None or not np.isfinite(value) else f"{value:{spec}}{suffix}"


def _spread(r, median, name, spec, scale=1.0, suffix=""):
    """A median with its spread (r's `name`_min etc.) over several runs: the min–max up to 3 runs, the IQR above."""
    text, lo, hi = _fmt(median * scale, spec, suffix), getattr(r, f"{name}_min"), getattr(r, f"{name}_max")
    few = r.runs <= 3 and np.isfinite(lo) and np.isfinite(hi)
    lo, hi, kind = (lo, hi, "min–max") if few else (getattr(r, f"{name}_q1"), getattr(r, f"{name}_q3"), "IQR")
    if r.runs > 1 and np.isfinite(lo) and np.isfinite(hi):
        text += f" [{kind} {lo * scale:{spec}}–{hi * scale:{spec}}]"
    return text


def _hardware_cells(r, data_sheet: bool) -> dict:
    return {
        "GFLOP/image": _fmt(r.flops_per_image / 1e9, ".3g"), "Achieved TFLOP/s": _fmt(r.achieved_flops / 1e12, ".3g"),
        "Ceiling TFLOP/s (measured)": _fmt(r.ceiling_flops / 1e12, ".3g") + f" {r.ceiling_dtype or ''}".rstrip(),
        "MFU": _fmt(r.mfu_measured * 100, ".1f", "%") + (" ⚠" if r.mfu_measured > 1 else ""),
        **({"MFU (data-sheet ceiling)": _fmt(r.mfu_table * 100, ".1f", "%")} if data_sheet else {}),
        "Bound": r.bound, "Warm-up steps' extra time (ms)": milliseconds(r.compile_warmup_s),
        "Timing note": r.timing_note or "—"}


def formatted_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The summary table as display strings (HTML and Markdown): what each precision's training cells measured."""
    multi = "machine" in table and table["machine"].nunique() > 1
    data_sheet = bool(table["mfu_table"].notna().any()) if "mfu_table" in table else False
    return pd.DataFrame([{
        **({"Machine": r.machine} if multi else {}),
        "Framework": _label(r.framework), "Model": r.model, "Dataset": r.dataset, "Step": r.step_loop,
        "Batch": _fmt(r.batch_size, ".0f"), "Precision": r.precision, "Runs": str(r.runs),
        "Images/s": _spread(r, r.throughput_img_s, "throughput", ",.0f"),
        "Images/s (median step)": _fmt(r.median_step_throughput_img_s, ",.0f"),
        "Peak memory (MiB)": _fmt(r.peak_memory_mib, ",.1f"),
        "Val. accuracy": _spread(r, r.val_accuracy, "accuracy", ".1f", 100, "%"),
        "Skipped steps": _fmt(r.skipped_steps, ".0f"), **_hardware_cells(r, data_sheet)} for r in table.itertuples()])


def _keys(runs: pd.DataFrame) -> list[str]:
    """The identity of a comparison group: (machine,) model, dataset and, where recorded, step loop and batch size."""
    return (["machine"] if "machine" in runs else []) + ["model", "dataset"] + [k for k in LOOP if k in runs]


def varying_keys(table: pd.DataFrame) -> set:
    """The loop keys (step loop, batch size) that take several values in a table: sentences must name them."""
    return {k for k in LOOP if k in table and table[k].nunique(dropna=False) > 1}


def named_machines(table: pd.DataFrame) -> set:
    """(model, dataset) pairs that ran on more than one machine: only their sentences need to name it."""
    if "machine" not in table or table.empty:
        return set()
    n = table.groupby(["model", "dataset"])["machine"].nunique()
    return set(n[n > 1].index)


def group_label(key: dict, multi_machine: set, varying: set = frozenset()) -> str:
    """A group's name in sentences: model on dataset, the loop keys that vary, the machine where it must be named."""
    said = {"step_loop": ", {} step", "batch_size": ", batch {:.0f}"}
    text = f"{key['model']} on {key['dataset']}" + "".join(
        w.format(key[k]) for k, w in said.items() if k in varying and k in key)
    named = "machine" in key and (key["model"], key["dataset"]) in multi_machine
    return text + (f" ({key['machine']})" if named else "")


def seeds_text(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def seed_list_text(seeds: list) -> str:
    """"3 seeds (0, 1, 2)" or "one seed (0)"."""
    return f"{seeds_text(len(seeds))} ({', '.join(map(str, seeds))})" if len(seeds) > 1 else f"one seed ({seeds[0]})"


def accuracy_statistics(runs: pd.DataFrame, epochs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per group, framework and precision: the paired test against fp32, too_short, the time to target."""
    ok = with_loop_columns(ok_runs(runs).copy())
    keys = _keys(ok)
    ids = [*keys, "framework", "precision"]
    cols = [*ids, *stats.ACC_COLS, "too_short", "target", "target_basis", "time_to_target_s", "reached_seeds",
            "timed_seeds", "ttt_ratio", "ttt_low", "ttt_high", "budget_cut", "floor_pp", "floor_seeds"]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    tests = stats.accuracy_tests(ok, keys + ["framework"])
    epochs = epochs if epochs is not None and not epochs.empty else pd.DataFrame(columns=["cell_id"])
    epochs = epochs[epochs["cell_id"].isin(set(ok["cell_id"]))]
    rows = []
    for key, group in ok.groupby(keys, sort=False, dropna=False):
        key = dict(zip(keys, key))
        cut = stats.budgeted(group)
        fp32 = group[precisions.is_reference(group["precision"]) & ~cut]
        fp32_epochs = epochs[epochs["cell_id"].isin(set(fp32["cell_id"]))]
        short = stats.too_short(fp32_epochs, key["dataset"]) if not fp32.empty else "no fp32 cell finished"
        given = group.get("cfg_target_accuracy", pd.Series(dtype=float)).dropna()  # else a share of fp32's final
        final, share = float(fp32["final_val_accuracy"].median()), stats.TARGET_FRACTION
        target, basis = ((float("nan"), "") if fp32.empty else (float(given.iloc[0]), "--target-accuracy")
                         if not given.empty else (share * final, f"{share:.0%} of fp32's {final:.1%}"))
        by_cell = dict(tuple(epochs[epochs["cell_id"].isin(set(group["cell_id"]))].groupby("cell_id")))
        per_cell = {c: stats.time_to_accuracy(by_cell.get(c, epochs.iloc[0:0]), target) if np.isfinite(target)
                    else np.nan for c in group.loc[~cut, "cell_id"]}
        for (fw, prec), cells in group.groupby(["framework", "precision"], sort=False):  # floor: fp32's seed range
            base, budgeted = fp32[fp32["framework"] == fw], stats.budgeted(cells)
            acc, timed = base.groupby("seed")["final_val_accuracy"].median().dropna() * 100, cells[~budgeted]
            row = {**key, "framework": fw, "precision": prec, "too_short": short or "", "target": target,
                   "target_basis": basis, "floor_seeds": len(acc), "budget_cut": int(budgeted.sum()),
                   "floor_pp": float(acc.max() - acc.min()) if len(acc) > 1 else np.nan}
            if not timed.empty:  # no time to target for a mode whose every cell was budgeted
                times = [per_cell[c] for c in timed["cell_id"] if not np.isnan(per_cell[c])]
                row.update(time_to_target_s=float(np.median(times)) if times else np.nan,
                           reached_seeds=int(np.isfinite(times).sum()), timed_seeds=len(times))
            if precisions.is_mixed(prec) and not timed.empty:  # NaN where no seed has both times
                fp32_time = {r.seed: per_cell[r.cell_id] for r in base.itertuples()}
                res = stats.ratio_interval([_log_ratio(fp32_time.get(r.seed, np.nan), per_cell[r.cell_id])
                                            for r in timed.itertuples()])
                row.update(ttt_ratio=res["ratio"], ttt_low=res["low"], ttt_high=res["high"])
            rows.append(row)
    out = pd.DataFrame(rows)
    out = out.merge(tests, on=ids, how="left") if not tests.empty else out
    return out.reindex(columns=cols).sort_values(ids, key=display_order).reset_index(drop=True)


def _log_ratio(a: float, b: float) -> float:
    return float(np.log(b / a)) if a > 0 and b > 0 and np.isfinite(a) and np.isfinite(b) else float("nan")


def memory_statistics(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mixed group: the peak-memory ratio's verdict, the difference in MiB and whether it is resolved."""
    ok = with_loop_columns(ok_runs(runs).copy())
    keys = _keys(ok) + ["framework"]
    cols = [*keys, "precision", "memory_note", "memory_difference_mib", "memory_resolution_mib", "memory_resolved"]
    rows = []
    for key, group in ok.groupby(keys, sort=False, dropna=False) if not ok.empty else []:
        fp32 = {r.seed: r.peak_memory_bytes for r in group[precisions.is_reference(group["precision"])].itertuples()}
        for prec, cells in group[precisions.is_mixed(group["precision"])].groupby("precision", sort=False):
            pairs = [(fp32[r.seed], r.peak_memory_bytes) for r in cells.itertuples() if r.seed in fp32]  # peak bytes
            res = stats.ratio_interval([_log_ratio(a, b) for a, b in pairs])
            verdict = stats.ratio_verdict(res["ratio"], res["low"], res["high"], res["seeds"], as_change=True)
            # resolved: every seed's difference past the larger max−min peak of either side's seeds (none under two)
            both = [(a, b) for a, b in pairs if np.isfinite(a) and np.isfinite(b)]
            resolution = float(np.ptp(both, axis=0).max()) / MIB if len(both) >= 2 else np.nan
            diffs = [(b - a) / MIB for a, b in both]
            weakest = 0.0 if not diffs or min(diffs) < 0 < max(diffs) else min(diffs, key=abs)
            difference, known = (float(np.median(diffs)), float(np.isfinite(resolution) and abs(weakest) > resolution)
                                 ) if diffs else (np.nan, np.nan)
            rows.append([*key, prec, "" if known == 0.0 else verdict, difference, resolution, known])
    return pd.DataFrame(rows, columns=cols)


HOW = {  # how each of stats' methods makes a paired comparison, and what its interval is
    stats.MCNEMAR: "McNemar's exact test where there is one seed (its interval: Newcombe's score interval for a "
                   "paired difference, which lets the number of images that differ vary)",
    stats.BOOTSTRAP: "a paired bootstrap over images (the same images resampled for every seed) where there are "
                     "several (its interval: the bootstrap's 95% percentile interval)",
    stats.NO_DIFFERENCE: "no test where every image was classified right or wrong exactly as in fp32: the interval "
                         "is then the exact 95% bound on the share of images that could differ",
}


def section_paragraph(acc: pd.DataFrame) -> str:
    """The paragraph above the accuracy table, naming only the tests this run ran."""
    how = [text for method, text in HOW.items() if method in set(acc.get("method", pd.Series(dtype=str)).dropna())]
    return ("Accuracy differences are paired: cells of one model, dataset and seed start from the same weights and "
            "are scored on the same validation images, so each mixed cell is compared image by image with its fp32"
            + (": " + "; ".join(how) if how else "") + ". A difference counts as detectable only when p (the "
            "probability of a difference at least this large if precision changed nothing) is below "
            f"{stats.ALPHA} and its 95% interval excludes zero. \"Not comparable\" means fp32 itself was near chance "
            "or still improving steeply at the last epoch, so the run is too short to say anything about accuracy. "
            "Time to target is the training time (validation excluded) until the validation accuracy, checked after "
            "every epoch, first reached the target.")



def full_table(runs: pd.DataFrame, epochs: pd.DataFrame | None = None, environment: dict | None = None,
               accuracy: pd.DataFrame | None = None) -> pd.DataFrame:
    """summary_table with memory_statistics and accuracy_statistics (`accuracy`, where the caller has it) per row."""
    table = summary_table(runs)
    if table.empty:
        return table
    keys = [*_keys(table), "framework", "precision"]
    out = table.merge(memory_statistics(runs), on=keys, how="left")
    accuracy = accuracy_statistics(runs, epochs) if accuracy is None else accuracy
    out = out.merge(accuracy, on=keys, how="left")
    for col in ("memory_note", "too_short"):
        out[col] = out[col].astype(object).where(out[col].notna(), "")
    # fp8 off a GPU: what an emulation measured is kept out of every verdict (report/fp8.py)
    out["emulated"] = emulated = fp8_report.speed_emulated(out["precision"], (environment or {}).get("device", "cpu"))
    out.loc[emulated, ["speedup_vs_fp32", "speed_min", "speed_max", "ttt_ratio", "ttt_low", "ttt_high",
                       "achieved_flops", "mfu_measured", "mfu_table", "memory_change_vs_fp32", "memory_difference_mib",
                       "memory_resolved", "memory_resolution_mib"]] = np.nan
    out.loc[emulated, "memory_note"] = fp8_report.EMULATED_MEMORY
    return out


def seed_counts_text(runs: pd.DataFrame) -> str:
    """How many seeds the medians are over, per model/dataset (and machine) where the groups differ."""
    ok = ok_runs(runs)
    if ok.empty:
        return ""
    keys = _keys(ok)
    counts = ok.groupby(keys, sort=False, dropna=False)["seed"].nunique()
    if counts.nunique() == 1:
        return seed_list_text(sorted(set(ok["seed"])))
    multi = named_machines(ok)
    return " and ".join(f"{seeds_text(int(n))} for {group_label(dict(zip(keys, k)), multi)}" for k, n in counts.items())


def fewer_seeds_note(runs: pd.DataFrame) -> str:
    """Why a model ran fewer seeds than the rest, where common.DEFAULT_MODEL_SEEDS is why ("" elsewhere)."""
    ok = ok_runs(runs)
    devices = set(ok.get("cfg_device", pd.Series(dtype=str)).dropna())
    if len(devices) != 1:
        return ""
    (device,), seeds = devices, set(ok["seed"])
    fewer = [(m, s) for m, s in DEFAULT_MODEL_SEEDS.get(device, {}).items()
             if set(ok.loc[ok["model"] == m, "seed"]) == set(s) and len(seeds) > len(s)]
    said = "; ".join(f"the {m} ran seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))} only" for m, s in fewer)
    return (f" ({said}: a compare on a {device.upper() if device == 'cpu' else device} given neither --seeds nor "
            f"--repeats runs it on that alone, to keep the default run short; {stats.MORE_SEEDS} runs it on every "
            "seed)") if fewer else ""


def legend(table: pd.DataFrame) -> str:
    """The summary table's legend: the brackets and words it can show, and only those."""
    several = "runs" in table and (table["runs"] > 1).any()
    brackets = "Brackets: the min–max of the seeds' values (3 or fewer seeds) or their IQR (more). " if several else ""
    keras_static = "framework" in table and any(scaling.cannot_skip(f, p) and precisions.of(p).loss_scaling
                                                for f, p in zip(table["framework"], table["precision"]))
    scaler = "a mode without a loss scaler" + (", or with Keras' static one," if keras_static else "")
    cut = ("; accuracy and peak memory where the speed budget stopped a cell of that precision (a run cut short "
           "is not comparable)" if "budget_cut" in table and (table["budget_cut"] > 0).any() else "")
    return ("Each row is what one framework and precision's training cells measured, the median over seeds. "
            f"{brackets}n/a: not measured, or not applicable ({scaler} skips no step){cut}. Each "
            "comparison with fp32 is a verdict, in the per-model tables above.")


def by_gpu_model(tables: dict) -> dict:
    """A run whose cells ran on several GPU models gets a `machine` column of each cell's GPU model; others as is."""
    runs = tables.get("run")
    if runs is None or "device_name" not in runs:
        return tables
    models = runs.set_index("cell_id")["device_name"]
    if models[models.notna() & (models != "cpu")].nunique() < 2:
        return tables
    return {name: df.assign(machine=df["cell_id"].map(models)) if "cell_id" in df else df
            for name, df in tables.items()}


def cap_label(device: str, cap_bytes: int | None) -> str:
    """What a search's memory cap is, in words (console, report note, figure caption)."""
    if device == "cuda":
        return ("the GPU's whole memory" if cap_bytes is None else
                f"a {format_size(cap_bytes)} GPU memory cap (torch set_per_process_memory_fraction, "
                "TensorFlow logical-device memory limit)")
    return f"a {format_size(cap_bytes)} cap on each probe process's CPU memory (RSS)" if cap_bytes else "no cap"


_SEARCH_CFG = ("framework", "model", "dataset", "precision", "device")  # of a search's cfg
_PROBE = ("batch", "ok", "peak_bytes", "memory_kind", "reason")  # of each probe
_SEARCH = ("cap_bytes", "max_ok", "first_failed", "stopped_early")  # of the search


def search_table(results: Iterable) -> pd.DataFrame:
    """One row per probe of every search (harness/run/maxbatch.py SearchResult objects), identity in columns."""
    rows = [{**({k: getattr(r.cfg, k) for k in _SEARCH_CFG} if r.cfg is not None else {}), "probe": order,
             **{k: getattr(p, k) for k in _PROBE}, **{k: getattr(r, k) for k in _SEARCH}}
            for r in results for order, p in enumerate(r.probes)]
    table = pd.DataFrame(rows, columns=[*_SEARCH_CFG, "probe", *_PROBE, *_SEARCH])
    return table.astype({"batch": "int64", "ok": "bool", "max_ok": "int64", "probe": "int64",
                         **dict.fromkeys(("peak_bytes", "cap_bytes", "first_failed"), "Int64")})  # None: missing
