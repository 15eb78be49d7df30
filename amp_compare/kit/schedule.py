"""The learning-rate schedule both frameworks run: one step-indexed factor, written once (no framework).

`lr_factor(update, total, warmup)` multiplies --lr at optimizer update `update` (0 for the first update the
optimizer really makes): a linear warm-up over the first `warmup` updates, then a cosine decay towards 0 at
`total`. torch applies it through torch.optim.lr_scheduler.LambdaLR advanced by a step post-hook (so an update
GradScaler skips does not advance it); Keras through a LearningRateSchedule of optimizer.iterations (which a
skipped LossScaleOptimizer step does not advance either). Both read the same index, so both use the same rate at
every update; tests/test_parity.py checks it through both optimizers.
"""

from __future__ import annotations

import math


def warmup_updates(total: int, warmup_share: float) -> int:
    """Updates of linear warm-up: the share of the run's updates, at least one when the share is not 0."""
    return max(1, round(total * warmup_share)) if warmup_share > 0 else 0


def lr_factor(update: int, total: int, warmup: int) -> float:
    """The multiplier of the base learning rate at `update` (0-based): (u+1)/warmup while warming up, then
    0.5 * (1 + cos(pi * progress)) with progress (u - warmup) / (total - warmup), so the last update's rate is
    small but not 0. Past `total` (a run trained longer than planned) it stays at the last update's value."""
    if update < warmup:
        return (update + 1) / warmup
    span = max(1, total - warmup)
    progress = min(update - warmup, span - 1) / span
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def run_updates(cfg) -> tuple[int, int]:
    """(total, warmup) updates of a cell's run (a RunConfig), planned from its config: epochs times the steps of
    an epoch of its dataset (kit/data.py's TRAIN_SAMPLES, --steps-per-epoch's cap), as both children step."""
    from amp_compare.kit.data import TRAIN_SAMPLES, steps_per_epoch

    total = cfg.epochs * steps_per_epoch(TRAIN_SAMPLES[cfg.dataset], cfg.batch_size, cfg.steps_per_epoch)
    return total, warmup_updates(total, cfg.lr_warmup)


def describe(total: int, warmup: int) -> str:
    """How settings_used records a schedule (both children, from their live scheduler objects)."""
    return f"warmup-cosine: {warmup} warm-up of {total} updates"
