"""The framework-free half of both train() functions: what a step returns, and what happens to it on the host.

Both `amp.train_step`s return one `StepRecord` of device tensors. Each framework's loop
(torch_impl/loop.py, keras_impl/loop.py) keeps the records on the device and hands host copies of
consecutive steps to one `StepBook` per run, which appends them to the TrainResult, fires the NaN/Inf
locator at the first non-finite or skipped step, watches for divergence and reports progress: the
loops then differ only where the frameworks do. Also here: the numerics lab's underflow rows and the
peak probe's dtype names, written once for both.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import RunConfig
from amp_compare.contract.twins import Locate
from amp_compare.kit.child import DivergenceWatch, Progress, TrainResult, first_nonfinite_parameter
from amp_compare.kit.data import epoch_batches
from amp_compare.kit.dataparallel import numerics_for
from amp_compare.kit.phases import SLOW_STEP_ENV
from amp_compare.kit.reuse import cached

# kit/ceiling.py names a matmul's dtype fp32/tf32/fp16/bf16; the frameworks' tensors take these names
# (tf32: float32 tensors, the TF32 switch set by setup()).
TENSOR_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "fp32": "float32"}


class StepRecord(NamedTuple):
    """One optimizer step, as both amp.train_step return it: device tensors, nothing read on the host."""

    loss: Any  # the batch's unscaled mean loss (float32)
    logits: Any  # the forward's output (the loop counts correct predictions from it)
    scale: Any  # the loss scale the step used (1.0: no scaling)
    skipped: Any  # bool: the optimizer did not update (non-finite gradients)


NOT_REPRODUCED = {"where": "not reproduced", "layer": "", "value": ""}

# The speed budget (RunConfig.speed_budget, docs/MEASUREMENT.md "Speed budget"). A precision this machine runs
# pathologically slowly (seen: fp16 convolutions 50-100x slower than fp32 on CPUs with AVX-512 FP16, 147-262 s a
# cell) is noticed from its first measured steps and timed over a bounded number of steps instead of its full epochs.
BUDGET_PROBE_STEPS = 10  # measured steps after the warm-up whose median projects the cell's training time
# The training time a budgeted cell aims to spend measuring, warm-up and probe included, as a share of the cell
# budget: 10 s of the default 60 s (then BUDGET_MIN_STEPS decides, at that Xeon's 0.75-0.96 s float16 steps)
BUDGET_MEASURE_SHARE = 1 / 6
# At least two batch means of harness/report/stats.py's BLOCK (20) steps: a one-seed speed interval needs two
BUDGET_MIN_STEPS = 40
BUDGET_MAX_STEPS = 200  # stats.py's ten batch means of 20 steps: more adds nothing to the interval
# Where the same framework's fp32 cell of this run finished first (RunConfig.speed_reference_step_s), only a cell
# this many times slower per step is budgeted: a busy machine slows fp32 too, and a mixed precision a few times
# slower than fp32 (this project's CPUs without half-precision units: 2-10x) is a result to measure in full
BUDGET_SLOW_RATIO = 20.0


def simulated_slow_step(precision: str) -> float:
    """Seconds SLOW_STEP_ENV adds to each step of `precision` (0: none; tests only)."""
    for item in os.environ.get(SLOW_STEP_ENV, "").split(","):
        name, _, seconds = item.partition("=")
        if name.strip() == precision and seconds:
            return float(seconds)
    return 0.0


class SpeedBudget:
    """Decides, from the first measured steps, whether a cell runs in full or is timed over `steps` steps.

    The clock is the host's, at each StepBook.add: on a CPU the loops add every step, so the intervals are the
    steps' (on a GPU, batches of them: their mean). After the warm-up and BUDGET_PROBE_STEPS more, the median
    interval times the steps still planned, plus the time so far, projects the cell's training; past
    cfg.speed_budget_s (and, where the same framework's fp32 cell finished first, BUDGET_SLOW_RATIO times its median
    step) the cell is budgeted: `steps` timed steps after the warm-up (enough for BUDGET_MEASURE_SHARE of the budget
    in all, at least BUDGET_MIN_STEPS), then the loop stops, and `reason` says why in numbers."""

    def __init__(self, cfg: RunConfig, planned_steps: int):
        self.cfg, self.planned = cfg, planned_steps
        self.marks: list[float] = [time.perf_counter()]
        self.steps: int | None = None  # timed steps of a budgeted cell (None: it runs in full, or undecided)
        self.reason = ""
        # DATA PARALLEL: an N-worker cell runs in full (its workers must stop together; they would not)
        self.decided = (not cfg.speed_budget or cfg.replicas > 1
                        or planned_steps <= cfg.warmup_steps + BUDGET_PROBE_STEPS + BUDGET_MIN_STEPS)

    def update(self, done: int, added: int) -> bool:
        """`added` steps just ended, `done` in all; True once a budgeted cell has run its steps (stop)."""
        now = time.perf_counter()
        self.marks += [self.marks[-1] + (now - self.marks[-1]) * (k + 1) / added for k in range(added)]
        if not self.decided and done >= self.cfg.warmup_steps + BUDGET_PROBE_STEPS:
            self.decide(done)
        return self.steps is not None and done >= self.cfg.warmup_steps + self.steps

    def decide(self, done: int) -> None:
        self.decided = True
        probe = [b - a for a, b in zip(self.marks[-BUDGET_PROBE_STEPS - 1:-1], self.marks[-BUDGET_PROBE_STEPS:])]
        median = sorted(probe)[len(probe) // 2]
        so_far = self.marks[-1] - self.marks[0]
        projected = so_far + median * (self.planned - done)
        reference = self.cfg.speed_reference_step_s
        if projected <= self.cfg.speed_budget_s or median <= 0 or \
                (reference and median < BUDGET_SLOW_RATIO * reference):  # not over the budget, or fp32 is slow too
            return
        measure_s = BUDGET_MEASURE_SHARE * self.cfg.speed_budget_s
        steps = int(max(BUDGET_MIN_STEPS, min(BUDGET_MAX_STEPS, (measure_s - so_far) // median)))
        if self.cfg.warmup_steps + steps >= self.planned:
            return
        self.steps = steps
        slower = (f", {median / reference:.0f}x the median step of this framework's fp32 cell in this run "
                  f"({reference * 1e3:.1f} ms)" if reference else "")
        self.reason = (f"projected {projected:.0f} s of training ({self.planned} steps; median step "
                       f"{median * 1e3:.1f} ms over steps {done - BUDGET_PROBE_STEPS}-{done - 1}{slower}) is over the "
                       f"cell budget of {self.cfg.speed_budget_s:g} s: timed over {steps} steps after the "
                       f"{self.cfg.warmup_steps} warm-up steps instead (--no-speed-budget runs it in full)")


class StepBook:
    """The host side of a run's step records, shared by both frameworks' loops.

    add() takes the host values of the steps since the last call (one step, or a batch of them where the
    loop reads the device less often); the first step whose loss is non-finite or whose update was skipped
    runs the locator once: a non-finite parameter, else `locate` (contract/twins.Locate) on that step's batch
    at the scale that step used; the divergence watch says when to stop.
    """

    def __init__(self, cfg: RunConfig, result: TrainResult, progress: Progress,
                 weights: Callable[[], dict], locate: Locate | None):
        self.cfg, self.result, self.progress, self.weights, self.locate = cfg, result, progress, weights, locate
        self.watch = DivergenceWatch(cfg.diverge_after)
        self.epoch, self.steps, self.first = 0, 0, 0
        self.budget = SpeedBudget(cfg, 0)  # planned at the first epoch's start, from its steps
        self.slow_step = simulated_slow_step(cfg.precision)  # 0 outside tests

    @property
    def stopped(self) -> bool:
        """Whether training stopped early: diverged, or a budgeted cell ran its steps."""
        return self.result.diverged_at_step is not None or self.result.budget_done

    def start_epoch(self, epoch: int, steps: int) -> None:
        self.epoch, self.steps, self.first = epoch, steps, len(self.result.step_loss)
        if epoch == 0:  # the clock of the speed budget starts with training
            self.budget = SpeedBudget(self.cfg, self.cfg.epochs * steps)

    def add(self, losses: list[float], scales: list[float], skipped: list[bool]) -> bool:
        """The next steps' values, in order; True once the run has diverged or a budgeted cell has run its steps
        (the loop stops)."""
        r, start = self.result, len(self.result.step_loss)
        r.step_epoch += [self.epoch] * len(losses)
        r.step_loss += losses
        r.step_loss_scale += scales
        r.step_skipped += skipped
        if self.locate is not None:
            bad = next((k for k, (loss, skip) in enumerate(zip(losses, skipped))
                        if skip or not math.isfinite(loss)), None)
            if bad is not None:
                self.nonfinite(start + bad, scales[bad])
        r.diverged_at_step = self.watch.update(losses, len(r.step_loss) - 1)
        self.progress.step(self.epoch, self.cfg.epochs, len(r.step_loss) - 1 - self.first, self.steps)
        if self.slow_step:
            time.sleep(self.slow_step * len(losses))
        if self.budget.update(len(r.step_loss), len(losses)) and r.diverged_at_step is None:
            r.budget_steps, r.budget_reason, r.budget_done = self.budget.steps, self.budget.reason, True
        return self.stopped

    def nonfinite(self, step: int, scale: float) -> None:
        """NaN/Inf locator: a non-finite parameter, else where the step's batch first turns non-finite."""
        bad = first_nonfinite_parameter(self.weights())
        found = ({"where": "parameters", "layer": bad, "value": "nan/inf", "tensor": bad} if bad else
                 self.locate(self.epoch, step - self.first, scale))
        self.result.nonfinite = {"step": step, **(found or NOT_REPRODUCED)}
        self.locate = None  # once per run

    def headroom(self, rows: list[dict]) -> None:
        """The vit's headroom maxima read at this epoch's end (the framework's vit.read_headroom: none for a
        CNN), tagged with the epoch, for the run's headroom table."""
        if rows:
            self.result.headroom.extend({**row, "epoch": self.epoch} for row in rows)

    def end_epoch(self, step_times: list[float], train_time_s: float, eval_time_s: float, correct: int,
                  val_loss: float, val_accuracy: float) -> None:
        """The epoch's row (train accuracy: correct predictions over the images of its steps)."""
        r = self.result
        steps = len(r.step_loss) - self.first
        r.step_time_s += step_times
        r.epochs.append({
            "epoch": self.epoch,
            "train_loss": float(np.mean(r.step_loss[self.first:])) if steps else float("nan"),
            "train_accuracy": correct / (steps * self.cfg.batch_size) if steps else float("nan"),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "train_time_s": train_time_s,
            "eval_time_s": eval_time_s,
        })


def times_each_step(cfg: RunConfig) -> bool:
    """How both loops time the training steps: one rule for the twins, from --step-values.

    True (host mode: a CPU, --step-values host, every N-worker cell): each step's wall time, a clock mark once the
    step has finished; on a CPU a step's values are host memory when it ends, on a GPU the loop waits for each step
    first (Keras: fit() converting its logs; torch: a device synchronisation).
    False (device mode: --step-values device, or auto on a GPU): the step values stay on the device between reads,
    so no step is waited for and none is timed alone (untimed_steps: NaN each; a device timeline such as CUDA
    events is not something every Keras backend offers). The epoch's wall time, until the host holds its last
    step's values, is its training time, which kit/child.step_time_summary divides by the steps.
    """
    if cfg.replicas > 1:  # an N-worker cell's per-worker values come with each step
        return True
    return cfg.step_values == "host" or (cfg.step_values == "auto" and cfg.device != "cuda")


def untimed_steps(steps: int) -> list[float]:
    """The step times of device mode (times_each_step False): missing, one NaN per step."""
    return [float("nan")] * steps


EVAL_BATCH = 512  # images per validation batch, both frameworks (memory only: the result does not depend on it)


def first_batch_index(cfg: RunConfig, n_train: int) -> np.ndarray:
    """The first training batch's image indices (the seeded plan's): the numerics lab measures on it."""
    return epoch_batches(n_train, cfg.batch_size, cfg.seed, 0, cfg.steps_per_epoch)[0]


def numerics_lab(cfg: RunConfig, numerics, model, first_batch: tuple, scale: float, optimizer,
                 result: TrainResult) -> None:
    """The numerics lab on the first batch, outside the timed loop: the dtype audit, gradient underflow at the
    scale in use, and in defaults mode with Adam the two Adam formulas' gap (numerics: the framework's module; an
    N-worker cell's measures nothing, kit/dataparallel.py)."""
    lab = numerics_for(cfg, numerics)
    # the audit depends on the configuration, not the seed's weights: one seed's child makes it for all (kit/reuse.py)
    result.dtypes = cached("dtypes", cfg, lambda: lab.dtype_audit(model, *first_batch, cfg.precision))
    result.underflow = underflow_rows(lab, model, first_batch, cfg.precision, scale, "first step", 0)
    if cfg.comparison == "defaults" and cfg.optimizer == "adam":  # the two Adams, measured on this batch
        result.info.update(lab.adam_formula_gap(model, *first_batch, cfg.precision, optimizer))


def last_underflow(cfg: RunConfig, numerics, model, first_batch: tuple, scale: float, result: TrainResult) -> None:
    """The underflow rows of the first batch again, at the last step's weights and scale."""
    result.underflow += underflow_rows(numerics_for(cfg, numerics), model, first_batch, cfg.precision,
                                                scale, "last step", len(result.step_loss) - 1)


def underflow_rows(numerics, model, batch: tuple, precision: str, scale: float, when: str,
                   step: int) -> list[dict]:
    """Per-layer gradient magnitudes of one batch against float16's range, at the scale in use then
    (numerics: the framework's numerics module). None for fp8 cells: their formats' range is the fp8 section's
    (per-layer SQNR and flushed share, kit/fp8.py), not float16's."""
    if precisions.of(precision).fp8:
        return []
    rows = numerics.gradient_underflow(model, *batch, precision, loss_scale=scale)
    return [{**row, "when": when, "at_step": step, "log2_hist": json.dumps(row.get("log2_hist"))} for row in rows]


@contextmanager
def recording_paused(recorders: list) -> Iterator[None]:
    """Set `record` False on each of the vit's headroom recorders (LayerNorm / attention layers, either framework)
    for the duration, then restore what each had: the numerics lab and FLOP counting measure the model's work
    alone."""
    saved = [layer.record for layer in recorders]
    for layer in recorders:
        layer.record = False
    try:
        yield
    finally:
        for layer, record in zip(recorders, saved):
            layer.record = record
