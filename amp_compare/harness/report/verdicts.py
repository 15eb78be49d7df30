"""Every verdict of a run as data: one row per model x dataset x framework x mixed precision x metric. Each metric
has an ordered rule table: the first rule that holds for the row's facts sets its status and reason."""

from __future__ import annotations

import json
from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.harness.report import stats

METRICS = ("speed", "memory", "accuracy", "time_to_target", "numerics")

STATUSES = {  # the closed set; the metric says which direction words apply
    "faster": "speed, time to target: mixed precision took less time than fp32, its 95% interval wholly on that side "
              "of 1× (speed: above it, as a multiple of fp32's speed; time to target: below it, of fp32's time)",
    "slower": "speed, time to target: mixed precision took more time than fp32, its 95% interval wholly on that side "
              "of 1× (speed: below it; time to target: above it)",
    "smaller": "memory: a lower peak than fp32's in every seed, by more than fp32's or its own seeds varied",
    "larger": "memory: a higher peak than fp32's in every seed, by more than fp32's or its own seeds varied",
    "higher": "accuracy: more images right than fp32, the 95% interval excludes 0",
    "lower": "accuracy: fewer images right than fp32, the 95% interval excludes 0",
    "same": "no difference beyond the stated margin (speed, time: ±5%; accuracy: fp32's own seed-to-seed range, "
            "measured in the run, or none: every validation image classified as fp32 classified it, in the seeds "
            "run) or, numerics, trained finite",
    "undecided": "measured, but the run cannot tell which way",
    "not_comparable": "nothing to compare (no trial, an emulation, a cut or too short run, no fp32 partner)",
    "failed": "the mixed cells did not finish",
    "differs": "loss scale path: the frameworks' scales differed at some step of the same seed",
    "skipped": "skipped steps: the scaler skipped updates (non-finite gradients at the scale then in use)",
    "clean": "skipped steps, underflow: no update skipped / no gradient element came out 0 in the float16 backward "
             "(attention key-bias residue apart)",
    "lost": "underflow: gradient elements the float32 reference holds came out 0 in the float16 backward (attention "
            "key-bias residue apart)",
    "sufficed": "static scale: no overflow (no skip, no non-finite loss) and no gradient element lost at it (0 both "
                "at it and without it)",
    "insufficient": "static scale: it overflowed or gradient elements were lost at it (0 both at it and without it)",
    "overflowed": "naive attention: training went non-finite (a skipped update or a non-finite loss)",
    "finite": "naive attention: no update skipped and every loss finite to the end",
    "agrees": "data parallel: the N-worker run's losses within what a rerun at another thread count moved them by",
    "departs": "data parallel: the N-worker run's losses beyond that floor, or its workers disagreed",
}

REASONS = {
    "interval_excludes_1": "the ratio's 95% interval lies wholly on one side of 1",
    "within_5pct": "the ratio's 95% interval lies within ±5% of 1",
    "interval_too_wide": "the 95% interval is wider than the margin and includes no change",
    "no_interval": "a single measurement: no interval",
    "contended": "in some of the trial's blocks the process got much less CPU than its own best blocks (or its "
                 "threads) allowed",
    "no_trial": "the run timed no speed trial",
    "emulated": "fp8 off a GPU: an emulation's time and memory are not fp8's",
    "above_resolution": "every seed's difference exceeds what fp32's seeds and the mixed precision's each varied by",
    "unresolved_memory": "some seed's difference is within what fp32's or the mixed precision's seeds varied by",
    "no_resolution": "one seed: nothing to measure the noise by",
    "interval_excludes_0": "the paired test is significant and its 95% interval excludes 0",
    "within_floor": "the paired 95% interval lies within fp32's own seed-to-seed accuracy range (the margin column)",
    "no_floor": "one fp32 seed: no seed-to-seed range to judge 'same' against",
    "no_image_differed": "every validation image was classified as fp32 classified it",
    "too_short": "fp32 itself had not learned enough to judge an accuracy change",
    "budget_cut": "the speed budget stopped a cell after a few dozen steps",
    "not_reached": "some seeds never reached the target",
    "one_seed": "one seed: no interval over seeds",
    "no_fp32": "no finished fp32 cell of the same seed to pair with",
    "all_finite": "every loss of every cell was finite, to its last step (where the speed budget stopped a cell: to "
                  "that step)",
    "diverged": "a cell's loss went non-finite and it stopped",
    "cell_failed": "the cells crashed or were refused",
    "timeout": "the cells ran out of time",
    "unavailable": "the framework cannot run this precision here",
    "none_faster": "no mixed precision was faster in a speed trial with accuracy kept",
    "all_slower": "every mixed precision was slower than fp32 in its speed trial",
    # loss scaling (LAB_METRICS)
    "one_framework": "only one framework ran this precision: no path to compare",
    "same_path": "every seed's per-step loss scale was the same in each framework",
    "same_path_until_cut": "every seed's per-step loss scale was the same in each framework over the steps both ran; "
                           "the speed budget stopped one of them earlier",
    "different_path": "some seed's per-step loss scale differed between the frameworks",
    "no_skip": "no update was skipped",
    "overflow_located": "at the first skip the NaN/Inf locator named the first parameter whose gradient came out "
                        "non-finite (the overflow was there or in a tensor before it in the backward)",
    "forward_overflow": "the locator found the forward non-finite: no loss scale helps",
    "skip_unlocated": "updates were skipped; the locator named no tensor",
    "no_probe": "the run recorded no underflow probe of this cell",
    "nothing_lost": "no gradient element the float32 reference holds came out 0 (attention key-bias residue apart)",
    "accuracy_lower": "elements were lost and accuracy was lower than fp32's (the accuracy verdict)",
    "accuracy_kept": "elements were lost and accuracy was the same as or higher than fp32's (the accuracy verdict)",
    "accuracy_undecided": "elements were lost; the accuracy verdict could not tell whether it mattered",
    "accuracy_not_lower": "elements were lost; the accuracy difference's 95% interval excludes any loss against fp32",
    "overflowed": "non-finite gradients or losses at the static scale: updates skipped (PyTorch) or applied (Keras)",
    "underflowed": "gradient elements came out 0 even at the static scale",
    "no_overflow_no_underflow": "no skip, every loss finite and no gradient element came out 0 at the static scale",
    # naive attention
    "forward_located": "the NaN/Inf locator found the first non-finite value in a layer's forward",
    "backward_located": "the NaN/Inf locator found the first non-finite value in the backward",
    "unlocated": "training went non-finite; the locator named no layer",
    "fp32_layers_kept_finite": "the layers given to --fp32-layers computed in float32, and training stayed finite",
    "stayed_finite": "training stayed finite with every layer in the precision's own dtype",
    # data parallel
    "workers_disagree": "the workers' own records disagreed (a skipped step or an update one worker did not make)",
    "within_thread_floor": "the loss gap to 1 worker is within the 1-worker run's gap at another thread count",
    "at_thread_floor": "the loss gap is within 2x that floor or a few float32 spacings of the loss: no evidence either "
                       "way",
    "beyond_thread_floor": "the loss gap to 1 worker is beyond the 1-worker run's gap at another thread count",
    "no_thread_floor": "no 1-worker rerun at another thread count finished: no floor to judge against",
    # fp8 against bf16
    "no_bf16": "no finished bf16 cell of the same seed to pair with",
}

# each interval's kind -> its words; the sign test's is conservative: order statistics cover the median with ≥95%
INTERVAL_KINDS = {"sign test 95%": "≥95% sign test", "trial 95%": "≥95% trial", "newcombe 95%": "95% Newcombe",
                  "exact 95% bound": "95% exact bound", "bootstrap 95%": "95% bootstrap",
                  "t over seeds 95%": "95% t over seeds", "none": ""}
SAME_RATIO = 0.05  # speed, time to target: an interval within 1 ± this is "same"


Rule = namedtuple("Rule", "when test status reason")


def finite(*values) -> bool:
    """Whether every value is a finite number (None and text are not)."""
    return all(isinstance(v, (int, float, np.floating)) and np.isfinite(v) for v in values)


def _within(low, high, margin, centre=1.0, rounding=0.0) -> bool:
    """[low, high] within centre ± margin, up to `rounding` (relative): an interval exactly as wide is within."""
    slack = rounding * max(1.0, abs(margin))
    return finite(low, high) and centre - margin - slack <= low and high <= centre + margin + slack


SPEED = [
    Rule("fp8 emulated off a GPU", lambda f: f.emulated, "not_comparable", "emulated"),
    Rule("no speed trial of this pair", lambda f: not f.trial, "not_comparable", "no_trial"),
    Rule("no interval", lambda f: not finite(f.low, f.high), "undecided", "no_interval"),
    Rule("interval above 1 (mixed faster)", lambda f: f.low > 1, "faster", "interval_excludes_1"),
    Rule("interval below 1 (mixed slower)", lambda f: f.high < 1, "slower", "interval_excludes_1"),
    Rule("interval within ±5% of 1", lambda f: _within(f.low, f.high, SAME_RATIO), "same", "within_5pct"),
    Rule("contended blocks in the trial", lambda f: f.contended > 0, "undecided", "contended"),
    Rule("otherwise", lambda f: True, "undecided", "interval_too_wide"),
]

MEMORY = [
    Rule("fp8 emulated off a GPU", lambda f: f.emulated, "not_comparable", "emulated"),
    # peak RSS grows over a run (Keras' fp32 doubles after its first step): a shorter run's peak is not comparable
    Rule("a cell stopped by the speed budget", lambda f: f.budget_cut > 0, "not_comparable", "budget_cut"),
    Rule("no paired fp32 reading", lambda f: not finite(f.estimate), "not_comparable", "no_fp32"),
    Rule("one seed: no noise to measure", lambda f: not finite(f.margin), "undecided", "no_resolution"),
    Rule("a seed's difference within the noise", lambda f: f.resolved != 1.0, "undecided", "unresolved_memory"),
    Rule("lower than fp32 beyond the noise", lambda f: f.estimate < 0, "smaller", "above_resolution"),
    Rule("otherwise: higher beyond the noise", lambda f: True, "larger", "above_resolution"),
]

ACCURACY = [
    Rule("a cell stopped by the speed budget", lambda f: f.budget_cut > 0, "not_comparable", "budget_cut"),
    Rule("fp32 too short to judge", lambda f: f.too_short, "not_comparable", "too_short"),
    Rule("no paired test", lambda f: not finite(f.estimate), "not_comparable", "no_fp32"),
    Rule("no image differed", lambda f: f.no_difference, "same", "no_image_differed"),
    Rule("significant, above 0", lambda f: f.significant and f.low > 0, "higher", "interval_excludes_0"),
    Rule("significant, below 0", lambda f: f.significant and f.high < 0, "lower", "interval_excludes_0"),
    Rule("fewer than two fp32 seeds: no measured floor", lambda f: not finite(f.floor), "undecided", "no_floor"),
    Rule("within ± fp32's seed range", lambda f: _within(f.low, f.high, f.floor, 0, 1e-9), "same", "within_floor"),
    Rule("otherwise", lambda f: True, "undecided", "interval_too_wide"),
]

TIME_TO_TARGET = [
    Rule("fp8 emulated off a GPU", lambda f: f.emulated, "not_comparable", "emulated"),
    Rule("a cell stopped by the speed budget", lambda f: f.budget_cut > 0, "not_comparable", "budget_cut"),
    Rule("fp32 too short to judge", lambda f: f.too_short, "not_comparable", "too_short"),
    Rule("a seed never reached the target", lambda f: f.reached < f.seeds, "undecided", "not_reached"),
    Rule("no paired times", lambda f: not finite(f.estimate), "not_comparable", "no_fp32"),
    Rule("one seed", lambda f: f.seeds < 2 or not finite(f.low, f.high), "undecided", "one_seed"),
    Rule("interval below 1 (mixed took less time)", lambda f: f.high < 1, "faster", "interval_excludes_1"),
    Rule("interval above 1 (mixed took more time)", lambda f: f.low > 1, "slower", "interval_excludes_1"),
    Rule("interval within ±5% of 1", lambda f: _within(f.low, f.high, SAME_RATIO), "same", "within_5pct"),
    Rule("otherwise", lambda f: True, "undecided", "interval_too_wide"),
]

NUMERICS = [
    Rule("a cell diverged", lambda f: f.diverged > 0, "failed", "diverged"),
    Rule("otherwise", lambda f: True, "same", "all_finite"),
]

# Loss scaling (facts from scaling.py). f.estimate: the final scale / skipped updates / lost elements / static scale.
SCALE_PATH = [
    Rule("no other framework ran it", lambda f: f.others == 0, "not_comparable", "one_framework"),
    Rule("every seed's per-step scales equal the others'", lambda f: f.same and f.whole, "same", "same_path"),
    Rule("equal over the steps both ran (one budget-cut)", lambda f: f.same, "same", "same_path_until_cut"),
    Rule("otherwise", lambda f: True, "differs", "different_path"),
]

SKIPS = [
    Rule("no update skipped", lambda f: f.estimate == 0, "clean", "no_skip"),
    Rule("the locator found a forward non-finite", lambda f: "forward" in f.where, "skipped", "forward_overflow"),
    Rule("the locator named a backward gradient", lambda f: "backward" in f.where, "skipped", "overflow_located"),
    Rule("otherwise", lambda f: True, "skipped", "skip_unlocated"),
]

UNDERFLOW = [
    Rule("no probe recorded", lambda f: not finite(f.estimate), "not_comparable", "no_probe"),
    Rule("no element lost", lambda f: f.estimate == 0, "clean", "nothing_lost"),
    Rule("accuracy lower than fp32", lambda f: f.accuracy == "lower", "lost", "accuracy_lower"),
    Rule("accuracy same or higher", lambda f: f.accuracy in ("same", "higher"), "lost", "accuracy_kept"),
    Rule("the accuracy interval excludes a loss", lambda f: f.accuracy_low >= 0, "lost", "accuracy_not_lower"),
    Rule("otherwise", lambda f: True, "lost", "accuracy_undecided"),
]

STATIC_SCALE = [
    Rule("a skip or a non-finite loss", lambda f: f.skipped > 0 or f.nonfinite > 0, "insufficient", "overflowed"),
    Rule("elements lost at it", lambda f: finite(f.lost) and f.lost > 0, "insufficient", "underflowed"),
    Rule("no probe recorded", lambda f: not finite(f.lost), "undecided", "no_probe"),
    Rule("otherwise", lambda f: True, "sufficed", "no_overflow_no_underflow"),
]

# The naive-attention ViT (facts from numerics.naive_rows). f.step: the first step a seed went non-finite (-1: none)
NAIVE = [
    Rule("non-finite in a forward", lambda f: f.step >= 0 and f.where == "forward", "overflowed", "forward_located"),
    Rule("non-finite in a backward", lambda f: f.step >= 0 and f.where == "backward", "overflowed", "backward_located"),
    Rule("a seed went non-finite otherwise", lambda f: f.step >= 0 or not f.finite, "overflowed", "unlocated"),
    Rule("finite, with layers forced to float32", lambda f: bool(f.forced), "finite", "fp32_layers_kept_finite"),
    Rule("otherwise", lambda f: True, "finite", "stayed_finite"),
]

# Data parallel (facts: dataparallel.verdict_rows), per N-worker cell; f.estimate, f.margin: its, the floor's loss gap
DATA_PARALLEL = [
    Rule("the engine cannot run this all-reduce here", lambda f: f.status == "unavailable", "failed", "unavailable"),
    Rule("the N-worker cell ran out of time", lambda f: f.status == "timeout", "failed", "timeout"),
    Rule("the N-worker cell did not finish", lambda f: not f.ok, "failed", "cell_failed"),
    Rule("the workers' records disagree", lambda f: not f.agree, "departs", "workers_disagree"),
    Rule("no floor run finished", lambda f: not finite(f.margin), "undecided", "no_thread_floor"),
    Rule("gap within the floor", lambda f: f.estimate <= f.margin, "agrees", "within_thread_floor"),
    Rule("gap at the floor", lambda f: f.at_floor, "undecided", "at_thread_floor"),
    Rule("otherwise", lambda f: True, "departs", "beyond_thread_floor"),
]

# fp8 against bf16 (facts from fp8.verdict_rows): ACCURACY's rules with bf16 as the partner
FP8 = [Rule("no bf16 partner", lambda f: not finite(f.estimate), "not_comparable", "no_bf16"), *ACCURACY]

LAB_METRICS = ("scale_path", "skipped_steps", "underflow", "static_scale")
# Each experiment's own question, answered first (answer.experiment_items): its header and its metrics
EXPERIMENTS = tuple((f"{name} (what this run asks)", metrics) for name, metrics in (
    ("Loss scaling", LAB_METRICS), ("Naive attention", ("attention_overflow",)), ("Data parallel", ("data_parallel",)),
    ("fp8 against bf16", ("fp8_vs_bf16",))))

FAILED = ("diverged", "timeout", "unavailable")  # run statuses that are the reason of a failed cell's rows
RULES = {"speed": SPEED, "memory": MEMORY, "accuracy": ACCURACY, "time_to_target": TIME_TO_TARGET, "numerics": NUMERICS}
LAB_RULES = {"scale_path": SCALE_PATH, "skipped_steps": SKIPS, "underflow": UNDERFLOW, "static_scale": STATIC_SCALE,
             "attention_overflow": NAIVE, "data_parallel": DATA_PARALLEL, "fp8_vs_bf16": FP8}
# speed: fp32's step time / the precision's (above 1: faster); time to target: the precision's / fp32's
UNITS = {"speed": "x fp32 speed", "memory": "MiB", "accuracy": "pp", "time_to_target": "x fp32 time",
         "numerics": "steps", "scale_path": "scale", "skipped_steps": "steps", "underflow": "elements",
         "static_scale": "scale", "attention_overflow": "step", "data_parallel": "relative loss gap",
         "fp8_vs_bf16": "pp"}
IDENTITY = ["model", "dataset", "step_loop", "batch_size", "framework", "precision"]
GROUP = ["model", "dataset", "framework", "precision"]  # a mixed precision's cells, over step loops and batch sizes
COLUMNS = [*IDENTITY, "metric", "estimate", "low", "high", "margin", "unit", "interval_kind", "status", "reason",
           "evidence"]


def decide(metric: str, facts: SimpleNamespace) -> tuple[str, str]:
    """(status, reason) of the first rule of `metric`'s table that holds."""
    rule = next(r for r in {**RULES, **LAB_RULES}[metric] if r.test(facts))
    return rule.status, rule.reason


def _num(value, attr: str = "") -> float:
    """`value`, or its attribute `attr` where given (NaN where it has none), as a float; NaN where not a number."""
    try:
        return float(getattr(value, attr, np.nan) if attr else value)
    except (TypeError, ValueError):
        return float("nan")


ACCURACY_KIND = {stats.MCNEMAR: "newcombe 95%", stats.BOOTSTRAP: "bootstrap 95%",
                 stats.NO_DIFFERENCE: "exact 95% bound"}


def row(key: dict, metric: str, facts: SimpleNamespace, evidence: dict, kind: str = "none") -> dict:
    """One verdict row: the first rule of `metric` that holds for `facts` decides its status and reason."""
    status, reason = decide(metric, facts)  # budget_cut: a figure beside a cut cell's is no verdict's
    estimate, low, high = (np.nan if reason == "budget_cut" else _num(facts, k) for k in ("estimate", "low", "high"))
    return {**key, "metric": metric, "estimate": estimate, "low": low, "high": high,
            "margin": _num(facts, "margin"), "unit": UNITS[metric],
            "interval_kind": kind if np.isfinite(low) else "none", "status": status, "reason": reason,
            "evidence": json.dumps(evidence, default=lambda v: v.item() if hasattr(v, "item") else str(v))}


def accuracy(r, key: dict | None = None, cut: int | None = None, metric: str = "accuracy") -> dict:
    """The accuracy verdict row of an accuracy-table row: ACCURACY, or FP8 where `metric` is fp8_vs_bf16."""
    method = r.method if isinstance(getattr(r, "method", None), str) else ""
    cut = int(np.nan_to_num(_num(r, "budget_cut"))) if cut is None else cut
    floor, p = _num(r, "floor_pp"), _num(r.p_value)
    key = key or {k: getattr(r, k, "") for k in IDENTITY}
    facts = SimpleNamespace(budget_cut=cut, too_short=bool(r.too_short), estimate=_num(r.diff_pp),
                            low=_num(r.ci_low), high=_num(r.ci_high), no_difference=method == stats.NO_DIFFERENCE,
                            significant=np.isfinite(p) and p < stats.ALPHA, floor=floor, margin=floor)
    evidence = {"method": method, "p_value": p, **{k: _num(r, k) for k in ("seeds", "images", "discordant")},
                "too_short": r.too_short or "", "budget_cut_cells": cut, "floor_fp32_seeds": _num(r, "floor_seeds")}
    return row(key, metric, facts, evidence, ACCURACY_KIND.get(method, "none"))


def _time(r, key: dict, cut: int) -> dict:
    reached, seeds = _num(r, "reached_seeds"), _num(r, "timed_seeds")
    facts = SimpleNamespace(emulated=bool(r.emulated), budget_cut=cut, too_short=bool(r.too_short),
                            reached=reached if np.isfinite(reached) else 0, seeds=seeds if np.isfinite(seeds) else 0,
                            estimate=_num(r.ttt_ratio), low=_num(r.ttt_low), high=_num(r.ttt_high), margin=SAME_RATIO)
    evidence = {"target": _num(r.target), "target_basis": str(getattr(r, "target_basis", "") or ""),
                "reached_seeds": np.nan if cut else facts.reached, "seeds": np.nan if cut else facts.seeds,
                "time_s": _num(r.time_to_target_s), "budget_cut_cells": cut}  # a cut cell was not timed: no count
    return row(key, "time_to_target", facts, evidence, "t over seeds 95%" if facts.seeds >= 2 else "none")


def _failed_rows(runs: pd.DataFrame, done: set):
    """Every metric failed for a mixed (model, dataset, framework, precision) of the run with no finished cell."""
    if runs.empty or "status" not in runs:
        return
    for ident, cells in runs[precisions.is_mixed(runs["precision"])].groupby(GROUP, sort=False):
        if ident in done:
            continue
        failed = {**dict(zip(GROUP, ident)), "step_loop": "", "batch_size": np.nan, "interval_kind": "none",
                  **dict.fromkeys(("estimate", "low", "high", "margin"), np.nan), "status": "failed",
                  "reason": s if (s := str(cells["status"].mode().iloc[0])) in FAILED else "cell_failed",
                  "evidence": json.dumps({"cells": sorted(cells["cell_id"]), "statuses": sorted(set(cells["status"]))})}
        yield from ({**failed, "metric": m, "unit": UNITS[m]} for m in METRICS)


def build(full: pd.DataFrame, runs: pd.DataFrame, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """The verdict table of a run from `full` (tables.full_table), its run table and its trials table."""
    from amp_compare.kit.trial import INTERVAL_KIND, trial_summary

    summaries = [] if trials is None or trials.empty else trial_summary(trials).to_dict("records")
    by_trial = {(t["model"], t["dataset"], str(t["step_loop"]), _num(t["batch_size"]), t["framework"],
                 t["precision"]): t for t in summaries[::-1]}  # the first trial of each pair
    diverged = runs[runs["status"].eq("diverged")].groupby(GROUP).size().to_dict() if "status" in runs else {}
    rows, done = [], set()
    mixed = full[precisions.is_mixed(full["precision"])] if not full.empty else full
    for r in mixed.itertuples():
        ident = (r.model, r.dataset, r.framework, r.precision)
        done.add(ident)
        key = {**{k: getattr(r, k) for k in IDENTITY}, "step_loop": str(r.step_loop), "batch_size": _num(r.batch_size)}
        n_cut, n_diverged = int(np.nan_to_num(_num(r.budget_cut))), int(diverged.get(ident, 0))
        resolution = _num(r.memory_resolution_mib)
        trial = by_trial.get(tuple(key.values()))  # key's order: IDENTITY's
        t = trial if trial and not r.emulated else {}  # an emulation's time: no ratio printed anywhere (fp8.py)
        facts = SimpleNamespace(emulated=bool(r.emulated), trial=trial is not None, estimate=t.get("ratio", np.nan),
                                low=t.get("low", np.nan), high=t.get("high", np.nan),
                                contended=int(t.get("contended_blocks", 0) or 0), margin=SAME_RATIO if t else np.nan)
        said = {k: t[k] for k in ("trial_id", "rounds", "contended_blocks", "contended_precisions", "fp32_step_s",
                                  "mixed_step_s") if k in t}
        speed = row(key, "speed", facts, said, "sign test 95%" if t.get("interval_kind") == INTERVAL_KIND else
                    "trial 95%")
        facts = SimpleNamespace(emulated=bool(r.emulated), budget_cut=n_cut, estimate=_num(r.memory_difference_mib),
                                resolved=_num(r, "memory_resolved"), margin=resolution)
        memory = row(key, "memory", facts, {"seeds": int(r.runs), "change": _num(r.memory_change_vs_fp32),
                                            "resolution_mib": resolution, "budget_cut_cells": n_cut})
        numerics = row(key, "numerics", SimpleNamespace(diverged=n_diverged, estimate=_num(r.skipped_steps)),
                       {"skipped_steps_median": _num(r.skipped_steps), "diverged_cells": n_diverged})
        rows += [speed, memory, accuracy(r, key, n_cut), _time(r, key, n_cut), numerics]
    rows += _failed_rows(runs, done)
    return pd.DataFrame(rows, columns=COLUMNS)


def choose(group: pd.DataFrame) -> tuple[str, str]:
    """(what a model x framework should use: its fastest precision that kept accuracy and numerics, else fp32; why)."""
    by = {prec: {r.metric: r for r in part.itertuples()} for prec, part in group.groupby("precision", sort=False)}
    kept = {prec: rows["speed"].estimate for prec, rows in by.items() if rows["speed"].status == "faster"
            and rows["accuracy"].status not in ("lower", "failed") and rows["numerics"].status != "failed"}
    if kept:
        return max(kept, key=kept.get), "interval_excludes_1"
    return "fp32", ("no_trial" if all(rows["speed"].reason == "no_trial" for rows in by.values()) else
                    "all_slower" if all(rows["speed"].status == "slower" for rows in by.values()) else "none_faster")
