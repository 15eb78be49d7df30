"""Runs a compare's speed trials (kit/trial.py) after its cells: one child per trial, forked from its twin's
pre-imported parent as a cell is (harness/run/forkserver.py), alone on the machine, each trial's blocks written to
trials/<trial-id>/trials.parquet, a failed or timed-out trial to trials/<trial-id>/failed.json. A finished trial is
not rerun by --resume; the manifest's `trials` entry says which ran and how each ended.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from amp_compare.contract import fp8
from amp_compare.contract.atomic import atomic_write_text
from amp_compare.contract.config import FRAMEWORK_MODULES, RunConfig
from amp_compare.contract.precision import REFERENCE
from amp_compare.harness.run import forkserver
from amp_compare.harness.run.runner import (
    _describe_exit,
    _run_child,
    child_env,
    framework_missing,
    shared_init_path,
    stderr_tail,
)
from amp_compare.kit.child import EXIT_UNAVAILABLE
from amp_compare.kit.trial import GO, trial_id

# A trial's own timeout: its budget and the start of three models (framework import is the parent's), with room for
# a loaded machine; never longer than a cell's --timeout
TIMEOUT_MARGIN_S, TIMEOUT_FACTOR = 120.0, 6.0


def timed(cfg: RunConfig) -> bool:
    """Whether a trial times this configuration: not an fp8 mode off a GPU (an emulation's time is not fp8's: no
    report gives it a speed) nor one its framework has no recipe for (its cells are unavailable: timing it would
    fail the whole trial, its other precisions with it)."""
    return not fp8.is_fp8(cfg.precision) or (cfg.device == "cuda" and fp8.unavailable_reason(
        cfg.framework, cfg.precision, cfg.replicas) is None)


def plan_trials(configs: list[RunConfig]) -> dict[str, list[RunConfig]]:
    """The run's trials: per trial_id (framework, model, dataset, batch size, step loop) with fp32 and at least one
    other precision among 1-worker cells (timed), the configurations of its first seed (fp32 first, then the matrix's
    order). None where the run's trial budget is 0."""
    configs = [c for c in configs if timed(c)]
    groups: dict[str, dict[str, RunConfig]] = {}
    for cfg in configs:
        if cfg.replicas > 1 or cfg.thread_floor or cfg.trial_budget_s <= 0:
            continue
        chosen = groups.setdefault(trial_id(cfg), {})
        if cfg.precision not in chosen or cfg.seed < chosen[cfg.precision].seed:
            chosen[cfg.precision] = cfg
    plan = {}
    for tid, chosen in groups.items():
        if REFERENCE in chosen and len(chosen) > 1:
            seed = chosen[REFERENCE].seed  # one seed's shared initial weights for every precision
            same = [c for c in configs if trial_id(c) == tid and c.seed == seed and c.replicas == 1
                    and not c.thread_floor and c.precision != REFERENCE]
            plan[tid] = [chosen[REFERENCE], *{c.precision: c for c in same}.values()]
    return plan


def trial_complete(run_dir: Path, tid: str) -> bool:
    path = Path(run_dir) / "trials" / tid / "trials.parquet"
    try:
        return len(pd.read_parquet(path, columns=["round"])) > 0
    except Exception:  # noqa: BLE001 - missing or unreadable: not finished
        return False


def run_trial(cfgs: list[RunConfig], run_dir: Path, run_id: str, timeout_s: float, on_event=lambda event: None,
              placement=None, hold_s: float = 0.0) -> dict:
    """One trial in a child of its own (forked where its twin's parent runs); returns its manifest outcome. placement:
    its cores and cancel event (launchers.Placement); hold_s: the child sets up, then waits that long for Ahead.release
    (kit/trial.py hold)."""
    tid = trial_id(cfgs[0])
    out = Path(run_dir) / "trials" / tid
    out.mkdir(parents=True, exist_ok=True)
    (out / "failed.json").unlink(missing_ok=True)
    spec = out / "trial.json"
    atomic_write_text(spec, json.dumps({"trial_id": tid, "configs": [c.to_dict() for c in cfgs]}, default=str))
    cfg = cfgs[0]
    start = time.monotonic()
    missing = framework_missing(cfg.framework)
    if missing:
        return _failed(out, "unavailable", missing, "", 0.0)
    cmd = [sys.executable, "-m", FRAMEWORK_MODULES[cfg.framework], "--trial", str(spec), "--out", str(out),
           "--run-id", run_id, "--cache-dir", str(Path(run_dir) / "cache")]
    if cfg.init == "shared":
        cmd += ["--init-file", str(shared_init_path(run_dir, cfg))]
    if hold_s:
        cmd += ["--hold", f"{hold_s:g}"]
    env = child_env(cfg)
    forkserver.server_for(cmd, env, env)
    timeout = min(timeout_s, TIMEOUT_MARGIN_S + TIMEOUT_FACTOR * cfg.trial_budget_s) + hold_s
    returncode, error = _run_child(cmd, cfg, out, env, timeout, on_event, placement, fork=True)
    wall = time.monotonic() - start
    tail = stderr_tail(out / "stderr.log")
    if not error and returncode == EXIT_UNAVAILABLE:
        return _failed(out, "unavailable", "its framework is unavailable", tail, wall)
    if not error and returncode != 0:
        error = _describe_exit(returncode)
    if not error and not trial_complete(run_dir, tid):
        error = "exited without writing its blocks"
    if error:
        (out / "trials.parquet").unlink(missing_ok=True)
        return _failed(out, "failed", error, tail, wall)
    return {"status": "ok", "error": "", "wall_s": round(wall, 3)}


def _failed(out: Path, status: str, error: str, tail: str, wall: float) -> dict:
    outcome = {"status": status, "error": error, "wall_s": round(wall, 3)}
    atomic_write_text(out / "failed.json", json.dumps({**outcome, "stderr_tail": tail}, indent=2))
    return outcome


class _Started:
    """A trial started ahead: its thread (run_trial), the child's pid once it is ready, its outcome once it ended."""

    def __init__(self) -> None:
        self.pid, self.outcome, self.forward = None, None, lambda event: None
        self.ready, self.done = threading.Event(), threading.Event()


class Ahead:
    """Speed trials set up ahead, while a run's last cells train (a default CPU run's cells, one per core). A core that
    no cell will take again builds and warms up the next trial's models (its child pinned there, as a cell is), which
    then waits (kit/trial.py hold); once every cell has ended, release() gives each in turn every core and lets it time
    its rounds alone, as a trial started afterwards does. The building and warm-up (Keras' tracing: 21 s for the ViT's
    three models on the AVX2-only EPYC) then takes a core the run's last cell left idle instead of the run's time."""

    def __init__(self, configs: list[RunConfig], run_dir: Path, run_id: str, timeout: float) -> None:
        self.todo = [(tid, cfgs) for tid, cfgs in plan_trials(configs).items() if not trial_complete(run_dir, tid)]
        self.run_dir, self.run_id, self.timeout = run_dir, run_id, timeout
        self.cancel = threading.Event()
        self.started: dict[str, _Started] = {}
        self.cells_ended: float | None = None  # perf_counter time of the last cell's end (run_parallel sets it)

    def start_next(self, cpu: int, on_ready: Callable[[str], None]) -> str | None:
        """Start setting up the next trial whose shared initial weights exist, pinned to `cpu`; on_ready(trial id)
        once its child is ready or has ended. Returns its trial id; None if no trial can start."""
        from amp_compare.harness.run.launchers import Placement

        index = self.next_index()
        if index is None:
            return None
        tid, cfgs = self.todo.pop(index)
        started = self.started[tid] = _Started()

        def ready() -> None:
            if not started.ready.is_set():
                started.ready.set()
                on_ready(tid)

        def on_event(event: dict) -> None:
            if event.get("kind") == "ready":
                started.pid = int(event["pid"])
                ready()
            else:
                started.forward(event)

        def work() -> None:
            try:
                started.outcome = {**run_trial(cfgs, self.run_dir, self.run_id, self.timeout, on_event,
                                               Placement(cpus=(cpu,), cancel=self.cancel), hold_s=self.timeout),
                                   "set_up": "beside the last cells"}
            except KeyboardInterrupt:  # stopped by `cancel`: its unfinished blocks are gone
                started.outcome = {"status": "failed", "error": "interrupted", "wall_s": 0.0}
            except Exception as exc:  # a harness fault in one trial: recorded, the others run
                started.outcome = {"status": "failed", "error": f"harness error: {type(exc).__name__}: {exc}",
                                   "wall_s": 0.0}
            started.done.set()
            ready()

        threading.Thread(target=work, daemon=True).start()
        return tid

    def next_index(self) -> int | None:
        """The trial (index into todo) to set up next: of those whose shared initial weights exist, the longest
        set-up, so that it overlaps the last cells and the short ones fill the cores after them; None if none can."""
        startable = [i for i, (_, cfgs) in enumerate(self.todo) if cfgs[0].init != "shared"
                     or shared_init_path(self.run_dir, cfgs[0]).exists()]
        return max(startable, key=lambda i: (self.set_up_cost(self.todo[i][1]), -i)) if startable else None

    def set_up_cost(self, cfgs: list[RunConfig]) -> float:
        """What a trial's set-up should take, from its cells that have finished: their own compile/warm-up seconds
        (phases.parquet; Keras' ViT traces for seconds, torch's models hardly at all)."""
        total = 0.0
        for cfg in cfgs:
            try:
                phases = pd.read_parquet(Path(self.run_dir) / "cells" / cfg.cell_id / "phases.parquet",
                                         columns=["phase", "seconds"])
            except Exception:  # noqa: BLE001 - not finished (or unreadable): nothing known
                continue
            total += float(phases.loc[phases["phase"] == "compile/warm-up", "seconds"].sum())
        return total

    def release(self, tid: str, on_event) -> dict:
        """Trial `tid`, set up ahead: every usable core for its child's threads, GO, and its outcome once it ended."""
        started = self.started[tid]
        started.forward = on_event
        started.ready.wait()
        if not started.done.is_set() and started.pid is not None:
            cpus = os.sched_getaffinity(0)
            try:
                for task in os.listdir(f"/proc/{started.pid}/task"):  # every thread it has: affinity is per thread
                    os.sched_setaffinity(int(task), cpus)
                os.kill(started.pid, GO)
            except (OSError, ValueError):
                pass  # it has ended meanwhile: its outcome says how
        while not started.done.wait(0.2):  # a short wait, so that Ctrl-C reaches this thread
            pass
        return started.outcome

    def stop(self) -> None:
        """Ctrl-C / SIGTERM: every child started ahead is stopped by its own thread (runner._run_child)."""
        self.cancel.set()
        for started in self.started.values():
            started.done.wait(30)


def run_trials(configs: list[RunConfig], run_dir: Path, run_id: str, timeout: float, console, manifest: dict,
               ahead: Ahead | None = None) -> BaseException | None:
    """Every planned trial not finished yet, one after another, with a progress bar each; their outcomes in
    manifest["trials"]. Returns the interruption (Ctrl-C, SIGTERM), if any: finished trials and cells are kept."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    plan = plan_trials(configs)
    entry = manifest.setdefault("trials", {})
    entry.update(budget_s=configs[0].trial_budget_s if configs else 0.0, planned=sorted(plan))
    outcomes = entry.setdefault("outcomes", {})
    todo = {tid: cfgs for tid, cfgs in plan.items() if not trial_complete(run_dir, tid)}
    if not todo:
        return None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("speed trials", total=len(todo))
        for tid, cfgs in todo.items():
            task = progress.add_task(f"  {tid}", total=None)

            def on_event(event: dict, task=task) -> None:
                if event.get("kind") == "step":
                    progress.update(task, total=event["steps"], completed=event["step"])

            try:
                outcome = (ahead.release(tid, on_event) if ahead is not None and tid in ahead.started
                           else run_trial(cfgs, run_dir, run_id, timeout, on_event))
            except KeyboardInterrupt as exc:
                if ahead is not None:
                    ahead.stop()
                progress.update(task, description=f"  {tid} [interrupted]")
                return exc
            except Exception as exc:  # a harness fault in one trial: recorded, the others run
                outcome = {"status": "failed", "error": f"harness error: {type(exc).__name__}: {exc}", "wall_s": 0.0}
            outcomes[tid] = outcome
            if outcome["status"] == "ok":  # the trials bar counts it; one that failed keeps its bar and why
                progress.remove_task(task)
            else:
                progress.update(task, description=f"  {tid} [{outcome['status'].upper()}: {outcome['error']}]")
            progress.advance(overall)
    return None
