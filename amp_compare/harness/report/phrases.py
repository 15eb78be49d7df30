"""The phrasebook: each verdict (verdicts.py) worded once per form, from its row alone: `number` (estimate and
interval), `cell` (a table cell), `lab_line` (an experiment's line in the answer)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd

from amp_compare.contract.config import framework_label, is_keras
from amp_compare.harness.report import stats
from amp_compare.harness.report.verdicts import ACCURACY_KIND, INTERVAL_KINDS, METRICS, REASONS, STATUSES, finite
from amp_compare.harness.report.verdicts import accuracy as accuracy_verdict
from amp_compare.kit.fp16 import FP16_EXP_LIMIT, FP16_MAX, FP32_EXP_LIMIT

METRIC = {**{m: m.replace("_", " ") for m in METRICS}, "memory": "peak memory"}
STATUS = {**{s: s for s in STATUSES}, "smaller": "less memory", "larger": "more memory", "not_comparable": "n/a"}
# a few words each, after "because" or in brackets: the reason's own words but for these
REASON = {**{r: r.replace("_", " ") for r in REASONS},
          "interval_excludes_1": "interval excludes 1×", "within_5pct": "interval within ±5%",
          "interval_too_wide": "wide interval", "contended": "CPU contended", "emulated": "fp8 emulated off a GPU",
          "above_resolution": "every seed beyond {spreads} seed-to-seed spreads, up to {margin:,.1f} MiB",
          "unresolved_memory": "within {spreads} seed-to-seed spreads, up to {margin:,.1f} MiB",
          "no_resolution": "one seed, noise unknown", "interval_excludes_0": "significant",
          "within_floor": "fp32 seeds {margin:.2f} pp apart", "no_floor": "one fp32 seed: no seed range",
          "too_short": "fp32 too short to judge", "budget_cut": "cut by the speed budget",
          "not_reached": "a seed never reached it", "no_fp32": "no fp32 partner", "all_finite": "finite throughout",
          "cell_failed": "crashed", "timeout": "timed out", "unavailable": "unavailable here",
          "none_faster": "none faster in the speed trials with accuracy kept",
          "all_slower": "every mixed precision slower in the speed trials", "skip_unlocated": "not located",
          "accuracy_not_lower": "no accuracy lost", "no_overflow_no_underflow": "no overflow, no underflow",
          "forward_located": "in a forward", "backward_located": "in the backward", "unlocated": "no layer named",
          "fp32_layers_kept_finite": "--fp32-layers kept it finite", "workers_disagree": "workers disagreed",
          "within_thread_floor": "within the thread floor", "at_thread_floor": "at the thread floor",
          "beyond_thread_floor": "beyond the thread floor", "no_bf16": "no bf16 partner"}
METHOD = {stats.MCNEMAR: "McNemar exact", stats.BOOTSTRAP: "paired bootstrap over images",
          stats.NO_DIFFERENCE: "none: no image differed"}
# the statuses and reasons a cell shows in brackets: why nothing was decided, or the margin a decision rests on
SHOWN = {"not_comparable", "undecided", "failed"}
SHOWN_REASONS = {"within_floor", "no_image_differed", "above_resolution"}
HEADER = {"speed": "Speed (× fp32's)", "memory": "Peak memory", "accuracy": "Accuracy",  # the tables' column headers
          "time_to_target": "Time to target (× fp32's)", "numerics": "Numerics"}
# Said wherever a Keras fp16-static row is: the framework difference a static scale exposes.
KERAS_STATIC = "Keras applies an update whose gradients are not finite, where PyTorch skips it"
ROLE_WORDS = {"input": "input", "kernel": "kernel", "grad_output": "output gradient"}  # fp8's three tensors


def reason(v) -> str:
    """The verdict's reason in a few words, with its margin where the reason quotes one, and what would decide it."""
    wide = (getattr(v, "metric", ""), v.reason) == ("speed", "interval_too_wide")
    spreads = f"fp32's and {v.precision}'s" if hasattr(v, "precision") else "fp32's and its"  # memory's margin
    return REASON[v.reason].format(margin=getattr(v, "margin", float("nan")), spreads=spreads) + (
        ": a longer --trial-budget-s narrows it" if wide else "")


def ratio(v: float) -> str:
    """Two decimals; three below 0.1 and where two would print 1.00 for a ratio that is not 1."""
    return f"{v:.3f}×" if v < 0.1 or (round(v, 2) == 1 and v != 1) else f"{v:.2f}×"


def pp_bound(value: float, digits: int = 1) -> str:
    """One end of an accuracy interval in pp: exactly 0 prints as 0, one that rounds to ±0.0 gets a digit more."""
    return "0" if value == 0 else f"{value:+.2f}" if abs(value) < 0.05 else f"{value:+.{digits}f}"


def number(v, interval: bool = True, of: bool = True) -> str:
    """The estimate in the verdict's unit with its 95% interval where it has one and `interval`; "" where none."""
    if not np.isfinite(v.estimate):
        return ""
    if v.unit in ("x fp32 speed", "x fp32 time"):  # worded as multiples of fp32's: "speed 0.16× fp32's"
        text, low, high = ratio(v.estimate) + (" fp32's" if of else ""), ratio(v.low)[:-1], ratio(v.high)[:-1]
    elif v.unit == "pp":
        digits = 2 if np.isfinite(getattr(v, "margin", np.nan)) else 1  # as the margin prints: within it, visibly
        text, low, high = f"{v.estimate:+.1f} pp", pp_bound(v.low, digits), pp_bound(v.high, digits)
    elif v.unit == "MiB":
        text, low, high = f"{v.estimate:+,.{1 if abs(v.estimate) < 10 else 0}f} MiB", "", ""
    else:
        return f"{v.estimate:g} {v.unit}"
    return text + (f" [{low}, {high}]" if interval and np.isfinite(v.low) else "")


def interval_words(v) -> str:
    """What the interval is: "≥95% sign test", "95% Newcombe", "" where there is none."""
    return INTERVAL_KINDS.get(v.interval_kind, "")


def cell(v, interval: bool = True, why: bool = True, of: bool = True, short: bool = False,
         contended: bool = False) -> str:
    """A table cell: the number (with its interval), the status, the reason where shown, contended blocks."""
    if v.reason == "unavailable":  # never run here: not a failure of what ran
        return "unavailable" if short else REASON["unavailable"]
    if short and v.status == "undecided":
        return STATUS[v.status]  # the terminal's 80 columns: its number decides nothing, the answer and page give it
    shown = (v.status in SHOWN and why) or (v.reason in SHOWN_REASONS and interval)
    status = ((short and {"smaller": "less", "larger": "more"}.get(v.status) or STATUS[v.status])
              + (f" ({reason(v)})" if shown else ""))
    if (why or contended) and v.metric == "speed" and v.reason != "contended":
        said = evidence(getattr(v, "evidence", ""))  # a decided trial that still lost its cores at times
        blocks, rounds = said.get("contended_blocks") or 0, said.get("rounds")
        of_all = f" of {2 * rounds:,}" if isinstance(rounds, (int, float)) and rounds else ""
        most = isinstance(rounds, (int, float)) and blocks > rounds  # more than half of the trial's blocks
        status += f" ({blocks}{of_all} blocks contended)" if blocks and (why or most) else ""
    if v.metric == "numerics" and v.status == "same":
        skips = v.estimate if np.isfinite(v.estimate) else 0  # the seeds' median of skipped updates (lab audit)
        return "finite losses" + (f", {skips:g} skipped update{'s' * (skips != 1)} (median)" if skips else "")
    return f"{number(v, interval, of)} {status}".strip()


def test(method, seeds) -> str:
    """The paired accuracy test by name, with its seeds: "McNemar exact, 1 seed"."""
    return METHOD[method] + (f", {seeds:.0f} seed{'s' * (seeds != 1)}" if np.isfinite(seeds) else "") \
        if method in METHOD else ""


def paired(t: dict, seeds: int = 0) -> str:
    """A paired accuracy test (stats.paired_test's): "-0.3 pp [-0.8, +0.3] (95% Newcombe, 2 seeds paired)"."""
    kind = INTERVAL_KINDS.get(ACCURACY_KIND.get(t.get("method")), "")
    said = [w for w in (kind, f"{seeds} seed{'s' * (seeds != 1)} paired" if seeds else "") if w]
    text = (f"{t['diff_pp']:+.1f} pp [{pp_bound(t['ci_low'])}, {pp_bound(t['ci_high'])}]"
            + (f" ({', '.join(said)})" if said else ""))
    if "detectable" in t:
        text += ": a detectable change" if t["detectable"] else ": no detectable change"
    return text + (" (near chance: the runs barely learned)" if t.get("near_chance") else "")


def accuracy(r) -> str:
    """An accuracy-table row's comparison with fp32 as its verdict's cell, then the interval's kind and p."""
    v = SimpleNamespace(**accuracy_verdict(r))
    p = evidence(v.evidence)["p_value"]
    said = [w for w in (interval_words(v),  # "" where no interval
                        f"p = {p:.2g}" if v.interval_kind != "exact 95% bound" and np.isfinite(p) else "") if w]
    return cell(v) + (f" ({', '.join(said)})" if said else "")


def table(verdicts: pd.DataFrame, short: bool = False) -> pd.DataFrame:
    """One row per framework x mixed precision of one model's verdicts, one cell per metric; short: the terminal's."""
    rows = []
    for (fw, prec), part in verdicts.groupby(["framework", "precision"], sort=False):
        by = {r.metric: r for r in part.itertuples()}
        if not by.keys() & METRIC.keys():  # only an experiment's rows (the answer says them): no empty table row
            continue
        who = {"Cells": f"{fw} {prec}"} if short else {"Framework": framework_label(fw), "Precision": prec}
        rows.append({**who, **{HEADER[m]: cell(by[m], not short, not short, of=False, short=short) if m in by else ""
                               for m in METRIC}})
    return pd.DataFrame(rows)


def columns_note(verdicts: pd.DataFrame, conditions: tuple[str, str] = ("", "")) -> str:
    """What the per-model tables' columns measure, with each model's target; `conditions`: speed.conditions."""
    targets = []
    for (model, _), part in verdicts[verdicts["metric"] == "time_to_target"].groupby(["model", "dataset"], sort=False):
        said = evidence(part["evidence"].iloc[0])
        if isinstance(target := said.get("target"), float) and np.isfinite(target):
            targets.append(f"{model} {target:.1%}" + (f", {basis}" if (basis := said.get("target_basis")) else ""))
    target = f" ({'; '.join(targets)})" if targets else ""
    cells, trial = conditions
    about = [*([f"they ran {cells}"] if cells else []),
             *(["Keras' tracing in the first epoch included"] if verdicts["framework"].map(is_keras).any() else [])]
    about = f" ({'; '.join(about)})" if about else ""
    return ("Speed: fp32's step time ÷ the precision's, from a speed trial (fp32 and mixed blocks interleaved in one "
            f"process{f', {trial}' if trial else ''}): exp of the median of its rounds' log ratios, with its sign-test "
            "interval (order statistics of the rounds: at least 95%). Peak memory: the precision's peak minus fp32's, "
            "median over seeds. Accuracy: final validation accuracy minus fp32's, in percentage points, with its 95% "
            f"interval. Time to target: the training cells' training wall time, validation excluded{about}, until "
            f"validation accuracy first reached the target{target}, ÷ fp32's of the same seed, the geometric mean over "
            "seeds.")


def glossary(verdicts: pd.DataFrame) -> list[tuple[str, str]]:
    """(term, text) per status and per reason the run's verdict table holds: the word printed and what it means."""
    if verdicts is None or verdicts.empty:
        return []
    statuses = "; ".join(f"\"{STATUS[s]}\": {STATUSES[s]}" for s in dict.fromkeys(verdicts["status"]))
    if ((verdicts["metric"] == "numerics") & (verdicts["status"] == "same")).any():  # cell() words it so
        statuses += f"; \"finite losses\" (the Numerics column): {REASONS['all_finite']}"
    words = {r: re.sub(r"{margin[^}]*}", "X", REASON[r]).replace("{spreads}", "fp32's and its")
             for r in dict.fromkeys(verdicts["reason"])}
    reasons = "; ".join(f"\"{w}\": {REASONS[r]}" for r, w in words.items())
    return [("Verdict words", f"What each word in the per-model tables means. {statuses}."),
            ("Verdict reasons", f"Why a verdict is what it is, in brackets beside it. {reasons}.")]


# The experiments' rows (verdicts.EXPERIMENTS): one line each in the answer

def power(value) -> str:
    """A scale as 2^k where it is a power of two, else as recorded."""
    v = float(value)
    k = np.log2(v) if v > 0 else np.nan
    return f"2^{int(k)}" if np.isfinite(k) and k == int(k) else f"{v:g}"


def as_written(value):
    """A recorded number as written (2, not 2.0, read back through a float column); a text as it is."""
    return int(value) if isinstance(value, float) and np.isfinite(value) and value.is_integer() else value


def evidence(text) -> dict:
    """A verdict row's evidence or a record's JSON column (JSON text, or a dict) as a dict; {} where empty or bad."""
    if isinstance(text, dict):
        return text
    try:
        return json.loads(text) if isinstance(text, str) and text else {}
    except json.JSONDecodeError:
        return {}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{('es' if word.endswith('s') else 's') if n != 1 else ''}"


def _path(v, e: dict) -> str:
    seeds = e.get("seeds", [])
    if not seeds:
        return "scale not recorded"
    ends: dict[tuple, list[str]] = {}
    for s in seeds:
        ends.setdefault((s["final"], s["growths"], s["backoffs"]), []).append(str(s["seed"]))
    finals = ", ".join(f"{power(f)} (seed{'s' if len(w) > 1 else ''} {', '.join(w)}: {_plural(g, 'doubling')}, "
                       f"{_plural(b, 'halving')})" for (f, g, b), w in ends.items())
    every = f", doubling after every {e['growth_interval']:,} clean steps" if e.get("growth_interval") else ""
    others = ", ".join(framework_label(f) for f in e.get("others", []))
    same = {"same_path": f"step by step the same as {others} in every seed",
            "same_path_until_cut": f"step by step the same as {others} over the {e.get('common_steps')} steps both "
                                   "ran (the speed budget stopped one of them there)",
            "different_path": f"a different path from {others}",
            "one_framework": "no other framework ran it"}[v.reason]
    return f"loss scale {power(seeds[0]['start'])}{every}, final {finals}; {same}"


def _skips(v, e: dict) -> str:
    skips = e.get("skips", [])
    if not skips:
        return "no update skipped" + _until_cut(e)
    found = {(f["seed"], f["step"]): f" ({cause(f)})" for f in e.get("located", [])}
    said = [f"seed {s['seed']} step {s['step']} at {power(s['scale'])}{found.get((s['seed'], s['step']), '')}"
            for s in skips[:6]]
    return f"skipped {len(skips)}: " + "; ".join(said) + (f"; and {len(skips) - 6} more" if len(skips) > 6 else "")


def _until_cut(e: dict) -> str:
    """Where the speed budget stopped a cell of the row: how far what it says reaches."""
    return f" (in the {n} steps a cell ran before the speed budget stopped it)" if (n := e.get("cut_steps")) else ""


def cause(f: dict) -> str:
    """The locator's finding at a cell's first skip with its headroom: |g| x scale reached 65,504."""
    if f["where"] != "backward":
        return f"the forward of {f['layer']} went {f['value']}: no scale helps"
    name = (f"{f['layer']}'s output gradient" if f["tensor"] == "output" else f"{f['layer']}.{f['tensor']}"
            if f.get("named", True) else f"a {f['tensor']} of {f['layer']}")  # named: a parameter of that name
    if not f.get("scale"):
        return f"{name} went {f['value']}"
    return (f"{name} went {f['value']}: either its largest |gradient| × {power(f['scale'])} passed {FP16_MAX:,.0f} "
            f"(≥ {_bound(FP16_MAX / f['scale'], 4, up=False)} unscaled) or a tensor before it in the backward did")


def _bound(bound: float, digits: int, up: bool) -> str:
    """`bound` to `digits` significant digits, rounded up for an upper bound, down for a lower one."""
    if not bound > 0:
        return f"{bound:g}"
    step = 10.0 ** (np.floor(np.log10(bound)) - digits + 1)
    rounded = np.ceil(bound / step - 1e-9) if up else np.floor(bound / step)
    return f"{rounded * step:.{max(0, int(digits - 1 - np.floor(np.log10(bound))))}f}"


def _underflow(v, e: dict) -> str:
    seeds = e.get("seeds", [])
    if not seeds:
        return "no underflow probe recorded"
    lost = ", ".join(f"{s['lost']:,} of {s['nonzero']:,} ({share(s['lost'] / s['nonzero'])}, seed {s['seed']}"
                     + (f"; {s['residue']:,} more are attention key-bias residue)" if s.get("residue") else ")")
                     if s["nonzero"] else f"0 (seed {s['seed']})" for s in seeds)
    said = (f"without loss scaling, non-zero gradient elements that came out exactly zero in the float16 backward at "
            f"the last step{_flushed(sum(s['lost'] for s in seeds), sum(s.get('flushed', 0) for s in seeds))}: "
            f"{lost}; ")
    if v.reason == "accuracy_not_lower":  # its own words: the interval, not the verdict's "undecided"
        d, n, k = e.get("discordant"), e.get("images"), e.get("seeds_paired")  # paired predictions: seeds x images
        k = int(k) if finite(k) else 1
        differing = f", {int(d):,} of {int(n) * k:,} paired predictions differing" if finite(d, n) else ""
        return f"{said}it cost no accuracy here: {e.get('accuracy_pp', np.nan):+.1f} pp against fp32{differing}"
    acc, why = e.get("accuracy_status", ""), e.get("accuracy_reason")
    shown = why in REASON and (acc in SHOWN or why in SHOWN_REASONS)
    acc_text = f"accuracy against fp32 {STATUS.get(acc, acc)}" + (
        f" ({reason(SimpleNamespace(reason=why, margin=e.get('accuracy_margin', np.nan)))})" if shown else "")
    mattered = {"accuracy_lower": "it cost accuracy here", "accuracy_kept": "no accuracy cost seen here",
                "accuracy_undecided": "not known whether it cost accuracy", "nothing_lost": "nothing was lost"}
    return f"{said}{acc_text}: {mattered.get(v.reason, '')}".rstrip(": ")


def _flushed(zeros: int, flushed: int, inside: str = " (") -> str:
    """The part of `zeros` that the float32 reference's flush test explains (at most: it counts, not matches)."""
    return f"{inside}the float32 reference's flush explains at most {flushed:,} of the {zeros:,})" if zeros else ""


def share(x: float) -> str:
    """A share as a percentage with its first significant digit shown (1 of 28,975: 0.003%, not 0.00%)."""
    return f"{x:.2%}" if x == 0 or x >= 1e-4 else f"{x:.{int(-np.floor(np.log10(x * 100)))}%}"


def _static(v, e: dict) -> str:
    no_skip = "no skip, " if e.get("skips", True) else ""  # a Keras static scale applies every update: none to skip
    scale, kept = f"static scale {power(v.estimate)}", f"{no_skip}every loss finite"
    zero = "exactly zero in the float16 backward both at it and without it"
    said = {"no_overflow_no_underflow": f"{scale} sufficed{_until_cut(e)}: {kept}, no gradient element lost at it "
                                        f"({zero})",
            "overflowed": f"{scale} overflowed: {_plural(e.get('skipped', 0), 'update')} skipped, "
                          f"{_plural(e.get('nonfinite_losses', 0), 'non-finite loss')}",
            "underflowed": f"{scale}: {kept}; {_plural(e.get('lost', 0), 'gradient element')} lost at it ({zero}; "
                           + (", ".join(f"{a['lost']:,} at seed {a['seed']}'s {a['when']}" for a in e["lost_at"])
                              if e.get("lost_at") else "both probes, all seeds")
                           + _flushed(e.get("lost", 0), e.get("flushed", 0), "; "),
            "no_probe": f"{scale}: {kept}; no underflow probe"}
    return said[v.reason] + (f"; {KERAS_STATIC}" if e.get("applies_nonfinite") else "")


def _naive(v, e: dict) -> str:
    """A naive-attention row: where training first went non-finite and how it ended, or that it stayed finite."""
    seeds = e.get("seeds", [])
    forced = f"with --fp32-layers {e['forced']}: " if e.get("forced") else ""
    if v.status == "finite":
        top = max((s["largest_logit"] for s in seeds), default=float("nan"))
        said = f"{forced}every loss finite, no update skipped"
        if not np.isfinite(top):
            return said
        said += (f"; largest attention logit {top:.3g}, {'past' if top > FP16_EXP_LIMIT else 'below'} ln(65,504) = "
                 f"{FP16_EXP_LIMIT:.1f}, where exp overflows float16")
        ran = "float32" if e.get("forced") else {"float16": "", "bfloat16": "bfloat16"}.get(e.get("half"), "float32")
        return said + (f"; {ran} overflows only past {FP32_EXP_LIMIT:.1f}" if ran else "")
    said = []
    for s in (s for s in seeds if s["step"] >= 0 or s["status"] != "ok"):
        where = (f"the locator found it in the {s['where']} of {s['layer']} ({s['value']})" if s["where"] else
                 "the locator named no layer")
        ended = ("the run diverged" if s["status"] == "diverged" else f"ended {s['status']}" if not s["skipped"] else
                 f"the scaler skipped {s['skipped']:,} of {s['steps']:,} steps")
        said.append(f"seed {s['seed']}: first skip or non-finite loss at step {s['step']}; {where}; {ended}")
    fix = next((s["layer"] for s in seeds if s["layer"]), "")
    return forced + "; ".join(said) + (f" — rerun with --fp32-layers {fix}" if fix and not e.get("forced") else "")


def _data_parallel(v, e: dict) -> str:
    """An N-worker cell's row: whether its workers agreed, its loss gap to 1 worker against the thread floor, skips."""
    who = (f"{e.get('workers')} workers, --allreduce {e.get('allreduce')}"
           + (f" (ran in {e['allreduce_dtype']})" if e.get("allreduce_dtype") not in ("", "not recorded") else ""))
    if v.status == "failed":
        return f"{who}: {REASON[v.reason]}" + (f" ({e['error']})" if e.get("error") else "")
    gap, floor = float(v.estimate), float(v.margin)
    times = gap / floor if floor > 0 else np.nan
    rerun = f"the {e['floor_threads']}-thread 1-worker rerun" if e.get("floor_threads") else "the rerun"
    against = {"within_thread_floor": f"within {rerun}'s {floor:.1e}",
               "at_thread_floor": f"at {rerun}'s {floor:.1e}: no evidence either way",
               "beyond_thread_floor": (f"beyond {rerun}'s {floor:.1e} ({times:,.{0 if times >= 10 else 1}f}×)"
                                       if floor > 0 else f"where {rerun} gave the same bits"),
               "no_thread_floor": "no rerun at another thread count to judge it by"}.get(v.reason, "")  # disagreed
    agreed = "the workers' own records disagreed" if v.reason == "workers_disagree" else "workers agreed"
    share = f"{_bound(100 * gap, 2, up=True)}%" if gap >= 1e-4 else "less than 0.01%"  # "within": a bound, rounded up
    losses = f"losses within {share} of 1 worker's at every step ({gap:.1e})" if np.isfinite(gap) else ""
    n, one = e.get("skipped_n"), e.get("skipped_1")
    skips = (f"; {n} skipped steps against 1 worker's {one}: a different loss-scale trajectory, so from there on not "
             "the same experiment" + (" (torch DDP: each worker's backward runs on the mean loss of its own 1/N of the "
                                      "batch and DDP averages the gradients afterwards, so the scaled half-precision "
                                      "gradients in a worker's backward are up to N× larger and overflow at a lower "
                                      "loss scale)" if v.framework == "torch" else "")
             if isinstance(n, (int, float)) and isinstance(one, (int, float)) and n != one else "")
    t, seeds = e.get("accuracy_test") or {}, e.get("accuracy_seeds") or 0
    acc = (f"; accuracy against the --allreduce fp32 cell{'s' * (seeds > 1)} {paired(t, int(seeds))}"
           if "diff_pp" in t else "")
    return f"{who}: {agreed}" + (f"; {losses}" if losses else "") + (f", {against}" if against else "") + skips + acc


def recipe(scaling, granularity, amax_history=0, power_of_2: bool = False) -> str:
    """How an fp8 recipe scales (contract/fp8.py's fields): "scaled by each step's own amax, one scale per tensor"."""
    said = {"dynamic": "scaled by each step's own amax", "delayed": f"scaled by the largest amax of up to "
            f"{amax_history or 0:,} past steps"}.get(scaling, "scaling not recorded")
    said += {"tensor": ", one scale per tensor", "row": ", one scale per row"}.get(granularity, "")
    return said + (", rounded down to powers of 2" if power_of_2 else "")


def _fp8(v, e: dict) -> str:
    """An fp8 row: its recipe as read back, its layers' median SQNR at the last step and its accuracy against bf16."""
    r = e.get("recipe") or {}
    scales = recipe(r.get("scaling"), r.get("granularity"), r.get("amax_history"), r.get("power_of_2_scales"))
    over = "layers and seeds" if (e.get("fp8_seeds") or 0) > 1 else "layers"
    by_role = e.get("sqnr_by_role_db") or {}
    sqnr = (f"median SQNR at the last step (over {over}): " + ", ".join(
        f"{ROLE_WORDS.get(role, role)} {by_role[role]:.1f}" for role in ROLE_WORDS if role in by_role) + " dB"
        if by_role else "no SQNR recorded")
    seeds = e.get("seeds")
    paired = f" ({seeds:.0f} seed{'s' * (seeds != 1)} paired)" if isinstance(seeds, (int, float)) and seeds else ""
    said = f"n/a ({reason(v)})" if v.status == "not_comparable" else cell(v)  # no number beside "n/a"
    return f"{e.get('layers', 0)} layers in fp8, {scales}; {sqnr}; accuracy against bf16{paired} {said}"


def lab_line(v) -> str:
    """One experiment's verdict row (verdicts.EXPERIMENTS) as the answer's line: "PyTorch fp16: loss scale ..."."""
    words = {"scale_path": _path, "skipped_steps": _skips, "underflow": _underflow, "static_scale": _static,
             "attention_overflow": _naive, "data_parallel": _data_parallel, "fp8_vs_bf16": _fp8}[v.metric]
    return f"{framework_label(v.framework)} {v.precision}: {words(v, evidence(v.evidence))}"
