"""Where the matrix's cells run: one after another, several at once on this machine, or on a Slurm cluster through
submitit. Every launcher runs each cell through runner.run_cell, in a child process of its own, which writes its
records atomically as on one machine; only where and when that happens changes.

* The default (cells_at_once): on a CPU without --threads, one cell per usable CPU at once, one thread each (the
  speed trials, which decide speed, time their rounds after them with no cell beside them, at --threads' default,
  having built and warmed up their models beside the last cells, each on a CPU a finished cell left: trials.Ahead); on a
  GPU, with --replicas or --threads, one after another.
* `--parallel 1`: the cells one after another, the calibration checked between them (cli.run_cells).
* `--parallel N` (local launcher): N cells at once. On a GPU each cell gets its own device(s) through
  CUDA_VISIBLE_DEVICES (an N-worker --replicas cell gets N of them), started as a process of its own; on a CPU each
  cell gets its own `--threads` cores, forked from its twin's pre-imported parent and pinned there before its
  framework starts a thread (os.sched_setaffinity; a cell that cannot be forked pins itself before its exec), so
  N x --threads may not exceed the usable CPUs, and the report says the cells shared the machine.
* `--launcher submitit`: one job per cell, submitted with submitit's `executor.batch()` (a Slurm job array where
  `srun` is found, submitit's local executor elsewhere), the run folder on the filesystem the nodes share. A job
  that fails, times out or is pre-empted becomes a failed cell with the scheduler's reason; Ctrl-C cancels the
  jobs submitted and not finished. `--replicas N` cells are one job with N GPUs, torchrun inside it.

Both concurrent launchers start cells in the interleaved order (harness/order.py) and hold back a cell whose
shared initial weights (runner.shared_init_path) are still being made by another cell of the same seed, so every
cell starts from the weights a sequential run gives it. Where each cell ran (host, GPUs, CPUs, job id) goes to
the manifest's `placements`; the child records its own host, CUDA_VISIBLE_DEVICES and CPU affinity in its run
record (contract/env.py placement), which the report uses to pair ratios on one GPU model only.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from amp_compare.contract.config import ConfigError, RunConfig, declared, option, usable_cpus
from amp_compare.harness.common import threads_text

LAUNCHERS = ("local", "submitit")
SLURM_OPTIONS = ("slurm_partition", "slurm_gpus_per_cell", "slurm_time", "slurm_account", "slurm_extra")
POLL_S = 0.2  # how often the parent looks at running cells / jobs (submitit's own watcher throttles sacct)


@dataclass
class LauncherOptions:
    """Where the cells run (harness/run/cli.py's compare_options reads these; none of them changes a cell's result,
    so --resume accepts them: a run started on one node may be finished on a cluster)."""

    parallel: int | None = option(None, "cells at once: on a GPU each on its own device (CUDA_VISIBLE_DEVICES); on a "
                                  "CPU each on its own --threads cores (N x --threads <= usable CPUs); with --launcher "
                                  "submitit the most jobs running at once (1: no limit)",
                                  default_text="on a CPU without --threads, one cell per usable CPU, one thread each "
                                  "(the speed trials still run with no cell beside them, at --threads' default); "
                                  "else 1",
                                  gt=0, le=4096, matrix=False)
    launcher: str = option("local", "local: child processes on this machine; submitit: one job per cell through "
                           "submitit (Slurm where srun is found, submitit's local executor elsewhere; pip install "
                           "'.[cluster]')", choices=LAUNCHERS, matrix=False)
    slurm_partition: str | None = option(None, "--launcher submitit: the Slurm partition", matrix=False)
    slurm_gpus_per_cell: int | None = option(None, "--launcher submitit: GPUs per job (default 1 on cuda, 0 on cpu; "
                                             "a --replicas N cell asks for N)", gt=0, le=1024, matrix=False)
    slurm_time: int | None = option(None, "--launcher submitit: the job's time limit in minutes",
                                    default_text="--timeout plus 10 minutes", gt=0, le=10**6, matrix=False)
    slurm_account: str | None = option(None, "--launcher submitit: the Slurm account", matrix=False)
    slurm_extra: tuple[str, ...] = option((), "--launcher submitit: more sbatch options as key=value (e.g. "
                                          "constraint=a100,qos=high; a value holding a comma goes in a --config "
                                          "file's list)", empty_ok=True, matrix=False, metavar="KEY=VALUE,...")


def launcher_options() -> dict:
    return declared(LauncherOptions)


def extra_parameters(items: tuple[str, ...]) -> dict[str, str]:
    """--slurm-extra's key=value items as sbatch options (ConfigError on an item without a key)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or key.strip().startswith("-"):
            raise ConfigError(f"--slurm-extra item {item!r} is not key=value (valid: sbatch options without their "
                              "dashes, e.g. constraint=a100,qos=high)")
        out[key.strip()] = value.strip()
    return out


def check_launcher(args) -> None:
    """What the declarations cannot check: submitit options without submitit, --parallel against the machine."""
    given = [f"--{n.replace('_', '-')}" for n in SLURM_OPTIONS if n in args.given]
    if given and args.launcher != "submitit":
        verb = "needs" if len(given) == 1 else "need"
        raise ConfigError(f"{', '.join(given)} {verb} --launcher submitit (got --launcher {args.launcher}; valid: "
                          f"{', '.join(LAUNCHERS)})")
    extra_parameters(args.slurm_extra)
    if args.launcher == "submitit":
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise ConfigError("--launcher submitit needs submitit (pip install -e '.[cluster]' installs it; valid "
                              "without it: --launcher local)") from None
        return
    if args.parallel in (None, 1):  # None: cells_at_once decides, once the matrix is known
        return
    if args.resolved_device == "cuda":
        gpus = len(visible_gpus())
        if args.parallel > gpus:
            raise ConfigError(f"--parallel {args.parallel} needs {args.parallel} GPUs, but {gpus} "
                              f"{'is' if gpus == 1 else 'are'} visible (valid: 1..{max(gpus, 1)})")
        return
    cpus = usable_cpus()
    if args.parallel * args.threads > cpus:
        raise ConfigError(f"--parallel {args.parallel} x --threads {args.threads} is more than the {cpus} CPUs this "
                          f"process may run on: each cell gets its own cores (valid: --parallel 1.."
                          f"{max(1, cpus // args.threads)} at --threads {args.threads})")


def visible_gpus() -> list[str]:
    """The GPUs a cell may be pinned to: CUDA_VISIBLE_DEVICES' entries where it is set, else nvidia-smi's indexes."""
    from amp_compare.harness.run.launch import visible_gpu_count

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = visible_gpu_count()
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1"][:count]
    return [str(i) for i in range(count)]


def cells_at_once(args, cells: list[RunConfig], previous: dict | None = None) -> list[RunConfig]:
    """--parallel's default (args.parallel None). On a CPU, with the local launcher, 1-worker cells and no --threads
    given: one cell per usable CPU (at most one per cell), each with one thread; the cells, which no longer decide
    speed, take half the time or less on two cores (the default compare on the 2-core AVX2-only EPYC: 243 s against
    320 s one after another at two threads), and the speed trials keep --threads' default, with no cell beside them
    (args.trial_threads; the manifest's launcher entry). A --resume (`previous`: the run's launcher entry) runs its
    cells as the run planned them: at once, up to the run's number, where the run's ran at once with one thread each
    and they still do. Elsewhere (a GPU, submitit, --replicas, --threads given, one cell) one at a time, as before.
    Returns the cells with the threads they run with."""
    args.trial_threads = getattr(args, "trial_threads", None) or args.threads
    if args.parallel is not None:
        return cells
    if getattr(args, "resume", None):
        ran_at_once = (previous or {}).get("launcher") == "local" and (previous or {}).get("parallel", 1) > 1
        local_cpu = args.launcher == "local" and args.resolved_device == "cpu"
        at_once = ran_at_once and local_cpu and cells and all(c.threads == 1 and c.replicas == 1 for c in cells)
        args.parallel = min(previous["parallel"], usable_cpus()) if at_once else 1
        return cells
    n = min(usable_cpus(), len(cells))
    if (n < 2 or args.launcher != "local" or args.resolved_device != "cpu" or "threads" in args.given
            or any(c.replicas > 1 or c.thread_floor for c in cells)):
        args.parallel = 1
        return cells
    args.parallel, args.threads = n, 1
    return [dataclasses.replace(c, threads=1) for c in cells]


def describe(args) -> dict:
    """The manifest's `launcher` entry: what was asked for (submitit's executor is added once it is made) and
    the speed trials' threads where they differ from the cells' (cells_at_once)."""
    out = {"launcher": args.launcher, "parallel": args.parallel}
    if getattr(args, "trial_threads", None) and args.trial_threads != args.threads:
        out["trial_threads"] = args.trial_threads
    if args.launcher == "submitit":
        out.update({n: getattr(args, n) for n in SLURM_OPTIONS})
        out["slurm_extra"] = list(args.slurm_extra)
    return out


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# ---- the placement of one cell on this machine ------------------------------------------------------------

@dataclass
class Placement:
    """Where a cell's child runs on this machine: its GPUs and CPUs; `cancel` stops it (Ctrl-C in the parent)."""

    gpus: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()
    cancel: threading.Event | None = None

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, "CUDA_VISIBLE_DEVICES": ",".join(self.gpus)} if self.gpus else env

    def command(self, cmd: list[str]) -> list[str]:
        """The child's command, pinned to its CPUs: the affinity is set before the exec, so every thread the
        framework starts (and torchrun's workers) inherits it; exec keeps the pid the runner stops."""
        if not self.cpus:
            return cmd
        pin = "import os,sys; os.sched_setaffinity(0, map(int, sys.argv[1].split(','))); os.execv(sys.argv[2], " \
              "sys.argv[2:])"
        return [sys.executable, "-S", "-c", pin, ",".join(map(str, self.cpus)), *cmd]

    def record(self) -> dict:
        return {"gpus": ",".join(self.gpus), "cpus": ",".join(map(str, self.cpus))}


def cell_needs(cfg: RunConfig) -> int:
    """Units a cell takes: GPUs on cuda (an N-worker cell: N), cores on a CPU (its --threads)."""
    return max(1, cfg.replicas) if cfg.device == "cuda" else max(1, cfg.threads)


class InitGate:
    """At most one cell of a shared-initial-weights file runs until that file exists: the first to run makes it
    (kit/child.py SharedInit), as in a sequential run; the others wait for it, then run in any order."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.making = Path(run_dir), set()

    def key(self, cfg: RunConfig) -> Path | None:
        from amp_compare.harness.run.runner import shared_init_path

        return shared_init_path(self.run_dir, cfg) if cfg.init == "shared" else None

    def may_start(self, cfg: RunConfig) -> bool:
        key = self.key(cfg)
        return key is None or key.exists() or key not in self.making

    def started(self, cfg: RunConfig) -> None:
        key = self.key(cfg)
        if key is not None and not key.exists():
            self.making.add(key)

    def ended(self, cfg: RunConfig) -> None:
        self.making.discard(self.key(cfg))


class CellBars:
    """The matrix bar and one bar per running cell (the sequential loop's look, several cells at once)."""

    def __init__(self, progress, total: int):
        self.progress, self.overall, self.tasks = progress, progress.add_task("matrix", total=total), {}

    def start(self, cfg: RunConfig, where: str | None = None) -> Callable[[dict], None]:
        task = self.progress.add_task(f"  {cfg.cell_id}" + (f" [{where}]" if where else ""), total=None)
        self.tasks[cfg.cell_id] = task

        def on_event(event: dict) -> None:
            if event.get("kind") == "step":
                self.progress.update(task, total=event["epochs"] * event["steps"],
                                     completed=event["epoch"] * event["steps"] + event["step"])
        return on_event

    def state(self, cfg: RunConfig, text: str) -> None:
        self.progress.update(self.tasks[cfg.cell_id], description=f"  {cfg.cell_id} [{text}]")

    def end(self, cfg: RunConfig, outcome) -> None:
        """A finished cell's bar goes (the matrix bar counts it: the terminal keeps the answer, not 24 full bars);
        one that did not finish stays, with why."""
        if outcome.status == "ok":
            self.progress.remove_task(self.tasks.pop(cfg.cell_id))
        else:
            self.state(cfg, f"{outcome.status.upper()}: {outcome.error}")
        self.progress.advance(self.overall)


# ---- several cells at once on this machine ---------------------------------------------------------------

def local_units(cells: list[RunConfig]) -> list:
    """What the local launcher hands out: the visible GPUs on cuda, the usable CPUs (in order) on a CPU."""
    if cells and cells[0].device == "cuda":
        return visible_gpus()
    return sorted(os.sched_getaffinity(0))


def run_parallel(cells: list[RunConfig], run_dir: Path, run_id: str, timeout: float, progress, parallel: int,
                 placements: dict, on_fault: Callable, ahead=None) -> tuple[list, BaseException | None]:
    """Up to `parallel` cells at once, each in its own child on its own units; returns the outcomes in the order
    cells ended and the interruption (Ctrl-C / SIGTERM), if any: then every running child is stopped. ahead
    (trials.Ahead): once no cell is left to start, a free CPU sets up the next speed trial; this returns when every
    cell has ended and every trial that could start is set up."""
    from amp_compare.harness.run.runner import prestart_fork_servers

    if cells and cells[0].device != "cuda":  # CPU cells fork from their twin's parent, pinned (runner.run_cell)
        try:
            prestart_fork_servers(cells, run_dir)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM, while the frameworks start: no cell ran
            return [], exc
    bars, gate, free = CellBars(progress, len(cells)), InitGate(run_dir), local_units(cells)
    rank = {unit: i for i, unit in enumerate(free)}  # units go back in their first order (GPU 0 first)
    waiting, running, outcomes = list(cells), {}, []
    ended: queue.Queue = queue.Queue()
    cancel = threading.Event()
    set_ups = TrialSetUps(ahead, progress, ended)
    try:
        while waiting or running or set_ups.units:
            for cfg in [c for c in waiting if gate.may_start(c)]:
                need = min(cell_needs(cfg), len(rank))  # a cell wanting more than there is gets everything
                if len(running) >= parallel or need > len(free):
                    break  # the next cell in the interleaved order waits for room: none skips ahead of it
                units, free = free[:need], free[need:]
                placement = (Placement(gpus=tuple(units), cancel=cancel) if cfg.device == "cuda"
                             else Placement(cpus=tuple(units), cancel=cancel))
                placements[cfg.cell_id] = {**placement.record(), "host": os.uname().nodename, "started": now()}
                gate.started(cfg)
                waiting.remove(cfg)
                on_event = bars.start(cfg, placement.record()["gpus"] or f"cpus {placement.record()['cpus']}")
                thread = threading.Thread(target=_cell_work, daemon=True,
                                          args=(cfg, run_dir, run_id, timeout, placement, on_event, on_fault, ended))
                running[cfg.cell_id] = (thread, units)
                thread.start()
            if not waiting:  # no cell left to start: a free core sets up a speed trial
                free = set_ups.start(free, len(rank) - len(running))
            try:
                cfg, outcome = ended.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if isinstance(cfg, str):  # a trial set up ahead is ready (or has ended): its core is free again
                free = sorted([*free, *set_ups.done(cfg)], key=rank.get)
                continue
            thread, units = running.pop(cfg.cell_id)
            free = sorted([*free, *units], key=rank.get)
            gate.ended(cfg)
            placements[cfg.cell_id]["ended"] = now()
            outcomes.append(outcome)
            bars.end(cfg, outcome)
            if not waiting and not running:
                set_ups.cells_done()
    except KeyboardInterrupt as exc:
        set_ups.stop()
        return _stop(running, cancel, ended, outcomes), exc
    return outcomes, None


def _cell_work(cfg: RunConfig, run_dir: Path, run_id: str, timeout: float, placement: Placement, on_event,
               on_fault: Callable, ended: queue.Queue) -> None:
    """One cell of run_parallel, in a thread of its own: its outcome goes to `ended`."""
    from amp_compare.harness.run.runner import run_cell

    try:
        outcome = run_cell(cfg, run_dir, run_id, timeout, on_event, placement=placement)
    except KeyboardInterrupt:  # stopped by `cancel`: its unfinished tables are gone, no record
        outcome = finished_outcome(cfg, run_dir)
    except Exception as exc:  # a harness fault in one cell: recorded, and the other cells run
        outcome = on_fault(cfg, run_dir, run_id, exc)
    ended.put((cfg, outcome))


class TrialSetUps:
    """The speed trials run_parallel sets up ahead (trials.Ahead; None: none) on units no cell will take again: the
    unit each holds, its progress line; each reports its end (ready, or its child ended) as (trial id, None) on
    `ended`, the queue the cells report on."""

    def __init__(self, ahead, progress, ended: queue.Queue) -> None:
        self.ahead, self.progress, self.ended = ahead, progress, ended
        self.units, self.bars = {}, {}

    def start(self, free: list, room: int) -> list:
        """Set up trials on free units while fewer than `room` are set up; the units left free."""
        while self.ahead is not None and free and len(self.units) < room:
            tid = self.ahead.start_next(free[0], lambda tid: self.ended.put((tid, None)))
            if tid is None:
                break
            self.units[tid], free = free[:1], free[1:]
            self.bars[tid] = self.progress.add_task(f"  speed trial {tid}: setting up", total=None)
        return free

    def done(self, tid: str) -> list:
        """A trial set up (or ended): the units it held. Its bar goes: the speed trials' own bars take over."""
        self.progress.remove_task(self.bars.pop(tid))
        return self.units.pop(tid)

    def cells_done(self) -> None:
        if self.ahead is not None:
            self.ahead.cells_ended = time.perf_counter()

    def stop(self) -> None:
        if self.ahead is not None:
            self.ahead.stop()


def finished_outcome(cfg: RunConfig, run_dir: Path):
    """The outcome of a cell stopped by Ctrl-C / SIGTERM after its child had written every record (it was still
    exiting): finished, as resume will see it (compare.cell_complete); None where it had not."""
    import pandas as pd

    from amp_compare.harness.run.compare import cell_complete
    from amp_compare.harness.run.runner import CellOutcome

    if not cell_complete(run_dir, cfg):
        return None
    run = pd.read_parquet(Path(run_dir) / "cells" / cfg.cell_id / "run.parquet", columns=["status", "error"])
    return CellOutcome(cfg.cell_id, str(run["status"].iloc[0]), str(run["error"].iloc[0]), 0.0)


def _stop(running: dict, cancel: threading.Event, ended: queue.Queue, outcomes: list) -> list:
    """Ctrl-C / SIGTERM in run_parallel: every running child is stopped by its own runner thread (runner._run_child);
    cells that finished before the signal, taken in or not yet, keep their outcomes."""
    cancel.set()
    for thread, _ in running.values():
        thread.join()
    while not ended.empty():
        _, outcome = ended.get()
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes


# ---- one job per cell through submitit -------------------------------------------------------------------

def cell_job(cfg: RunConfig, run_dir: str, run_id: str, timeout: float) -> dict:
    """What a submitit job runs on its node: the cell, in its own child, exactly as on one machine, and where
    it ran. The return value comes back to the parent through submitit's result pickle."""
    from amp_compare.harness.run.runner import run_cell

    started = now()
    outcome = run_cell(cfg, Path(run_dir), run_id, timeout, fork=False)  # one cell per job: nothing to share
    return {"outcome": dataclasses.asdict(outcome), "host": os.uname().nodename, "started": started, "ended": now(),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
            "slurm_node": os.environ.get("SLURMD_NODENAME", "")}


def job_gpus(cfg: RunConfig, settings) -> int:
    """GPUs one cell's job asks for: --slurm-gpus-per-cell (default 1 on cuda, 0 on a CPU), at least the
    cell's --replicas on cuda (torchrun inside the job starts one worker per GPU)."""
    if cfg.device != "cuda":
        return settings.slurm_gpus_per_cell or 0
    return max(settings.slurm_gpus_per_cell or 1, cfg.replicas)


def make_executor(folder: Path, settings, timeout: float, cluster: str | None = None):
    """submitit's AutoExecutor with the run's job parameters (Slurm where srun is found, else its local executor);
    per-batch parameters (GPUs, CPUs) are set in submit_batch."""
    import submitit

    executor = submitit.AutoExecutor(folder=str(folder / "%j"), cluster=cluster)
    minutes = settings.slurm_time or math.ceil(timeout / 60) + 10  # the cell's own timeout fires first
    params = {"timeout_min": minutes, "tasks_per_node": 1, "nodes": 1, "name": "amp-compare"}
    if executor.cluster == "slurm":
        params.update(slurm_partition=settings.slurm_partition, slurm_account=settings.slurm_account,
                      slurm_additional_parameters=extra_parameters(settings.slurm_extra) or None,
                      slurm_array_parallelism=settings.parallel if settings.parallel > 1 else 256)
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


def submit_batch(executor, cells: list[RunConfig], run_dir: Path, run_id: str, timeout: float, settings) -> list:
    """One job per cell, submitted together (`executor.batch()`: one Slurm job array per GPU count)."""
    jobs = []
    by_gpus: dict[int, list[RunConfig]] = {}
    for cfg in cells:
        by_gpus.setdefault(job_gpus(cfg, settings), []).append(cfg)
    for gpus, group in by_gpus.items():
        executor.update_parameters(gpus_per_node=gpus, cpus_per_task=max(c.threads for c in group))
        with executor.batch():
            batch = [executor.submit(cell_job, cfg, str(run_dir), run_id, timeout) for cfg in group]
        jobs += list(zip(batch, group))
    return jobs


def job_outcome(job, cfg: RunConfig, run_dir: Path, run_id: str, placements: dict):
    """A finished job's cell outcome: the cell's own when the job returned, else a failed cell with the
    scheduler's reason (timed out, pre-empted, cancelled, killed, failed), its partial tables dropped."""
    from amp_compare.harness.run.runner import CellOutcome, failed_run_table, remove_partial, write_failed_record

    try:
        result = job.result()
    except Exception as exc:  # submitit's FailedJobError / UncompletedJobError: the job itself ended badly
        message = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        error = f"{job_label(job)} ended {job.state}: {message}"
        cell_dir = run_dir / "cells" / cfg.cell_id
        remove_partial(cell_dir)
        tail = "\n".join((job.stderr() or "").rstrip().splitlines()[-25:])
        write_failed_record(cell_dir, failed_run_table(cfg, run_id, error, tail))
        placements[cfg.cell_id].update(state=job.state, ended=now())
        return CellOutcome(cfg.cell_id, "failed", error, 0.0)
    placements[cfg.cell_id].update({k: v for k, v in result.items() if k != "outcome"}, state=job.state)
    return CellOutcome(**result["outcome"])


def job_label(job) -> str:
    return f"{type(job).__name__.removesuffix('Job').lower() or 'submitit'} job {job.job_id}"


def run_submitit(cells: list[RunConfig], run_dir: Path, run_id: str, timeout: float, progress, settings,
                 placements: dict, launcher: dict) -> tuple[list, BaseException | None]:
    """Every cell as a submitit job; waits with the progress bar. Ctrl-C (or SIGTERM) cancels every job submitted
    and not finished (scancel on Slurm) and drops their unfinished tables."""
    executor = make_executor(run_dir / "submitit", settings, timeout)
    launcher["executor"] = executor.cluster
    bars, gate, waiting, running, outcomes = CellBars(progress, len(cells)), InitGate(run_dir), list(cells), {}, []
    try:
        while waiting or running:
            ready = []
            for cfg in waiting:  # in order: the first cell of a seed makes its shared weights, the others wait
                if gate.may_start(cfg):
                    gate.started(cfg)
                    ready.append(cfg)
            if ready:
                for job, cfg in submit_batch(executor, ready, run_dir, run_id, timeout, settings):
                    waiting.remove(cfg)
                    running[cfg.cell_id] = (job, cfg)
                    placements[cfg.cell_id] = {"job_id": str(job.job_id), "submitted": now()}
                    bars.start(cfg, f"{job_label(job)} submitted")
            for cell_id, (job, cfg) in list(running.items()):
                if not job.done():
                    bars.state(cfg, f"{job_label(job)} {job.state}")
                    continue
                del running[cell_id]
                gate.ended(cfg)
                outcome = job_outcome(job, cfg, run_dir, run_id, placements)
                outcomes.append(outcome)
                bars.end(cfg, outcome)
            time.sleep(POLL_S)
    except KeyboardInterrupt as exc:
        cancel_jobs(running.values(), run_dir)
        return outcomes, exc
    return outcomes, None


def cancel_jobs(running, run_dir: Path) -> None:
    """Cancel the jobs submitted and not finished; a cell without its run record keeps no partial table."""
    from amp_compare.harness.run.runner import remove_partial

    running = list(running)
    for job, _ in running:
        job.cancel(check=False)
    for job, cfg in running:
        for _ in range(50):  # the local executor's job stops its child within a second or two; Slurm's scancel
            if job.done():  # kills the job's whole cgroup
                break
            time.sleep(POLL_S)
        if not (run_dir / "cells" / cfg.cell_id / "run.parquet").exists():
            remove_partial(run_dir / "cells" / cfg.cell_id)



# ---- the entry point run_cells calls -----------------------------------------------------------------------

def concurrent(launcher: dict) -> bool:
    """Whether the manifest's launcher runs cells otherwise than one after another in this process's children."""
    return launcher.get("launcher") == "submitit" or launcher.get("parallel", 1) > 1


def settings_of(launcher: dict):
    """The launcher options back from the manifest's `launcher` entry (describe's dict)."""
    defaults = {n: d.default for n, d in launcher_options().items()}
    values = {**defaults, **{k: v for k, v in launcher.items() if k in defaults}}
    values["slurm_extra"] = tuple(values["slurm_extra"] or ())
    return LauncherOptions(**values)


def launch(cells: list[RunConfig], run_dir: Path, run_id: str, timeout: float, progress, manifest: dict,
           on_fault: Callable, ahead=None) -> tuple[list, BaseException | None]:
    """Run the cells with the manifest's launcher; where each ran lands in manifest["placements"], and a note
    in the report says the cells shared the machine or ran as jobs. No calibration check runs between cells:
    the parent's matmul would time the machine while other cells load it."""
    settings, placements = settings_of(manifest["launcher"]), manifest.setdefault("placements", {})
    notes = manifest.setdefault("notes", [])
    if settings.launcher == "submitit":
        outcomes, interrupted = run_submitit(cells, run_dir, run_id, timeout, progress, settings, placements,
                                             manifest["launcher"])
        note = (f"The cells ran as submitit jobs ({manifest['launcher'].get('executor')} executor), one job per "
                "cell; each cell's host and GPUs are in its run record and in the manifest's placements.")
    else:
        outcomes, interrupted = run_parallel(cells, run_dir, run_id, timeout, progress, settings.parallel,
                                             placements, on_fault, ahead)
        note = (f"Up to {settings.parallel} cells ran at once on this machine, each pinned to its own "
                + ("GPU (CUDA_VISIBLE_DEVICES)." if cells and cells[0].device == "cuda" else
                   f"CPUs (CPU affinity), {threads_text(c.threads for c in cells)} each, sharing the machine's memory "
                   "and caches: "
                   "their times are what training took beside other cells, not alone"
                   + (f"; the speed trials timed their rounds after them, with no cell beside them, "
                      f"{threads_text([trials])} (each trial's models were built and warmed up before that, on a "
                      "CPU that a finished cell had left once no cell was waiting to start)."
                      if (trials := manifest["launcher"].get("trial_threads")) else ".")))
    if note not in notes:
        notes.append(note)
    return outcomes, interrupted
