"""Where a run's time goes (the phase table) and what keeps the default run fast: the cuts of a cell's fixed cost
(digits without scikit-learn, work reused across seeds) and the speed budget of a pathologically slow precision."""

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from amp_compare.contract import records
from amp_compare.contract.config import RunConfig
from amp_compare.contract.records import pack_correct
from amp_compare.harness.report import stats
from amp_compare.harness.report.tables import accuracy_statistics
from amp_compare.harness.run import runner
from amp_compare.harness.run.compare import cell_complete
from amp_compare.kit import reuse, training
from amp_compare.kit.phases import Phases

# Measured: the tiny compare's cells (busy 2-core EPYC) spent 0.1-0.4 s between their last phase and the parent's
# clock at their end (writing six tables with fsync, os._exit, the parent's 0.1 s poll); the interpreter's own
# teardown, before os._exit, took 4-5 s there.
EXIT_LIMIT_S = 3.0


def test_phases_account_for_each_childs_wall_time(tiny_run):
    """Every cell writes its phase table; the phases are consecutive laps from the parent's spawn, so from the
    config read to the tables' build they sum to the child's own wall time (child_wall_s) and, with the cell's exit,
    to the wall the parent timed."""
    _, run_dir = tiny_run
    tables = records.read_run(run_dir)
    phases, run = tables["phases"], tables["run"].set_index("cell_id")
    walls = json.loads((run_dir / "manifest.json").read_text())["phases"]["cell_wall_s"]
    assert set(phases["cell_id"]) == set(run.index) == set(walls)
    for cell_id, cell in phases.groupby("cell_id"):
        seconds = cell.set_index("phase")["seconds"]
        assert {"process start", "framework import", "data", "init", "audits", "training", "evaluation",
                "closing"} <= set(seconds.index), cell_id
        assert (seconds >= 0).all() and (cell["cpu_seconds"] >= 0).all(), cell_id
        # child_wall_s: the child's clock from child_main's start to the record tables' build (records and the FLOP
        # count are that build)
        own = seconds.drop(["process start", "framework import", "records", "flop count"]).sum()
        assert own == pytest.approx(run.loc[cell_id, "child_wall_s"], abs=0.05), cell_id
        assert seconds["evaluation"] >= tables["epochs"].query("cell_id == @cell_id")["eval_time_s"].sum() - 1e-6
        assert 0 <= walls[cell_id] - seconds.sum() < EXIT_LIMIT_S, (cell_id, walls[cell_id], seconds.sum())


def test_the_parent_keeps_its_own_phases(tiny_run):
    _, run_dir = tiny_run
    parent = json.loads((run_dir / "manifest.json").read_text())["phases"]
    for name in ("parent start", "planning", "calibration", "cells", "between cells", "render"):
        assert parent[name] >= 0, name
    walls = parent["cell_wall_s"].values()
    if json.loads((run_dir / "manifest.json").read_text())["launcher"]["parallel"] > 1:  # cells at once: the span
        assert max(walls) - 0.01 <= parent["cells"] <= sum(walls) + 0.01 * len(walls), parent
    else:
        assert parent["cells"] == pytest.approx(sum(walls), abs=0.01 * len(walls))


def test_a_forked_cell_trains_as_a_fresh_process_does(tiny_run, tmp_path):
    """The shared tiny compare's cells were forked from their twin's pre-imported parent (harness/run/forkserver.py):
    their framework import is the parent's, paid once (the manifest's "fork servers"), and they train to the same
    losses and accuracies as the same cells started as fresh interpreters.

    The fresh cell is Keras' bf16 cell, run again in a copy of the tiny compare by the function a compare runs per
    cell, unforked (runner.run_cell(fork=False), as a submitit job runs its cell: launchers.cell_job), from the
    config the compare gave it: it starts from the initial weights the tiny compare's torch fp32 cell made, as the
    forked one did. Torch's forked fp32 and bf16 cells are compared, every record, with the same cells run as fresh
    interpreters in tests/test_launchers.py; a fresh torch cell here would cost a torch import and a cell for that
    same check."""
    import shutil

    from amp_compare.contract.config import RunConfig

    _, run_dir = tiny_run
    parent = json.loads((run_dir / "manifest.json").read_text())["phases"]
    assert parent["fork servers"] > 0
    forked = records.read_run(run_dir)
    imports = forked["phases"].query("phase == 'framework import'").set_index("cell_id")["seconds"]
    assert (imports < 0.5).all(), imports  # nothing left to import: the parent did
    cells = ["tf-simple_cnn-synthetic-bf16-s0"]
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, ignore=lambda folder, names: [n for n in names if n in (".lock", *cells)])
    cfg = RunConfig.from_json((run_dir / "cells" / cells[0] / "config.json").read_text())
    outcome = runner.run_cell(cfg, copy, run_dir.name, 600, fork=False)
    assert outcome.status == "ok", outcome.error
    fresh = records.read_run(copy)
    fresh_imports = fresh["phases"].query("phase == 'framework import' and cell_id in @cells")["seconds"]
    assert len(fresh_imports) == 1 and (fresh_imports > 0.5).all(), fresh_imports
    for name, column in (("steps", "loss"), ("epochs", "val_accuracy")):
        a, b = (t[name][t[name]["cell_id"].isin(cells)].sort_values(["cell_id", name[:-1]]) for t in (forked, fresh))
        assert len(a) == len(b) > 0, name
        np.testing.assert_array_equal(a[column].to_numpy(), b[column].to_numpy())


def test_the_twins_parents_start_at_once():
    """forkserver.prestart (a sequential run's start) starts every parent its cells need before waiting for any: the
    imports overlap, and the run's "fork servers" phase is the wall waited, once for all of them."""
    import sys

    from amp_compare.harness.run import forkserver

    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}
    cells = [([sys.executable, "-m", module, "--x"], env, env) for module in ("json", "csv", "json")]
    # The registry is the process's: a test run earlier in this worker (run_cell without a compare's close_all) may
    # have left a parent and its start seconds there; the count below is this test's start alone
    forkserver.close_all()
    try:
        forkserver.prestart(cells)
        servers = [forkserver.server_for(*cell) for cell in cells]
        assert servers[0] is servers[2] and servers[0] is not servers[1] and all(s.alive for s in servers)
        assert max(s.started for s in servers) < min(s.ready_at for s in servers)  # both began before either was ready
    finally:
        started = forkserver.close_all()
    assert list(started) == ["json + csv"] and started["json + csv"] > 0


def test_kept_parents_serve_compare_after_compare_and_exit_when_idle(tmp_path, monkeypatch):
    """AMP_COMPARE_PARENTS: the parent one compare started serves the next (no second import), two compares
    connected at once each get their own children's exit codes, the test runner's per-test variables do not name
    another parent, and the parent exits (and removes its pid file) once idle. The folder's path is longer than a
    socket file's may be (108 bytes): the parents listen on abstract socket names."""
    from amp_compare.harness.run import forkserver

    monkeypatch.setattr(forkserver, "SHARED_IDLE_S", 1.0)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}
    (tmp_path / "in.json").write_text('{"b": 1, "a": [2]}')
    folder, err = tmp_path / ("parents-" + "x" * 100), open(tmp_path / "stderr.log", "w")

    def connect(extra: dict[str, str] | None = None) -> forkserver.ForkServer:
        return forkserver.ForkServer.shared("json.tool", {**env, **(extra or {})}, str(folder)).ready()

    def run(server: forkserver.ForkServer, args: list[str]) -> forkserver.ForkedChild:
        return server.spawn(["json.tool", *args], env, err)

    first = connect()
    [pidfile] = folder.glob("*.pid")
    kept = int(pidfile.read_text().split()[0])
    assert run(first, ["--sort-keys", str(tmp_path / "in.json"), str(tmp_path / "out1.json")]).wait() == 0
    first.close()  # the end of one compare: its parent goes on
    from amp_compare.kit.phases import SLOW_STEP_ENV

    # the test runner's, torch's cache folder, the terminal's size, the tests' slowed step: none read at import
    second = connect({"PYTEST_CURRENT_TEST": "another test", "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_x",
                      "COLUMNS": "80", "LINES": "24", SLOW_STEP_ENV: "bf16=0.06"})
    third = connect()
    assert int(pidfile.read_text().split()[0]) == kept and len(list(folder.glob("*.pid"))) == 1  # no second parent
    bad = run(second, [str(tmp_path / "missing.json")])  # argparse's exit code 2
    good = run(third, [str(tmp_path / "in.json"), str(tmp_path / "out2.json")])
    assert (good.wait(), bad.wait()) == (0, 2)  # each compare gets its own child's exit
    assert json.loads((tmp_path / "out1.json").read_text()) == {"a": [2], "b": 1}
    other = forkserver.ForkServer.shared("json.tool", {**env, "OMP_NUM_THREADS": "3"}, str(folder))
    assert other.path != second.path  # a variable a framework may read at import: a parent of its own
    for server in (second, third, other.ready()):
        server.close()
    pids = {kept, int(other.path.with_name(other.path.name + ".pid").read_text().split()[0])}
    for proc in [p for p in forkserver._DETACHED if p.pid in pids]:
        assert proc.wait(timeout=60) == 0  # idle for SHARED_IDLE_S: it exits
    assert not list(folder.glob("*.pid"))
    err.close()


def test_a_kept_parent_that_failed_to_import_is_not_started_again(tmp_path, monkeypatch):
    """A twin whose framework does not import (a broken install) fails the same way every time: ready() says why
    after the one start, instead of importing it twice more (the retries are for a parent that ended on its idle
    timeout as a compare connected)."""
    from amp_compare.harness.run import forkserver

    twin = tmp_path / "code" / "broken_twin"  # a twin package whose training module imports a missing framework
    twin.mkdir(parents=True)
    (twin / "__init__.py").write_text("")
    (twin / "entry.py").write_text('TRAIN_MODULE = "broken_twin.train"\nPRELOAD = ()\n')
    (twin / "train.py").write_text("import no_such_framework_installed\n")
    launches = []
    real = forkserver._launch_shared
    monkeypatch.setattr(forkserver, "_launch_shared", lambda *a: launches.append(a[0]) or real(*a))
    env = {"PYTHONPATH": f"{Path(__file__).resolve().parents[1]}:{twin.parent}", "PATH": "/usr/bin:/bin"}
    with pytest.raises(forkserver.ForkServerError, match="no_such_framework_installed"):
        forkserver.ForkServer.shared("broken_twin", env, str(tmp_path / "parents")).ready()
    assert launches == ["broken_twin"]


def test_an_edited_source_file_names_another_kept_parent(tmp_path, monkeypatch):
    """A kept parent has imported the project's code: once a source file changes, a compare must not fork its cells
    from it (the parent is named by the files' modification times too, forkserver._code_stamp)."""
    from amp_compare.harness.run import forkserver

    source = tmp_path / "amp_compare" / "kit" / "training.py"
    source.parent.mkdir(parents=True)
    source.write_text("x = 1\n")
    monkeypatch.setattr(forkserver, "PROJECT_ROOT", tmp_path)
    env = {"PATH": "/usr/bin:/bin"}
    before = forkserver._env_digest(env, "amp_compare.torch_impl")
    assert forkserver._env_digest(env, "amp_compare.torch_impl") == before
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 1))
    assert forkserver._env_digest(env, "amp_compare.torch_impl") != before


def test_a_moved_part_keeps_the_sum():
    phases = Phases()
    phases.lap("training")
    total = sum(phases.seconds.values())
    phases.move(total / 2, "training", "evaluation")
    phases.move(10 * total, "training", "compile/warm-up")  # never more than the source holds
    assert sum(phases.seconds.values()) == pytest.approx(total) and phases.seconds["training"] == 0
    assert sum(phases.cpu_seconds.values()) == pytest.approx(sum(r["cpu_seconds"] for r in phases.rows()))


def test_digits_are_read_as_scikit_learn_reads_them():
    from sklearn.datasets import load_digits

    from amp_compare.kit.data import digits_arrays

    images, labels = digits_arrays()
    bunch = load_digits()
    assert np.array_equal(images, bunch.images) and np.array_equal(labels, bunch.target)


def test_work_is_reused_across_seeds_only(tmp_path, monkeypatch):
    monkeypatch.setattr(reuse, "CACHE_DIR", tmp_path)
    calls = []

    def compute(value):
        return lambda: calls.append(value) or [{"op": "conv", "value": value}]

    first = reuse.cached("dtypes", RunConfig(seed=0), compute(0))
    assert reuse.cached("dtypes", RunConfig(seed=2), compute(2)) == first  # another seed: reused
    assert reuse.cached("dtypes", RunConfig(seed=0, precision="bf16"), compute(3)) != first  # another cell: not
    assert calls == [0, 3]


def test_the_ceiling_is_measured_once_per_framework_and_matmul_dtype(tmp_path, monkeypatch):
    """kit/ceiling.measure_cell_ceiling with the children's remember (reuse.per_machine): one matmul measurement per
    framework and dtype the matmul runs in, whatever the model or seed; each cell still records its own basis."""
    from amp_compare.kit import ceiling

    monkeypatch.setattr(reuse, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(ceiling, "measure_on", lambda device, timer: (timer(8, 1), 8))
    timed = []

    def cell(**options):
        cfg = RunConfig(**options)
        return ceiling.measure_cell_ceiling(cfg.precision, cfg.tf32, "cpu", "cpu", lambda name: lambda n, r: (
            timed.append((cfg.framework, name)) or 1e9 + len(timed)), reuse.per_machine("ceiling", cfg))

    no_half = {"cpu_fp16_hardware": False, "cpu_bf16_hardware": True}
    monkeypatch.setattr("amp_compare.contract.env.cpu_info", lambda: no_half)
    fp32 = cell(framework="torch", model="simple_cnn", precision="fp32", seed=0)
    fp16 = cell(framework="torch", model="vit", precision="fp16", seed=1)  # no fp16 arithmetic: the fp32 matmul
    bf16 = cell(framework="torch", model="vit", precision="bf16", seed=0)
    tf_fp32 = cell(framework="tf", model="simple_cnn", precision="fp32", seed=2)
    assert timed == [("torch", "fp32"), ("torch", "bf16"), ("tf", "fp32")]
    assert fp16["ceiling_flops_measured"] == fp32["ceiling_flops_measured"] != tf_fp32["ceiling_flops_measured"]
    assert bf16["ceiling_dtype"] == "bf16" and fp32["ceiling_basis"] == "" and "no fp16" in fp16["ceiling_basis"]
    threads = RunConfig().threads + 1
    cell(framework="torch", model="simple_cnn", precision="fp32", threads=threads)  # another thread count: again
    assert timed[-1] == ("torch", "fp32") and len(timed) == 4


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _budget_run(monkeypatch, step_s: float, reference: float | None = None, planned: int = 12 * 22,
                **options) -> training.SpeedBudget:
    """A SpeedBudget fed steps of step_s seconds (a fake clock) until it stops or its planned steps have run."""
    clock = FakeClock()
    monkeypatch.setattr(training.time, "perf_counter", clock)
    cfg = RunConfig(**{"epochs": 12, "warmup_steps": 5, "speed_budget_s": 120.0, "speed_reference_step_s": reference,
                       **options})
    budget = training.SpeedBudget(cfg, planned_steps=planned)
    for done in range(1, planned + 1):
        clock.now += step_s
        if budget.update(done, 1):
            budget.stopped_at = done
            break
    return budget


def test_a_slow_precision_is_timed_over_a_bounded_number_of_steps(monkeypatch):
    slow = _budget_run(monkeypatch, step_s=0.5)  # 264 steps of 0.5 s: 132 s projected, over 120 s
    assert slow.steps == training.BUDGET_MIN_STEPS and slow.stopped_at == 5 + slow.steps
    assert "over the cell budget of 120 s" in slow.reason and "--no-speed-budget" in slow.reason
    quick = _budget_run(monkeypatch, step_s=0.05)  # 13 s projected: runs in full
    assert quick.steps is None and not hasattr(quick, "stopped_at")
    many = _budget_run(monkeypatch, step_s=0.1, planned=2000)  # 200 s projected: 20 s of 0.1 s steps, 15 run
    assert many.steps == pytest.approx((120 / 6 - 15 * 0.1) / 0.1, abs=1) and many.stopped_at == 5 + many.steps


def test_only_a_precision_far_slower_than_fp32_is_budgeted(monkeypatch):
    """A busy machine slows fp32 as well: a cell only 5x slower than its fp32 runs in full, a 50x one does not."""
    assert _budget_run(monkeypatch, step_s=0.5, reference=0.1).steps is None
    budgeted = _budget_run(monkeypatch, step_s=0.5, reference=0.01)
    assert budgeted.steps == training.BUDGET_MIN_STEPS and "50x the median step" in budgeted.reason
    assert _budget_run(monkeypatch, step_s=0.5, speed_budget=False).steps is None


def test_a_budgeted_cell_runs_its_steps_records_them_and_counts_as_finished(tmp_path, monkeypatch):
    """A real torch child (the function a compare runs per cell) with bf16 made slow by the test hook: it stops
    after its warm-up and BUDGET_MIN_STEPS timed steps, and says so in its run row."""
    monkeypatch.setenv(training.SLOW_STEP_ENV, "bf16=0.06")
    cfg = RunConfig(dataset="synthetic", precision="bf16", epochs=2, steps_per_epoch=60, batch_size=16,
                    warmup_steps=1, speed_budget_s=2.0, threads=1)
    outcome = runner.run_cell(cfg, tmp_path, "r1", 300)
    assert outcome.status == "ok", outcome.error
    tables = records.read_run(tmp_path)
    run = tables["run"].iloc[0]
    assert run["budget_steps"] == training.BUDGET_MIN_STEPS and run["steps_timed"] == training.BUDGET_MIN_STEPS
    assert run["steps_total"] == 1 + training.BUDGET_MIN_STEPS and len(tables["epochs"]) == 1  # of 2 planned
    assert "over the cell budget of 2 s" in run["budget_reason"]
    assert cell_complete(tmp_path, cfg)  # a resume does not run it again


def _accuracy_runs(budgeted_precision: str | None) -> pd.DataFrame:
    """torch fp32 and bf16, three seeds, bf16 wrong on 30 more of 200 images every seed (a detectable drop)."""
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(3):
        base = rng.random(200) < 0.9
        worse = base.copy()
        worse[np.flatnonzero(base)[:30]] = False
        for prec, correct in (("fp32", base), ("bf16", worse)):
            rows.append({"framework": "torch", "model": "simple_cnn", "dataset": "digits", "precision": prec,
                         "seed": seed, "status": "ok", "cell_id": f"torch-{prec}-{seed}", "val_samples": 200,
                         "val_correct": pack_correct(correct), "final_val_accuracy": correct.mean(),
                         "budget_steps": 40 if prec == budgeted_precision else None})
    return pd.DataFrame(rows).astype({"budget_steps": "Int64"})


def test_a_budgeted_cells_accuracy_is_compared_with_nothing():
    full = accuracy_statistics(_accuracy_runs(None)).set_index("precision")
    assert np.isfinite(full.loc["bf16", "p_value"]) and full.loc["bf16", "budget_cut"] == 0
    assert stats.accuracy_tests(_accuracy_runs("bf16"), ["model", "dataset", "framework"]).empty
    cut = accuracy_statistics(_accuracy_runs("bf16")).set_index("precision")
    assert not np.isfinite(cut.loc["bf16", "p_value"]) and cut.loc["bf16", "budget_cut"] > 0
    from amp_compare.harness.report import phrases

    assert "cut by the speed budget" in phrases.accuracy(next(cut.loc[["bf16"]].reset_index().itertuples()))
    assert stats.accuracy_tests(_accuracy_runs("fp32"), ["model", "dataset", "framework"]).empty


def test_a_budgeted_cells_row_says_why_it_has_no_time_to_target_and_its_partial_epoch_is_not_drawn(tmp_path):
    """The accuracy table: a budget-cut precision is not comparable and has no time to target (its cells reached
    the target in fewer epochs than fp32's, or not at all: "not reached" would be false); its last, partial epoch
    (the budget stopped it a step in) is neither a curve's point nor counted as an epoch."""
    from amp_compare.harness.report import render

    runs = _accuracy_runs("bf16")
    epochs = pd.DataFrame([{**r, "epoch": e, "val_accuracy": 0.88 + 0.01 * e, "train_time_s": 1.0, "eval_time_s": 0.1}
                           for r in runs[["cell_id", "framework", "model", "dataset", "precision", "seed"]]
                           .to_dict("records") for e in range(3)])
    table = render._accuracy_table(accuracy_statistics(runs, epochs), pd.DataFrame(columns=["metric"]))
    bf16 = table.set_index("Precision").loc["bf16"]
    assert bf16["Comparable"] == "no: cut by the speed budget"
    assert bf16["Time to target (s)"] == bf16["Seeds reaching it"] == ""
    assert table.set_index("Precision").loc["fp32", "Comparable"] == "yes"
    steps = pd.DataFrame([{"cell_id": c, "epoch": e} for c in runs["cell_id"] for e in range(3)
                          for _ in range(22 if e < 2 or c.startswith("torch-fp32") else 1)])
    from amp_compare.harness.report import figures

    tta = figures.make_time_to_accuracy_figure(runs, epochs, accuracy_statistics(runs, epochs), tmp_path)
    assert tta.caption.endswith("Not drawn: PyTorch simple_cnn bf16 (the speed budget stopped them: their time to "
                                "accuracy is not compared).")
    from amp_compare.harness.report import speed

    (note,) = speed.budget_note(runs.assign(steps_total=[66, 45] * 3), 60.0)
    assert note.startswith("The speed budget stopped 3 cells: PyTorch simple_cnn bf16 (3 cells, 45 of 66 steps). "
                           "Their first steps projected more than the 60 s cell budget"), note
    assert "their precision's accuracy, memory and time to target are compared with nothing" in note  # as verdicts'
    assert speed.budget_note(_accuracy_runs(None).assign(steps_total=66), 60.0) == []
    kept = stats.whole_epochs(epochs, steps, runs)
    assert kept.groupby("cell_id").size().to_dict() == {**{f"torch-fp32-{s}": 3 for s in range(3)},
                                                         **{f"torch-bf16-{s}": 2 for s in range(3)}}


def test_the_manifest_holds_the_cell_budget_and_the_option_turns_it_off(tmp_path):
    from amp_compare.harness.run.cli import build_parser, compare_settings
    from amp_compare.harness.run.compare import plan_compare

    def plan(*extra):
        args = compare_settings(build_parser().parse_args(["compare", "--device", "cpu", "--out", str(tmp_path),
                                                           "--datasets", "synthetic", *extra]))
        return plan_compare(args)

    _, cells, manifest = plan()
    assert manifest["cell_budget"]["enabled"] and manifest["cell_budget"]["limit_s"] == 60.0
    assert manifest["cell_budget"]["min_steps"] == training.BUDGET_MIN_STEPS >= 2 * stats.BLOCK
    assert all(c.speed_budget for c in cells)
    _, cells, manifest = plan("--no-speed-budget", "--speed-budget-s", "30")
    assert not manifest["cell_budget"]["enabled"] and not any(c.speed_budget for c in cells)
    assert manifest["cell_budget"]["limit_s"] == 30.0


def test_ctrl_c_while_the_parents_start_ends_the_run_as_an_interruption(tmp_path, monkeypatch):
    """A Ctrl-C (or SIGTERM) while the twins' parents start, before any cell: run_cells hands the interruption up as
    it does one inside a cell (the run is resumable, nothing to lose), not a traceback."""
    from rich.console import Console

    from amp_compare.harness.run import compare

    def interrupted(cells, run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "prestart_fork_servers", interrupted)
    outcomes, exc = compare.run_cells([RunConfig()], tmp_path, "run", 60.0, Console(file=open(os.devnull, "w")))
    assert outcomes == [] and isinstance(exc, KeyboardInterrupt)


@pytest.mark.parametrize("backend, has_jax", [("tensorflow", False), ("jax", True)])
def test_a_keras_child_leaves_out_the_imports_its_cells_never_use(backend, has_jax):
    """keras_impl/entry.py, what every Keras child (forked or fresh) imports first: on TensorFlow, neither
    scikit-learn (Keras' wrappers) nor JAX (TensorFlow's lite converter imports it) is loaded with its training
    module; the keras-jax twin's child still has JAX, and its setup (the seeds) does not import TensorFlow."""
    import subprocess
    import sys

    framework = {"tensorflow": "tf", "jax": "keras-jax"}[backend]
    code = ("import sys, importlib; from amp_compare.keras_impl import entry; train = importlib.import_module("
            "entry.TRAIN_MODULE); import keras; from amp_compare.contract.config import RunConfig; "
            f"train.setup(RunConfig(framework={framework!r}, threads=1)); print(keras.backend.backend(), "
            "sys.modules.get('jax') is not None, sys.modules.get('sklearn') is not None, 'tensorflow' in sys.modules)")
    env = {**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [backend, str(has_jax), "False", str(backend == "tensorflow")], proc.stdout


def test_a_precision_with_one_budget_cut_seed_is_left_out_of_the_time_to_accuracy_figure_named_by_seed(tmp_path):
    """The lab audit: the caption said "Not drawn: PyTorch simple_cnn fp16" while the figure drew its two uncut
    seeds; a precision with a cut cell has no time to target (verdicts.TIME_TO_TARGET), so none of it is drawn."""
    from amp_compare.harness.report import figures

    runs = _accuracy_runs("bf16")
    runs["budget_steps"] = runs["budget_steps"].where(runs["seed"] == 0)
    epochs = pd.DataFrame([{**r, "epoch": e, "val_accuracy": 0.88 + 0.01 * e, "train_time_s": 1.0, "eval_time_s": 0.1}
                           for r in runs[["cell_id", "framework", "model", "dataset", "precision", "seed"]]
                           .to_dict("records") for e in range(3)])
    tta = figures.make_time_to_accuracy_figure(runs, epochs, accuracy_statistics(runs, epochs), tmp_path)
    assert tta.caption.endswith("Not drawn: PyTorch simple_cnn bf16 (seed 0 of 3 stopped) (the speed budget stopped "
                                "them, or the seeds named: a precision with a stopped cell has no time to accuracy "
                                "compared).")
