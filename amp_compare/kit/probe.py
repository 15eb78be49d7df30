"""The max-batch probe's child side: what `python -m amp_compare.torch_impl.probe|keras_impl.probe` runs.

A probe child reads the cell's RunConfig, builds a dataset of the right shape (no images), makes one
random batch, calls its framework's `two_steps` and prints one JSON line: fits (exit 0) or does not
(exit EXIT_OOM). The parent's side (spawning, the RSS watchdog, the doubling and bisection search) is
harness/run/maxbatch.py; this module never imports it, nor any framework. Sizes are parsed and printed here
(`parse_size`, `format_size`), since both sides use them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from amp_compare.contract.config import ConfigError, RunConfig
from amp_compare.contract.env import proc_status_bytes
from amp_compare.kit.data import NUM_CLASSES, Dataset, load_dataset

EXIT_OOM = 75  # sysexits EX_TEMPFAIL: this batch does not fit; a smaller one may
PEAK_RSS_KIND = "cpu_peak_rss"  # absolute VmHWM of the probe process: the cap is on the whole process
CIFAR_SHAPE = (32, 32, 3)

_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'4GiB' -> 4294967296. Units B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024)."""
    match = _SIZE.fullmatch(str(text))
    unit = _UNITS.get(match.group(2).lower()) if match else None
    size = int(float(match.group(1)) * unit) if unit else 0
    if size < 1:
        # A bare number is refused: "4" meaning four bytes is never what someone asking for 4 GB meant.
        raise ConfigError(f"bad memory size {text!r} (valid: a positive number and a unit, B, KB, MB, GB, TB "
                          "(1000-based) or KiB, MiB, GiB, TiB (1024-based), e.g. 4GiB)")
    return size


def format_size(size: float) -> str:
    """Bytes as a short 1024-based string, e.g. '1.50 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def rss_bytes(pid: int | str = "self", key: str = "VmRSS") -> int:
    """A process's resident memory (VmRSS) or its peak (VmHWM) from /proc; 0 once it has gone."""
    return proc_status_bytes(key, pid)


def shape_dataset(name: str, data_dir: str | None = None) -> Dataset:
    """A Dataset with the right input shape and class count but no images: all make_model needs.

    CIFAR-shaped datasets are 32x32x3 by definition and are not loaded (hundreds of MB that would
    land in the very peak being measured); the small ones come from load_dataset, the source of truth.
    """
    if name in ("synthetic_cifar", "cifar10", "cifar100"):
        shape, classes, source = CIFAR_SHAPE, NUM_CLASSES[name], f"{name}: shape only"
    else:
        data = load_dataset(name, data_dir)
        shape, classes, source = data.input_shape, data.num_classes, data.source
    empty = np.zeros((0, *shape), dtype=np.float32)
    labels = np.zeros(0, dtype=np.int64)
    return Dataset(name, empty, labels, empty, labels, classes, source)


def random_batch(data: Dataset, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch of random NHWC float32 images and int64 labels: memory does not depend on the pixels."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *data.input_shape), dtype=np.float32)
    return x, rng.integers(0, data.num_classes, size=batch, dtype=np.int64)


def exception_chain(exc: BaseException | None):
    """exc and the exceptions behind it (__cause__, else __context__): torch.compile, for one, hands an allocator
    failure on wrapped (BackendCompilerFailed), so is_out_of_memory looks through the whole chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


# What torch's allocators say when they run out where they raise a plain RuntimeError (the CPU allocator always;
# CUDA's where no OutOfMemoryError is raised): native torch and Keras on torch meet the same allocators.
TORCH_OOM_MESSAGES = ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory")


def torch_ran_out(exc: BaseException, out_of_memory_error: type) -> bool:
    """torch.OutOfMemoryError (passed in: this module imports no framework), or an allocator's RuntimeError."""
    return isinstance(exc, out_of_memory_error) or (
        isinstance(exc, RuntimeError) and any(message in str(exc) for message in TORCH_OOM_MESSAGES))


# two_steps(cfg, data, x, y) -> (peak_bytes, memory_kind): build the cell as training does, run two steps.
TwoSteps = Callable[[RunConfig, Dataset, np.ndarray, np.ndarray], tuple[int, str]]


def probe_main(two_steps: TwoSteps, is_out_of_memory: Callable[[Exception], bool],
               argv: list[str] | None = None, limit_gpu: Callable[[int], str] | None = None) -> int:
    """`python -m amp_compare.torch_impl.probe|keras_impl.probe`: one JSON line; exit 0 (fits) or EXIT_OOM.

    Only out-of-memory errors (MemoryError, or what the framework's `is_out_of_memory` accepts)
    become EXIT_OOM; anything else raises, so a bug never passes for a batch that is too large.
    """
    parser = argparse.ArgumentParser(description="Train two steps of one amp-compare cell at one batch size.")
    parser.add_argument("--config", required=True, type=Path, help="RunConfig JSON file")
    parser.add_argument("--batch", required=True, type=int, help="images per step")
    parser.add_argument("--memory-cap", type=parse_cap, default=None,
                        help="bytes (or e.g. 4GiB) the process's peak RSS may reach (CPU) or the GPU memory "
                             "the framework may allocate (GPU, enforced by limit_gpu)")
    args = parser.parse_args(argv)
    cfg = dataclasses.replace(RunConfig.from_json(args.config.read_text()), batch_size=args.batch)

    def report(ok: bool, **fields) -> int:
        print(json.dumps({"batch": args.batch, "ok": ok, **fields}), flush=True)
        return 0 if ok else EXIT_OOM

    try:
        if cfg.device == "cuda" and args.memory_cap is not None and limit_gpu is not None:
            limit_gpu(args.memory_cap)  # before the framework allocates anything on the device
        data = shape_dataset(cfg.dataset, cfg.data_dir)
        x, y = random_batch(data, args.batch, cfg.seed)
        peak, kind = two_steps(cfg, data, x, y)
    except Exception as exc:
        if not (isinstance(exc, MemoryError) or is_out_of_memory(exc)):
            raise
        return report(False, reason=f"{type(exc).__name__}: {_oom_line(str(exc))}")
    if cfg.device == "cpu" and args.memory_cap is not None and peak > args.memory_cap:
        return report(False, peak_bytes=peak, memory_kind=kind,
                      reason=f"peak RSS {format_size(peak)} above the cap {format_size(args.memory_cap)}")
    return report(True, peak_bytes=peak, memory_kind=kind)


def _oom_line(message: str) -> str:
    """The informative line of an out-of-memory error (TensorFlow's first line is 'Graph execution error:')."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [""]
    hits = [line for line in lines if re.search(r"\bOOM\b|out of memory|allocat", line, re.IGNORECASE)]
    return (hits or lines)[0][:300]


def parse_cap(text: str) -> int:
    """--memory-cap: plain bytes (what the parent passes) or a size with a unit."""
    return int(text) if text.isdigit() and int(text) > 0 else parse_size(text)
