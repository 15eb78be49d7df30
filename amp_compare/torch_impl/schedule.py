"""The learning-rate schedule in PyTorch: kit/schedule.py's step-indexed factor through LambdaLR.

The scheduler advances in an optimizer step post-hook, i.e. after each update the optimizer really made: an
update GradScaler skips (non-finite gradients) calls no optimizer.step and does not advance it, as a skipped
LossScaleOptimizer step does not advance Keras' optimizer.iterations, which its schedule reads
(keras_impl/optimizers.WarmupCosine). So both frameworks use the same rate at every update.
"""

from __future__ import annotations

import torch

from amp_compare.contract.config import RunConfig
from amp_compare.kit import schedule


def attach(optimizer: torch.optim.Optimizer, cfg: RunConfig) -> torch.optim.Optimizer:
    """The cell's schedule on `optimizer` (constant: nothing to attach). Returns the optimizer; its `lr_schedule`
    attribute holds (total, warmup) for settings_used."""
    if cfg.lr_schedule != "warmup-cosine":
        return optimizer
    total, warmup = schedule.run_updates(cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: schedule.lr_factor(update, total, warmup))
    optimizer.register_step_post_hook(lambda *_: scheduler.step())
    optimizer.lr_schedule = (total, warmup)
    return optimizer


def describe(optimizer: torch.optim.Optimizer) -> str:
    """The schedule a live optimizer runs, as settings_used records it."""
    planned = getattr(optimizer, "lr_schedule", None)
    return "constant" if planned is None else schedule.describe(*planned)
