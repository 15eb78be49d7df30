"""One --find-max-batch probe in PyTorch: two training steps of a cell at one batch size.

`python -m amp_compare.torch_impl.probe --config cfg.json --batch N --memory-cap BYTES` builds the model,
optimizer and loss scaler exactly as torch_impl/train.py does, trains two steps on one random
batch (the second holds the optimizer state) and prints one JSON line; harness/run/maxbatch.py runs
it and reads that line. Read beside keras_impl/probe.py: same shape, framework lines differ.
"""

from __future__ import annotations

import numpy as np
import torch

from amp_compare.contract.config import RunConfig
from amp_compare.kit.data import Dataset
from amp_compare.kit.probe import PEAK_RSS_KIND, exception_chain, probe_main, rss_bytes, torch_ran_out
from amp_compare.torch_impl.amp import train_step
from amp_compare.torch_impl.train import assemble, compile_model, setup, to_device_images


def two_steps(cfg: RunConfig, data: Dataset, x: np.ndarray, y: np.ndarray) -> tuple[int, str]:
    """Train two steps on (x, y) as train() would; returns the peak memory and what it measures."""
    setup(cfg)
    device = torch.device(cfg.device)
    run = assemble(cfg, data, None, lambda model: compile_model(cfg, model, device)).compiled  # as train()
    images, labels = to_device_images(x, device, cfg.channels_last), torch.from_numpy(y).to(device)
    run.model.train()
    for _ in range(2):
        if run.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        record = train_step(run.net, run.optimizer, run.scaler, images, labels, cfg.precision, cfg.clip_grad_norm)
    record.loss.item()  # waits for the device: the steps have really run
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "torch_cuda_max_memory_allocated"
    return rss_bytes(key="VmHWM"), PEAK_RSS_KIND


def limit_gpu(cap_bytes: int) -> str:
    """--memory-cap on a GPU: the caching allocator refuses to go past this share of the device's memory."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), 0)
    return "torch.cuda.set_per_process_memory_fraction"


def is_out_of_memory(exc: BaseException | None) -> bool:
    """An allocator ran out, here or behind a wrapper: torch.compile (the tuned loop) can hand the error on as
    BackendCompilerFailed when memory ran out while it compiled or captured CUDA graphs (kit/probe.exception_chain,
    as in keras_impl/probe.py)."""
    return any(_ran_out(e) for e in exception_chain(exc))


def _ran_out(exc: BaseException) -> bool:
    """torch.OutOfMemoryError on a GPU; the CPU allocator raises a plain RuntimeError instead (kit/probe.py)."""
    return torch_ran_out(exc, torch.OutOfMemoryError)


if __name__ == "__main__":
    from amp_compare.kit.phases import exit_now

    exit_now(probe_main(two_steps, is_out_of_memory, limit_gpu=limit_gpu))  # its line is out: no teardown
