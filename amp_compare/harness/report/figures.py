"""seaborn figures of one compare run, pure functions of the record tables: one colour per framework, one line
style / marker per precision, PNG and SVG, each with a title, axis units, a caption and alt text."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from amp_compare.contract import precision as precisions  # noqa: E402
from amp_compare.contract.config import FRAMEWORK_LABELS, PRECISIONS, display_order, framework_label  # noqa: E402
from amp_compare.contract.fp8 import FP8_MODES  # noqa: E402
from amp_compare.harness.report import fp8 as fp8_report  # noqa: E402
from amp_compare.harness.report import numerics as nr  # noqa: E402
from amp_compare.harness.report import phrases, scaling, stats, tables  # noqa: E402
from amp_compare.kit.fp16 import FP16_EXP_LIMIT, FP16_MAX  # noqa: E402


def laid_out(fig):
    """The figure laid out as it will be drawn, without rasterizing it: the renderer to measure its artists with."""
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


# seaborn sizes a legend outside a grid by drawing the figure twice; all it reads is the layout (same PNGs)
sns.axisgrid._draw_figure = sns.categorical._draw_figure = laid_out

FRAMEWORK_COLORS = dict(zip(FRAMEWORK_LABELS.values(), ("#d1495b", "#00798c", "#edae49", "#66a182")))
_STYLES = {"fp32": ("", "o"), "fp16": ((5, 2), "s"), "bf16": ((1, 1.5), "^"), "fp16-noscale": ((3, 1, 1, 1), "v"),
           "fp16-static": ((8, 2, 2, 2), "D"), "fp8": ((2, 2), "X"), "fp8-rowwise": ((6, 1.5, 1, 1.5), "P")}
LINES = {"hue": "Framework", "style": "Precision", "palette": FRAMEWORK_COLORS,  # every line chart's seaborn keywords
         "dashes": {p: d for p, (d, _) in _STYLES.items()}, "markers": {p: m for p, (_, m) in _STYLES.items()}}


class Figure(namedtuple("Figure", "key section title caption alt")):  # key: its file stem under figures/
    def saved(self, fig, out_dir: Path) -> Figure:  # `fig` written to out_dir as <key>.png and .svg
        _save(fig, out_dir, self.key)
        return self


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    labels = [FRAMEWORK_LABELS[f] for f in FRAMEWORK_LABELS if f in set(df["framework"])]
    df["Framework"] = pd.Categorical(df["framework"].map(framework_label), categories=labels)
    df["Precision"] = pd.Categorical(df["precision"], categories=[p for p in PRECISIONS if p in set(df["precision"])])
    df["machine"] = df.get("machine", "")
    if varied := [c for c in ("model", "dataset") if c in df and df[c].nunique() > 1]:
        df["machine"] = df[["machine", *varied]].astype(str).agg(lambda r: " · ".join(v for v in r if v), axis=1)
    return df


def _facet(df: pd.DataFrame) -> dict:
    """A column per machine of a combined report, or per model x dataset (_labelled's "machine"), where several."""
    return {"col": "machine"} if df["machine"].nunique() > 1 else {}


def _per_panel(grid, frame: pd.DataFrame):
    """(axes, the rows of `frame` it shows) per panel of a grid with a column per machine (_facet) or one panel."""
    for machine, ax in zip(grid.col_names or [None], grid.axes.flat):
        yield ax, frame if machine is None else frame[frame["machine"] == machine]


def _save(fig, out_dir: Path, key: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for path in (out_dir / f"{key}.png", out_dir / f"{key}.svg"):
            fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as exc:  # a full disk: no half-written figure, and the error names it
        path.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    finally:
        plt.close(fig)


def _finish(grid, title: str, xlabel: str, ylabel: str) -> None:
    grid.set_axis_labels(xlabel, ylabel)
    if grid._col_var:  # noqa: SLF001 — seaborn keeps the facet variables here
        grid.set_titles("{row_name} · {col_name}" if grid._row_var else "{col_name}")  # noqa: SLF001
        grid.figure.suptitle(title, y=1.03)
    else:
        grid.ax.set_title(title)


def _bar(runs: pd.DataFrame, table: pd.DataFrame, y: str, ylabel: str, title: str, annotate: str):
    """Median bars over seeds with interquartile error bars, each labelled by table[annotate] above its error bar."""
    df = _labelled(runs)
    grid = sns.catplot(data=df, kind="bar", x="Precision", y=y, hue="Framework", palette=FRAMEWORK_COLORS,
                       estimator=np.median, errorbar=("pi", 50), capsize=0.1, height=4, aspect=1.6, **_facet(df))
    for ax, part in _per_panel(grid, _labelled(table)):
        labels = dict(zip(zip(part["Framework"], part["precision"]), part[annotate]))
        xys = [np.asarray(line.get_xydata(), dtype=float) for line in ax.get_lines()]  # an error bar with its caps
        errs = [(xy[d, 0].min(), xy[d, 0].max(), xy[d, 1].max()) for xy in xys  # is one line, NaN between the parts
                if (d := np.isfinite(xy).all(axis=1)).any()]
        for container, framework in zip(ax.containers, df["Framework"].cat.categories):  # a bar per precision
            for bar, prec in zip(container, df["Precision"].cat.categories):
                if not (label := labels.get((framework, prec), "")):
                    continue
                left, right = bar.get_x() - 1e-9, bar.get_x() + bar.get_width() + 1e-9
                top = max([bar.get_height(), *(y for lo, hi, y in errs if lo >= left and hi <= right)])
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, top), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=8)
            ax.margins(y=0.12)  # room above the tallest label
    _finish(grid, title, "Precision mode", ylabel)
    untangle_x_labels(grid.figure)  # many precision modes (the loss-scaling lab) in a narrow panel
    return grid.figure


def _stagger_markers(grid) -> None:
    """Each line's markers at its own offset (fp32 at steps 0, k, 2k…; fp16 at 1, k+1…): coinciding lines show."""
    for ax in grid.axes.flat:
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
        for i, line in enumerate(lines):
            n = len(line.get_xdata())
            step = max(len(lines), n // 8, 1)
            line.set_markevery((i % step, step) if n > len(lines) else None)


def _drawn_tick_labels(a, renderer) -> list[tuple[float, bool, object]]:
    """(tick position, major?, drawn box) of every labelled tick of an axis (ax.xaxis) inside its view."""
    low, high = sorted(a.get_view_interval())
    return [(t.get_loc(), major, t.label1.get_window_extent(renderer))
            for major, ticks in ((True, a.get_major_ticks()), (False, a.get_minor_ticks())) for t in ticks
            if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high]


def tick_label_overlaps(fig, axis: str = "x") -> int:
    """How many pairs of the drawn tick labels (major and minor) on one axis of each axes overlap, in all."""
    renderer = laid_out(fig)
    boxes = [[box for _, _, box in _drawn_tick_labels(getattr(ax, f"{axis}axis"), renderer)] for ax in fig.axes]
    return sum(a.overlaps(b) for drawn in boxes for i, a in enumerate(drawn) for b in drawn[i + 1:])


def plain_log_labels(fig, axis: str) -> None:
    """A log axis in plain numbers (0.3, not 3×10^-1); a minor label kept only where it clears the others."""
    formatter = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    logs = [a for a in (getattr(ax, f"{axis}axis") for ax in fig.axes) if a.get_scale() == "log"]
    for a in logs:
        a.set_major_formatter(formatter)
        a.set_minor_formatter(formatter)
    renderer = laid_out(fig) if logs else None
    for a in logs:
        if not any(t.label1.get_visible() for t in a.get_major_ticks()):
            continue  # a shared axis' inner panel: its formatter is its neighbour's, which must not be emptied here
        drawn = _drawn_tick_labels(a, renderer)
        kept_boxes = [box.padded(2) for _, major, box in drawn if major]
        keep = []
        rank = {2: 0, 5: 0, 3: 1}  # the minor ticks kept first when not all fit: 2 and 5, then 3, then the rest
        for loc, _, box in sorted((d for d in drawn if not d[1]), key=lambda d: (
                rank.get(int(round(d[0] / 10 ** np.floor(np.log10(d[0])))), 2), d[0])):
            if not any(box.padded(2).overlaps(k) for k in kept_boxes):
                keep.append(loc)
                kept_boxes.append(box.padded(2))
        a.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _, kept=np.array(keep): f"{v:g}" if kept.size and np.isclose(kept, v, rtol=1e-6).any() else ""))
        if sum(major for _, major, _ in drawn) + len(keep) < 2:  # inside one decade and no minor tick: even steps
            a.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
            a.set_minor_locator(matplotlib.ticker.NullLocator())


def curves_coincide(frame: pd.DataFrame, x: str, y: str) -> float | None:
    """Largest relative gap of a precision's median curve from its framework's fp32 one (None without)."""
    keys = [k for k in ("machine", "model", "dataset", "framework") if k in frame]
    curves = frame.groupby([*keys, "precision", x], observed=True)[y].median().unstack("precision")
    if precisions.REFERENCE not in curves:
        return None
    base = curves[precisions.REFERENCE]
    gap = curves.drop(columns=precisions.REFERENCE).sub(base, axis=0).abs().div(base.abs().clip(lower=1e-12), axis=0)
    return None if np.isnan(gap := gap.max().max()) else float(gap)


def loss_scale_grid(scaled: pd.DataFrame):
    """The loss scale per step of each loss-scaled cell, an X on its skipped steps, y in powers of two."""
    df = _labelled(scaled)
    df["log2_scale"] = np.log2(df["loss_scale"])
    grid = sns.relplot(data=df, kind="line", x="step", y="log2_scale", **LINES, units="cell_id", estimator=None,
                       markersize=6, drawstyle="steps-post", height=4, aspect=1.8, **_facet(df))
    _stagger_markers(grid)
    for ax, part in _per_panel(grid, df[df["skipped"]]):
        if not part.empty:
            sns.scatterplot(data=part, x="step", y="log2_scale", hue="Framework", palette=FRAMEWORK_COLORS,
                            marker="X", s=60, legend=False, ax=ax, zorder=4)  # above the lines' own markers
    finite = df["log2_scale"][np.isfinite(df["log2_scale"])]
    low, high = (np.floor(finite.min()) - 1, np.ceil(finite.max()) + 1) if not finite.empty else (-1.0, 2.0)
    for ax in grid.axes.flat:
        ax.set_ylim(low - 0.2, high + 0.2)
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True, nbins=8, min_n_ticks=3))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"$2^{{{int(round(v))}}}$"))
    present = [p for p in precisions.scaled_names() if p in set(scaled["precision"])]
    kinds = "; ".join(f"{p}: {precisions.SCALING_WORDS[precisions.of(p).loss_scaling]}" for p in present)
    _finish(grid, f"Loss scale per step ({kinds})", "Optimizer step (counting from 0)", "Loss scale")
    return grid


BUSY_SLOWDOWN = 1.4  # a cell's step time over its speed trial's median step beyond which the machine was busy


def busy_cells(runs: pd.DataFrame, trials: pd.DataFrame | None) -> pd.Series:
    """Per finished cell that ran while the machine was busy: its time per step over its speed trial's."""
    ok, trials = tables.ok_runs(runs), pd.DataFrame() if trials is None else trials
    keys = [*(["machine"] if "machine" in trials and "machine" in ok else []), "framework", "model", "dataset",
            "batch_size", "step_loop", "precision", "threads"]
    if (trials.empty or ok.empty or not {"throughput_img_s", "cfg_threads"} <= set(ok)
            or not all(k in trials for k in [*keys, "wall_s", "steps"])):  # older records: no judge
        return pd.Series(dtype=float)
    blocks = trials[~trials["contended"].astype(bool)] if "contended" in trials else trials
    step = (blocks["wall_s"] / blocks["steps"]).groupby([blocks[k] for k in keys]).median().rename("trial_step")
    cells = tables.with_loop_columns(ok.assign(threads=ok["cfg_threads"])).join(step, on=keys)  # its thread count
    slowdown = ((cells["batch_size"] / cells["throughput_img_s"]) / cells["trial_step"]).set_axis(cells["cell_id"])
    return slowdown[slowdown > BUSY_SLOWDOWN].astype(float).sort_index()


def make_speed_verdict_figure(verdicts: pd.DataFrame, out_dir: Path) -> Figure | None:
    """Each speed verdict's ratio to fp32 and its interval, per model x dataset, against 1×."""
    speed = verdicts[(verdicts["metric"] == "speed") & np.isfinite(verdicts["estimate"].astype(float))]
    if speed.empty:
        return None
    groups = list(speed.groupby(["model", "dataset"], sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 0.9 + 0.5 * max(len(g) for _, g in groups)),
                             squeeze=False, layout="constrained")
    for ax, ((model, dataset), part) in zip(axes[0], groups):
        for y, v in enumerate(part.iloc[::-1].itertuples()):
            color = {"faster": "#2a9d8f", "slower": "#d1495b"}.get(v.status, "#8d8d8d")
            if np.isfinite(v.low):
                ax.plot([v.low, v.high], [y, y], color=color, lw=2.5)
            ax.plot(v.estimate, y, "o", color=color)
            ax.annotate(f"{phrases.ratio(v.estimate)} {phrases.STATUS[v.status]}", (v.estimate, y),
                        xytext=(0, 7), textcoords="offset points", ha="center", fontsize=8,
                        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"})  # legible over the 1× line
        ax.axvline(1, color="black", ls="--", lw=1)
        ax.set_xscale("log")
        ends = part[["estimate", "low", "high"]].astype(float).to_numpy()
        ax.set_xlim(min(np.nanmin(ends), 1) / 2, max(np.nanmax(ends), 1) * 2)  # the labels and 1× inside
        labels = [f"{framework_label(f)} {p}" for f, p in zip(part["framework"], part["precision"])][::-1]
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(-0.6, len(labels) - 0.2)
        ax.set(title=f"{model} on {dataset}", xlabel="× fp32's speed (log scale; right of 1: faster)")
    plain_log_labels(fig, "x")
    kinds = sorted({phrases.interval_words(v) for v in speed.itertuples()} - {""})
    return Figure("speed_verdicts", "speed", "Speed verdicts",
                  "Each point is a mixed precision's speed verdict from the speed trials: fp32's step time over its "
                  "own, as a multiple of fp32's speed; the line through it is the interval the verdict rests on"
                  + (f" ({', '.join(kinds)})" if kinds else "") + ", coloured by the verdict (teal faster, red "
                  "slower, grey neither). Right of the dashed 1× line: faster than fp32.",
                  "Dot plot of each framework and mixed precision's speed relative to fp32, with intervals, on a "
                  "log axis with a line at 1x.").saved(fig, out_dir)


def _memory_labels(table: pd.DataFrame) -> pd.DataFrame:
    """The memory bars' labels of full_table's rows: change against fp32, undecided or cut; ⚠ on a memory note."""
    known = table["memory_resolved"].astype(float)  # NaN: not measured
    out = table.assign(memory_unresolved=known.notna() & (known != 1), memory_cut=table["budget_cut"].fillna(0) > 0)
    out["memory_label"] = ["cut" if r.memory_cut else "undecided" if r.memory_unresolved
                           else "" if not np.isfinite(r.memory_change_vs_fp32) else f"{r.memory_change_vs_fp32:+.0%}"
                           + (" ⚠" if pd.notna(r.memory_note) and str(r.memory_note) else "") for r in out.itertuples()]
    return out


def _memory_figures(ok: pd.DataFrame, table: pd.DataFrame, out_dir: Path, spread: str) -> list[Figure]:
    """Peak memory bars (an emulated fp8 left out: its memory is the emulation's), _memory_labels' labels."""
    kinds = ", ".join(sorted(set(ok["memory_kind"].dropna())))
    left_out = sorted(set(table.loc[table["emulated"], "precision"]))
    mem_table = _memory_labels(table[~table["emulated"]])
    _save(_bar(ok[~ok["precision"].isin(left_out)], mem_table, "peak_memory_mib", "Peak memory during training (MiB)",
               "Peak memory", "memory_label"), out_dir, "memory")
    ratios = (np.isfinite(mem_table["memory_change_vs_fp32"].astype(float)) & ~mem_table["memory_unresolved"]
              & ~mem_table["precision"].isin([precisions.REFERENCE]))  # a decided mixed precision: its change
    not_drawn = (f" Not drawn: {', '.join(left_out)}, emulated on this CPU ({fp8_report.EMULATED_MEMORY})."
                 if left_out else "")
    return [Figure("memory", "memory", "Peak memory by precision",
                   f"Memory measured as: {kinds}." + (
                       " A decided mixed precision's label is its change against the same framework's fp32 (the "
                       "geometric mean over seeds of each seed's ratio), with ⚠ where its 95% interval is wider than "
                       f"{stats.NOISY_WIDTH}× end to end, includes no change, or is missing." if ratios.any() else
                       " No mixed precision's difference was decided, so no mixed precision's bar carries a "
                       "percentage.") + " fp32's bars read +0%: the reference the others are measured against."
                   + " On a CPU this is the process's resident memory, which includes framework workspaces, so "
                   "half-precision activations need not make it smaller."
                   + (" \"undecided\": some seed's difference from fp32 is within what fp32's or its own seeds"
                      " differed by, or one seed ran (the per-model tables above give the difference in MiB)."
                      if mem_table["memory_unresolved"].any() else "")
                   + (" \"cut\": the speed budget stopped a cell of it after a few dozen steps, and a peak over "
                      "fewer steps is not compared (resident memory grows over a run)." if mem_table["memory_cut"].any()
                      else "") + not_drawn + spread,
                   "Bar chart of peak training memory in MiB for each framework and precision mode.")]


def _loss_curve_figures(steps: pd.DataFrame, out_dir: Path, left: str = "") -> list[Figure]:
    """Loss per step, a panel per framework (and machine), a line per precision; `left`: the cells not drawn."""
    if steps.empty:
        return []
    df = _labelled(steps)
    grid = sns.relplot(data=df, kind="line", x="step", y="loss", **LINES, errorbar=None, markersize=6, linewidth=1.2,
                       height=3.6, aspect=1.3, estimator="median",
                       **({"col": "machine", "row": "Framework"} if _facet(df) else {"col": "Framework"}))
    _stagger_markers(grid)
    # a line exactly under later ones (PyTorch and Keras aligned) is redrawn wider beneath them, as their border
    for ax in grid.axes.flat:
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 0]
        xys = [np.column_stack([ln.get_xdata(), ln.get_ydata()]).astype(float) for ln in lines]
        for i, low in enumerate(lines):  # within float32's rounding: one pixel cannot tell them apart
            over = sum(len(up) == len(xys[i]) and np.allclose(up, xys[i], rtol=1e-6, atol=1e-9, equal_nan=True)
                       for up in xys[i + 1:])
            if over:  # the more lines on top, the wider: each of a stack shows as its own border
                low.set_linewidth(low.get_linewidth() * (1 + 1.8 * over))
                low.set_markersize(low.get_markersize() * (1 + 0.6 * over))
                low.set_zorder(low.get_zorder() - over)
    grid.set(yscale="log")
    _finish(grid, "Training loss per step", "Optimizer step (counting from 0)",
            "Batch cross-entropy loss (nats, log scale)")
    plain_log_labels(grid.figure, "y")  # last: it measures the labels where the finished figure draws them
    gap = curves_coincide(steps, "step", "loss")
    overlap = (f" Here the precisions' curves coincide: within each framework no mixed-precision loss is more "
               f"than {gap:.1%} from fp32's at any step, so the lines draw on top of each other; the staggered "
               "markers show each one." if gap is not None and gap < 0.02 else "")
    panels = " and ".join(["framework", *(k for k in ("machine", "model", "dataset")  # those that vary: _labelled
                                          if k in steps and steps[k].nunique() > 1)])
    return [Figure("loss_curves", "accuracy", "Training loss per step",
                   f"One panel per {panels}; each line is one precision, the median over seeds of the loss at each "
                   "step, all from the same initial weights, with its own marker; no band is drawn." + overlap + left,
                   "Line charts of per-step training loss, one panel per framework, one line per "
                   "precision.").saved(grid.figure, out_dir)]


def _loss_scale_figures(steps: pd.DataFrame, out_dir: Path) -> list[Figure]:
    """The Loss scaling section: the scale per step of the loss-scaled cells, skipped steps marked."""
    if steps.empty or (scaled := steps[steps["precision"].isin(precisions.scaled_names())]).empty:
        return []
    per = [k for k in ("model", "dataset") if k in scaled and scaled[k].nunique() > 1]
    counts = ", ".join(
        f"{' '.join(map(str, key[:len(per)]))}{' ' if per else ''}{framework_label(key[-1])} {key[-2]}: "
        f"{int(g['skipped'].sum())} of {len(g)} steps skipped in {(n := g['cell_id'].nunique())} run{'s' * (n != 1)}"
        for key, g in scaled.sort_values(["framework", "precision"], key=display_order).groupby(
            [*per, "precision", "framework"], sort=False))
    return [Figure("loss_scale", "loss_scaling", "Loss-scale trajectory",
                   "The scale each step used, one line per seed (each cell's own trajectory from its step "
                   f"records, not a median over seeds); an X marks that cell's own skipped step, at the scale it "
                   f"skipped at ({counts}).",
                   "Step chart of the loss scale per step, in powers of two, one line per seed of each "
                   "loss-scaled run of each framework.").saved(loss_scale_grid(scaled).figure, out_dir)]


def make_figures(runs: pd.DataFrame, steps: pd.DataFrame, out_dir: Path, device: str = "cpu",
                 notes: pd.DataFrame | None = None) -> list[Figure]:
    """Every figure the data allows, drawn into out_dir, in report order; notes: full_table(runs), else computed."""
    sns.set_theme(style="whitegrid", context="notebook")
    table = tables.full_table(runs, environment={"device": device}) if notes is None else notes
    if table.empty:
        return []
    finished = tables.ok_runs(runs)
    ok, shown, sweep = tables.with_loop_columns(finished.copy()), table, ""
    if table["batch_size"].nunique() > 1 or table["step_loop"].nunique() > 1:  # a sweep: one loop, largest batch
        step = "plain" if (table["step_loop"] == "plain").any() else str(table["step_loop"].iloc[0])
        batch = table.loc[table["step_loop"] == step, "batch_size"].max()
        ok = ok[(ok["step_loop"] == step) & (ok["batch_size"] == batch)]
        shown = table[(table["step_loop"] == step) & (table["batch_size"] == batch)]
        sweep = (f" Shown: the {step} loop at batch {batch:.0f}; every batch size and loop is in the "
                 "speed-up-vs-batch figure and the summary table.")
    ok["peak_memory_mib"] = ok["peak_memory_bytes"] / tables.MIB
    steps = steps[steps["cell_id"].isin(set(ok["cell_id"]))] if not steps.empty else steps
    n = int(shown["runs"].max())  # seeds per bar
    spread = (f" Bars are medians over {tables.seed_counts_text(ok)}; error bars span the interquartile range"
              + (f" (interpolated between the {n} seeds' values)" if n <= 3 else "") + "." if n > 1 else
              " One run (one seed) per bar, so no error bar: --seeds 0,1,2 (or --repeats 3) shows the spread.")
    left = runs[~runs["cell_id"].isin(set(finished["cell_id"]))].sort_values("cell_id")  # named with how each ended
    said, one = ", ".join(f"{r.cell_id} ({getattr(r, 'status', 'failed')})" for r in left.itertuples()), len(left) == 1
    left_out = "" if left.empty else (
        f" Left out: {said}: {'it' if one else 'they'} did not finish"
        + (" (a diverged cell's losses went non-finite)" if (left.get("status") == "diverged").any() else "")
        + f", so {'its curve is' if one else 'their curves are'} not drawn.")
    return [*_memory_figures(ok, shown, out_dir, spread + sweep),
            *_loss_curve_figures(steps, out_dir, left_out + sweep),
            *_loss_scale_figures(steps, out_dir), *make_batch_figures(table, out_dir)]


def make_batch_figures(table: pd.DataFrame, out_dir: Path) -> list[Figure]:
    """--batch-sizes: speed-up against fp32 per batch size and mixed precision, a column per loop."""
    mixed = precisions.is_mixed(table["precision"]) & np.isfinite(table["speedup_vs_fp32"].astype(float))
    if table["batch_size"].nunique() < 2 or (data := table[mixed]).empty:
        return []
    title = "Mixed-precision speed-up vs batch size"
    facet = {"col": "step_loop"} if table["step_loop"].nunique() > 1 else {}
    grid = sns.relplot(data=_labelled(data), kind="line", x="batch_size", y="speedup_vs_fp32", **LINES,
                       errorbar=None, height=4, aspect=1.5, **facet)
    grid.set(xscale="log")
    sizes = sorted(table["batch_size"].unique())
    for ax in grid.axes.flat:
        ax.set_xticks(sizes, [f"{b:.0f}" for b in sizes])
        ax.minorticks_off()
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    grid.set_titles("{col_name} loop")  # nothing without a column per loop
    grid.set_axis_labels("Batch size (images per step, log scale)", "Speed-up against fp32 at the same batch (×)")
    grid.figure.suptitle(title, y=1.03)
    return [Figure("speedup_vs_batch", "speed", title,
                   "Each line is one framework in one mixed precision: its throughput (wall time) over the same "
                   "framework's fp32 at the same batch size and loop. A speed-up that grows with the batch means the "
                   "smaller batches were bound by per-step host cost (Python, kernel launches, syncs), not by "
                   "arithmetic: a property of the loop and the batch size, not of AMP.",
                   "Line chart of speed-up against batch size for each framework and "
                   "precision.").saved(grid.figure, out_dir)]


def untangle_x_labels(fig) -> None:
    """Overlapping x tick labels turned upright, then every k-th shown, the smallest k that clears them."""
    for every in range(1, 50):
        if not tick_label_overlaps(fig):
            return
        for ax in fig.axes:
            ax.tick_params(axis="x", rotation=90)
            for i, label in enumerate(ax.get_xticklabels() if every > 1 else []):
                label.set_visible(i % every == 0)


def make_underflow_figure(underflow: pd.DataFrame, out_dir: Path) -> Figure | None:
    """Share of each layer's gradient float16 flushes to 0, unscaled vs scaled, zero gradients aside."""
    if underflow.empty or (last := underflow[underflow["when"] == "last step"]).empty:
        return None
    zero = scaling.zero_gradient(last)
    residue, shown = last[zero], last[~zero]
    if (df := _labelled(shown)).empty:
        return None
    if "model" in df and df["model"].nunique() > 1:  # two models' `fc` layers are two bars
        df = df.assign(layer=df["model"].astype(str) + ": " + df["layer"].astype(str))
    df = df.groupby(["Framework", "Precision", "layer"], observed=True).apply(
        lambda g: pd.Series({"no scaling": np.average(g["flush_fraction_unscaled"], weights=g["nonzero"] + 1e-12),
                             "scale in use": np.average(g["flush_fraction_scaled"], weights=g["nonzero"] + 1e-12)}),
        include_groups=False).reset_index()
    long = df.melt(id_vars=["Framework", "Precision", "layer"], var_name="Scaling", value_name="flush")
    long["flush_pct"] = long["flush"] * 100
    aspect = max(2.0, 0.25 * long["layer"].nunique() / 2.6)  # room for each layer's name, upright
    grid = sns.catplot(data=long, kind="bar", x="layer", y="flush_pct", hue="Framework", col="Scaling",
                       row="Precision", palette=FRAMEWORK_COLORS, height=2.6, aspect=aspect, sharey=True, errorbar=None)
    grid.set_axis_labels("Layer (canonical name)", "Flushed to 0 (%)")
    grid.set(ylim=(0, max(0.01, float(long["flush_pct"].max()) * 1.1)))
    grid.set_titles("{row_name}, {col_name}")
    grid.figure.suptitle("Gradient underflow in float16 at the last step", y=1.02)
    untangle_x_labels(grid.figure)
    models = shown["model"].astype(str) if "model" in shown else pd.Series("", index=shown.index)
    params = ", ".join(sorted(set(shown["param"].astype(str)), key=lambda p: (p != "weight", p)))
    seeds = _per_model_text(shown.groupby(models)["seed"].nunique().map(lambda n: [n]), "seeds per bar:")
    steps = (_per_model_text(shown.groupby(models)["at_step"].unique(), "step", "steps") + ", counting from 0"
             if "at_step" in shown and shown["at_step"].notna().all() else "the last step")
    text = ("Share of each layer's non-zero float32 gradient elements that round to 0 in float16 (|g| at or below "
            f"2^-25, half the smallest subnormal 2^-24) at the last step's probe ({steps}), without loss scaling "
            "(left) and multiplied by the loss scale the run used (right). Each bar pools the layer's parameters "
            f"({params}) of every seed that ran ({seeds}): their flushed elements over their non-zero elements, "
            "together. The table beside it gives the first seed only, every layer together. Loss scaling is "
            "there to make each right bar lower than its left one.")
    if not residue.empty:
        names = sorted(set((residue["model"].astype(str) + ": " if models.nunique() > 1 else "")
                           + residue["layer"].astype(str) + "." + residue["param"].astype(str)))
        flushed = int((residue["flush_fraction_unscaled"] * residue["nonzero"]).round().sum())
        text += (f" Not drawn: {', '.join(names)}, of whose {int(residue['nonzero'].sum()):,} non-zero elements "
                 f"over {residue['cell_id'].nunique()} cells {flushed:,} would flush without scaling: an attention "
                 "key bias's exact gradient is zero (softmax ignores the constant shift it adds), so what the probe "
                 "finds there is rounding residue, not underflow.")
    return Figure("underflow", "numerics", "Gradient underflow per layer", text,
                  "Bar charts of the percentage of gradient elements per layer that float16 would flush to zero, "
                  "unscaled and scaled, per framework and precision.").saved(grid.figure, out_dir)


def _per_model_text(by_model: pd.Series, word: str, plural: str | None = None) -> str:
    """Per model values: "step 87" where every model has the same ones, else "step 87 (simple_cnn), 131 (vit)"."""
    said = {m: " and ".join(f"{v:g}" for v in sorted(values)) for m, values in by_model.items()}
    word = plural if plural and any(len(v) > 1 for v in by_model) else word
    same = len(set(said.values())) == 1
    return f"{word} " + (next(iter(said.values())) if same else ", ".join(f"{v} ({m})" for m, v in said.items()))


def make_gradient_histogram_figure(underflow: pd.DataFrame, out_dir: Path) -> Figure | None:
    """Per framework: last-step scaled gradient magnitudes per power of two vs float16."""
    hist = nr.gradient_histogram(underflow)
    if (hist := hist[hist["count"] > 0]).empty:  # an empty power of two would draw a flat line across the axis
        return None
    hist["scaled_log2"] = hist["log2"] + np.log2(hist["loss_scale"])
    per = [k for k in ("model",) if k in hist and hist[k].nunique() > 1]  # one panel per model and framework
    hist["share_pct"] = 100 * hist["count"] / hist.groupby([*per, "framework", "precision"])["count"].transform("sum")
    df = _labelled(hist)
    df["Panel"] = (df["model"].astype(str) + " · " if per else "") + df["Framework"].astype(str)
    grid = sns.relplot(data=df, kind="line", x="scaled_log2", y="share_pct", **LINES, col="Panel",
                       drawstyle="steps-mid", errorbar=None, height=3.6, aspect=1.5)
    low, high = float(df["scaled_log2"].min()) - 1, max(float(df["scaled_log2"].max()) + 1, 17.0)
    for ax in grid.axes.flat:
        ax.axvspan(min(low, -26), -25, color="#d1495b", alpha=0.12, linewidth=0)
        ax.axvspan(np.log2(FP16_MAX), high, color="#d1495b", alpha=0.12, linewidth=0)
        ax.axvline(-14, color="#888", linestyle=":", linewidth=1)
        ax.set_xlim(min(low, -26), high)
    _finish(grid, "Gradient magnitudes against float16's range, last step",
            "log2 |gradient × loss scale in use|\n(float16: 0 below −25, inf above 16)", "Non-zero elements (%)")
    return Figure("gradient_histogram", "numerics", "Gradient magnitudes against float16's range",
                  "Each framework's non-zero float32 reference gradient elements at the last step (first seed, all "
                  "layers), by power of two of |gradient| times the loss scale the cell used. Shaded: what float16 "
                  "cannot hold — below 2^-25 it rounds to zero (the smallest subnormal is 2^-24), above "
                  f"{FP16_MAX:,.0f} (2^16) it overflows to inf; the dotted line is 2^-14, below which float16 keeps "
                  "fewer significant bits. Loss scaling moves the whole histogram right: it rescues the left tail as "
                  "long as the right one stays out of the shade. The Numerics section says how close each cell came "
                  "to float16's largest value.",
                  "Step chart per framework of the percentage of gradient elements per power of two of the scaled "
                  "gradient magnitude, with float16's underflow and overflow regions "
                  "shaded.").saved(grid.figure, out_dir)


def make_time_to_accuracy_figure(runs: pd.DataFrame, epochs: pd.DataFrame, acc: pd.DataFrame,
                                 out_dir: Path, trials: pd.DataFrame | None = None) -> Figure | None:
    """Validation accuracy against cumulative training time per cell, each panel's target dotted."""
    ok = tables.ok_runs(runs)
    cut_group = stats.cut_groups(ok, [c for c in ("machine", "framework", "model", "dataset", "precision") if c in ok])
    cut = [(f"{framework_label(f)} {m} {p}", sorted(part.loc[stats.budgeted(part), "seed"]), len(part))  # stopped
           for (f, m, p), part in ok[cut_group].groupby(["framework", "model", "precision"], sort=False)]
    named = [name + ("" if len(s) == n else f" (seed{'s' * (len(s) > 1)} {', '.join(map(str, s))} of {n} stopped)")
             for name, s, n in cut]  # the seeds named where not all
    left = ("" if not cut else f" Not drawn: {', '.join(named)} (the speed budget stopped "
            + ("them: their time to accuracy is not compared)." if all(len(s) == n for _, s, n in cut) else
               "them, or the seeds named: a precision with a stopped cell has no time to accuracy compared)."))
    ok = ok[~cut_group]
    if ok.empty or epochs.empty or acc.empty or (e := epochs[epochs["cell_id"].isin(set(ok["cell_id"]))]).empty:
        return None
    keys = (["machine"] if "machine" in ok else []) + ["model", "dataset"]
    e = e.sort_values(["cell_id", "epoch"])
    e = e.assign(train_wall_s=e.groupby("cell_id")["train_time_s"].cumsum(), val_accuracy_pct=e["val_accuracy"] * 100,
                 panel=e[keys].astype(str).agg(" · ".join, axis=1))
    df = _labelled(e)
    panels = list(dict.fromkeys(df["panel"]))
    grid = sns.relplot(data=df, kind="line", x="train_wall_s", y="val_accuracy_pct", **LINES, units="cell_id",
                       estimator=None, linewidth=1, height=4.2, aspect=1.7,
                       **({"col": "panel", "col_order": panels} if len(panels) > 1 else {}))
    targets = acc.drop_duplicates(keys).assign(panel=lambda t: t[keys].astype(str).agg(" · ".join, axis=1))
    _finish(grid, "Validation accuracy against training time", "Training wall time (s, cumulative, validation "
            "excluded)", "Validation accuracy (%)")
    judged = targets[(targets["too_short"] == "") & np.isfinite(targets["target"].astype(float))]
    target = dict(zip(judged["panel"], judged["target"]))
    for panel, ax in zip(panels, grid.axes.flat):  # the target's line, and its value in the title, clear of the data
        if panel in target:
            ax.axhline(target[panel] * 100, color="#555", linestyle=":", linewidth=1.2)
        name = f"Validation accuracy against training time ({panel})" if len(panels) == 1 else panel
        ax.set_title(name + (f" — dotted: target {target[panel]:.1%}" if panel in target else ""))
    bases = [f"{r.panel}: {r.target:.1%}, {r.target_basis}" for r in judged.itertuples()]
    target_text = ((f"The dotted line is the target ({bases[0].split(': ', 1)[1]})" if len(bases) == 1 else
                    f"Each panel's dotted line is its own target ({'; '.join(bases)})")
                   + "; the first point above it is that cell's time to accuracy. A line that never crosses it did "
                   "not reach the target — a result, not an error." if bases else
                   "No target line: the run is too short to judge accuracy (see the note).")
    busy = busy_cells(ok, trials)
    busy_said = "" if busy.empty else (
        f" Ran while the machine was busy (wall time per step over {BUSY_SLOWDOWN:g}× the median step of the speed "
        f"trial's uncontended blocks of the same framework, precision and thread count): "
        f"{', '.join(f'{c} ({x:.1f}×)' for c, x in busy.items())}; their lines' times say more about the machine "
        "than about the precision.")
    return Figure("time_to_accuracy", "accuracy", "Time to accuracy",
                  f"Each line is one cell (one seed), a point per epoch: validation accuracy after that epoch against "
                  f"the training time spent so far. {target_text}{busy_said} Panels: " + "; ".join(panels) + "." + left,
                  "Line chart of validation accuracy in percent against cumulative training seconds per cell, "
                  "with a dotted horizontal target line.").saved(grid.figure, out_dir)


def _headroom_panel(ax, part: pd.DataFrame, colours: dict, naive_logits: bool) -> None:
    """One headroom panel: a line per block and framework, float16's max, and naive exp's overflow."""
    for (block, label), g in part.groupby(["block", "Framework"], observed=True):
        g = g.groupby("epoch", as_index=False)["max_abs"].max()  # the largest over seeds
        line, marker = ("-", "o") if str(label) == "PyTorch" else ("--", "s")
        ax.plot(g["epoch"] + 1, g["max_abs"], line, marker=marker, color=colours[block], markersize=4,
                linewidth=1.2, label=f"{block} · {label}")
    ax.set_yscale("log")
    exp = f"naive exp overflows float16: ln({FP16_MAX:,.0f}) ≈ {FP16_EXP_LIMIT:.1f}"  # far below the logit's limit
    for level, colour, style, text in [(FP16_MAX, "#d1495b", "--", f"float16 max {FP16_MAX:,.0f}"),
                                       (FP16_EXP_LIMIT, "#a0761e", ":", exp)][:1 + naive_logits]:
        ax.axhline(level, color=colour, linewidth=1, linestyle=style)
        ax.text(0.02, level, text, color=colour, fontsize=7, va="bottom", transform=ax.get_yaxis_transform())
    low = min(float(part["max_abs"].min()) / 3 if not part.empty else 0.1,
              FP16_EXP_LIMIT / 2 if naive_logits else np.inf)  # the exp limit's line inside every panel
    ax.set_ylim(max(low, 1e-3), FP16_MAX * 4)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def make_headroom_figure(headroom: pd.DataFrame, runs: pd.DataFrame, out_dir: Path) -> Figure | None:
    """The vit's largest attention logit and LayerNorm input per block and epoch against float16's max."""
    headroom = headroom[~headroom["precision"].isin(FP8_MODES)]  # float16's range says nothing of fp8
    blocks = nr.headroom_per_block(headroom, runs)
    if blocks.empty or (blocks := blocks[np.isfinite(blocks["max_abs"].to_numpy(dtype=float))
                                         & (blocks["max_abs"] > 0)]).empty:
        return None
    df = _labelled(blocks)
    precs = list(df["Precision"].cat.categories)
    quantities = [q for q in nr.QUANTITY_LABELS if q in set(df["quantity"])]
    names = sorted(set(df["block"]), key=lambda b: (b == "norm", b))
    colours = dict(zip(names, sns.color_palette("viridis", len(names))))
    fig, axes = plt.subplots(len(quantities), len(precs), figsize=(3.4 * len(precs), 2.9 * len(quantities)),
                             squeeze=False, sharex=True)
    naive = "attention" in blocks and (blocks["attention"] == "naive").any()
    for r, quantity in enumerate(quantities):
        for c, (prec, ax) in enumerate(zip(precs, axes[r])):
            _headroom_panel(ax, df[(df["quantity"] == quantity) & (df["Precision"] == prec)], colours,
                            naive and quantity == "attention_logit")
            ax.set_title(f"{prec} · {nr.QUANTITY_LABELS[quantity]}", fontsize=9)
            ax.set_xlabel("Epoch (counting from 1)" if r == len(quantities) - 1 else "")
            ax.set_ylabel("Largest |value| (log)" if c == 0 else "")
    # every block x framework that appears anywhere, once, in order of first appearance (alike in every panel)
    shown = {lab: h for ax in axes.flat for h, lab in zip(*ax.get_legend_handles_labels())}
    fig.legend(list(shown.values()), list(shown), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
               title="block · framework")
    fig.suptitle("ViT headroom per block over training", y=1.02)
    fig.tight_layout()
    cpu = ", ".join(sorted(set(runs.get("cpu_model", pd.Series(dtype=str)).dropna().astype(str)) - {""}))
    bad = headroom[headroom["quantity"].isin(nr.QUANTITY_LABELS) & ~np.isfinite(headroom["max_abs"].astype(float))]
    bad = "; ".join(f"{framework_label(fw)} {prec}: {', '.join(dict.fromkeys(g['layer']))} from epoch "
                    f"{int(g['epoch'].min()) + 1}" for (fw, prec), g in bad.sort_values(
                        ["framework", "precision"], key=display_order).groupby(["framework", "precision"], sort=False))
    return Figure("headroom", "numerics", "ViT headroom per block",
                  "The largest |attention logit| (what enters the softmax) and the largest |input| of the block's "
                  "LayerNorms in each epoch's training steps, per block, framework and precision (recorded inside "
                  f"the step, read once per epoch), against float16's largest finite value {FP16_MAX:,.0f} (dashed): "
                  "the distance to the line is the headroom before float16 overflows. A value that went non-finite "
                  f"is left out{f' ({bad})' if bad else ''}. Whether a tensor is float16 at all is the dtype "
                  "table's: one computed in float32 has float32's range"
                  + (f"; the product Q·Kᵀ before its 1/√d scaling reached {qk.max():,.1f} (data/headroom, "
                     "qk_product)" if len(qk := headroom.loc[headroom["quantity"] == "qk_product", "max_abs"]
                                          .astype(float).dropna()) else "") + "."
                  + (" The dotted line: the naive attention's exp overflows float16 once a logit passes "
                     f"ln({FP16_MAX:,.0f}) ≈ {FP16_EXP_LIMIT:.1f}." if naive else "")
                  + (f" Measured on {cpu}." if cpu else ""),
                  "Line charts, log scale, of the largest attention logit and LayerNorm input per epoch for each "
                  "transformer block, per precision and framework, with float16's maximum as a reference "
                  "line.").saved(fig, out_dir)
