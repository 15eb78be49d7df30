"""Every place a training cells' speed ratio appears says what it measured and carries no verdict of its own (speed
verdicts are the speed trials', verdicts.py): the runs index, the time-to-accuracy caption, the same-epoch
sentence. Synthetic runs (tests/test_report_sentences.write_run), rendered as a compare
renders them."""

import html as html_lib

import pandas as pd

from amp_compare.contract import records
from amp_compare.harness.report import figures
from amp_compare.harness.report.tables import accuracy_statistics
from tests.test_report_sentences import make_run, write_run

# torch bf16's seeds disagree on the side of 1; fp16's 8x slowdown in every seed
SPEEDS = {("torch", "bf16"): [1.6, 0.7, 1.2], ("torch", "fp16"): [0.12, 0.11, 0.13]}


def test_the_runs_index_carries_no_wall_time_warning(tmp_path):
    rendered, _ = make_run(tmp_path, speeds=SPEEDS)
    full = rendered.table.set_index(["framework", "precision"])
    assert "speed_note" not in full
    index = html_lib.unescape((tmp_path / "index.html").read_text())
    # the runs index gives each run's answer (its verdict table), not the cells' throughput beside it (audits)
    assert "use simple_cnn/synthetic: PyTorch fp32" in index and "fp32 speed" not in index, index
    assert "⚠" not in index


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
    assert computed == [run_dir] and "use simple_cnn/synthetic: PyTorch fp32" in html_lib.unescape(
        (tmp_path / "index.html").read_text())


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
