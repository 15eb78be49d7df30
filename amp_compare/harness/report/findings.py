"""The findings: the English sentences a reader sees first, each built only from the aggregated table of
tables.py (full_table) and the run's own records, so the HTML report, summary.md and the terminal agree."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import framework_label as _label
from amp_compare.harness.report import fp8 as fp8_report
from amp_compare.harness.report import memory, stats
from amp_compare.harness.report import numerics as nr
from amp_compare.harness.report.cell_text import accuracy_interval_kind, interval_kind, mark, pp_bound, ratio_number
from amp_compare.harness.report.hardware import ceiling_limits, ceiling_sentences, on_fp32_ceiling
from amp_compare.harness.report.speed import LogLine, isa_limit, slowdown_sentences
from amp_compare.harness.report.steadiness import describe as describe_steadiness
from amp_compare.harness.report.tables import (
    LOOP,
    full_table,
    group_label,
    named_machines,
    ok_runs,
    same_value,
    seeds_text,
    varying_keys,
    with_loop_columns,
)


def speed_text(r) -> str:
    """A mixed cell's speed ratio as the summary and findings show it: with its interval and, where the
    interval does not support it, why."""
    if getattr(r, "emulated", False):
        return fp8_report.EMULATED_SPEED
    basis = getattr(r, "speed_basis", "")
    text = f"{ratio_number(r.speedup_vs_fp32, basis)}×"
    if np.isfinite(getattr(r, "speed_low", np.nan)):
        seeds = getattr(r, "speed_seeds", 0)
        values = (f"; seeds {r.speed_min:.2f}–{r.speed_max:.2f}" if basis == "seeds"
                  and 1 < seeds <= 3 and np.isfinite(getattr(r, "speed_min", np.nan)) else "")
        text += (f" [{interval_kind(r.speed_basis, seeds)}: {ratio_number(r.speed_low, basis)}–"
                 f"{ratio_number(r.speed_high, basis)}{values}]")
    if getattr(r, "speed_note", ""):
        text += f" ⚠ {r.speed_note}"
    return text


def accuracy_text(r) -> str:
    """A mixed cell's accuracy change, worded from its paired test: never a difference without its interval."""
    if getattr(r, "budget_note", ""):
        return f"not comparable ({r.budget_note})"
    if getattr(r, "too_short", ""):
        return "not comparable (run too short)"
    p = getattr(r, "p_value", np.nan)
    if not np.isfinite(p):
        return "no paired test (no per-image results)"
    ptext, kind = f"p = {p:.2g}", accuracy_interval_kind(getattr(r, "test", ""))
    if getattr(r, "test", "") == stats.NO_DIFFERENCE:  # no test ran, so there is no p to print
        return f"classified every image right or wrong exactly as fp32 did ({kind} ±{r.ci_high:.1f} pp)"
    if not stats.detectable({"p_value": p, "ci_low": r.ci_low, "ci_high": r.ci_high}):
        return (f"no detectable difference ({r.diff_pp:+.1f} pp [{kind} {pp_bound(r.ci_low)}, {pp_bound(r.ci_high)}], "
                f"{ptext})")
    if r.diff_pp < 0:
        return f"lower by {-r.diff_pp:.1f} pp [{kind} {-r.ci_high:.1f}, {-r.ci_low:.1f}] ({ptext})"
    return f"higher by {r.diff_pp:.1f} pp [{kind} {r.ci_low:.1f}, {r.ci_high:.1f}] ({ptext})"


def _time_text(r) -> str:
    if not np.isfinite(r.target) or r.timed_seeds == 0:
        return "n/a"
    if not np.isfinite(r.time_to_target_s):
        return f"not reached ({r.reached_seeds:.0f} of {r.timed_seeds:.0f} seeds reached it)"
    text = f"{r.time_to_target_s:.1f} s" + (f" ({r.reached_seeds:.0f} of {r.timed_seeds:.0f} seeds reached it)"
                                            if r.reached_seeds != r.timed_seeds else "")
    if getattr(r, "emulated", False):
        return text + f" ({fp8_report.EMULATED_SPEED})"
    if np.isfinite(getattr(r, "ttt_ratio", np.nan)):
        interval = f" [95% t-interval over seeds {r.ttt_low:.2f}–{r.ttt_high:.2f}]" if np.isfinite(r.ttt_low) else ""
        # the ratio is the geometric mean of each seed's own ratio, not the quotient of the medians printed beside it
        mean = ", geometric mean of the seeds' ratios" if interval else ""
        text += f" ({r.ttt_ratio:.2f}× fp32's{mean}{interval}{mark(r.ttt_note)})"
    return text


def _notes(notes, same: str = "1×") -> str:
    """The distinct ⚠ notes of a sentence's numbers, said once at its end (the intervals themselves are beside
    the numbers: "noisy" is said once, in words)."""
    noisy = stats.noisy_rule(direction=same == "1×", same=same)
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
        return cls(table, items, named_machines(table), varying_keys(table))

    def label(self, key: dict) -> str:
        return group_label(key, self.multi, self.varying)

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
        parts = [f"{r.precision} {speed_text(r)} ({r.throughput_img_s:,.0f} images/s in emulation)"
                 if r.emulated else
                 f"{r.precision} at {speed_text(r)} ({r.throughput_img_s:,.0f} images/s)" for r in mixed.itertuples()]
        out.append(f"{label}, {_label(fw)} ({seeds_text(int(fp32['runs'].iloc[0]))}): against fp32's "
                   f"{fp32['throughput_img_s'].iloc[0]:,.0f} images/s, {'; '.join(parts)}.")
    table = groups.table
    is_mixed = precisions.is_mixed(table["precision"])
    if (table.loc[is_mixed, "speed_basis"] == "steps").any():
        out.append("With one seed a speed interval covers the step-to-step noise of that seed's two cells only: how "
                   "much the ratio varies from seed to seed is unknown (run with "
                   f"{stats.MORE_SEEDS} to measure it).")
    measured = is_mixed & ~table["emulated"].astype(bool)  # an emulation's is no speed result
    flagged = table[measured & (table["speed_note"] != "")]
    if not flagged.empty:
        out.append(flagged_sentence(list(flagged["speed_note"]), int(measured.sum()), interval_method(table)))
    return out


def flagged_sentence(notes: list[str], total: int, method: str) -> str:
    """How many of the cells' wall-time speed ratios are marked ⚠ (the Speed section's table gives each one's note)."""
    intervals = f" Their 95% intervals: {method}." if method else ""
    return (f"{len(notes)} of {total} wall-time speed ratios are marked ⚠: the run's evidence does not support them "
            f"(the Speed section's table says why each).{intervals}")


def slowdown_scope(runs: pd.DataFrame) -> bool:
    """Whether the run's slowdowns can be explained from one CPU's flags: every cell on a CPU, one CPU model."""
    devices = set(runs.get("cfg_device", pd.Series(dtype=str)).dropna())
    one_cpu = runs["cpu_model"].nunique() <= 1 if "cpu_model" in runs else "machine" not in runs
    return devices == {"cpu"} and bool(one_cpu)


def machine_findings(groups: Groups, runs: pd.DataFrame, environment: dict) -> list[str]:
    """The machine's steadiness, mixed precision slower than fp32 with what the run's evidence says of why,
    and MFU."""
    out = []
    steadiness = describe_steadiness(environment)
    if steadiness:
        out.append(steadiness)
    table = groups.table
    if slowdown_scope(runs):
        logs = [line for line in environment.get("framework_logs", []) if isinstance(line, LogLine)]
        out += slowdown_sentences(table, environment, logs)
    if table["mfu_measured"].notna().any():
        out += ceiling_sentences(with_loop_columns(ok_runs(runs).copy()))
    return out + mfu_findings(table)


def memory_findings(groups: Groups, runs: pd.DataFrame) -> list[str]:
    """Per model/dataset: each mixed cell's peak memory against fp32, a percentage with its interval where it
    exceeds the run's resolution, "below what this run resolves" where it does not (memory.py)."""
    kinds = ", ".join(sorted(set(ok_runs(runs)["memory_kind"].dropna())))
    out = []
    for key, group in groups.items:
        mem = group[precisions.is_mixed(group["precision"]) & group["memory_change_vs_fp32"].notna()]
        if not mem.empty:
            parts = [f"{_label(r.framework)} {r.precision} {memory.finding_text(r)}" for r in mem.itertuples()]
            out.append(f"{groups.label(key)}, peak memory against fp32 ({kinds}; the change is the geometric mean "
                       f"over seeds of each seed's ratio, MiB the median difference): {'; '.join(parts)}."
                       f"{_notes(mem['memory_note'], 'no change')}")
        emulated = group[group["emulated"].astype(bool)]
        if not emulated.empty:  # withheld as their speed is: the emulation's memory, not fp8's
            out.append(f"{groups.label(key)}, peak memory of {', '.join(sorted(set(emulated['precision'])))}: not "
                       f"compared with fp32, {fp8_report.EMULATED_MEMORY}; no fp8 arithmetic ran.")
    return out


def too_short_findings(groups: Groups) -> list[str]:
    """Per model/dataset whose fp32 did not learn enough: that accuracy cannot be compared, and what to change
    (the accuracy section repeats these as its warnings)."""
    out = []
    for key, group in groups.items:
        short = group["too_short"].iloc[0]
        if short:
            out.append(f"Accuracy cannot be compared from this run for {groups.label(key)}: {short}. Train longer "
                       "(more --epochs, no --steps-per-epoch cap) or on the real dataset before reading accuracy "
                       "differences.")
    return out


def accuracy_findings(groups: Groups) -> list[str]:
    """The paired accuracy tests, or why the run cannot answer."""
    out = too_short_findings(groups)
    for label, fw, mixed, fp32 in groups.per_framework():
        if mixed["too_short"].iloc[0]:
            continue
        tested = mixed[np.isfinite(mixed["p_value"].astype(float))]
        method = _accuracy_method(tested)
        parts = [f"{r.precision} {accuracy_text(r)}" for r in mixed.itertuples()]
        out.append(f"{label}, {_label(fw)} ({seeds_text(int(fp32['runs'].iloc[0]))}): final validation accuracy "
                   f"against fp32's {fp32['val_accuracy'].iloc[0]:.1%}: {'; '.join(parts)}{method}.")
    return out


def _accuracy_method(tested: pd.DataFrame) -> str:
    """How the sentence's accuracy intervals were made: the test each row really ran, the exact bound where
    every image was classified right or wrong exactly as in fp32 (no test ran there)."""
    if tested.empty:
        return ""
    first = tested.iloc[0]
    images, seeds = int(first.images), int(first.seeds)
    shortcut = tested["test"] == stats.NO_DIFFERENCE
    in_seeds = "" if seeds == 1 else f" in each of {seeds} seeds"
    exact = (f"every one of the {images} validation images was classified right or wrong exactly as in fp32{in_seeds}, "
             f"so no test ran: ±{stats.no_discordance_bound(images):.1f} pp is the exact 95% bound (Clopper-Pearson, "
             f"0 of {images}) on the share of images that could differ")
    test = (f"McNemar's exact test on {images} validation images" if seeds == 1 else
            f"paired bootstrap over {images} validation images × {seeds} seeds")
    if shortcut.all():
        return f"; {exact}"
    if shortcut.any():
        return f"; {test} ({', '.join(tested.loc[shortcut, 'precision'])}: {exact})"
    return f"; {test}"


def time_findings(groups: Groups) -> list[str]:
    """Time to the target accuracy per cell, each mixed one against fp32's with its interval."""
    out = []
    for key, group in groups.items:
        if group["too_short"].iloc[0] or not np.isfinite(group["target"].iloc[0]):
            continue
        first = group.iloc[0]
        parts = [f"{_label(fw)} " + ", ".join(f"{r.precision} {_time_text(r)}" for r in g.itertuples())
                 for fw, g in group.groupby("framework", sort=False)]
        out.append(f"{groups.label(key)}, training time to {first.target:.1%} validation accuracy "
                   f"({first.target_basis}; median over seeds, validation excluded): {'; '.join(parts)}."
                   f"{_row_notes(group, 'ttt_note')}{_same_epoch(group)}")
    return out


def _row_notes(group: pd.DataFrame, column: str) -> str:
    """The ⚠ notes of a sentence's numbers, each named by its row (framework and precision): several rows' notes
    run together would not say which is whose."""
    whose: dict[str, list[str]] = {}
    for r in group.itertuples():
        note = getattr(r, column)
        if isinstance(note, str) and note:
            whose.setdefault(note, []).append(f"{_label(r.framework)} {r.precision}")
    if len(whose) == 1:  # one note for every marked row: nothing to tell apart
        return f" ⚠: {next(iter(whose))}."
    said = ["{}: {}".format(", ".join(rows), note) for note, rows in whose.items()]
    return f" ⚠: {'; '.join(said)}." if said else ""


def _same_epoch(group: pd.DataFrame) -> str:
    """Where every cell reached the target in the same epoch: what its times then measure. The records number
    epochs from 0; a reader counts from 1. A time is all the training up to that epoch's end, so it holds every
    cell's first-epoch warm-up (Keras traces and compiles its step function there), not only its steady speed."""
    epochs = set(group["reached_epochs"].fillna(""))
    if not (len(epochs) == 1 and "," not in next(iter(epochs)) and next(iter(epochs))
            and (group["reached_seeds"] == group["timed_seeds"]).all()):
        return ""
    n = int(epochs.pop()) + 1
    fws = set(group["framework"]) if "framework" in group else set()
    words = (("keras", "Keras traces and compiles its step"), ("torch", "PyTorch makes its first calls"))
    where = [w for fw, w in words if any((f != "torch") == (fw == "keras") for f in fws)]
    return (f" Every cell reached it at the end of epoch {n} of its run (counting from 1), so each time is that "
            f"cell's training time over its first {n} epoch{'s' if n != 1 else ''}, first-step and warm-up time "
            f"included{' (where ' + ', and '.join(where) + ')' if where else ''}: they differ as the whole training "
            "time does, which the timed steps' speed alone does not give.")


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
            sel = sel[same_value(sel[k], v)]
        parts = []
        for fw in group["framework"].drop_duplicates():
            cells = [g.sort_values("step") for _, g in sel[sel["framework"] == fw].groupby("cell_id")]
            if cells:
                skipped = float(np.median([g["skipped"].sum() for g in cells]))
                n = float(np.median([len(g) for g in cells]))
                last = float(np.median([g["loss_scale"].iloc[-1] for g in cells]))
                per_seed = ", median per seed" if len(cells) > 1 else ""
                parts.append(f"{_label(fw)} skipped {skipped:.0f} of {n:.0f} steps and ended at scale "
                             f"2^{np.log2(last):.0f} ({seeds_text(len(cells))}{per_seed})")
        if parts:
            growth = nr.growth_sentence(ok[ok["cell_id"].isin(set(sel["cell_id"]))], sel)
            out.append(f"{groups.label(key)}, dynamic loss scaling (fp16): " + "; ".join(parts) + "."
                       + (f" {growth}" if growth else ""))
    return out


@dataclass
class Findings:
    """The findings as facts the page lays out: every sentence in order, the accuracy warnings among them, and
    whether a slowdown sentence already explained the CPU (the page then shows no separate flags note)."""

    sentences: list[str]
    accuracy_warnings: list[str]
    slowdown_explained: bool


def finding_parts(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict,
                  epochs: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> Findings:
    """Sentences built only from the aggregated table (full_table, computed here unless given) and the run's
    own records, in its order, each naming the model and dataset (and machine, where several) its numbers
    belong to and how many seeds they are over."""
    table = full_table(runs, steps, epochs, environment) if table is None else table
    if table.empty:
        return Findings(["No cell finished, so there is nothing to compare yet; see the failed cells below."], [],
                        False)
    groups = Groups.of(table)
    out = [*speed_findings(groups), *machine_findings(groups, runs, environment), *memory_findings(groups, runs),
           *accuracy_findings(groups), *time_findings(groups), *scaling_findings(groups, runs, steps)]
    diverged = nr.with_loss_history(runs[runs["status"] == "diverged"], steps) if "status" in runs else runs.iloc[0:0]
    mixed = table[precisions.is_mixed(table["precision"])]
    ended = [f"{r.model} on {r.dataset}, {_label(r.framework)} {r.precision} (seed {r.seed}) diverged: {r.error}"
             + (f"; {nr.ending_text(r, since=False)}." if nr.ending_text(r) else ".") for r in diverged.itertuples()]
    return Findings(
        ended[::-1] + out, too_short_findings(groups),
        slowdown_scope(runs) and bool((mixed["speedup_vs_fp32"] < 1).any()))


def findings(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict,
             epochs: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> list[str]:
    """finding_parts' sentences (the terminal and summary.md show these)."""
    return finding_parts(runs, steps, environment, epochs, table).sentences


def mfu_findings(table: pd.DataFrame) -> list[str]:
    """What the MFU column is measured against where that is not the cell's own dtype, and any MFU over 100%
    (the measured matmul is then not the ceiling of the path the cell ran: the number is shown, flagged)."""
    out = []
    dtypes = table.get("ceiling_dtype", pd.Series(dtype=str)).fillna("")
    emulated = table[on_fp32_ceiling(dtypes)]
    if not emulated.empty:
        which = ", ".join(sorted(set(emulated["precision"])))
        out.append(f"MFU of the {which} cells is against the fp32 matmul ceiling, used because this CPU's flags "
                   "list no arithmetic for their half format (the ceiling chosen, not a record of which kernels ran).")
    limits = ceiling_limits(dtypes)
    limited = table[limits != ""]
    if not limited.empty:
        which = ", ".join(sorted(set(limited["precision"])))
        did = isa_limit({"cpu_isa_limits": limits[limits != ""].iloc[0]})[0]
        out.append(f"MFU of the {which} cells is against the fp32 matmul ceiling, used because this run {did}: a "
                   "half-format matmul timed under that limit is no ceiling (the ceiling chosen, not a record of "
                   "which kernels ran).")
    over = table[table["mfu_measured"] > 1]
    if not over.empty:
        cells = ", ".join(f"{_label(r.framework)} {r.precision} batch {r.batch_size:.0f} ({r.mfu_measured:.0%})"
                          for r in over.itertuples())
        out.append(f"MFU above 100% in {len(over)} cell(s) ({cells}): the model trained faster than the matmul "
                   "measured as the ceiling, so that matmul is not the ceiling of the kernels these cells ran; "
                   "read their MFU as a ratio of two measured rates, not as a fraction of the hardware.")
    return out
