"""Data-parallel cells on the parent's side: the matrix they add, how each is launched, how it is stopped.

`--replicas N` (contract/config.py, RunConfig.replicas) with N > 1 adds, for every cell of the matrix, the cells a
reader needs to judge an N-worker run beside the 1-worker one (`expand_replicas`):
  * the 1-worker cell itself (the baseline: throughput and per-step losses compared against it);
  * the same 1-worker cell at another thread count (`thread_floor`): the framework's own run-to-run floor, which
    the N-vs-1 loss gap is judged against;
  * one N-worker cell per `--allreduce` precision (fp32, fp16, bf16), at the same global batch.
The harness still sees each of them as one cell: one record, one timeout, one progress line.

How an N-worker cell runs (`launch_command`, `child_env_for`):
  * torch: `python -m torch.distributed.run --standalone --nproc-per-node N -m amp_compare.torch_impl ...`, one
    process per worker (torch_impl/distributed.py: DistributedDataParallel, gloo on a CPU, NCCL on CUDA);
  * Keras on TensorFlow / JAX: the same single child process, which builds its MirroredStrategy / DataParallel
    over N devices (keras_impl/distributed.py); on a CPU JAX gets N host devices from XLA_FLAGS, set here before
    it starts, and TensorFlow N logical CPU devices, set by the child.
torchrun starts every worker in a session of its own, so killing torchrun's process group leaves them running:
`kill_tree` stops the whole tree of a cell (the runner's kill_group calls it), and each worker also asks the kernel
to kill it when torchrun dies (torch_impl/distributed.py). This module never imports a framework.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from amp_compare.contract.config import ALLREDUCE_REFERENCE, ConfigError, RunConfig

ENV_DUMP = "AMP_COMPARE_HLO_DUMP"  # where a keras-jax N-worker child finds XLA's dump of its compiled step


def floor_threads(cfg: RunConfig) -> int:
    """The floor cell's thread count: another one than the cell's (1 -> 2, otherwise 1). JAX sizes XLA's CPU pool
    itself (--threads does not reach it): its floor cell runs XLA single-threaded (`child_env_for`) against the
    1-worker cell's default pool."""
    return 1 if cfg.framework == "keras-jax" or cfg.threads > 1 else 2


def visible_gpu_count() -> int:
    """NVIDIA GPUs this process may use, without importing a framework: nvidia-smi's list, narrowed by
    CUDA_VISIBLE_DEVICES where it is set."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    count = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return count


def expand_replicas(cells: list[RunConfig], allreduce: tuple[str, ...], device: str) -> list[RunConfig]:
    """The matrix with --replicas and --allreduce applied (cli.plan_compare calls this; bad input: ConfigError).

    Every cell carries the requested N in `replicas`; with N > 1 each becomes the 1-worker baseline, its
    thread-count floor and one N-worker cell per all-reduce precision."""
    if not cells:
        return cells
    n = cells[0].replicas
    if n == 1:
        if tuple(allreduce) != (ALLREDUCE_REFERENCE,):
            raise ConfigError(f"--allreduce {','.join(allreduce)} needs --replicas 2 or more (the all-reduce of a "
                              f"data-parallel run; valid with --replicas 1: {ALLREDUCE_REFERENCE})")
        return cells
    if device == "cuda":
        gpus = visible_gpu_count()
        if n > gpus:
            raise ConfigError(f"--replicas {n} needs {n} GPUs on --device cuda, but {gpus} "
                              f"{'is' if gpus == 1 else 'are'} visible (valid: 1..{max(gpus, 1)})")
    out = []
    for cfg in cells:
        if cfg.batch_size % n:
            raise ConfigError(f"batch size {cfg.batch_size} does not split into --replicas {n} equal parts (each "
                              f"worker takes batch/{n} of the global batch; valid: a multiple of {n})")
        base = dataclasses.replace(cfg, replicas=1, allreduce=ALLREDUCE_REFERENCE)
        out.append(base)
        out.append(dataclasses.replace(base, threads=floor_threads(cfg), thread_floor=True))
        out += [dataclasses.replace(cfg, allreduce=a) for a in allreduce]
    return out


def launch_command(cfg: RunConfig, cmd: list[str]) -> list[str]:
    """The command that runs a cell: torch's N-worker cells under torchrun (`cmd` is the 1-worker child's
    `python -m <module> args...`), everything else as it is."""
    if cfg.replicas == 1 or cfg.framework != "torch":
        return cmd
    module, args = cmd[2], cmd[3:]
    # --standalone: a rendezvous on this machine on a free port (several cells or suites may run at once);
    # torchrun's own default of OMP_NUM_THREADS=1 per worker is replaced by the cell's thread share
    # (torch_impl/distributed.py sets it from the cell's --threads).
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(cfg.replicas),
            "--max-restarts", "0", "-m", module, *args]


def child_env_for(cfg: RunConfig, env: dict[str, str], cell_dir: Path) -> dict[str, str]:
    """What an N-worker cell's child needs in its environment before its framework starts."""
    if cfg.framework == "keras-jax" and cfg.thread_floor:  # XLA's CPU work on one thread (the JAX FAQ's flags)
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "multi_thread_eigen" not in f
                 and "intra_op_parallelism_threads" not in f]
        return {**env, "XLA_FLAGS": " ".join([*flags, "--xla_cpu_multi_thread_eigen=false",
                                               "intra_op_parallelism_threads=1"])}
    if cfg.replicas == 1:
        return env
    env = dict(env)
    if cfg.framework == "keras-jax":
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(("--xla_force_host_platform_device",
                                                                                    "--xla_dump_to"))]
        if cfg.device == "cpu":
            flags.append(f"--xla_force_host_platform_device_count={cfg.replicas}")
        # XLA writes the optimised HLO of the training step here; the child reads the all-reduce's element type
        # back from it (what ran, not what was asked for) and removes the folder.
        dump = Path(cell_dir) / "hlo"
        flags += [f"--xla_dump_to={dump}", "--xla_dump_hlo_module_re=.*train_step.*"]
        env["XLA_FLAGS"] = " ".join(flags)
        env[ENV_DUMP] = str(dump)
    if cfg.framework == "torch":
        env.pop("OMP_NUM_THREADS", None)  # torch_impl/distributed.py sets each worker's share of --threads
    return env


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a cell's whole tree: the child's process group and every descendant's own group (torchrun puts each
    worker in a session of its own). Stopped first, so none can start another process in between."""
    procs = descendants(pid)
    for p in [pid, *procs]:
        try:
            os.kill(p, signal.SIGSTOP)
        except (ProcessLookupError, PermissionError):
            pass
    procs = list(dict.fromkeys(procs + descendants(pid)))  # any started before the stop landed
    for target in [pid, *procs]:
        for kill in (os.killpg, os.kill):
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
