"""One --find-max-batch probe in Keras (any backend): two training steps of a cell at one batch size.

`python -m amp_compare.keras_impl.probe --config cfg.json --batch N --memory-cap BYTES` builds and compiles the
model and optimizer exactly as keras_impl/train.py does, trains two steps on one random batch (the
second holds the optimizer state) and prints one JSON line; harness/run/maxbatch.py runs it and
reads that line. Read beside torch_impl/probe.py: same shape, framework lines differ.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # CUDA-driver chatter on GPU-less machines
if __name__ == "__main__":  # a probe process (never an import): Keras without its scikit-learn wrappers, as a child
    import amp_compare.keras_impl.entry  # noqa: F401 - marks scikit-learn missing before Keras loads (it says why)

import numpy as np  # noqa: E402

from amp_compare.contract.config import RunConfig  # noqa: E402
from amp_compare.contract.env import gpu_total_bytes  # noqa: E402
from amp_compare.keras_impl import backends  # noqa: E402
from amp_compare.keras_impl.train import assemble, compile_model, setup  # noqa: E402
from amp_compare.kit.data import Dataset  # noqa: E402
from amp_compare.kit.probe import PEAK_RSS_KIND, exception_chain, probe_main, rss_bytes, torch_ran_out  # noqa: E402


def two_steps(cfg: RunConfig, data: Dataset, x: np.ndarray, y: np.ndarray) -> tuple[int, str]:
    """Train two steps on (x, y) as train() would; returns the peak memory and what it measures."""
    setup(cfg)  # as train(): refuses a GPU cell where the backend sees none
    with backends.device_scope(cfg):
        # as train(): an AmpModel (its train_step is the one fit() runs), fp8-converted in the fp8 modes
        model = assemble(cfg, data, None, lambda m: compile_model(cfg, m)).model
        for _ in range(2):  # train_on_batch returns host values: the step has finished
            model.train_on_batch(x, y)
    if cfg.device == "cuda":
        return backends.peak_memory(cfg)
    return rss_bytes(key="VmHWM"), PEAK_RSS_KIND


def limit_gpu(cap_bytes: int) -> str:
    """--memory-cap on a GPU, set before the backend allocates on it: TensorFlow a logical device with that
    memory limit; JAX its preallocated fraction; torch a per-process memory fraction."""
    if backends.JAX:
        # JAX reads the variable once, when its backend starts: the device's total comes from nvidia-smi, since
        # asking JAX (jax.devices()) would start the backend first and leave the cap without effect
        total = gpu_total_bytes()
        if total:
            os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{min(1.0, cap_bytes / total):.4f}"
        return "XLA_PYTHON_CLIENT_MEM_FRACTION"
    if backends.TORCH:
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(
                min(1.0, cap_bytes / torch.cuda.get_device_properties(0).total_memory))
        return "torch.cuda.set_per_process_memory_fraction"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=cap_bytes // 2**20)])  # MiB
    return "tf.config.LogicalDeviceConfiguration(memory_limit)"


def is_out_of_memory(exc: BaseException | None) -> bool:
    """An allocator ran out, here or behind a wrapper (kit/probe.exception_chain, as in torch_impl/probe.py).
    (A failed CPU allocation may abort the process with std::bad_alloc instead; amp_compare.harness.run.maxbatch.probe
    recognises that from the outside.)"""
    return any(_ran_out(e) for e in exception_chain(exc))


def _ran_out(exc: BaseException) -> bool:
    """TensorFlow's ResourceExhaustedError, torch's OutOfMemoryError, XLA's RESOURCE_EXHAUSTED."""
    if backends.TENSORFLOW:
        import tensorflow as tf

        return isinstance(exc, tf.errors.ResourceExhaustedError)
    if backends.TORCH:
        import torch

        return torch_ran_out(exc, torch.OutOfMemoryError)  # the CPU allocator's RuntimeError too, as torch_impl's
    return "RESOURCE_EXHAUSTED" in str(exc)


if __name__ == "__main__":
    from amp_compare.kit.phases import exit_now

    exit_now(probe_main(two_steps, is_out_of_memory, limit_gpu=limit_gpu))  # its line is out: no teardown
