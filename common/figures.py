"""seaborn figures of one compare run: pure functions of the record tables.

Every figure uses one colour per framework and one line style / marker per precision, saves
PNG and SVG, and comes with a title, axis units, a caption saying what to notice and alt text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from common.config import FRAMEWORK_LABELS, PRECISIONS  # noqa: E402
from common.summary import ok_runs, summary_table  # noqa: E402

FRAMEWORK_COLORS = {"PyTorch": "#d1495b", "TensorFlow/Keras": "#00798c"}
PRECISION_DASHES = {"fp32": "", "fp16": (5, 2), "bf16": (1, 1.5), "fp16-noscale": (3, 1, 1, 1),
                    "fp16-static": (8, 2, 2, 2)}
PRECISION_MARKERS = {"fp32": "o", "fp16": "s", "bf16": "^", "fp16-noscale": "v", "fp16-static": "D"}


@dataclass
class Figure:
    key: str  # file stem under figures/
    section: str  # report section it belongs to
    title: str
    caption: str  # what to notice
    alt: str


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    labels = [FRAMEWORK_LABELS[f] for f in FRAMEWORK_LABELS if f in set(df["framework"])]
    df["Framework"] = pd.Categorical(df["framework"].map(lambda f: FRAMEWORK_LABELS.get(f, f)), categories=labels)
    df["Precision"] = pd.Categorical(df["precision"], categories=[p for p in PRECISIONS if p in set(df["precision"])])
    return df


def _save(fig, out_dir: Path, key: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for ext in ("png", "svg"):
        fig.savefig(out_dir / f"{key}.{ext}", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _bar(table: pd.DataFrame, y: str, ylabel: str, title: str, annotate: str | None, fmt: str):
    df = _labelled(table)
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.barplot(data=df, x="Precision", y=y, hue="Framework", palette=FRAMEWORK_COLORS, ax=ax)
    if annotate:
        for container, (_, group) in zip(ax.containers, df.groupby("Framework", observed=True)):
            labels = [fmt.format(v) if np.isfinite(v) else "" for v in group.sort_values("Precision")[annotate]]
            ax.bar_label(container, labels=labels, fontsize=8, padding=2)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("Precision mode")
    ax.legend(title="Framework", fontsize=8)
    return fig


def make_figures(runs: pd.DataFrame, epochs: pd.DataFrame, steps: pd.DataFrame, out_dir: Path) -> list[Figure]:
    """Draw every figure the data allows into out_dir; return their descriptions in report order."""
    sns.set_theme(style="whitegrid", context="notebook")
    table = summary_table(runs)
    figures: list[Figure] = []
    if table.empty:
        return figures
    ok_ids = set(ok_runs(runs)["cell_id"])
    steps = steps[steps["cell_id"].isin(ok_ids)] if not steps.empty else steps
    epochs = epochs[epochs["cell_id"].isin(ok_ids)] if not epochs.empty else epochs

    _save(_bar(table, "throughput_img_s", "Training throughput (images/s, median step)",
               "Training throughput", "speedup_vs_fp32", "{:.2f}×"), out_dir, "throughput")
    figures.append(Figure("throughput", "speed", "Training throughput by precision",
                          "Bars are images per second from the median step time (warm-up excluded); the label "
                          "on each bar is the speed-up against the same framework's fp32. Above 1× mixed "
                          "precision helped; below 1× it cost time.",
                          "Bar chart of training images per second for each framework and precision mode."))

    if not steps.empty:
        timed = _labelled(steps[~steps["warmup"]])
        timed["step_time_ms"] = timed["step_time_s"] * 1000
        fig, ax = plt.subplots(figsize=(7, 4))
        sns.boxplot(data=timed, x="Precision", y="step_time_ms", hue="Framework", palette=FRAMEWORK_COLORS,
                    ax=ax, showfliers=True, fliersize=2)
        ax.set_yscale("log")
        ax.set_title("Step-time distribution (warm-up excluded)")
        ax.set_ylabel("Time per training step (ms, log scale)")
        ax.set_xlabel("Precision mode")
        _save(fig, out_dir, "step_times")
        figures.append(Figure("step_times", "speed", "Distribution of step times",
                              "Boxes span the 25th–75th percentile of per-step times, whiskers 1.5× that range. "
                              "A tall box or many outliers means the step time is noisy; compare medians, "
                              "not single steps.",
                              "Box plot of per-step training time in milliseconds for each framework and precision."))

    table_mem = table.copy()
    _save(_bar(table_mem, "peak_memory_mib", "Peak memory during training (MiB)", "Peak memory",
               "memory_change_vs_fp32", "{:+.0%}"), out_dir, "memory")
    kinds = ", ".join(sorted(set(ok_runs(runs)["memory_kind"].dropna())))
    figures.append(Figure("memory", "memory", "Peak memory by precision",
                          f"Memory measured as: {kinds}. The label is the change against the same framework's "
                          "fp32. On a CPU this is the process's resident memory, which includes framework "
                          "workspaces, so half-precision activations need not make it smaller.",
                          "Bar chart of peak training memory in MiB for each framework and precision mode."))

    _save(_bar(table, "val_accuracy", "Final validation accuracy (fraction)", "Final validation accuracy",
               "val_accuracy", "{:.1%}"), out_dir, "accuracy")
    figures.append(Figure("accuracy", "accuracy", "Final validation accuracy",
                          "Accuracy on the held-out split after the last epoch. Equal bars mean the precision "
                          "mode did not cost accuracy on this task.",
                          "Bar chart of final validation accuracy for each framework and precision mode."))

    if not steps.empty:
        df = _labelled(steps)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        sns.lineplot(data=df, x="step", y="loss", hue="Framework", style="Precision", palette=FRAMEWORK_COLORS,
                     dashes=PRECISION_DASHES, errorbar=None, linewidth=1, ax=ax)
        ax.set_yscale("log")
        ax.set_title("Training loss per step")
        ax.set_xlabel("Optimizer step")
        ax.set_ylabel("Batch cross-entropy loss (nats, log scale)")
        _save(fig, out_dir, "loss_curves")
        figures.append(Figure("loss_curves", "accuracy", "Training loss per step",
                              "Each line is one framework in one precision (median over seeds). Lines of the same "
                              "colour that overlap mean the precision mode did not change training.",
                              "Line chart of per-step training loss for each framework and precision."))

    if not epochs.empty:
        df = _labelled(epochs)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        sns.lineplot(data=df, x="epoch", y="val_accuracy", hue="Framework", style="Precision",
                     palette=FRAMEWORK_COLORS, dashes=PRECISION_DASHES, markers=PRECISION_MARKERS,
                     errorbar=None, ax=ax)
        ax.set_title("Validation accuracy per epoch")
        ax.set_xlabel("Epoch")
        ax.set_ylabel("Validation accuracy (fraction)")
        _save(fig, out_dir, "val_accuracy")
        figures.append(Figure("val_accuracy", "accuracy", "Validation accuracy per epoch",
                              "How fast each cell learns. Curves that separate early and meet later mean a "
                              "precision mode slowed learning without changing where it ends.",
                              "Line chart of validation accuracy after each epoch for each framework and precision."))

    scaled = steps[steps["precision"].isin(["fp16", "fp16-static"])] if not steps.empty else steps
    if not scaled.empty:
        df = _labelled(scaled)
        df["log2_scale"] = np.log2(df["loss_scale"])
        fig, ax = plt.subplots(figsize=(8, 4))
        sns.lineplot(data=df, x="step", y="log2_scale", hue="Framework", style="Precision", palette=FRAMEWORK_COLORS,
                     dashes=PRECISION_DASHES, errorbar=None, drawstyle="steps-post", ax=ax)
        skipped = df[df["skipped"]]
        if not skipped.empty:
            sns.scatterplot(data=skipped, x="step", y="log2_scale", hue="Framework", palette=FRAMEWORK_COLORS,
                            marker="X", s=60, legend=False, ax=ax)
        ax.set_title("Loss scale per step (fp16: dynamic; fp16-static: fixed)")
        ax.set_xlabel("Optimizer step")
        ax.set_ylabel("Loss scale (log2)")
        _save(fig, out_dir, "loss_scale")
        counts = ", ".join(f"{FRAMEWORK_LABELS.get(fw, fw)}: {int(g['skipped'].sum())} skipped"
                           for fw, g in scaled.groupby("framework", sort=False))
        figures.append(Figure("loss_scale", "loss_scaling", "Loss-scale trajectory",
                              f"The scale each step used; an X marks a step skipped because a gradient overflowed "
                              f"({counts}). The scale halves on each skip and doubles after every growth interval "
                              "of clean steps.",
                              "Step chart of the log2 loss scale per step for fp16 runs of each framework."))
    return figures


def make_underflow_figure(underflow: pd.DataFrame, out_dir: Path) -> Figure | None:
    """Fraction of each layer's gradient elements float16 would flush to zero, unscaled vs at the scale in use."""
    if underflow.empty:
        return None
    df = _labelled(underflow[underflow["when"] == "last step"])
    if df.empty:
        return None
    df = df.groupby(["Framework", "Precision", "layer"], observed=True).apply(
        lambda g: pd.Series({"no scaling": np.average(g["flush_fraction_unscaled"], weights=g["nonzero"] + 1e-12),
                             "scale in use": np.average(g["flush_fraction_scaled"], weights=g["nonzero"] + 1e-12)}),
        include_groups=False).reset_index()
    long = df.melt(id_vars=["Framework", "Precision", "layer"], var_name="Scaling", value_name="flush")
    long["flush_pct"] = long["flush"] * 100
    grid = sns.catplot(data=long, kind="bar", x="layer", y="flush_pct", hue="Framework", col="Scaling",
                       row="Precision", palette=FRAMEWORK_COLORS, height=2.6, aspect=2.0, sharey=True, errorbar=None)
    grid.set_axis_labels("Layer (canonical name)", "Flushed to 0 (%)")
    grid.set(ylim=(0, max(0.01, float(long["flush_pct"].max()) * 1.1)))
    grid.set_titles("{row_name}, {col_name}")
    grid.figure.suptitle("Gradient underflow in float16 at the last step", y=1.02)
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=45)
    _save(grid.figure, out_dir, "underflow")
    return Figure("underflow", "numerics", "Gradient underflow per layer",
                  "Share of each layer's non-zero float32 gradient elements whose magnitude is below float16's "
                  "smallest subnormal (2^-24) — they would become 0 in float16 — without loss scaling (left) and "
                  "multiplied by the loss scale the run used (right). Loss scaling exists to shrink the left bars.",
                  "Bar charts of the percentage of gradient elements per layer that float16 would flush to zero, "
                  "unscaled and scaled, per framework and precision.")
