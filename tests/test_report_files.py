"""What a reader receives: report files anyone can open (the usual file mode), and a terminal summary that
fits the terminal it is printed on."""

import io
import os
import re
import stat
from contextlib import contextmanager

import pandas as pd
import pytest

from amp_compare.contract.atomic import atomic_write_text, usual_file_mode
from amp_compare.contract.records import atomic_write_table
from amp_compare.harness.report.tables import formatted_summary, summary_table
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


def _printed(runs: pd.DataFrame, width: int) -> str:
    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), color_system=None)
    print_summary(console, "amp-compare summary (test)", runs, ["A finding."])
    return console.file.getvalue()


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("kind", ["three seeds, five precisions", "one seed", "two machines"])
def test_terminal_summary_fits_the_terminal_without_cutting_a_value(width, kind):
    runs = {"three seeds, five precisions": lambda: _runs(),
            "one seed": lambda: _runs(seeds=1, precisions=("fp32", "fp16", "bf16")),
            "two machines": lambda: _runs(machines=("NVIDIA H100 80GB HBM3 · 20261122-run-cuda",
                                                    "AMD EPYC 7B12 · 20261122-run-cpu"))}[kind]()
    text = _printed(runs, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in text  # nothing cut to "Fram…", "PyTo…"
    # Every row shows the report's own strings: framework and precision whole, medians as the report prints them.
    summary = formatted_summary(summary_table(runs))
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines if re.match(r"^\s*(PyTorch|Keras \(TF\))\s", line)]
    assert len(rows) == len(summary)
    for cells, (_, expected) in zip(rows, summary.iterrows()):
        assert cells[:2] == [expected["Framework"], expected["Precision"]]
        shown = [re.sub(r" \[.*\]$", "", str(v)) for v in expected]
        assert all(c in shown or c in map(str, expected) for c in cells), (cells, list(expected))
        assert "Images/s" in text and expected["Speed vs fp32"] in cells
    if kind == "two machines":  # each machine's rows under a title naming it
        assert "NVIDIA H100 80GB HBM3 · 20261122-run-cuda" in text and "AMD EPYC 7B12" in text
    if width == 100 and kind != "two machines":
        assert "Peak" in text  # 100 columns keep the memory column


def test_wide_terminal_gets_the_full_table_with_ranges():
    text = _printed(_runs(), 200)
    assert "[" in text and "Skipped" in text and "The report also shows" not in text


def test_the_terminal_prints_the_reports_brackets_as_text_not_as_markup():
    # "[min–max …]" starts with a letter: printed as rich markup it was read as a style tag and vanished
    text = _printed(_runs(), 200)
    assert "[min–max 6,173–6,296]" in text
    from rich.console import Console

    console = Console(width=200, file=io.StringIO(), color_system=None)
    print_summary(console, "t", _runs(), ["bf16 at 1.31× [95% t over 2 seeds: 1.26–1.36; seeds 1.30–1.31]."])
    assert "[95% t over 2 seeds: 1.26–1.36; seeds 1.30–1.31]" in console.file.getvalue()
