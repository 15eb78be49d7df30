"""TorchAdam: Keras' Adam with torch.optim.Adam's update formula, for `--comparison aligned`;
WarmupCosine: kit/schedule.py's learning-rate schedule as a Keras LearningRateSchedule.

torch (and the Adam paper's Algorithm 1) adds epsilon to the bias-corrected sqrt(v):

    p -= lr / (1 - beta_1**t) * m / (sqrt(v) / sqrt(1 - beta_2**t) + eps)

keras.optimizers.Adam adds it to the uncorrected sqrt(v) (the paper's "epsilon hat" form):

    p -= lr * sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (sqrt(v) + eps)

Multiplying torch's numerator and denominator by sqrt(1 - beta_2**t) shows torch's rule is
Keras' with eps replaced by eps * sqrt(1 - beta_2**t), which is all this subclass changes.
One more difference is rounding, not formula: keras.optimizers.Adam casts beta_2 through a float32
tensor before taking 1 - beta_2**t, and 1 - float32(0.999) is 1.3e-5 off 0.001, so its step size
at t = 1 is 6.5e-6 off (relative); torch computes the bias corrections in Python double. TorchAdam
computes them in float64 too, then casts to the variable's dtype.

torch stays the reference (its fused/foreach kernels implement the same formula), so in aligned
mode both frameworks run one formula at the same epsilon; tests/test_parity.py checks it step
by step, with no element left out.

AdamW: torch.optim.AdamW and Keras both decouple the weight decay the same way, p -= lr * wd * p before the
Adam step (torch: param.mul_(1 - lr * wd); Keras' optimizer base class: _apply_weight_decay, variable -=
variable * wd * lr, with the learning rate of the same update), so TorchAdam given a weight decay is torch's
AdamW: only the epsilon placement above differed (keras.optimizers.AdamW is itself Adam with a weight decay).
"""

from __future__ import annotations

import math

import keras
from keras import ops


class TorchAdam(keras.optimizers.Adam):
    """keras.optimizers.Adam with epsilon added to the bias-corrected sqrt(v), as torch.optim.Adam."""

    formula = "torch"  # read back by settings_used()

    def __init__(self, *args, amsgrad: bool = False, **kwargs):
        if amsgrad:
            raise ValueError("TorchAdam implements plain Adam only (amsgrad=False)")
        super().__init__(*args, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        # Bias corrections in float64 from the exact Python betas (ops.cast(0.999, ...) goes through float32).
        local_step = ops.cast(self.iterations + 1, "float64")
        correction_1 = 1 - ops.power(ops.convert_to_tensor(self.beta_1, "float64"), local_step)
        correction_2_sqrt = ops.sqrt(1 - ops.power(ops.convert_to_tensor(self.beta_2, "float64"), local_step))
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        alpha = lr * ops.cast(correction_2_sqrt / correction_1, variable.dtype)
        # torch's eps, rescaled to the uncorrected sqrt(v) this update divides by
        epsilon_hat = ops.cast(ops.convert_to_tensor(self.epsilon, "float64") * correction_2_sqrt, variable.dtype)
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        self.assign_sub(variable, ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), epsilon_hat)))


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """kit/schedule.py's lr_factor as a function of optimizer.iterations (the updates made: a step that
    LossScaleOptimizer skips does not advance it), times the base rate. Computed in float64 from the exact Python
    values (torch computes the factor in Python floats); the optimizer casts it to each variable's dtype."""

    def __init__(self, base_lr: float, total: int, warmup: int):
        self.base_lr, self.total, self.warmup = float(base_lr), int(total), int(warmup)

    def __call__(self, step):
        update = ops.cast(step, "float64")
        warmup, span = float(self.warmup), float(max(1, self.total - self.warmup))
        rising = (update + 1.0) / max(warmup, 1.0)
        progress = ops.minimum(update - warmup, span - 1.0) / span
        cosine = 0.5 * (1.0 + ops.cos(ops.convert_to_tensor(math.pi, "float64") * progress))
        return self.base_lr * ops.where(update < warmup, rising, cosine)

    def get_config(self):
        return {"base_lr": self.base_lr, "total": self.total, "warmup": self.warmup}


def learning_rate(cfg):
    """The optimizer's learning_rate for a cell (a RunConfig): --lr, or kit/schedule.py's warm-up + cosine."""
    if cfg.lr_schedule != "warmup-cosine":
        return cfg.lr
    from amp_compare.kit import schedule

    return WarmupCosine(cfg.lr, *schedule.run_updates(cfg))


def describe_schedule(optimizer) -> str:
    """The schedule a live optimizer runs, as settings_used records it (torch_impl/schedule.describe's twin)."""
    from amp_compare.kit import schedule

    lr = optimizer._learning_rate
    return schedule.describe(lr.total, lr.warmup) if isinstance(lr, WarmupCosine) else "constant"
