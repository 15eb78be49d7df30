"""Bad input is refused before anything runs: one line naming the value and choices, exit 2, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BAD = [
    (["--models", "vgg"], "unknown model 'vgg' (valid: simple_cnn, resnet18, vit)"),
    (["--datasets", "imagenet"],
     "unknown dataset 'imagenet' (valid: digits, synthetic, synthetic_cifar, cifar10, cifar100)"),
    (["--precisions", "fp32,fp4"], "unknown precision 'fp4' (valid: fp32, fp16, bf16, fp16-noscale, fp16-static, fp8, "
                                   "fp8-rowwise)"),
    (["--frameworks", "jax"], "unknown framework 'jax' (valid: torch, tf, keras-jax, keras-torch)"),
    (["--device", "tpu"], "unknown device 'tpu' (valid: auto, cpu, cuda)"),
    (["--optimizer", "lion"], "unknown optimizer 'lion' (valid: auto, adam, adamw, sgd)"),
    (["--epochs", "0"], "epochs must be a positive int (1..9223372036854775807), got 0"),
    (["--batch-size", "-1"], "batch_size must be a positive int (1..9223372036854775807), got -1"),
    (["--steps-per-epoch", "0"], "steps_per_epoch must be a positive int (1..9223372036854775807) or null, got 0"),
    (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
    (["--batch-size", "100000", "--datasets", "digits"], "batch size 100000 is larger than the 1438 training images"),
    (["--seeds", "a,b"], "--seeds must be comma-separated integers, got 'a,b'"),
    (["--timeout", "0"], "timeout must be a positive finite float, got 0.0"),
    (["--comparison", "loose"], "unknown comparison 'loose' (valid: aligned, defaults)"),
    (["--init", "random"], "unknown init 'random' (valid: shared, framework)"),
    (["--width", "0"], "width must be a positive int (1..9223372036854775807), got 0"),
    (["--diverge-after", "0"], "diverge_after must be a positive int (1..9223372036854775807), got 0"),
    (["--resume", "no-such-run"], "unknown run id 'no-such-run'"),
    (["--config", "/nonexistent/amp.json"], "cannot read config file '/nonexistent/amp.json'"),
    (["--loss-scale", "8"], "--loss-scale 8 needs precision fp16-static among --precisions"),
    (["--precisions", "fp16-static"], "precision 'fp16-static' needs --loss-scale"),
    (["--fp32-layers", "fcc"], "unknown layer 'fcc' for --fp32-layers of simple_cnn (valid: conv1, conv2, fc"),
    (["--clip-grad-norm", "0"], "clip_grad_norm must be a positive finite float or null, got 0.0"),
    # Numbers the records cannot store (int64) are refused before anything runs.
    (["--seeds", str(2**63)], "each a non-negative int (0..9223372036854775807), got 9223372036854775808"),
    (["--growth-interval", str(2**64)], "growth_interval must be a positive int (1..9223372036854775807), got 1844"),
    (["--warmup-steps", str(2**63)], "warmup_steps must be a non-negative int (0..9223372036854775807), got 9223"),
    # Non-finite numbers.
    (["--timeout", "nan"], "timeout must be a positive finite float, got nan"),
    (["--lr", "inf"], "lr must be a positive finite float or null, got inf"),
    (["--precisions", "fp16-static", "--loss-scale", "inf"],
     "loss_scale must be a positive finite float or null, got inf"),
    (["--init-scale=-inf"], "init_scale must be a positive finite float, got -inf"),
    (["--momentum", "1"], "momentum must be a float in [0, 1), got 1.0"),
    # Empty and duplicate-after-parsing lists.
    (["--seeds", ""], "seeds is empty (valid: a non-empty list"),
    (["--frameworks", ","], "frameworks is empty (valid: a non-empty list"),
    (["--seeds", "0,00"], "seeds lists 0 more than once"),
    (["--precisions", "fp32,fp32"], "precisions lists 'fp32' more than once"),
    (["--repeats", "0"], "repeats must be a positive int (1..1000) or null, got 0"),
    (["--repeats", "2", "--seeds", "1"], "--repeats and --seeds both choose the seeds"),
    (["--max-batch-limit", "0"], "max_batch_limit must be a positive int (1..9223372036854775807), got 0"),
    (["--tf32", "maybe"], "unknown tf32 'maybe' (valid: on, off)"),
    # Dotted --fp32-layers names are checked against the model's real blocks.
    (["--models", "resnet18", "--fp32-layers", "layer1.9"], "unknown layer 'layer1.9' for --fp32-layers of resnet18"),
    (["--fp32-layers", "conv1.weight"], "unknown layer 'conv1.weight' for --fp32-layers of simple_cnn"),
    (["--fp32-layers", "fc,fc"], "fp32_layers lists 'fc' more than once"),
    # Output paths the file system refuses.
    (["--run-id", "x" * 300], "is 300 bytes long, longer than the file system allows (valid: up to 255 bytes)"),
    (["--run-id", "a/b"], "run id 'a/b' must be a plain folder name"),
    (["--run-id", ""], "run id '' must be a plain folder name"),
    # What the machine can run (issue 27): more threads than CPUs, a memory cap of nothing or infinity, a data
    # folder that is a file (one that does not exist: tests/test_profile_inputs.py).
    (["--threads", "100000"], "--threads 100000 is more than this machine can run: valid 1.."),
    (["--memory-cap", "0"], "--memory-cap '0' must be a positive, finite size"),
    (["--memory-cap", "1e400"], "--memory-cap '1e400' must be a positive, finite size"),
    (["--memory-cap", "1" + "0" * 400 + "GiB"], "must be a positive, finite size"),
    (["--data-dir", str(ROOT / "pyproject.toml")], "pyproject.toml' is not a folder (valid: a folder to look in"),
]


def _compare(args, out):
    return subprocess.run([sys.executable, "-m", "amp_compare", "compare", "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def _main(args, capsys) -> tuple[int, str]:
    """The CLI's own entry point in this process (what `python -m amp_compare` calls), its exit status and stderr."""
    from amp_compare.harness.run.compare import main

    try:
        rc = main(["compare", "--device", "cpu", *args])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, monkeypatch, args, message):
    def no_cell_may_run(*args, **kwargs):  # a check that regressed must not start children (--threads 100000 did)
        raise AssertionError("bad input reached the cells")

    monkeypatch.setattr("amp_compare.harness.run.compare.run_cells", no_cell_may_run)
    out = tmp_path / "reports"
    rc, err = _main([*args, "--out", str(out)], capsys)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert not out.exists()


def test_bad_input_through_the_real_entry_point(tmp_path):
    proc = _compare(["--lr", "inf"], tmp_path / "reports")
    assert proc.returncode == 2
    assert proc.stderr == "amp-compare: error: lr must be a positive finite float or null, got inf\n"
    assert not (tmp_path / "reports").exists()


def test_output_under_proc_leaves_nothing(tmp_path, capsys):
    rc, err = _main(["--out", "/proc/amp-compare-test/reports"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "'/proc/amp-compare-test/reports' is not" in err, err
    assert not Path("/proc/amp-compare-test").exists()


def test_a_folder_that_cannot_be_made_leaves_no_empty_parents(tmp_path):
    from amp_compare.contract.config import ConfigError
    from amp_compare.harness.run.compare import make_dirs

    with pytest.raises(ConfigError, match="cannot create the run folder"):
        make_dirs(tmp_path / "a" / "b" / ("x" * 300))
    assert list(tmp_path.iterdir()) == []


CONFIG_BAD = [
    ('{"seeds": 5}', "seeds must be a non-empty list (or comma-separated text) of distinct values, each a "
                     "non-negative int (0..9223372036854775807), got 5"),
    ('{"seeds": []}', "seeds is empty"),
    ('{"seeds": ["0"]}', "got '0'"),
    ('{"timeout": null}', "timeout must be a positive finite float, got None"),
    ('{"out": 5}', "out must be a path, got 5"),
    ('{"augment": "false"}', "augment must be true or false, got 'false'"),
    ('{"compile": 1}', "compile must be true or false, got 1"),
    ('{"epochs": "3"}', "epochs must be a positive int (1..9223372036854775807), got '3'"),
    ('{"epochs": 2.5}', "epochs must be a positive int"),
    ('{"lr": 1e999}', "lr must be a positive finite float or null, got inf"),
    ('{"growth_interval": 18446744073709551616}', "growth_interval must be a positive int"),
    ('{"precisions": ["fp32", "fp32"]}', "precisions lists 'fp32' more than once"),
    ('{"resume": "r1"}', "unknown option(s) resume in config file"),
]


@pytest.mark.parametrize(("text", "message"), CONFIG_BAD, ids=[t for t, _ in CONFIG_BAD])
def test_config_file_is_typed_as_strictly_as_the_command_line(tmp_path, capsys, text, message):
    path = tmp_path / "amp.json"
    path.write_text(text)
    rc, err = _main(["--config", str(path), "--out", str(tmp_path / "reports")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "reports").exists()


def test_help_defaults_are_the_ones_the_run_uses(tmp_path):
    """The help's per-device defaults come from the declaration that plan_compare uses."""
    from amp_compare.harness.common import DEFAULT_MODEL_EPOCHS
    from amp_compare.harness.run.cli import build_parser, compare_options, compare_settings
    from amp_compare.harness.run.compare import plan_compare

    help_text = build_parser()._subparsers._group_actions[0].choices["compare"].format_help()
    flat = " ".join(help_text.split())
    assert "simple_cnn trains 4 and vit 6 (where recorded 12-epoch runs' fp32 accuracy was within 1-3 points of its " \
        "end) (default: 12 on cpu, 15 on cuda)" in flat
    assert "images per optimizer step (default: 64 on cpu, 256 on cuda)" in flat
    args = compare_settings(build_parser().parse_args(["compare", "--device", "cpu", "--out", str(tmp_path)]))
    _, cells, _ = plan_compare(args)
    options = compare_options()
    assert options["epochs"].default_for("cpu") == 12
    # each default model stops early (DEFAULT_MODEL_EPOCHS), unless --epochs is given
    assert {c.model: c.epochs for c in cells} == DEFAULT_MODEL_EPOCHS["cpu"] == {"simple_cnn": 4, "vit": 6}
    given = compare_settings(build_parser().parse_args(["compare", "--device", "cpu", "--out", str(tmp_path),
                                                        "--epochs", "12"]))
    assert {c.epochs for c in plan_compare(given)[1]} == {12}
    assert {c.batch_size for c in cells} == {options["batch_size"].default_for("cpu")}
    assert sorted({c.seed for c in cells}) == list(options["seeds"].default_for("cpu"))
    # the vit beside simple_cnn, at seed 0 only on a CPU (DEFAULT_MODEL_SEEDS), unless seeds are given
    assert {c.model for c in cells} == {"simple_cnn", "vit"} and {c.seed for c in cells if c.model == "vit"} == {0}
    args = compare_settings(build_parser().parse_args(["compare", "--device", "cpu", "--out", str(tmp_path),
                                                       "--seeds", "0,1"]))
    assert {c.seed for c in plan_compare(args)[1] if c.model == "vit"} == {0, 1}


def test_options_page_is_the_declaration():
    """docs/OPTIONS.md's table is generated from the declaration (amp_compare.harness.run.cli.update_options_page
    rewrites it), and the README links the page."""
    from amp_compare.harness.run.cli import options_markdown

    page = (ROOT / "docs" / "OPTIONS.md").read_text()
    start, end = "<!-- options: generated from the declaration -->", "<!-- end of options -->"
    assert start in page and end in page, "docs/OPTIONS.md lacks the options table markers"
    table = page.split(start)[1].split(end)[0].strip()
    assert table == options_markdown().strip(), (
        "stale options table: run amp_compare.harness.run.cli.update_options_page()")
    assert "docs/OPTIONS.md" in (ROOT / "README.md").read_text()


def test_cuda_without_gpu_is_refused(tmp_path):
    from amp_compare.contract.env import nvidia_gpu_present

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
    from amp_compare.harness.run.cli import build_parser, compare_settings
    from amp_compare.harness.run.compare import plan_compare

    cfg = tmp_path / "amp.json"
    cfg.write_text('{"precisions": ["fp32", "bf16"], "epochs": 3, "datasets": "synthetic", "device": "cpu", '
                   '"augment": false}')
    args = build_parser().parse_args(["compare", "--config", str(cfg), "--epochs", "5", "--out", str(tmp_path / "r")])
    _, cells, plan = plan_compare(compare_settings(args))
    assert plan["matrix"]["precisions"] == ["fp32", "bf16"] and {c.epochs for c in cells} == {5}
    assert {c.dataset for c in cells} == {"synthetic"} and not any(c.augment for c in cells)


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
    proc = subprocess.run([sys.executable, "-m", "amp_compare", "report", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not a compare run folder" in proc.stderr


def _cifar_env(tmp_path):
    """No CIFAR anywhere, and no network use: an empty cache and an unreachable mirror."""
    import os

    return dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), AMP_COMPARE_DATA=str(tmp_path / "none"))


def test_missing_cifar_archive_says_which_file_to_put_where(tmp_path):
    (tmp_path / "data").mkdir()  # an existing but empty folder (one that does not exist is refused before)
    proc = subprocess.run([sys.executable, "-m", "amp_compare", "compare", "--datasets", "cifar10", "--data-dir",
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
    proc = subprocess.run([sys.executable, "-m", "amp_compare", "compare", "--datasets", "cifar10", "--data-dir",
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
    proc = subprocess.run([sys.executable, "-m", "amp_compare", "compare", "--datasets", "cifar10", "--data-dir",
                           str(tmp_path / "data"), "--models", "resnet18", "--width", "4", "--precisions", "fp32",
                           "--frameworks", "torch", "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "16",
                           "--seeds", "0", "--augment", "--device", "cpu", "--no-figures",
                           "--out", str(tmp_path / "reports"), "--run-id", "c"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=_cifar_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = pd.read_parquet(tmp_path / "reports/c/data/run.parquet")
    # One framework: the archive is read by kit/cifar.py, the same code for both children.
    assert list(runs["status"]) == ["ok"] and (runs["train_samples"] == 80).all()
    assert runs["dataset_source"].str.contains("CIFAR-10 from").all()
    assert runs["cfg_augment"].all() and set(runs["cfg_model"] if "cfg_model" in runs else runs["model"]) == {
        "resnet18"}


def _disk_full_after(monkeypatch, part: str):
    """Make every atomic write of a path containing `part` fail as a full disk does (ENOSPC)."""
    import errno

    from amp_compare.contract import atomic

    real = atomic.atomic_write_bytes

    def full(path, data):
        if part in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(atomic, "atomic_write_bytes", full)
    monkeypatch.setattr("amp_compare.contract.records.atomic_write_bytes", full)


def test_a_full_disk_while_the_report_is_written_is_one_line_and_keeps_every_cell(tmp_path, monkeypatch, capsys):
    """Issue 27: a full disk while writing the report ended in a pyarrow traceback (exit 1). Now one line names
    the path and the command that finishes the job, the exit is non-zero, and every finished record stays."""
    from amp_compare.contract import records
    from amp_compare.harness.run import runner
    from amp_compare.harness.run.cli import EXIT_REPORT_UNWRITTEN
    from amp_compare.harness.run.compare import main
    from tests.test_report_sentences import write_run

    source = write_run(tmp_path / "src", frameworks=("torch",), precisions=("fp32", "fp16"), seeds=(0,), steps=30)

    def synthetic_cell(cfg, run_dir, run_id, timeout_s, on_event=lambda e: None, placement=None):  # a finished cell
        tables = records.read_cell(source / "cells" / cfg.cell_id.replace("digits", "synthetic"))
        records.write_cell(run_dir / "cells" / cfg.cell_id, tables)
        return runner.CellOutcome(cfg.cell_id, "ok", "", 0.0)

    monkeypatch.setattr(runner, "run_cell", synthetic_cell)
    monkeypatch.setattr(runner, "prestart_fork_servers", lambda cells, run_dir: None)  # no child: no torch parent
    _disk_full_after(monkeypatch, "/data/")
    out = tmp_path / "reports"
    rc = main(["compare", "--device", "cpu", "--frameworks", "torch", "--models", "simple_cnn", "--precisions",
               "fp32,fp16", "--seeds", "0", "--datasets", "synthetic", "--epochs", "3", "--run-id", "full", "--out",
               str(out), "--no-figures", "--trial-budget-s", "0"])  # no speed trial: its child would train for real
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT_REPORT_UNWRITTEN == 4
    line = err[-1]
    assert line.startswith("amp-compare: error: the disk is full (No space left on device: ") and "/data/" in line
    assert f"python -m amp_compare report {out / 'full'}" in line and "Traceback" not in "\n".join(err)
    kept = records.read_run(out / "full")["run"]
    assert sorted(kept["status"]) == ["ok", "ok"]  # nothing finished was lost
    # the same from `report`, and once there is space again the report renders from the kept records
    rc = main(["report", str(out / "full"), "--no-figures"])
    assert rc == 4 and "the disk is full" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["report", str(out / "full"), "--no-figures"]) == 0
    assert (out / "full" / "index.html").exists()


def test_the_reports_advice_for_a_one_seed_vit_gives_it_the_seeds_and_the_report_says_why_it_had_one(tmp_path):
    """Audit: a default CPU compare (matrix seeds 0,1,2) ran the vit on seed 0 only and said nothing of why; its
    advice must be an option that gives the vit more seeds when followed, and the report says why it had one."""
    import pandas as pd

    from amp_compare.harness.report import stats
    from amp_compare.harness.report.tables import fewer_seeds_note
    from amp_compare.harness.run.cli import build_parser, compare_settings
    from amp_compare.harness.run.compare import plan_compare

    default = compare_settings(build_parser().parse_args(["compare", "--device", "cpu", "--out", str(tmp_path)]))
    cells = plan_compare(default)[1]
    advised = stats.MORE_SEEDS.split(" given")[0].split()  # ["--seeds", "0,1,2"]
    followed = compare_settings(build_parser().parse_args(["compare", "--device", "cpu", "--out", str(tmp_path),
                                                           *advised]))
    assert {c.seed for c in plan_compare(followed)[1] if c.model == "vit"} == {0, 1, 2}
    runs = pd.DataFrame([{"cell_id": c.cell_id, "model": c.model, "seed": c.seed, "status": "ok",
                          "cfg_device": c.device} for c in cells])
    note = fewer_seeds_note(runs)
    assert note.startswith(" (the vit ran seed 0 only: a compare on a CPU given neither --seeds nor --repeats")
    assert stats.MORE_SEEDS in note  # the advice the report gives is the one followed above
    assert fewer_seeds_note(runs[runs["model"] == "vit"]) == ""  # every model ran the same seeds: nothing to say


def test_the_reports_path_is_printed_once_on_a_terminal_and_always_for_a_script(monkeypatch, capsys):
    """A default run's summary fits 80x40 only if the path its last line already gives ("Report: …") is not printed a
    second time on the same terminal; a script reading stdout still gets it."""
    from types import SimpleNamespace

    from amp_compare.harness.run.compare import print_path

    for stdout_tty, console_tty, printed in ((True, True, ""), (False, True, "r/index.html\n"),
                                             (True, False, "r/index.html\n")):
        monkeypatch.setattr(sys.stdout, "isatty", lambda tty=stdout_tty: tty)
        print_path(Path("r/index.html"), SimpleNamespace(is_terminal=console_tty))
        assert capsys.readouterr().out == printed


def test_every_path_option_is_made_absolute_before_a_child_starts(monkeypatch, tmp_path):
    """The children run in the project's folder: every option naming a file or folder (a declared Path, or path=True)
    is resolved against the user's working directory first, and no option whose help names a folder or file is
    left out of that set (run_id names a folder inside --out; slurm_extra passes sbatch options through; profile is
    a switch whose traces go in the cell's folder)."""
    from amp_compare.harness.run.cli import PATH_OPTIONS, absolute_paths, compare_options

    named = {n for n, d in compare_options().items() if any(w in d.spec.help.lower() for w in ("folder", " file"))}
    assert set(PATH_OPTIONS) == {"out", "config", "data_dir"} and named - set(PATH_OPTIONS) <= {"run_id", "slurm_extra",
                                                                                          "profile"}, named
    monkeypatch.chdir(tmp_path)
    made = absolute_paths({"out": Path("reports"), "config": Path("c.json"), "data_dir": "archives", "seeds": (0,)})
    assert made == {"out": tmp_path / "reports", "config": tmp_path / "c.json", "data_dir": str(tmp_path / "archives"),
                    "seeds": (0,)}
    from amp_compare.harness.run.cli import build_parser  # report's run folders too

    assert build_parser().parse_args(["report", "reports/r1"]).run_dirs == [tmp_path / "reports" / "r1"]
