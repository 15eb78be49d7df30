"""Bad input is refused before anything runs: one line naming the value and choices, exit 2, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BAD = [
    (["--models", "vgg"], "unknown model 'vgg' (valid: simple_cnn, resnet18)"),
    (["--datasets", "imagenet"],
     "unknown dataset 'imagenet' (valid: digits, synthetic, synthetic_cifar, cifar10, cifar100)"),
    (["--precisions", "fp32,fp8"], "unknown precision 'fp8' (valid: fp32, fp16, bf16, fp16-noscale, fp16-static)"),
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
    (["--comparison", "loose"], "unknown comparison 'loose' (valid: aligned, defaults)"),
    (["--init", "random"], "unknown init 'random' (valid: shared, framework)"),
    (["--width", "0"], "width must be a positive int, got 0"),
    (["--diverge-after", "0"], "diverge_after must be a positive int, got 0"),
    (["--resume", "no-such-run"], "unknown run id 'no-such-run'"),
    (["--config", "/nonexistent/amp.json"], "cannot read config file '/nonexistent/amp.json'"),
    (["--loss-scale", "8"], "--loss-scale 8 needs precision fp16-static among --precisions"),
    (["--precisions", "fp16-static"], "precision 'fp16-static' needs --loss-scale"),
    (["--fp32-layers", "fcc"], "unknown layer 'fcc' for --fp32-layers of simple_cnn (valid: conv1, conv2, fc"),
    (["--clip-grad-norm", "0"], "clip_grad_norm must be a positive float, got 0.0"),
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


def test_malformed_and_unknown_config_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"epochs": 2,')
    proc = _compare(["--config", str(bad)], tmp_path / "reports")
    assert proc.returncode == 2 and "malformed config file" in proc.stderr and len(proc.stderr.splitlines()) == 1
    bad.write_text('{"epochz": 2}')
    proc = _compare(["--config", str(bad)], tmp_path / "reports")
    assert proc.returncode == 2 and "unknown option(s) epochz in config file" in proc.stderr
    assert not (tmp_path / "reports").exists()


def test_config_file_values_are_used_and_cli_overrides(tmp_path):
    from common.cli import build_parser, load_config_file, plan_compare

    cfg = tmp_path / "amp.json"
    cfg.write_text('{"precisions": ["fp32", "bf16"], "epochs": 3, "datasets": "synthetic", "device": "cpu"}')
    parser = build_parser()
    load_config_file(cfg, parser)
    args = parser.parse_args(["compare", "--epochs", "5", "--out", str(tmp_path / "r")])
    _, cells, plan = plan_compare(args)
    assert plan["matrix"]["precisions"] == ["fp32", "bf16"] and {c.epochs for c in cells} == {5}
    assert {c.dataset for c in cells} == {"synthetic"}


def test_resume_refuses_matrix_options(tmp_path):
    run = tmp_path / "reports" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    proc = _compare(["--resume", "r1", "--epochs", "3"], tmp_path / "reports")
    assert proc.returncode == 2 and "drop --epochs" in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json"]


def test_output_path_under_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = _compare([], tmp_path / "file" / "reports")
    assert proc.returncode == 2 and "is not writable" in proc.stderr
    assert (tmp_path / "file").read_text() == "x"


def test_report_of_a_folder_that_is_no_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "common", "report", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not a compare run folder" in proc.stderr


def _cifar_env(tmp_path):
    """No CIFAR anywhere, and no network use: an empty cache and an unreachable mirror."""
    import os

    return dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), AMP_COMPARE_DATA=str(tmp_path / "none"))


def test_missing_cifar_archive_says_which_file_to_put_where(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "common", "compare", "--datasets", "cifar10", "--data-dir",
                           str(tmp_path / "data"), "--out", str(tmp_path / "reports")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=_cifar_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    *notices, line = proc.stderr.strip().splitlines()  # a notice of the download attempt may come first
    assert all(n.startswith("downloading") for n in notices), notices
    assert line.startswith("amp-compare: error:") and "cifar-10-python.tar.gz not found in" in line
    assert str(tmp_path / "data") in line and "put it in one of those folders" in line
    assert not (tmp_path / "reports").exists() and not (tmp_path / "cache" / "amp-compare").exists()


def test_corrupt_cifar_archive_is_refused_and_nothing_cached(tmp_path):
    from tests.cifar_fixtures import write_fake_archive

    (tmp_path / "data").mkdir()
    archive = write_fake_archive(tmp_path / "data", "cifar10")
    archive.write_bytes(archive.read_bytes()[:300])  # truncated download
    proc = subprocess.run([sys.executable, "-m", "common", "compare", "--datasets", "cifar10", "--data-dir",
                           str(tmp_path / "data"), "--out", str(tmp_path / "reports")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=_cifar_env(tmp_path))
    assert proc.returncode == 2 and "is not a readable CIFAR-10 archive" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "reports").exists() and not (tmp_path / "cache" / "amp-compare").exists()


def test_compare_on_a_cifar_archive_in_the_official_format(tmp_path):
    import pandas as pd

    from tests.cifar_fixtures import write_fake_archive

    (tmp_path / "data").mkdir()
    write_fake_archive(tmp_path / "data", "cifar10", n_train_per_batch=16, n_test=16)
    proc = subprocess.run([sys.executable, "-m", "common", "compare", "--datasets", "cifar10", "--data-dir",
                           str(tmp_path / "data"), "--models", "resnet18", "--width", "4", "--precisions", "fp32",
                           "--epochs", "2", "--batch-size", "16", "--seeds", "0", "--augment", "--device", "cpu",
                           "--out", str(tmp_path / "reports"), "--run-id", "c"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=_cifar_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = pd.read_parquet(tmp_path / "reports/c/data/run.parquet")
    assert list(runs["status"]) == ["ok", "ok"] and (runs["train_samples"] == 80).all()
    assert runs["dataset_source"].str.contains("CIFAR-10 from").all()
    assert runs["cfg_augment"].all() and set(runs["cfg_model"] if "cfg_model" in runs else runs["model"]) == {
        "resnet18"}
