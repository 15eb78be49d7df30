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

    def start_epoch(self, epoch: int, steps: int) -> None:
        self.epoch, self.steps, self.first = epoch, steps, len(self.result.step_loss)

    def add(self, losses: list[float], scales: list[float], skipped: list[bool]) -> bool:
        """The next steps' values, in order; True once the run has diverged (the loop stops)."""
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
        return r.diverged_at_step is not None

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
    result.dtypes = lab.dtype_audit(model, *first_batch, cfg.precision)
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
