"""Every numerical tolerance of the PyTorch/Keras parity tests (tests/test_parity.py), with its reason.

Both frameworks compute in float32 (machine epsilon 2**-23 ~ 1.2e-7) but not in the same order:
torch's CPU convolutions and matmuls run in oneDNN, TensorFlow's in oneDNN or Eigen, each with
its own blocking and threading, so every dot product and every BatchNorm mean sums its terms in
a different order. Such rounding differences scale with the magnitude of the summed terms, not
with the result (an element near zero after cancellation carries the error of its large
summands), so a tolerance is relative to the compared tensor's scale, its largest magnitude:
|a - b| <= atol + rtol * max|b|, per tensor. `atol` only matters for a tensor that is (near)
zero as a whole.

Each float32 value was fixed from this reasoning before measuring; parity.json records what each
test measured as a fraction of its tolerance. The training steps run in float64 (LOSS64, WEIGHTS64
below), where Adam at the project's epsilon is compared with no element left out. A real
mismatch (a transposed kernel, a shifted padding, another BatchNorm epsilon or momentum, a
different optimizer rule) shows at >= 1e-3; tests/mutants.py proves it for its list.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    rtol: float  # relative to the tensor's scale, max|expected|
    atol: float

    def allowed(self, expected: np.ndarray) -> float:
        return self.atol + self.rtol * float(np.max(np.abs(expected), initial=0.0))


# Forward logits, inference and training mode. Up to 9 x 64 products per dot product and
# ~20 layers; each layer adds a few ulps of reordering error relative to its activations'
# scale and BatchNorm renormalises that scale in between, so the logits should agree to about
# 1e-6 of their scale. 1e-5 leaves a 10x margin.
FORWARD = Tolerance(rtol=1e-5, atol=1e-6)

# Gradients of one step, per parameter tensor. The backward pass is twice as deep as the
# forward pass, and a weight gradient sums over batch x H x W positions (up to 2048) whose
# terms largely cancel, so its error relative to the tensor's scale is ~10x the forward one.
GRADIENT = Tolerance(rtol=1e-4, atol=1e-8)

# The loss of each training step (~2.3): a mean of 8 cross-entropies of the forward logits,
# so the forward tolerance.
LOSS = Tolerance(rtol=1e-5, atol=0.0)

# BatchNorm running statistics after one training-mode forward (float32): the batch statistics
# carry the forward's ~1e-6 relative rounding; 1e-4 of the tensor's scale leaves a wide margin,
# and a wrong momentum (0.91 for 0.9) moves them by ~1e-2 of (batch stat - running stat).
WEIGHTS = Tolerance(rtol=1e-4, atol=1e-7)

# float64 training steps (test_parity.test_training_steps_agree): float64's machine epsilon is
# 2**-52 ~ 2.2e-16, so the frameworks' different summation orders leave ~1e-13 of a tensor's
# scale (measured: step 1 agrees to 4e-16). One thing stays float32 in Keras whatever the policy:
# its optimizers cast Python hyperparameters through a float32 tensor (momentum 0.9 becomes
# 0.9 * (1 - 2.6e-8), Adam's beta_1/beta_2 likewise), so every update differs from torch's float64
# one by up to a few 2**-24 ~ 6e-8 of itself, summed over the steps (measured: 2e-9 absolute on
# resnet18's conv1 after SGD step 2). That error is relative to how far training moved a tensor,
# not to its size, so the weights are compared as the change since the start: |dk - dt| <= atol +
# rtol * max|dt|. rtol 1e-6 = ~16x a float32 hyperparameter's relative error (bias corrections
# and momentum sums amplify it by at most (1 - beta)^-1 over 10 steps); the smallest mapping error
# the mutation check applies (beta_2 0.998 instead of 0.999) changes updates by ~5e-5 of
# themselves, 50x above it. atol covers a tensor that did not move. The loss (~2.3) follows the
# weights: rtol 1e-7.
LOSS64 = Tolerance(rtol=1e-7, atol=0.0)
WEIGHTS64 = Tolerance(rtol=1e-6, atol=1e-13)
