"""The Keras model on JAX and on Keras' torch backend, proven equal to the torch model as on TensorFlow.

Each backend runs in one child process (KERAS_BACKEND is read when Keras is imported): the child,
tests/parity_backend_child.py, calls tests/test_parity.py's own test functions under that backend
(weight transfer, fp32 forward and gradients, free-running float64 steps with SGD and Adam, the fp16
loss-scale/skip sequence) and checks the --tf32 read-back; each outcome here is one test. The child
runs once per backend for all its checks. Also here: the runner gives a Keras cell its backend.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from amp_compare.contract.config import KERAS_BACKENDS, RunConfig
from amp_compare.contract.env import PROJECT_ROOT
from tests.parity_backend_child import CHECKS, FAST_XLA_FLAGS, UNSUPPORTED

BACKENDS = {"keras-jax": "jax", "keras-torch": "torch"}
# Every check of the child on every backend, less what a backend cannot do (parity_backend_child.UNSUPPORTED says why)
CASES = [(fw, name) for fw, backend in sorted(BACKENDS.items())
         for name in [*(name for name, _, _ in CHECKS), "tf32_read_back"] if name not in UNSUPPORTED.get(backend, ())]


@pytest.fixture(scope="module")
def backend_results(tmp_path_factory):
    """One child per backend, run on first use; its JSON results by framework."""
    cache: dict[str, dict] = {}

    def run(framework: str) -> dict:
        if framework not in cache:
            if importlib.util.find_spec(BACKENDS[framework]) is None:
                pytest.skip(f"{BACKENDS[framework]} is not installed (pip install -e '.[jax]')")
            out = tmp_path_factory.mktemp(framework) / "parity.json"
            env = {**os.environ, "KERAS_BACKEND": KERAS_BACKENDS[framework], "PYTHONPATH": str(PROJECT_ROOT),
                   "TF_CPP_MIN_LOG_LEVEL": "3"}
            proc = subprocess.run([sys.executable, "-m", "tests.parity_backend_child", str(out)], cwd=PROJECT_ROOT,
                                  env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0 and out.exists(), f"the {framework} child failed:\n{proc.stderr[-3000:]}"
            cache[framework] = json.loads(out.read_text())
        return cache[framework]

    return run


@pytest.mark.parametrize("framework, check", CASES)
def test_keras_backend_parity(framework, check, backend_results):
    results = backend_results(framework)
    assert results["backend"] == KERAS_BACKENDS[framework]  # the child really ran on that backend
    outcome = results["checks"][check]
    assert outcome["passed"], f"{framework} {check}: {outcome['message']}"


def test_keras_cells_get_their_backend_in_the_child_environment():
    from amp_compare.harness.run.runner import child_env

    for framework, backend in KERAS_BACKENDS.items():
        assert child_env(RunConfig(framework=framework))["KERAS_BACKEND"] == backend
    assert RunConfig(framework="keras-tf").framework == "tf"  # the alias is stored under one name


@pytest.mark.parametrize("framework, step_values", [("keras-jax", "device")])
def test_a_keras_backend_cell_runs_through_the_runner(framework, step_values, tmp_path, monkeypatch):
    """One tiny fp16 cell through the product's path (runner, child, records): the records name the backend,
    its TF32 read-back, its dtype-audit method; device mode (AsyncStepRecorder: no per-step wait, per-step
    times missing). One backend only, for time (~20 s a cell here); `keras-torch` in host mode passes the same
    test, and the four-column compare in docs/BACKENDS.md runs every backend."""
    import pandas as pd

    from amp_compare.harness.run.runner import run_cell

    if importlib.util.find_spec(BACKENDS[framework]) is None:
        pytest.skip(f"{BACKENDS[framework]} is not installed")
    monkeypatch.setenv("XLA_FLAGS", FAST_XLA_FLAGS)  # the child inherits it: tiny model, compile less hard
    cfg = RunConfig(framework=framework, dataset="synthetic", precision="fp16", epochs=1, steps_per_epoch=3,
                    batch_size=8, warmup_steps=1, init="framework", threads=1, step_values=step_values)
    outcome = run_cell(cfg, tmp_path, "run", timeout_s=300)
    assert outcome.status == "ok", outcome.error
    cell = tmp_path / "cells" / cfg.cell_id
    run, steps = pd.read_parquet(cell / "run.parquet").iloc[0], pd.read_parquet(cell / "steps.parquet")
    assert run["framework"] == framework and run["keras_backend"] == KERAS_BACKENDS[framework]
    assert json.loads(run["settings_used"])["tf32"] == "off"
    assert len(steps) == 3 and steps["loss"].notna().all() and steps["loss_scale"].iloc[0] == cfg.init_scale
    assert steps["step_time_s"].isna().all() == (step_values == "device")
    assert run["memory_kind"].startswith("cpu_peak_rss")
    audit = pd.read_parquet(cell / "dtypes.parquet")
    assert set(audit["audit_method"]) == {"each layer's dtype policy (compute_dtype) and variable dtypes; backward: "
                                          "the same dtype, as autodiff keeps each tensor's dtype"}
    assert set(audit.loc[audit["layer"] == "conv1", "compute_dtype"]) == {"float16"}


def test_keras_tf_alias_on_the_command_line(tmp_path):
    """--frameworks keras-tf is the tf framework: one name in the matrix, the records and the report."""
    from amp_compare.harness.run.cli import build_parser, compare_settings

    args = compare_settings(build_parser().parse_args(["compare", "--device", "cpu", "--out", str(tmp_path),
                                                       "--frameworks", "keras-tf,torch,keras-jax"]))
    assert args.frameworks == ("tf", "torch", "keras-jax")
