"""A tiny real compare: both frameworks, all three precisions, a few steps each, then the report."""

import os
import re

import numpy as np
import pandas as pd

from amp_compare.contract.config import DEFAULT_PRECISIONS as PRECISIONS

FIGURES = ["speed_verdicts", "memory", "loss_curves", "loss_scale", "underflow"]


def test_tiny_compare_writes_records_and_report(tiny_run):
    proc, run_dir = tiny_run
    out = run_dir.parent
    assert proc.stdout.strip().endswith(str(run_dir / "index.html"))
    assert proc.returncode == 0  # every cell finished
    assert proc.stderr.strip().splitlines()[-1].startswith("amp-compare: 6 of 6 cells finished, 0 failed in ")
    runs = pd.read_parquet(run_dir / "data" / "run.parquet")
    assert sorted(runs["status"]) == ["ok"] * 6
    # data/run's MFU is the report's: against the run's one ceiling per device and dtype, not each cell's own timing
    dtype = runs["ceiling_dtype"].str.split(" ").str[0]
    assert (runs["ceiling_flops"] == runs.groupby(dtype)["ceiling_flops_measured"].transform("max")).all()
    assert np.allclose(runs["mfu_measured"], runs["achieved_flops"] / runs["ceiling_flops"])
    assert set(zip(runs["framework"], runs["precision"])) == {(f, p) for f in ("torch", "tf") for p in PRECISIONS}
    steps = pd.read_parquet(run_dir / "data" / "steps.parquet")
    assert steps.groupby("cell_id").size().eq(6).all()
    fp16 = steps[steps["precision"] == "fp16"]
    assert (fp16["loss_scale"] == 2.0**15).all()  # aligned initial scale, no overflow in 6 steps
    assert (steps[steps["precision"] != "fp16"]["loss_scale"] == 1.0).all()
    epochs = pd.read_parquet(run_dir / "data" / "epochs.parquet")
    assert epochs.groupby("cell_id").size().eq(2).all() and epochs["val_accuracy"].between(0, 1).all()
    for key in FIGURES:
        for ext in ("png", "svg"):
            assert (run_dir / "figures" / f"{key}.{ext}").stat().st_size > 1000, key
    html = (run_dir / "index.html").read_text()
    assert 'href="#glossary"' in html  # every section is in the navigation
    assert "&lt;table" not in html and html.count("<table") >= 4  # tables render as HTML, not escaped text
    for key in FIGURES:
        assert f'src="figures/{key}.png"' in html
    # under the answer: the speed verdicts drawn (the trials'), the other figures inside the rest
    assert html.index('src="figures/speed_verdicts.png"') < html.index('<details class="rest">') \
        < html.index('src="figures/memory.png"')
    for section in ("Summary", "Speed", "Memory", "Accuracy", "Numerics", "Framework differences",
                    "Environment", "Glossary", "Reproduce", "Appendix"):
        assert f">{section}</h2>" in html
    md = (run_dir / "summary.md").read_text()
    assert md.count("| PyTorch | simple_cnn |") == 3 and md.count("| Keras (TF) | simple_cnn |") == 3  # full table
    assert (out / "index.html").read_text().count("tiny/index.html") == 1
    # The per-model verdict table, one row per framework x mixed precision, in summary.md and the terminal alike:
    # the terminal's cell is the Markdown cell without its interval and reason (each of its words is in it).
    verdict_rows = [cells for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in md.splitlines())
                    if len(cells) > 2 and cells[0] in ("PyTorch", "Keras (TF)") and cells[1] in ("fp16", "bf16")]
    row = re.compile(r"^\s*(torch|tf) (fp16|bf16)\s{2,}")  # the terminal names frameworks as --frameworks does
    lines = [line for line in proc.stderr.splitlines() if row.match(line)]
    terminal_rows = [re.split(r"\s{2,}", line.strip()) for line in lines]
    assert len(terminal_rows) == len(verdict_rows) == 4
    for md_cells, cells in zip(verdict_rows, terminal_rows):
        framework = {"PyTorch": "torch", "Keras (TF)": "tf"}[md_cells[0]]
        assert cells[0] == f"{framework} {md_cells[1]}" and len(cells) >= 4, (cells, md_cells)
        for shown, full in zip(cells[1:], md_cells[2:]):
            assert all(word in full for word in shown.rstrip("…").split()), (shown, full)
    # Not a terminal: rich's own width (COLUMNS, else 80), not forced wider.
    assert max(len(line) for line in lines) <= int(os.environ.get("COLUMNS", 80))

def test_every_cell_started_from_the_same_weights(tiny_run):
    _, run_dir = tiny_run
    runs = pd.read_parquet(run_dir / "data" / "run.parquet")
    assert runs["init_source"].str.startswith("shared file simple_cnn-w64-synthetic-s0.npz").all()
    assert runs["init_source"].str.endswith("(this cell)").sum() == 1
    steps = pd.read_parquet(run_dir / "data" / "steps.parquet")
    first = steps[steps["step"] == 0].set_index("cell_id")["loss"]
    # Same weights, same first batch: the first loss agrees across frameworks and precisions
    # to within half-precision forward error.
    assert first.max() - first.min() < 5e-3, first


def test_per_image_correctness_is_the_last_validation_pass(tiny_run):
    """val_correct (the paired accuracy tests' input) holds one bit per validation image, and its mean is the
    last epoch's val_accuracy. Torch takes both from one evaluation pass (equal by construction: what bites
    there is the records' packing); Keras computes val_correct in a predict pass of its own, and this fails
    when that pass compares against the wrong labels (seen: np.roll(y_val, 1))."""
    from amp_compare.contract.records import unpack_correct

    for cell in sorted((tiny_run[1] / "cells").iterdir()):
        run = pd.read_parquet(cell / "run.parquet").iloc[0]
        last = pd.read_parquet(cell / "epochs.parquet").sort_values("epoch")["val_accuracy"].iloc[-1]
        correct = unpack_correct(run["val_correct"], int(run["val_samples"]))
        assert len(correct) == int(run["val_samples"]) == 400, cell.name
        assert abs(correct.mean() - last) < 1e-6, (cell.name, correct.mean(), last)
