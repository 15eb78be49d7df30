"""Faults a long compare meets: each test asserts that no finished result is lost.

Real framework children run here (torch: ~3 s a cell); a few tests break exactly one cell of a
real matrix through tests/children/misbehave/__main__.py, which runs the real child for every other cell.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from amp_compare.contract import records
from amp_compare.harness.report.render import render
from tests.children import misbehave

ROOT = Path(__file__).resolve().parent.parent
# --no-figures: these tests read records and the report's text; drawing figures (seconds of CPU per run) is
# tested on the shared tiny compare, the combined reports and the figure tests.
# simple_cnn only: the CPU default's vit would double every matrix here (the faults are the harness's, not a model's).
# --trial-budget-s 0: a matrix with fp32 and a mixed precision would otherwise end in a speed trial of 10 s per
# framework (tests/test_trials.py and the shared tiny compare test the trials); these tests read the cells.
TINY = ["--models", "simple_cnn", "--datasets", "synthetic", "--steps-per-epoch", "3", "--batch-size", "16",
        "--warmup-steps", "1", "--device", "cpu", "--no-figures", "--trial-budget-s", "0"]


def _compare(out: Path, *args: str, env: dict | None = None, wait: bool = True):
    cmd = [sys.executable, "-m", "amp_compare", "compare", "--out", str(out), *args]
    if wait:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


# The real harness (amp_compare.harness.run.compare.main) in a process of its own, whose torch cells run through
# tests/children/misbehave/__main__.py: the cell whose id contains `cell` misbehaves (`mode`), every other
# cell runs the real torch child. SIGINT gets Python's own handler (Ctrl-C in a terminal): a suite started
# in the background by a non-interactive shell inherits SIGINT ignored, and the interrupt test then hung.
HARNESS = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
           "from amp_compare.harness.run import runner; "
           "runner.FRAMEWORK_MODULES['torch'] = 'tests.children.misbehave'; "
           "from amp_compare.harness.run.compare import main; sys.exit(main(sys.argv[1:]))")


def _misbehave(out: Path, cell: str, mode: str = "hang") -> None:
    """Which cell of the runs under `out` misbehaves, and how: written where the stand-in reads it at the cell's start
    (tests/children/misbehave), not in the environment, which would name a pre-imported parent of this test's own
    (a torch import): every test's stand-in cells fork from one."""
    out.mkdir(parents=True, exist_ok=True)
    (out / misbehave.SPEC).write_text(json.dumps({"mode": mode, "cell": cell}))


def _harness(out: Path, *args: str, cell: str, mode: str = "hang") -> subprocess.Popen:
    _misbehave(out, cell, mode)
    return subprocess.Popen([sys.executable, "-c", HARNESS, "compare", "--out", str(out), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _runs(run_dir: Path) -> pd.DataFrame:
    return records.read_run(run_dir, warn=lambda m: None)["run"].set_index("cell_id")


def _wait_for(predicate, timeout: float = 300.0, what: str = "") -> None:
    """Event-driven wait: poll for a file or process, with a generous limit (a busy machine is slow)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.1)


def _child_pid(cell: str, where: Path) -> int | None:
    """The child training `cell` of the run under `where` (this test's own folder: other tests, xdist workers and
    other checkouts on the machine run children of the same cell ids at the same time): the process whose stderr
    is that cell's stderr.log (a cell forked from its twin's pre-imported parent has the parent's command line)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                err = os.readlink(proc / "fd" / "2")
            except OSError:
                continue
            if err.startswith(str(where)) and err.endswith("stderr.log") and cell in Path(err).parent.name:
                return int(proc.name)
    return None


def test_sigkill_of_a_child_mid_run_loses_nothing(tmp_path):
    out = tmp_path / "reports"
    cell = "torch-simple_cnn-synthetic-fp32-s1"  # hangs mid-run until killed from outside
    proc = _harness(out, "--frameworks", "torch", "--precisions", "fp32", "--seeds", "0,1,2", "--epochs", "1",
                    "--run-id", "k", *TINY, cell=cell)
    _wait_for(lambda: _child_pid(cell, out) is not None, what=f"the child of {cell}")
    pid = _child_pid(cell, out)
    ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    assert b"amp_compare.kit.zygote" in Path(f"/proc/{ppid}/cmdline").read_bytes()  # forked (harness/run/forkserver)
    os.kill(pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 3, stderr[-2000:]  # some cells failed: not 0, not a crash
    assert stderr.strip().splitlines()[-1].startswith("amp-compare: 2 of 3 cells finished, 1 failed"), stderr
    runs = _runs(out / "k")
    assert runs.loc[cell, "status"] == "failed" and runs.loc[cell, "error"] == "killed by signal SIGKILL"
    assert (runs.drop(cell)["status"] == "ok").all() and len(runs) == 3
    html = (out / "k" / "index.html").read_text()
    assert f"{cell} (failed)" in html and "killed by signal SIGKILL" in html
    assert "Figures were not drawn for this run (--no-figures)" in html and "<img" not in html
    assert not (out / "k" / "figures").exists()


def test_timeout_fails_one_cell_and_the_matrix_goes_on(tmp_path, monkeypatch, capsys):
    from amp_compare.harness.run import runner

    monkeypatch.setitem(runner.FRAMEWORK_MODULES, "torch", "tests.children.misbehave")
    _misbehave(tmp_path, "-bf16-")
    from amp_compare.harness.run.compare import main

    rc = main(["compare", "--out", str(tmp_path), "--frameworks", "torch", "--precisions", "bf16,fp32",
               "--epochs", "1", "--run-id", "t", "--timeout", "12", "--seeds", "0", *TINY])
    assert rc == 3
    assert "1 of 2 cells finished, 1 failed" in capsys.readouterr().err.strip().splitlines()[-1]
    runs = _runs(tmp_path / "t")
    assert runs.loc["torch-simple_cnn-synthetic-bf16-s0", "error"] == "timed out after 12 s"
    assert runs.loc["torch-simple_cnn-synthetic-fp32-s0", "status"] == "ok"


def test_diverging_configuration_is_a_result_not_a_crash(tmp_path):
    proc = _compare(tmp_path, "--precisions", "fp32", "--optimizer", "sgd", "--lr", "1e8", "--diverge-after", "3",
                    "--epochs", "2", "--run-id", "d", "--seeds", "0", *TINY)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = _runs(tmp_path / "d")
    assert set(runs["status"]) == {"diverged"}
    assert (runs["diverged_at_step"] >= 0).all()
    # Either watch may fire first: the loss non-finite for --diverge-after steps (training stops early), or
    # weights non-finite while the loss stays finite (max-pooling can keep it so; found after the last step).
    reasons = runs["error"].str.extract(r"(non-finite loss for 3 consecutive steps from step|non-finite weights)")[0]
    assert reasons.notna().all(), runs["error"].tolist()
    steps = records.read_run(tmp_path / "d")["steps"].set_index("cell_id")
    for cell, reason in reasons.items():
        if reason.startswith("non-finite loss"):
            assert len(steps.loc[[cell]]) < 6  # stopped early
    assert "diverged" in (tmp_path / "d" / "index.html").read_text()


def _interrupt(tmp_path: Path, sig: int, run_id: str) -> tuple[subprocess.Popen, str, Path]:
    """A two-cell run stopped by `sig` while its second cell (a child that hangs) runs."""
    proc = _harness(tmp_path, "--frameworks", "torch", "--precisions", "fp32,bf16", "--epochs", "2", "--seeds", "0",
                    "--run-id", run_id, *TINY, cell="-bf16-")
    first = tmp_path / run_id / "cells/torch-simple_cnn-synthetic-fp32-s0/run.parquet"
    _wait_for(lambda: first.exists() and _child_pid("bf16-s0", tmp_path / run_id) is not None,
              what="the second cell")
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=300)
    return proc, stderr, first


def test_interrupted_compare_resumes_to_what_a_clean_run_gives(tiny_run, tmp_path):
    # The clean run: the shared tiny compare (tests/conftest.py), whose torch fp32/bf16 cells have this run's
    # settings (TINY, two epochs, seed 0; its torch fp32 cell makes the shared initial weights, as here).
    proc, stderr, first = _interrupt(tmp_path, signal.SIGINT, "cut")
    assert proc.returncode == 130, stderr[-2000:]
    assert "python -m amp_compare compare --resume cut" in stderr
    kept = first.read_bytes()
    assert not (tmp_path / "cut/cells/torch-simple_cnn-synthetic-bf16-s0/run.parquet").exists()
    resumed = _compare(tmp_path, "--resume", "cut", "--no-figures")  # the real child this time
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "1 cells on cpu" in resumed.stderr
    assert first.read_bytes() == kept  # the finished cell was not touched
    cells = ["torch-simple_cnn-synthetic-fp32-s0", "torch-simple_cnn-synthetic-bf16-s0"]
    clean = records.read_run(tiny_run[1])
    a = {name: clean[name][clean[name]["cell_id"].isin(cells)] for name in ("run", "steps", "epochs")}
    b = records.read_run(tmp_path / "cut")
    assert sorted(a["run"]["cell_id"]) == sorted(b["run"]["cell_id"]) == sorted(cells)
    assert sorted(a["run"]["status"]) == sorted(b["run"]["status"]) == ["ok", "ok"]
    key = ["cell_id", "step"]
    la = a["steps"].sort_values(key)["loss"].to_numpy()
    lb = b["steps"].sort_values(key)["loss"].to_numpy()
    np.testing.assert_allclose(la, lb, rtol=1e-6)  # same data, same initial weights, same numbers
    acc = [df["epochs"].sort_values(["cell_id", "epoch"])["val_accuracy"].to_numpy() for df in (a, b)]
    np.testing.assert_array_equal(*acc)


def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    proc, stderr, first = _interrupt(tmp_path, signal.SIGTERM, "term")
    assert proc.returncode == 143, stderr[-2000:]
    assert "Terminated: 1 finished cells are kept" in stderr and "--resume term" in stderr
    assert first.exists() and (tmp_path / "term" / "index.html").exists()  # report rendered from what finished
    # The child was stopped, not left training (its hang lasts 600 s): a killed process can take a moment to
    # leave /proc on a busy machine, so wait for that, with a generous limit.
    _wait_for(lambda: _child_pid("bf16-s0", tmp_path / "term") is None, timeout=60, what="the child to be stopped")
    assert not (tmp_path / "term/cells/torch-simple_cnn-synthetic-bf16-s0/run.parquet").exists()


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "reports" / run_dir.name
    shutil.copytree(run_dir, copy)
    (copy / ".lock").unlink(missing_ok=True)
    return copy


def test_resume_reruns_cells_whose_tables_are_not_all_readable_and_complete(tiny_run, tmp_path):
    copy = _copy(tiny_run[1], tmp_path)
    corrupt, short = "torch-simple_cnn-synthetic-fp32-s0", "torch-simple_cnn-synthetic-bf16-s0"
    steps = copy / "cells" / corrupt / "steps.parquet"
    steps.write_bytes(steps.read_bytes()[: len(steps.read_bytes()) // 2])  # run.parquet still reads "ok"
    epochs = copy / "cells" / short / "epochs.parquet"
    pd.read_parquet(epochs).head(1).to_parquet(epochs)  # readable, but one of its two epochs
    untouched = {p: p.read_bytes() for p in (copy / "cells").glob("tf-*/*.parquet")}
    proc = _compare(copy.parent, "--resume", copy.name, "--no-figures")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 cells on cpu" in proc.stderr
    tables = records.read_run(copy)
    assert len(tables["run"]) == 6 and set(tables["run"]["status"]) == {"ok"}
    assert tables["steps"].groupby("cell_id").size().eq(6).all()
    assert tables["epochs"].groupby("cell_id").size().eq(2).all()
    assert all(p.read_bytes() == data for p, data in untouched.items())


def test_corrupt_manifest_is_one_line_in_report_and_resume(tiny_run, tmp_path):
    copy = _copy(tiny_run[1], tmp_path)
    manifest = copy / "manifest.json"
    manifest.write_text(manifest.read_text()[:200])  # truncated
    for cmd in (["report", str(copy)], ["compare", "--resume", copy.name, "--out", str(copy.parent)]):
        proc = subprocess.run([sys.executable, "-m", "amp_compare", *cmd], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "manifest.json' is unreadable or incomplete" in proc.stderr and "restore manifest.json" in proc.stderr


def test_a_second_compare_of_a_locked_run_is_refused(tiny_run, tmp_path):
    import filelock

    copy = _copy(tiny_run[1], tmp_path)
    before = sorted(p.name for p in (copy / "cells").iterdir())
    with filelock.FileLock(str(copy / ".lock"), timeout=0):  # held as a running compare/resume holds it
        proc = _compare(copy.parent, "--resume", copy.name)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "is in use by another compare or --resume" in proc.stderr
    assert sorted(p.name for p in (copy / "cells").iterdir()) == before


def test_corrupt_record_among_good_ones(tiny_run, tmp_path):
    _, run_dir = tiny_run
    copy = tmp_path / "reports" / "tiny"
    shutil.copytree(run_dir, copy)
    bad = copy / "cells" / "tf-simple_cnn-synthetic-fp16-s0" / "steps.parquet"
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])  # truncated mid-write by some fault
    warnings: list[str] = []
    tables = records.read_run(copy, warn=warnings.append)
    assert len(tables["run"]) == 5 and "tf-simple_cnn-synthetic-fp16-s0" in warnings[0]
    render(copy, figures=False)  # the page's text is what it reads
    html = (copy / "index.html").read_text()
    assert "tf-simple_cnn-synthetic-fp16-s0 (missing)" in html
    assert html.count("simple_cnn-synthetic-") >= 5


def test_framework_that_fails_to_import_is_unavailable_and_the_rest_runs(tmp_path):
    fake = tmp_path / "fake" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('simulated broken TensorFlow install')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"))
    proc = _compare(tmp_path / "reports", "--precisions", "fp32", "--epochs", "1", "--run-id", "u", "--seeds", "0",
                    *TINY, env=env)
    assert proc.returncode == 3, proc.stderr[-2000:]  # a cell did not finish: a CI script can tell
    runs = _runs(tmp_path / "reports" / "u")
    assert runs.loc["tf-simple_cnn-synthetic-fp32-s0", "status"] == "unavailable"
    assert "simulated broken TensorFlow install" in runs.loc["tf-simple_cnn-synthetic-fp32-s0", "error"]
    assert runs.loc["torch-simple_cnn-synthetic-fp32-s0", "status"] == "ok"
    assert "tf-simple_cnn-synthetic-fp32-s0 (unavailable)" in (tmp_path / "reports/u/index.html").read_text()
