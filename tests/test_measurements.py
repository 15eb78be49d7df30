"""Repeats with spread, the timing table, and combined reports of several runs."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from amp_compare.harness.report.render import render_combined

ROOT = Path(__file__).resolve().parent.parent


def test_repeats_give_medians_with_spread(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "amp_compare", "compare", "--frameworks", "torch", "--models", "simple_cnn",
         "--precisions", "fp32",
         "--repeats", "3", "--datasets", "synthetic", "--epochs", "2", "--steps-per-epoch", "4", "--batch-size", "16",
         "--warmup-steps", "1", "--device", "cpu", "--no-figures", "--out", str(tmp_path), "--run-id", "rep"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = pd.read_parquet(tmp_path / "rep/data/run.parquet")
    assert sorted(runs["seed"]) == [0, 1, 2]
    md = (tmp_path / "rep/summary.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| PyTorch")]
    assert len(rows) == 1 and all("| 3 |" in r for r in rows)
    assert all("[" in r and "–" in r for r in rows)  # interquartile ranges next to the medians
    html = (tmp_path / "rep/index.html").read_text()
    assert "medians over 3 seeds (0, 1, 2)" in html and "Images/s from epoch time" in html and "p99 (ms)" in html


def test_combined_report_has_the_machine_in_every_figure(tiny_run, tmp_path, unsaved_figures):
    """Every figure drawn over both runs and placed in the page; drawn, not written (unsaved_figures: writing PNG
    and SVG is half their time here), since the tiny compare's own files are checked in test_end_to_end.py."""
    _, run_dir = tiny_run
    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    index = render_combined([run_dir, other], tmp_path / "combined")
    runs = pd.read_csv(tmp_path / "combined/data/run.csv")
    assert runs["machine"].nunique() == 2 and len(runs) == 12
    assert runs["cell_id"].is_unique
    html = index.read_text()
    assert "Combined report of 2 runs" in html and html.count("<h2") >= 9
    for key in ("memory", "loss_curves", "loss_scale"):
        assert f'src="figures/{key}.png"' in html  # a figure is on the page once make_figures has drawn it
    md = (tmp_path / "combined/summary.md").read_text()
    assert "| Machine |" in md


def test_find_max_batch_on_cpu_with_a_cap(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "amp_compare", "compare", "--frameworks", "torch", "--models", "simple_cnn",
         "--precisions", "fp32",
         "--datasets", "synthetic", "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "16", "--seeds", "0",
         "--device", "cpu", "--find-max-batch", "--memory-cap", "700MiB", "--max-batch-limit", "64", "--no-figures",
         "--out", str(tmp_path), "--run-id", "mb"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    search = pd.read_parquet(tmp_path / "mb/maxbatch/torch-fp32.parquet")
    # one probe (each is a child that imports torch): the search starts at 64, and the limit, 64, ends it there (the
    # doubling and bisection: test_maxbatch.py, with fake probes and with real ones)
    assert list(search["batch"]) == [64] and search["ok"].all()
    max_ok = int(search["max_ok"].iloc[0])
    assert max_ok == 64 and search["first_failed"].isna().all()
    assert (search.loc[search["ok"], "peak_bytes"] <= 700 * 2**20).all()
    html = (tmp_path / "mb/index.html").read_text()
    # its figure is drawn in test_perf.py::test_max_batch_search_stops_at_its_time_budget_and_says_so
    assert "Largest batch that fit" in html and re.search(rf">\s*{max_ok}\s*<", html)


def test_bad_memory_cap_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "amp_compare", "compare", "--find-max-batch", "--memory-cap", "lots",
                           "--out", str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "lots" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
