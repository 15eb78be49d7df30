"""Keras' side of a speed trial (kit/trial.py): each precision's model as a cell builds and steps it.

The model, shared initial weights, fp8 conversion and compile() come from train.py (setup, and assemble:
kit/build.py's order) and each step is the train function fit() runs
(model.make_train_function(): AmpModel.train_step inside Keras' tf.function / jit). On TensorFlow the batches are
gathered inside the step from loop.DeviceImages, as in a cell, by the cell's first batch indices; the other backends
take (x, y) numpy batches through train_on_batch (fit's train function too, with a host read of its logs each step).
"""

from __future__ import annotations

import keras
import numpy as np

from amp_compare.contract.config import RunConfig
from amp_compare.keras_impl import backends, loop
from amp_compare.keras_impl.train import assemble, compile_model, setup
from amp_compare.kit.child import SharedInit
from amp_compare.kit.data import Dataset, epoch_batches
from amp_compare.kit.trial import Stepper

if backends.TENSORFLOW:
    import tensorflow as tf

BATCHES = 8  # the cell's first batches, which every block cycles through


def steppers(cfgs: list[RunConfig], data: Dataset, shared_init: SharedInit) -> tuple[list[Stepper], int]:
    """One Stepper per configuration (fp32 first), and the intra-op threads the process runs with."""
    plan = epoch_batches(len(data.x_train), cfgs[0].batch_size, cfgs[0].seed, 0)[:BATCHES]
    images = None
    out = []
    for cfg in cfgs:
        setup(cfg)  # the precision's dtype policy, before its model is built
        with backends.device_scope(cfg):
            model = assemble(cfg, data, shared_init, lambda m, cfg=cfg: compile_model(cfg, m)).model
            if backends.TENSORFLOW:
                images = images or loop.DeviceImages(data.x_train, data.y_train)
                model.device_images = images
        out.append(Stepper(cfg.precision, _runner(model, data, plan)))
    keras.config.set_dtype_policy("float32")
    return out, _threads(cfgs[0].threads)


def _runner(model: keras.Model, data: Dataset, plan: np.ndarray):
    position = [0]
    if backends.TENSORFLOW:
        indices = [tf.constant(idx) for idx in plan]
        model.make_train_function()
        train = model.train_function

        def run_steps(k: int) -> float:
            for _ in range(k):
                logs = train(iter((indices[position[0] % len(indices)],)))
                position[0] += 1
            return float(keras.ops.convert_to_numpy(logs["step"])[0])  # the host read that ends the block

        return run_steps

    def run_steps(k: int) -> float:
        for _ in range(k):
            idx = plan[position[0] % len(plan)]
            logs = model.train_on_batch(data.x_train[idx], data.y_train[idx], return_dict=True)
            position[0] += 1
        return float(np.asarray(logs["step"])[0])

    return run_steps


def set_threads(n: int) -> int:
    """Intra-op threads from here on where the backend can still change them (torch; TensorFlow and XLA keep the
    count their runtime started with), and the count in use."""
    if backends.TORCH:
        backends.set_threads(n)
    return _threads(n)


def _threads(default: int) -> int:
    info = backends.thread_info()
    return next((v for k, v in info.items() if k in ("tf_intra_op_threads", "torch_threads") and v > 0), default)
