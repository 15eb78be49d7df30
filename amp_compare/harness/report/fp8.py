"""The report's fp8 section from the run's tables: layers in fp8, each recipe read back beside contract/fp8.py's,
per-layer SQNR, scale trajectories, loss and paired accuracy against bf16 and fp32. `section` (None without fp8
cells), `html`, `markdown` and `figure` render it. Framework-free."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from amp_compare.contract import fp8 as contract
from amp_compare.contract.config import framework_label
from amp_compare.harness.report import phrases, verdicts
from amp_compare.harness.report.stats import ACC_COLS, budgeted, correct_pairs, paired_test
from amp_compare.kit.fp16 import FP16_MAX

# An fp8 cell off a GPU runs in emulation: no speed ratio or verdict, and its memory and FLOP/s are the emulation's.
EMULATED_SPEED = "emulated: not a speed result"
EMULATED_MEMORY = "emulated: not fp8 memory (float32 dequantized copies)"


def speed_emulated(precision: pd.Series, device: str) -> pd.Series:
    """Whether each mode's speed is an emulation's."""
    return precision.isin(contract.FP8_MODES) & (device != "cuda")


def api_text(row: dict) -> str:
    """The AMP API a cell ran: an fp8 cell's from its fp8_settings (its amp_api says "none"), others' as recorded."""
    recorded = row.get("amp_api") if isinstance(row.get("amp_api"), str) else ""  # a crashed cell's is missing (NaN)
    live = phrases.evidence(row.get("fp8_settings"))
    if row.get("precision") not in contract.FP8_MODES or not live:
        return recorded
    layers = f"on {len(live.get('converted', []))} layers, {live.get('scaling', '?')} scaling"
    if row.get("framework") == "torch":  # the converted layers' class, as the child read it (older records lack it)
        emulated = ", emulated: float32 matmuls of dequantized values" if live.get("emulate") else ""
        return f"{live.get('module') or 'fp8 layers (class not recorded)'} {layers}{emulated}"
    return f"Keras dtype policy {live.get('policy') or '(not recorded)'} {layers}"


OUTLIER_LAYER = "blocks.0.attn.query"  # a projection whose input carries --fp8-outlier's activation


def sqnr(cells: pd.DataFrame, when: str = "last step") -> tuple[float, str]:
    """Of one cell's fp8_layers rows at `when`: the median of each layer's worst SQNR, and the worst, described."""
    mine = cells[cells["when"] == when] if not cells.empty else cells
    if mine.empty:
        return float("nan"), "n/a"
    worst = mine.loc[mine["sqnr_db"].idxmin()]
    zero = float(worst["zero_share"]) if "zero_share" in worst else 0.0
    flushed = f", {zero:.0%} of its nonzero values flushed to 0" if zero >= 0.005 else ""
    return (float(mine.groupby(["cell_id", "layer"])["sqnr_db"].min().median()),
            f"{float(worst['sqnr_db']):.1f} ({worst['layer']} {worst['role']}{flushed})")


def verdict_rows(acc: pd.DataFrame, runs: pd.DataFrame, layers: pd.DataFrame | None) -> list[dict]:
    """The fp8 verdict rows (verdicts.FP8): accuracy paired against bf16; recipe and SQNR as evidence."""
    if acc.empty or runs.empty or not acc["precision"].isin(contract.FP8_MODES).any():
        return []
    ok = runs[(runs["status"] == "ok") & ~budgeted(runs)]
    out = []
    for r in acc[acc["precision"].isin(contract.FP8_MODES)].itertuples():
        same = ok[(ok["model"] == r.model) & (ok["dataset"] == r.dataset) & (ok["framework"] == r.framework)]
        mine = same[same["precision"] == r.precision]
        pairs = correct_pairs(same[same["precision"] == contract.PARTNER], mine)
        test = {**dict.fromkeys(ACC_COLS, np.nan), "method": "", **(paired_test(pairs) if pairs else {})}
        row = verdicts.accuracy(SimpleNamespace(**{**r._asdict(), **test, "seeds": len(pairs)}), metric="fp8_vs_bf16")
        last = (layers[layers["cell_id"].isin(set(mine["cell_id"])) & (layers["when"] == "last step")]
                if layers is not None and not layers.empty else pd.DataFrame())
        roles = last.groupby("role")["sqnr_db"].median().astype(float).to_dict() if not last.empty else {}
        live = phrases.evidence(mine["fp8_settings"].iloc[0]) if not mine.empty else {}
        recipe = {k: live.get(k) for k in ("scaling", "granularity", "amax_history", "power_of_2_scales")}
        row["evidence"] = json.dumps({**phrases.evidence(row["evidence"]), "recipe": recipe,
                                      "layers": len(live.get("converted", [])), "fp8_seeds": len(mine),
                                      "sqnr_by_role_db": roles}, default=str)
        out.append(row)
    return out


def _sentences(runs: pd.DataFrame, fp8_runs: pd.DataFrame, trace: pd.DataFrame, layers: pd.DataFrame,
               device: str) -> list[str]:
    out = [] if device == "cuda" else [
        "fp8 is emulated on this CPU (fp8 casts, float32 matmuls of the dequantized values): this section shows "
        "numerics only; no speed, memory or MFU is claimed for fp8. Every matmul ran in float32 on dequantized values, "
        "so each SQNR measures the casts' rounding, not an fp8 unit's accumulation."]
    if "model" in fp8_runs and (fp8_runs["model"] == "vit").any():
        out.append("The ViT headroom figure leaves fp8 out: it measures distance to float16's largest value, "
                   f"{FP16_MAX:,.0f}, while each fp8 tensor is scaled into its own format's range before its cast "
                   "(by fmax / amax: torchao from this step's amax, Keras from an amax history), so that distance "
                   "says nothing of an fp8 tensor.")
    unavailable = runs[(runs["precision"].isin(contract.FP8_MODES)) & (runs["status"] == "unavailable")]
    out += [f"{framework_label(r.framework)} {r.precision}: unavailable — {str(r.error).removeprefix('unavailable: ')}"
            for r in unavailable.drop_duplicates(["framework", "precision"]).itertuples()]
    if not trace.empty:
        first = trace[(trace["step"] == 0) & (trace["role"] == "input")]
        for fw, group in first.groupby("framework"):
            lo, hi = group["scale"].min(), group["scale"].max()
            out.append(f"{framework_label(fw)} ({', '.join(sorted(group['precision'].unique()))}): the first step's "
                       f"input scales (fmax / amax) {f'are all {lo:.3g}' if lo == hi else f'range {lo:.3g}–{hi:.3g}'}"
                       + (" — Keras' delayed scaling starts from 1.0 and takes its first amax from the history "
                          "after that step" if fw != "torch" else " — this step's own amax (dynamic)") + ".")
    if not layers.empty and (fp8_runs.get("cfg_fp8_outlier", pd.Series(dtype=bool)) == True).any():  # noqa: E712
        hit = layers[(layers["layer"] == OUTLIER_LAYER) & (layers["role"] == "input") & (layers["when"] == "last step")]
        out += [f"--fp8-outlier: {OUTLIER_LAYER}'s input under {framework_label(r.framework)} {r.precision}: SQNR "
                f"{r.sqnr_db:.1f} dB, {r.zero_share:.1%} of its nonzero values flushed to zero (amax {r.amax:.3g})."
                for r in hit.itertuples()]
    return out


def _from_zero(trace: pd.DataFrame) -> pd.DataFrame:
    """The per-tensor recipes' trace (a per-row recipe never applies its per-tensor fmax / amax), steps from 0."""
    if trace.empty:
        return trace
    modes = trace[["framework", "precision"]].drop_duplicates().itertuples(index=False)
    tensorwise = {(fw, p) for fw, p in modes if getattr(contract.recipe(fw, p), "granularity", "") == "tensor"}
    trace = trace[[key in tensorwise for key in zip(trace["framework"], trace["precision"])]]
    return trace.assign(step=trace["step"] - trace.groupby("cell_id")["step"].transform("min"))


def section(tables: dict[str, pd.DataFrame], device: str = "cpu") -> dict | None:
    runs = tables.get("run", pd.DataFrame())
    if runs.empty or not runs["precision"].isin(contract.FP8_MODES).any():
        return None
    fp8_runs = runs[runs["precision"].isin(contract.FP8_MODES) & (runs["status"] == "ok")]
    layers, trace = tables.get("fp8_layers", pd.DataFrame()), _from_zero(tables.get("fp8_trace", pd.DataFrame()))
    rows, recipes, apis = [], [], []
    for cell in fp8_runs.itertuples():
        cells = layers[layers["cell_id"] == cell.cell_id] if not layers.empty else layers
        median, worst = sqnr(cells)
        same = runs[(runs["framework"] == cell.framework) & (runs["model"] == cell.model)
                    & (runs["dataset"] == cell.dataset) & (runs["seed"] == cell.seed)]
        versus = []  # loss, then accuracy paired image by image, minus bf16's, then fp32's, of the same seed
        for other in (contract.PARTNER, "fp32"):
            base = same[same["precision"] == other]
            pairs = correct_pairs(base, same[same["precision"] == cell.precision])
            versus += ["n/a" if base.empty else f"{cell.final_val_loss - float(base.iloc[0]['final_val_loss']):+.4f}",
                       phrases.paired(paired_test(pairs)) if pairs else "n/a"]
        rows.append({
            "framework": framework_label(cell.framework), "precision": cell.precision, "seed": cell.seed,
            "layers in fp8": len(phrases.evidence(getattr(cell, "fp8_settings", "")).get("converted", [])),
            "median layer SQNR, last step (dB)": f"{median:.1f}" if np.isfinite(median) else "n/a",
            "worst SQNR, last step (dB)": worst, "worst SQNR, first step (dB)": sqnr(cells, "first step")[1],
            "val loss": f"{cell.final_val_loss:.4f}", "val acc.": f"{cell.final_val_accuracy:.2%}",
            f"loss − {contract.PARTNER} (this seed)": versus[0], "loss − fp32 (this seed)": versus[2],
            f"acc. − {contract.PARTNER}, this seed [interval]": versus[1],
            "acc. − fp32, this seed [interval]": versus[3]})
    for cell in fp8_runs.drop_duplicates(["framework", "precision"]).to_dict("records"):  # recipe as read, declared
        label, live = framework_label(cell["framework"]), phrases.evidence(cell.get("fp8_settings", ""))
        declared = contract.recipe(cell["framework"], cell["precision"])
        apis.append(f"{label} {cell['precision']}: {api_text(cell)}")
        for key in ("scaling", "granularity", "amax_history", "formats", "power_of_2_scales", "scale_convention"):
            want = list(declared.formats) if key == "formats" else getattr(declared, key)
            recipes.append({"framework": label, "precision": cell["precision"], "setting": key,
                            "read back": str(live.get(key, "not recorded")), "declared": str(want),
                            "match": "yes" if live.get(key) == want else "NO",
                            "why it matters": contract.DIFFERENCES.get(key, "")})
    return {"table": pd.DataFrame(rows), "recipes": pd.DataFrame(recipes), "layers": layers, "trace": trace,
            "sentences": _sentences(runs, fp8_runs, trace, layers, device), "apis": apis}


def html(sec: dict | None, figure_path: str | None = None) -> str:
    if sec is None:
        return ""
    return "\n".join(['<h2 id="fp8">fp8 training</h2>',
             "<p>Each framework's own fp8 recipe on a float32 base, as its cells recorded it: "
             f"{escape('; '.join(sec['apis']))}. SQNR: signal-to-quantization-"
             "noise ratio of each converted layer's input, kernel and output gradient as its recipe quantizes them, "
             "against the float32 tensors, at the first and the last training step. A layer's SQNR is its worst of the "
             "three tensors; the median is over layers, the worst names the layer and tensor. Each row's accuracy "
             "differences pair that seed's cells image by image (McNemar's exact test; the bracket is Newcombe's "
             "95% interval for a paired difference).</p>",
             "<ul>" + "".join(f"<li>{escape(s)}</li>" for s in sec["sentences"]) + "</ul>",
             sec["table"].to_html(index=False, escape=True, border=0) if not sec["table"].empty else
             "<p>No fp8 cell finished.</p>",
             "<h3>Recipes, read back from the live objects</h3>",
             sec["recipes"].to_html(index=False, escape=True, border=0) if not sec["recipes"].empty else "",
             *([f'<figure><img src="{figure_path}" alt="fp8 input scale per step and layer, each framework">'
               "<figcaption>Input scale (fmax / amax) of each converted layer per training step, one line "
               "per layer and seed, of the per-tensor recipes (a per-row recipe's scales, one per row, are not "
               "drawn): torchao's follows each step's amax; Keras' is the largest amax of up to 1,024 earlier "
               "steps.</figcaption></figure>"] if figure_path else [])])


def markdown(sec: dict | None, table_markdown) -> list[str]:
    return ["", "### fp8 training", "", *[f"- {s}" for s in sec["sentences"]], "",
            *([table_markdown(sec["table"])] if not sec["table"].empty else [])] if sec is not None else []


def figure(sec: dict | None, out: Path) -> str | None:
    """figures/fp8_scales.png: each converted layer's input scale per step, one panel per fp8 cell."""
    if sec is None or sec["trace"].empty:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    trace = sec["trace"][sec["trace"]["role"] == "input"]
    cells = list(trace.groupby(["framework", "precision"]))
    # one colour and dash per layer, the same in every panel, so one legend names them all
    names = sorted(trace["layer"].unique())
    colours = plt.get_cmap("tab20")(np.linspace(0, 1, max(len(names), 1)))
    style = {name: (colours[i], ("-", "--", ":")[i % 3]) for i, name in enumerate(names)}
    fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells), 3.5), squeeze=False)
    for ax, ((fw, prec), group) in zip(axes[0], cells):
        for (layer, _), g in group.groupby(["layer", "seed"]):  # one line per seed: never joined across seeds
            ax.plot(g["step"], g["scale"], lw=0.8, color=style[layer][0], ls=style[layer][1], label=layer)
        ax.set(yscale="log", xlabel="training step (from 0)", ylabel="input scale (fmax / amax)",
               title=f"{framework_label(fw)} {prec}")
    handles = [plt.Line2D([], [], color=c, ls=ls, lw=1.2, label=n) for n, (c, ls) in style.items()]
    fig.legend(handles=handles, fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5), title="layer")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "fp8_scales.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "figures/fp8_scales.png"
