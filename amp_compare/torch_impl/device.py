"""What torch measures of the device a cell runs on: its name, the training memory peak, the matmul peak.

The twin of keras_impl/backends.py's device functions (Keras adds a branch per backend there).
"""

from __future__ import annotations

import time

import torch

from amp_compare.contract.config import RunConfig
from amp_compare.kit import reuse
from amp_compare.kit.child import CpuPeakMemory
from amp_compare.kit.training import TENSOR_DTYPES


def device_info(device: torch.device) -> dict[str, object]:
    """What torch sees of the accelerator and its libraries."""
    info: dict[str, object] = {"torch_cuda_version": torch.version.cuda or "", "torch_cudnn_version":
                               torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else ""}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        info.update(device_name=torch.cuda.get_device_name(device), compute_capability=f"{major}.{minor}")
    else:
        info["device_name"] = "cpu"
    return info


def dataset_bytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return int(sum(t.nbytes for t in tensors))


def start_memory_window(device: torch.device) -> CpuPeakMemory | None:
    """Training's memory window: the CUDA allocator's peak reset, or the CPU's resident peak from now."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        return None
    return CpuPeakMemory()


def training_peak(memory: CpuPeakMemory | None, tensors: tuple[torch.Tensor, ...]) -> tuple[int, str]:
    """The training peak since start_memory_window, and what it measures. On a GPU the dataset held on the
    device is reported apart (dataset_device_bytes), not as training memory."""
    if memory is None:
        peak = torch.cuda.max_memory_allocated(tensors[0].device) - dataset_bytes(tensors)
        return max(0, peak), "cuda_allocator_peak_minus_dataset"
    return memory.peak_bytes(), memory.kind + "_after_first_step"


def measure_ceiling(device: torch.device, cfg: RunConfig) -> dict:
    """The device's matmul FLOP/s ceiling for this cell's dtype (kit/ceiling.py), measured before training."""
    from amp_compare.kit import ceiling

    def matmul_timer(name: str):
        dtype = getattr(torch, TENSOR_DTYPES[name])

        def time_matmul(n: int, repeats: int) -> float:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            torch.mm(a, b)  # first call: kernel selection, not timed
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        return time_matmul

    return ceiling.measure_cell_ceiling(cfg.precision, cfg.tf32, device.type, device_info(device)["device_name"],
                                        matmul_timer, reuse.per_machine("ceiling", cfg))
