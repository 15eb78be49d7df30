"""The Speed section's words: how throughput and warm-up are measured, what the CPU's flags do and do not say, and
the frameworks' own log lines on their half-precision path; the Profile section: the ops and library path behind a
mixed cell's step time outside SPEED_BAND of fp32's."""

from __future__ import annotations

import re
from collections import namedtuple
from pathlib import Path

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import framework_label
from amp_compare.contract.env import ARITHMETIC_FLAGS, AVX512_FOUNDATION, BELOW_AVX512, ISA_LIMITED
from amp_compare.contract.log_words import HALF_FALLBACK
from amp_compare.harness.common import SIZE, UNSTEADY, threads_text
from amp_compare.harness.report.hardware import ceiling_marks
from amp_compare.harness.report.phrases import ratio
from amp_compare.harness.report.stats import budgeted, ok_runs
from amp_compare.harness.report.tables import LOOP, group_label, with_loop_columns
from amp_compare.kit.profile import PLAIN_STEPS
from amp_compare.kit.trial import speed_status, trial_summary

FALLBACK_LINE = re.compile(re.escape(HALF_FALLBACK) + r"[^.]*\.\s*Falling back to [^.\n]*")  # float16's, in stderr
LogLine = namedtuple("LogLine", ["framework", "precision", "text"])  # a FALLBACK_LINE found in a cell's stderr.log


def framework_log_lines(run_dir: Path, runs: pd.DataFrame) -> list[LogLine]:
    """Each distinct FALLBACK_LINE per framework and precision, from the finished cells' stderr.log."""
    lines = []
    for r in ok_runs(runs).itertuples():
        path = Path(run_dir) / "cells" / str(r.cell_id) / "stderr.log"
        if path.is_file() and (match := FALLBACK_LINE.search(path.read_text(errors="replace"))):
            lines.append(LogLine(r.framework, r.precision, " ".join(match.group(0).split())))
    return list(dict.fromkeys(lines))


def isa_limit(environment: dict) -> str:
    """What the run did where it set contract/env.py's ISA_LIMIT_VARS (recorded as cpu_isa_limits), else ""."""
    limits = str(environment.get("cpu_isa_limits") or "")
    if not limits:
        return ""
    pairs = [part.split("=", 1) for part in limits.split(", ")]
    libraries = " and ".join(dict.fromkeys(ISA_LIMITED.get(name, name) for name, _ in pairs))
    below = all(value.upper() in BELOW_AVX512.get(name, ()) for name, value in pairs)
    return f"kept {libraries} from " + ("AVX-512" if below else "some of the CPU's instructions") + f" ({limits})"


def log_sentences(table: pd.DataFrame, environment: dict, logs: list[LogLine]) -> list[str]:
    """With a mixed row: each framework's log line on kernels, quoted, with the CPU's flags and ISA limit."""
    if not precisions.is_mixed(table["precision"]).any():
        return []
    listed = {f.strip() for f in str(environment.get("cpu_amp_flags") or "").split(",")}
    family = (AVX512_FOUNDATION, *ARITHMETIC_FLAGS["float16"])
    has, lacks = [f for f in family if f in listed], [f for f in family if f not in listed]
    said = ", ".join(has) + (f" but not {' or '.join(lacks)}" if lacks else "")
    flags = f"; beside it, this CPU's flags list {said if has else 'none of ' + ', '.join(lacks)}"
    did = isa_limit(environment)
    limit = f"; and this run {did}: the line does not say which of the two made it fall back" if did else ""
    return [f"{framework_label(line.framework)}'s {line.precision} cells logged: \"{line.text}\" (its own record of "
            f"the path it took){flags}{limit}." for line in logs]


def timing_paragraph(warmup: int, cells: str = "") -> str:
    """The Speed section's paragraph on how the training cells' throughput is measured (`cells`: how they ran)."""
    return (f"The training cells' throughput (what their training took{f', {cells}' if cells else ''}; not the speed "
            "verdicts, which are the trials' above) is the images of the timed steps divided by their wall time, with "
            f"the first {warmup} steps excluded as warm-up, stalls and host syncs included (a whole epoch, warm-up "
            "included, is the epoch-time column); training is timed apart from validation, process start and imports. "
            "The median-step figure (batch size over the p50, the median, step time) is shown beside it: a gap of "
            "more than 10% between them is called out in the hardware table's timing note (stalled steps, syncs, or a "
            "noisy machine). Throughput from epoch time divides all images by the whole training time, the warm-up "
            "steps included; the column beside it says, per row, whether it came out lower or higher than the "
            "median-step figure and by how much. \"First step's extra time\" is the first step's time beyond the "
            "median step (ms).")


def hardware_paragraph(table: pd.DataFrame, ceilings: list[str] | tuple[str, ...] = ()) -> str:
    """The Hardware efficiency table's paragraph, from `table`'s ceiling marks and the run's `ceilings`."""
    emulated, limited = ceiling_marks(table)
    text = ("Per row, each column the median over the row's cells (its seeds): training FLOPs per image (counted "
            "once from the layer shapes both frameworks share), the FLOP/s achieved over the timed steps' wall "
            "time, and MFU: that rate over the run's one FLOP/s ceiling per device and dtype, the best "
            "matmul of one fixed size timed by any cell of the run, in either framework, so both frameworks are "
            "measured against the same ceiling" + ("; MFU against the device's data-sheet ceiling too."
                                                   if table.get("mfu_table", pd.Series()).notna().any() else "."))
    if ceilings:
        text += f" This run's ceiling{'s' if len(ceilings) > 1 else ''}: {'; '.join(ceilings)}."
    text += (" The verdict host-bound / compute-bound comes from how throughput moved with the batch size; "
             "without --batch-sizes it is \"undetermined\", or \"compute-bound\" with its rule beside it (MFU ≥ "
             "50%). \"Warm-up steps' extra time\" is, summed over the warm-up steps slower than the median step, each "
             "one's time beyond it (ms), whatever it went to (first-call setup, tracing or compilation where the "
             "loop compiles).")
    if emulated:
        text += (" Where the CPU's flags list no arithmetic for a half format, that format's cells are measured "
                 "against the fp32 matmul's ceiling (marked \"no … arithmetic\"), used because this CPU has no "
                 "arithmetic in that format: a matmul in that format would time its conversions to float32, not a "
                 "ceiling, so none is timed. The mark says which ceiling was used, not which kernels the cells ran.")
    if limited:
        text += (" Where the run kept oneDNN or PyTorch's own kernels from a half format's instructions (marked "
                 "\"… arithmetic limited by\" and the variables that did it), that format's cells are measured "
                 "against the fp32 matmul's ceiling: a matmul in that format timed under the limit is no ceiling.")
    return text + (" An MFU over 100% is marked ⚠: the measured matmul was then not the ceiling of the kernels "
                   "the cell ran.")


def relation(value: float, reference: float) -> str:
    """How `value` compares with `reference`, in words a reader cannot misread ("21% lower")."""
    if not (np.isfinite(value) and np.isfinite(reference)) or reference <= 0:
        return "n/a"
    change = value / reference - 1
    if abs(change) < 0.005:
        return "equal (within 0.5%)"
    return f"{abs(change):.0%} {'higher' if change > 0 else 'lower'}"


def calibration_checks(environment: dict) -> list[float]:
    """The run's calibration checks in ms, in time order (an older record's before/after pair)."""
    listed = environment.get("calibrations")
    if isinstance(listed, list) and listed:
        return [float(c["ms"]) for c in listed if isinstance(c, dict) and c.get("ms")]
    return [float(environment[k]) for k in ("calibration_before_ms", "calibration_after_ms") if environment.get(k)]


def machine_note(environment: dict) -> str:
    """How busy the machine was, from the run's calibration checks ("" under two); no verdict reads it."""
    ms = calibration_checks(environment)
    if len(ms) < 2:
        return ""
    listed = environment.get("calibrations")
    if len(ms) == 2:  # in order: a median of two would hide which way it went
        where, read = "", f"read {ms[0]:.1f} ms before the cells and {ms[1]:.1f} ms after them"
    else:  # only a list of checks has more than two
        between = any(str(c.get("when", "")).startswith("after ") and c.get("when") != "after the matrix"
                      for c in listed)
        where = " before the cells, between them and after them," if between else " before and after the cells,"
        read = f"read {min(ms):.1f}–{max(ms):.1f} ms, median {float(np.median(ms)):.1f} ms"
    old = [{"spread": environment.get(f"calibration_{when}_spread")} for when in ("before", "after")]
    spreads = [float(c["spread"]) for c in (listed if isinstance(listed, list) else old) if c.get("spread") is not None]
    unsteady = (f"; within a check its rounds varied by up to {max(spreads):.0%} of their median (p10 to p90), more "
                f"than the {UNSTEADY:.0%} of a steady machine" if spreads and max(spreads) > UNSTEADY else "")
    return (f"How busy the machine was: {len(ms)} calibration checks (a fixed {SIZE}×{SIZE} float32 matmul timed"
            f"{where} while no cell ran) {read}{unsteady}.")


def _phase_medians(phases: pd.DataFrame | None, cells: pd.DataFrame) -> dict:
    """Medians over the cells: CPU-s per training second, evaluation seconds, warm-up (compile_warmup_s) seconds."""
    if phases is None or phases.empty:
        return {}
    mine = phases[phases["cell_id"].isin(set(cells["cell_id"]))]
    # a cell that recorded no such phase spent no time in it; a phase no cell recorded has no median
    by = mine.groupby(["cell_id", "phase"])[["seconds", "cpu_seconds"]].sum().unstack("phase").fillna(0.0)
    by[("cpu", "training")] = by.get(("cpu_seconds", "training"), np.nan) / by.get(("seconds", "training"), np.nan)
    median = by.median()
    return {"cpu": float(median.get(("cpu", "training"), np.nan)), "eval": float(median.get(("seconds", "evaluation"),
            np.nan)), "warmup": float(cells.get("compile_warmup_s", pd.Series(dtype=float)).median())}


def conditions(launcher: dict, cell_threads, trial_threads) -> tuple[str, str]:
    """(how the training cells ran, how the speed trials did) from the launcher and threads; ("", "") under submitit."""
    if launcher.get("launcher") == "submitit":
        return "", ""
    cells, trials = threads_text(cell_threads), threads_text(trial_threads)
    ran = f"up to {n} at once" if (n := int(launcher.get("parallel") or 1)) > 1 else "one after another"
    return f"{ran}{f', {cells} each' if cells else ''}", "no cell beside them" + (f", {trials}" if trials else "")


def trials_table(trials: pd.DataFrame | None) -> pd.DataFrame:
    """The Speed section's table of the speed trials, one row per trial x mixed precision; empty without trials."""
    if trials is None or trials.empty or "threads" not in trials:
        return pd.DataFrame()
    summary = trial_summary(trials)
    threads = trials.groupby("trial_id")["threads"].first()
    return pd.DataFrame([{"model": r.model, "dataset": r.dataset, "framework": framework_label(r.framework),
                          "precision": r.precision, "batch": int(r.batch_size),
                          "speed (× fp32's)": f"{ratio(r.ratio)} [{ratio(r.low)[:-1]}, {ratio(r.high)[:-1]}]",
                          "verdict": speed_status(r.ratio, r.low, r.high), "rounds": int(r.rounds),
                          "contended blocks": f"{r.contended_blocks} of {2 * r.rounds}",
                          "fp32 step (ms)": round(1000 * r.fp32_step_s, 1),
                          "mixed step (ms)": round(1000 * r.mixed_step_s, 1), "threads": int(threads[r.trial_id])}
                         for r in summary.itertuples()])


def trial_and_cells(verdicts: pd.DataFrame, full: pd.DataFrame, runs: pd.DataFrame,
                    phases: pd.DataFrame | None) -> list[str]:
    """A sentence per speed trial whose interval misses the training cells' ratio: the cells' CPU and extra time."""
    out = []
    timed = verdicts[(verdicts["metric"] == "speed") & verdicts["low"].notna()]
    ok, varying = with_loop_columns(ok_runs(runs).copy()), {k for k in LOOP if full[k].nunique() > 1}

    def same(table: pd.DataFrame, v, precision: str) -> pd.DataFrame:  # the trial's model, framework, loop and batch
        want = {**{k: getattr(v, k) for k in ("model", "dataset", "framework", *LOOP)}, "precision": precision}
        return table[np.logical_and.reduce([(table[k] == x) | (table[k].isna() & pd.isna(x)) for k, x in want.items()])]
    for v in timed.itertuples():
        row = same(full, v, v.precision)
        if row.empty or not np.isfinite(cells := float(row["speedup_vs_fp32"].iloc[0])) or v.low <= cells <= v.high:
            continue
        lo, hi, n = row[["speed_min", "speed_max", "runs"]].astype(float).iloc[0]
        seeds = "one seed" if n == 1 else f"the geometric mean of the {n:.0f} seeds' ratios, {lo:.3f}–{hi:.3f}×"
        fp32, mixed = (_phase_medians(phases, same(ok, v, p)) for p in ("fp32", v.precision))
        text = (f"{group_label(v._asdict(), set(), varying)}, {framework_label(v.framework)} {v.precision}: the "
                f"training cells ran at {cells:.3f}× fp32's throughput ({seeds}), outside the speed trial's "
                f"{v.estimate:.3f}× [{v.low:.3f}, {v.high:.3f}]")
        if fp32 and mixed:
            s = {k: "n/a" if np.isnan(x) else f"{x:.1f} s" for k, x in (
                ("w32", fp32["warmup"]), ("w", mixed["warmup"]), ("e32", fp32["eval"]), ("e", mixed["eval"]))}
            text += (f"; the cells (medians over seeds) used {fp32['cpu']:.2f} (fp32) and {mixed['cpu']:.2f} "
                     f"({v.precision}) CPU-seconds per second of training, their warm-up steps slower than the median "
                     f"step took {s['w32']} and {s['w']} beyond it in all, and they spent {s['e32']} and {s['e']} "
                     "evaluating, outside the timed steps")
        out.append(text + ".")
    return out


def budget_note(runs: pd.DataFrame, limit_s: float) -> list[str]:
    """Which finished cells the speed budget stopped, after how many of fp32's steps, and what it costs."""
    ok = ok_runs(runs)
    if (cut := ok[budgeted(ok)]).empty:
        return []
    full = ok[ok["precision"] == precisions.REFERENCE]
    planned = full.groupby(["framework", "model"])["steps_total"].median()
    said = ", ".join(
        f"{framework_label(f)} {m} {p} ({len(g)} cell{'s' * (len(g) != 1)}, "
        + "/".join(str(int(n)) for n in sorted(set(g["steps_total"])))
        + (f" of {int(planned[(f, m)])}" if (f, m) in planned else "") + " steps)"
        for (f, m, p), g in cut.groupby(["framework", "model", "precision"], sort=False))
    return [f"The speed budget stopped {len(cut)} cell{'s' * (len(cut) != 1)}: {said}. Their first steps projected "
            f"more than the {limit_s:g} s cell budget; their precision's accuracy, memory and time to target are "
            "compared with nothing (their speed comes from the speed trials); --no-speed-budget runs them in full."]


SPEED_BAND = 1.1  # mixed vs fp32 median step ratio outside [1/1.1, 1.1]: a slowdown or speed-up worth explaining
BAND_TEXT = f"{SPEED_BAND - 1:.0%}"
SHOWN_OPS = 3  # operations named per cell
NO_PROFILE = "unexplained: no profile evidence for this cell or its fp32 cell (run with --profile)"
NONE_MOVED = f"No mixed cell ran more than {BAND_TEXT} slower or faster than its fp32 cell."


def _explain(run: pd.Series, base: pd.Series, ratio: float, ops: pd.DataFrame, prims: pd.DataFrame) -> dict:
    """The ops that moved most in the direction of a mixed cell's step `ratio` to its fp32 cell (>1: it is faster)."""
    row = {"cell": run["cell_id"], "vs fp32": f"{ratio:.2f}x ({'faster' if ratio > 1 else 'slower'})"}
    mine, theirs = (ops[ops["cell_id"] == c["cell_id"]].groupby("op")["self_time_s"].sum()  # self time per step
                    / max(c.get("profile_steps", float("nan")), 1.0) for c in (run, base))
    if mine.empty or theirs.empty:
        return {**row, "operations behind the difference": NO_PROFILE, "library path": "", "casts": ""}
    moved = mine.sub(theirs, fill_value=0.0).sort_values(ascending=ratio > 1).head(SHOWN_OPS)
    moved = moved[(moved < 0) if ratio > 1 else (moved > 0)]
    total = mine.sum() - theirs.sum()
    lib = ops[ops["cell_id"].isin([run["cell_id"], base["cell_id"]])].drop_duplicates("op").set_index("op")["library"]
    share = moved.sum() / total if total and np.isfinite(total) and (total > 0) == (ratio < 1) else float("nan")
    text = "; ".join(f"{op} {d * 1e3:+.1f} ms/step" for op, d in moved.items()) + (
        f" ({share:.0%} of the window's {total * 1e3:+.1f} ms/step)" if np.isfinite(share) else "")
    # oneDNN's reference (non-JIT) kernels the cell ran: the library path that makes a half precision crawl
    slow = prims[(prims["cell_id"] == row["cell"]) & prims["impl"].str.startswith("ref")] if not prims.empty else prims
    paths = [f"{op}: {lib.get(op) or 'not reported'}" for op in moved.index] + [
        f"oneDNN ran its reference kernel {r.impl} for {r.kind} {r.prop_kind} ({r.dtype})" for r in slow.itertuples()]
    return {**row, "operations behind the difference": text or "no op moved in that direction in the window",
            "library path": "; ".join(paths), "casts": f"{run.get('profile_cast_share', np.nan):.1%} vs fp32 "
                                                       f"{base.get('profile_cast_share', np.nan):.1%}"}


def profile_section(tables: dict[str, pd.DataFrame]) -> dict | None:
    """The section's table and sentences, or None when no cell of the run was profiled."""
    runs = tables.get("run", pd.DataFrame())
    if runs.empty or "profile_step_s" not in runs.columns:
        return None
    ops = tables.get("profile_ops", pd.DataFrame(columns=["cell_id", "op", "self_time_s", "library"]))
    prims = tables.get("profile_primitives", pd.DataFrame(columns=["cell_id", "impl"]))
    ok = runs[runs["status"] == "ok"].set_index("cell_id", drop=False)
    rows = []
    for _, run in ok[ok["precision"] != precisions.REFERENCE].iterrows():
        fp32 = run["cell_id"].replace(f"-{run['precision']}-", f"-{precisions.REFERENCE}-", 1)  # its fp32 cell's id
        ratio = ok.loc[fp32, "median_step_s"] / run["median_step_s"] if fp32 in ok.index and run["median_step_s"] > 0 \
            else 1.0  # no fp32 cell or no step time: nothing to explain
        if not 1 / SPEED_BAND <= ratio <= SPEED_BAND:
            rows.append(_explain(run, ok.loc[fp32], ratio, ops, prims))
    profiled = ok[ok["profile_step_s"].notna()]
    traces = [f"{c}: cells/{c}/{t}" for c, t in zip(profiled["cell_id"], profiled["profile_trace"]) if t]
    over = profiled["profile_overhead"].dropna()  # how the window was kept out of the timed steps, and its cost
    cost = (f"a profiled step took {over.median():.2f}x a bare one (median over {len(over)} cells, range "
            f"{over.min():.2f}-{over.max():.2f}x)" if len(over) else "no cell timed both windows")
    said = [f"The profiled steps ran after each cell's timed epochs, never among them: {PLAIN_STEPS} bare steps, "
            f"then {int(profiled['profile_steps'].max())} under the profiler; {cost}."] if not profiled.empty else []
    return {"table": pd.DataFrame(rows), "sentences": said, "traces": traces, "none_moved": NONE_MOVED,
            "band": BAND_TEXT}
