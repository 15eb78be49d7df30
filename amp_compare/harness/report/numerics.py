"""The report's Numerics and "What happened" sections: their tables and sentences, from the record tables."""

from __future__ import annotations

import re
from collections import Counter
from itertools import groupby
from types import SimpleNamespace

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import DISPLAY_ORDER, KERAS_BACKENDS, display_order, ordered
from amp_compare.contract.config import framework_label as _label
from amp_compare.contract.fp8 import FP8_MODES
from amp_compare.harness.report import phrases, scaling, stats, verdicts
from amp_compare.kit.fp16 import FP16_MAX


def scale_counts(steps: pd.DataFrame) -> pd.DataFrame:
    """Per framework x precision (medians over seeds): skipped steps, growth events, final scale."""
    keys = [*(k for k in ("model", "dataset") if k in steps), "framework", "precision"]  # never a median over models
    if steps.empty:
        return pd.DataFrame(columns=[*keys, "steps", "skipped", "growth_events", "first_scale", "final_scale"])
    cells = steps.sort_values("step").groupby([*keys, "cell_id"])
    scale = cells["loss_scale"]
    df = pd.DataFrame({"steps": cells.size(), "skipped": cells["skipped"].sum().astype(int),
                       "growth_events": scale.agg(lambda s: int((np.diff(s) > 0).sum())),
                       "first_scale": scale.first(), "final_scale": scale.last()})
    return df.groupby(keys, as_index=False).median().sort_values(keys, key=display_order)


# What each underflow column counts: the same method in both frameworks (kit/fp16.py UNDERFLOW_METHOD).
UNDERFLOW_METHODS = (
    "Would flush: the float32 reference gradient (forward and backward in float32, mixed precision off) "
    "rounded to float16, unscaled and times the scale in use; share of its non-zero elements that become 0.",
    "Lost in the mixed backward: the real backward under the run's precision (the half-precision ops "
    "autocast / the dtype policy chose), of the unscaled loss and of the loss times the scale in use; share "
    "of the reference's non-zero elements that came out exactly zero there. At the scale, only elements zero "
    "without it too: scaling up cannot underflow, so a zero only at the scale is float16 cancellation, counted "
    "apart (kit/fp16.py mixed_zero_kinds); a reference of exactly 0 is the gradient's own cancellation, no loss.",
)


def underflow_summary(underflow: pd.DataFrame) -> pd.DataFrame:
    """Element-weighted UNDERFLOW_METHODS shares per framework x precision x when, with their residue_ parts."""
    if underflow.empty:
        return pd.DataFrame()
    underflow = underflow.assign(zero_gradient=scaling.zero_gradient(underflow))
    shares = {"flush_unscaled": "flush_fraction_unscaled", "flush_scaled": "flush_fraction_scaled",  # residue in each
              "lost_unscaled": "lost_fraction_mixed_unscaled", "lost_scaled": "lost_fraction_mixed_scaled",
              "cancelled_scaled": "cancelled_fraction_mixed_scaled"}

    def weighted(g: pd.DataFrame) -> dict:
        has = set(g.columns[g.notna().all()])  # the columns recorded

        def mean(col: str, by: str = "nonzero", only: np.ndarray | bool = True) -> float:
            w = g[by].to_numpy(dtype=float)
            return float((g[col] * w * only).sum() / (w.sum() or 1.0)) if col in has else float("nan")

        return {"elements": int(g["elements"].sum()),
                **{col: mean(col, "elements") for col in ("zero_fraction", "zero_fraction_mixed")},
                **{name: mean(col) for name, col in shares.items()},
                "loss_scale": float(g["loss_scale"].iloc[0]),
                "at_step": int(g["at_step"].iloc[0]) if "at_step" in has else -1,
                **{f"residue_{name}": mean(col, only=g["zero_gradient"].to_numpy()) for name, col in shares.items()}}

    first_seed = underflow[underflow["seed"] == underflow["seed"].min()]  # one seed shows the mechanism
    keys = _per_model(first_seed) + ["framework", "precision", "when"]
    rows = [{**dict(zip(keys, key)), **weighted(g)} for key, g in first_seed.groupby(keys)]
    return pd.DataFrame(rows).sort_values(keys, key=display_order)


def dtype_side_by_side(dtypes: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per mixed precision: each (layer, phase) with the dtypes torch and Keras computed it in."""
    out: dict[str, pd.DataFrame] = {}
    if dtypes.empty:
        return out
    first_seed = dtypes[dtypes["seed"] == dtypes["seed"].min()]
    per = [k for k in ("model",) if k in first_seed and first_seed[k].nunique() > 1]  # a row names its model
    for prec in ordered(set(first_seed["precision"]) - {precisions.REFERENCE}):
        d = first_seed[first_seed["precision"] == prec]
        table = pd.concat({_label(fw): d[d["framework"] == fw].groupby([*per, "layer", "phase"], sort=False).agg(
            dtypes=("compute_dtype", _dtypes),  # the dtypes the layer's ops produced ("float16+float32": one op)
            ops=("op", lambda s: ", ".join(dict.fromkeys(s))),
            params=("param_dtype", lambda s: ", ".join(sorted(set(s) - {""})) or "-"))
            for fw in ordered(d["framework"])}, axis=1).reset_index()
        table.columns = [" ".join(c).strip() if isinstance(c, tuple) else c for c in table.columns]
        dtype_cols = [c for c in table.columns if c.endswith(" dtypes")]
        # only rows every framework attributes are compared, the others counted apart (_differing_rows)
        attributed = table[dtype_cols].notna().all(axis=1)
        out[prec] = table.assign(differs=attributed & (table[dtype_cols].nunique(axis=1) > 1),
                                 attributed=attributed).fillna("-")
    return out


def with_loss_history(runs: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """The run table with `history` beside each cell from its step records (-1 / NaN where not recorded)."""
    history = ["first_nonfinite_loss_step", "first_skipped_step", "last_step", "nonfinite_step_loss"]
    located = (dict(zip(runs["cell_id"], pd.to_numeric(runs["nonfinite_step"], errors="coerce").fillna(-1)))
               if "nonfinite_step" in runs and "cell_id" in runs else {})
    rows = []
    for cell, g in ([] if steps is None or steps.empty or "loss" not in steps else
                    steps.sort_values(["cell_id", "step"]).groupby("cell_id", sort=False)):
        bad = g.loc[~np.isfinite(g["loss"].astype(float)), "step"]
        skipped, at = g.loc[g["skipped"].astype(bool), "step"], g.loc[g["step"] == located.get(cell, -1), "loss"]
        rows.append({"cell_id": cell, "first_nonfinite_loss_step": int(bad.iloc[0]) if len(bad) else -1,
                     "first_skipped_step": int(skipped.iloc[0]) if len(skipped) else -1,
                     "last_step": int(g["step"].iloc[-1]),
                     "nonfinite_step_loss": float(at.iloc[0]) if len(at) else np.nan})
    return runs.drop(columns=history, errors="ignore").merge(pd.DataFrame(rows, columns=["cell_id", *history]),
                                                             on="cell_id", how="left")


def ending_text(r) -> str:
    """How a cell went non-finite, from with_loss_history's columns on a row (namedtuple); "" where not recorded."""
    first, skip, start = (pd.to_numeric(getattr(r, k, np.nan), errors="coerce")
                          for k in ("first_nonfinite_loss_step", "first_skipped_step", "diverged_at_step"))
    if pd.isna(first):
        return ""
    said = [f"first non-finite loss at step {int(first)}" if first >= 0 else "every loss finite"]
    if 0 <= skip < (first if first >= 0 else np.inf):  # NaN compares False
        said.append(f"the loss scaler skipped its first update at step {int(skip)}, with a finite loss")
    if getattr(r, "status", None) == "diverged" and start >= 0:
        said.append(f"it was stopped after step {int(r.last_step)}")
    return "steps counted from 0: " + "; ".join(said)


def nonfinite_findings(runs: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The NaN/Inf locator's rows, each with the loss of the step it ran at (nonfinite_step_loss, from `steps`)."""
    per, history = _per_model(runs), steps is not None and "cell_id" in runs  # two models: their layers share names
    cols = [*per, "framework", "precision", "seed", "nonfinite_step", "nonfinite_where", "nonfinite_layer",
            "nonfinite_value", "nonfinite_step_loss"]
    if "nonfinite_step" not in runs:
        return pd.DataFrame(columns=cols)
    runs = with_loss_history(runs, steps) if history else runs.assign(nonfinite_step_loss=np.nan)
    found = runs[pd.to_numeric(runs["nonfinite_step"], errors="coerce").fillna(-1) >= 0]
    return found[cols].sort_values([*per, "framework", "precision", "seed"], key=display_order)


def growth_facts(runs: pd.DataFrame, steps: pd.DataFrame) -> tuple[int, int] | None:
    """(growth interval, the most clean steps in a row of any dynamic-scaling cell), or None without either."""
    cells = runs[runs["precision"].isin(precisions.names(loss_scaling="dynamic"))] if "precision" in runs else runs[:0]
    if cells.empty or "cfg_growth_interval" not in cells or cells["cfg_growth_interval"].isna().all() \
            or (mine := steps[steps["cell_id"].isin(set(cells["cell_id"]))]).empty:
        return None
    skips = (g.sort_values("step")["skipped"].fillna(False).astype(bool) for _, g in mine.groupby("cell_id"))
    return int(cells["cfg_growth_interval"].dropna().min()), int(max((~s).groupby(s.cumsum()).sum().max()
                                                                     for s in skips))


def gradient_histogram(underflow: pd.DataFrame) -> pd.DataFrame:
    """Per float16 probe (_float16_probe): its non-zero reference gradient elements per 2^k <= |g| < 2^(k+1)."""
    rows, per = [], [k for k in ("model", "dataset") if k in underflow]  # never two models' elements in one count
    for _, g in _float16_probe(underflow, "log2_hist"):
        total = sum((Counter(stats.log2_histogram(text)) for text in g["log2_hist"]), Counter())  # zeros dropped
        rows += [{**{k: g[k].iloc[0] for k in [*per, "framework", "precision"]}, "log2": k, "count": v,
                  "loss_scale": float(g["loss_scale"].iloc[0])} for k, v in sorted(total.items())]
    out = pd.DataFrame(rows, columns=[*per, "framework", "precision", "log2", "count", "loss_scale"])
    return out.sort_values(["framework", "precision", "log2"], key=display_order)


def _float16_probe(underflow: pd.DataFrame, column: str) -> list[tuple[str, pd.DataFrame]]:
    """("vit on synthetic, PyTorch fp16", its last-step probe rows, first seed) per float16 mode with `column`."""
    if underflow.empty or column not in underflow:
        return []
    sel = underflow[(underflow["when"] == "last step") & underflow["precision"].isin(precisions.names(half="float16"))]
    sel, per = sel[sel["seed"] == sel["seed"].min()].sort_values(["framework", "precision"], key=display_order,
                                                                 kind="stable"), _per_model(underflow)
    return [(f"{_who(per, key)}{_label(key[-2])} {key[-1]}", g)
            for key, g in sel.groupby([*per, "framework", "precision"], sort=False)]


def _per_model(df: pd.DataFrame) -> list[str]:
    """The identity columns beyond framework x precision that the rows vary in (two models are never pooled)."""
    return [k for k in ("model", "dataset") if k in df and df[k].nunique() > 1]


def _who(per: list[str], key: tuple) -> str:
    """"vit on synthetic, " for a group of a run with several models/datasets, "" for a run with one."""
    return " on ".join(map(str, key[:len(per)])) + ", " if per else ""


def scaled_bound(top: int, scale: float) -> tuple[float, str]:
    """The probe's bound 2^(top+1) × scale on |gradient| × scale after the last step, and its words."""
    bound, held = 2.0 ** (top + 1) * scale, phrases.power(scale)
    return bound, f"times the scale the scaler held after that step ({held}) below {phrases.power(bound)}"


def headroom_sentences(underflow: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[str]:
    """Per float16 mode: the last step's largest |parameter gradient| against float16's max; scale_record_text."""
    groups = [(who, g, tops) for who, g in _float16_probe(underflow, "log2_hist")
              if (tops := [k for text in g["log2_hist"] for k, n in stats.log2_histogram(text).items() if n > 0])]
    # in gradient_histogram's row order: framework, precision, then the smallest magnitude held
    groups.sort(key=lambda t: (*(DISPLAY_ORDER[t[1][k].iloc[0]] for k in ("framework", "precision")), min(t[2])))
    out, explained = [], set()
    for who, g, tops in groups:
        top, scale = max(tops), float(g["loss_scale"].iloc[0])
        bound, below = scaled_bound(top, scale)
        w = g["nonzero"].to_numpy(float)
        over = float((g["overflow_fraction_scaled"] * w).sum() / w.sum()) if w.sum() else 0.0
        scaled = f"; {below}" if scale != 1 else ""
        reach = f", {over:.3%} of them overflowing to inf at that scale" if bound > FP16_MAX else ""
        record = scale_record_text(steps[steps["cell_id"] == g["cell_id"].iloc[0]], explained) \
            if steps is not None and not steps.empty else ""  # what a skip means: said in the first that has one
        out.append(f"{who}, after the last step (the first batch again): the largest |parameter gradient| was below "
                   f"2^{top + 1}{scaled}{reach}"
                   + ("" if out else  # what the bound does not bound, said once
                      f" — a bound{', like each below,' if len(groups) > 1 else ''} on the parameter gradients at "
                      f"{'its' if len(groups) > 1 else 'this'} probe only, not on other steps' nor on the intermediate "
                      "tensors of the backward, where overflow can also happen (the NaN/Inf locator names the tensor "
                      "at a cell's first skip), so it does not say whether a step overflowed")
                   + (f". {record}" if record else "") + ".")
    return out


def scale_record_text(cell_steps: pd.DataFrame, explained: set | None = None) -> str:
    """What a loss-scaled cell's step records show of overflow (its skips, their steps and scales); "" for none."""
    if cell_steps.empty or "loss_scale" not in cell_steps or (cell_steps["loss_scale"].astype(float) == 1).all():
        return ""
    g = cell_steps.sort_values("step")
    scale = g["loss_scale"].astype(float).to_numpy()
    skipped, finite = g["skipped"].astype(bool).to_numpy(), np.isfinite(g["loss"].astype(float).to_numpy())
    last = f"the last step (step {int(g['step'].iloc[-1])}, counting from 0) ran at {phrases.power(scale[-1])}"
    fw, prec = (str(g[k].iloc[0]) if k in g else "" for k in ("framework", "precision"))
    if fw in KERAS_BACKENDS and prec in precisions.names(loss_scaling="static") and not skipped.any():
        return (f"The step records: {'every' if finite.all() else 'not every'} loss of its {len(g):,} steps was "
                f"finite (a Keras static scale applies every update, so no skip can show an overflow); {last}")
    if not skipped.any():  # the Loss scaling part's table and paragraph say so: not again beside each probe
        return ""
    steps, explained, kinds = g["step"].astype(int).to_numpy(), set() if explained is None else explained, []
    why = {"with a finite loss": " (non-finite gradients at the scale then in use: a backward overflow, which a lower "
                                 "scale cures, or a forward value the loss does not read, which it does not — the "
                                 "NaN/Inf locator says which at the first)",  # each said at its first mention only
           "with a non-finite loss": " (the forward overflowed: no loss scale helps, since the scale multiplies only "
                                     "the backward)"}
    for mask, said in zip((skipped & finite, skipped & ~finite), why):  # "N <said>: steps 1–2, 5, at <scales>"
        if not (n := int(mask.sum())):
            continue
        at = pd.Series(scale[mask]).value_counts().sort_index(ascending=False)
        scales = (", ".join(f"{phrases.power(v)} ({k}×)" for v, k in at.items()) if len(at) <= 4 else  # a collapse
                  f"{len(at)} scales from {phrases.power(at.index[0])} down to {phrases.power(at.index[-1])}")
        runs = [[s for _, s in run] for _, run in groupby(enumerate(steps[mask].tolist()), lambda t: t[1] - t[0])]
        ranges = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)
        kinds.append(f"{n} {said}{'' if said in explained else why[said]}: step{'s' if n > 1 else ''} {ranges}, "
                     f"at {scales}")
        explained.add(said)
    late = steps[~finite]
    irrelevant = (f"; from step {int(late[0])} (the first non-finite loss) on, the scale's fall could not help: "
                  f"compute the layer the NaN/Inf locator names in float32 (--fp32-layers) or use a max-subtracted "
                  f"softmax" if len(late) else "")
    ending = f"was skipped, with a {'' if finite[-1] else 'non-'}finite loss" if skipped[-1] else "was not skipped"
    return (f"The step records: the scaler skipped {int(skipped.sum())} of {len(g):,} updates, "
            + "; ".join(kinds) + f"{irrelevant}; {last} and {ending}")


def lost_sentences(underflow: pd.DataFrame) -> list[str]:
    """Per float16 mode (last step): the elements the real float16 backward lost, by layer, cancellation apart."""
    out = []
    for who, g in _float16_probe(underflow, "lost_fraction_mixed_unscaled"):
        scale = float(g["loss_scale"].iloc[0])
        column = "lost_fraction_mixed_scaled" if scale != 1 else "lost_fraction_mixed_unscaled"
        if g[column].isna().all():
            continue
        zero = scaling.zero_gradient(g).to_numpy()  # a key bias's zero is residue (exact gradient 0), not cancellation
        lost = (g[column].fillna(0) * g["nonzero"]).round().astype(int)
        total, nonzero, residue = int(lost.sum()), int(g["nonzero"].sum()), int(lost[zero].sum())
        alone = int((g["lost_fraction_mixed_unscaled"].fillna(0) * g["nonzero"]).round().sum())  # with no scale
        at = (f" both at the scale held after the last step ({phrases.power(scale)}) and without it (lost"
              + (f"; without the scale alone, {alone:,} did" if alone != total else "") + ")"
              if scale != 1 else " (no loss scaling)")
        counted = (f"none of the {nonzero:,} non-zero gradient elements" if total == 0 else
                   f"{total:,} of the {nonzero:,} non-zero gradient elements ({phrases.share(total / nonzero)})")
        gone = (g["cancelled_fraction_mixed_scaled"].fillna(0) * g["nonzero"]).round()[~zero].sum() \
            if scale != 1 and "cancelled_fraction_mixed_scaled" in g else 0
        residue = (f" ({'all' if residue == total else f'{residue:,} of them'} attention key-bias residue)"
                   if residue else "")
        names, counts = (g["layer"].astype(str) + "." + g["param"].astype(str)).to_numpy(), lost.to_numpy()
        order = [i for i in np.argsort(-counts, kind="stable") if counts[i] > 0]
        said, top = [f"{names[i]} ({counts[i]:,})" for i in order], counts[order[0]] if order else 0
        where = (f"most ({top:,} of {total:,}) were in {names[order[0]]}"
                 + (f", then {said[1]}" if len(said) > 1 else "") if 2 * top > total else  # "most": over half
                 f"they were spread over {len(order)} layers, none holding most of them: {', '.join(said[:3])}"
                 + (f" and {len(order) - 3} more layers" if len(order) > 3 else ""))
        out.append(f"{who}, after the last step: {counted} came out exactly zero in the real float16 backward{at}"
                   + (f"; {where}{residue}" if total else "")
                   + (f"; {int(gone):,} ({phrases.share(gone / nonzero)}) did only at the scale (float16 cancellation)."
                      if gone else "."))
    return out


def skip_cause_sentences(runs: pd.DataFrame, steps: pd.DataFrame | None, underflow: pd.DataFrame | None) -> list[str]:
    """Per cell whose first skip the locator traced to a parameter's gradient: that finding beside the probe's bound."""
    if steps is None or steps.empty or "nonfinite_where" not in runs:
        return []
    out, per = [], _per_model(runs)
    found = runs[(runs["nonfinite_where"] == "backward") & (runs["nonfinite_tensor"] != "output")
                 & runs["precision"].isin(precisions.scaled_names())]
    for r in found.sort_values([*per, "framework", "precision", "seed"], key=display_order).to_dict("records"):
        g = steps[steps["cell_id"] == r["cell_id"]].sort_values("step")
        f = scaling.finding(r, g, underflow)
        if f["scale"] is None:
            continue
        top, after = f["probe_top_log2"], ""
        if top is not None:
            bound, below = scaled_bound(top, float(g["loss_scale"].iloc[-1]))
            after = (f"; after the last step the probe measured its largest |gradient| below 2^{top + 1}, {below}"
                     + (f", {FP16_MAX / bound:.3g}× under 65,504" if bound <= FP16_MAX else
                        ", not provably under 65,504"))
        out.append(f"{_who(per, tuple(r[k] for k in per))}{_label(r['framework'])} {r['precision']} seed {r['seed']}: "
                   f"the skip at step {f['step']} (scale {phrases.power(f['scale'])}) — {phrases.cause(f)}{after}.")
    return out


def scaling_accuracy_sentences(runs: pd.DataFrame, acc: pd.DataFrame | None = None) -> list[str]:
    """Per framework with fp16 both dynamically scaled and unscaled: both accuracies, each tested against fp32."""
    if (ok := stats.finished(runs)).empty:
        return []
    ok = ok[~stats.cut_groups(ok, [k for k in ("machine", "model", "dataset", "framework", "precision") if k in ok])]
    out, per, acc = [], _per_model(ok), acc if acc is not None and not acc.empty else None  # never two models' median
    median = ok.groupby([*per, "framework", "precision"])["final_val_accuracy"].median()
    tested = {} if acc is None else {key: f" (against fp32: {phrases.accuracy(g.iloc[0])})"
                                     for key, g in acc.groupby([*per, "framework", "precision"])}
    for group in dict.fromkeys(k[:-1] for k in median.index):
        dyn, none = (*group, scaling.DYNAMIC[0]), (*group, scaling.UNSCALED[0])
        if dyn in median and none in median:
            out.append(f"{_who(per, group)}{_label(group[-1])}: validation accuracy {median[dyn]:.1%} with dynamic "
                       f"loss scaling{tested.get(dyn, '')}, {median[none]:.1%} without any{tested.get(none, '')}"
                       + (" — each tested against fp32 image by image, as the Accuracy section does." if acc
                          is not None else "."))
    return out


def numerics_said(runs: pd.DataFrame, underflow: pd.DataFrame, steps: pd.DataFrame | None = None,
                  acc: pd.DataFrame | None = None) -> dict[str, list[str]]:
    """What happened, per Numerics subsection, saying only what its tables do not."""
    return {"loss_scaling": skip_cause_sentences(runs, steps, underflow) + scaling_accuracy_sentences(runs, acc),
            "underflow": headroom_sentences(underflow, steps) + lost_sentences(underflow)}


def op_dtype_facts(dtypes: pd.DataFrame, device: str, side_by_side: dict | None = None) -> dict:
    """What the glossary and dtype-audit section say of op dtypes (side_by_side: dtype_side_by_side(dtypes))."""
    said = {"torch": "aten ops seen by a TorchDispatchMode inside autocast",  # records without audit_method
            "tf": "ops of the traced training step (TensorFlow graph), by layer scope"}
    if "audit_method" in dtypes:
        said |= {fw: m for fw, m in dtypes.groupby("framework")["audit_method"].agg(
            lambda s: "; ".join(sorted(set(s.dropna()) - {""}))).items() if m}
    facts: dict = {"device": "CUDA" if device == "cuda" else "CPU", "precision": "", "differing": {},
                   "methods": [f"{_label(fw)}: {said.get(fw, 'not recorded')}"
                               for fw in ordered(dtypes["framework"])] if len(dtypes) else []}
    if dtypes.empty or (first := dtypes[(dtypes["seed"] == dtypes["seed"].min())
                                        & precisions.is_mixed(dtypes["precision"])]).empty:
        return facts
    facts["precision"] = ordered(first["precision"])[0]
    facts["inputs_recorded"] = "input_dtype" in dtypes and dtypes["input_dtype"].fillna("").astype(str).ne("").any()
    for p, table in (dtype_side_by_side(dtypes) if side_by_side is None else side_by_side).items():
        facts["differing"][p] = _differing_rows(table) | ({"models": {  # a two-model table: per model as well
            m: _differing_rows(g) for m, g in table.groupby("model", sort=False)}} if "model" in table else {})
    return facts


def _differing_rows(table: pd.DataFrame) -> dict:
    """How many of a dtype side-by-side table's rows differ between the frameworks, and in which layers."""
    both, differing = table["attributed"], table.loc[table["differs"], "layer"].replace("", "(unnamed)")
    return {"rows": int(table["differs"].sum()), "of": int(both.sum()), "unattributed": int((~both).sum()),
            "layers": list(dict.fromkeys(differing))[:8]}


# The parts of a vit, by canonical layer name (both audits name layers alike); "core" is the attention core:
# its ops are split into the matmuls (Q·Kᵀ, ·V) and the rest (the logits' scale and the softmax).
VIT_COMPONENTS = (
    ("LayerNorm", r"\.ln[12]$|^norm$", "all"),
    ("attention: Q/K/V/output projections", r"\.attn\.(?:query|key|value|out)$", "all"),
    ("Q·Kᵀ", r"\.attn$", "matmul"),
    ("softmax (with the logits' scale)", r"\.attn$", "softmax"),
    ("·V", r"\.attn$", "matmul"),
    ("GELU", r"\.mlp\.act$", "all"),
    ("residual adds", r"\.res[12]$", "all"),
    ("class token + position embedding", r"^embed$", "all"),
    ("head (fc)", r"^fc$", "all"),
)
CAST_OPS = {"_to_copy", "Cast"}
LAYOUT_OPS = {"Transpose"}  # TensorFlow's transpose of K moves data, computes nothing (torch's is a view)
MATMUL_OPS = {"bmm", "mm", "matmul", "baddbmm", "einsum", "BatchMatMulV2", "BatchMatMulV3", "MatMul", "Einsum"}
FUSED_ATTENTION = re.compile(r"scaled_dot_product|dot_product_attention|flash_attention", re.IGNORECASE)
# What a fused kernel does inside, where its source says so (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp).
FUSED_INSIDE = {"_scaled_dot_product_flash_attention_for_cpu":
                "float32 accumulation inside (PyTorch's CPU flash-attention kernel accumulates in at::opmath_type, "
                "float32 for half inputs; its float32 output is the log-sum-exp it keeps for the backward)"}


def _dtypes(values) -> str:
    return ", ".join(sorted({x for v in values for x in str(v).split("+") if x}))


def _computed_in(rows: pd.DataFrame) -> pd.Series:
    """The dtype each op computed in: its floating inputs'; where they mix or are not recorded, its outputs'."""
    inputs = rows["input_dtype"].fillna("").astype(str) if "input_dtype" in rows else pd.Series("", rows.index)
    out = []
    for i, o in zip(inputs, rows["compute_dtype"].astype(str)):
        ins, outs = {x for x in i.split("+") if x}, [x for x in o.split("+") if x]
        out.append(ins.pop() if len(ins) == 1 else outs[0] if outs and (ins or len(outs) == 1) else o)
    return pd.Series(out, index=rows.index, dtype=object)


def _cell(rows: pd.DataFrame, kind: str) -> tuple[str, str]:
    """One framework's (ops text, computed-in text) for one part."""
    math = rows[~rows["op"].isin(CAST_OPS | LAYOUT_OPS)]
    fused = math[math["op"].astype(str).str.contains(FUSED_ATTENTION)]
    if kind != "all" and not fused.empty:  # named once, in the middle row of the three the kernel does
        op, inputs = str(fused["op"].iloc[0]), _dtypes(_computed_in(fused))
        inside = f"; {FUSED_INSIDE[op]}" if op in FUSED_INSIDE else ""
        return (f"fused kernel {op}, inputs {inputs}{inside}" if kind == "softmax" else
                f"the fused kernel, inputs {inputs}"), inputs
    if kind != "all":
        math = math[math["op"].isin(MATMUL_OPS) == (kind == "matmul")]
    per_op = math.assign(computed=_computed_in(math)).groupby("op", sort=False)["computed"].agg(_dtypes)
    text = "; ".join(f"{op}: {dt}" for op, dt in per_op.items()) or "-"
    if kind == "matmul" and per_op.str.contains(",").any():
        text += " (the audit counts both attention matmuls as one op: which is which is not recorded)"
    casts = _dtypes(rows.loc[rows["op"].isin(CAST_OPS), "compute_dtype"])
    if casts and kind == "all":  # the attention core's casts serve its input and its softmax: not said per row
        text += f" (casts to {casts})"
    return text, _dtypes(per_op) or "-"


def vit_dtype_table(dtypes: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per mixed precision: each VIT_COMPONENTS part's ops and computed-in dtype per framework (CNNs: empty)."""
    out: dict[str, pd.DataFrame] = {}
    if dtypes.empty or not dtypes["layer"].astype(str).str.match(r"blocks\.\d+\.attn$").any():
        return out
    first = dtypes[(dtypes["seed"] == dtypes["seed"].min()) & (dtypes["phase"] == "forward")]
    first = first[first["layer"].astype(str).str.match(r"blocks\.|embed$|norm$|fc$")]
    for prec in ordered(set(first["precision"]) - {precisions.REFERENCE}):
        d = first[first["precision"] == prec]
        rows = []
        for component, pattern, kind in VIT_COMPONENTS:
            part = d[d["layer"].astype(str).str.contains(pattern, regex=True)]
            row = {"part": component}
            for fw in ordered(d["framework"]):
                row[_label(fw)], row[f"{_label(fw)} computed in"] = _cell(part[part["framework"] == fw], kind)
            computed = [row[c] for c in row if c.endswith(" computed in")]
            # "-": that framework's audit attributes no op to this part: not attributed, so no difference
            row["differs"] = "-" not in computed and len(set(computed)) > 1
            rows.append(row)
        out[prec] = pd.DataFrame(rows)
    return out


QUANTITY_LABELS = {"attention_logit": "attention logit (softmax input)", "layernorm_input": "LayerNorm input"}


def headroom_per_block(headroom: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per framework x precision x seed x epoch x block x quantity: the largest magnitude (`attention`: from runs)."""
    keys = ["framework", "precision", "seed", "cell_id", "epoch", "block", "quantity"]
    if headroom is None or headroom.empty:
        return pd.DataFrame(columns=[*keys, "max_abs"])
    df = headroom[headroom["quantity"].isin(QUANTITY_LABELS)].copy()
    # blocks.1.attn -> blocks.1; norm -> norm (the final LayerNorm is a block of its own here)
    df["block"] = [".".join(p[:2]) if p[0] == "blocks" else p[0] for p in df["layer"].str.split(".")]
    out = df.groupby(keys, as_index=False)["max_abs"].max()
    if runs is not None and "cfg_attention" in runs:
        out = out.merge(runs[["cell_id", "cfg_attention"]].rename(columns={"cfg_attention": "attention"}),
                        on="cell_id", how="left")
    return out.sort_values(["framework", "precision", "block", "quantity", "epoch"], key=display_order)


def cross_framework_loss_gap(steps: pd.DataFrame) -> str:
    """The vit's median relative loss gap per precision, PyTorch vs Keras by seed, before either's first skip or NaN."""
    mine = steps[steps["model"] == "vit"] if "model" in steps else steps[:0]
    ran = set(mine.get("framework", ()))
    if "torch" not in ran or (keras_fw := next((fw for fw in KERAS_BACKENDS if fw in ran), None)) is None:
        return ""
    parts = []
    for prec in ordered(set(mine["precision"]) - set(FP8_MODES)):  # fp8: each framework its own recipe
        found = []  # per seed: (median gap, steps compared, steps both ran)
        for _, sel in mine[mine["precision"] == prec].groupby("seed"):
            t, k = (sel[sel["framework"] == fw].set_index("step") for fw in ("torch", keras_fw))
            both = pd.concat([t["loss"], k["loss"]], axis=1, keys=["t", "k"], join="inner")  # NaN losses kept
            bad = ~np.isfinite(both.to_numpy(dtype=float)).all(axis=1)
            for x in (t, k) if "skipped" in sel else ():  # after a skipped update the two scalers' paths differ
                bad |= x["skipped"].reindex(both.index).fillna(False).astype(bool).to_numpy()
            kept = both.iloc[:int(np.argmax(bad))] if bad.any() else both
            if len(kept):
                found.append((float(np.median(np.abs(kept.t - kept.k) / np.abs(kept.t))), len(kept), len(both)))
        if not found:
            continue
        gaps, counts, totals = zip(*found)  # a seed's steps, marked where a skip or non-finite loss cut them short
        n = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
        per = " per seed" if len(counts) > 1 else ""
        covered = (f"{n} steps{per}" if counts == totals else f"only its first {n} of {max(totals)} steps{per}: a "
                   "skip or non-finite loss cut it short, not comparable")
        parts.append(f"{prec} {float(np.median(gaps)):.2g} ({covered})")
    return (f"Measured in this run (vit): median per-step relative loss gap PyTorch vs {_label(keras_fw)} from the "
            f"same weights and batches, over the steps before either cell's first non-finite loss or skipped update: "
            f"{', '.join(parts)} (fp32's gap is the floor: summation order alone; a precision cut short covers "
            "fewer, earlier steps and is not compared with it).") if parts else ""


def section_words(facts, dtype_facts: dict) -> dict[str, str]:
    """The Numerics section's paragraphs (wording.RunFacts; op_dtype_facts' differing rows and audit methods)."""
    differing = dtype_facts.get("differing", {})
    rows = sum(f["rows"] for f in differing.values())  # rows both frameworks attribute that differ; lone: the others
    lone = {p: f["unattributed"] for p, f in differing.items() if f.get("unattributed")}
    n = sum(lone.values())
    apart = (f" {n} row{'s' if n != 1 else ''} ({', '.join(f'{p}: {k}' for p, k in lone.items())}) one framework's "
             "audit does not attribute (\"-\" in its column): not attributed, so not compared." if lone else "")

    def _rows_text(f: dict) -> str:  # "3 of 40 rows (fc, …)", "…" where more rows differ than layers are named
        named = ", ".join(f["layers"]) + (", …" if f["rows"] > len(f["layers"]) else "")
        return f"{f['rows']} of {f['of']} rows" + (f" ({named})" if f["layers"] else "")

    per = "; ".join(f"{p}: " + (", ".join(f"{m} {_rows_text(g)}" for m, g in f["models"].items())
                                if "models" in f else _rows_text(f)) for p, f in differing.items() if f["rows"])
    dtype = "Dtypes each layer computed in during one training step (first seed)."
    if len(facts.frameworks) > 1:
        dtype += " " + (f"{rows} row{'s' if rows != 1 else ''} differ between the frameworks, marked in red, counted "
                        f"over the rows both attribute — {per}.{apart} Aligned mode (the default) aligns every "
                        "difference a setting can, and tests/test_numerics.py checks those layers row by row; a row in "
                        "red is one no setting aligns (contract/mapping.py names them, e.g. PyTorch's fused attention, "
                        "which runs Q·Kᵀ, softmax and ·V in one op) or, in defaults mode, each framework's own default."
                        if rows else "No row both frameworks attribute differs between them." + apart)
    if dtype_facts.get("methods"):
        dtype += f" How each column was taken: {'; '.join(dtype_facts['methods'])}."
    return {
        "underflow_intro": "Measured the same way in both frameworks, twice per probe (one batch, first seed, first "
                           "and last step), the two methods side by side:",
        "underflow_after": "The first method is what float16 would do to exact float32 gradients; the second is what "
                           "the run's own half-precision backward did (there underflow shows as exact zeros, never "
                           "as a flush). Differences between the frameworks in the second method come from which "
                           "layers each computes in the half dtype (see the dtype audit).",
        "dtype_audit": dtype,
        "vit_dtypes": "For each part of the ViT, the dtype its arithmetic computed in, per framework and precision: "
                      "the dtype of the floating inputs of the ops that did it in the forward of the audited step "
                      "(the dtype audit says how each column was taken). An op whose inputs mix dtypes computes in the "
                      "promoted one (a float32 residual plus a float16 branch: float32). A fused attention kernel is "
                      "one op for Q·Kᵀ, softmax and ·V: the table names it and its inputs' dtype, and says what it "
                      "does inside only where its source says so; an extra float32 output (torch's log-sum-exp, kept "
                      "for the backward) says nothing of the dtype the softmax read. Casts are listed apart; rows in "
                      "red compute in different dtypes. The framework differences table says which of them aligned "
                      "mode makes identical and how."
                      + ("" if dtype_facts.get("inputs_recorded", True) else
                         " These records predate the audits' input dtypes: the table shows each op's output dtypes."),
        "nonfinite": "At the first non-finite loss or skipped update, the run located the first layer whose forward "
                     "output (or, if the forward was finite, whose gradient) was non-finite, re-running that step's "
                     "batch at its weights and loss scale. A forward finding beside a finite loss of that step is "
                     "one in elements the loss does not read (the vit's head reads only the class token's row): it "
                     "reached the update through the gradients.",
        "no_nonfinite": "No cell met a non-finite loss or gradient.",
        "no_scaled": "No loss-scaled cell in this run, so no loss-scale figure.",
    }


def naive_rows(table: pd.DataFrame, runs: pd.DataFrame, headroom: pd.DataFrame | None) -> list[dict]:
    """The verdicts.NAIVE rows: per model x framework x precision run with --attention naive, how it went."""
    if table.empty or runs.empty or "cfg_attention" not in runs:
        return []
    done = stats.finished(runs[runs["cfg_attention"] == "naive"])
    logits = headroom_per_block(headroom)
    logits, out = logits[logits["quantity"] == "attention_logit"], []
    for r in table.drop_duplicates(["model", "dataset", "framework", "precision"]).itertuples():
        mine = done[(done["model"] == r.model) & (done["dataset"] == r.dataset) & (done["framework"] == r.framework)
                    & (done["precision"] == r.precision)].sort_values("seed")
        if mine.empty:
            continue
        seeds = []
        for c in mine.to_dict("records"):  # where it went non-finite, how it ended, its largest attention logit
            step, first_bad, loss = (pd.to_numeric(c.get(k, np.nan), errors="coerce")
                                     for k in ("nonfinite_step", "first_nonfinite_loss_step", "final_train_loss"))
            every_finite = bool(first_bad < 0) if pd.notna(first_bad) else bool(np.isfinite(loss))
            skipped, peaks = int(c.get("skipped_steps", 0) or 0), logits[logits["cell_id"] == c["cell_id"]]
            # a non-finite peak (inf, or NaN: a running maximum that met an overflowed value) wins, at its first epoch
            bad = peaks[~np.isfinite(peaks["max_abs"].to_numpy(dtype=float))].sort_values("epoch")["max_abs"]
            seeds.append({"seed": int(c["seed"]), "step": int(step) if pd.notna(step) else -1,
                          **{k: str(c.get(f"nonfinite_{k}") or "") for k in ("where", "layer", "value")},
                          "status": str(c.get("status")), "skipped": skipped, "steps": int(c.get("steps_total") or 0),
                          "finite": c.get("status") == "ok" and every_finite and skipped == 0,
                          "largest_logit": float(bad.iloc[0] if len(bad) else peaks["max_abs"].max())})
        first = min((s for s in seeds if s["step"] >= 0), key=lambda s: s["step"], default={"step": -1, "where": ""})
        forced = mine["cfg_fp32_layers"].iloc[0] if "cfg_fp32_layers" in mine else ""
        if not isinstance(forced, str):  # a tuple read back from parquet: a list/array, or None / NaN where empty
            forced = ",".join(map(str, forced)) if isinstance(forced, (list, tuple, np.ndarray)) else ""
        facts = SimpleNamespace(estimate=first["step"] if first["step"] >= 0 else np.nan, step=first["step"],
                                where=first["where"], forced=forced, finite=all(s["finite"] for s in seeds))
        key = {k: getattr(r, k) for k in verdicts.IDENTITY}
        half = getattr(precisions.BY_NAME.get(r.precision), "half", "") or ""
        out.append(verdicts.row(key, "attention_overflow", facts, {"seeds": seeds, "forced": forced, "half": half}))
    return out

