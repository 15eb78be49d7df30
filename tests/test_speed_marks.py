"""Every place a speed ratio appears carries the report's own ⚠ and says what it measured (issue 32's audit):
the throughput figure's labels, the runs index, the time-to-accuracy caption, the same-epoch sentence. Synthetic
runs (tests/test_report_sentences.write_run), rendered as a compare renders them."""

import html as html_lib

import numpy as np
import pandas as pd

from amp_compare.contract import records
from amp_compare.harness.report import figures, findings
from amp_compare.harness.report.tables import accuracy_statistics, full_table, summary_table
from tests.test_report_sentences import make_run, write_run

# torch bf16's seeds disagree on the side of 1 (⚠ noisy); fp16's 8x slowdown in every seed stands
SPEEDS = {("torch", "bf16"): [1.6, 0.7, 1.2], ("torch", "fp16"): [0.12, 0.11, 0.13]}


def test_the_runs_index_and_the_figure_labels_keep_the_reports_warning(tmp_path):
    rendered, _ = make_run(tmp_path, speeds=SPEEDS)
    full = rendered.table.set_index(["framework", "precision"])
    assert full.loc[("torch", "bf16"), "speed_note"] and not full.loc[("torch", "fp16"), "speed_note"]
    index = html_lib.unescape((tmp_path / "index.html").read_text())
    bf16 = f"{full.loc[('torch', 'bf16'), 'speedup_vs_fp32']:.2f}×"
    assert f"torch bf16: {bf16} fp32 speed ⚠" in index and "torch fp16: 0.12× fp32 speed," in index, index
    table = summary_table(rendered.runs)
    labels = figures.speed_labels(table, rendered.table).set_axis(pd.MultiIndex.from_frame(
        table[["framework", "precision"]]))
    assert labels[("torch", "bf16")] == f"{bf16} ⚠" and labels[("torch", "fp16")] == "0.12×"


def test_the_runs_index_computes_a_runs_headline_once_per_state_of_its_records(tmp_path, monkeypatch):
    """The index is rebuilt at every render: an untouched past run's headline is read back (a folder of many runs
    would otherwise cost half a second more per run each time), a re-rendered run's computed again."""
    from amp_compare.harness.report import render

    make_run(tmp_path, speeds=SPEEDS)
    first = (tmp_path / "index.html").read_text()
    computed = []
    original = render._index_headline
    monkeypatch.setattr(render, "_index_headline", lambda *a: computed.append(a[0]) or original(*a))
    render.render_runs_index(tmp_path)
    assert computed == [] and (tmp_path / "index.html").read_text() == first
    run_dir = next(p.parent for p in tmp_path.glob("*/manifest.json"))
    render.render(run_dir, figures=False)  # its tables written again: its headline is computed again
    assert computed == [run_dir] and "torch fp16: 0.12× fp32 speed," in html_lib.unescape(
        (tmp_path / "index.html").read_text())


def test_the_throughput_caption_says_what_its_bars_and_labels_are(tmp_path, unsaved_figures):
    t = records.read_run(write_run(tmp_path, speeds=SPEEDS))
    caption = next(f for f in figures.make_figures(t["run"], t["epochs"], t["steps"], tmp_path / "f",
                                                   notes=full_table(t["run"], t["steps"], t["epochs"]))
                   if f.key == "throughput").caption
    assert "A bar's height is the median over seeds" in caption and "not the quotient of two bars" in caption


def test_the_time_to_accuracy_caption_names_each_panels_own_target(tmp_path):
    t = records.read_run(write_run(tmp_path))
    other = t["run"].assign(model="vit", cell_id="v" + t["run"]["cell_id"],
                            final_val_accuracy=t["run"]["final_val_accuracy"] * 0.9)
    epochs = pd.concat([t["epochs"], t["epochs"].assign(cell_id="v" + t["epochs"]["cell_id"],
                                                        val_accuracy=t["epochs"]["val_accuracy"] * 0.9)])
    runs = pd.concat([t["run"], other], ignore_index=True)
    acc = accuracy_statistics(runs, epochs)
    fig = figures.make_time_to_accuracy_figure(runs, epochs, acc, tmp_path / "f")
    targets = acc.drop_duplicates("model").set_index("model")["target"]
    assert targets["vit"] != targets["simple_cnn"]
    assert "Each panel's dotted line is its own target" in fig.caption
    for model, target in targets.items():
        assert f"{model} · synthetic: {target:.1%}" in fig.caption, fig.caption


def test_the_same_epoch_sentence_counts_from_one_and_says_warm_up_is_in_the_times():
    group = pd.DataFrame({"reached_epochs": ["1", "1"], "reached": ["3/3", "3/3"]})
    said = findings._same_epoch(group)
    assert "end of epoch 2 of its run (counting from 1)" in said and "warm-up time included" in said
    assert "differ only as the training speed does" not in said


def test_the_legends_say_the_noisy_rule_the_marks_follow(tmp_path):
    """Audit: the time-to-target legend said "noisy: a 95% interval wider than 1.3× end to end, or including 1×",
    yet 7.48× [4.02–13.91] was unmarked. A speed or time-to-target interval wholly on one side of 1× keeps its
    side however wide; the legends say so, and every row's mark follows what they say."""
    speeds = {("torch", "bf16"): [1.6, 0.7, 1.2], ("tf", "fp16"): [0.22, 0.14, 0.26]}
    rendered, html = make_run(tmp_path, speeds=speeds)
    t = rendered.table
    mixed = t[t["precision"] != "fp32"]
    for low, high, note in [*zip(mixed["speed_low"], mixed["speed_high"], mixed["speed_note"]),
                            *zip(mixed["ttt_low"], mixed["ttt_high"], mixed["ttt_note"])]:
        assert note.startswith("noisy") == (low < 1 < high), (low, high, note)  # ratios here are >5% from 1×
    wide = mixed.set_index(["framework", "precision"]).loc[("tf", "fp16")]
    assert wide["speed_high"] / wide["speed_low"] > 1.3 and wide["speed_note"] == ""  # wide, wholly below 1×
    said = findings._notes(["noisy: interval 0.50–1.20×"])
    assert "an interval wholly on one side of 1× is not marked however wide" in said and "wider than" not in said
    assert "interval wholly on one side of 1× is not marked however wide: its side stands" in html


def test_rows_counted_slower_are_the_ones_without_a_warning(tmp_path):
    """Audit: run B said "bf16 was slower than fp32 in 2 of 4 bfloat16 rows (0.50–0.95×)" counting a 0.95× whose
    interval held 1×, run A "1 of 4" with that row at 1.11×: a count flipped on a ratio neither run supports. A row
    under ⚠ is counted apart, in the findings and in the glossary's evidence alike."""
    speeds = {("torch", "bf16"): [0.70, 1.05, 1.06], ("tf", "bf16"): [0.8, 0.8, 0.8]}
    rendered, html = make_run(tmp_path, speeds=speeds)
    t = rendered.table.set_index(["framework", "precision"])
    assert t.loc[("torch", "bf16"), "speed_note"].startswith("noisy") and t.loc[("tf", "bf16"), "speed_note"] == ""
    said = next(s for s in rendered.findings if "(bfloat16)" in s)
    assert said.startswith("bf16 (bfloat16) was slower than fp32 in 1 of 2 bfloat16 rows of the summary (0.80×; "
                           "rows with ⚠ not counted); 1 more read below 1× but carry ⚠ (0.92×)"), said
    assert "This run: bfloat16 rows without ⚠ at 0.80× fp32's speed (1 more with ⚠ left out)" in html


def test_a_warned_ratio_names_its_own_cells_stalled_steps(tmp_path):
    """Audit: PyTorch bf16's ⚠ named one seed and drift, not its own cell's p99 60.2 ms against p50 19.9 ms that
    the hardware note called "stalled steps"."""
    run_dir = write_run(tmp_path, speeds={("torch", "bf16"): [0.34], ("torch", "fp16"): [0.12]}, seeds=(0,))
    for cell in (run_dir / "cells").glob("torch-*-bf16-*"):
        steps = pd.read_parquet(cell / "steps.parquet")
        stalled = steps.index[steps["step"] % 25 == 3]  # a few steps five times their median
        steps.loc[stalled, "step_time_s"] = steps["step_time_s"].median() * 5
        records.atomic_write_table(cell / "steps.parquet", steps)
    t = records.read_run(run_dir)
    full = full_table(t["run"], t["steps"], t["epochs"]).set_index(["framework", "precision"])
    note = full.loc[("torch", "bf16"), "speed_note"]
    assert "one seed" in note and "also its own steps stalled (torch-" in note and "p99 step" in note, note
    assert "its own steps stalled" not in full.loc[("torch", "fp16"), "speed_note"]


def test_time_to_target_notes_say_whose_they_are():
    """Re-audit: two rows' ⚠ reasons ran together in one sentence without saying which row each belonged to."""
    from amp_compare.harness.report.findings import _row_notes

    rows = pd.DataFrame({"framework": ["torch", "tf", "tf"], "precision": ["bf16", "bf16", "fp16"],
                         "ttt_note": ["noisy: interval 0.37–1.39×", "machine drift could explain it", ""]})
    assert _row_notes(rows, "ttt_note") == (" ⚠: PyTorch bf16: noisy: interval 0.37–1.39×; Keras (TF) bf16: machine "
                                            "drift could explain it.")
    assert _row_notes(rows.assign(ttt_note="one seed"), "ttt_note") == " ⚠: one seed."


def test_a_stalled_cell_is_named_only_where_it_moves_the_ratio_its_way():
    """Re-audit: a stalled fp32 baseline was named beside a slowdown, which a slower fp32 cell cannot explain."""
    from types import SimpleNamespace

    from amp_compare.harness.report.tables import own_stalls

    def row(cell):
        return SimpleNamespace(cell_id=cell, throughput_img_s=np.nan, median_step_throughput_img_s=np.nan)

    steady, stalled = np.full(50, 0.01), np.r_[np.full(45, 0.01), np.full(5, 0.2)]
    pairs = [(row("fp32-s0"), row("bf16-s0"))]
    assert own_stalls(pairs, {"fp32-s0": stalled, "bf16-s0": steady}, ratio=0.5) == ""
    assert "fp32-s0" in own_stalls(pairs, {"fp32-s0": stalled, "bf16-s0": steady}, ratio=1.5)
    assert "bf16-s0" in own_stalls(pairs, {"fp32-s0": steady, "bf16-s0": stalled}, ratio=0.5)
