"""The loss-scaling lab's verdict rows (verdicts.LAB_METRICS): fp16 beside fp16-noscale or fp16-static."""

from __future__ import annotations

import re
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import KERAS_BACKENDS
from amp_compare.harness.report import phrases, stats, verdicts

DYNAMIC = precisions.names(half="float16", loss_scaling="dynamic")
STATIC = precisions.names(half="float16", loss_scaling="static")
UNSCALED = precisions.names(half="float16", loss_scaling=None)


def cannot_skip(framework: str, precision: str) -> bool:
    """A mode whose skipped-step count is no observation: no loss scaler, or Keras' static one (it never skips)."""
    scaling = precisions.of(precision).loss_scaling
    return scaling is None or (scaling == "static" and framework in KERAS_BACKENDS)


def rows(table: pd.DataFrame, runs: pd.DataFrame, steps: pd.DataFrame, underflow: pd.DataFrame | None) -> list[dict]:
    """The lab's verdict rows of every model x dataset with fp16 beside fp16-noscale or fp16-static."""
    out: list[dict] = []
    if table.empty or runs.empty or steps is None or steps.empty or "cell_id" not in runs:
        return out
    done = stats.finished(runs)
    by_cell = defaultdict(lambda: steps[:0], list(steps.sort_values("step").groupby("cell_id")))  # each cell's steps
    for (model, dataset), part in table.groupby(["model", "dataset"], sort=False):
        cells = done[(done["model"] == model) & (done["dataset"] == dataset)]
        if not (cells["precision"].isin(DYNAMIC).any() and cells["precision"].isin(STATIC + UNSCALED).any()):
            continue
        for r in part.drop_duplicates(["framework", "precision"]).itertuples():
            key = {k: getattr(r, k) for k in verdicts.IDENTITY}
            mine = cells[(cells["framework"] == r.framework) & (cells["precision"] == r.precision)]
            if mine.empty:
                continue
            if r.precision in DYNAMIC:
                out += [_path_row(key, mine, cells, by_cell), _skips_row(key, mine, by_cell, underflow)]
            elif r.precision in UNSCALED:
                out.append(_underflow_row(key, mine, underflow, part))
            elif r.precision in STATIC:
                out.append(_static_row(key, mine, by_cell, underflow))
    return out


def _path_row(key: dict, mine: pd.DataFrame, cells: pd.DataFrame, by_cell: dict) -> dict:
    """The dynamic scale's path per seed, against every other framework's cell of the same precision and seed."""
    seeds, same, others, shorter = [], True, set(), []
    cut_cells = stats.budgeted(cells)
    for c in mine.sort_values("seed").itertuples():
        scale = by_cell[c.cell_id]["loss_scale"].astype(float).to_numpy()
        if not len(scale):
            continue
        seeds.append({"seed": int(c.seed), "start": scale[0], "final": scale[-1], "steps": len(scale),
                      "growths": int((np.diff(scale) > 0).sum()), "backoffs": int((np.diff(scale) < 0).sum())})
        for t in cells[(cells["precision"] == key["precision"]) & (cells["seed"] == c.seed)
                       & (cells["framework"] != key["framework"])].itertuples():
            others.add(t.framework)
            theirs = by_cell[t.cell_id]["loss_scale"].astype(float).to_numpy()
            # compared over the steps both ran only where the speed budget stopped either cell
            cut = bool(cut_cells[[c.Index, t.Index]].any()) and len(theirs) != len(scale)
            n = min(len(theirs), len(scale)) if cut else None
            same = same and bool(np.array_equal(theirs[:n], scale[:n]))
            shorter += [n] if cut else []
    interval = pd.to_numeric(mine.get("cfg_growth_interval", pd.Series(dtype=float)), errors="coerce").dropna()
    facts = SimpleNamespace(estimate=seeds[0]["final"] if seeds else np.nan, others=len(others), same=same,
                            whole=not shorter)
    return verdicts.row(key, "scale_path", facts, {
        "seeds": seeds, "others": sorted(others), "common_steps": min(shorter) if shorter else None,
        "growth_interval": int(interval.iloc[0]) if len(interval) else None})


def cut_steps(mine: pd.DataFrame, by_cell: dict) -> int | None:
    """The fewest steps a cell of `mine` ran where the speed budget stopped one (None: every cell ran in full)."""
    return min((len(by_cell[c]) for c in mine.loc[stats.budgeted(mine), "cell_id"]), default=None)


def finding(c: dict, g: pd.DataFrame, underflow: pd.DataFrame | None) -> dict:
    """The locator's finding of run record `c` (`g`: its steps): its step's scale, the last probe's top log2 of it."""
    step, layer, tensor = int(pd.to_numeric(c["nonfinite_step"])), str(c["nonfinite_layer"]), str(c["nonfinite_tensor"])
    at = g.loc[g["step"] == step, "loss_scale"].astype(float)
    probed = underflow[(underflow["cell_id"] == c["cell_id"]) & (underflow["layer"] == layer)
                       & (underflow["param"] == tensor)] if underflow is not None and "param" in underflow else None
    last = probed[probed["when"] == "last step"] if probed is not None and "log2_hist" in probed else []
    tops = [k for k, v in stats.log2_histogram(last["log2_hist"].iloc[0]).items() if v > 0] if len(last) else []
    return {"seed": int(c["seed"]), "step": step, "where": str(c["nonfinite_where"]), "layer": layer, "tensor": tensor,
            "value": str(c["nonfinite_value"]), "scale": float(at.iloc[0]) if len(at) else None,
            "named": c["framework"] not in KERAS_BACKENDS or (probed is not None and not probed.empty),
            "probe_top_log2": max(tops) if tops else None}


def _skips_row(key: dict, mine: pd.DataFrame, by_cell: dict, underflow: pd.DataFrame | None) -> dict:
    """Each skipped update (seed, step, the scale it ran at) and the locator's finding at each cell's first."""
    skips, located = [], []
    for c in mine.sort_values("seed").to_dict("records"):
        g = by_cell[c["cell_id"]]
        skips += [{"seed": int(c["seed"]), "step": int(s.step), "scale": float(s.loss_scale)}
                  for s in g[g["skipped"].astype(bool)].itertuples()]
        if pd.to_numeric(c.get("nonfinite_step", -1), errors="coerce") >= 0 and str(c.get("nonfinite_where", "")):
            located.append(finding(c, g, underflow))
    facts = SimpleNamespace(estimate=float(len(skips)), where={f["where"] for f in located})
    return verdicts.row(key, "skipped_steps", facts, {"skips": skips, "located": located,
                                                      "cut_steps": cut_steps(mine, by_cell)})


# Parameters whose exact gradient is zero (softmax ignores a key bias's constant shift): the reference holds residue.
ZERO_GRADIENT_PARAM = re.compile(r"(?:^|\.)(?:key|k_proj)\.bias$")


def zero_gradient(underflow: pd.DataFrame) -> pd.Series:
    """Per underflow row: whether its parameter's exact gradient is zero (ZERO_GRADIENT_PARAM): residue, not loss."""
    return (underflow["layer"].astype(str) + "." + underflow["param"].astype(str)).str.contains(ZERO_GRADIENT_PARAM)


def lost_elements(underflow: pd.DataFrame | None, cell_id: str, at: str, when: str = "last step") -> tuple:
    """One cell's probe at `when`: (lost but residue, non-zero, flushed of the lost, residue) elements, or NaN."""
    column, flush = f"lost_fraction_mixed_{at}", f"flush_fraction_{at}"
    sel = (underflow[(underflow["cell_id"] == cell_id) & (underflow["when"] == when)]
           if underflow is not None and column in underflow else pd.DataFrame())
    if sel.empty or sel[column].isna().all():
        return np.nan, 0, 0, 0
    zeros, residue = (sel[column].fillna(0) * sel["nonzero"]).round(), zero_gradient(sel).to_numpy()
    flushed = np.minimum(zeros, (sel[flush].fillna(0) * sel["nonzero"]).round()) if flush in sel else 0 * zeros
    return (int(zeros[~residue].sum()), int(sel["nonzero"].sum()), int(flushed[~residue].sum()),
            int(zeros[residue].sum()))


def _underflow_row(key: dict, mine: pd.DataFrame, underflow: pd.DataFrame | None, part: pd.DataFrame) -> dict:
    """What dropping loss scaling lost at the last step's probe, per seed, beside the same cells' accuracy verdict."""
    seeds = []
    for c in mine.sort_values("seed").itertuples():
        counts = lost_elements(underflow, c.cell_id, "unscaled")
        if np.isfinite(counts[0]):
            seeds.append({"seed": int(c.seed), **dict(zip(("lost", "nonzero", "flushed", "residue"), counts))})
    acc = part[(part["framework"] == key["framework"]) & (part["precision"] == key["precision"])
               & (part["metric"] == "accuracy")]
    a = acc.iloc[0] if not acc.empty else dict.fromkeys(["estimate", "low", "high", "margin"], np.nan) | {
        "status": "", "reason": "", "evidence": None}
    said = phrases.evidence(a["evidence"])
    facts = SimpleNamespace(estimate=float(sum(s["lost"] for s in seeds)) if seeds else np.nan, accuracy=a["status"],
                            accuracy_low=float(a["low"]) if np.isfinite(a["low"]) else np.nan)
    return verdicts.row(key, "underflow", facts, {
        "seeds": seeds, "accuracy_status": facts.accuracy, "accuracy_reason": a["reason"], "accuracy_pp": a["estimate"],
        "accuracy_low": facts.accuracy_low, "accuracy_high": a["high"], "accuracy_margin": a["margin"],
        "discordant": said.get("discordant"), "images": said.get("images"), "seeds_paired": said.get("seeds")})


def _static_row(key: dict, mine: pd.DataFrame, by_cell: dict, underflow: pd.DataFrame | None) -> dict:
    """Whether the fixed scale sufficed: no skipped update, no non-finite loss, nothing lost at it (both probes)."""
    skipped = nonfinite = lost = flushed = 0
    counted, lost_at = False, []
    for c in mine.sort_values("seed").itertuples():
        g = by_cell[c.cell_id]
        skipped += int(g["skipped"].astype(bool).sum())
        nonfinite += int((~np.isfinite(g["loss"].astype(float))).sum()) + int(getattr(c, "status", "") == "diverged")
        for when in ("first step", "last step"):
            n, _, f, _ = lost_elements(underflow, c.cell_id, "scaled", when)
            if np.isfinite(n):
                lost, flushed, counted = lost + n, flushed + f, True
                lost_at += [{"seed": int(c.seed), "when": when, "lost": int(n)}] if n else []
    scale = pd.to_numeric(mine.get("cfg_loss_scale", pd.Series(dtype=float)), errors="coerce").dropna()
    facts = SimpleNamespace(estimate=float(scale.iloc[0]) if len(scale) else np.nan, skipped=skipped,
                            nonfinite=nonfinite, lost=lost if counted else np.nan)
    keras = key["framework"] in KERAS_BACKENDS  # Keras' static scale never skips: it applies a non-finite update
    return verdicts.row(key, "static_scale", facts, {
        "skipped": skipped, "nonfinite_losses": nonfinite, "cut_steps": cut_steps(mine, by_cell), "skips": not keras,
        "lost": lost if counted else None, "flushed": flushed, "lost_at": lost_at,
        "applies_nonfinite": keras and bool(skipped or nonfinite)})
