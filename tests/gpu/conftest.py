"""What the `gpu` tests share: whether a CUDA device is there, which framework columns can run, one compare.

Every test in tests/gpu/ is marked `gpu` and skipped, with the reason, where no CUDA device is visible: no
NVIDIA GPU (found without importing a framework, so a CPU machine pays nothing beyond collection), or torch
missing or not seeing one. `pytest -m gpu` runs only these; the normal suite collects and skips them.

AMP_COMPARE_REQUIRE_GPU=1 (benchmarks/gpu_check.py sets it on the GPU machine) turns every such skip into a
failure: there a missing GPU, torch or Keras is a broken check, not a machine without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

REQUIRED = os.environ.get("AMP_COMPARE_REQUIRE_GPU", "") not in ("", "0")
# The framework columns a GPU machine with torch and JAX (and no TensorFlow) can run, and what each imports.
GPU_FRAMEWORKS = {"torch": ("torch",), "keras-jax": ("jax", "keras"), "keras-torch": ("torch", "keras")}


@functools.cache
def no_cuda_reason() -> str:
    """Why no CUDA test can run here ("" where one can)."""
    from amp_compare.contract.env import nvidia_gpu_present

    if not nvidia_gpu_present():
        return "no NVIDIA GPU visible (no /proc/driver/nvidia/gpus entry, nvidia-smi -L fails or is absent)"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return ""


def missing_for(framework: str) -> str:
    """Why a framework column cannot run here ("" where it can)."""
    absent = [m for m in GPU_FRAMEWORKS[framework] if importlib.util.find_spec(m) is None]
    return f"{framework} needs {', '.join(absent)}, not installed" if absent else ""


def require(reason: str) -> None:
    """Skip with the reason, or fail with it where the GPU check demands a GPU (AMP_COMPARE_REQUIRE_GPU)."""
    if reason:
        (pytest.fail if REQUIRED else pytest.skip)(reason)


def gpu_marks() -> list:
    """Each gpu test module's pytestmark: the marker, and the skip decided at collection (cheap on a CPU)."""
    reason = no_cuda_reason()
    return [pytest.mark.gpu, pytest.mark.skipif(bool(reason) and not REQUIRED, reason=reason or "CUDA is there")]


@pytest.fixture(autouse=True)
def _cuda_or_fail():
    """With AMP_COMPARE_REQUIRE_GPU the skipif above is off: a missing GPU fails each test instead."""
    require(no_cuda_reason())


def compare(out: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m amp_compare compare --device cuda …` exactly as a user runs it, into `out`."""
    cmd = [sys.executable, "-m", "amp_compare", "compare", "--device", "cuda", "--out", str(out), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def run_table(run_dir: Path):
    """The run's combined run table (data/run.parquet, written by the report)."""
    import pandas as pd

    return pd.read_parquet(run_dir / "data" / "run.parquet")


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
