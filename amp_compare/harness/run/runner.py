"""Runs one cell in its own child process and turns any outcome into a record.

Each framework trains in a fresh `python -m torch_impl|keras_impl` process: TensorFlow grabs GPU
memory and never gives it back, peak memory is only honest per process, and a crash in one
framework must not take the harness down. The child streams progress lines on stdout; its
stderr goes to `cells/<cell-id>/stderr.log`. A child that crashes, is killed or passes its
timeout is recorded as a failed cell with the reason and the tail of its stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from amp_compare.contract import records
from amp_compare.contract.atomic import atomic_write_text
from amp_compare.contract.config import (
    FRAMEWORK_EXTRAS,
    FRAMEWORK_LIBRARIES,
    FRAMEWORK_MODULES,
    KERAS_BACKENDS,
    RunConfig,
)
from amp_compare.contract.env import PROJECT_ROOT
from amp_compare.contract.log_words import HALF_WORDS, PATH_WORDS
from amp_compare.contract.precision import REFERENCE
from amp_compare.harness.run import forkserver
from amp_compare.harness.run.launch import child_env_for, kill_tree, launch_command
from amp_compare.kit.child import EXIT_UNAVAILABLE, PROGRESS_PREFIX
from amp_compare.kit.phases import SPAWNED_AT_ENV
from amp_compare.kit.profile import profile_env

STDERR_TAIL_LINES = 25


@dataclass
class CellOutcome:
    cell_id: str
    status: str  # "ok" or "failed"
    error: str
    wall_s: float


def stderr_tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# A framework's own log line about the half-precision path it took (contract/log_words.py): a line must name a half
# format and a fallback or a support limit.
_LOG_PREFIX = re.compile(r"^(?:\d{4}-\d\d-\d\d [\d:.]+: [IWEF] |[IWEF]\d{4} [\d:.]+\s+\d+ )\S+:\d+\] ")


def framework_notices(path: Path, limit: int = 5) -> str:
    """The distinct log lines of a cell's stderr about its half-precision path (prefixes of TF's logger cut),
    newline-separated; "" when there are none."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    found = [_LOG_PREFIX.sub("", ln).strip() for ln in lines
             if any(w in ln for w in HALF_WORDS) and any(w in ln for w in PATH_WORDS)]
    return "\n".join(list(dict.fromkeys(found))[:limit])


def failed_run_table(cfg: RunConfig, run_id: str, error: str, tail: str, status: str = "failed") -> pd.DataFrame:
    """The one-row run record of a cell that produced no result ("failed" or "unavailable")."""
    identity = {"run_id": run_id, "cell_id": cfg.cell_id, "framework": cfg.framework, "model": cfg.model,
                "dataset": cfg.dataset, "precision": cfg.precision, "seed": cfg.seed}
    row = {**identity, "schema_version": records.SCHEMA_VERSION, "status": status, "error": error,
           "stderr_tail": tail, **{f"cfg_{k}": v for k, v in cfg.to_dict().items() if k not in identity}}
    return pd.DataFrame([row])


def write_failed_record(cell_dir: Path, run: pd.DataFrame) -> None:
    """Write a failed cell's one-row run record, whatever its values: a value Parquet cannot store
    (an integer past int64, an odd object) is written as text rather than crash the harness."""
    try:
        records.write_cell(cell_dir, {"run": run})
        return
    except (OverflowError, ValueError, TypeError, ArithmeticError) as exc:  # pyarrow's errors derive from these
        note = f" [record stored as text: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}]"
    text = run.copy()
    for col in text.columns:
        if col not in ("schema_version",):
            text[col] = text[col].map(lambda v: v if v is None or isinstance(v, str) else str(v))
    text["error"] = text["error"].astype(str) + note
    records.write_cell(cell_dir, {"run": text})


def shared_init_path(run_dir: Path, cfg: RunConfig) -> Path:
    """Cells that must start from the same weights share this file (precision and framework vary)."""
    return Path(run_dir) / "init" / f"{cfg.model}-w{cfg.width}-{cfg.dataset}-s{cfg.seed}.npz"


def child_env(cfg: RunConfig | None = None) -> dict[str, str]:
    """The child's environment. For a Keras cell, KERAS_BACKEND (read once, when Keras is imported) names the
    cell's backend, and the device the cell asked for is the one the backend picks (JAX and Keras' torch
    backend would otherwise take a visible GPU for a --device cpu cell)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The child imports amp_compare (contract, kit and its framework package) from the project root.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    if cfg is not None and cfg.framework in KERAS_BACKENDS:
        env["KERAS_BACKEND"] = KERAS_BACKENDS[cfg.framework]
        if cfg.framework == "keras-jax" and cfg.device == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
        if cfg.framework == "keras-torch":
            env["KERAS_TORCH_DEVICE"] = "cuda" if cfg.device == "cuda" else "cpu"
    return env


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def framework_missing(framework: str) -> str | None:
    """Why a framework cannot run here, found without importing it (None: it is installed)."""
    install = f"pip install -e '.[{FRAMEWORK_EXTRAS[framework]}]' installs it"
    libraries = FRAMEWORK_LIBRARIES[framework]
    for library in (libraries,) if isinstance(libraries, str) else libraries:
        try:
            found = importlib.util.find_spec(library) is not None
        except (ImportError, ValueError) as exc:
            return f"{library} cannot be found ({exc})"
        if not found:
            return f"{library} is not installed ({install})"
    return None


def remove_partial(cell_dir: Path) -> None:
    """A cell without its run.parquet never finished: drop whatever tables it left."""
    for name in (*records.TABLES, *records.OPTIONAL_TABLES):
        (cell_dir / f"{name}.parquet").unlink(missing_ok=True)


# What a cell must share with an fp32 cell for that cell's median step to be its speed reference (the seed need not:
# precisions rotate per seed, so a seed's fp32 cell may run after its mixed cells)
REFERENCE_KEYS = ("framework", "model", "dataset", "width", "batch_size", "step", "replicas", "threads", "device",
                  "compile", "channels_last", "vit_dim", "vit_depth", "vit_heads", "vit_patch", "attention")


def speed_reference(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """The cell with speed_reference_step_s set: the median step of a finished fp32 cell of this run like it
    (REFERENCE_KEYS; the same seed preferred), which the speed budget weighs its own steps against
    (kit/training.py SpeedBudget). Unchanged for an fp32 cell, without the budget, or where none finished yet."""
    if not cfg.speed_budget or cfg.precision == REFERENCE:
        return cfg
    found = []
    for path in (run_dir / "cells").glob("*/config.json"):
        run_path = path.with_name("run.parquet")
        try:
            other = RunConfig.from_json(path.read_text())
            if other.precision != REFERENCE or not run_path.exists() or \
                    any(getattr(other, k) != getattr(cfg, k) for k in REFERENCE_KEYS):
                continue
            median = float(pd.read_parquet(run_path, columns=["median_step_s"])["median_step_s"].iloc[0])
        except Exception:  # noqa: BLE001 - an unreadable or failed cell is no reference
            continue
        if median > 0:
            found.append((other.seed != cfg.seed, median))
    return dataclasses.replace(cfg, speed_reference_step_s=min(found)[1]) if found else cfg


def run_cell(cfg: RunConfig, run_dir: Path, run_id: str, timeout_s: float,
             on_event: Callable[[dict], None] = lambda event: None, placement=None, fork: bool = True) -> CellOutcome:
    """Train one cell in a child process; always leaves a run record behind. `placement` (harness/run/launchers.py,
    --parallel): the GPUs / CPUs the child is pinned to and the event that stops it. `fork`: the child may be
    forked from its twin's pre-imported parent (harness/run/forkserver.py; not with a GPU placement, whose
    CUDA_VISIBLE_DEVICES a framework reads when it is imported)."""
    fork = fork and (placement is None or not placement.gpus)
    cell_dir = Path(run_dir) / "cells" / cfg.cell_id
    cell_dir.mkdir(parents=True, exist_ok=True)
    remove_partial(cell_dir)  # a resumed cell starts clean
    config_path = cell_dir / "config.json"
    cfg = speed_reference(cfg, Path(run_dir))
    atomic_write_text(config_path, cfg.to_json())
    missing = framework_missing(cfg.framework)
    if missing:
        write_failed_record(cell_dir, failed_run_table(cfg, run_id, missing, "", status="unavailable"))
        return CellOutcome(cfg.cell_id, "unavailable", missing, 0.0)
    cmd = [sys.executable, "-m", FRAMEWORK_MODULES[cfg.framework], "--config", str(config_path),
           "--out", str(cell_dir), "--run-id", run_id]
    if cfg.init == "shared":
        cmd += ["--init-file", str(shared_init_path(run_dir, cfg))]
    cmd += ["--cache-dir", str(Path(run_dir) / "cache")]  # work reused across seeds (kit/reuse.py)
    cmd = launch_command(cfg, cmd)  # DATA PARALLEL: torch's N-worker cells under torchrun (harness/run/launch.py)
    env = cell_env(cfg, cell_dir)
    if fork:  # its twin's pre-imported parent starts before the cell's clock (its own phase)
        forkserver.server_for(cmd, env, child_env(cfg))
    start = time.monotonic()
    returncode, error = _run_child(cmd, cfg, cell_dir, env, timeout_s, on_event, placement, fork)
    return _outcome(cfg, run_id, cell_dir, returncode, error, time.monotonic() - start)


def prestart_fork_servers(cells: list[RunConfig], run_dir: Path) -> None:
    """Start at once the pre-imported parents these cells (one after another, or at once on a CPU's cores) will be
    forked from (forkserver.prestart): the commands and environments run_cell gives them."""
    wanted = []
    for cfg in cells:
        if not framework_missing(cfg.framework):
            cmd = launch_command(cfg, [sys.executable, "-m", FRAMEWORK_MODULES[cfg.framework]])
            wanted.append((cmd, cell_env(cfg, Path(run_dir) / "cells" / cfg.cell_id), child_env(cfg)))
    forkserver.prestart(wanted)


def cell_env(cfg: RunConfig, cell_dir: Path) -> dict[str, str]:
    """The child's environment: child_env and what the cell adds (DATA PARALLEL's flags, --profile's trace)."""
    return profile_env(cfg, child_env_for(cfg, child_env(cfg), cell_dir), cell_dir)


def _run_child(cmd: list[str], cfg: RunConfig, cell_dir: Path, env: dict[str, str], timeout_s: float,
               on_event: Callable[[dict], None], placement=None, fork: bool = False) -> tuple[int, str]:
    """Start the child (`env`: cell_env's), stream its progress lines to on_event, kill it at the timeout. Returns
    its exit code and the harness's error ("" unless it timed out); Ctrl-C (or the placement's cancel event, set by
    the parent of cells running at once) stops it and drops its unfinished tables."""
    start, proc, error = time.monotonic(), None, ""
    own_cmd, cpus = cmd, ()  # what a child started on its own runs; the cores a forked child pins itself to
    if placement is not None:
        own_cmd, env, cpus = placement.command(cmd), placement.env(env), placement.cpus
    cancel = placement.cancel if placement is not None else None
    with open(cell_dir / "stderr.log", "wb") as err:
        try:
            with signals_deferred():  # a Ctrl-C/SIGTERM inside Popen would leave its child running, unkillable
                env = {**env, SPAWNED_AT_ENV: repr(time.time())}  # the child's "process start" phase begins here
                if fork:  # forked from its twin's pre-imported parent where it can be
                    proc = forkserver.child_for(cmd, env, child_env(cfg), err, cpus)
                if proc is None:
                    proc = subprocess.Popen(own_cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                            env=env, cwd=PROJECT_ROOT, start_new_session=True)
            lines: queue.Queue = queue.Queue()
            # its lines, then None at the end of its output (it has exited, or is exiting): from then on the loop
            # looks for its exit code every few milliseconds instead of every 0.1 s (a cell's end is not late)
            reader = threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put(None)], daemon=True)
            reader.start()
            ended = False
            while True:
                try:
                    line = lines.get(timeout=0.005 if ended else 0.1)
                    ended = ended or line is None
                    line = "" if line is None else line.decode(errors="replace")
                    if line.startswith(PROGRESS_PREFIX):
                        on_event(json.loads(line[len(PROGRESS_PREFIX):]))
                except (queue.Empty, json.JSONDecodeError):
                    pass
                if ended and proc.poll() is not None and lines.empty():
                    break
                if cancel is not None and cancel.is_set() and proc.poll() is None:  # one that has ended keeps
                    raise KeyboardInterrupt  # its outcome: it finished before the stop
                if time.monotonic() - start > timeout_s:
                    kill_group(proc)
                    error = f"timed out after {timeout_s:g} s"
                    break
        except BaseException:  # Ctrl-C: stop the child, drop its unfinished tables, go up
            if proc is not None:
                kill_group(proc)
            if not (cell_dir / "run.parquet").exists():
                remove_partial(cell_dir)
            raise
        proc.wait()
    return proc.returncode, error


def _outcome(cfg: RunConfig, run_id: str, cell_dir: Path, returncode: int, error: str, wall: float) -> CellOutcome:
    """The cell's outcome from how its child ended; a failed cell keeps only its (failed) run row."""
    tail = stderr_tail(cell_dir / "stderr.log")
    status = "failed"
    if not error and returncode == EXIT_UNAVAILABLE:
        status = "unavailable"
        error = next((ln for ln in reversed(tail.splitlines()) if ln.startswith("unavailable:")), "unavailable")
    if not error and returncode != 0:
        error = _describe_exit(returncode)
    if not error and not (cell_dir / "run.parquet").exists():
        error = "exited without writing its records"
    if error:
        # The child may have died after writing some tables: a failed cell keeps only its run row.
        remove_partial(cell_dir)
        write_failed_record(cell_dir, failed_run_table(cfg, run_id, error, tail, status=status))
        return CellOutcome(cfg.cell_id, status, error, wall)
    try:
        run = pd.read_parquet(cell_dir / "run.parquet")
    except Exception as exc:  # the child's own record is unreadable: a failed cell, not a harness crash
        error = f"its run record is unreadable ({type(exc).__name__}: {exc})"
        remove_partial(cell_dir)
        write_failed_record(cell_dir, failed_run_table(cfg, run_id, error, tail))
        return CellOutcome(cfg.cell_id, "failed", error, wall)
    notices = framework_notices(cell_dir / "stderr.log")
    if notices:  # the run record keeps them: a report is rendered from records, not from logs
        records.atomic_write_table(cell_dir / "run.parquet", run.assign(framework_notices=notices))
    return CellOutcome(cfg.cell_id, str(run["status"].iloc[0]), str(run["error"].iloc[0]), wall)


@contextlib.contextmanager
def signals_deferred(signals=(signal.SIGINT, signal.SIGTERM)):
    """Hold Ctrl-C and SIGTERM while the body runs (starting a child: Popen returns the handle that stops it),
    then act on the first that came with the handler that was in place. Only the main thread can set
    handlers; elsewhere the body runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, left as it is
                signal.signal(sig, handler)
        if pending and callable(previous[pending[0]]):
            previous[pending[0]](pending[0], None)  # raises KeyboardInterrupt / Terminated where those are set
        elif pending and previous[pending[0]] == signal.SIG_DFL:
            signal.raise_signal(pending[0])


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's whole process group (TF and torch start helper threads/processes) and, DATA PARALLEL, every
    process below it: torchrun starts each worker in a session of its own (harness/run/launch.py kill_tree)."""
    if proc.poll() is None:
        kill_tree(proc.pid)
    proc.wait()
