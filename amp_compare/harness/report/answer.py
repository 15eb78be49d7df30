"""The answer a report opens with: per model and framework, which precision to use on this machine and why,
from this run's evidence only, and where the run cannot decide, what would.

`answers(...)` turns the run's facts into `Answer`s (no words chosen by reading other sentences): the summary
statistics (tables.full_table), each seed's ratio (per_seed.seed_table), the cells that diverged or failed, the
CPU's flags (contract/env.py), the frameworks' own log lines about their half-precision path (the run table's
`framework_notices`, kept by harness/run/runner.py) and, where a profile was recorded, its top ops and library
paths (`profile_evidence`: framework, model, precision, op, self_share, library_path). `render(answers, fmt)`
writes the one answer as HTML, Markdown or terminal text, so the three say the same.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import framework_label
from amp_compare.harness.report import fp8 as fp8_report
from amp_compare.harness.report import memory, numerics, speed, stats
from amp_compare.harness.report.cell_text import ratio_number
from amp_compare.harness.report.dataparallel import recorded_error
from amp_compare.harness.report.tables import LOOP, group_label, named_machines, varying_keys

# What would decide a ratio the run could not, by the kind of its ⚠ note (stats.note_kind).
DECIDE = {"stalled": "a re-run of the stalled cell named beside it",
          "machine drift": "benchmarks/amp_speed.py (fp32 and mixed steps interleaved in one process, so the "
                           "machine's drift cancels)",
          "noisy": "more seeds (--seeds 0,1,2,3,4): the seeds' ratios spread too widely for a 95% interval on one "
                   "side of 1×",
          "one seed": f"more seeds (a run with {stats.MORE_SEEDS})",
          "too few": "more timed steps per cell (more --epochs or --steps-per-epoch)",
          "no ": f"more timed steps or {stats.MORE_SEEDS}"}
FORMAT_FLAGS = {"float16": ("cpu_fp16_hardware", "avx512_fp16/amx_fp16", "float16 arithmetic"),
                "bfloat16": ("cpu_bf16_hardware", "avx512_bf16/amx_bf16", "bfloat16 dot products")}
LOG_NAMES = {"float16": ("DT_HALF", "float16", "Half"), "bfloat16": ("DT_BFLOAT16", "bfloat16", "BFloat16")}


@dataclass
class PrecisionAnswer:
    precision: str
    verdict: str  # faster, slower, no difference, undecided, failed
    speed: str
    accuracy: str = ""
    memory: str = ""
    why: str = ""
    decide: str = ""  # what would decide it ("" when the run decided)
    budget: str = ""
    failed: str = ""  # seeds whose cell diverged or failed: such a precision is never the one to use


@dataclass
class Answer:
    label: str  # "simple_cnn on synthetic, PyTorch"
    use: str
    because: str
    parts: list[PrecisionAnswer] = field(default_factory=list)


def _off_one(ratio: float) -> str:
    """A seed's ratio, with as many decimals as it takes not to read as 1.00 when it is above or below 1 (1.001)."""
    for decimals in (2, 3, 4):
        if f"{ratio:.{decimals}f}" != f"{1:.{decimals}f}":
            return f"{ratio:.{decimals}f}"
    return f"{ratio:.2f}"


def _speed_text(r, seeds: pd.DataFrame) -> str:
    """The ratio, in every seed's words where every seed agrees, else with its interval and its kind."""
    ratios = seeds["ratio"].to_numpy(float)
    same_side = len(ratios) >= 2 and ((ratios > 1).all() or (ratios < 1).all())
    if same_side and len(ratios) <= 3:
        side = "below" if (ratios < 1).all() else "above"
        return (f"{r.speedup_vs_fp32:.2f}× fp32's speed (geometric mean), {side} 1× in every seed ("
                + ", ".join(f"{_off_one(v)}×" for v in ratios) + ")")
    if not np.isfinite(r.speed_low):
        return f"{ratio_number(r.speedup_vs_fp32, r.speed_basis)}× fp32's speed (no interval)"
    if r.speed_basis == "steps":  # one seed: its interval says nothing of other seeds
        seed = int(seeds["seed"].iloc[0]) if len(seeds) else 0
        return (f"{ratio_number(r.speedup_vs_fp32, 'steps')}× fp32's speed in seed {seed} "
                f"[{ratio_number(r.speed_low, 'steps')}–{ratio_number(r.speed_high, 'steps')}] (95% interval of the "
                f"step-to-step noise within seed {seed}'s two cells only; how the ratio varies between seeds is "
                "unknown)")
    every = " in every seed" if same_side else ""
    return (f"{r.speedup_vs_fp32:.2f}× fp32's speed{every} [{r.speed_low:.2f}–{r.speed_high:.2f}] "
            f"(95% t-interval over {int(r.speed_seeds)} seeds)")


def _verdict(r) -> tuple[str, str]:
    """(verdict, what would decide it) from the speed ratio's note and interval."""
    note = r.speed_note or ""
    if note:
        fallback = DECIDE["one seed"] if r.speed_seeds == 1 else DECIDE["noisy"]
        return "undecided", DECIDE.get(stats.note_kind(note), fallback)
    if np.isfinite(r.speed_low) and (r.speed_low > 1 or r.speed_high < 1):
        return ("faster" if r.speedup_vs_fp32 > 1 else "slower"), ""
    return "no difference", ""


def _accuracy_text(r) -> str:
    if getattr(r, "too_short", ""):
        return f"accuracy not comparable in this run ({r.too_short}): train longer to judge it"
    p = getattr(r, "p_value", np.nan)
    if not isinstance(p, float) or not np.isfinite(p):
        return ""
    if getattr(r, "test", "") == stats.NO_DIFFERENCE:  # no test ran: no p to print
        # the records hold whether each image was right, not which class was predicted (val_correct)
        return f"every image was classified right or wrong exactly as in fp32 (exact 95% bound ±{r.ci_high:.1f} pp)"
    if stats.detectable({"p_value": p, "ci_low": r.ci_low, "ci_high": r.ci_high}):
        return (f"accuracy {'lower' if r.diff_pp < 0 else 'higher'} by {abs(r.diff_pp):.1f} percentage points "
                f"[{r.ci_low:+.1f}, {r.ci_high:+.1f}] (p = {p:.2g})")
    return f"no detectable accuracy change (p = {p:.2g})"


def _why(fw: str, model: str, prec: str, cells: pd.DataFrame, environment: dict, device: str,
         profile: pd.DataFrame | None) -> str:
    """The reason, from measured evidence only: a profile's top op and its library path, the framework's own
    log lines, the CPU's flags (what it could compute in, not which kernels ran)."""
    half = precisions.of(prec).half or ""
    said = []
    rows = profile[(profile["framework"] == fw) & (profile["model"] == model) & (profile["precision"] == prec)] \
        if profile is not None and not profile.empty else pd.DataFrame()
    if not rows.empty:
        top = rows.sort_values("self_share", ascending=False).iloc[0]
        said.append(f"in its profile, {top['op']} accounts for {top['self_share']:.0%} of the step-time difference "
                    f"against fp32 (library: {top['library_path']})")
    logs = cells.get("framework_notices", pd.Series(dtype=object)).dropna().astype(str)
    lines = dict.fromkeys(ln for text in logs for ln in text.splitlines()
                          if any(w in ln for w in LOG_NAMES.get(half, ())))
    # the framework's own line is its record of the path it took: quoted as that, not interpreted
    said += [f"{framework_label(fw)} logged “{ln}” (its own record of the path it took)" for ln in list(lines)[:1]]
    if device == "cpu" and half in FORMAT_FLAGS:
        key, names, what = FORMAT_FLAGS[half]
        flags = environment.get("cpu_amp_flags") or "none"
        said.append(f"this CPU has {what} (flags: {flags})" if environment.get(key) else
                    f"this CPU has no {what} ({names} absent; flags: {flags})")
        did, follows = speed.isa_limit(environment)
        if did:  # the flags are the CPU's, not what the frameworks were let use
            said[-1] += f", but this run {did}, {follows}" if environment.get(key) else f", and this run {did}"
    if rows.empty and not lines:  # a quoted fallback line already says which path the framework took
        said.append("which kernels ran is unexplained by this run (no profile)")
    return "; ".join(said)


def _budget(cells: pd.DataFrame) -> str:
    if "budget_steps" not in cells or cells["budget_steps"].isna().all():
        return ""
    n = int(cells["budget_steps"].dropna().min())
    reason = next((str(v) for v in cells.get("budget_reason", pd.Series(dtype=object)).dropna() if str(v)), "")
    return (f"its speed was measured over {n} steps only (speed budget{': ' + reason if reason else ''}); "
            "--no-speed-budget measures it in full")


def _ended(cells: pd.DataFrame) -> str:
    """How the cells that did not finish normally ended ("" when all did)."""
    parts = []
    for r in cells[cells["status"] != "ok"].itertuples():
        # the steps' records, as every other sentence on it reads them, and a failed cell's own recorded error
        error = recorded_error(getattr(r, "error", ""), getattr(r, "stderr_tail", "")) if r.status == "failed" else ""
        ending = "; ".join(t for t in (numerics.ending_text(r), error) if t)
        parts.append(f"seed {r.seed} {r.status}" + (f" ({ending})" if ending else ""))
    return ", ".join(parts)


def _not_reported(cells: pd.DataFrame) -> str:
    """Why a precision whose cells did not finish has no speed: a diverged cell was timed (its run row has a speed),
    but over steps whose losses went non-finite and whose updates were skipped — said from its step records
    (numerics.loss_history's counts); "no speed measured" where no cell was timed or its steps were not recorded."""
    said = []
    for r in cells[cells["status"] != "ok"].itertuples():
        speed = pd.to_numeric(getattr(r, "throughput_img_s", np.nan), errors="coerce")
        bad = pd.to_numeric(getattr(r, "nonfinite_skipped_count", np.nan), errors="coerce")
        last = pd.to_numeric(getattr(r, "last_step", np.nan), errors="coerce")
        if pd.notna(speed) and speed > 0 and pd.notna(bad) and pd.notna(last) and last >= 0:
            said.append((f"seed {r.seed}: " if len(cells) > 1 else "")
                        + f"{int(bad)} of {int(last) + 1} steps non-finite and skipped")
    return f"timed but not reported: {'; '.join(said)}" if said else "no speed measured"


def _failed(prec: str, cells: pd.DataFrame, environment: dict) -> PrecisionAnswer:
    """A precision with no finished cell in this group: how its cells ended (beside a run's instruction limit,
    which no record ties to the failure or clears of it)."""
    # the locator only where a cell went non-finite: an error (a kernel missing) is said by _ended itself
    numeric = any("non-finite" in numerics.ending_text(r) for r in cells[cells["status"] != "ok"].itertuples())
    did = speed.isa_limit(environment)[0]
    limit = f"; this run {did}, and no record says whether that is why" if did else ""
    return PrecisionAnswer(prec, "failed", _not_reported(cells), failed=_ended(cells) + limit, decide=(
        "the NaN/Inf locator and What happened sections say where it went wrong" if numeric else ""))


def _part(r, seeds: pd.DataFrame, cells: pd.DataFrame, environment: dict, device: str,
          profile: pd.DataFrame | None) -> PrecisionAnswer:
    """One mixed precision of one model/framework group, from its row of full_table."""
    verdict, decide = _verdict(r)
    why = _why(r.framework, r.model, r.precision, cells, environment, device, profile) \
        if verdict in ("faster", "slower") else ""
    speed = _speed_text(r, seeds) + (f" ⚠ {r.speed_note}" if r.speed_note else "")
    return PrecisionAnswer(r.precision, verdict, speed, _accuracy_text(r), memory.answer_text(r), why, decide,
                           _budget(cells), _ended(cells))


def _loss_gaps(prec: str, cells: pd.DataFrame, group: pd.DataFrame) -> list[str]:
    """The fp8 cells' final validation loss minus fp32's and bf16's of the same seed (median over seeds)."""
    said = []
    for other in ("fp32", "bf16"):
        base = group[(group["precision"] == other) & (group["status"] == "ok")].set_index("seed")
        gaps = [r.final_val_loss - base.loc[r.seed, "final_val_loss"] for r in cells.itertuples()
                if r.seed in base.index and "final_val_loss" in base]
        gaps = [g for g in gaps if np.isfinite(g)]
        if gaps:
            said.append(f"validation loss {float(np.median(gaps)):+.4f} against {other}"
                        + (f" (median over {len(gaps)} seeds)" if len(gaps) > 1 else
                           " (one seed: one reading, no interval)"))
    return said


def _sqnr(cells: pd.DataFrame, fp8_layers: pd.DataFrame | None) -> str:
    """The worst quantization SQNR of the fp8 cells' last step (the fp8 section's table)."""
    if fp8_layers is None or fp8_layers.empty or "sqnr_db" not in fp8_layers:
        return ""
    rows = fp8_layers[fp8_layers["cell_id"].isin(set(cells["cell_id"])) & (fp8_layers["when"] == "last step")]
    rows = rows[np.isfinite(rows["sqnr_db"].astype(float))]
    if rows.empty:
        return ""
    worst = rows.loc[rows["sqnr_db"].astype(float).idxmin()]
    return f"worst SQNR {worst['sqnr_db']:.1f} dB ({worst['layer']} {worst['role']}, last step; the fp8 section)"


def _emulated(r, cells: pd.DataFrame, group: pd.DataFrame, fp8_layers: pd.DataFrame | None) -> PrecisionAnswer:
    """An fp8 mode off a GPU: its speed is the emulation's, so the answer speaks of its numerics only."""
    numerics = "; ".join(_loss_gaps(r.precision, cells[cells["status"] == "ok"], group)
                         + [s for s in (_sqnr(cells, fp8_layers),) if s])
    return PrecisionAnswer(r.precision, "emulated", fp8_report.EMULATED_SPEED, _accuracy_text(r), "",
                           f"numerics only: {numerics}" if numerics else "", failed=_ended(cells))


def _choice(parts: list[PrecisionAnswer], ratios: dict[str, float]) -> tuple[str, str]:
    """(what to use, because): the fastest precision shown faster with no detectable accuracy loss, else fp32."""
    good = [p for p in parts if p.verdict == "faster" and not p.failed and not p.accuracy.startswith("accuracy lower")]
    if good:
        best = max(good, key=lambda p: ratios[p.precision])
        caveat = " (accuracy not judged: see below)" if best.accuracy.startswith("accuracy not") else ""
        return best.precision, f"the fastest precision this run shows faster than fp32{caveat}"
    open_ = [p.precision for p in parts if p.verdict == "undecided"]
    if open_:
        return "fp32", (f"no mixed precision was shown faster; {', '.join(open_)} undecided by this run "
                        "(what would decide it is below)")
    return "fp32", "no mixed precision was faster in this run"


def answers(full: pd.DataFrame, seeds: pd.DataFrame, runs: pd.DataFrame, environment: dict, device: str,
            profile: pd.DataFrame | None = None, fp8_layers: pd.DataFrame | None = None,
            steps: pd.DataFrame | None = None) -> list[Answer]:
    """One Answer per (machine x) model x dataset (x step loop x batch size) x framework, in the summary's order;
    `steps` (the step records) say where a cell that did not finish went non-finite (numerics.loss_history)."""
    if full.empty or runs.empty:
        return []
    runs = numerics.with_loss_history(runs, steps)
    keys = [k for k in ("machine", "model", "dataset", *LOOP) if k in full]
    multi, varying = named_machines(full), varying_keys(full)
    out = []
    for key, group in full.groupby([*keys, "framework"], sort=False, dropna=False):
        key = dict(zip([*keys, "framework"], key))
        mine = runs[(runs["framework"] == key["framework"]) & (runs["model"] == key["model"])
                    & (runs["dataset"] == key["dataset"])]
        for k in ("machine", "step_loop", "batch_size"):
            col = {"step_loop": "cfg_step", "batch_size": "cfg_batch_size"}.get(k, k)
            if k in keys and col in mine and pd.notna(key[k]):
                mine = mine[mine[col] == key[k]]
        parts, ratios = [], {}
        for r in group[precisions.is_mixed(group["precision"])].itertuples():
            mine_seeds = seeds[(seeds["cell_id"].isin(set(mine["cell_id"]))) & (seeds["precision"] == r.precision)] \
                if not seeds.empty else seeds
            cells = mine[mine["precision"] == r.precision]
            parts.append(_emulated(r, cells, mine, fp8_layers) if r.emulated else
                         _part(r, mine_seeds, cells, environment, device, profile))
            ratios[r.precision] = r.speedup_vs_fp32
        done = set(group["precision"])
        for prec, cells in mine[precisions.is_mixed(mine["precision"]) & ~mine["precision"].isin(done)].groupby(
                "precision", sort=False):
            parts.append(_failed(prec, cells, environment))
        parts.sort(key=lambda p: precisions.NAMES.index(p.precision) if p.precision in precisions.NAMES else 99)
        use, because = _choice(parts, ratios)
        out.append(Answer(f"{group_label(key, multi, varying)}, {framework_label(key['framework'])}", use, because,
                          parts))
    return out


def _line(p: PrecisionAnswer) -> str:
    """The speed verdict with what explains it (why) or would decide it, then accuracy and memory: a reason
    is never placed after a clause it does not explain."""
    text = f"{p.precision}: {p.speed}"
    if p.failed:
        text += f" — did not finish: {p.failed}"
    if p.why:
        text += f" — {p.why}" if p.verdict == "emulated" else f" — why: {p.why}"
    if p.budget:
        text += f" — {p.budget}"
    if p.decide:
        text += f" — this run cannot decide it; what would: {p.decide}"
    rest = "; ".join(t for t in (p.accuracy, p.memory) if t)
    return text + (f". {rest[0].upper()}{rest[1:]}." if rest else ".")


def preface(environment: dict) -> str:
    """What every answer below stands under, said before them: a run that kept the frameworks from instructions
    (speed.isa_limit) measured them under that limit, fp32 included, not this CPU's default."""
    did = speed.isa_limit(environment)[0]
    return (f"This run {did}: every cell's numbers, fp32's included, are what the frameworks did under that limit, "
            "not this CPU's default.") if did else ""


def render(items: list[Answer], fmt: str, first: str = "") -> str:
    """The answer as "html", "markdown" or "text" (the terminal): the same sentences in each; `first` (preface)
    before them."""
    if not items:
        return ""
    heads = [(f"{a.label}: use {a.use}", f"{a.because}.") for a in items]
    if fmt == "html":
        blocks = [f"<p><b>{html.escape(h)}</b> — {html.escape(b)}</p><ul>"
                  + "".join(f"<li>{html.escape(_line(p))}</li>" for p in a.parts) + "</ul>"
                  for (h, b), a in zip(heads, items)]
        return "<div class='answer'>" + (f"<p>{html.escape(first)}</p>" if first else "") + "".join(blocks) + "</div>"
    if fmt == "markdown":
        return (f"{first}\n\n" if first else "") + "\n".join(
            f"**{h}** — {b}\n" + "".join(f"\n* {_line(p)}" for p in a.parts) + "\n" for (h, b), a in zip(heads, items))
    return (f"{first}\n" if first else "") + "\n".join(
        f"{h} — {b}" + "".join(f"\n  - {_line(p)}" for p in a.parts) for (h, b), a in zip(heads, items))
