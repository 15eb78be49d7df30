"""Framework-free facts about the machine: CPU model and the flags that bear on AMP speed.

On x86 CPUs the flags that give a half format arithmetic are AVX-512 BF16 / AMX-BF16 (bfloat16) and
AVX-512 FP16 / AMX-FP16 (float16); F16C only converts between float16 and float32. Flags say what the
CPU can compute, not which kernels a framework runs: the report words them so (harness/report/speed.py).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from amp_compare.contract.config import usable_cpus

# The CPU flags that give each half format its own arithmetic (the report's "this CPU has no float16 arithmetic").
ARITHMETIC_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}
AVX512_FOUNDATION = "avx512f"
# CPU flags that matter for mixed precision, and what each one means.
AMP_CPU_FLAGS = {
    "avx512_bf16": "AVX-512 BF16: bfloat16 dot products",
    "amx_bf16": "AMX BF16: bfloat16 matrix tiles",
    "avx512_fp16": "AVX-512 FP16: float16 arithmetic",
    "amx_fp16": "AMX FP16: float16 matrix tiles",
    AVX512_FOUNDATION: "AVX-512 foundation",
    "avx2": "AVX2",
    "fma": "fused multiply-add",
    "f16c": "F16C: float16<->float32 conversion only",
}
# Variables that keep the frameworks from instructions the CPU has (oneDNN, used by PyTorch and TensorFlow: its
# most capable ISA; PyTorch's own vectorised kernels: theirs): with one set, the flags above are not what ran.
ISA_LIMIT_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
# What each variable limits, and its values that leave out every AVX-512 instruction (bf16 dot products included)
ISA_LIMITED = {"ONEDNN_MAX_CPU_ISA": "oneDNN", "DNNL_MAX_CPU_ISA": "oneDNN",
               "ATEN_CPU_CAPABILITY": "PyTorch's own kernels"}
BELOW_AVX512 = {"ONEDNN_MAX_CPU_ISA": {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"},
                "DNNL_MAX_CPU_ISA": {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"},
                "ATEN_CPU_CAPABILITY": {"DEFAULT", "AVX2"}}
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def cpu_info(cpuinfo: str | None = None) -> dict[str, object]:
    """CPU model name and which AMP-relevant flags it has (Linux /proc/cpuinfo; else unknown)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor() or "unknown", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    present = [f for f in AMP_CPU_FLAGS if f in flags]
    limits = ", ".join(f"{v}={os.environ[v]}" for v in ISA_LIMIT_VARS if os.environ.get(v))
    return {
        "cpu_model": model,
        "cpu_amp_flags": ",".join(present),
        "cpu_bf16_hardware": any(f in flags for f in ARITHMETIC_FLAGS["bfloat16"]),
        "cpu_fp16_hardware": any(f in flags for f in ARITHMETIC_FLAGS["float16"]),
        **({"cpu_isa_limits": limits} if limits else {}),  # recorded only where set (the Environment table)
        "cpu_count": os.cpu_count() or 1,
        "cpus_usable": usable_cpus(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),  # --threads' default follows it where set
    }


def placement() -> dict[str, str]:
    """Where this process runs, as a cell's run record keeps it: the host, the GPUs it may see
    (CUDA_VISIBLE_DEVICES: --parallel pins each cell to its own, Slurm sets a job's) and the CPUs it may run on
    (--parallel on a CPU pins each cell to its own cores). Cells of one run may run on several hosts."""
    try:
        cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    except AttributeError:  # not on Linux
        cpus = ""
    return {"hostname": platform.node(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "cpu_affinity": cpus, "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")}


def proc_status(key: str, pid: int | str = "self") -> str | None:
    """One field of Linux's /proc/<pid>/status ("VmRSS" -> "1234 kB", "Umask" -> "0022"): the one reader of
    that file (contract/atomic.py's umask, kit/child.py's and kit/probe.py's memory). None where unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def proc_status_bytes(key: str, pid: int | str = "self") -> int:
    """A memory field of /proc/<pid>/status (VmRSS, VmHWM) in bytes; 0 where unreadable (the process has gone)."""
    value = proc_status(key, pid)
    try:
        return int(value.split()[0]) * 1024 if value else 0
    except (ValueError, IndexError):
        return 0


def git_sha(root: Path = PROJECT_ROOT) -> str:
    if not shutil.which("git"):
        return "unknown"
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        sha = out.stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def nvidia_gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible, without importing a framework."""
    if Path("/proc/driver/nvidia/gpus").exists() and any(Path("/proc/driver/nvidia/gpus").iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def gpu_total_bytes() -> int:
    """The first GPU's total memory from nvidia-smi (0 where there is none), without starting a framework."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(float(out.strip().splitlines()[0])) * 2**20  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0


LIBRARIES = ("torch", "tensorflow", "keras", "numpy", "pandas", "pyarrow", "matplotlib", "seaborn", "scikit-learn",
             "jinja2", "rich")


def library_versions() -> dict[str, str]:
    """Installed versions, read from package metadata (nothing is imported)."""
    from importlib import metadata

    out = {}
    for name in LIBRARIES:
        try:
            out[f"version_{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[f"version_{name}"] = "not installed"
    return out


def host_environment() -> dict[str, object]:
    """What the parent records once per compare run."""
    return {
        **cpu_info(),
        **library_versions(),
        "hostname": platform.node(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "git_sha": git_sha(),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
