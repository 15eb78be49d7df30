"""Figures a reader can read: the loss-scale axis in whole powers of two, a title naming only the modes the run
had, and loss curves where lines that coincide stay distinguishable (panels, staggered markers, a note)."""

import os
import sys
from pathlib import Path
from unittest import mock

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from amp_compare.harness.report import figures
from amp_compare.harness.report.figures import curves_coincide, loss_scale_grid


def _steps(precisions=("fp32", "fp16", "bf16"), scale=2.0**15, n=24, gap=0.0):
    rows = []
    for fw in ("torch", "tf"):
        for i, prec in enumerate(precisions):
            for step in range(n):
                rows.append({"framework": fw, "precision": prec, "cell_id": f"{fw}-{prec}", "seed": 0, "step": step,
                             "loss": 2.3 - 0.01 * step + gap * i, "skipped": False,
                             "loss_scale": scale if prec.startswith("fp16") else 1.0})
    return pd.DataFrame(rows)


def _lines(steps):
    """The loss-curves figure as _loss_curve_figures draws it, kept open."""
    drawn = []
    with mock.patch.object(figures, "_save", lambda fig, out_dir, key: drawn.append(fig)):
        figures._loss_curve_figures(steps, Path("unused"))
    return drawn[0]


def _tick_labels(ax):
    ax.figure.canvas.draw()
    return [t.get_text() for t in ax.get_yticklabels() if t.get_text()]


def test_flat_loss_scale_has_whole_power_of_two_ticks_and_names_only_dynamic_fp16():
    steps = _steps(precisions=("fp16",))
    grid = loss_scale_grid(steps)
    ax = grid.ax
    ticks = ax.get_yticks()
    visible = ticks[(ticks >= ax.get_ylim()[0]) & (ticks <= ax.get_ylim()[1])]
    assert len(visible) >= 3 and np.allclose(visible, np.round(visible)), visible  # not 14.2, 14.4 … 15.8
    assert "$2^{15}$" in _tick_labels(ax)
    assert ax.get_title() == "Loss scale per step (fp16: dynamic)"  # no fp16-static in a run without one
    plt.close(grid.figure)


def test_loss_scale_title_names_fp16_static_when_the_run_had_it():
    steps = _steps(precisions=("fp16", "fp16-static"))
    steps.loc[(steps["precision"] == "fp16") & (steps["step"] >= 5), "loss_scale"] = 2.0**14
    grid = loss_scale_grid(steps)
    assert grid.ax.get_title() == "Loss scale per step (fp16: dynamic; fp16-static: fixed)"
    ticks = grid.ax.get_yticks()
    assert np.allclose(ticks, np.round(ticks))
    plt.close(grid.figure)


def test_a_skipped_steps_x_is_drawn_above_the_lines_markers():
    """The lab audit's loss_scale.png: the lines' staggered square markers hid the X of half the skipped steps."""
    steps = _steps(precisions=("fp16",))
    steps.loc[steps["step"] == 7, "skipped"] = True
    grid = loss_scale_grid(steps)
    crosses = [c for c in grid.ax.collections if len(c.get_offsets())]
    assert crosses and all(c.get_zorder() > line.get_zorder() for c in crosses for line in grid.ax.lines)
    plt.close(grid.figure)


def test_the_loss_curves_caption_counts_its_panels(tmp_path):
    """The lab audit: "One panel per framework" under a figure with a panel per framework and model."""

    one, two = _steps(precisions=("fp32",)).assign(model="simple_cnn"), []
    two = pd.concat([one, one.assign(model="vit")])
    for steps, panels in ((one, "One panel per framework;"), (two, "One panel per framework and model;")):
        (fig,) = figures._loss_curve_figures(steps, tmp_path)
        assert fig.caption.startswith(panels), fig.caption
    plt.close("all")


def test_coinciding_loss_curves_stay_distinguishable():
    steps = _steps()  # six identical curves: what a tiny run from shared weights draws
    fig = _lines(steps)
    axes = fig.axes[:2]
    assert [ax.get_title() for ax in axes] == ["PyTorch", "Keras (TF)"]  # one panel per framework
    for ax in axes:
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
        assert len(lines) == 3
        assert len({ln.get_marker() for ln in lines}) == 3  # a marker per precision
        starts = [ln.get_markevery()[0] for ln in lines]
        assert len(set(starts)) == 3, starts  # at different steps, so none hides another
    plt.close(fig)


@pytest.mark.parametrize("gap, coincide", [(0.0, True), (0.001, True), (0.5, False)])
def test_curves_coincide_measures_the_largest_gap_to_fp32(gap, coincide):
    value = curves_coincide(_steps(gap=gap), "step", "loss")
    assert (value < 0.02) == coincide
    assert value == pytest.approx(max(2 * gap / (2.3 - 0.01 * s) for s in range(24)), rel=1e-6)


def test_gradient_histogram_shows_each_framework_against_float16s_range(tmp_path):
    """Issue 28: the children record log2-magnitude histograms and overflow headroom; the report now draws them
    per framework, shifted by the loss scale in use, with float16's flush and overflow regions shaded."""
    import json

    from amp_compare.harness.report.figures import make_gradient_histogram_figure
    from amp_compare.harness.report.numerics import numerics_said

    hist = json.dumps({str(k): (10 if -20 <= k <= -6 else 0) for k in range(-40, 17)})
    rows = [{"framework": fw, "precision": prec, "seed": 0, "when": "last step", "layer": "conv1", "param": "weight",
             "nonzero": 150, "elements": 150, "overflow_fraction_scaled": 0.0, "loss_scale": scale, "log2_hist": hist}
            for fw in ("torch", "tf") for prec, scale in (("fp16", 2.0**15), ("fp16-noscale", 1.0))]
    fig = make_gradient_histogram_figure(pd.DataFrame(rows), tmp_path)
    assert fig is not None and (tmp_path / "gradient_histogram.png").stat().st_size > 1000
    # the headroom sentences are said once, in the Numerics section's list beside the figure, not in its caption
    said = " ".join(numerics_said(pd.DataFrame(), pd.DataFrame(rows))["underflow"])
    assert ("PyTorch fp16, after the last step (the first batch again): the largest |parameter gradient| was below "
            "2^-5; times the scale the scaler held after that step (2^15) below 2^10 — a bound, like each below, on "
            "the parameter gradients at its probe only") in said
    assert said.count("a bound") == 1  # the caveat once, not per sentence
    assert "Keras (TF) fp16-noscale, after the last step (the first batch again): the largest |parameter gradient| " \
           "was below 2^-5." in said and "nothing overflowed" not in said
    assert "largest |gradient|" not in fig.caption
    assert make_gradient_histogram_figure(pd.DataFrame(rows).assign(log2_hist="{}"), tmp_path) is None


def test_the_underflow_figures_layer_names_do_not_overlap(tmp_path, monkeypatch):
    """Issue 32: a two-model run's 20 layer names at 45° ran into each other. They are drawn upright with room
    for each, and the drawn label boxes are checked for overlap."""

    names = ["conv1", "conv2", "fc"] + [f"blocks.{b}.{p}" for b in range(2) for p in
                                        ("attn.query", "attn.key", "attn.value", "attn.out", "ln1", "ln2", "mlp.fc1",
                                         "mlp.fc2")] + ["embed", "norm", "patch"]
    rows = [{"framework": fw, "precision": prec, "seed": 0, "when": "last step",
             "model": "simple_cnn" if i < 3 else "vit", "layer": name, "param": "weight", "nonzero": 100,
             "flush_fraction_unscaled": 0.03 * (i % 3 == 0), "flush_fraction_scaled": 0.0}
            for fw in ("torch", "tf") for prec in ("fp32", "fp16", "fp16-noscale", "fp16-static")
            for i, name in enumerate(names)]
    drawn = []
    monkeypatch.setattr(figures, "_save", lambda fig, out_dir, key: drawn.append(fig))
    assert figures.make_underflow_figure(pd.DataFrame(rows), tmp_path) is not None
    (fig,) = drawn
    labels = [t.get_text() for t in fig.axes[-1].get_xticklabels() if t.get_visible()]
    assert "vit: blocks.1.attn.query" in labels and len(labels) == len(names)
    assert figures.tick_label_overlaps(fig) == 0


def _drawn(monkeypatch, module):
    """The figures a make_* function draws, kept open instead of saved."""
    drawn = []
    monkeypatch.setattr(module, "_save", lambda fig, out_dir, key: drawn.append(fig))
    return drawn


def test_a_log_loss_axis_over_three_decades_has_no_overprinted_labels():
    """The audit's loss_curves.png: every minor tick of 0.007–3 labelled, 0.09/0.08/0.07… overprinting."""

    steps = _steps()
    steps["loss"] = 3.0 * np.exp(-np.log(3.0 / 0.007) * steps["step"] / 23)
    fig = _lines(steps)
    assert figures.tick_label_overlaps(fig, "y") == 0
    assert {"0.01", "0.1", "1"} <= set(_tick_labels(fig.axes[0]))  # plain numbers, not 10^-1
    plt.close(fig)


def test_the_gradient_histograms_axis_labels_do_not_run_into_the_next_panels(monkeypatch, tmp_path):
    import json


    hist = json.dumps({str(k): (10 if -20 <= k <= -6 else 0) for k in range(-40, 17)})
    rows = [{"framework": fw, "precision": "fp16", "seed": 0, "when": "last step", "layer": "conv1",
             "param": "weight", "nonzero": 150, "elements": 150, "overflow_fraction_scaled": 0.0,
             "loss_scale": 2.0**15, "log2_hist": hist, "model": model}
            for fw in ("torch", "tf") for model in ("simple_cnn", "vit")]
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")  # as the report draws its figures
    drawn = _drawn(monkeypatch, figures)
    assert figures.make_gradient_histogram_figure(pd.DataFrame(rows), tmp_path) is not None
    (fig,) = drawn
    fig.canvas.draw()
    boxes = [ax.xaxis.label.get_window_extent() for ax in fig.axes if ax.xaxis.label.get_text()]
    assert len(boxes) == 4 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)


def test_the_time_to_accuracy_target_is_named_clear_of_the_data(monkeypatch, tmp_path):
    """The audit: "target 93.9%" written at the line's left end, where the first epochs' points overprinted it."""
    from amp_compare.contract import records
    from amp_compare.harness.report.tables import accuracy_statistics
    from tests.test_report_sentences import write_run

    t = records.read_run(write_run(tmp_path))
    acc = accuracy_statistics(t["run"], t["epochs"])
    drawn = _drawn(monkeypatch, figures)
    assert figures.make_time_to_accuracy_figure(t["run"], t["epochs"], acc, tmp_path / "f") is not None
    (fig,) = drawn
    ax = fig.axes[0]
    assert f"dotted: target {acc['target'].iloc[0]:.1%}" in ax.get_title()
    assert not ax.texts  # nothing written inside the plot, where the data are
    plt.close(fig)


def test_bar_labels_stand_above_their_error_bars(monkeypatch, tmp_path):
    """The audit's memory.png: "+0%" at the bar's top, under the bar's own error bar."""

    runs = pd.DataFrame([{"framework": fw, "precision": p, "seed": s, "peak_memory_mib": 40 + 10 * s}
                         for fw in ("torch", "tf") for p in ("fp32", "fp16") for s in range(3)])
    table = runs.drop_duplicates(["framework", "precision"]).assign(label="+0%")
    fig = figures._bar(runs, table, "peak_memory_mib", "MiB", "Peak memory", "label")
    fig.canvas.draw()
    ax = fig.axes[0]
    texts = [t.get_window_extent() for t in ax.texts if t.get_text()]
    bars = [ln.get_window_extent() for ln in ax.get_lines() if np.isfinite(ln.get_ydata()).sum() > 1]
    assert len(texts) == 4 and len(bars) == 4
    assert not any(t.overlaps(b) for t in texts for b in bars)
    plt.close(fig)


def _dies_in_a_drawing_process(parent: int) -> str:
    if os.getpid() != parent:
        os._exit(1)  # a drawing process terminated abruptly
    return "drawn"


def test_a_drawing_process_that_dies_is_answered_by_drawing_here(monkeypatch):
    """The figures drawn in two forked processes (render._in_parallel): one that dies leaves the page its figures,
    drawn in this process instead, not a BrokenProcessPool."""
    from amp_compare.harness.report import render

    for name in ("torch", "tensorflow", "jax"):  # as in the compare's parent, which loads no framework
        monkeypatch.delitem(sys.modules, name, raising=False)
    task = (_dies_in_a_drawing_process, (os.getpid(),))
    assert render._in_parallel([task, task])() == ["drawn", "drawn"]


def test_the_figures_are_drawn_while_the_rest_of_the_page_is_built_and_dropped_when_it_fails(tmp_path, monkeypatch):
    """render._render starts the drawing before the page's other sections and collects it after them; a page
    that fails on the way drops the drawing (no drawing process outlives it)."""
    from amp_compare.harness.report import render
    from tests.test_report_sentences import write_run

    run_dir = write_run(tmp_path, seeds=(0,))
    order = []

    def started(tasks):
        order.append("drawing started")
        return lambda cancel=False: order.append("dropped" if cancel else "collected") or []

    monkeypatch.setattr(render, "_in_parallel", started)
    rest = render._page_rest
    monkeypatch.setattr(render, "_page_rest", lambda *a: order.append("rest of the page") or rest(*a))
    render.render(run_dir)
    assert order == ["drawing started", "rest of the page", "collected"]
    order.clear()

    def fails(*args):
        raise RuntimeError("a section failed")

    monkeypatch.setattr(render, "_page_rest", fails)
    with pytest.raises(RuntimeError):
        render.render(run_dir)
    assert order == ["drawing started", "dropped"]


def test_the_loss_curves_count_steps_from_0_as_the_tables_do(monkeypatch, tmp_path):
    """The audit: the tables count optimizer steps from 0; so does the loss figure's axis."""

    drawn = _drawn(monkeypatch, figures)
    figures._loss_curve_figures(_steps(), tmp_path)
    (loss,) = drawn
    assert loss.axes[0].get_xlabel() == "Optimizer step (counting from 0)"
    plt.close(loss)


def test_the_naive_exp_limit_is_drawn_inside_every_attention_logit_panel(monkeypatch, tmp_path):
    """The audit's headroom.png: fp32 and bf16 logits of 48–63 set the axis' floor above ln(65,504) ≈ 11.1, so the
    dotted line lay below the panel (only its label printed, under the axis)."""
    from amp_compare.kit.fp16 import FP16_EXP_LIMIT

    cells = [(fw, prec) for fw in ("torch", "tf") for prec in ("fp32", "fp16", "bf16")]
    headroom = pd.DataFrame([{"cell_id": f"{fw}-{prec}", "framework": fw, "precision": prec, "seed": 0, "epoch": e,
                              "layer": "blocks.0.attn", "quantity": "attention_logit",
                              "max_abs": (16.7 if prec == "fp16" else 48.0 + 7 * e)}
                             for fw, prec in cells for e in range(2)])
    runs = pd.DataFrame([{"cell_id": f"{fw}-{prec}", "cfg_attention": "naive"} for fw, prec in cells])
    drawn = _drawn(monkeypatch, figures)
    assert figures.make_headroom_figure(headroom, runs, tmp_path) is not None
    (fig,) = drawn
    panels = [ax for ax in fig.axes if "attention logit" in ax.get_title()]
    assert len(panels) == 3
    for ax in panels:
        low, high = ax.get_ylim()
        assert low < FP16_EXP_LIMIT < high, (ax.get_title(), low)
        assert any(np.allclose(ln.get_ydata(), FP16_EXP_LIMIT) for ln in ax.get_lines())
    plt.close(fig)


def test_a_log_loss_axis_inside_one_decade_still_has_labelled_ticks():
    """The audit's naive loss_curves.png: losses of 2.0–2.5 on a log axis, no tick inside, no number on the axis."""
    steps = _steps()
    steps["loss"] = 2.47 - 0.02 * steps["step"]
    fig = _lines(steps)

    fig.canvas.draw()
    shown = figures._drawn_tick_labels(fig.axes[0].yaxis, fig.canvas.get_renderer())  # major and minor, in view
    assert len(shown) >= 2, [loc for loc, _, _ in shown]
    plt.close(fig)


def _key_bias_underflow():
    """A vit's last-step probe, two seeds: the key bias (exact gradient zero) flushes whole, a weight 1 in 100."""
    rows = []
    for fw in ("torch", "tf"):
        for seed in (0, 1):
            for layer, param, flush in (("blocks.0.attn.key", "bias", 1.0), ("blocks.0.attn.key", "weight", 0.0),
                                        ("fc", "weight", 0.01 * (seed + 1)), ("fc", "bias", 0.0)):
                rows.append({"cell_id": f"{fw}-fp32-s{seed}", "framework": fw, "precision": "fp32", "seed": seed,
                             "model": "vit", "when": "last step", "at_step": 87, "layer": layer, "param": param,
                             "nonzero": 100, "elements": 100, "zero_fraction": 0.0, "flush_fraction_unscaled": flush,
                             "flush_fraction_scaled": flush, "loss_scale": 1.0, "method": "m"})
    return pd.DataFrame(rows)


def test_the_underflow_bars_leave_out_key_bias_residue_and_the_caption_says_what_a_bar_pools(monkeypatch, tmp_path):
    """The audits: attention key biases (exact gradient zero: rounding residue) drawn as 3% underflow, and a
    caption that said neither the seed pooling nor the step."""

    drawn = _drawn(monkeypatch, figures)
    fig = figures.make_underflow_figure(_key_bias_underflow(), tmp_path)
    assert "Not drawn: blocks.0.attn.key.bias, of whose 400 non-zero elements over 4 cells 400 would flush" \
        in fig.caption
    assert "rounding residue, not underflow" in fig.caption
    assert "(step 87, counting from 0)" in fig.caption and "(seeds per bar: 2)" in fig.caption, fig.caption
    assert "the layer's parameters (weight, bias)" in fig.caption
    (drawn_fig,) = drawn
    ax = drawn_fig.axes[0]
    names = [t.get_text() for t in ax.get_xticklabels()]
    heights = {names[round(b.get_x() + b.get_width() / 2)]: b.get_height() for c in ax.containers for b in c}
    assert heights["blocks.0.attn.key"] == 0  # the key's weight only: nothing flushed
    assert heights["fc"] == pytest.approx(100 * (0.01 + 0.02) / 4)  # both seeds, weight and bias, by element
    plt.close(drawn_fig)


def test_the_underflow_table_says_which_share_is_key_bias_residue():
    from amp_compare.harness.report import render

    table = render._underflow_table(_key_bias_underflow())
    cell = table["float32 reference: would flush in fp16, no scaling"].iloc[0]
    assert cell == "25.250% (of it 25.000% attention key-bias residue)", cell  # first seed
    # the lab audit: "last step" rows of cells the speed budget stopped (step 44) beside fp32's (step 87)
    assert set(table["When"]) == {"last step (step 87)"}
    assert set(render._underflow_table(_key_bias_underflow().drop(columns="at_step"))["When"]) == {"last step"}
    # round 3 of the audit: the cancelled column said 0.016% beside a sentence that left the key biases out of it
    cancelled = render._underflow_table(_key_bias_underflow().assign(
        lost_fraction_mixed_unscaled=0.0, lost_fraction_mixed_scaled=0.0,
        cancelled_fraction_mixed_scaled=lambda d: d["flush_fraction_unscaled"]))
    assert cancelled["mixed backward: cancelled at that scale only"].iloc[0] == cell, cancelled.iloc[0]


def _busy_run(tmp_path):
    """A synthetic run whose torch fp32 seed 2 ran 3x slower than its speed trial's step (the machine busy), and
    speed trials that ran each precision at the cells' own median step."""
    from amp_compare.contract import records
    from amp_compare.harness.report.tables import with_loop_columns
    from tests.test_report_sentences import write_run

    t = records.read_run(write_run(tmp_path))
    cells = with_loop_columns(t["run"].copy())
    cells = cells.assign(threads=cells["cfg_threads"])
    keys = ["framework", "model", "dataset", "batch_size", "step_loop", "precision", "threads"]
    trials = (cells["batch_size"] / cells["throughput_img_s"]).groupby([cells[k] for k in keys]).median()
    trials = trials.rename("wall_s").reset_index().assign(steps=1, contended=False)
    busy = t["run"]["cell_id"][(t["run"]["framework"] == "torch") & (t["run"]["precision"] == "fp32")
                               & (t["run"]["seed"] == 2)].iloc[0]
    t["run"].loc[t["run"]["cell_id"] == busy, "throughput_img_s"] /= 3
    return t, trials, busy


def test_the_time_to_accuracy_caption_names_the_cells_that_ran_on_a_busy_machine(tmp_path, monkeypatch):
    """A busy fp32 cell (3× its speed trial's step) is named in the time-to-accuracy caption."""
    from amp_compare.harness.report.tables import accuracy_statistics

    t, trials, busy = _busy_run(tmp_path)
    assert list(figures.busy_cells(t["run"], trials).round(1).items()) == [(busy, 3.0)]
    drawn = _drawn(monkeypatch, figures)
    tta = figures.make_time_to_accuracy_figure(t["run"], t["epochs"], accuracy_statistics(t["run"], t["epochs"]),
                                               tmp_path / "f", trials)
    assert f"busy (wall time per step over 1.4× the median step of the speed trial's uncontended blocks of the same " \
           f"framework, precision and thread count): {busy} (3.0×); their lines' times" in tta.caption, tta.caption
    for fig in drawn:
        plt.close(fig)
    assert figures.busy_cells(t["run"], None).empty  # no trials: nothing said
    # cells at another thread count than their trial (one each, at once, beside a trial with more): not judged,
    # and with no mark to explain the captions say nothing of busy cells
    more = trials.assign(threads=trials["threads"] + 1)
    assert figures.busy_cells(t["run"], more).empty
    tta = figures.make_time_to_accuracy_figure(t["run"], t["epochs"], accuracy_statistics(t["run"], t["epochs"]),
                                               tmp_path / "g", more)
    assert "busy" not in tta.caption and "thread" not in tta.caption, tta.caption



def test_figures_measured_from_the_layout_alone_are_the_pngs_full_draws_give(tmp_path, monkeypatch):
    """figures.laid_out (layout without a raster) replaces full draws where a figure measures its text: the minor
    log labels it keeps (loss curves over three decades) and seaborn's legend beside a grid. The PNGs are the same,
    byte for byte, as when every measurement drew the whole figure."""
    import seaborn as sns
    import seaborn.axisgrid
    import seaborn.utils


    steps = _steps()
    steps["loss"] = 3.0 * np.exp(-np.log(3.0 / 0.007) * steps["step"] / 23)
    bars = pd.DataFrame({"Layer": ["conv1", "conv2", "fc"] * 4, "Share": np.linspace(0.1, 0.9, 12),
                         "Framework": ["PyTorch", "Keras (TensorFlow)"] * 6, "Scaling": ["none"] * 6 + ["used"] * 6})

    def pngs(name):
        curves = _lines(steps)
        grid = sns.catplot(data=bars, kind="bar", x="Layer", y="Share", hue="Framework", col="Scaling", height=2)
        out = []
        for i, fig in enumerate((curves, grid.figure)):
            fig.savefig(tmp_path / f"{name}{i}.png", dpi=110, bbox_inches="tight")
            plt.close(fig)
            out.append((tmp_path / f"{name}{i}.png").read_bytes())
        return out

    assert seaborn.axisgrid._draw_figure is figures.laid_out  # what a report draws with
    ours = pngs("ours")
    monkeypatch.setattr(figures, "laid_out", lambda fig: fig.canvas.draw() or fig.canvas.get_renderer())
    monkeypatch.setattr(seaborn.axisgrid, "_draw_figure", seaborn.utils._draw_figure)
    assert ours == pngs("drawn")


def test_the_speed_figure_draws_each_speed_verdict_with_its_interval(tmp_path, monkeypatch):
    """The figure under the answer is the verdict table's speed rows (estimate, low, high) against 1×, not the
    cells' throughput (whose ratios the audit found beside, and disagreeing with, the verdicts)."""
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, out, key: drawn.setdefault(key, fig))
    rows = [("torch", "fp16", 0.024, 0.021, 0.029, "slower"), ("torch", "bf16", 1.54, 1.25, 1.91, "faster"),
            ("tf", "bf16", 0.97, 0.90, 1.05, "undecided")]
    v = pd.DataFrame([{"model": "simple_cnn", "dataset": "digits", "framework": f, "precision": p, "metric": "speed",
                       "estimate": e, "low": lo, "high": hi, "status": st, "interval_kind": "trial 95%"}
                      for f, p, e, lo, hi, st in rows])
    fig = figures.make_speed_verdict_figure(pd.concat([v, v.assign(metric="memory")]), tmp_path)
    assert fig.key == "speed_verdicts" and "≥95% trial" in fig.caption
    (ax,) = drawn["speed_verdicts"].axes
    points = sorted(line.get_xdata()[0] for line in ax.lines if len(line.get_xdata()) == 1)
    intervals = sorted(tuple(line.get_xdata()) for line in ax.lines if line.get_linestyle() == "-"
                       and len(line.get_xdata()) == 2)  # not the dashed 1× line
    assert points == sorted([0.024, 1.54, 0.97]) and intervals == sorted((lo, hi) for *_, lo, hi, _ in rows)
    assert figures.make_speed_verdict_figure(v.assign(metric="memory"), tmp_path) is None


def test_the_headroom_caption_says_which_tensors_are_float16_and_gives_the_unscaled_product(monkeypatch, tmp_path):
    """The default audit: the caption set LayerNorm inputs (computed in float32) against float16's largest value as
    if they were float16, and left out Keras' float16 Q·Kᵀ product (about 4x the plotted logit), recorded beside it."""
    rows = [{"cell_id": "tf-fp16", "framework": "tf", "precision": "fp16", "seed": 0, "epoch": 0,
             "layer": "blocks.0.attn", "quantity": q, "max_abs": v}
            for q, v in (("attention_logit", 5.8), ("layernorm_input", 3.9), ("qk_product", 23.36))]
    _drawn(monkeypatch, figures)
    fig = figures.make_headroom_figure(pd.DataFrame(rows), pd.DataFrame([{"cell_id": "tf-fp16"}]), tmp_path)
    assert "Whether a tensor is float16 at all is the dtype table's" in fig.caption
    assert "Q·Kᵀ before its 1/√d scaling reached 23.4 (data/headroom, qk_product)" in fig.caption
