"""The framework child's side of the protocol, shared by torch_impl and keras_impl.

`python -m torch_impl --config cfg.json --out cells/<cell-id> --run-id <id>` (and the same
for keras_impl) lands in `child_main`, which reads the config, loads the dataset arrays, calls
the framework's `train()`, turns what it measured into the three record tables and writes
them atomically. Progress goes to stdout as lines prefixed with PROGRESS_PREFIX, for the
parent's progress bar. This module never imports a framework.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from amp_compare.contract import env, records
from amp_compare.contract.atomic import atomic_write_bytes
from amp_compare.contract.config import ConfigError, RunConfig
from amp_compare.contract.records import pack_correct
from amp_compare.contract.tables import Reported, check
from amp_compare.kit import reuse
from amp_compare.kit.data import Dataset, load_dataset
from amp_compare.kit.phases import PHASES, lap

PROGRESS_PREFIX = "@@amp-compare "
EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: the framework is missing or fails to import


class Unavailable(RuntimeError):
    """This cell cannot run on this framework here (e.g. a data-parallel mode its engine does not offer): recorded
    as "unavailable" with the message, not as a failure."""


def writes_records() -> bool:
    """Whether this process writes the cell's records and progress: always, except the workers of a torchrun
    launch (data parallel) other than rank 0."""
    return os.environ.get("RANK", "0") == "0"


class Progress:
    """Writes progress events for the parent; cheap enough to call every step."""

    def __init__(self, stream=None, min_interval_s: float = 0.2):
        self.stream = stream or sys.stdout
        self.min_interval_s = min_interval_s
        self._last = 0.0

    def emit(self, **event) -> None:
        self.stream.write(PROGRESS_PREFIX + json.dumps(event) + "\n")
        self.stream.flush()

    def step(self, epoch: int, epochs: int, step: int, steps: int) -> None:
        now = time.monotonic()
        if now - self._last >= self.min_interval_s or step + 1 == steps:
            self._last = now
            self.emit(kind="step", epoch=epoch, epochs=epochs, step=step + 1, steps=steps)


class SharedInit:
    """One set of initial weights for every cell of a (model, dataset, width, seed).

    The first cell to run saves its framework's freshly initialised weights (canonical numpy
    layout, see kit/weights.py) to `path`; every later cell, in either framework, loads
    them. With no path each framework keeps its own initialisers.
    """

    def __init__(self, path: Path | None, framework: str, seed: int):
        self.path, self.framework, self.seed = path, framework, seed

    def apply(self, model, get_weights: Callable, set_weights: Callable) -> str:
        """Load or save the shared weights; returns where this run's initial weights came from."""
        if self.path is None:
            return f"{self.framework} default initialisers, seed {self.seed}"
        if self.path.exists():
            with np.load(self.path, allow_pickle=False) as saved:
                weights = {k: saved[k] for k in saved.files if k != "__made_by__"}
                made_by = str(saved["__made_by__"]) if "__made_by__" in saved.files else "unknown"
            set_weights(model, weights)
            return f"shared file {self.path.name}, made by {made_by}"
        made_by = f"{self.framework} default initialisers, seed {self.seed}"
        buffer = io.BytesIO()
        np.savez(buffer, __made_by__=np.array(made_by), **get_weights(model))
        atomic_write_bytes(self.path, buffer.getvalue())
        return f"shared file {self.path.name}, made by {made_by} (this cell)"


class CpuPeakMemory:
    """Peak resident memory of this process during training, above its resident memory just before.

    Linux keeps the peak (VmHWM); writing 5 to /proc/self/clear_refs resets it to the current
    resident size, so the peak seen afterwards belongs to training alone.
    """

    kind = "cpu_peak_rss_above_baseline"

    def __init__(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.kind = "cpu_peak_rss_above_baseline_unreset"  # peak may predate training
        self.baseline = self._status_bytes("VmRSS")

    @staticmethod
    def _status_bytes(key: str) -> int:
        return env.proc_status_bytes(key)

    def peak_bytes(self) -> int:
        return max(0, self._status_bytes("VmHWM") - self.baseline)

    def restart_window(self) -> int:
        """Ends the window so far (returns its peak) and starts a new one at the current resident size,
        with the same baseline: what is still resident (weights, optimizer state) keeps counting,
        a one-off spike before now (tracing, compilation) no longer does."""
        before = self.peak_bytes()
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        # Memory freed since the baseline (the pre-training numerics probe's buffers, released by the first
        # step) must not hide the training peak: the baseline is the lowest resident size before the window.
        self.baseline = min(self.baseline, self._status_bytes("VmRSS"))
        return before


class FirstStepWindow:
    """The first step carries one-off work (tracing, compilation, CUDA-graph capture, lazy allocations):
    on a CPU its memory peak is reported apart (first_step_peak_memory_bytes) and the training peak's
    window restarts after it, so the peak is the steady training state's. (On a GPU the allocators'
    peaks count tensors only, not compiler memory: the window stays whole; pass cpu_memory=None.)
    Called from the loop after step 0 is timed: its cost (a write to /proc) falls in step 1, a warm-up step."""

    def __init__(self, cpu_memory: CpuPeakMemory | None):
        self.cpu_memory, self.peak_bytes = cpu_memory, 0

    def after(self, epoch: int, step: int) -> None:
        if epoch == 0 and step == 0 and self.cpu_memory is not None:
            self.peak_bytes = self.cpu_memory.restart_window()


@dataclass
class TrainResult:
    """What a framework's train() measured. Lists are per step / per epoch, in order."""

    step_epoch: list[int] = field(default_factory=list)
    step_loss: list[float] = field(default_factory=list)
    step_loss_scale: list[float] = field(default_factory=list)  # 1.0 where no loss scaling
    step_skipped: list[bool] = field(default_factory=list)  # non-finite gradients, update skipped
    step_time_s: list[float] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)  # keys: REQUIRED["epochs"]
    peak_memory_bytes: int = 0
    memory_kind: str = ""
    diverged_at_step: int | None = None  # first step of the non-finite run that stopped training
    diverged_reason: str = ""  # set when the run diverged for another reason than non-finite losses
    # The run-table columns train() reports about itself (versions, device, settings, the lab's Adam gap, data
    # parallel): contract/tables.py REPORTED declares each with its kind and unit, and Reported refuses any other.
    info: Reported = field(default_factory=Reported)
    nonfinite: dict | None = None  # the NaN/Inf locator's finding at the first non-finite step
    # The other tables, one dict per row, columns declared in contract/tables.py TABLES (checked when written; a
    # table without rows is not written): the numerics lab's dtype audit of one step and gradient magnitudes per
    # layer, an N-worker cell's per-worker values per step, the vit's per-epoch maxima.
    dtypes: list[dict] = field(default_factory=list)
    underflow: list[dict] = field(default_factory=list)
    workers: list[dict] = field(default_factory=list)
    headroom: list[dict] = field(default_factory=list)
    profile_ops: list[dict] = field(default_factory=list)  # --profile: the window's top ops (kit/profile.py)
    profile_primitives: list[dict] = field(default_factory=list)  # --profile: oneDNN primitives it ran
    fp8_layers: list[dict] = field(default_factory=list)  # fp8: per-layer SQNR, first and last step (kit/fp8.py)
    fp8_trace: list[dict] = field(default_factory=list)  # fp8: per-step amax and scale of each converted layer
    # Per validation image (in order), whether the final model classified it correctly: the paired
    # accuracy tests of harness/report/stats.py compare these between precisions.
    val_correct: np.ndarray | None = None
    # The speed budget (kit/training.py SpeedBudget): timed steps after the warm-up where the cell stopped early
    # for being slow, and why; None / "" where it ran in full
    budget_steps: int | None = None
    budget_reason: str = ""
    budget_done: bool = False

    def __post_init__(self) -> None:
        self.info = Reported(self.info)  # a plain dict given: each key checked against the declaration


def first_nonfinite_parameter(weights: dict[str, np.ndarray]) -> str | None:
    """The first parameter (canonical name, in model order) holding inf or NaN, if any."""
    return next((name for name, value in weights.items() if not np.all(np.isfinite(value))), None)


def check_final_weights(result: TrainResult, weights: dict[str, np.ndarray]) -> None:
    """A run whose weights became non-finite diverged, even when its loss stayed finite.

    Seen: Keras fp16-static at scale 2**40 turned every conv weight NaN after step 0 while
    max-pooling kept the loss finite, and the run was recorded "ok". Called once after training.
    """
    bad = first_nonfinite_parameter(weights)
    if bad is None or result.diverged_at_step is not None:
        return
    last = len(result.step_loss) - 1
    result.diverged_at_step = last
    result.diverged_reason = f"non-finite weights ({bad}) after the last step ({last}) while the loss stayed finite"
    if result.nonfinite is None:
        result.nonfinite = {"step": last, "where": "parameters", "layer": bad, "value": "nan/inf", "tensor": bad}


class DivergenceWatch:
    """Counts consecutive non-finite losses; training stops once the run reaches `limit` steps."""

    def __init__(self, limit: int):
        self.limit, self.run = limit, 0

    def update(self, losses: list[float], last_step: int) -> int | None:
        """Feed the losses of the steps up to `last_step`; returns the step the divergence began, or None."""
        for loss in losses:
            self.run = 0 if math.isfinite(loss) else self.run + 1
        return last_step - self.run + 1 if self.run >= self.limit else None


def step_time_summary(step_times: list[float], warmup_steps: int, batch_size: int,
                      train_time_s: float | None = None,
                      epoch_times: list[tuple[float, int]] | None = None) -> dict[str, float]:
    """One timing protocol for both frameworks: warm-up steps dropped, distribution kept.

    The headline, throughput_img_s, is wall time: the images of the timed steps over the time they took
    together (the marks are back to back, so stalls, host syncs and slow steps count, as in a user's
    epoch). median_step_throughput_img_s (batch / median step) is the secondary figure; a gap between
    the two over TIMING_GAP is called out in the report (harness/report/hardware.py). compile_warmup_s: what the
    warm-up steps took beyond as many median steps (tracing, compilation, CUDA-graph capture).

    Where per-step times were not measured (device mode, kit/training.times_each_step: NaN), both come from training
    time over steps and the percentiles stay missing. epoch_times: (training seconds, steps) per epoch. The first
    epoch holds the tracing and compilation (XLA, torch.compile) as the warm-up steps do in host mode: where
    later epochs ran, they alone are timed and compile_warmup_s is what the first took beyond as many of
    their steps (without them, all epochs: compilation included, compile_warmup_s missing).
    """
    nan = float("nan")
    if step_times and np.all(np.isnan(step_times)) and train_time_s:
        later = [(t, n) for t, n in (epoch_times or [])[1:] if n > 0]
        median, warm = train_time_s / len(step_times), nan
        if later:
            median = sum(t for t, _ in later) / sum(n for _, n in later)
            warm = max(0.0, epoch_times[0][0] - epoch_times[0][1] * median)
        return {"median_step_s": median, "p90_step_s": nan, "p99_step_s": nan,
                "throughput_img_s": batch_size / median, "median_step_throughput_img_s": batch_size / median,
                "steps_timed": 0, "compile_warmup_s": warm}
    times = np.asarray(step_times[warmup_steps:] or step_times, dtype=float)
    if times.size == 0:
        return {"median_step_s": nan, "p90_step_s": nan, "p99_step_s": nan, "throughput_img_s": nan,
                "median_step_throughput_img_s": nan, "steps_timed": 0, "compile_warmup_s": nan}
    median, wall = float(np.median(times)), float(times.sum())
    warm = np.asarray(step_times[:warmup_steps], dtype=float) if times.size < len(step_times) else times[:0]
    return {
        "median_step_s": median,
        "p90_step_s": float(np.percentile(times, 90)),
        "p99_step_s": float(np.percentile(times, 99)),
        "throughput_img_s": batch_size * times.size / wall if wall > 0 else nan,
        "median_step_throughput_img_s": batch_size / median if median > 0 else nan,
        "steps_timed": int(times.size),
        "compile_warmup_s": float(np.maximum(warm - median, 0).sum()) if warm.size else nan,
    }


def steps_table(identity: dict, result: TrainResult, warmup_steps: int) -> pd.DataFrame:
    """One row per training step: loss, loss scale, skipped, step time, and whether it is a warm-up step."""
    n = len(result.step_loss)
    steps = pd.DataFrame({
        **{k: [v] * n for k, v in identity.items()},
        "epoch": result.step_epoch,
        "step": list(range(n)),
        "loss": np.asarray(result.step_loss, dtype=float),
        "loss_scale": np.asarray(result.step_loss_scale, dtype=float),
        "skipped": np.asarray(result.step_skipped, dtype=bool),
        "step_time_s": np.asarray(result.step_time_s, dtype=float),
    })
    steps["warmup"] = steps["step"] < warmup_steps
    return steps


def derived_columns(run: dict, nonfinite: dict | None) -> dict:
    """The run row's columns that follow from the others: achieved FLOP/s, MFU against both FLOP/s ceilings (the
    cell's own; the report recomputes MFU against the run's one ceiling per device and dtype), and the NaN/Inf
    locator's finding (nonfinite_step -1: none)."""
    out = {"achieved_flops": run["flops_per_image"] * run["throughput_img_s"]}
    for kind in ("measured", "table"):
        ceiling = float(run.get(f"ceiling_flops_{kind}", float("nan")) or float("nan"))
        out[f"mfu_{kind}"] = out["achieved_flops"] / ceiling if ceiling > 0 else float("nan")
    out.update({f"nonfinite_{k}": (nonfinite or {}).get(k, "") for k in ("step", "where", "layer", "value", "tensor")})
    if out["nonfinite_step"] == "":
        out["nonfinite_step"] = -1
    return out


def outcome_columns(cfg: RunConfig, result: TrainResult, dataset: Dataset, identity: dict) -> dict:
    """The run row's status, configuration, data and final figures (how the cell ended and on what)."""
    last = result.epochs[-1] if result.epochs else {}
    diverged = result.diverged_at_step is not None
    return {
        "schema_version": records.SCHEMA_VERSION,
        "status": "diverged" if diverged else "ok",
        "error": (result.diverged_reason or
                  f"non-finite loss for {cfg.diverge_after} consecutive steps from step {result.diverged_at_step}"
                  if diverged else ""),
        "diverged_at_step": result.diverged_at_step if diverged else -1,
        "stderr_tail": "",
        **{f"cfg_{k}": v for k, v in cfg.to_dict().items() if k not in identity},
        "dataset_source": dataset.source,
        "train_samples": len(dataset.x_train),
        "val_samples": len(dataset.x_val),
        "final_val_accuracy": last.get("val_accuracy", float("nan")),
        "val_correct": pack_correct(result.val_correct) if result.val_correct is not None else "",
        "final_val_loss": last.get("val_loss", float("nan")),
        "final_train_loss": last.get("train_loss", float("nan")),
    }


def build_tables(run_id: str, cfg: RunConfig, result: TrainResult, dataset: Dataset,
                 wall_s: float) -> dict[str, pd.DataFrame]:
    identity = {"run_id": run_id, "cell_id": cfg.cell_id, "framework": cfg.framework, "model": cfg.model,
                "dataset": cfg.dataset, "precision": cfg.precision, "seed": cfg.seed}
    steps = steps_table(identity, result, cfg.warmup_steps)
    epochs = pd.DataFrame([{**identity, **row} for row in result.epochs])
    train_time = float(sum(e["train_time_s"] for e in result.epochs))
    images = len(steps) * cfg.batch_size
    lap("records")
    performance = performance_columns(cfg, dataset, result.info)
    lap("flop count")
    run = {
        **identity,
        **outcome_columns(cfg, result, dataset, identity),
        **step_time_summary(result.step_time_s, cfg.warmup_steps, cfg.batch_size, train_time,
                            [(e["train_time_s"], result.step_epoch.count(e["epoch"])) for e in result.epochs]),
        "train_time_s": train_time,
        # The first step carries tracing / compilation (torch.compile, XLA, tf.function) and kernel setup:
        # its excess over the median step is reported apart from step time.
        "first_step_overhead_s": (max(0.0, result.step_time_s[0] - float(np.median(result.step_time_s)))
                                  if result.step_time_s and not np.isnan(result.step_time_s[0]) else float("nan")),
        "eval_time_s": float(sum(e["eval_time_s"] for e in result.epochs)),
        "epoch_throughput_img_s": images / train_time if train_time > 0 else float("nan"),
        "steps_total": len(steps),
        "skipped_steps": int(steps["skipped"].sum()),
        "peak_memory_bytes": int(result.peak_memory_bytes),
        **performance,
        "memory_kind": result.memory_kind,
        "child_wall_s": wall_s,
        # the speed budget (kit/training.py): missing / "" where the cell ran in full
        "budget_steps": result.budget_steps,
        "budget_reason": result.budget_reason,
        **env.cpu_info(),
        **env.placement(),  # host, GPUs and CPUs the cell ran on (harness/run/launchers.py places cells)
        **{k: (json.dumps(v, sort_keys=True) if isinstance(v, dict) else "" if v is None else v)
           for k, v in result.info.items()},
    }
    run.update(derived_columns(run, result.nonfinite))
    tables = {"run": pd.DataFrame([run]).astype({"budget_steps": "Int64"}), "epochs": epochs, "steps": steps}
    for name in records.OPTIONAL_TABLES:
        if rows := getattr(result, name, None):  # phases: added by child_main once the records are timed
            tables[name] = pd.DataFrame([{**identity, **row} for row in rows])
    for name, table in tables.items():  # every column declared and of its kind, before anything is written
        check(name, table, strict=True)
    return tables


def performance_columns(cfg: RunConfig, dataset: Dataset, info: dict) -> dict:
    """FLOPs per image (kit/flops.py: one count for both frameworks); the throughput-based columns
    (achieved FLOP/s, MFU) follow from these and the headline throughput in `derived_columns`."""
    from amp_compare.kit.flops import train_flops

    return {"flops_per_image": float(train_flops(cfg.model, dataset.input_shape, dataset.num_classes, cfg.width,
                                                 cfg.vit_shape)),
            "step_loop": cfg.step}


def phases_table(run: pd.Series, result: TrainResult) -> pd.DataFrame:
    """The child's phases (kit/phases.py) as one row each, with the cell's identity. Two parts measured inside the
    training lap are moved out of it: the validation passes (the epochs' eval_time_s: inside Keras' fit, between
    torch's epochs) and the warm-up steps' time beyond as many median steps (compile_warmup_s: tracing,
    compilation, first-touch allocations)."""
    PHASES.lap("records")
    PHASES.move(float(sum(e["eval_time_s"] for e in result.epochs)), "training", "evaluation")
    warm = float(run.get("compile_warmup_s", float("nan")))
    if math.isfinite(warm):
        PHASES.move(warm, "training", "compile/warm-up")
    identity = {k: run[k] for k in records.IDENTITY}
    return pd.DataFrame([{**identity, **row} for row in PHASES.rows()])


TrainFn = Callable[[RunConfig, Dataset, Progress, SharedInit], TrainResult]


def child_entry(train_module: str) -> int:
    """`python -m torch_impl|keras_impl` lands here: a framework that fails to import is 'unavailable'; with --trial
    the process runs a speed trial instead of a cell."""
    lap("process start")
    try:
        train_fn = importlib.import_module(train_module).train
        lap("framework import")
    except ImportError as exc:
        print(f"unavailable: {train_module} cannot import its framework ({exc})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if "--trial" in sys.argv[1:]:  # a speed trial (kit/trial.py), run by the twin's trial module
        from amp_compare.kit.trial import trial_main

        twin = importlib.import_module(train_module.rsplit(".", 1)[0] + ".trial")
        return trial_main(twin.steppers, set_threads=getattr(twin, "set_threads", None))
    return child_main(train_fn)


def child_main(train_fn: TrainFn, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train one amp-compare cell and write its records.")
    parser.add_argument("--config", required=True, type=Path, help="RunConfig JSON file")
    parser.add_argument("--out", required=True, type=Path, help="cell folder to write records into")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--init-file", type=Path, default=None, help="shared initial weights (.npz)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="the run's cache of work reused across seeds")
    args = parser.parse_args(argv)
    reuse.CACHE_DIR = args.cache_dir  # kit/reuse.py: the dtype audit and the FLOP/s ceiling, reused across seeds
    start = time.perf_counter()
    try:
        cfg = RunConfig.from_json(args.config.read_text())
    except (OSError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lap("config")
    dataset = load_dataset(cfg.dataset, cfg.data_dir)
    lap("data")
    progress = Progress(None if writes_records() else open(os.devnull, "w"))  # DATA PARALLEL: rank 0 reports
    try:
        result = train_fn(cfg, dataset, progress, SharedInit(args.init_file, cfg.framework, cfg.seed))
    except Unavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if not writes_records():  # DATA PARALLEL: a torchrun worker other than rank 0 trained; rank 0 writes
        return 0
    tables = build_tables(args.run_id, cfg, result, dataset, time.perf_counter() - start)
    tables["phases"] = phases_table(tables["run"].iloc[0], result)
    records.write_cell(args.out, tables)
    progress.emit(kind="done")
    return 0
