"""PyTorch training for one amp-compare cell: an explicit loop, torch.amp end to end.

Read this file beside tf_impl/train.py: the functions have the same names and order, and the
AMP lines (marked `# AMP:`) are where the frameworks differ. Per-step values stay on the
device during an epoch and are copied to the host once at its end, so the loop has no
per-step host synchronisation on a GPU.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from common.child import CpuPeakMemory, Progress, TrainResult
from common.config import RunConfig
from common.data import Dataset, epoch_batches
from torch_impl.models import build_model

AMP_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
EVAL_BATCH = 512


def setup(cfg: RunConfig) -> None:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    try:
        torch.set_num_interop_threads(cfg.threads)
    except RuntimeError:  # only settable before the first parallel work in the process
        pass


def make_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_epsilon)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)


def make_scaler(cfg: RunConfig) -> torch.amp.GradScaler:
    # AMP: dynamic loss scaling for fp16 only; a disabled scaler makes scale/step/update pass through.
    return torch.amp.GradScaler(cfg.device, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval,
                                enabled=cfg.loss_scaling)


def current_scale(scaler: torch.amp.GradScaler, device: torch.device) -> torch.Tensor:
    """The live loss scale as a device tensor (get_scale() would synchronise every step)."""
    if not scaler.is_enabled():
        return torch.ones((), device=device)
    if scaler._scale is None:  # created lazily by the first scaler.scale()
        return torch.full((), scaler.get_scale(), device=device)
    return scaler._scale.detach().clone().reshape(())


def train_step(model, optimizer, scaler, x, y, amp_dtype):
    """One optimizer step. Returns (loss, correct) as device tensors."""
    with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):  # AMP: op-level casts
        logits = model(x)
        loss = F.cross_entropy(logits, y)  # autocast computes this in float32
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()  # AMP: backward of loss * scale
    scaler.step(optimizer)  # AMP: unscale gradients; skip the update if any is inf/NaN
    scaler.update()  # AMP: halve the scale on overflow, double it after growth_interval good steps
    return loss.detach(), (logits.argmax(1) == y).sum()


@torch.no_grad()
def evaluate(model, x, y, amp_dtype) -> tuple[float, float]:
    """Validation loss and accuracy, under the same precision as training."""
    model.eval()
    loss_sum = torch.zeros((), device=x.device)
    correct = torch.zeros((), device=x.device, dtype=torch.long)
    for i in range(0, len(x), EVAL_BATCH):
        xb, yb = x[i:i + EVAL_BATCH], y[i:i + EVAL_BATCH]
        with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(xb)
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").float()
        correct += (logits.argmax(1) == yb).sum()
    model.train()
    return loss_sum.item() / len(x), correct.item() / len(x)


def make_dataset(data: Dataset, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The whole (small) dataset as device tensors, NHWC -> NCHW once; batches are gathered by index."""
    def images(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(device)

    return (images(data.x_train), torch.from_numpy(data.y_train).to(device),
            images(data.x_val), torch.from_numpy(data.y_val).to(device))


class StepClock:
    """Per-step wall time: CUDA events on a GPU (read at epoch end, no sync), else perf_counter."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks; resets the clock."""
        if self.cuda:
            torch.cuda.synchronize()
            out = [a.elapsed_time(b) / 1000.0 for a, b in zip(self.marks, self.marks[1:])]
        else:
            out = list(np.diff(self.marks))
        self.marks = []
        return out


def train(cfg: RunConfig, data: Dataset, progress: Progress) -> TrainResult:
    setup(cfg)
    device = torch.device(cfg.device)
    amp_dtype = AMP_DTYPES[cfg.precision]
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(device)
    optimizer = make_optimizer(cfg, model.parameters())
    scaler = make_scaler(cfg)
    x_train, y_train, x_val, y_val = make_dataset(data, device)

    result = TrainResult(info={
        "framework_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "amp_api": "torch.autocast + torch.amp.GradScaler" if cfg.loss_scaling else
                   ("torch.autocast" if cfg.mixed else "none"),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
    })
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        cpu_memory = CpuPeakMemory()
    model.train()
    clock = StepClock(device)
    for epoch in range(cfg.epochs):
        plan = torch.from_numpy(epoch_batches(len(x_train), cfg.batch_size, cfg.seed, epoch,
                                              cfg.steps_per_epoch)).to(device)
        losses, corrects, scales_used, scales_after = [], [], [], []
        clock.mark()
        for step, idx in enumerate(plan):
            scales_used.append(current_scale(scaler, device))
            loss, correct = train_step(model, optimizer, scaler, x_train[idx], y_train[idx], amp_dtype)
            scales_after.append(current_scale(scaler, device))
            losses.append(loss)
            corrects.append(correct)
            clock.mark()
            progress.step(epoch, cfg.epochs, step, len(plan))
        step_times = clock.intervals()  # synchronises once per epoch
        train_time = float(sum(step_times))
        eval_start = time.perf_counter()
        val_loss, val_accuracy = evaluate(model, x_val, y_val, amp_dtype)
        eval_time = time.perf_counter() - eval_start

        used, after = torch.stack(scales_used).cpu(), torch.stack(scales_after).cpu()
        epoch_losses = torch.stack(losses).float().cpu().numpy()
        result.step_epoch += [epoch] * len(plan)
        result.step_loss += epoch_losses.tolist()
        result.step_loss_scale += used.tolist()
        result.step_skipped += (after < used).tolist()  # the scaler backs off only on a skipped step
        result.step_time_s += step_times
        result.epochs.append({
            "epoch": epoch,
            "train_loss": float(np.mean(epoch_losses)),
            "train_accuracy": float(torch.stack(corrects).sum().item()) / (len(plan) * cfg.batch_size),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "train_time_s": train_time,
            "eval_time_s": eval_time,
        })
    if device.type == "cuda":
        result.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
        result.memory_kind = "cuda_allocator_peak"
    else:
        result.peak_memory_bytes = cpu_memory.peak_bytes()
        result.memory_kind = cpu_memory.kind
    return result
