"""The device's FLOP/s ceiling for a precision: a measured matmul of one fixed size, and known GPU data sheets.

MFU (model FLOPs utilisation) = achieved FLOP/s of training / the device's ceiling for the dtype the
matmuls run in. Two ceilings, both recorded per cell:
  * measured: the best of repeated square matmuls of one size per device type (SIZES) in that dtype,
    timed by the framework child at the start of the cell, outside the timed loop and the memory
    window (`measure`). The report takes the best of every cell of the run, both frameworks', per
    device and dtype (harness/report/hardware.py `run_ceilings`): one ceiling both frameworks' MFU is measured
    against, not each framework's own matmul. On a CPU it is the only ceiling there is (no vendor
    figure fits every CPU). A CPU without a half format's arithmetic
    (no AVX-512 BF16/AMX for bf16, no AVX-512 FP16/AMX for fp16) makes the frameworks convert to
    float32 and compute there, so that format's ceiling is the fp32 matmul (`ceiling_dtype`): the
    emulated matmul itself is no ceiling (measured on a 2-core EPYC, 2026-11-23: torch's bf16 matmul
    1.4 GFLOP/s, while simple_cnn's bf16 convolutions trained at 7.8 GFLOP/s, an "MFU" of 556%). The same holds
    where the run keeps the frameworks from the format's instructions (ONEDNN_MAX_CPU_ISA and the like:
    contract/env.ISA_LIMIT_VARS; on the AVX-512 BF16 EPYC capped at AVX2, torch's bf16 matmul 0.0009 TFLOP/s).
  * table: NVIDIA's published dense (no sparsity) peaks per GPU model, for the same dtype (`KNOWN_CEILINGS`).
This module never imports a framework: the child passes a function that times one matmul.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from amp_compare.contract import precision as precisions

# Dense tensor-core (fp16, bf16, tf32) and CUDA-core (fp32) peaks in TFLOP/s, from NVIDIA's data sheets:
# H100/H200: "NVIDIA H100 Tensor Core GPU" and "NVIDIA H200" data sheets (SXM; sparsity figures halved);
# A100: "NVIDIA A100 Tensor Core GPU" data sheet; L40S, L4, A10, V100, T4: their NVIDIA data sheets.
# Order matters: the first key found in the device name wins ("A100" before "A10", "L40S" before "L4").
CEILING_SOURCE = "NVIDIA data sheet, dense (no sparsity)"
KNOWN_CEILINGS: dict[str, dict[str, float]] = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},  # SXM5
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "V100": {"fp32": 15.7, "fp16": 125.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
}


def matmul_dtype(precision: str, tf32: str = "off") -> str:
    """The dtype a cell's matmuls and convolutions run in: its half format, or fp32 (tf32 where enabled)."""
    half = precisions.of(precision).half
    if half is not None:
        return {"bfloat16": "bf16", "float16": "fp16"}[half]
    return "tf32" if tf32 == "on" else "fp32"


def ceiling_dtype(precision: str, tf32: str, device_type: str, cpu_info: dict | None = None) -> tuple[str, str]:
    """The dtype whose matmul ceiling bounds a cell's arithmetic, and the reason where it is not the cell's own
    matmul dtype: on a CPU without the half format's arithmetic, fp32 (see the module docstring)."""
    choice = ceiling_choice(precision, tf32, device_type, cpu_info)
    return choice["dtype"], choice["basis"]


def ceiling_choice(precision: str, tf32: str, device_type: str, cpu_info: dict | None = None) -> dict:
    """ceiling_dtype's dtype and basis, with what made it fp32 as data: fp32_for, the half format measured against
    the fp32 matmul ("" where the ceiling is the cell's own dtype), and isa_limit, the variables that kept the
    frameworks from that format's instructions ("" where the CPU has no arithmetic for it at all)."""
    dtype = matmul_dtype(precision, tf32)
    out = {"dtype": dtype, "basis": "", "fp32_for": "", "isa_limit": ""}
    if device_type == "cpu" and precisions.of(precision).half is not None:
        from amp_compare.contract import env

        info = env.cpu_info() if cpu_info is None else cpu_info
        if not info.get(f"cpu_{dtype}_hardware"):
            # the basis says what the ceiling is and why, not how the frameworks computed (no record shows it)
            return {**out, "dtype": "fp32", "fp32_for": dtype,
                    "basis": f"no {dtype} arithmetic on this CPU, so its cells are measured against the fp32 matmul"}
        if info.get("cpu_isa_limits"):  # ONEDNN_MAX_CPU_ISA=AVX2 timed torch's bf16 matmul at 0.0009 TFLOP/s
            return {**out, "dtype": "fp32", "fp32_for": dtype, "isa_limit": info["cpu_isa_limits"],
                    "basis": f"{dtype} arithmetic limited by {info['cpu_isa_limits']} on this CPU, so its cells are "
                             "measured against the fp32 matmul"}
    return out


def known_row(device_name: str) -> str | None:
    """The KNOWN_CEILINGS row a device name matches (the first key found in it), or None."""
    name = device_name.upper()
    return next((key for key in KNOWN_CEILINGS if key.upper() in name), None)


def known_ceiling(device_name: str, dtype: str) -> float | None:
    """The published dense peak in FLOP/s for this GPU and dtype, or None (CPU, unknown GPU, no such dtype)."""
    row = known_row(device_name)
    value = KNOWN_CEILINGS[row].get(dtype) if row else None
    return value * 1e12 if value else None


# Per device type: the one matmul size every cell of a run times (so the run's best is over one named size,
# the same for both frameworks) and the seconds of repeats. On the 2-core EPYC of docs a 1024x1024 fp32 product
# takes ~27 ms (~80 GFLOP/s), so 0.25 s holds about nine; on a GPU an 8192x8192 product takes 1-25 ms.
SIZES = {"cuda": (8192, 1.0), "cpu": (1024, 0.25)}


def measure_on(device_type: str, time_matmul: Callable[[int, int], float]) -> tuple[float, int]:
    """measure() at this device type's size and budget (SIZES: "cuda" or "cpu")."""
    size, budget_s = SIZES["cuda" if device_type == "cuda" else "cpu"]
    return measure(time_matmul, size=size, budget_s=budget_s)


def measure(time_matmul: Callable[[int, int], float], size: int = 1024, budget_s: float = 1.0,
            min_single_s: float = 0.02) -> tuple[float, int]:
    """Best FLOP/s of size x size @ size x size products: time_matmul(n, repeats) -> seconds for `repeats`
    products (the caller synchronises a GPU). Repeats of at least min_single_s fill the time budget.
    Returns (FLOP/s, size)."""
    flop = 2 * size**3
    single = time_matmul(size, 1)
    best, deadline = flop / max(single, 1e-12), time.perf_counter() + budget_s
    repeats = max(1, int(min_single_s / max(single, 1e-9)))
    while time.perf_counter() < deadline:
        best = max(best, repeats * flop / max(time_matmul(size, repeats), 1e-12))
    return best, size


def measure_cell_ceiling(precision: str, tf32: str, device_type: str, device_name: str,
                         matmul_timer: Callable[[str], Callable[[int, int], float]],
                         remember: Callable[[str, Callable], list] | None = None) -> dict:
    """What each child records about its ceiling: the ceiling dtype (ceiling_dtype), its matmul measured at
    the device's size (measure_on), and ceiling_info. matmul_timer(dtype: fp32/tf32/fp16/bf16) -> time_matmul.
    remember(dtype, measure): the measurement an earlier cell of the run made in that dtype (kit/reuse.py)."""
    choice = ceiling_choice(precision, tf32, device_type)
    name = choice["dtype"]

    def measure() -> list:
        return list(measure_on(device_type, matmul_timer(name)))

    flops, size = remember(name, measure) if remember else measure()
    return ceiling_info(device_name, name, choice["basis"], flops, size, choice["fp32_for"], choice["isa_limit"])


def ceiling_info(device_name: str, dtype: str, basis: str, measured_flops: float, size: int, fp32_for: str = "",
                 isa_limit: str = "") -> dict:
    """What a child records about the ceiling (run-table columns; see kit/child.build_tables): dtype, basis,
    fp32_for and isa_limit as ceiling_choice gives them, the matmul measured in that dtype, the data-sheet value
    where known."""
    table = known_ceiling(device_name, dtype)
    return {"ceiling_dtype": f"{dtype} ({basis.split(' on ')[0]})" if basis else dtype, "ceiling_basis": basis,
            "ceiling_fp32_for": fp32_for, "ceiling_isa_limit": isa_limit,
            "ceiling_flops_measured": float(measured_flops), "ceiling_matmul_size": int(size),
            "ceiling_flops_table": float(table) if table else float("nan"),
            # the row itself, not only the device: "H100" (SXM5) is also what an H100 variant the table lacks matches
            "ceiling_table_source": (f"{CEILING_SOURCE}: {known_row(device_name)} row, {dtype} {table / 1e12:g} "
                                     f"TFLOP/s, for {device_name}") if table else ""}
