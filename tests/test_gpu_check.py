"""benchmarks/gpu_check.py's plumbing on a CPU: what comes back (few files, plain names, flat), the table's
columns from a real compare run, the phase limits and the budget, and that a stopped phase leaves no process.

The whole check with tiny settings (`run --device cpu --smoke`, training included) is behind
AMP_COMPARE_GPU_CHECK_SMOKE=1: it costs about half a minute here, more than the suite's budget allows.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import gpu_check
from tests.conftest import ROOT

SCRIPT = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")]


def _run(*args, timeout=300):
    return subprocess.run([*SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _returned(out: Path) -> list[Path]:
    """What the device tool would bring back: every file, checked against its limits (<= 8 files, <= 2 folders
    down, names of letters, digits, '.', '_' and '-')."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8, files
    for p in files:
        rel = p.relative_to(out.parent)
        assert len(rel.parts) - 1 <= 2 and all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts), rel
    return files


def test_run_writes_the_few_files_that_come_back(tmp_path):
    """The tests phase for real (every gpu test skips here, with its reason), a CUDA-only phase skipped and
    named, the command for what was not run, and a table with its columns even without a cell."""
    out = tmp_path / "out" / "gpu-check"
    proc = _run("run", "--device", "cpu", "--smoke", "--no-install", "--out", str(out), "--work", str(tmp_path / "w"),
                "--phases", "tests,keras-torch-tuned")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert sorted(p.name for p in _returned(out)) == sorted(gpu_check.OUTPUT_FILES)
    check = (out / "check.md").read_text()
    assert "| tests | ok |" in check and "SMOKE RUN" in check
    assert "| keras-torch-tuned | skipped | 0 | needs CUDA:" in check
    assert "--phases keras-torch-tuned`" in check  # what to run next, on a GPU
    assert "| tuned torch bf16, batch 1024: MFU ≥ 35% | not measured |" in check
    assert "no NVIDIA GPU visible" in (out / "pytest.txt").read_text()
    assert list(pd.read_csv(out / "table.csv").columns) == gpu_check.TABLE_COLUMNS
    env = json.loads((out / "env.json").read_text())
    assert env["install"]["status"] == "skipped" and env["phases"][0]["name"] == "tests"


def test_phases_that_do_not_fit_the_budget_are_skipped_and_named(tmp_path):
    out = tmp_path / "gpu-check"
    proc = _run("run", "--device", "cpu", "--no-install", "--budget-s", "1", "--out", str(out),
                "--work", str(tmp_path / "w"), "--phases", "torch-256,keras-jax-256")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = (out / "check.md").read_text()
    for name in ("torch-256", "keras-jax-256"):
        assert f"| {name} | skipped | 0 | budget: 0 s left, the phase needs at least" in check
    assert "--phases torch-256,keras-jax-256`" in check
    bad = _run("run", "--out", str(tmp_path / "x"), "--phases", "torch-512")
    assert bad.returncode == 2 and bad.stderr.strip() == ("gpu_check: error: unknown phase 'torch-512' (valid: "
                                                          f"{', '.join(gpu_check.PHASE_NAMES)})")
    assert not (tmp_path / "x").exists()


def test_the_table_from_a_compare_run(tiny_run, tmp_path):
    _, run_dir = tiny_run
    proc = _run("table", str(run_dir), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(tmp_path / "table.csv")
    assert list(table.columns) == gpu_check.TABLE_COLUMNS
    runs = pd.read_parquet(run_dir / "data" / "run.parquet").set_index(["framework", "precision"])
    assert len(table) == len(runs) == 6
    for row in table.itertuples():
        cell = runs.loc[(row.framework, row.precision)]
        assert row.img_s == pytest.approx(cell["throughput_img_s"])
        assert row.mfu_pct == pytest.approx(cell["mfu_measured"] * 100)
        assert row.peak_memory_mib == pytest.approx(cell["peak_memory_bytes"] / 2**20)
        assert row.speedup_vs_fp32 == pytest.approx(
            cell["throughput_img_s"] / runs.loc[(row.framework, "fp32"), "throughput_img_s"])
    assert "| torch | plain | 16 | bf16 |" in proc.stdout


def test_a_stopped_phase_leaves_no_process_behind(tmp_path):
    """run_limited: a child past its limit is stopped, and a grandchild in a session of its own (as the harness
    starts framework children) is killed by the token it inherited."""
    log = gpu_check.Log()
    pid_file = tmp_path / "grandchild.pid"
    spawn = ("import subprocess, sys, time, pathlib; p = pathlib.Path(sys.argv[1]); "
             "subprocess.Popen([sys.executable, '-c', 'import os, sys, time, pathlib; "
             "pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(600)', str(p)], "
             "start_new_session=True)\n"
             "while not p.exists() or not p.read_text(): time.sleep(0.05)")  # waits for the event, then exits
    code, _, stopped = gpu_check.run_limited([sys.executable, "-c", spawn, str(pid_file)], dict(os.environ), 120,
                                             tmp_path / "a.out", log, "spawn")
    assert code == 0 and not stopped
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
        if (Path(f"/proc/{pid}/stat").exists() and
                Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")):
            break  # killed, waiting to be reaped by init
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[-1].startswith("Z"), "the grandchild still runs"
    code, seconds, stopped = gpu_check.run_limited([sys.executable, "-c", "import time; time.sleep(600)"],
                                                   dict(os.environ), 1, tmp_path / "b.out", log, "sleeper")
    assert stopped and code == -15 and seconds < 60
    assert "stopped at its time limit" in log.text()


@pytest.mark.skipif(not os.environ.get("AMP_COMPARE_GPU_CHECK_SMOKE"), reason="set AMP_COMPARE_GPU_CHECK_SMOKE=1")
def test_the_whole_check_in_smoke_mode(tmp_path):
    out = tmp_path / "gpu-check"
    proc = _run("run", "--device", "cpu", "--smoke", "--no-install", "--out", str(out), "--work", str(tmp_path / "w"),
                "--budget-s", "1800", "--phases", "tests,torch-256,keras-jax-256,keras-torch-tuned", timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    _returned(out)
    table = pd.read_csv(out / "table.csv")
    assert set(zip(table["framework"], table["precision"])) == {(f, p) for f in ("torch", "keras-jax")
                                                                for p in ("fp32", "bf16")}
    assert (table["status"] == "ok").all() and (table["img_s"] > 0).all()
    assert (table["reference_img_s"] > 0).all() and (table["reference_over_this"] > 0).all()
    check = (out / "check.md").read_text()
    assert "tuned loop skipped: its CUDA graphs need a GPU" in check
    assert check.count("torch reference loop") == 2 and check.count("bare Keras fit (jax)") == 2
    assert (out / "summaries.md").read_text().count("# phase ") == 2
