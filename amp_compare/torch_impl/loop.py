"""PyTorch's instrumented training loop: amp.train_step per batch, records kept on the device, read in runs.

Read beside keras_impl/loop.py (fit() with a recording callback). run_epoch keeps each step's
StepRecord (kit/training.py) on the device and hands host copies to the run's StepBook every
`read_every` steps: every step on a CPU, where a read is a copy in memory (the locator and the
divergence watch then act at the step itself), every 25 on a GPU, where a read waits for the device.
StepClock times the steps as Keras' recorders do (kit/training.times_each_step).
benchmarks/overhead.py measures what this loop costs against the tutorial's plain loop.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from amp_compare.kit.child import FirstStepWindow
from amp_compare.kit.training import EVAL_BATCH, StepBook, untimed_steps
from amp_compare.torch_impl.amp import mixed_precision, train_step

GPU_READ_EVERY = 25  # steps between host reads of the records on a GPU


class StepClock:
    """Step wall times as kit/training.times_each_step defines them for both twins. each_step (None: the rule's
    default for the device, a CPU yes, a GPU no): perf_counter marks between steps, on a GPU each after a device
    synchronisation. Otherwise a mark only counts a step (no wait; the first one, the epoch's start, waits for
    work queued before it) and the steps' times are missing, the marks' span to the device's end of work their
    training time."""

    def __init__(self, device: torch.device, each_step: bool | None = None):
        self.cuda = device.type == "cuda"
        self.each_step = not self.cuda if each_step is None else each_step
        self.marks: list[float] = []
        self.elapsed = 0.0  # the training time of the steps intervals() last returned

    def mark(self) -> None:
        if self.cuda and (self.each_step or not self.marks):
            torch.cuda.synchronize()
        self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds of each step between consecutive marks (untimed_steps' NaN where steps are not timed alone),
        their training time in `elapsed` (the sum, or the span until the device finished); resets the clock."""
        if self.each_step:
            out = np.diff(self.marks).tolist()
            self.elapsed = float(sum(out))
        else:
            if self.cuda:
                torch.cuda.synchronize()
            out = untimed_steps(max(len(self.marks) - 1, 0))
            self.elapsed = time.perf_counter() - self.marks[0] if self.marks else 0.0
        self.marks = []
        return out


def to_host(values: list[torch.Tensor]) -> list:
    """Host values of 0-d device tensors: one copy for the lot (item() for a single one)."""
    return [values[0].item()] if len(values) == 1 else torch.stack(values).tolist()


def run_epoch(net, optimizer, scaler, x, y, plan, precision: str, clock: StepClock, book: StepBook,
              clip_grad_norm: float | None = None, graphs: bool = False, read_every: int | None = None,
              first_step: FirstStepWindow | None = None) -> tuple[int, list[float]]:
    """One epoch of amp.train_step over the plan's batches; returns (correct predictions, step times).

    The records go to `book` (losses, scales, skips, the locator, the divergence watch) every read_every
    steps and at the end; the epoch stops early once it says the run diverged. Nothing else is read on the
    host during the epoch (tests/test_perf.py counts the reads). graphs: CUDA graphs (--step tuned on a GPU)
    start a step. first_step: the CPU memory window restarted after the run's first step.
    """
    read_every = read_every or (GPU_READ_EVERY if x.device.type == "cuda" else 1)
    records, predicted, read = [], [], 0
    clock.mark()
    for step, idx in enumerate(plan):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        record = train_step(net, optimizer, scaler, x[idx], y[idx], precision, clip_grad_norm)
        records.append(record)
        predicted.append(record.logits.argmax(1))  # now: CUDA graphs reuse the logits' memory next step
        clock.mark()
        if step == 0 and first_step is not None:
            first_step.after(book.epoch, step)
        if step + 1 - read >= read_every or step + 1 == len(plan):
            fresh, read = records[read:], step + 1
            if book.add(*(to_host([getattr(r, k) for r in fresh]) for k in ("loss", "scale", "skipped"))):
                break
    step_times = clock.intervals()  # device mode: the epoch's one synchronisation (its span in clock.elapsed)
    correct = (torch.stack(predicted) == y[plan[:len(predicted)]]).sum()
    return int(correct.item()), step_times


@torch.no_grad()
def evaluate(model, x, y, precision: str) -> tuple[float, float, np.ndarray]:
    """Validation loss, accuracy and, per image, whether it was classified correctly (the last epoch's go to
    the paired tests of harness/report/stats.py), under the same precision as training."""
    model.eval()
    loss_sum = torch.zeros((), device=x.device)
    hits = []
    for i in range(0, len(x), EVAL_BATCH):
        xb, yb = x[i:i + EVAL_BATCH], y[i:i + EVAL_BATCH]
        with mixed_precision(precision, x.device.type):
            logits = model(xb)
            loss_sum += torch.nn.functional.cross_entropy(logits, yb, reduction="sum").float()
        hits.append(logits.argmax(1) == yb)
    model.train()
    correct = torch.cat(hits).cpu().numpy()  # one read of the device per pass
    return loss_sum.item() / len(x), float(correct.mean()), correct


def host_syncs_per_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> int:
    """Host synchronisations per step the training step itself makes on a GPU (the loop adds none):
    GradScaler.step reads found_inf on the host unless the optimizer takes it on the device."""
    return int(scaler.is_enabled() and not getattr(optimizer, "_step_supports_amp_scaling", False))
