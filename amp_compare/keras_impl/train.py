"""TensorFlow/Keras 3 training for one amp-compare cell: `model.fit` with a recording callback.

Read this file beside torch_impl/train.py: the functions of contract/twins.py have one signature
in both, the AMP idiom itself is amp.py, and the AMP lines here are marked `# AMP:`. `train_step`
is the Keras way to customise fit(); ours is amp.py's scaled step plus the per-step values we record
(the batch's own loss, the loss scale it used, whether the update was skipped), because Keras logs
only a running mean of the loss per batch.
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # CUDA-driver chatter on GPU-less machines

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amp_compare.contract.config import RunConfig  # noqa: E402
from amp_compare.contract.mapping import framework_settings  # noqa: E402
from amp_compare.keras_impl import numerics  # noqa: E402
from amp_compare.keras_impl.amp import current_scale, describe_amp, make_scaler, mixed_precision  # noqa: E402
from amp_compare.keras_impl.amp import train_step as scaled_step  # noqa: E402
from amp_compare.keras_impl.models import build_model, get_weights, set_weights  # noqa: E402
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
    keras.utils.set_random_seed(cfg.seed)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(cfg.threads)
        tf.config.threading.set_inter_op_parallelism_threads(cfg.threads)
    except RuntimeError:  # only settable before TensorFlow initialises its runtime
        pass
    mixed_precision(cfg.precision)  # AMP: layers built from now on compute in half precision
    # TF32 decided here, as on the torch side (TF's own default is on), so fp32 means the same in both.
    tf.config.experimental.enable_tensor_float_32_execution(cfg.tf32 == "on")


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
    return used


def make_model(cfg: RunConfig, data: Dataset) -> keras.Model:
    settings = framework_settings(cfg)  # empty in 'defaults' mode: Keras' own BatchNorm and padding
    model = build_model(cfg.model, data.input_shape, data.num_classes, model_class=AmpModel, width=cfg.width,
                        bn_momentum=settings.get("bn_momentum"), bn_epsilon=settings.get("bn_epsilon"),
                        stride2_padding=settings.get("stride2_padding", "same"),
                        # aligned: the output layer in the policy's dtype, as torch autocast's Linear
                        output_dtype=None if settings.get("output_dtype") == "policy" else "float32")
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
    if cfg.optimizer == "adam":
        if settings.get("adam_formula") == "torch":  # aligned: torch.optim.Adam's formula (keras_impl/optimizers.py)
            from amp_compare.keras_impl.optimizers import TorchAdam

            inner = TorchAdam(learning_rate=cfg.lr, epsilon=settings["adam_epsilon"], **extra)
        else:
            inner = keras.optimizers.Adam(learning_rate=cfg.lr, **extra)
    else:
        inner = keras.optimizers.SGD(learning_rate=cfg.lr, momentum=cfg.momentum, **extra)
    optimizer = make_scaler(cfg, inner)  # AMP: loss scaling wraps the optimizer (fp16, fp16-static)
    optimizer.build(params)
    return optimizer


def make_loss(cfg: RunConfig) -> keras.losses.Loss:
    """The training loss: mean cross-entropy over the batch, computed in float32 (the loss's dtype is
    floatx, float32, whatever the policy: it casts the logits up, as torch autocast does for cross_entropy)."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def compile_model(cfg: RunConfig, model: keras.Model) -> None:
    """fit()'s setup, for train() and the probe alike: the optimizer (auto_scale_loss=False: make_optimizer
    is the whole AMP setup, so fp16-noscale stays unscaled), the loss, accuracy, XLA (jit_compile) for
    --compile or --step tuned; the optimizer is built on the model's variables before fit()."""
    model.compile(optimizer=make_optimizer(cfg, model.trainable_variables), loss=make_loss(cfg), metrics=["accuracy"],
                  jit_compile=cfg.compile or cfg.step == "tuned", auto_scale_loss=False)


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


class StepLog:
    """Per-step values kept on the device (GPU): written inside train_step, read once per epoch.

    Reading a step's values on the host every step would synchronise a GPU every step and hide
    the speed-up being measured; Keras does that as soon as a callback has on_train_batch_end.
    """

    def __init__(self, steps: int):
        self.loss = tf.Variable(tf.zeros([steps]), trainable=False)
        self.scale = tf.Variable(tf.zeros([steps]), trainable=False)
        self.skipped = tf.Variable(tf.zeros([steps], tf.bool), trainable=False)
        self.position = tf.Variable(0, dtype=tf.int32, trainable=False)

    def record(self, loss, scale, skipped) -> None:
        index = tf.reshape(self.position, [1, 1])
        self.loss.scatter_nd_update(index, tf.reshape(tf.cast(loss, tf.float32), [1]))
        self.scale.scatter_nd_update(index, tf.reshape(tf.cast(scale, tf.float32), [1]))
        self.skipped.scatter_nd_update(index, tf.reshape(skipped, [1]))
        self.position.assign_add(1)

    def drain(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This epoch's values on the host (one synchronisation), and a reset for the next epoch."""
        n = int(self.position.numpy())
        values = self.loss.numpy()[:n], self.scale.numpy()[:n], self.skipped.numpy()[:n]
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

    def train_step(self, data):
        """One optimizer step. Returns the epoch's running metrics plus this batch's own values."""
        x, y = self.batch(data)
        loss, logits, scale_used, skipped = scaled_step(self, x, y)  # AMP: the scaled step (amp.py)
        for metric in self.metrics:  # epoch running means: loss, then the compiled accuracy
            if metric.name == "loss":
                metric.update_state(loss)
        logs = self.compute_metrics(x, y, logits)
        if self.step_log is not None:
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
            device_images.images.assign(epoch_images(data, self.cfg.seed, epoch, augment=True))
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

    def drain(self) -> None:
        loss, scale, skipped = self.model.step_log.drain()  # the epoch's one synchronisation
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


def device_info(gpus: list) -> dict[str, object]:
    """What TensorFlow sees of the accelerator and the CUDA/cuDNN it was built with."""
    build = tf.sysconfig.get_build_info()
    info: dict[str, object] = {"tf_cuda_version": build.get("cuda_version", ""),
                               "tf_cudnn_version": build.get("cudnn_version", "")}
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        capability = details.get("compute_capability")
        info.update(device_name=details.get("device_name", "GPU"),
                    compute_capability=".".join(map(str, capability)) if capability else "")
    else:
        info["device_name"] = "cpu"
    return info


def make_dataset(cfg: RunConfig, data: Dataset) -> tuple[tf.data.Dataset, DeviceImages]:
    """Batch indices in exactly the order of the cell's amp_compare.kit.data.batch_plan (every epoch's
    batches in a row: fit() takes steps_per_epoch of them per epoch), and the images they index.

    The model gathers each batch inside its train_step (see DeviceImages); with augmentation
    StepRecorder swaps in each epoch's augmented images (kit/data.py: the pixels torch sees).
    """
    plan = batch_plan(len(data.x_train), cfg.batch_size, cfg.seed, cfg.epochs, cfg.steps_per_epoch)
    indices = tf.data.Dataset.from_tensor_slices(plan.reshape(-1, plan.shape[-1])).prefetch(tf.data.AUTOTUNE)
    return indices, DeviceImages(data.x_train, data.y_train)


def train(cfg: RunConfig, data: Dataset, progress: Progress, shared_init: SharedInit) -> TrainResult:
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
        **device_info(gpus if cfg.device == "cuda" else []),
        "tf32": f"tensor_float_32_execution={tf.config.experimental.tensor_float_32_execution_enabled()}",
        "amp_api": describe_amp(cfg),
        "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    })
    tuned = cfg.compile or cfg.step == "tuned"  # --step tuned: XLA (jit_compile=True)
    result.info.update(compiled="jit_compile=True (XLA)" if tuned else "tf.function (no XLA)", step_loop=cfg.step,
                       optimizer_impl="keras default", **measure_peak(device, cfg, result.info["device_name"]))
    with tf.device(device):
        model = make_model(cfg, data)
        init_source = shared_init.apply(model, get_weights, set_weights)
        compile_model(cfg, model)
        result.info.update(init_source=init_source, framework_defaults=describe_defaults(),
                           settings_used=settings_used(model, model.optimizer, model.optimizer, cfg))
        dataset, model.device_images = make_dataset(cfg, data)
        device_mode = cfg.step_values == "device" or (cfg.step_values == "auto" and cfg.device == "cuda")
        recorder = DeviceStepRecorder if device_mode else StepRecorder
        # host mode reads each step's values (a wait per step on a GPU); device mode reads once per epoch
        result.info["host_syncs_per_step"] = 0 if device_mode else 1
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
            bad = first_nonfinite_parameter(get_weights(model))
            found = ({"where": "parameters", "layer": bad, "value": "nan/inf", "tensor": bad} if bad else
                     numerics.locate_nonfinite(model, tf.gather(model.device_images.images, idx).numpy(),
                                               data.y_train[idx], cfg.precision,
                                               float(current_scale(model.optimizer))))
            result.nonfinite = {"step": step, **(found or {"where": "not reproduced", "layer": "", "value": ""})}
            return True

        model.step_log = StepLog(steps) if device_mode else None  # after the audit: its trace must not record
        if cfg.device == "cuda":
            tf.config.experimental.reset_memory_stats("GPU:0")
        else:
            cpu_memory = CpuPeakMemory()
        callback = recorder(cfg, steps, progress, result, on_nonfinite=on_nonfinite,
                            augment=(data, model.device_images) if cfg.augment else None)
        callback.first_step = FirstStepWindow(cpu_memory if cfg.device == "cpu" else None)
        model.fit(dataset, epochs=cfg.epochs, steps_per_epoch=steps, verbose=0, shuffle=False,
                  validation_data=(data.x_val, data.y_val), validation_batch_size=EVAL_BATCH, callbacks=[callback])
    if cfg.device == "cuda":
        # the training images held on the device (DeviceImages) are reported apart, not as training memory
        result.peak_memory_bytes = max(0, tf.config.experimental.get_memory_info("GPU:0")["peak"] - dataset_bytes)
        result.memory_kind = "tf_gpu_allocator_peak_minus_dataset"
        result.info["dataset_device_bytes"] = dataset_bytes
    else:
        result.peak_memory_bytes = cpu_memory.peak_bytes()
        result.memory_kind = cpu_memory.kind + "_after_first_step"
        result.info["dataset_device_bytes"] = 0
    result.info["first_step_peak_memory_bytes"] = callback.first_step.peak_bytes
    # Per validation image, right or wrong: the final model's predictions for the paired tests (harness/stats.py).
    result.val_correct = np.argmax(model.predict(data.x_val, batch_size=EVAL_BATCH, verbose=0), axis=1) == data.y_val
    check_final_weights(result, get_weights(model))  # non-finite weights behind a finite loss: diverged
    result.extra["underflow"] += underflow_rows(numerics, model, probe, cfg, model.optimizer, "last step",
                                                len(result.step_loss) - 1)
    return result


def measure_peak(device: str, cfg: RunConfig, device_name: str) -> dict:
    """The device's matmul peak for this cell's dtype (kit/peak.py), measured before training."""
    from amp_compare.kit import peak

    dtype = {"fp16": tf.float16, "bf16": tf.bfloat16, "tf32": tf.float32, "fp32": tf.float32}[
        peak.matmul_dtype(cfg.precision, cfg.tf32)]

    def time_matmul(n: int, repeats: int) -> float:
        with tf.device(device):
            a = tf.cast(tf.random.normal([n, n]), dtype)
            b = tf.cast(tf.random.normal([n, n]), dtype)
            tf.linalg.matmul(a, b)[0, 0].numpy()  # first call: kernel selection, not timed
            start = time.perf_counter()
            for _ in range(repeats):
                c = tf.linalg.matmul(a, b)
            c[0, 0].numpy()  # waits for the device (ops on one stream run in order); copies one element
            return time.perf_counter() - start

    flops, size = peak.measure(time_matmul, max_size=8192 if device.startswith("/GPU") else 2048,
                               budget_s=1.0 if device.startswith("/GPU") else 0.5)
    return peak.peak_info(device_name, cfg.precision, cfg.tf32, flops, size)


def underflow_rows(numerics, model, probe, cfg: RunConfig, scaler, when: str, step: int) -> list[dict]:
    """Per-layer gradient magnitudes of one batch against float16's range, at the scale in use then."""
    scale = float(current_scale(scaler))
    rows = numerics.gradient_underflow(model, *probe, cfg.precision, loss_scale=scale)
    return [{**row, "when": when, "at_step": step, "log2_hist": json.dumps(row.get("log2_hist"))} for row in rows]
