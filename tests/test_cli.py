"""Bad input is refused before anything runs: one line naming the value and choices, exit 2, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BAD = [
    (["--models", "vgg"], "unknown model 'vgg' (valid: simple_cnn, resnet18)"),
    (["--datasets", "imagenet"], "unknown dataset 'imagenet' (valid: digits, synthetic)"),
    (["--precisions", "fp32,fp8"], "unknown precision 'fp8' (valid: fp32, fp16, bf16)"),
    (["--frameworks", "jax"], "unknown framework 'jax' (valid: torch, tf)"),
    (["--device", "tpu"], "unknown device 'tpu' (valid: auto, cpu, cuda)"),
    (["--optimizer", "lion"], "unknown optimizer 'lion' (valid: adam, sgd)"),
    (["--epochs", "0"], "epochs must be a positive int, got 0"),
    (["--batch-size", "-1"], "batch_size must be a positive int, got -1"),
    (["--steps-per-epoch", "0"], "steps_per_epoch must be a positive int, got 0"),
    (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
    (["--batch-size", "100000", "--datasets", "digits"], "batch size 100000 is larger than the 1438 training images"),
    (["--seeds", "a,b"], "--seeds must be comma-separated non-negative integers, got 'a,b'"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0.0"),
]


def _compare(args, out):
    return subprocess.run([sys.executable, "-m", "common", "compare", "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, args, message):
    out = tmp_path / "reports"
    proc = _compare(args, out)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists()


def test_cuda_without_gpu_is_refused(tmp_path):
    from common.env import nvidia_gpu_present

    if nvidia_gpu_present():
        pytest.skip("this machine has a GPU")
    proc = _compare(["--device", "cuda"], tmp_path / "reports")
    assert proc.returncode == 2 and "no NVIDIA GPU is visible" in proc.stderr
    assert not (tmp_path / "reports").exists()


def test_unwritable_output_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        import os

        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        proc = _compare([], locked / "reports")
        assert proc.returncode == 2 and "is not writable" in proc.stderr
    finally:
        locked.chmod(0o700)


def test_output_path_under_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = _compare([], tmp_path / "file" / "reports")
    assert proc.returncode == 2 and "is not writable" in proc.stderr
    assert (tmp_path / "file").read_text() == "x"


def test_report_of_a_folder_that_is_no_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "common", "report", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not a compare run folder" in proc.stderr
