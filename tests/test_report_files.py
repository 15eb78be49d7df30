"""What a reader receives: report files anyone can open (the usual file mode), and a terminal summary that
fits the terminal it is printed on."""

import io
import os
import stat
from contextlib import contextmanager

import pandas as pd
import pytest

from amp_compare.contract.atomic import atomic_write_text, usual_file_mode
from amp_compare.contract.records import atomic_write_table
from amp_compare.harness.report.terminal import print_summary


@contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_atomic_writes_get_the_usual_mode_not_mkstemps_0600(tmp_path, mask):
    with _umask(mask):
        assert usual_file_mode() == 0o666 & ~mask
        atomic_write_text(tmp_path / "index.html", "<p>hi</p>")
        atomic_write_table(tmp_path / "run.parquet", pd.DataFrame({"a": [1]}))
        atomic_write_table(tmp_path / "run.csv", pd.DataFrame({"a": [1]}))
    for name in ("index.html", "run.parquet", "run.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind


def test_every_file_of_a_report_gets_the_usual_mode(tiny_run):
    """index.html, summary.md, manifest.json, data/*, figures/*, reports/index.html and the cells' records."""
    _, run_dir = tiny_run
    expected = usual_file_mode()  # the fixture's compare ran under this process's umask
    files = [p for p in run_dir.rglob("*") if p.is_file()] + [run_dir.parent / "index.html"]
    wrong = {str(p.relative_to(run_dir.parent)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
             if stat.S_IMODE(p.stat().st_mode) != expected}
    assert len(files) > 20 and not wrong, wrong


def _runs(seeds=3, precisions=("fp32", "fp16", "bf16", "fp16-noscale", "fp16-static"), machines=("",)):
    rows = []
    for machine in machines:
        for fw in ("torch", "tf"):
            for i, prec in enumerate(precisions):
                for seed in range(seeds):
                    rows.append({"machine": machine, "framework": fw, "model": "resnet18", "dataset": "synthetic_cifar",
                                 "precision": prec, "seed": seed, "status": "ok",
                                 "throughput_img_s": 12345.6 / (i + 1) * (1 + 0.01 * seed),
                                 "peak_memory_bytes": (2048.5 - 100 * i) * 2**20 * (1 + 0.001 * seed),
                                 "final_val_accuracy": 0.9123 - 0.01 * i - 0.003 * seed, "skipped_steps": 3 * i,
                                 "cell_id": f"{machine}{fw}-{prec}-{seed}", "memory_kind": "rss", "cfg_device": "cpu"})
    df = pd.DataFrame(rows)
    return df if len(machines) > 1 else df.drop(columns="machine")


def test_the_terminal_prints_brackets_as_text_not_as_markup(tmp_path):
    # "[-1.0, +1.0]" printed as rich markup would be read as a style tag and vanish
    from rich.console import Console

    from amp_compare.harness.report import verdicts
    from amp_compare.harness.report.render import Rendered

    v = pd.DataFrame([{"model": "m", "dataset": "d", "step_loop": "plain", "batch_size": 8.0, "framework": "torch",
                       "precision": "bf16", "metric": "accuracy", "estimate": 0.0, "low": -1.0, "high": 1.0,
                       "margin": 1.0, "unit": "pp", "interval_kind": "newcombe 95%", "status": "same",
                       "reason": "within_floor", "evidence": "{}"}], columns=verdicts.COLUMNS)
    console = Console(width=80, file=io.StringIO(), color_system=None)
    print_summary(console, "t", Rendered(tmp_path / "index.html", None, [], answer="[min–max 1–2]", verdicts=v))
    text = console.file.getvalue()
    assert "[min–max 1–2]" in text and "+0.0 pp same" in text and str(tmp_path / "index.html") in text
