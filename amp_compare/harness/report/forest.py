"""The forest plot of speed ratios (issue 32): every seed's ratio of a mixed cell to its fp32 cell with that
seed's own 95% interval, on a log axis, one panel per model (and dataset, step loop, batch size where several
ran: no panel mixes two), and behind each seed the band of ratios the machine's drift alone could have produced
between its two cells (harness/report/drift.py). A ratio outside its band stands on this machine."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd

from amp_compare.contract.config import display_order, framework_label
from amp_compare.harness.report.figures import (
    FRAMEWORK_COLORS,
    PRECISION_MARKERS,
    Figure,
    _drawn_tick_labels,
    _save,
    plain_log_labels,
    plt,
)


def _panel_label(row, keys: list[str]) -> str:
    words = {"step_loop": "{} step", "batch_size": "batch {:.0f}"}
    return " · ".join(words.get(k, "{}").format(row[k]) for k in keys)


def _draw_panel(ax, part: pd.DataFrame) -> None:
    """One model's seeds, one row each (framework, precision, seed), top to bottom in display order."""
    part = part.sort_values(["framework", "precision", "seed"], key=display_order).reset_index(drop=True)
    y = np.arange(len(part))[::-1]
    for yi, r in zip(y, part.itertuples()):
        if np.isfinite(r.band_low):
            ax.fill_betweenx([yi - 0.4, yi + 0.4], r.band_low, r.band_high, color="#999", alpha=0.25, linewidth=0)
        color = FRAMEWORK_COLORS.get(framework_label(r.framework), "#333")
        if np.isfinite(r.low):
            ax.plot([r.low, r.high], [yi, yi], color=color, linewidth=1.6)
        stalled = bool(getattr(r, "stalled", False))
        ax.plot([r.ratio], [yi], marker=PRECISION_MARKERS.get(r.precision, "o"), color=color, markersize=6,
                markerfacecolor=color if r.outside and not stalled else "white")
    ax.axvline(1.0, color="#444", linewidth=0.8)
    ax.set_yticks(y, [f"{framework_label(r.framework)} {r.precision} · seed {r.seed}"
                      + (" ⚠ stall" if getattr(r, "stalled", False) else "") for r in part.itertuples()])
    ax.set_xscale("log")  # labelled by make_forest_figure once the figure is laid out
    ax.set_xlabel("speed vs fp32 of the same seed (log scale)")


# the values an end of a panel's axis may snap to, per decade, finest first: a coarser set where the finer one's end
# labels would run into the decades' labels
END_STEPS = ((1, 1.5, 2, 3, 5, 7), (1, 2, 5), (1,))


def _labelled_ends(ax) -> None:
    """Widen a panel's log axis to the nearest plain values beyond what it draws and label both ends, so labelled
    ticks cover every interval and band on both sides of 1× (a panel spanning 0.7–1.7× had labels only at 0.7×,
    0.8×, 1×: no tick under an interval that reached 1.68×). The decades between stay labelled."""
    low, high = ax.get_xlim()
    # minor labels on the majors' line: a shorter minor tick set them 2 points higher, a staggered row of numbers
    rc = matplotlib.rcParams
    ax.tick_params(axis="x", which="minor",
                   pad=rc["xtick.major.size"] + rc["xtick.major.pad"] - rc["xtick.minor.size"])
    for steps in END_STEPS:
        grid = [m * 10.0 ** k for k in range(int(np.floor(np.log10(low))) - 1, int(np.ceil(np.log10(high))) + 1)
                for m in steps]
        lo = max(g for g in grid if g <= low * (1 + 1e-9))
        hi = min(g for g in grid if g >= high * (1 - 1e-9))
        ax.set_xlim(lo, hi)
        decades = [10.0 ** k for k in range(int(np.ceil(np.log10(lo) - 1e-9)), int(np.floor(np.log10(hi) + 1e-9)) + 1)]
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sorted({lo, hi, *decades})))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.figure.canvas.draw()
        boxes = [box for _, major, box in _drawn_tick_labels(ax, "x", ax.figure.canvas.get_renderer()) if major]
        if not any(a.padded(2).overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:]):
            return


def make_forest_figure(seeds: pd.DataFrame, out_dir: Path, emulated: list[str] | None = None) -> Figure | None:
    """The per-seed forest plot from per_seed.seed_table; None without a mixed cell paired with its fp32.
    `emulated`: the modes left out because their time is an emulation's (report/fp8.py)."""
    if seeds is None or seeds.empty:
        return None
    keys = [k for k in ("machine", "model", "dataset", "step_loop", "batch_size")
            if k in seeds and (k in ("model",) or seeds[k].nunique(dropna=False) > 1)]
    panels = list(seeds.groupby(keys, sort=False, dropna=False))
    heights = [max(1.2, 0.32 * len(p) + 0.8) for _, p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (_, part) in zip(axes[:, 0], panels):
        _draw_panel(ax, part)
        ax.set_title(_panel_label(part.iloc[0], keys), loc="left", fontsize=10)
    fig.suptitle("Speed ratio per seed, with the machine's drift band", y=1.0)
    fig.tight_layout()
    for ax in axes[:, 0]:
        _labelled_ends(ax)
    # plain numbers (0.3×), minor labels thinned: a panel spanning under a decade got 3×10^-1 and 4×10^-1
    # labels that ran into each other
    plain_log_labels(fig, "x", "×")
    _save(fig, out_dir, "speed_forest")
    return Figure("speed_forest", "speed", "Speed ratio of every seed against the machine's drift",
                  "Each row is one seed: its mixed cell's images/s over its fp32 cell's (log axis; 1× is the "
                  "vertical line), the line that seed's 95% interval from batch means of both cells' timed steps "
                  "(none where too few steps were timed). The grey band is the range of ratios the machine's own "
                  "drift could have produced between those two cells: the quotients of the calibration checks next "
                  "to them, widened by three typical check-to-check moves. A filled marker lies outside its band "
                  "(drift cannot explain it), an open one inside; \"⚠ stall\" marks a seed whose fp32 or mixed cell "
                  "ran next to a calibration check far above the run's median (a stall) that could explain its ratio: "
                  "its band counts that stalled check among the checks (the band the findings quote), and its "
                  "ratio, inside it, is not supported (open marker). One panel per model and dataset."
                  + (f" Not drawn: {', '.join(emulated)}, emulated on this CPU (not a speed result)."
                     if emulated else ""),
                  "Forest plot per model: for each framework, precision and seed, a marker at the speed ratio with "
                  "a horizontal interval, on a log axis, over a grey band of what machine drift alone could do.")
