"""Keras 3 training for one amp-compare cell, on any of Keras' backends: `model.fit` with a recording callback.

Read this file beside torch_impl/train.py: the functions of contract/twins.py have one signature
in both, the AMP idiom itself is amp.py, and the AMP lines here are marked `# AMP:`. `train_step`
is the Keras way to customise fit(); ours is amp.py's scaled step plus the per-step values we record
(the batch's own loss, the loss scale it used, whether the update was skipped), because Keras logs
only a running mean of the loss per batch.

One model, policy, optimizer (LossScaleOptimizer for fp16), loss and record for the frameworks tf,
keras-jax and keras-torch: the backend (KERAS_BACKEND, set by the parent before Keras is imported)
changes only what keras_impl/backends.py holds, the train_step's autodiff (Keras' own per-backend
form: GradientTape, jax.value_and_grad over a stateless call, torch's backward) and the input
pipeline: TensorFlow feeds batch indices through tf.data and gathers the images inside the step;
the other backends get each batch as numpy arrays from a generator in the same order.
"""

from __future__ import annotations

import json
import os
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # CUDA-driver chatter on GPU-less machines

import keras  # noqa: E402
import numpy as np  # noqa: E402

from amp_compare.keras_impl import backends  # noqa: E402

if backends.TENSORFLOW:  # TensorFlow-only code below (tf.data, DeviceImages, StepLog) runs on that backend only
    import tensorflow as tf

from amp_compare.contract.config import RunConfig  # noqa: E402
from amp_compare.contract.mapping import framework_settings  # noqa: E402
from amp_compare.keras_impl import numerics, vit  # noqa: E402
from amp_compare.keras_impl.amp import current_scale, describe_amp, make_scaler, mixed_precision  # noqa: E402
from amp_compare.keras_impl.amp import stateless_train_step as stateless_scaled_step  # noqa: E402
from amp_compare.keras_impl.amp import train_step as scaled_step  # noqa: E402
from amp_compare.keras_impl.models import build_model, get_weights, set_weights  # noqa: E402
from amp_compare.keras_impl.optimizers import describe_schedule, learning_rate  # noqa: E402
from amp_compare.kit.child import (  # noqa: E402
    CpuPeakMemory,
    DivergenceWatch,
    FirstStepWindow,
    Progress,
    SharedInit,
    TrainResult,
    check_final_weights,
    first_nonfinite_parameter,
)
from amp_compare.kit.data import Dataset, batch_plan, epoch_images  # noqa: E402

EVAL_BATCH = 512


def setup(cfg: RunConfig) -> None:
    backends.check_backend(cfg)  # the cell's framework names the backend this process's Keras must run on
    keras.utils.set_random_seed(cfg.seed)
    backends.set_threads(cfg.threads)
    mixed_precision(cfg.precision)  # AMP: layers built from now on compute in half precision
    # TF32 decided here, as on the torch side (TF's and JAX's own GPU defaults are on), so fp32 means the same
    # everywhere; read back into settings_used.
    backends.set_tf32(cfg.tf32)


def describe_defaults() -> dict[str, object]:
    """This Keras' own defaults for each item of amp_compare.contract.mapping.DIFFERENCES, read from fresh objects."""
    adam = keras.optimizers.Adam()
    bn = keras.layers.BatchNormalization()
    scaler = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    conv = keras.layers.Conv2D(1, 3, padding="same")
    return {
        "adam_epsilon": adam.epsilon,
        "bn_momentum": bn.momentum,
        "bn_epsilon": bn.epsilon,
        "stride2_padding": f"padding={conv.padding!r}: extra row/column at bottom/right for even inputs",
        "weight_decay": f"decoupled from the gradient (default {adam.weight_decay})",
        "loss_reduction": keras.losses.SparseCategoricalCrossentropy().reduction,
        "init_scale": scaler.initial_scale,
        "growth_interval": scaler.dynamic_growth_steps,
        "initial_weights": f"{type(conv.kernel_initializer).__name__} kernels, "
                           f"{type(conv.bias_initializer).__name__} biases",
        **vit.describe_defaults(),  # vit: LayerNorm, GELU, attention, AdamW, schedule, token stream
    }


def settings_used(model: keras.Model, optimizer: keras.optimizers.Optimizer, scaler: keras.optimizers.Optimizer,
                  cfg: RunConfig) -> dict:
    """The values this run actually used, read back from the objects it trained with.

    Recorded in Keras' own convention (BatchNorm momentum weights the old average);
    harness/settings_check.py maps and compares them with the torch child's. scaler: what
    amp.make_scaler returned, the optimizer itself (a LossScaleOptimizer for fp16). cfg: the twin
    contract's argument; Keras reads everything from the live objects.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    used: dict[str, object] = {"loss_reduction": model.loss.reduction, "weight_decay": inner.weight_decay}
    if isinstance(inner, keras.optimizers.Adam):
        used.update(adam_epsilon=inner.epsilon, adam_beta_1=inner.beta_1, adam_beta_2=inner.beta_2,
                    adam_formula=getattr(inner, "formula", "keras"))
    if isinstance(inner, keras.optimizers.SGD):
        used.update(sgd_momentum=inner.momentum, sgd_nesterov=inner.nesterov)
    used["learning_rate"] = float(keras.ops.convert_to_numpy(inner.learning_rate))
    used["lr_schedule"] = describe_schedule(inner)
    if cfg.optimizer == "adamw":  # Keras' AdamW is Adam with a decoupled weight decay: its value, read back
        used["adamw_weight_decay"] = float(inner.weight_decay or 0.0)
    used.update(vit.settings_used(model))  # vit: LayerNorm eps, GELU form, token stream dtype
    bn = next((layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)), None)
    if bn is not None:
        used.update(bn_momentum=bn.momentum, bn_epsilon=bn.epsilon)
    strided = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)
               and tuple(layer.strides) != (1, 1) and tuple(layer.kernel_size) == (3, 3)]
    if strided:
        names = {layer.name for layer in model.layers}
        padded = {f"{layer.name}_pad" in names and layer.padding == "valid" for layer in strided}
        used["stride2_padding"] = "symmetric" if padded == {True} else f"padding={strided[0].padding!r}"
    used["output_dtype"] = model.layers[-1].dtype_policy.compute_dtype
    if isinstance(scaler, keras.optimizers.LossScaleOptimizer):
        used.update(init_scale=scaler.initial_scale, growth_interval=scaler.dynamic_growth_steps)
    elif inner.loss_scale_factor:
        used["static_loss_scale"] = inner.loss_scale_factor
    used["tf32"] = backends.tf32_state()[0]  # read back from the backend, not from cfg
    return used


def make_model(cfg: RunConfig, data: Dataset) -> keras.Model:
    settings = framework_settings(cfg)  # empty in 'defaults' mode: Keras' own BatchNorm and padding
    model = build_model(cfg.model, data.input_shape, data.num_classes, model_class=AmpModel, width=cfg.width,
                        bn_momentum=settings.get("bn_momentum"), bn_epsilon=settings.get("bn_epsilon"),
                        stride2_padding=settings.get("stride2_padding", "same"),
                        # aligned: the output layer in the policy's dtype, as torch autocast's Linear
                        output_dtype=None if settings.get("output_dtype") == "policy" else "float32",
                        vit=vit.arguments(cfg, settings))
    if cfg.fp32_layers:  # AMP: these layers get the float32 policy (Keras fixes a policy at construction)
        model = numerics.apply_fp32_layers(model, cfg.fp32_layers)
    return model


def make_optimizer(cfg: RunConfig, params) -> keras.optimizers.Optimizer:
    """The cell's optimizer, loss scaling included (amp.make_scaler), built on params (the model's
    trainable variables) as fit() would build it."""
    settings = framework_settings(cfg)
    extra: dict[str, object] = {}
    if cfg.clip_grad_norm is not None:  # the global norm, as torch's clip_grad_norm_ (clipnorm is per tensor)
        extra["global_clipnorm"] = cfg.clip_grad_norm
    lr = learning_rate(cfg)  # --lr, or kit/schedule.py's warm-up + cosine (keras_impl/optimizers.WarmupCosine)
    if cfg.optimizer in ("adam", "adamw"):
        if cfg.optimizer == "adamw":  # decoupled weight decay, as torch's AdamW (contract/mapping.py)
            extra["weight_decay"] = cfg.weight_decay
        if settings.get("adam_formula") == "torch":  # aligned: torch.optim.Adam's formula (keras_impl/optimizers.py)
            from amp_compare.keras_impl.optimizers import TorchAdam

            inner = TorchAdam(learning_rate=lr, epsilon=settings["adam_epsilon"], **extra)
        else:
            inner = (keras.optimizers.AdamW if cfg.optimizer == "adamw" else keras.optimizers.Adam)(
                learning_rate=lr, **extra)
    else:
        inner = keras.optimizers.SGD(learning_rate=lr, momentum=cfg.momentum, **extra)
    optimizer = make_scaler(cfg, inner)  # AMP: loss scaling wraps the optimizer (fp16, fp16-static)
    optimizer.build(params)
    return optimizer


def make_loss(cfg: RunConfig) -> keras.losses.Loss:
    """The training loss: mean cross-entropy over the batch, computed in float32 (the loss's dtype is
    floatx, float32, whatever the policy: it casts the logits up, as torch autocast does for cross_entropy)."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def jit_compile(cfg: RunConfig) -> bool:
    """fit()'s jit_compile. --compile / --step tuned: XLA (TensorFlow, JAX), torch.compile (torch backend). plain:
    TensorFlow traces tf.function without XLA; JAX has no graph mode without XLA (its fit always jits, Keras'
    default there); Keras' torch backend runs eagerly (its default)."""
    return cfg.compile or cfg.step == "tuned" or backends.JAX


def compile_model(cfg: RunConfig, model: keras.Model, steps_per_execution: int = 1) -> None:
    """fit()'s setup, for train() and the probe alike: the optimizer (auto_scale_loss=False: make_optimizer
    is the whole AMP setup, so fp16-noscale stays unscaled), the loss, accuracy, jit_compile (above); the
    optimizer is built on the model's variables before fit(). steps_per_execution: see train()."""
    model.compile(optimizer=make_optimizer(cfg, model.trainable_variables), loss=make_loss(cfg), metrics=["accuracy"],
                  jit_compile=jit_compile(cfg), auto_scale_loss=False, steps_per_execution=steps_per_execution)
    # fit() would build the accuracy metric's variables inside its first trace of the step, and TensorFlow traces a
    # function that creates variables twice; built here, the step is traced once (measured, vit: fit 12.4 s -> 7.0 s)
    model._compile_metrics.build(keras.ops.zeros((1,), "int64"), keras.ops.zeros((1, model.outputs[0].shape[-1])))


class DeviceImages:
    """The training set as device-resident variables; fit() then feeds only batch indices.

    This mirrors torch_impl, which gathers x_train[idx] from device tensors each step: measured
    here, a tf.data map that gathers batches cost 8-27% per step on a 2-core CPU against a batch
    already in memory, gathering inside the step about 0% (benchmarks/overhead.py). A plain
    holder object, so Keras does not track the images as model weights.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images = tf.Variable(images, trainable=False, name="train_images")
        self.labels = tf.constant(labels)

    def set_epoch(self, epoch: int, images: np.ndarray) -> None:
        """This epoch's (augmented) pixels, before the epoch's clock starts. Assigned in eighths: a whole-array
        assign builds a second full copy on the device beside the old one, inside the memory window (torch
        frees its old copy first, torch_impl/train.py)."""
        step = max(1, -(-len(images) // 8))
        for start in range(0, len(images), step):
            self.images[start:start + step].assign(images[start:start + step])


class HostImages:
    """The other backends' training set: numpy arrays that `host_batches` slices each step's batch from.

    With augmentation each epoch has its own pixels (kit/data.py), made by the recorder before the
    epoch's clock starts; the batch generator, which fit() may run ahead of the training loop, waits
    for them, so no epoch's augmentation falls inside another epoch's timed steps.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, augmented_first: np.ndarray | None = None):
        self.base, self.labels = images, labels
        self.augmented = augmented_first is not None
        self._by_epoch = {0: augmented_first} if self.augmented else {}
        self._ready = threading.Condition()

    def set_epoch(self, epoch: int, images: np.ndarray) -> None:
        with self._ready:
            if epoch not in self._by_epoch:
                self._by_epoch = {e: v for e, v in self._by_epoch.items() if e >= epoch - 1} | {epoch: images}
                self._ready.notify_all()

    def images(self, epoch: int) -> np.ndarray:
        if not self.augmented:
            return self.base
        with self._ready:
            if not self._ready.wait_for(lambda: epoch in self._by_epoch, timeout=3600):
                raise RuntimeError(f"the augmented images of epoch {epoch} never came")
            return self._by_epoch[epoch]


def host_batches(images: HostImages, plan: np.ndarray):
    """(x, y) numpy batches in exactly the order of amp_compare.kit.data.batch_plan, epoch after epoch.
    plan: (epochs, steps, batch) indices, or one epoch's (steps, batch)."""
    plan = plan.reshape(-1, *plan.shape[-2:])
    for epoch in range(plan.shape[0]):
        pixels = images.images(epoch)
        for idx in plan[epoch]:
            yield pixels[idx], images.labels[idx]


class StepLog:
    """Per-step values kept on the device (GPU): written inside train_step, read once per epoch.

    Reading a step's values on the host every step would synchronise a GPU every step and hide
    the speed-up being measured. (TensorFlow's fit() still converts each execution's logs: see
    backends.host_syncs_per_step; the tuned loop runs an epoch per execution.)
    """

    def __init__(self, steps: int):
        self.loss = tf.Variable(tf.zeros([steps]), trainable=False)
        self.scale = tf.Variable(tf.zeros([steps]), trainable=False)
        # float32, not bool: TensorFlow registers no GPU kernel of ResourceScatterNdUpdate for bool
        self.skipped = tf.Variable(tf.zeros([steps]), trainable=False)
        self.position = tf.Variable(0, dtype=tf.int32, trainable=False)

    def record(self, loss, scale, skipped) -> None:
        index = tf.reshape(self.position, [1, 1])
        self.loss.scatter_nd_update(index, tf.reshape(tf.cast(loss, tf.float32), [1]))
        self.scale.scatter_nd_update(index, tf.reshape(tf.cast(scale, tf.float32), [1]))
        self.skipped.scatter_nd_update(index, tf.reshape(tf.cast(skipped, tf.float32), [1]))
        self.position.assign_add(1)

    def drain(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This epoch's values on the host (one synchronisation), and a reset for the next epoch."""
        n = int(self.position.numpy())
        values = self.loss.numpy()[:n], self.scale.numpy()[:n], self.skipped.numpy()[:n] > 0
        self.position.assign(0)
        return values


class AmpModel(keras.Model):
    device_images: DeviceImages | None = None  # set by make_dataset(); None: fit() feeds (x, y) batches
    step_log: StepLog | None = None  # set for device-side step values (GPU); None: fit() logs carry them

    def batch(self, data) -> tuple[tf.Tensor, tf.Tensor]:
        """The (images, labels) of a step: gathered on the device from indices, or as fit() gave them."""
        if self.device_images is not None:
            return tf.gather(self.device_images.images, data), tf.gather(self.device_images.labels, data)
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)  # train_on_batch() passes (x, y, None)
        return x, y

    if backends.JAX:
        def train_step(self, state, data):
            """One optimizer step: amp.py's scaled step in JAX's stateless form (the state goes in and comes out),
            plus the epoch's running metrics and this batch's own values."""
            x, y = self.batch(data)
            loss, logits, scale_used, skipped, state = stateless_scaled_step(self, state, x, y)  # AMP (amp.py)
            trainable, non_trainable, optimizer_state, metrics_state = state
            logs, metrics_state = self._update_metrics_variables(metrics_state, loss, x, y, logits, None)
            return ({**logs, "batch_loss": loss, "loss_scale": scale_used, "skipped": skipped},
                    (trainable, non_trainable, optimizer_state, metrics_state))

    else:
        def train_step(self, data):
            """One optimizer step. Returns the epoch's running metrics plus this batch's own values."""
            x, y = self.batch(data)
            loss, logits, scale_used, skipped = scaled_step(self, x, y)  # AMP: the scaled step (amp.py)
            for metric in self.metrics:  # epoch running means: loss, then the compiled accuracy
                if metric.name == "loss":
                    metric.update_state(loss)
            logs = self.compute_metrics(x, y, logits)
            if self.step_log is not None:  # TensorFlow's device mode
                self.step_log.record(loss, scale_used, skipped)
            return {**logs, "batch_loss": loss, "loss_scale": scale_used, "skipped": skipped}


class EpochRecorder(keras.callbacks.Callback):
    """Per-epoch records, validation timed apart from training; the base of both step recorders."""

    def __init__(self, cfg: RunConfig, steps: int, progress: Progress, result: TrainResult,
                 augment: tuple[Dataset, DeviceImages] | None = None, on_nonfinite=None):
        super().__init__()
        self.cfg, self.steps, self.progress, self.result, self.augment = cfg, steps, progress, result, augment
        self.on_nonfinite = on_nonfinite  # called once, at the first non-finite loss or skipped update
        self.watch = DivergenceWatch(cfg.diverge_after)
        self.first_step = FirstStepWindow(None)  # train() sets the CPU's memory window

    def on_epoch_begin(self, epoch, logs=None):
        if self.augment:  # the same augmented pixels as the torch side, before the epoch's clock starts
            data, device_images = self.augment
            device_images.set_epoch(epoch, epoch_images(data, self.cfg.seed, epoch, augment=True))
        self.epoch, self.losses, self.eval_time = epoch, [], 0.0
        self.last = self.epoch_start = time.perf_counter()

    def on_test_begin(self, logs=None):
        self.eval_start = time.perf_counter()

    def on_test_end(self, logs=None):
        self.eval_time = time.perf_counter() - self.eval_start

    def check(self, first: int) -> None:
        """Locator and divergence over this epoch's steps from index `first` of the records."""
        for k in range(first, len(self.result.step_loss)):
            if self.on_nonfinite and (not np.isfinite(self.result.step_loss[k]) or self.result.step_skipped[k]):
                self.on_nonfinite(k, self.epoch, k - (len(self.result.step_loss) - len(self.losses)))
                self.on_nonfinite = None
        self.result.diverged_at_step = self.watch.update(self.result.step_loss[first:], len(self.result.step_loss) - 1)
        if self.result.diverged_at_step is not None:
            self.model.stop_training = True  # fit() stops after this batch (this epoch, in device mode)

    def epoch_row(self, epoch: int, logs: dict, train_time: float) -> None:
        self.result.epochs.append({
            "epoch": epoch,
            "train_loss": float(np.mean(self.losses)),
            "train_accuracy": float(logs["accuracy"]),  # running mean over the epoch's equal batches
            "val_loss": float(logs.get("val_loss", np.nan)),
            "val_accuracy": float(logs.get("val_accuracy", np.nan)),
            "train_time_s": train_time,
            "eval_time_s": self.eval_time,
        })


class StepRecorder(EpochRecorder):
    """Host mode (CPU): every step's values and wall time, read from fit()'s logs as each step ends."""

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
        self.first_step.after(self.epoch, batch)
        self.check(len(self.result.step_loss) - 1)

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_row(epoch, logs, float(sum(self.result.step_time_s[-len(self.losses):])))


class DeviceStepRecorder(EpochRecorder):
    """Device mode (GPU): no per-step hook, so fit() never waits for a step; the StepLog is read once
    per epoch. Per-step times cannot be had without a wait per step: they are recorded as missing and
    the step-time statistics come from the epoch's training time."""

    def on_test_begin(self, logs=None):
        if self.losses == []:  # first thing after the epoch's steps: wait for them, then stop the clock
            self.drain()
        super().on_test_begin(logs)

    def read_epoch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.model.step_log.drain()  # the epoch's one synchronisation

    def drain(self) -> None:
        loss, scale, skipped = self.read_epoch()
        self.train_time = time.perf_counter() - self.epoch_start
        first = len(self.result.step_loss)
        self.losses = loss.tolist()
        self.result.step_epoch += [self.epoch] * len(loss)
        self.result.step_loss += self.losses
        self.result.step_loss_scale += scale.tolist()
        self.result.step_skipped += skipped.tolist()
        self.result.step_time_s += [float("nan")] * len(loss)
        self.progress.step(self.epoch, self.cfg.epochs, len(loss) - 1, self.steps)
        self.check(first)

    def on_epoch_end(self, epoch, logs=None):
        if self.losses == []:  # no validation ran
            self.drain()
        self.epoch_row(epoch, logs, self.train_time)


class AsyncStepRecorder(DeviceStepRecorder):
    """Device mode on JAX and Keras' torch backend: no wait per step either. These backends hand an
    `async_safe` callback each step's logs on a worker thread, which alone waits for the step's values;
    the training loop goes on dispatching. The epoch's clock stops once every dispatched step's values
    have arrived (the one wait per epoch), as DeviceStepRecorder's StepLog read does on TensorFlow."""

    async_safe = True

    def on_epoch_begin(self, epoch, logs=None):
        self.dispatched, self.arrived = 0, {}
        self.arrival = threading.Condition()
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):  # the training loop's thread: a count, no wait
        self.dispatched += 1
        if self.epoch == 0 and batch == 1:
            # Step 0's dispatch includes tracing and compiling the step (jax.jit / torch.compile happen on the host
            # before the first step is queued): compile time apart from the per-epoch step time.
            self.result.info["first_step_dispatch_s"] = time.perf_counter() - self.epoch_start

    def on_train_batch_end(self, batch, logs=None):  # a worker thread: the logs are host values now
        with self.arrival:
            self.arrived[batch] = (float(logs["batch_loss"]), float(logs["loss_scale"]), bool(logs["skipped"]))
            self.arrival.notify_all()

    def read_epoch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self.arrival:
            if not self.arrival.wait_for(lambda: len(self.arrived) >= self.dispatched, timeout=3600):
                raise RuntimeError(f"only {len(self.arrived)} of {self.dispatched} steps' values arrived")
            rows = [self.arrived[k] for k in sorted(self.arrived)]
        loss, scale, skipped = (np.array(column) for column in zip(*rows)) if rows else ([], [], [])
        return np.asarray(loss, float), np.asarray(scale, float), np.asarray(skipped, bool)


def make_dataset(cfg: RunConfig, data: Dataset) -> tuple:
    """What fit() iterates, in exactly the order of the cell's amp_compare.kit.data.batch_plan (every epoch's
    batches in a row: fit() takes steps_per_epoch of them per epoch), and the images it draws from.

    TensorFlow: batch indices through tf.data, the model gathers each batch inside its train_step (see
    DeviceImages). Other backends: a generator of numpy (x, y) batches (HostImages). With augmentation
    (augment_seed: the cell's seed) the recorder swaps in each epoch's augmented images (kit/data.py:
    the pixels torch sees) before the epoch's clock starts.
    """
    plan = batch_plan(len(data.x_train), cfg.batch_size, cfg.seed, cfg.epochs, cfg.steps_per_epoch)
    if backends.TENSORFLOW:
        indices = tf.data.Dataset.from_tensor_slices(plan.reshape(-1, plan.shape[-1])).prefetch(tf.data.AUTOTUNE)
        return indices, DeviceImages(data.x_train, data.y_train)
    first = epoch_images(data, cfg.seed, 0, augment=True) if cfg.augment else None
    images = HostImages(data.x_train, data.y_train, augmented_first=first)
    return host_batches(images, plan), images


def attach_dataset(model: keras.Model, cfg: RunConfig, data: Dataset):
    """make_dataset, and the model told where its batches come from: TensorFlow gathers each batch inside the
    step from DeviceImages; the other backends' generator yields (x, y) batches, nothing to gather."""
    dataset, images = make_dataset(cfg, data)
    model.device_images = images if backends.TENSORFLOW else None
    return dataset, images


def sync_state(model: keras.Model) -> None:
    """JAX's fit keeps the training state apart from the model's variables: put it back before reading them."""
    if hasattr(model, "jax_state_sync"):
        model.jax_state_sync()


def train(cfg: RunConfig, data: Dataset, progress: Progress, shared_init: SharedInit) -> TrainResult:
    setup(cfg)
    if cfg.device == "cuda" and not backends.gpu_available():
        raise RuntimeError(f"device 'cuda' requested but Keras' {backends.BACKEND} backend sees no GPU")
    plan = batch_plan(len(data.x_train), cfg.batch_size, cfg.seed, cfg.epochs, cfg.steps_per_epoch)
    steps = plan.shape[1]
    _, tf32_setting = backends.tf32_state()
    result = TrainResult(info={
        **backends.versions(),
        **backends.device_info(cfg),
        "tf32": tf32_setting,
        "amp_api": describe_amp(cfg),
        **backends.thread_info(),
    })
    # JAX's GPU peak counts from the process's start (backends.peak_memory): its matmul probe (up to three
    # 8192x8192 float32 matrices, 768 MiB) waits until the training peak has been read
    peak_first = not (backends.JAX and cfg.device == "cuda")
    result.info.update(compiled=compiled_text(jit_compile(cfg)), step_loop=cfg.step, optimizer_impl="keras default",
                       **(measure_peak(cfg, result.info["device_name"]) if peak_first else {}))
    device_mode = cfg.step_values == "device" or (cfg.step_values == "auto" and cfg.device == "cuda")
    # TensorFlow's fit() waits for the logs after every execution of the train function (backends.
    # host_syncs_per_step). The tuned loop in device mode runs each epoch as one execution, Keras' own way to
    # cut that per-step cost; the plain loop keeps fit()'s default of one step per execution, as a user has.
    per_execution = steps if device_mode and backends.TENSORFLOW and cfg.step == "tuned" else 1
    with backends.device_scope(cfg):
        model = make_model(cfg, data)
        init_source = shared_init.apply(model, get_weights, set_weights)
        compile_model(cfg, model, per_execution)
        result.info.update(init_source=init_source, framework_defaults=describe_defaults(),
                           settings_used=settings_used(model, model.optimizer, model.optimizer, cfg))
        dataset, images = attach_dataset(model, cfg, data)
        recorder = (DeviceStepRecorder if backends.TENSORFLOW else AsyncStepRecorder) if device_mode else StepRecorder
        # host mode reads each step's values (a wait per step on a GPU); device mode reads them once per epoch
        result.info["host_syncs_per_step"] = backends.host_syncs_per_step(device_mode, per_execution,
                                                                          cfg.loss_scaling == "dynamic")
        result.info["steps_per_execution"] = per_execution
        result.info["step_values"] = ("device: StepLog read once per epoch" if backends.TENSORFLOW else
                                      "device: async_safe callback, one wait per epoch") if device_mode else "host"
        dataset_bytes = int(data.x_train.nbytes + data.y_train.nbytes)  # DeviceImages: same arrays
        # Numerics lab, outside the timed loop: dtype audit and gradient underflow on the first batch.
        probe = (data.x_train[plan[0, 0]], data.y_train[plan[0, 0]])
        result.extra["dtypes"] = numerics.dtype_audit(model, *probe, cfg.precision)
        result.extra["underflow"] = underflow_rows(numerics, model, probe, cfg, model.optimizer, "first step", 0)
        if cfg.comparison == "defaults" and cfg.optimizer == "adam":  # the two Adams, measured on this batch
            result.info.update(numerics.adam_formula_gap(model, *probe, cfg.precision, model.optimizer))

        def on_nonfinite(step: int, epoch: int, batch: int) -> bool:
            """NaN/Inf locator: where the first non-finite loss or gradient came from."""
            idx = plan[epoch, batch]
            sync_state(model)
            bad = first_nonfinite_parameter(get_weights(model))
            pixels = (keras.ops.convert_to_numpy(tf.gather(model.device_images.images, idx))
                      if backends.TENSORFLOW else images.images(epoch)[idx])
            found = ({"where": "parameters", "layer": bad, "value": "nan/inf", "tensor": bad} if bad else
                     numerics.locate_nonfinite(model, pixels, data.y_train[idx], cfg.precision,
                                               float(current_scale(model.optimizer))))
            result.nonfinite = {"step": step, **(found or {"where": "not reproduced", "layer": "", "value": ""})}
            return True

        on_device = cfg.device == "cuda" and backends.TENSORFLOW  # only TensorFlow holds the images on the device
        model.step_log = StepLog(steps) if device_mode and backends.TENSORFLOW else None  # after the audit
        if cfg.device == "cuda":
            backends.reset_peak_memory(cfg)
        else:
            cpu_memory = CpuPeakMemory()
        callback = recorder(cfg, steps, progress, result, on_nonfinite=on_nonfinite,
                            augment=(data, images) if cfg.augment else None)
        callback.first_step = FirstStepWindow(cpu_memory if cfg.device == "cpu" else None)
        headroom = vit.HeadroomRecorder(result.extra.setdefault("headroom", []))  # vit: read once per epoch
        model.fit(dataset, epochs=cfg.epochs, steps_per_epoch=steps, verbose=0, shuffle=False,
                  validation_data=(data.x_val, data.y_val), validation_batch_size=EVAL_BATCH,
                  callbacks=[callback, headroom])
        if not result.extra["headroom"]:  # a CNN has no recorders: no table
            del result.extra["headroom"]
    if cfg.device == "cuda":
        peak, kind = backends.peak_memory(cfg)
        # the training images held on the device (DeviceImages, TensorFlow) are reported apart, not as training memory
        result.peak_memory_bytes = max(0, peak - dataset_bytes) if on_device else peak
        result.memory_kind = kind + ("_minus_dataset" if on_device else "")
        result.info["dataset_device_bytes"] = dataset_bytes if on_device else 0
    else:
        result.peak_memory_bytes = cpu_memory.peak_bytes()
        result.memory_kind = cpu_memory.kind + "_after_first_step"
        result.info["dataset_device_bytes"] = 0
    if not peak_first:
        result.info.update(measure_peak(cfg, result.info["device_name"]))
    result.info["first_step_peak_memory_bytes"] = callback.first_step.peak_bytes
    # Per validation image, right or wrong: the final model's predictions for the paired tests (harness/stats.py).
    result.val_correct = np.argmax(model.predict(data.x_val, batch_size=EVAL_BATCH, verbose=0), axis=1) == data.y_val
    check_final_weights(result, get_weights(model))  # non-finite weights behind a finite loss: diverged
    result.extra["underflow"] += underflow_rows(numerics, model, probe, cfg, model.optimizer, "last step",
                                                len(result.step_loss) - 1)
    return result


def compiled_text(jit_compile: bool) -> str:
    """How the step is compiled on this backend, in words for the report's Environment table."""
    if backends.TENSORFLOW:
        return "jit_compile=True (XLA)" if jit_compile else "tf.function (no XLA)"
    if backends.JAX:
        return "jax.jit (XLA), Keras' default on JAX"
    return "jit_compile=True (torch.compile)" if jit_compile else "eager (Keras' torch default)"


def measure_peak(cfg: RunConfig, device_name: str) -> dict:
    """The device's matmul peak for this cell's dtype (kit/peak.py), measured before training (after it for JAX
    on a GPU, whose peak memory counts from the process's start: see train())."""
    from amp_compare.kit import peak

    def matmul_timer(name: str):
        dtype = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "fp32": "float32"}[name]
        return backends.time_matmul_function(cfg, dtype)

    return peak.measure_cell_peak(cfg.precision, cfg.tf32, cfg.device, device_name, matmul_timer)


def underflow_rows(numerics, model, probe, cfg: RunConfig, scaler, when: str, step: int) -> list[dict]:
    """Per-layer gradient magnitudes of one batch against float16's range, at the scale in use then."""
    scale = float(current_scale(scaler))
    rows = numerics.gradient_underflow(model, *probe, cfg.precision, loss_scale=scale)
    return [{**row, "when": when, "at_step": step, "log2_hist": json.dumps(row.get("log2_hist"))} for row in rows]
