"""Keras 3 training for one amp-compare cell, on any of Keras' backends: build, numerics lab, fit(), closing records.

Read this file beside the other framework's train.py: the functions of contract/twins.py have one signature
in both, the AMP idiom itself is amp.py, the instrumented loop loop.py (fit() over AmpModel with a
recording callback), and the AMP lines here are marked `# AMP:`.

One model, policy, optimizer (LossScaleOptimizer for fp16), loss and record for the frameworks tf,
keras-jax and keras-torch: the backend (KERAS_BACKEND, set by the parent before Keras is imported)
changes only what keras_impl/backends.py holds, the train_step's autodiff (Keras' own per-backend
form: GradientTape, jax.value_and_grad over a stateless call, torch's backward) and the input
pipeline: TensorFlow feeds batch indices through tf.data and gathers the images inside the step;
the other backends get each batch as numpy arrays from a generator in the same order.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # CUDA-driver chatter on GPU-less machines

import keras  # noqa: E402
import numpy as np  # noqa: E402

from amp_compare.keras_impl import backends  # noqa: E402

if backends.TENSORFLOW:  # TensorFlow-only code below (tf.data, the locator's gather) runs on that backend only
    import tensorflow as tf

from amp_compare.contract.config import RunConfig  # noqa: E402
from amp_compare.contract.mapping import framework_settings  # noqa: E402
from amp_compare.keras_impl import amp, distributed, fp8, loop, numerics, profile, vit  # noqa: E402
from amp_compare.keras_impl.models import build_model, get_weights, set_weights  # noqa: E402
from amp_compare.keras_impl.optimizers import learning_rate  # noqa: E402
from amp_compare.keras_impl.settings import describe_defaults, settings_used  # noqa: E402
from amp_compare.kit import training  # noqa: E402
from amp_compare.kit.build import Built, build  # noqa: E402
from amp_compare.kit.child import (  # noqa: E402
    CpuPeakMemory,
    FirstStepWindow,
    Progress,
    SharedInit,
    TrainResult,
    check_final_weights,
)
from amp_compare.kit.data import Dataset, batch_plan, epoch_images, steps_per_epoch  # noqa: E402
from amp_compare.kit.dataparallel import numerics_for  # noqa: E402
from amp_compare.kit.phases import lap  # noqa: E402
from amp_compare.kit.training import EVAL_BATCH, StepBook, first_batch_index  # noqa: E402


def setup(cfg: RunConfig) -> None:
    backends.check_backend(cfg)  # the cell's framework names the backend this process's Keras must run on
    distributed.prepare(cfg)  # DATA PARALLEL: N devices before the backend starts, or unavailable (distributed.py)
    backends.set_random_seed(cfg.seed)
    backends.set_threads(cfg.threads)
    amp.mixed_precision(cfg.precision)  # AMP: layers built from now on compute in half precision
    # TF32 decided here, as on the torch side (TF's and JAX's own GPU defaults are on), so fp32 means the same
    # everywhere; read back into settings_used.
    backends.set_tf32(cfg.tf32)
    if cfg.device == "cuda" and not backends.gpu_available():  # train() and the probe both start here
        raise RuntimeError(f"device 'cuda' requested but Keras' {backends.BACKEND} backend sees no GPU")


def make_model(cfg: RunConfig, data: Dataset) -> keras.Model:
    settings = framework_settings(cfg)  # empty in 'defaults' mode: Keras' own BatchNorm and padding
    model = build_model(cfg.model, data.input_shape, data.num_classes, model_class=loop.AmpModel, width=cfg.width,
                        bn_momentum=settings.get("bn_momentum"), bn_epsilon=settings.get("bn_epsilon"),
                        stride2_padding=settings.get("stride2_padding", "same"),
                        # aligned: the output layer in the policy's dtype, as torch autocast's Linear
                        output_dtype=None if settings.get("output_dtype") == "policy" else "float32",
                        vit=vit.arguments(cfg, settings))
    if cfg.fp32_layers:  # AMP: these layers get the float32 policy (Keras fixes a policy at construction)
        model = numerics.apply_fp32_layers(model, cfg.fp32_layers)
    return model


def assemble(cfg: RunConfig, data: Dataset, shared_init: SharedInit | None, compile) -> Built:
    """The cell's model in kit/build.py's order, with Keras' steps: make_model, the shared initial weights,
    fp8.convert (float8 Dense/EinsumDense outside --fp32-layers), then compile(model)."""
    return build(cfg, data, shared_init, make_model=make_model, get_weights=get_weights, set_weights=set_weights,
                 convert_fp8=fp8.convert, compile=compile)


def make_optimizer(cfg: RunConfig, params) -> keras.optimizers.Optimizer:
    """The cell's optimizer, loss scaling included (amp.with_loss_scaling), built on params (the model's
    trainable variables) as fit() would build it."""
    settings = framework_settings(cfg)
    extra = amp.clip_gradients(cfg.clip_grad_norm)  # AMP: on the unscaled gradients (amp.py)
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
    optimizer = amp.with_loss_scaling(cfg, inner)  # AMP: loss scaling wraps the optimizer (fp16, fp16-static)
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


def untuned(dataset):
    """A tf.data pipeline with a fixed prefetch and no autotuner. Destroying an iterator (fit() does, for its
    validation pass at each epoch's end) waits for the autotuner's thread to wake from its sleep: 14-19 s of idle
    time per epoch were seen on a 2-core Xeon with one thread per cell (a third of a float16 cell's wall time)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.prefetch(2).with_options(options)


def validation_data(data: Dataset) -> tuple:
    """fit()'s and predict()'s validation input and its batch size: on TensorFlow an untuned tf.data pipeline of
    EVAL_BATCH images a batch (Keras' own, built from arrays, autotunes), on other backends the arrays."""
    if backends.TENSORFLOW:
        return untuned(tf.data.Dataset.from_tensor_slices((data.x_val, data.y_val)).batch(EVAL_BATCH)), None
    return (data.x_val, data.y_val), EVAL_BATCH


def make_dataset(cfg: RunConfig, data: Dataset) -> tuple:
    """What fit() iterates, in exactly the order of the cell's amp_compare.kit.data.batch_plan (every epoch's
    batches in a row: fit() takes steps_per_epoch of them per epoch), and the images it draws from.

    TensorFlow: batch indices through tf.data, the model gathers each batch inside its train_step (see
    loop.DeviceImages). Other backends: a generator of numpy (x, y) batches (loop.HostImages). With augmentation
    (augment_seed: the cell's seed) the recorder swaps in each epoch's augmented images (kit/data.py:
    the pixels torch sees) before the epoch's clock starts.
    """
    plan = batch_plan(len(data.x_train), cfg.batch_size, cfg.seed, cfg.epochs, cfg.steps_per_epoch)
    if backends.TENSORFLOW:
        indices = tf.data.Dataset.from_tensor_slices(plan.reshape(-1, plan.shape[-1]))
        return untuned(indices), loop.DeviceImages(data.x_train, data.y_train)
    first = epoch_images(data, cfg.seed, 0, augment=True) if cfg.augment else None
    images = loop.HostImages(data.x_train, data.y_train, augmented_first=first)
    return loop.host_batches(images, plan), images


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
    logs = profile.start_logs(cfg)  # --profile on TF: oneDNN's log and TF's Eigen-fallback line (profile.py)
    steps = steps_per_epoch(len(data.x_train), cfg.batch_size, cfg.steps_per_epoch)
    # JAX's GPU peak memory counts from the process's start (backends.peak_memory): its matmul ceiling probe (up to
    # three 8192x8192 float32 matrices, 768 MiB) waits until the training peak has been read
    ceiling_first = not (backends.JAX and cfg.device == "cuda")
    result = TrainResult(info=run_info(cfg, steps))
    lap("setup")  # kit/phases.py: where the child's wall time goes
    result.info.update(backends.measure_ceiling(cfg, result.info["device_name"])  # one per dtype (kit/reuse.py)
                       if ceiling_first else {})
    lap("ceiling")
    with distributed.scope(cfg):  # DATA PARALLEL: the strategy's scope / the distribution; else device_scope
        built = assemble(cfg, data, shared_init, lambda m: compile_model(cfg, m, result.info["steps_per_execution"]))
        model, init_source = built.model, built.init_source
        distributed.compiled(cfg, model, data)  # DATA PARALLEL: built for the strategy; its all-reduce observed
        lap("init")
        result.info.update(init_source=init_source, framework_defaults=describe_defaults(),
                           settings_used=settings_used(model, model.optimizer, model.optimizer, cfg),
                           fp8_settings=fp8.settings(model))  # fp8: the recipe read back from the live layers
        lap("setup")
        dataset, images = attach_dataset(model, cfg, data)
        lap("data")
        first_batch = numerics_lab(cfg, data, model, result)  # outside the timed loop
        lap("audits")
        model.step_log = loop.StepLog(steps) if device_mode(cfg) and backends.TENSORFLOW else None  # after the audit
        memory = backends.start_memory_window(cfg)
        train_epochs(cfg, data, model, dataset, images, result, progress, memory, steps)
        lap("training")
    close_records(cfg, data, model, result, memory, first_batch)
    profile.profile_window(cfg, model, data, result, logs)  # --profile: extra steps after the timed ones
    distributed.finish(cfg, result)  # DATA PARALLEL: engine, all-reduce dtype read back, per-worker records
    if not ceiling_first:
        result.info.update(backends.measure_ceiling(cfg, result.info["device_name"]))
    lap("closing")
    return result


def device_mode(cfg: RunConfig) -> bool:
    """Per-step values kept on the device and read once per epoch (the GPU default), not per step. DATA PARALLEL:
    an N-worker cell's per-worker values come with fit()'s logs of each step (host mode)."""
    return not training.times_each_step(cfg)  # the rule both twins time steps by


def run_info(cfg: RunConfig, steps: int) -> dict:
    """The run's environment, compilation and step-value mode, for the run table."""
    on_device = device_mode(cfg)
    # TensorFlow's fit() waits for the logs after every execution of the train function (backends.
    # host_syncs_per_step). The tuned loop in device mode runs each epoch as one execution, Keras' own way to
    # cut that per-step cost; the plain loop keeps fit()'s default of one step per execution, as a user has.
    per_execution = steps if on_device and backends.TENSORFLOW and cfg.step == "tuned" else 1
    return {
        **backends.versions(),
        **backends.device_info(cfg),
        "tf32": backends.tf32_state()[1],
        "amp_api": amp.describe_amp(cfg),
        **backends.thread_info(),
        "compiled": backends.compiled_text(jit_compile(cfg)),
        "step_loop": cfg.step,
        "optimizer_impl": "keras default",
        # host mode reads each step's values (a wait per step on a GPU); device mode reads them once per epoch
        "host_syncs_per_step": backends.host_syncs_per_step(on_device, per_execution, cfg.loss_scaling == "dynamic"),
        "steps_per_execution": per_execution,
        "step_values": ("device: StepLog read once per epoch" if backends.TENSORFLOW else
                        "device: async_safe callback, one wait per epoch") if on_device else "host",
    }


def numerics_lab(cfg: RunConfig, data: Dataset, model: keras.Model, result: TrainResult) -> tuple:
    """The numerics lab (kit/training.py) on the first batch, taken from the host arrays; returns that batch,
    which the closing underflow rows measure again."""
    first = first_batch_index(cfg, len(data.x_train))
    first_batch = (data.x_train[first], data.y_train[first])
    training.numerics_lab(cfg, numerics, model, first_batch, float(amp.current_scale(model.optimizer)),
                          model.optimizer, result)
    result.fp8_layers = fp8.layer_rows(model, *first_batch, cfg, "first step", 0)  # fp8: per-layer SQNR
    return first_batch


def train_epochs(cfg: RunConfig, data: Dataset, model: keras.Model, dataset, images, result: TrainResult,
                 progress: Progress, memory: CpuPeakMemory | None, steps: int) -> None:
    """The timed loop: model.fit over the batch plan, each epoch followed by its validation pass, recorded by
    loop.py's callback for the step-value mode."""
    lab = numerics_for(cfg, numerics)
    plan = batch_plan(len(data.x_train), cfg.batch_size, cfg.seed, cfg.epochs, cfg.steps_per_epoch)

    def weights() -> dict:
        sync_state(model)
        return get_weights(model)

    def locate(epoch: int, batch: int, scale: float) -> dict | None:
        idx = plan[epoch, batch]
        pixels = (keras.ops.convert_to_numpy(tf.gather(model.device_images.images, idx))
                  if backends.TENSORFLOW else images.images(epoch)[idx])
        return lab.locate_nonfinite(model, pixels, data.y_train[idx], cfg.precision, scale)

    recorder = ((loop.DeviceStepRecorder if backends.TENSORFLOW else loop.AsyncStepRecorder) if device_mode(cfg)
                else loop.StepRecorder)
    callback = recorder(StepBook(cfg, result, progress, weights, locate), steps,
                        augment=(data, images) if cfg.augment else None, first_step=FirstStepWindow(memory))
    validation, batch = validation_data(data)
    model.fit(dataset, epochs=cfg.epochs, steps_per_epoch=steps, verbose=0, shuffle=False,
              validation_data=validation, validation_batch_size=batch,
              callbacks=[callback, *distributed.callbacks(cfg, steps),  # DATA PARALLEL: per-worker values
                         *fp8.callbacks(cfg, model, result.fp8_trace)])  # fp8: scales
    result.info["first_step_peak_memory_bytes"] = callback.first_step.peak_bytes


def close_records(cfg: RunConfig, data: Dataset, model: keras.Model, result: TrainResult,
                  memory: CpuPeakMemory | None, first_batch: tuple) -> None:
    """After training: the training peak, the final model's validation predictions, final weights,
    underflow at the last step."""
    on_device = cfg.device == "cuda" and backends.TENSORFLOW  # only TensorFlow holds the images on the device
    dataset_bytes = int(data.x_train.nbytes + data.y_train.nbytes) if on_device else 0  # DeviceImages: same arrays
    result.peak_memory_bytes, result.memory_kind = backends.training_peak(cfg, memory, dataset_bytes)
    result.info["dataset_device_bytes"] = dataset_bytes
    # Per validation image, right or wrong: the final model's predictions for the paired tests
    # (harness/report/stats.py).
    validation, batch = validation_data(data)
    x = validation if backends.TENSORFLOW else data.x_val  # the arrays' (x, y) pair would read as two inputs
    result.val_correct = np.argmax(model.predict(x, batch_size=batch, verbose=0), axis=1) == data.y_val
    check_final_weights(result, get_weights(model))  # non-finite weights behind a finite loss: diverged
    training.last_underflow(cfg, numerics, model, first_batch, float(amp.current_scale(model.optimizer)), result)
    result.fp8_layers += fp8.layer_rows(model, *first_batch, cfg, "last step", len(result.step_loss) - 1)
