import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent


def artifacts_dir() -> Path:
    """Where tests leave files for people to look at (screenshots, measured differences)."""
    path = Path(os.environ.get("AMP_COMPARE_ARTIFACTS", ROOT / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One tiny real compare (both frameworks x fp32/fp16/bf16, a few steps), shared by the tests that read it."""
    out = tmp_path_factory.mktemp("compare") / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "common", "compare", "--datasets", "synthetic", "--epochs", "2",
         "--steps-per-epoch", "3", "--batch-size", "16", "--warmup-steps", "1", "--seeds", "0", "--out", str(out),
         "--run-id", "tiny", "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out / "tiny"
