"""Peak-memory differences are said only where the run resolves them (issue 32): a difference smaller than the
larger spread of fp32's and the mixed precision's seeds (the same framework and model) in some seed is "undecided",
never a percentage; one larger in every seed is decided. Synthetic run folders rendered as a compare renders
them (no figures), in the summary table, the findings, summary.md and the terminal."""

import json

import numpy as np
import pytest

from tests.test_report_sentences import make_run, write_run

# PyTorch's fp32 seeds read as the did (36.7 / 51.4 / 43.6 MiB: a 14.7 MiB spread); its fp16 cells sit
# inside that spread, its bf16 cells far above it. Keras' cells agree to 0.5 MiB, so a 7 MiB step is resolved.
MEMORY = {("torch", "fp32"): [36.7, 51.4, 43.6], ("torch", "fp16"): [40.0, 45.0, 42.0],
          ("torch", "bf16"): [300.0, 310.0, 305.0], ("tf", "fp32"): [7.0, 7.5, 7.2],
          ("tf", "fp16"): [7.1, 7.3, 7.0], ("tf", "bf16"): [14.0, 14.2, 14.1]}


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory):
    """make_run(memory=MEMORY) once, for the tests that only read it (its render is seconds of CPU): (report.Rendered,
    the page's text, the run folder)."""
    tmp = tmp_path_factory.mktemp("memory")
    rendered, html = make_run(tmp, memory=MEMORY)
    return rendered, html, tmp / "r"


def _draw_only(monkeypatch, *groups):
    """make_figures draws only these groups of its figures (figures.py), the ones whose captions or labels a test
    reads: the others' drawing is seconds of CPU each (the loss curves of 18 cells about 5 s) and is
    checked in tests/test_figures.py and on the shared tiny compare."""
    from amp_compare.harness.report import figures

    for group in ("_memory_figures", "_loss_curve_figures", "_loss_scale_figures"):
        if group not in groups:
            monkeypatch.setattr(figures, group, lambda *args, **kwargs: [])


def _row(table, framework, precision):
    return table[(table["framework"] == framework) & (table["precision"] == precision)].iloc[0]


def test_memory_below_the_runs_resolution_is_unresolved_and_above_it_a_percentage_with_its_interval(memory_run):
    rendered, html, run_dir = memory_run
    table = rendered.table
    torch16, torch_bf16, tf16 = _row(table, "torch", "fp16"), _row(table, "torch", "bf16"), _row(table, "tf", "fp16")
    assert np.isclose(torch16["memory_resolution_mib"], 14.7) and torch16["memory_resolved"] == 0.0
    assert torch_bf16["memory_resolved"] == 1.0 and tf16["memory_resolved"] == 0.0
    assert np.isclose(_row(table, "tf", "bf16")["memory_resolution_mib"], 0.5)  # Keras' own spread, not PyTorch's
    assert not any("peak memory against fp32" in s for s in rendered.findings)  # the verdicts say it, once
    summary = (run_dir / "summary.md").read_text()
    # the per-model verdict tables word each difference once (phrases.cell), with the spread it is judged against
    assert "| -1.6 MiB undecided (within fp32's and fp16's seed-to-seed spreads, up to 14.7 MiB) |" in summary
    assert "| -0.2 MiB undecided (within fp32's and fp16's seed-to-seed spreads, up to 0.5 MiB) |" in summary
    beyond = "more memory (every seed beyond fp32's and bf16's seed-to-seed spreads, up to"
    assert f"| +261 MiB {beyond} 14.7 MiB) |" in summary and f"| +6.9 MiB {beyond} 0.5 MiB) |" in summary
    memory = rendered.verdicts[rendered.verdicts["metric"] == "memory"].set_index(["framework", "precision"])
    assert memory.loc[("torch", "fp16"), "reason"] == "unresolved_memory"
    assert memory.loc[("torch", "bf16"), "status"] == "larger"


def test_one_seed_with_no_identical_cells_anywhere_is_unresolved_not_a_percentage(tmp_path):
    rendered, _ = make_run(tmp_path, seeds=(0,), memory=MEMORY)
    row = _row(rendered.table, "torch", "bf16")  # +261 MiB, yet one reading each: the run cannot say what it resolves
    assert np.isnan(row["memory_resolution_mib"]) and row["memory_resolved"] == 0.0
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "| +263 MiB undecided (one seed, noise unknown) |" in summary


def test_a_one_seed_model_borrows_no_resolution_from_the_other_model(tmp_path):
    """The default run's shape: simple_cnn over three seeds, the ViT over one. The ViT's one reading per precision
    measures no noise of its own, and another model's spread is another measurement: every ViT difference is
    undecided (one seed), even +27.4 MiB."""
    from amp_compare.contract import records
    from amp_compare.harness.report import render as report

    torch_memory = {k: v for k, v in MEMORY.items() if k[0] == "torch"}
    cnn = write_run(tmp_path / "cnn", frameworks=("torch",), memory=torch_memory)
    vit = write_run(tmp_path / "vit", frameworks=("torch",), seeds=(0,), model="vit",
                    memory={("torch", "fp32"): [2.6], ("torch", "fp16"): [5.7], ("torch", "bf16"): [30.0]})
    for cell in (vit / "cells").iterdir():
        cell.rename(cnn / "cells" / cell.name)
    manifest = json.loads((cnn / "manifest.json").read_text())
    vit_manifest = json.loads((vit / "manifest.json").read_text())
    manifest["matrix"]["models"] += ["vit"]
    manifest["cells"] += vit_manifest["cells"]
    manifest["configs"] += vit_manifest["configs"]
    (cnn / "manifest.json").write_text(json.dumps(manifest))
    assert len(records.read_run(cnn)["run"]) == 12
    rendered = report.render(cnn, figures=False)
    table = rendered.table
    vit16 = table[(table["model"] == "vit") & (table["precision"] == "fp16")].iloc[0]
    vit_bf16 = table[(table["model"] == "vit") & (table["precision"] == "bf16")].iloc[0]
    assert np.isnan(vit16["memory_resolution_mib"]) and vit16["memory_resolved"] == 0.0
    assert vit_bf16["memory_resolved"] == 0.0
    v = rendered.verdicts
    vit = v[(v["metric"] == "memory") & (v["model"] == "vit")].set_index("precision")
    assert (vit["reason"] == "no_resolution").all() and (vit["status"] == "undecided").all()


def test_the_verdict_the_table_and_the_findings_say_the_same_of_each_memory_difference(tmp_path):
    """One rule: a difference past the run's resolution is decided (larger or smaller) in the verdict table where the
    summary table prints a percentage, and undecided where the summary says "unresolved"; the page's tables and
    summary.md word the verdict once (phrases.cell)."""
    memory = {**MEMORY, ("torch", "bf16"): [15.0, 30.0, 20.0]}  # -21.7 MiB: past its own 15 MiB spread, a wide interval
    rendered, page = make_run(tmp_path, memory=memory)
    row = _row(rendered.table, "torch", "bf16")
    assert row["memory_resolved"] == 1.0
    v = rendered.verdicts[rendered.verdicts["metric"] == "memory"].set_index(["framework", "precision"])
    assert (v.loc[("torch", "bf16"), "status"], v.loc[("torch", "fp16"), "status"]) == ("smaller", "undecided")
    summary = (tmp_path / "r" / "summary.md").read_text()
    # fp16 is judged against fp32's 14.7 MiB and its own 5 MiB, not bf16's 15 MiB
    for said in ("-22 MiB less memory",
                 "-1.6 MiB undecided (within fp32's and fp16's seed-to-seed spreads, up to 14.7 MiB)"):
        assert said in summary and said in page


def test_the_memory_figures_bar_labels_say_undecided_where_the_table_does(memory_run, tmp_path, unsaved_figures,
                                                                         monkeypatch):
    from amp_compare.contract import records
    from amp_compare.harness.report import figures
    from amp_compare.harness.report.tables import full_table

    _draw_only(monkeypatch, "_memory_figures")
    run_dir = memory_run[2]
    runs = records.read_run(run_dir)["run"]
    labels = figures._memory_labels(full_table(runs))
    by = labels.set_index(["framework", "precision"])["memory_label"]
    assert by[("torch", "fp16")] == "undecided" and by[("torch", "bf16")].startswith("+601%"), by
    assert by[("tf", "bf16")] == "+95%" and not any(v.endswith("%") for v in labels.loc[
        labels["memory_label"] == "undecided", "memory_label"])
    t = records.read_run(run_dir)
    caption = next(f for f in figures.make_figures(runs, t["steps"], tmp_path / "f")
                   if f.key == "memory").caption
    assert "some seed's difference from fp32 is within what fp32's or its own seeds differed by" in caption


def test_the_memory_figures_bar_labels_carry_the_summary_tables_warning(memory_run, tmp_path, monkeypatch):
    """The audit's memory.png: "+51%", "+65%" bare where the Summary table's Memory vs fp32 said "+51% ⚠"."""
    from amp_compare.contract import records
    from amp_compare.harness.report import figures

    rendered, _, run_dir = memory_run
    _draw_only(monkeypatch, "_memory_figures")
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, out_dir, key: drawn.setdefault(key, fig))
    t = records.read_run(run_dir)
    figures.make_figures(t["run"], t["steps"], tmp_path / "f", "cpu", rendered.table)
    labels = sorted(text.get_text() for ax in drawn["memory"].axes for text in ax.texts)
    assert labels == ["+0%", "+0%", "+601% ⚠", "+95%", "undecided", "undecided"], labels  # fp32: +0%


def test_the_bar_figures_captions_name_the_runs_per_bar_from_the_run(tmp_path, unsaved_figures, monkeypatch):
    from amp_compare.contract import records
    from amp_compare.harness.report import figures

    _draw_only(monkeypatch, "_memory_figures")
    for seeds, said in (((0,), "One run (one seed) per bar, so no error bar"),
                        ((0, 1), "interquartile range (interpolated between the 2 seeds' values)")):
        t = records.read_run(write_run(tmp_path / str(len(seeds)), seeds=seeds))
        caption = next(f for f in figures.make_figures(t["run"], t["steps"], tmp_path / "f")
                       if f.key == "memory").caption
        assert said in caption, caption
