"""The answer the page, summary.md and the terminal open with, from the verdict table alone: a preface, then per model
x framework an experiment's lines, the precision to use and why (verdicts.choose), one line per mixed precision."""

from __future__ import annotations

import html

import pandas as pd

from amp_compare.contract.config import DISPLAY_ORDER, framework_label
from amp_compare.harness.report import phrases, speed
from amp_compare.harness.report.verdicts import EXPERIMENTS, choose


def _line(prec: str, rows: pd.DataFrame) -> str:
    """A mixed precision's line: its speed (with interval) and accuracy verdicts, or one word where it did not run."""
    if (rows["reason"] == "unavailable").all():
        return f"{prec}: {phrases.REASON['unavailable']}"
    by = {r.metric: r for r in rows.itertuples()}
    return f"{prec}: " + "; ".join(  # n/a's reason and the rest of the intervals: the tables (80 columns)
        f"{phrases.METRIC[m]} " + ("n/a" if by[m].status == "not_comparable" else phrases.cell(
            by[m], m == "speed", by[m].status == "failed", contended=True)) for m in ("speed", "accuracy") if m in by)


def items(verdicts: pd.DataFrame) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """[(model on dataset, [(framework: use X (why), [one line per mixed precision])])]."""
    out = []
    for (model, dataset), part in verdicts.groupby(["model", "dataset"], sort=False):
        frameworks = experiment_items(part)
        for fw, group in _answerable(part).groupby("framework", sort=False):
            use, reason = choose(group)
            frameworks.append((f"{framework_label(fw)}: use {use} ({phrases.REASON[reason]})",
                               [_line(prec, rows) for prec, rows in group.groupby("precision", sort=False)]))
        said = [phrases.evidence(e).get("seeds") for e in part.loc[part["metric"] == "accuracy", "evidence"]]
        seeds = max((float(n) for n in said if isinstance(n, (int, float))), default=float("nan"))  # accuracy's
        out.append((f"{model} on {dataset}" + (" (one seed)" if seeds == 1 else ""), frameworks))
    return out


def _answerable(part: pd.DataFrame) -> pd.DataFrame:
    """The rows the precision to use is chosen from: all but the experiments' (verdicts.EXPERIMENTS)."""
    return part[~part["metric"].isin([m for _, metrics in EXPERIMENTS for m in metrics])]


def uses(verdicts: pd.DataFrame) -> str:
    """The runs index's headline of a run: per model x dataset, the precision each framework should use."""
    return "; ".join(f"{model}/{dataset}: " + ", ".join(f"{framework_label(fw)} {choose(group)[0]}" for fw, group
                                                       in _answerable(part).groupby("framework", sort=False))
                     for (model, dataset), part in verdicts.groupby(["model", "dataset"], sort=False))


def experiment_items(part: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """Each experiment's rows (verdicts.EXPERIMENTS) of one model x dataset under its header, framework by framework."""
    return [(header, [phrases.lab_line(v) for _, g in rows.groupby("framework", sort=False) for v in sorted(
        g.itertuples(), key=lambda v: (DISPLAY_ORDER.get(v.precision, 99), metrics.index(v.metric)))])
        for header, metrics in EXPERIMENTS if not (rows := part[part["metric"].isin(metrics)]).empty]


FAR_SLOWER = 0.1  # a speed verdict whose interval stays at or below this x fp32's: the kernels are the question


def preface(environment: dict, device: str = "cpu", verdicts: pd.DataFrame | None = None,
            profiled: bool = False) -> str:
    """The run's instruction limit or missing half arithmetic, then the precisions found FAR_SLOWER."""
    did = speed.isa_limit(environment)
    missing = [half for half, key in (("bfloat16", "cpu_bf16_hardware"), ("float16", "cpu_fp16_hardware"))
               if not environment.get(key)]
    said = [f"This run {did}: every number is what the frameworks did under that limit." if did else
            f"This CPU's flags list no {' or '.join(missing)} arithmetic." if device == "cpu" and missing else ""]
    far = verdicts[(verdicts["metric"] == "speed") & (verdicts["status"] == "slower")
                   & (verdicts["high"] <= FAR_SLOWER)] if verdicts is not None and not verdicts.empty else None
    if far is not None and not far.empty:  # per framework x model: which precisions, and how much slower
        parts = [f"{framework_label(fw)} {model} {_listed(list(dict.fromkeys(rows['precision'])))} "  # 42× or 42–95×
                 + "–".join(dict.fromkeys(f"{x:.0f}" for x in (1 / rows["estimate"]).agg(["min", "max"]))) + "×"
                 for (fw, model), rows in far.groupby(["framework", "model"], sort=False)]
        said.append(f"{_listed(parts)} slower than fp32 in the speed trials; "  # no profile: the option says where
                    + ("the Profile section names the kernels." if profiled
                       else "this run recorded no profile: rerun with --profile to name the kernels."))
    return " ".join(filter(None, said))


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def render(verdicts: pd.DataFrame, fmt: str, first: str = "") -> str:
    """The answer as "html", "markdown" or "text" (the terminal): the same lines in each."""
    said = items(verdicts)
    if not said:
        return ""
    if fmt == "html":
        e = html.escape
        body = "".join(f"<p><b>{e(m)}</b></p><ul>" + "".join(
            f"<li>{e(h)}<ul>" + "".join(f"<li>{e(ln)}</li>" for ln in lines) + "</ul></li>" for h, lines in fws)
            + "</ul>" for m, fws in said)
        return "<div class='answer'>" + (f"<p>{e(first)}</p>" if first else "") + body + "</div>"
    if fmt == "markdown":
        return (f"{first}\n\n" if first else "") + "\n".join(
            f"**{m}**\n\n" + "\n".join(f"* {h}\n" + "".join(f"  * {ln}\n" for ln in lines) for h, lines in fws)
            for m, fws in said)
    return (f"{first}\n" if first else "") + "\n".join(
        m + "".join(f"\n  {h}" + "".join(f"\n    {ln}" for ln in lines) for h, lines in fws) for m, fws in said)
