"""Keras 3's mixed-precision idiom, all of it: a mixed dtype policy + LossScaleOptimizer.

Read beside the other framework's amp.py (torch_impl/, keras_impl/): the same functions in the same
order (torch adds FixedScaler, what GradScaler lacks), so `diff` of the two files is the
AMP difference between the frameworks. train.py, loop.py, probe.py, numerics.py and the benchmarks
take the AMP setting, loss scaling and scaled step from here. What each precision mode means is one
row of contract/precision.py.
keras.ops where it can be, so the file reads the same on every Keras backend; only the scaled step's
autodiff is each backend's own (Keras' per-backend train_step: TensorFlow's GradientTape, torch's
backward, JAX's stateless value_and_grad), the AMP lines the same in all three.
"""

from __future__ import annotations

import keras

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import RunConfig
from amp_compare.contract.mapping import framework_settings
from amp_compare.kit.training import StepRecord


def amp_setting(precision: str) -> str:
    """What Keras' AMP switch takes for a mode: the dtype policy ("float32": float32 throughout)."""
    return precisions.of(precision).keras_policy


def mixed_precision(precision: str) -> None:
    """AMP: the global dtype policy. Every layer built afterwards computes in the half dtype and keeps
    float32 weights (a layer's policy is fixed when it is built: set this before building the model)."""
    keras.config.set_dtype_policy(amp_setting(precision))


def with_loss_scaling(cfg: RunConfig, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """AMP: loss scaling, which wraps the optimizer (torch makes a scaler beside it): fp16 dynamic in a
    LossScaleOptimizer (built explicitly; compile would wrap it implicitly), fp16-static the optimizer's
    own loss_scale_factor (x S before backward, / S after); other modes train with the optimizer as it is.
    Returns the optimizer to train with, which is also the "scaler" current_scale and settings_used take."""
    if cfg.loss_scaling == "static":  # AMP: Keras' own static scaling
        optimizer.loss_scale_factor = cfg.loss_scale  # what the constructor's loss_scale_factor sets
        return optimizer
    if cfg.loss_scaling != "dynamic":
        return optimizer
    settings = framework_settings(cfg)
    scaling = ({"initial_scale": settings["init_scale"], "dynamic_growth_steps": settings["growth_interval"]}
               if settings else {})
    return keras.optimizers.LossScaleOptimizer(optimizer, **scaling)


def current_scale(scaler: keras.optimizers.Optimizer):
    """The live loss scale as a device tensor, read without waiting for the device; 1.0: no scaling.
    (scaler: the optimizer with_loss_scaling returned.)"""
    if isinstance(scaler, keras.optimizers.LossScaleOptimizer):
        return keras.ops.copy(keras.ops.convert_to_tensor(scaler.dynamic_scale))
    return keras.ops.convert_to_tensor(scaler.loss_scale_factor or 1.0, dtype="float32")


def clip_gradients(max_norm: float | None) -> dict:
    """--clip-grad-norm on the true gradients: the optimizer's global_clipnorm (as torch's clip_grad_norm_;
    clipnorm would be per tensor), which Keras applies inside optimizer.apply, after LossScaleOptimizer has
    unscaled. Returns the optimizer's constructor arguments."""
    return {} if max_norm is None else {"global_clipnorm": max_norm}  # AMP: clipped after unscaling


def train_step(model: keras.Model, x, y) -> StepRecord:
    """One scaled optimizer step. Returns its StepRecord (kit/training.py) of device tensors; a step is
    skipped when the optimizer did not advance its iterations. Keras' default train_step's core, on
    TensorFlow or Keras' torch backend; JAX's stateless form: stateless_train_step."""
    if keras.backend.backend() == "torch":
        return _torch_train_step(model, x, y)
    import tensorflow as tf

    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=logits)  # float32: the loss casts the logits up
        scaled_loss = model.optimizer.scale_loss(loss)  # AMP: loss * scale (unchanged without scaling)
    scale_used = current_scale(model.optimizer)
    updates_before = keras.ops.copy(model.optimizer.iterations)
    grads = tape.gradient(scaled_loss, model.trainable_variables)  # AMP: backward of loss * scale
    # AMP: LossScaleOptimizer unscales, skips the update if any gradient is inf/NaN,
    # halves the scale on overflow and doubles it after dynamic_growth_steps good steps.
    model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
    skipped = keras.ops.equal(model.optimizer.iterations, updates_before)  # a skipped update leaves the count
    return StepRecord(loss, logits, scale_used, skipped)


def _torch_train_step(model: keras.Model, x, y):
    """train_step on Keras' torch backend: Keras' torch step (zero_grad, backward, apply under no_grad)."""
    import torch

    logits = model(x, training=True)
    model.zero_grad()
    loss = model.compute_loss(x=x, y=y, y_pred=logits)  # float32: the loss casts the logits up
    scaled_loss = model.optimizer.scale_loss(loss)  # AMP: loss * scale (unchanged without scaling)
    scale_used = current_scale(model.optimizer)
    updates_before = keras.ops.copy(keras.ops.convert_to_tensor(model.optimizer.iterations))
    scaled_loss.backward()  # AMP: backward of loss * scale
    variables = model.trainable_weights[:]
    # AMP: LossScaleOptimizer unscales, skips the update if any gradient is inf/NaN,
    # halves the scale on overflow and doubles it after dynamic_growth_steps good steps.
    with torch.no_grad():
        model.optimizer.apply([v.value.grad for v in variables], variables)
    skipped = keras.ops.equal(keras.ops.convert_to_tensor(model.optimizer.iterations), updates_before)
    return StepRecord(loss.detach(), logits.detach(), scale_used, skipped)


def stateless_train_step(model: keras.Model, state, x, y):
    """train_step on JAX, whose fit() is stateless: the model's (trainable, non-trainable, optimizer, metrics)
    values go in and come out. Returns (StepRecord, new state); the scale and the iteration count are read
    from the optimizer's state, not from its variables."""
    import jax

    trainable, non_trainable, optimizer_state, metrics_state = state
    position = {id(v): i for i, v in enumerate(model.optimizer.variables)}
    updates_before = optimizer_state[position[id(model.optimizer.iterations)]]
    if isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        scale_used = optimizer_state[position[id(model.optimizer.dynamic_scale)]]
    else:
        scale_used = current_scale(model.optimizer)
    # AMP: compute_loss_and_updates returns loss * scale (optimizer.scale_loss) and the unscaled loss;
    # the gradients are those of loss * scale.
    grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
    (_, (loss, logits, non_trainable, metrics_state)), grads = grad_fn(
        trainable, non_trainable, metrics_state, x, y, None, training=True, optimizer_variables=optimizer_state)
    # AMP: LossScaleOptimizer unscales, skips the update if any gradient is inf/NaN,
    # halves the scale on overflow and doubles it after dynamic_growth_steps good steps.
    trainable, optimizer_state = model.optimizer.stateless_apply(optimizer_state, grads, trainable)
    skipped = optimizer_state[position[id(model.optimizer.iterations)]] == updates_before
    return (StepRecord(loss, logits, scale_used, skipped),
            (trainable, non_trainable, optimizer_state, metrics_state))


def describe_amp(cfg: RunConfig) -> str:
    """The AMP API a cell used, in words (the run table's amp_api)."""
    return {"dynamic": "mixed_float16 policy + LossScaleOptimizer",
            "static": "mixed_float16 policy + optimizer loss_scale_factor"}.get(
        cfg.loss_scaling, f"{amp_setting(cfg.precision)} policy, no loss scaling" if cfg.mixed else "none")
