"""benchmarks/gpu_check.py on a CPU: what `run` writes, the budget, the table from a compare run's records (the
package's summary table, the plain loop's fp32 and the reference beside it, the targets), that a stopped phase
leaves no process, and `prepare`'s diff between the check's requirements and a target's package list.

The whole check with tiny settings (`run --device cpu --smoke`, training and both reference loops included) is
behind AMP_COMPARE_GPU_CHECK_SMOKE=1: a few minutes on a 2-core CPU, more than the suite's budget allows.
"""

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import gpu_check, gpu_table, wheelhouse
from tests.conftest import ROOT

SCRIPT = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")]


def _run(*args, timeout=300):
    return subprocess.run([*SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_run_writes_its_files(tmp_path):
    """The tests phase for real (every gpu test skips here, with its reason), a CUDA-only phase skipped and
    named, the command for what was not run, and a table with its columns even without a cell."""
    out = tmp_path / "out" / "gpu-check"
    proc = _run("run", "--device", "cpu", "--smoke", "--no-install", "--out", str(out), "--work", str(tmp_path / "w"),
                "--phases", "tests,keras-torch-tuned")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_check.OUTPUT_FILES)
    check = (out / "check.md").read_text()
    assert "| tests | ok |" in check and "SMOKE RUN" in check
    assert "| keras-torch-tuned | skipped | 0 | needs CUDA:" in check
    assert "--phases keras-torch-tuned`" in check  # what to run next, on a GPU
    assert "| tuned torch bf16, batch 1024: MFU ≥ 35% | not measured |" in check
    assert "no NVIDIA GPU visible" in (out / "pytest.txt").read_text()
    columns = list(pd.read_csv(out / "table.csv").columns)
    assert {"throughput_img_s", "speedup_vs_fp32", "speedup_vs_plain_fp32", "reference_over_this", *gpu_table.EXTRA} \
        <= set(columns)
    env = json.loads((out / "env.json").read_text())
    assert env["phases"][0]["name"] == "tests" and env["smoke"] and env["references"] == []


def test_phases_that_do_not_fit_the_budget_are_skipped_and_named(tmp_path):
    out = tmp_path / "gpu-check"
    proc = _run("run", "--device", "cpu", "--no-install", "--budget-s", "1", "--out", str(out),
                "--work", str(tmp_path / "w"), "--phases", "torch-256,keras-jax-256")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = (out / "check.md").read_text()
    for name in ("torch-256", "keras-jax-256"):
        assert f"| {name} | skipped | 0 | budget: 0 s left, the phase needs at least" in check
    assert "--phases torch-256,keras-jax-256`" in check
    for bad, message in ((["--phases", "torch-512"], f"unknown phase 'torch-512' (valid: "
                                                      f"{', '.join(gpu_check.PHASE_NAMES)})"),
                         (["--budget-s", "0"], "--budget-s must be positive, got 0")):
        proc = _run("run", "--no-install", "--out", str(tmp_path / "x"), *bad)
        assert proc.returncode == 2 and proc.stderr.strip() == f"gpu_check: error: {message}"
    assert not (tmp_path / "x").exists()


def test_the_table_from_a_compare_run(tiny_run, tmp_path):
    """`table` on a real run: each row its cell's figures, the speed over fp32 the ratio of the two cells'."""
    _, run_dir = tiny_run
    proc = _run("table", str(run_dir), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(tmp_path / "table.csv")
    runs = pd.read_parquet(run_dir / "data" / "run.parquet").set_index(["framework", "precision"])
    assert len(table) == len(runs) == 6
    for row in table.itertuples():
        cell = runs.loc[(row.framework, row.precision)]
        assert row.throughput_img_s == pytest.approx(cell["throughput_img_s"])
        assert row.peak_memory_mib == pytest.approx(cell["peak_memory_bytes"] / 2**20)
        assert row.host_syncs_per_step == pytest.approx(cell["host_syncs_per_step"], nan_ok=True)
        fp32 = runs.loc[(row.framework, "fp32"), "throughput_img_s"]
        assert row.speedup_vs_fp32 == pytest.approx(cell["throughput_img_s"] / fp32)
        assert row.speedup_vs_plain_fp32 == pytest.approx(cell["throughput_img_s"] / fp32)  # every row is plain
    assert "| PyTorch | plain | 16 | bf16 |" in proc.stdout


def test_references_and_targets_from_recorded_rows(tiny_run):
    """The reference lands beside the plain torch row of its precision and batch; a target is judged from the
    rows there are (relabelled here as batch 256 and tuned, the only rows the first target reads) and "not
    measured" where there are none."""
    runs = gpu_table.read_runs([tiny_run[1]])
    table = gpu_table.build_table(runs, [{"reference": "torch reference loop", "precision": "bf16", "batch": 16,
                                          "img_s": 1000.0}])
    ref = table.set_index(["framework", "precision"])
    assert ref.loc[("torch", "bf16"), "reference_over_this"] == pytest.approx(
        1000.0 / ref.loc[("torch", "bf16"), "throughput_img_s"])
    assert ref["reference_img_s"].notna().sum() == 1
    verdicts = {name: (verdict, figures) for name, verdict, figures in gpu_table.targets(table)}
    assert verdicts["plain torch loop within 1.05× of the tutorial's loop, batch 256"] == ("not measured", "")
    tuned = gpu_table.build_table(runs.assign(step_loop="tuned", cfg_step="tuned", cfg_batch_size=256), [])
    fp16 = tuned[(tuned["framework"] == "torch") & (tuned["precision"] == "fp16")].iloc[0]
    verdict, figures = dict((n, (v, f)) for n, v, f in gpu_table.targets(tuned))[
        "tuned torch fp16, batch 256: ≥ 55,000 img/s and ≥ 8× fp32"]
    assert verdict == ("met" if fp16.throughput_img_s >= 55_000 and fp16.speedup_vs_fp32 >= 8 else "missed")
    assert figures.startswith(f"{fp16.throughput_img_s:,.0f} img/s")


def _pid_gone(pid: int, within_s: float = 30) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split(") ")[-1].startswith("Z"):  # gone, or killed and unreaped
            return True
        time.sleep(0.05)
    return False


def test_a_stopped_phase_leaves_no_process_behind(tmp_path):
    """run_limited: a child past its limit gets SIGTERM; one that ignores it is killed with its whole tree
    (launch.kill_tree), a grandchild in a session of its own (as torchrun starts workers) included."""
    log = []
    pid_file = tmp_path / "grandchild.pid"
    spawn = ("import signal, subprocess, sys, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "p = pathlib.Path(sys.argv[1]); subprocess.Popen([sys.executable, '-c', 'import os, sys, time, pathlib; "
             "pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(600)', str(p)], "
             "start_new_session=True); time.sleep(600)")
    code, seconds, stopped = gpu_check.run_limited([sys.executable, "-c", spawn, str(pid_file)], dict(os.environ), 5,
                                                   tmp_path / "a.out", log, grace_s=1)
    assert stopped and code == -signal.SIGKILL and seconds < 60
    assert _pid_gone(int(pid_file.read_text())), "the grandchild still runs"
    code, seconds, stopped = gpu_check.run_limited([sys.executable, "-c", "import time; time.sleep(600)"],
                                                   dict(os.environ), 1, tmp_path / "b.out", log)
    assert stopped and code == -signal.SIGTERM and seconds < 60
    assert "stopped at its time limit" in log[-1]


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "Metadata-Version: 2.1\nName: "
                    f"{name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_prepare_keeps_what_the_target_lacks_or_holds_too_old(tmp_path):
    have = wheelhouse.installed("Package    Version\n---------- -------\nnumpy      2.1.0\ntorch 2.11.0+cu130\n"
                                "typing_extensions==4.12.2\nrich==13.9.4\n")
    assert have == {"numpy": "2.1.0", "torch": "2.11.0+cu130", "typing-extensions": "4.12.2", "rich": "13.9.4"}
    assert wheelhouse.unmet(["numpy>=2.0", "torch>=2.4", "rich>=14", "keras>=3.15,<4",
                             "tomli; python_version < '3.11'"], have, "3.12") == ["rich>=14", "keras>=3.15,<4"]
    wheels = [_wheel(tmp_path, "keras", "3.15.1", ["numpy", "optree", "rich"]),
              _wheel(tmp_path, "optree", "0.20.0", ["typing-extensions>=4.6.0"]),
              _wheel(tmp_path, "pydantic", "2.14.3", ["typing-extensions>=4.16.0", "annotated-types>=0.6.0"]),
              _wheel(tmp_path, "annotated-types", "0.8.0", []), _wheel(tmp_path, "numpy", "2.3.0", []),
              _wheel(tmp_path, "typing-extensions", "4.16.0", []), _wheel(tmp_path, "unused", "1.0", [])]
    kept = wheelhouse.needed_wheels(["keras>=3.15", "pydantic>=2.7"], wheels, have, "3.12")
    # numpy is there; typing-extensions is there but older than pydantic needs; nothing needs `unused`
    assert [wheelhouse.name_of(w.name) for w in kept] == ["keras", "optree", "pydantic", "annotated-types",
                                                           "typing-extensions"]
    assert not wheelhouse.needed_wheels(["keras>=3.15"], wheels, {**have, "keras": "3.15.1", "optree": "0.20.0"},
                                        "3.12")


def test_prepare_against_a_target_that_has_everything(tmp_path):
    """This environment's own `pip list` as the target's: every requirement met, nothing downloaded."""
    names = {wheelhouse.name_of(r) for r in wheelhouse.requirements()}
    assert {"keras", "pydantic", "pytest", "pytest-xdist", "pandas"} <= names and not names & {"torch", "tensorflow"}
    listing = tmp_path / "target-packages.txt"
    listing.write_text(subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                                      text=True, check=True).stdout)
    proc = _run("prepare", "--installed", str(listing), "--python-version", "3.11", "--dest", str(tmp_path / "w"))
    assert proc.returncode == 0 and "no wheel needed" in proc.stdout, proc.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.skipif(not os.environ.get("AMP_COMPARE_GPU_CHECK_SMOKE"), reason="set AMP_COMPARE_GPU_CHECK_SMOKE=1")
def test_the_whole_check_in_smoke_mode(tmp_path):
    out = tmp_path / "gpu-check"
    proc = _run("run", "--device", "cpu", "--smoke", "--no-install", "--out", str(out), "--work", str(tmp_path / "w"),
                "--phases", "tests,torch-256,keras-jax-256,keras-torch-tuned", timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    table = pd.read_csv(out / "table.csv")
    assert set(zip(table["framework"], table["precision"])) == {(f, p) for f in ("torch", "keras-jax")
                                                                for p in ("fp32", "bf16")}
    assert (table["throughput_img_s"] > 0).all()
    assert (table["reference_img_s"] > 0).all() and (table["reference_over_this"] > 0).all()
    assert "tuned loop skipped: its CUDA graphs need a GPU" in (out / "check.md").read_text()
    references = [r["reference"] for r in json.loads((out / "env.json").read_text())["references"]]
    assert sorted(references) == ["bare Keras fit (jax)"] * 2 + ["torch reference loop"] * 2
