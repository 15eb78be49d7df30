"""TensorFlow/Keras 3 training for one amp-compare cell: `model.fit` with a recording callback.

Read this file beside torch_impl/train.py: the functions have the same names and order, and
the AMP lines (marked `# AMP:`) are where the frameworks differ. `train_step` is the Keras
way to customise fit(); ours is the default one plus the per-step values we record (the
batch's own loss, the loss scale it used, whether the update was skipped), because Keras
logs only a running mean of the loss per batch.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # CUDA-driver chatter on GPU-less machines

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from common.child import CpuPeakMemory, Progress, TrainResult  # noqa: E402
from common.config import RunConfig  # noqa: E402
from common.data import Dataset, batch_plan  # noqa: E402
from tf_impl.models import build_model  # noqa: E402

DTYPE_POLICIES = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}
EVAL_BATCH = 512


def setup(cfg: RunConfig) -> None:
    keras.utils.set_random_seed(cfg.seed)
    tf.config.threading.set_intra_op_parallelism_threads(cfg.threads)
    tf.config.threading.set_inter_op_parallelism_threads(cfg.threads)
    keras.config.set_dtype_policy(DTYPE_POLICIES[cfg.precision])  # AMP: layers compute in half precision


def make_optimizer(cfg: RunConfig) -> keras.optimizers.Optimizer:
    if cfg.optimizer == "adam":
        inner = keras.optimizers.Adam(learning_rate=cfg.lr, epsilon=cfg.adam_epsilon)
    else:
        inner = keras.optimizers.SGD(learning_rate=cfg.lr, momentum=cfg.momentum)
    if not cfg.loss_scaling:
        return inner
    # AMP: dynamic loss scaling for fp16 only, built explicitly (compile would wrap it implicitly).
    return keras.optimizers.LossScaleOptimizer(inner, initial_scale=cfg.init_scale,
                                               dynamic_growth_steps=cfg.growth_interval)


def current_scale(optimizer: keras.optimizers.Optimizer) -> tf.Tensor:
    """The live loss scale as a device tensor."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.identity(optimizer.dynamic_scale)
    return tf.ones((), dtype="float32")


class AmpModel(keras.Model):
    def train_step(self, data):
        """One optimizer step. Returns the epoch's running metrics plus this batch's own values."""
        x, y = data
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=logits)  # float32: the last layer is float32
            scaled_loss = self.optimizer.scale_loss(loss)  # AMP: loss * scale (unchanged without scaling)
        scale_used = current_scale(self.optimizer)
        grads = tape.gradient(scaled_loss, self.trainable_variables)  # AMP: backward of loss * scale
        # AMP: LossScaleOptimizer unscales, skips the update if any gradient is inf/NaN,
        # halves the scale on overflow and doubles it after dynamic_growth_steps good steps.
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        for metric in self.metrics:  # epoch running means: loss, then the compiled accuracy
            if metric.name == "loss":
                metric.update_state(loss)
        logs = self.compute_metrics(x, y, logits)
        return {**logs, "batch_loss": loss, "loss_scale": scale_used,
                "skipped": current_scale(self.optimizer) < scale_used}  # backs off only on a skipped step


class StepRecorder(keras.callbacks.Callback):
    """Records every step's values and time, and times validation apart from training."""

    def __init__(self, cfg: RunConfig, steps: int, progress: Progress, result: TrainResult):
        super().__init__()
        self.cfg, self.steps, self.progress, self.result = cfg, steps, progress, result

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.losses = epoch, []
        self.last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()  # logs arrive as host values, so the step has finished
        self.result.step_time_s.append(now - self.last)
        self.last = now
        self.losses.append(float(logs["batch_loss"]))
        self.result.step_epoch.append(self.epoch)
        self.result.step_loss.append(self.losses[-1])
        self.result.step_loss_scale.append(float(logs["loss_scale"]))
        self.result.step_skipped.append(bool(logs["skipped"]))
        self.progress.step(self.epoch, self.cfg.epochs, batch, self.steps)

    def on_test_begin(self, logs=None):
        self.eval_start = time.perf_counter()

    def on_test_end(self, logs=None):
        self.eval_time = time.perf_counter() - self.eval_start

    def on_epoch_end(self, epoch, logs=None):
        self.result.epochs.append({
            "epoch": epoch,
            "train_loss": float(np.mean(self.losses)),
            "train_accuracy": float(logs["accuracy"]),  # running mean over the epoch's equal batches
            "val_loss": float(logs["val_loss"]),
            "val_accuracy": float(logs["val_accuracy"]),
            "train_time_s": float(sum(self.result.step_time_s[-self.steps:])),
            "eval_time_s": self.eval_time,
        })


def make_dataset(data: Dataset, plan: np.ndarray) -> tf.data.Dataset:
    """Batches in exactly the order of common.data.batch_plan, gathered from device-resident tensors."""
    x, y = tf.constant(data.x_train), tf.constant(data.y_train)
    flat = plan.reshape(-1, plan.shape[-1])
    return (tf.data.Dataset.from_tensor_slices(flat)
            .map(lambda idx: (tf.gather(x, idx), tf.gather(y, idx)))
            .prefetch(tf.data.AUTOTUNE))


def train(cfg: RunConfig, data: Dataset, progress: Progress) -> TrainResult:
    setup(cfg)
    gpus = tf.config.list_physical_devices("GPU")
    if cfg.device == "cuda" and not gpus:
        raise RuntimeError("device 'cuda' requested but TensorFlow sees no GPU")
    device = "/GPU:0" if cfg.device == "cuda" else "/CPU:0"
    plan = batch_plan(len(data.x_train), cfg.batch_size, cfg.seed, cfg.epochs, cfg.steps_per_epoch)
    steps = plan.shape[1]
    result = TrainResult(info={
        "framework_version": tf.__version__,
        "keras_version": keras.__version__,
        "device_name": (tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
                        if cfg.device == "cuda" else "cpu"),
        "amp_api": "mixed_float16 policy + LossScaleOptimizer" if cfg.loss_scaling else
                   (f"{DTYPE_POLICIES[cfg.precision]} policy" if cfg.mixed else "none"),
        "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    })
    with tf.device(device):
        model = build_model(cfg.model, data.input_shape, data.num_classes, model_class=AmpModel)
        model.compile(optimizer=make_optimizer(cfg),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        model.optimizer.build(model.trainable_variables)
        dataset = make_dataset(data, plan)
        if cfg.device == "cuda":
            tf.config.experimental.reset_memory_stats("GPU:0")
        else:
            cpu_memory = CpuPeakMemory()
        model.fit(dataset, epochs=cfg.epochs, steps_per_epoch=steps, verbose=0,
                  validation_data=(data.x_val, data.y_val), validation_batch_size=EVAL_BATCH,
                  callbacks=[StepRecorder(cfg, steps, progress, result)])
    if cfg.device == "cuda":
        result.peak_memory_bytes = tf.config.experimental.get_memory_info("GPU:0")["peak"]
        result.memory_kind = "tf_gpu_allocator_peak"
    else:
        result.peak_memory_bytes = cpu_memory.peak_bytes()
        result.memory_kind = cpu_memory.kind
    return result
