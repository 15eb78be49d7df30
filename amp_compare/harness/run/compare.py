"""Orchestration of `python -m amp_compare compare|report`: `main` parses the command line (cli.py), plans the
matrix or the resume of a run, holds the run folder's lock, runs each cell in its own child process with a
progress bar (runner.py), checks the machine's calibration between cells, runs --find-max-batch, and hands the
run folder to the report (harness/report/render.py).

Bad input is refused before anything is written (one line, exit 2); Ctrl-C and SIGTERM keep every finished
cell, render the report and print the resume command (exit codes: cli.py, docs/RELIABILITY.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import io
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from amp_compare.contract.config import ConfigError, RunConfig, run_options
from amp_compare.contract.fp8 import plan_error as fp8_plan_error
from amp_compare.contract.precision import names as precision_names
from amp_compare.harness.common import DEFAULT_MODEL_EPOCHS, DEFAULT_MODEL_SEEDS
from amp_compare.harness.run.cli import (
    EXIT_BAD_INPUT,
    EXIT_CELLS_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REPORT_UNWRITTEN,
    EXIT_TERMINATED,
    MATRIX_OPTIONS,
    build_parser,
    compare_options,
    compare_settings,
)
from amp_compare.harness.run.launch import expand_replicas


def _writable_dir(path: Path) -> None:
    """The output folder can be made and written (found by making and removing a probe folder in its
    nearest existing parent: nothing is left behind)."""
    probe = path.resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {str(path)!r} is not writable ({probe} is not a writable folder)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".amp-compare-probe-", dir=probe))
    except OSError as exc:
        raise ConfigError(f"output directory {str(path)!r} is not writable ({probe}: {exc.strerror})") from None


def _check_run_id(out: Path, run_id: str) -> None:
    if not run_id or any(c in run_id for c in "/\\\0") or run_id in (".", ".."):
        raise ConfigError(f"run id {run_id!r} must be a plain folder name")
    probe = out.resolve()
    while not probe.exists():
        probe = probe.parent
    limit = os.pathconf(probe, "PC_NAME_MAX") if probe.is_dir() else 255
    for part in (*out.parts, run_id):
        if len(os.fsencode(part)) > limit:
            raise ConfigError(f"folder name {part[:40]!r}... is {len(os.fsencode(part))} bytes long, longer than "
                              f"the file system allows (valid: up to {limit} bytes)")


def make_dirs(path: Path) -> None:
    """mkdir -p that leaves nothing behind when it fails (a bad path is bad input, not a traceback)."""
    made = []
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    try:
        for p in missing:
            p.mkdir()
            made.append(p)
    except OSError as exc:
        for p in reversed(made):
            p.rmdir()
        raise ConfigError(f"cannot create the run folder {str(path)!r}: {exc.strerror}") from None


def check_machine_limits(args: argparse.Namespace) -> None:
    """What the options' declarations cannot know: --threads against the CPUs this process may run on,
    --memory-cap as a positive finite size (whether or not --find-max-batch uses it), --data-dir a folder (or
    none yet)."""
    from amp_compare.contract.config import usable_cpus
    from amp_compare.kit.probe import parse_size

    limit = usable_cpus()
    if args.threads > limit:
        source = "" if "threads" in args.given else " (from $OMP_NUM_THREADS)"
        raise ConfigError(f"--threads {args.threads}{source} is more than this machine can run: valid 1..{limit}, "
                          "the CPUs this process may run on")
    if args.memory_cap is not None:
        try:
            cap = parse_size(args.memory_cap)
        except (ConfigError, OverflowError):
            cap = 0
        if not 0 < cap < 2**63:
            raise ConfigError(f"--memory-cap {args.memory_cap!r} must be a positive, finite size (valid: a number "
                              "and a unit, B, KB, MB, GB, TB or KiB, MiB, GiB, TiB, e.g. 4GiB)")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():  # a typo must not start a download
        what = "is not a folder" if Path(args.data_dir).exists() else "does not exist"
        raise ConfigError(f"--data-dir {args.data_dir!r} {what} (valid: a folder to look in for the "
                          "dataset archives, e.g. one holding cifar-10-python.tar.gz)")


def expand_cells(cells: list[RunConfig], steps: tuple[str, ...],
                 batch_sizes: tuple[int, ...] | None) -> list[RunConfig]:
    """The matrix times the step loops times the batch sizes (plan_compare calls this with the options
    as the one declaration validated them: known steps, positive batch sizes)."""
    sizes = sorted(set(batch_sizes or ()))
    out = []
    for cfg in cells:
        for size in sizes or [cfg.batch_size]:
            for s in dict.fromkeys(steps):
                out.append(dataclasses.replace(cfg, step=s, batch_size=size, batch_sweep=bool(sizes)))
    return out


def plan_compare(args: argparse.Namespace) -> tuple[str, list[RunConfig], dict]:
    """Validate everything and build the matrix; writes nothing. `args` comes from compare_settings."""
    from amp_compare.harness.run.order import interleaved_order
    from amp_compare.kit.data import load_dataset, steps_per_epoch

    device = args.resolved_device
    frameworks, precisions, models, datasets = args.frameworks, args.precisions, args.models, args.datasets
    if "repeats" in args.given and "seeds" in args.given:
        raise ConfigError("--repeats and --seeds both choose the seeds; give one of them")
    check_machine_limits(args)
    seeds = tuple(range(args.repeats)) if args.repeats else args.seeds
    chosen = "repeats" in args.given or "seeds" in args.given

    def model_seeds(model: str) -> tuple[int, ...]:
        return seeds if chosen else DEFAULT_MODEL_SEEDS.get(device, {}).get(model, seeds)
    notes = []
    cell_options = [n for n, d in run_options().items() if d.spec.cli and n != "loss_scale"]
    common = {n: getattr(args, n) for n in cell_options}
    if "datasets" not in args.given and device == "cuda":
        try:
            load_dataset("cifar10", args.data_dir)
        except ConfigError as exc:  # the GPU default still runs, on data of CIFAR's shape, and says so
            datasets = ("synthetic_cifar",)
            notes.append(f"CIFAR-10 unavailable ({exc}); the GPU default used synthetic data of CIFAR's shape.")
    if fp8_error := fp8_plan_error(frameworks, models, precisions, args.given):  # contract/fp8.py
        raise ConfigError(fp8_error)
    static = precision_names(loss_scaling="static")
    if args.loss_scale is not None and not set(static) & set(precisions):
        raise ConfigError(f"--loss-scale {args.loss_scale:g} needs precision {', '.join(static)} among --precisions "
                          f"(got {','.join(precisions)})")
    epochs = {} if "epochs" in args.given else DEFAULT_MODEL_EPOCHS.get(device, {})
    if shorter := {m: epochs[m] for m in models if m in epochs and epochs[m] < args.epochs}:
        notes.append("Epochs per model (the default on this device, fewer than --epochs' default so that the default "
                     "compare ends within minutes): " + ", ".join(f"{m} {n}" for m, n in shorter.items())
                     + "; --epochs N trains every model N.")

    def model_options(model: str) -> dict:
        return {**common, "epochs": shorter.get(model, common["epochs"])}
    cells = [RunConfig(framework=fw, model=m, dataset=d, precision=p, seed=s, device=device,
                       loss_scale=args.loss_scale if p in static else None, **model_options(m))
             for m in models for d in datasets for s in model_seeds(m) for p in precisions for fw in frameworks]
    cells = expand_cells(cells, args.step, args.batch_sizes)  # --step and --batch-sizes (expand_cells above)
    cells = expand_replicas(cells, args.allreduce, device)  # DATA PARALLEL: --replicas/--allreduce (launch.py)
    cells = interleaved_order(cells)  # precision order rotated per seed, so drift cancels (order.py)
    for d in datasets:
        n_train = len(load_dataset(d, args.data_dir).x_train)
        if steps_per_epoch(n_train, max(c.batch_size for c in cells)) == 0:
            raise ConfigError(f"batch size {max(c.batch_size for c in cells)} is larger than the {n_train} training "
                              f"images of {d!r} (valid: 1..{n_train})")
    run_id = _new_run_id(args, device)
    max_batch = _max_batch_settings(args, device, notes)
    matrix = {"frameworks": list(frameworks), "models": list(models), "datasets": list(datasets),
              "precisions": list(precisions), "seeds": list(seeds)}
    defaults = {k: v for k, v in dataclasses.asdict(cells[0]).items()
                if k not in ("framework", "model", "dataset", "precision", "seed")}
    return run_id, cells, {"matrix": matrix, "defaults": defaults, "device": device, "notes": notes,
                           "max_batch": max_batch, "cell_budget": cell_budget(cells[0])}


def cell_budget(cfg: RunConfig) -> dict:
    """The manifest's cell_budget: the speed budget every cell ran under (kit/training.py SpeedBudget; which cells
    it stopped early, and why, is in their run rows: budget_steps, budget_reason)."""
    from amp_compare.kit import training

    return {"enabled": cfg.speed_budget, "limit_s": cfg.speed_budget_s, "probe_steps": training.BUDGET_PROBE_STEPS,
            "measure_s": training.BUDGET_MEASURE_SHARE * cfg.speed_budget_s, "min_steps": training.BUDGET_MIN_STEPS,
            "max_steps": training.BUDGET_MAX_STEPS, "warmup_steps": cfg.warmup_steps,
            "off_with": "--no-speed-budget"}


def _new_run_id(args: argparse.Namespace, device: str) -> str:
    """The new run's folder name, checked: a writable --out, a plain name the file system takes, not there yet."""
    _writable_dir(args.out)
    run_id = args.run_id if args.run_id is not None else f"{datetime.now():%Y%m%d-%H%M%S}-{device}"
    _check_run_id(args.out, run_id)
    if (args.out / run_id).exists():
        raise ConfigError(f"run folder {str(args.out / run_id)!r} already exists (choose another --run-id)")
    return run_id


def _max_batch_settings(args: argparse.Namespace, device: str, notes: list[str]) -> dict | None:
    """--find-max-batch's settings for the manifest (None without it), its cap said in `notes`."""
    if not args.find_max_batch:
        return None
    from amp_compare.harness.report.tables import cap_label
    from amp_compare.kit.probe import parse_size

    cap = parse_size(args.memory_cap or "4GiB") if device == "cpu" or args.memory_cap else None
    notes.append(f"--find-max-batch: largest batch per framework x precision under {cap_label(device, cap)}.")
    return {"cap_bytes": cap, "cap": args.memory_cap, "limit": args.max_batch_limit}


def read_manifest(run_dir: Path) -> dict:
    """A run's manifest.json, or one line saying it is unreadable and what to do."""
    path = Path(run_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest, dict) or not isinstance(manifest.get("configs"), list):
            raise ValueError("no list of cell configurations")
        configs = [RunConfig.from_dict(c) for c in manifest["configs"]]
    except (OSError, ValueError, TypeError) as exc:  # JSONDecodeError and ConfigError are ValueErrors
        raise ConfigError(f"manifest {str(path)!r} is unreadable or incomplete ({str(exc).splitlines()[0]}); "
                          "its cells' records are intact: restore manifest.json from a backup, or start a new "
                          "run with another --run-id") from None
    manifest["_configs"] = configs
    return manifest


def cell_complete(run_dir: Path, cfg: RunConfig) -> bool:
    """A finished cell: every table it wrote reads back, with the rows a finished run has."""
    from amp_compare.contract import records

    cell_dir = Path(run_dir) / "cells" / cfg.cell_id
    try:
        tables = records.read_cell(cell_dir)
        status = str(tables["run"]["status"].iloc[0])
    except Exception:  # an unreadable table is as good as none
        return False
    if status not in ("ok", "diverged"):  # a diverged run is a result, not a failure
        return False
    if not all(name in tables and len(tables[name]) for name in records.TABLES):
        return False
    # a cell the speed budget stopped early (kit/training.py) is finished with fewer epochs
    budgeted = "budget_steps" in tables["run"] and bool(tables["run"]["budget_steps"].notna().iloc[0])
    return status == "diverged" or budgeted or len(tables["epochs"]) == cfg.epochs


def plan_resume(args: argparse.Namespace):
    """The cells of an earlier run that are missing, failed or incomplete (finished cells are left
    untouched), planned under the run folder's lock, which the caller releases."""
    run_dir = args.out / args.resume
    if not (run_dir / "manifest.json").exists():
        known = sorted(p.name for p in args.out.glob("*") if (p / "manifest.json").exists())
        raise ConfigError(f"unknown run id {args.resume!r} in {str(args.out)!r} (valid: {', '.join(known) or 'none'})")
    options = compare_options()
    given = [options[k].flag for k in MATRIX_OPTIONS if k in args.given]
    if given:
        raise ConfigError(f"--resume reuses the run's saved configuration; drop {', '.join(given)} "
                          "(valid with --resume: --out, --timeout, --no-figures and where the cells run: "
                         "--parallel, --launcher, --slurm-*)")
    lock = lock_run(run_dir)
    try:
        manifest = read_manifest(run_dir)
        configs = manifest.pop("_configs")
        return run_dir, [cfg for cfg in configs if not cell_complete(run_dir, cfg)], manifest, lock
    except BaseException:
        lock.release()
        raise


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


def process_age_s() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere 0: unknown), the parent's first phase."""
    try:
        start_ticks = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _on_sigterm(signum, frame):
    raise Terminated()


def lock_run(run_dir: Path):
    """Hold the run folder's lock: a second compare or --resume of the same run is refused."""
    import filelock

    lock = filelock.FileLock(str(run_dir / ".lock"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise ConfigError(f"run {run_dir.name!r} is in use by another compare or --resume "
                          f"(lock {str(run_dir / '.lock')!r}); wait for it to finish") from None
    return lock


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    from amp_compare.contract.env import host_environment
    from amp_compare.harness.run import launchers

    command = "python -m amp_compare " + " ".join(shlex.quote(a) for a in argv)
    launchers.check_launcher(args)
    phases = {"parent start": process_age_s()}  # interpreter, imports and parsing before this line
    planning = time.perf_counter()
    if args.resume:
        run_dir, cells, manifest, lock = plan_resume(args)
        manifest.setdefault("resumed", []).append({"command": command, "cells": len(cells)})
        trial_threads = manifest.get("launcher", {}).get("trial_threads")  # the run's, not this part's
        cells = launchers.cells_at_once(args, cells, manifest.get("launcher"))
        manifest["launcher"] = launchers.describe(args)  # the launcher of the latest part (each cell's placement)
        manifest["launcher"].pop("trial_threads", None)
        if trial_threads:
            manifest["launcher"]["trial_threads"] = trial_threads
    else:
        run_id, cells, plan = plan_compare(args)
        cells = launchers.cells_at_once(args, cells)  # on a CPU, by default, one thread per cell and cells at once
        plan["defaults"]["threads"] = cells[0].threads
        run_dir = args.out / run_id
        make_dirs(run_dir)
        lock = lock_run(run_dir)
        manifest = {"run_id": run_id, "command": command,
                    **plan, "cells": [c.cell_id for c in cells], "configs": [c.to_dict() for c in cells],
                    "environment": host_environment(), "timeout_s": args.timeout,
                    "launcher": launchers.describe(args)}
    phases["planning"] = time.perf_counter() - planning
    manifest["phases"] = phases  # the parent's phases; _run_matrix and _compare_locked add theirs
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _compare_locked(args, run_dir, cells, manifest)
    finally:
        signal.signal(signal.SIGTERM, previous)
        lock.release()


def _compare_locked(args: argparse.Namespace, run_dir: Path, cells: list[RunConfig], manifest: dict) -> int:
    from amp_compare.contract.atomic import atomic_write_text

    atomic_write_text(run_dir / "manifest.json", json.dumps(manifest, indent=2, default=str))
    console = _console()
    console.print(f"amp-compare: {len(cells)} cells on {manifest['device']} -> {run_dir}")
    start = time.monotonic()
    outcomes, interrupted = _run_matrix(cells, run_dir, manifest, args.timeout, console)
    rendering = time.perf_counter()
    try:
        interrupted, index = _finish(args, run_dir, cells, manifest, console, interrupted)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(disk_full(exc, run_dir, args.out, unfinished=len(outcomes) < len(cells)), file=sys.stderr)
        return EXIT_REPORT_UNWRITTEN
    manifest["phases"]["render"] = time.perf_counter() - rendering
    atomic_write_text(run_dir / "manifest.json", json.dumps(manifest, indent=2, default=str))
    done = [o for o in outcomes if o.status in ("ok", "diverged")]
    bad = [f"{o.cell_id} ({o.status}: {o.error})" for o in outcomes if o not in done]
    if bad:
        console.print(f"not finished: {'; '.join(bad)}")
    print_path(index, console)
    if interrupted:
        console.print(f"{'Terminated' if isinstance(interrupted, Terminated) else 'Interrupted'}: {len(done)} "
                      f"finished cells are kept in {run_dir}. Resume with:\n"
                      f"  python -m amp_compare compare --resume {run_dir.name} --out {shlex.quote(str(args.out))}")
    status = (EXIT_TERMINATED if isinstance(interrupted, Terminated) else EXIT_INTERRUPTED if interrupted
              else EXIT_CELLS_FAILED if bad else EXIT_OK)
    unavailable = sum(o.status == "unavailable" for o in outcomes)  # asked for, but not runnable here: not a fault
    console.print(f"amp-compare: {len(done)} of {len(cells)} cells finished, {len(bad) - unavailable} failed"
                  f"{f', {unavailable} unavailable' if unavailable else ''}"
                  f"{f', {len(cells) - len(outcomes)} not run (interrupted)' if interrupted else ''}"
                  f" in {time.monotonic() - start:.0f} s (exit {status})")
    return status


def _run_matrix(cells: list[RunConfig], run_dir: Path, manifest: dict, timeout: float, console):
    """run_cells with the machine's calibration checked before the matrix and after every cell, in the
    parent while no child runs (harness/run/calibrate.py); every check lands in manifest["calibrations"]."""
    from amp_compare.harness.run import calibrate, forkserver, launchers

    checks = manifest.setdefault("calibrations", [])
    phases = manifest.setdefault("phases", {})
    started, spent = time.perf_counter(), []

    def timed_check(when: str) -> None:
        begin = time.perf_counter()
        checks.append(calibrate.check(when))
        spent.append(time.perf_counter() - begin)

    timed_check("before the matrix")
    ahead = _trials_ahead(run_dir, manifest, timeout)
    cells_start = time.perf_counter()
    outcomes, interrupted = run_cells(cells, run_dir, manifest["run_id"], timeout, console,
                                      after_cell=lambda cfg: timed_check(f"after {cfg.cell_id}"),
                                      manifest=manifest, ahead=ahead)
    # the trials' time runs from the last cell's end: a trial set up beside the last cells took none of the run's
    cells_end = ahead.cells_ended if ahead is not None and ahead.cells_ended else time.perf_counter()
    if not interrupted:  # the speed trials, alone on the machine, forked from the same parents (harness/run/trials.py)
        interrupted = run_speed_trials(run_dir, manifest, timeout, console, ahead)
        phases["trials"] = phases.get("trials", 0.0) + time.perf_counter() - cells_end
    # the twins' pre-imported parents (harness/run/forkserver.py) go before the last check and the report
    forked = forkserver.close_all()
    if len(checks) < 2:
        timed_check("after the matrix")
    manifest["environment"].update(calibrate.environment_entries(checks[0], checks[-1]))
    # Each cell's wall time as the parent saw it, spawn to exit: the child's own phases (phases.parquet) and,
    # beyond their sum, the cell's "exit" (writing its tables, the interpreter's shutdown)
    phases["cell_wall_s"] = {**phases.get("cell_wall_s", {}), **{o.cell_id: round(o.wall_s, 3) for o in outcomes}}
    phases["calibration"] = sum(spent)
    phases["fork servers"] = sum(forked.values())  # the wall waited for the twins' parents to start (all at once)
    # the cells' wall: their sum one after another; from the first start to the last end where they ran at once
    phases["cells"] = (cells_end - cells_start - phases["fork servers"] if launchers.concurrent(manifest["launcher"])
                       else sum(o.wall_s for o in outcomes))
    phases["between cells"] = (time.perf_counter() - started - phases["calibration"] - phases["cells"]
                               - phases["fork servers"] - phases.get("trials", 0.0))
    return outcomes, interrupted


def _trial_configs(manifest: dict) -> list[RunConfig]:
    """Every cell's configuration as the speed trials run it: at the launcher's trial threads where the cells ran one
    thread each, at once."""
    configs = [RunConfig.from_dict(c) for c in manifest["configs"]]
    threads = manifest.get("launcher", {}).get("trial_threads")
    return [dataclasses.replace(c, threads=threads) for c in configs] if threads else configs


def _trials_ahead(run_dir: Path, manifest: dict, timeout: float):
    """The speed trials to set up beside the last cells (trials.Ahead): where the cells run at once on this machine's
    CPUs (the default on a CPU); None elsewhere (one after another, submitit jobs, GPUs)."""
    from amp_compare.harness.run import trials

    launcher = manifest.get("launcher", {})
    if (launcher.get("launcher", "local") != "local" or launcher.get("parallel", 1) < 2
            or manifest.get("device") == "cuda"):
        return None
    return trials.Ahead(_trial_configs(manifest), run_dir, manifest["run_id"], timeout)


def run_speed_trials(run_dir: Path, manifest: dict, timeout: float, console, ahead=None) -> BaseException | None:
    """The run's speed trials (harness/run/trials.py) over every cell of its manifest, so a resumed run plans the same
    ones; on this machine only: where a submitit launcher ran the cells elsewhere, the manifest says none ran. ahead:
    the trials set up beside the last cells (trials.Ahead), released here."""
    from amp_compare.harness.run import trials

    if manifest.get("launcher", {}).get("launcher") == "submitit":
        manifest["trials"] = {"planned": [], "skipped": "the cells ran as submitit jobs, not on this machine"}
        return None
    try:
        return trials.run_trials(_trial_configs(manifest), run_dir, manifest["run_id"], timeout, console, manifest,
                                 ahead)
    finally:  # which trials ran, kept even when interrupted
        from amp_compare.contract.atomic import atomic_write_text

        atomic_write_text(run_dir / "manifest.json", json.dumps(manifest, indent=2, default=str))


def _finish(args: argparse.Namespace, run_dir: Path, cells: list[RunConfig], manifest: dict, console, interrupted):
    """What follows the cells: the manifest with its calibrations, --find-max-batch, the report. Returns the
    interruption (if any) and the report's index.html."""
    from amp_compare.contract.atomic import atomic_write_text

    atomic_write_text(run_dir / "manifest.json", json.dumps(manifest, indent=2, default=str))
    if manifest.get("max_batch") and not interrupted:
        interrupted = run_max_batch(cells, run_dir, manifest["max_batch"], args.timeout, console)
    try:
        index = _render(run_dir, console, figures=args.figures)
    except KeyboardInterrupt as exc:  # a second signal while rendering: the records are all there
        interrupted, index = interrupted or exc, run_dir / "index.html"
    return interrupted, index


def disk_full(exc: OSError, run_dir: Path, out: Path | None = None, unfinished: bool = False) -> str:
    """The one line a full disk while writing a report gets: what failed, that nothing finished is lost
    (every record is written atomically), and the command that finishes the job once there is space."""
    where = exc.filename or run_dir
    resume = (f"; cells not run yet: python -m amp_compare compare --resume {run_dir.name} --out "
              f"{shlex.quote(str(out))}" if unfinished and out is not None else "")
    return (f"amp-compare: error: the disk is full ({exc.strerror or 'no space left'}: {where}); the report of "
            f"{run_dir} was not written, every finished cell's records are kept: free space, then run "
            f"python -m amp_compare report {shlex.quote(str(run_dir))}{resume}")


def run_max_batch(cells: list[RunConfig], run_dir: Path, settings: dict, timeout: float, console):
    """--find-max-batch: one search per framework x precision (first model, dataset and seed), each written
    to maxbatch/<framework>-<precision>.parquet once it finishes. Returns the interruption, if any."""
    from amp_compare.contract.atomic import atomic_write_bytes
    from amp_compare.harness.report.tables import cap_label, search_table
    from amp_compare.harness.run.maxbatch import find_max_batch

    seen, searches = set(), []
    for cfg in cells:
        if (cfg.framework, cfg.precision) not in seen:
            seen.add((cfg.framework, cfg.precision))
            searches.append(cfg)
    for cfg in searches:
        path = run_dir / "maxbatch" / f"{cfg.framework}-{cfg.precision}.parquet"
        if path.exists():  # a resumed run keeps finished searches
            continue
        console.print(f"max batch {cfg.framework} {cfg.precision} under {cap_label(cfg.device, settings['cap_bytes'])}"
                      ":")
        try:
            result = find_max_batch(cfg, settings["cap_bytes"], start=64, limit=settings["limit"], timeout_s=timeout,
                                    on_probe=lambda p: console.print(f"  batch {p.batch}: "
                                                                     f"{'fits' if p.ok else p.reason}"))
        except KeyboardInterrupt as exc:
            return exc
        except RuntimeError as exc:  # a probe that crashed for another reason than memory
            console.print(f"  search failed: {exc}")
            continue
        if result.stopped_early:
            console.print(f"  {result.stopped_early}: batch {result.max_ok}")
        buffer = io.BytesIO()
        search_table([result]).to_parquet(buffer, index=False)
        atomic_write_bytes(path, buffer.getvalue())
    return None


def run_cells(cells: list[RunConfig], run_dir: Path, run_id: str, timeout: float, console, after_cell=lambda cfg: None,
              manifest: dict | None = None, ahead=None) -> tuple[list, BaseException | None]:
    """Each cell in its own child, with a progress bar over the matrix and one within each cell; after_cell(cfg)
    runs once each cell has ended (the calibration check between cells). The manifest's launcher (--parallel,
    --launcher submitit) may run several at once instead (harness/run/launchers.py)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from amp_compare.harness.run import launchers
    from amp_compare.harness.run.runner import prestart_fork_servers, run_cell

    outcomes = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        if manifest is not None and launchers.concurrent(manifest["launcher"]):
            return launchers.launch(cells, run_dir, run_id, timeout, progress, manifest, harness_fault, ahead)
        starting = progress.add_task("  starting the frameworks", total=None)
        try:
            prestart_fork_servers(cells, run_dir)  # every twin's pre-imported parent at once, before the first cell
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated): no cell ran, nothing to lose
            return outcomes, exc
        progress.remove_task(starting)
        bars = launchers.CellBars(progress, len(cells))
        for cfg in cells:
            on_event = bars.start(cfg)
            try:
                outcome = run_cell(cfg, run_dir, run_id, timeout, on_event)
            except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
                bars.state(cfg, "interrupted")
                return outcomes, exc
            except Exception as exc:  # a harness fault in one cell: recorded, and the other cells run
                outcome = harness_fault(cfg, run_dir, run_id, exc)
            outcomes.append(outcome)
            after_cell(cfg)
            bars.end(cfg, outcome)
    return outcomes, None


def harness_fault(cfg: RunConfig, run_dir: Path, run_id: str, exc: Exception):
    """The outcome (and, where it can be written, the record) of a cell the harness itself failed on."""
    from amp_compare.harness.run.runner import CellOutcome, failed_run_table, write_failed_record

    error = f"harness error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    try:
        write_failed_record(run_dir / "cells" / cfg.cell_id, failed_run_table(cfg, run_id, error, ""))
    except Exception as again:  # noqa: BLE001 - nothing more can be recorded; the outcome still counts it
        error += f" (record not written: {again})"
    return CellOutcome(cfg.cell_id, "failed", error, 0.0)


def _console():
    """A rich console on stderr, rich's own width where stderr is no terminal (COLUMNS, else 80)."""
    from rich.console import Console

    return Console(stderr=True)


def _render(run_dir: Path, console, figures: bool = True) -> Path:
    from amp_compare.harness.report.render import render
    from amp_compare.harness.report.terminal import print_summary

    rendered = render(run_dir, figures=figures)
    print_summary(console, f"amp-compare summary ({run_dir.name})", rendered)
    return rendered.index


def print_path(index: Path, console) -> None:
    """The report's path on stdout, for a script; not where stdout and the summary's console are one terminal, whose
    last lines already say it ("Report: …", report/terminal.py): the default run's answer then fits 80x40."""
    if not (sys.stdout.isatty() and console.is_terminal):
        print(index)


def report(args: argparse.Namespace) -> int:
    for run_dir in args.run_dirs:
        if not (run_dir / "manifest.json").exists():
            raise ConfigError(f"{str(run_dir)!r} is not a compare run folder (no manifest.json)")
        read_manifest(run_dir)
    console = _console()
    if len(args.run_dirs) > 1:  # one combined report, the machine as a dimension
        from amp_compare.harness.report.render import render_combined

        if len({d.resolve() for d in args.run_dirs}) != len(args.run_dirs):
            raise ConfigError("the same run folder was given twice to report (give each once)")
        out = args.run_dirs[0].parent / f"combined-{datetime.now():%Y%m%d-%H%M%S}"
        print(render_combined(args.run_dirs, out, figures=args.figures))
        return 0
    try:
        print_path(_render(args.run_dirs[0], console, figures=args.figures), console)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(disk_full(exc, args.run_dirs[0]), file=sys.stderr)
        return EXIT_REPORT_UNWRITTEN
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "compare":
            return compare(compare_settings(args), argv)
        return report(args)
    except ConfigError as exc:
        print(f"amp-compare: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
