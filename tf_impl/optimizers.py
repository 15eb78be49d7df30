"""TorchAdam: Keras' Adam with torch.optim.Adam's update formula, for `--comparison aligned`.

torch (and the Adam paper's Algorithm 1) adds epsilon to the bias-corrected sqrt(v):

    p -= lr / (1 - beta_1**t) * m / (sqrt(v) / sqrt(1 - beta_2**t) + eps)

keras.optimizers.Adam adds it to the uncorrected sqrt(v) (the paper's "epsilon hat" form):

    p -= lr * sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (sqrt(v) + eps)

Multiplying torch's numerator and denominator by sqrt(1 - beta_2**t) shows torch's rule is
Keras' with eps replaced by eps * sqrt(1 - beta_2**t), which is all this subclass changes.
torch stays the reference (its fused/foreach kernels implement the same formula), so in aligned
mode both frameworks run one formula at the same epsilon; tests/test_parity.py checks it step
by step, with no element left out.
"""

from __future__ import annotations

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
        local_step = ops.cast(self.iterations + 1, variable.dtype)
        beta_1_power = ops.power(ops.cast(self.beta_1, variable.dtype), local_step)
        beta_2_power = ops.power(ops.cast(self.beta_2, variable.dtype), local_step)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        alpha = lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        epsilon_hat = ops.cast(self.epsilon, variable.dtype) * ops.sqrt(1 - beta_2_power)  # torch's eps, rescaled
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        self.assign_sub(variable, ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), epsilon_hat)))
