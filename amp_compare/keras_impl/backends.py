"""What differs between Keras 3's backends (TensorFlow, JAX, PyTorch) for one amp-compare child.

The Keras model, its dtype policy, the optimizer and LossScaleOptimizer, the loss and the recorded
values are one code path for every backend (keras_impl/train.py). What cannot be backend-neutral lives
here, one function per concern, each with a branch per backend: threads and TF32 (set and read
back), the device and its name, the framework version, how the step is compiled, the training memory
peak, the matmul timing of the peak FLOP/s probe, and gradients of a loss for the numerics lab
(torch_impl/device.py is the torch side's twin of the device functions). TensorFlow-only code
(tf.data, tf.config, TF's memory info, the traced-graph dtype audit) stays on the TensorFlow path.

The backend is fixed when Keras is imported, by KERAS_BACKEND (harness/run/runner.py sets it in the
child's environment from the cell's framework: tf, keras-jax, keras-torch).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # CUDA-driver chatter on GPU-less machines

import keras  # noqa: E402
import numpy as np  # noqa: E402

from amp_compare.contract.config import KERAS_BACKENDS, RunConfig  # noqa: E402
from amp_compare.kit import reuse  # noqa: E402
from amp_compare.kit.child import CpuPeakMemory  # noqa: E402
from amp_compare.kit.training import TENSOR_DTYPES  # noqa: E402

BACKEND = keras.backend.backend()  # "tensorflow", "jax" or "torch"
TENSORFLOW, JAX, TORCH = BACKEND == "tensorflow", BACKEND == "jax", BACKEND == "torch"
# JAX's float32 matmul/convolution precision per --tf32 (jax_default_matmul_precision): "float32" keeps
# full float32 (off); "tensorfloat32" lets an NVIDIA GPU use TF32 (on). JAX's own default on a GPU is TF32.
JAX_MATMUL_PRECISION = {"on": "tensorfloat32", "off": "float32"}


def host_syncs_per_step(device_mode: bool, steps_per_execution: int, dynamic_scaling: bool) -> float:
    """How often fit() waits for the device per training step, from what Keras 3.15 does on each backend
    (tests/test_device_mode.py counts the TensorFlow conversions):
    * TensorFlow: its backend is not thread-safe, so CallbackList never dispatches callbacks on a worker
      thread: after every execution of the train function it converts the logs to host values
      (pythonify_logs), whether or not a callback reads them. One wait per execution: 1 per step with
      steps_per_execution=1, one per epoch where train() runs the epoch as one execution (tuned, device mode).
    * JAX and torch: host mode reads each step's logs (1); device mode hands them to an async_safe
      callback on a worker thread, so the training loop does not wait (0).
    * torch: LossScaleOptimizer's dynamic scaling branches twice per step with ops.cond, a Python `if` on a
      device bool there: 2 more waits (JAX's cond is lax.cond, TensorFlow's tf.cond: on the device).
    """
    if TENSORFLOW:
        waits = 1 / steps_per_execution
    else:
        waits = 0.0 if device_mode else 1.0
    return waits + (2.0 if TORCH and dynamic_scaling else 0.0)


def check_backend(cfg: RunConfig) -> None:
    """The cell's framework names the backend Keras must run on; a child on another backend stops here."""
    expected = KERAS_BACKENDS[cfg.framework]
    if BACKEND != expected:
        raise RuntimeError(f"framework {cfg.framework!r} runs Keras on {expected!r}, but this process's Keras runs "
                           f"on {BACKEND!r}: set KERAS_BACKEND={expected} before Keras is imported")


def set_random_seed(seed: int) -> None:
    """keras.utils.set_random_seed (Python's, NumPy's and the backend's generators, Keras' global seed generator),
    without importing TensorFlow off the TensorFlow backend: Keras seeds TensorFlow wherever it is installed, for
    tf.data pipelines, which only the TensorFlow cells use (keras_impl/train.make_dataset); that import was ~5
    CPU-seconds of every keras-jax and keras-torch cell's setup."""
    if not TENSORFLOW and "tensorflow" not in sys.modules:
        from keras.src.utils import module_utils

        module_utils.tensorflow._available = False  # noqa: SLF001 - what Keras caches where TensorFlow is absent
    keras.utils.set_random_seed(seed)


def set_threads(threads: int) -> None:
    """Intra- and inter-op threads, where the backend lets a running process set them."""
    if TENSORFLOW:
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # only settable before TensorFlow initialises its runtime
            pass
    elif TORCH:
        import torch

        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # settable once, before any inter-op work
            torch.set_num_interop_threads(threads)


def thread_info() -> dict[str, object]:
    """The thread counts in use, read back (JAX's XLA CPU client sizes its own pool: recorded as such)."""
    if TENSORFLOW:
        import tensorflow as tf

        return {"tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}
    if TORCH:
        import torch

        return {"torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads()}
    return {"jax_threads": "XLA's own pool (not settable from a running process)"}


def set_tf32(tf32: str) -> None:
    """--tf32 on|off, so float32 means the same on every backend (each backend's own default differs)."""
    if TENSORFLOW:
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(tf32 == "on")
    elif JAX:
        import jax

        jax.config.update("jax_default_matmul_precision", JAX_MATMUL_PRECISION[tf32])
    else:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = tf32 == "on"
        torch.backends.cudnn.allow_tf32 = tf32 == "on"


def tf32_state() -> tuple[str, str]:
    """TF32 as the backend reports it now: ("on" | "off" | "mixed", the backend's own setting in words)."""
    if TENSORFLOW:
        import tensorflow as tf

        enabled = tf.config.experimental.tensor_float_32_execution_enabled()
        return ("on" if enabled else "off"), f"tensor_float_32_execution={enabled}"
    if JAX:
        import jax

        value = jax.config.jax_default_matmul_precision
        state = {"tensorfloat32": "on", "high": "on", "float32": "off", "highest": "off"}.get(
            str(value).lower(), f"backend default ({value})")
        return state, f"jax_default_matmul_precision={value}"
    import torch

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    state = "on" if matmul and cudnn else "off" if not (matmul or cudnn) else "mixed"
    return state, f"matmul.allow_tf32={matmul}, cudnn.allow_tf32={cudnn}"


def gpu_available() -> bool:
    if TENSORFLOW:
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    if JAX:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    import torch

    return torch.cuda.is_available()


def device_scope(cfg: RunConfig):
    """Where the model lives: TensorFlow places by scope; JAX and Keras' torch backend by the child's
    environment (JAX_PLATFORMS, KERAS_TORCH_DEVICE, set by harness/run/runner.py), so no scope is needed."""
    if TENSORFLOW:
        import tensorflow as tf

        return tf.device("/GPU:0" if cfg.device == "cuda" else "/CPU:0")
    return contextlib.nullcontext()


def versions() -> dict[str, object]:
    """framework_version: the backend library's version (Keras' own is keras_version)."""
    if TENSORFLOW:
        import tensorflow as tf

        version = tf.__version__
    elif JAX:
        import jax
        import jaxlib

        version = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"
    else:
        import torch

        version = torch.__version__
    return {"framework_version": version, "keras_version": keras.__version__, "keras_backend": BACKEND}


def device_info(cfg: RunConfig) -> dict[str, object]:
    """The accelerator the cell runs on, as the backend names it (TensorFlow adds its CUDA/cuDNN build)."""
    if TENSORFLOW:
        import tensorflow as tf

        build = tf.sysconfig.get_build_info()
        info: dict[str, object] = {"tf_cuda_version": build.get("cuda_version", ""),
                                   "tf_cudnn_version": build.get("cudnn_version", "")}
        gpus = tf.config.list_physical_devices("GPU") if cfg.device == "cuda" else []
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            capability = details.get("compute_capability")
            info.update(device_name=details.get("device_name", "GPU"),
                        compute_capability=".".join(map(str, capability)) if capability else "")
        else:
            info["device_name"] = "cpu"
        return info
    if cfg.device != "cuda":
        return {"device_name": "cpu"}
    if JAX:
        import jax

        return {"device_name": jax.devices()[0].device_kind}
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return {"device_name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}",
            "torch_cuda_version": torch.version.cuda or ""}


def start_memory_window(cfg: RunConfig) -> CpuPeakMemory | None:
    """Training's memory window: the accelerator's peak reset (JAX keeps one peak per process: nothing to
    reset), or the CPU's resident peak from now on."""
    if cfg.device != "cuda":
        return CpuPeakMemory()
    if TENSORFLOW:
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("GPU:0")
    elif TORCH:
        import torch

        torch.cuda.reset_peak_memory_stats()
    return None


def training_peak(cfg: RunConfig, memory: CpuPeakMemory | None, dataset_bytes: int = 0) -> tuple[int, str]:
    """The training peak since start_memory_window and what it measures; dataset_bytes: the training images
    held on the device (DeviceImages, TensorFlow), reported apart, not as training memory."""
    if memory is not None:
        return memory.peak_bytes(), memory.kind + "_after_first_step"
    peak, kind = peak_memory(cfg)
    return (max(0, peak - dataset_bytes), kind + "_minus_dataset") if dataset_bytes else (peak, kind)


def peak_memory(cfg: RunConfig) -> tuple[int, str]:
    """The accelerator allocator's peak in bytes and what it measures (GPU cells only)."""
    if TENSORFLOW:
        import tensorflow as tf

        return tf.config.experimental.get_memory_info("GPU:0")["peak"], "tf_gpu_allocator_peak"
    if JAX:
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        return int(stats.get("peak_bytes_in_use", 0)), "jax_peak_bytes_in_use_since_start"
    import torch

    return torch.cuda.max_memory_allocated(), "torch_cuda_max_memory_allocated"


def measure_ceiling(cfg: RunConfig, device_name: str) -> dict:
    """The device's matmul FLOP/s ceiling for this cell's dtype (kit/ceiling.py), measured before training (after
    it for JAX on a GPU, whose peak memory counts from the process's start: see train.train())."""
    from amp_compare.kit import ceiling

    return ceiling.measure_cell_ceiling(cfg.precision, cfg.tf32, cfg.device, device_name,
                                        lambda name: time_matmul_function(cfg, TENSOR_DTYPES[name]),
                                        reuse.per_machine("ceiling", cfg))


def compiled_text(jit_compile: bool) -> str:
    """How the step is compiled on this backend, in words for the report's Environment table."""
    if TENSORFLOW:
        return "jit_compile=True (XLA)" if jit_compile else "tf.function (no XLA)"
    if JAX:
        return "jax.jit (XLA), Keras' default on JAX"
    return "jit_compile=True (torch.compile)" if jit_compile else "eager (Keras' torch default)"


def time_matmul_function(cfg: RunConfig, dtype: str):
    """time_matmul(n, repeats) -> seconds for kit/ceiling.py, in this backend's own ops."""
    ops = keras.ops

    def time_matmul(n: int, repeats: int) -> float:
        with device_scope(cfg):
            rng = np.random.default_rng(0)
            a = ops.cast(ops.convert_to_tensor(rng.standard_normal((n, n), dtype=np.float32)), dtype)
            b = ops.cast(ops.convert_to_tensor(rng.standard_normal((n, n), dtype=np.float32)), dtype)
            # one element, as float32 (numpy has no bfloat16): waits for the device, copies 4 bytes
            ops.convert_to_numpy(ops.cast(ops.matmul(a, b)[0, 0], "float32"))  # first call: kernel selection
            start = time.perf_counter()
            for _ in range(repeats):
                c = ops.matmul(a, b)
            ops.convert_to_numpy(ops.cast(c[0, 0], "float32"))  # waits for the device (ops run in order)
            return time.perf_counter() - start

    return time_matmul


def gradients(model: keras.Model, loss_of_outputs, inputs, extra_outputs=()) -> tuple[object, list]:
    """The loss and its gradients w.r.t. the model's trainable variables (and `extra_outputs` positions).

    loss_of_outputs(outputs) -> scalar loss, outputs = model(inputs, training=True). Eager, in each
    backend's own autodiff: TensorFlow's GradientTape, torch.autograd, jax.grad over a stateless call
    (the model's non-trainable state, e.g. BatchNorm's moving statistics, is left as it was on JAX and
    put back by the callers on the others). Gradients come back in trainable-variable order (None where
    a variable does not reach the loss). With extra_outputs (indices into a list-valued output), the
    gradients w.r.t. those outputs come first; JAX does not offer these: None each.
    """
    variables = model.trainable_variables
    if TENSORFLOW:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            outputs = model(inputs, training=True)
            loss = loss_of_outputs(outputs)
        targets = [outputs[i] for i in extra_outputs] + list(variables)
        return loss, list(tape.gradient(loss, targets))
    if TORCH:
        import torch

        outputs = model(inputs, training=True)
        loss = loss_of_outputs(outputs)
        targets = [outputs[i] for i in extra_outputs] + [v.value for v in variables]
        grads = torch.autograd.grad(loss, targets, allow_unused=True)
        return loss.detach(), list(grads)
    import jax

    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss_fn(trainable):
        outputs, _ = model.stateless_call(trainable, non_trainable, inputs, training=True)
        return loss_of_outputs(outputs)

    loss, grads = jax.value_and_grad(loss_fn)([v.value for v in variables])
    return loss, [None] * len(extra_outputs) + list(grads)
