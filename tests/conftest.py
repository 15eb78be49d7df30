import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import filelock
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# One thread per framework child and per xdist worker (--threads' default follows it): two workers on two
# cores, each with children of two OpenMP threads, made the threads wait and spin for each other's cores
# (docs/DEVELOPMENT.md, "The test suite").
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
# The twins' pre-imported parents kept across the suite's compares (harness/run/forkserver.py, AMP_COMPARE_PARENTS):
# about 6-9 CPU-seconds of framework imports a compare saved. Made by the first process (pytest-xdist's controller,
# whose workers inherit it), which stops the parents at its end.
_PARENTS = None if os.environ.get("AMP_COMPARE_PARENTS") else tempfile.mkdtemp(prefix="amp-compare-parents-")
if _PARENTS:
    os.environ["AMP_COMPARE_PARENTS"] = _PARENTS


def pytest_unconfigure(config):
    if _PARENTS:
        for pidfile in Path(_PARENTS).glob("*.pid"):
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)  # each removes its socket and exits
            except (OSError, ValueError):
                pass
        shutil.rmtree(_PARENTS, ignore_errors=True)
# simple_cnn only: the CPU default adds the vit (its cells would double this fixture's time); tests/test_vit.py
# runs the vit through both children's train() and the report's vit parts
TINY_ARGS = ["--models", "simple_cnn", "--datasets", "synthetic", "--epochs", "2", "--steps-per-epoch", "3",
             "--batch-size", "16", "--warmup-steps", "1", "--seeds", "0", "--run-id", "tiny", "--device", "cpu",
             "--trial-budget-s", "2"]  # the trials run their least (one mirrored pair of rounds) in a tiny run


@pytest.fixture
def test_models():
    """The test-only models (tests/model_registry.py) registered while a test runs: a module that parametrises
    over every model marks its tests with it."""
    from tests.model_registry import registered

    with registered():
        yield


def artifacts_dir() -> Path:
    """Where tests leave files for people to look at (screenshots, measured differences)."""
    path = Path(os.environ.get("AMP_COMPARE_ARTIFACTS", ROOT / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def shared_dir(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this session sees (the session's own basetemp without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One tiny real compare (both frameworks x fp32/fp16/bf16, a few steps), shared by the tests that read it.

    Run once per session even under pytest-xdist: the first worker that needs it runs it under a file
    lock and leaves its exit status and output beside it; the other workers wait on the lock and read them.
    Tests only read this run; the ones that change a run change a copy.
    """
    root = shared_dir(tmp_path_factory) / "tiny-compare"
    root.mkdir(exist_ok=True)
    out, result = root / "reports", root / "result.json"
    with filelock.FileLock(str(root / ".lock"), timeout=900):
        if not result.exists():
            proc = subprocess.run([sys.executable, "-m", "amp_compare", "compare", *TINY_ARGS, "--out", str(out)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=600)
            result.write_text(json.dumps({"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout,
                                          "stderr": proc.stderr}))
    proc = subprocess.CompletedProcess(**json.loads(result.read_text()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out / "tiny"


# Under pytest-xdist (nox -s tests: -n 3 --dist loadfile --no-loadscope-reorder) whole files go to the
# workers in this order, longest first, so that no long file starts last and keeps one core busy alone.
# test_end_to_end.py first: it runs the shared tiny compare that other files read; the next two need no tiny
# compare (the other workers start on them instead of waiting on its lock). The order follows each file's
# measured worker time on the AVX2-only EPYC (the fault tests, the combined report, the Keras
# backends' parity children, the vit's four trainings per framework, the data-parallel compares first).
# Without xdist the order is pytest's.
LONG_FIRST = ["test_end_to_end.py", "test_keras_backends.py", "test_vit.py", "test_faults.py", "test_measurements.py",
              "test_data_parallel.py", "test_launchers.py", "test_parity.py", "test_speed.py", "test_perf.py",
              "test_memory_resolution.py", "test_maxbatch.py", "test_amp_modes.py", "test_device_mode.py",
              "test_install.py", "test_cli.py", "test_gpu_check.py", "test_fp8_reference.py", "test_answer.py",
              "test_numerics.py", "test_vitnaive_report.py", "test_speed_marks.py", "test_accuracy_stats.py",
              "test_figures.py", "test_browser.py"]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(LONG_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable: same order within a file


@pytest.fixture
def unsaved_figures(monkeypatch):
    """Figures drawn as a report draws them, then closed unwritten: writing each to PNG and SVG is most of a
    figure's time, and a test that reads only what make_figures returns (captions, labels) needs no file. The
    files themselves are checked on the shared tiny compare (tests/test_end_to_end.py) and tests/test_figures.py."""
    import matplotlib.pyplot as plt

    from amp_compare.harness.report import figures

    monkeypatch.setattr(figures, "_save", lambda fig, out_dir, key: plt.close(fig))
