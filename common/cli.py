"""Command line: `python -m common compare …` runs a matrix; `python -m common report DIR` re-renders.

compare validates the whole matrix before anything is written (bad input: one line, exit 2),
then runs each cell in its own child process with a progress bar, renders the report and
prints the summary table and the path of reports/<run-id>/index.html.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

from common.config import (
    COMPARISONS,
    DATASETS,
    DEFAULT_PRECISIONS,
    DEVICES,
    FRAMEWORKS,
    INITS,
    MODELS,
    OPTIMIZERS,
    PRECISIONS,
    ConfigError,
    RunConfig,
)
from common.perf import expand_cells

# Default configuration per device (the matrix is always both frameworks x fp32/fp16/bf16).
PROFILES = {
    "cpu": {"models": "simple_cnn", "datasets": "digits", "epochs": 12, "batch_size": 64, "augment": False,
            "seeds": "0,1,2", "channels_last": False},
    # resnet18 on CIFAR-10 (synthetic data of CIFAR's shape when the archive is absent and cannot be fetched)
    "cuda": {"models": "resnet18", "datasets": "cifar10", "epochs": 15, "batch_size": 256, "augment": True,
             "seeds": "0", "channels_last": True},
}
DEFAULT_TIMEOUT_S = 1800.0


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage over several)
        print(f"amp-compare: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _list(name: str, text: str, choices: tuple[str, ...] | None = None) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ConfigError(f"--{name} is empty (valid: {', '.join(choices or ())})")
    for item in items:
        if choices is not None and item not in choices:
            raise ConfigError(f"unknown {name.rstrip('s')} {item!r} (valid: {', '.join(choices)})")
    return list(dict.fromkeys(items))


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in _list("seeds", text)]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated non-negative integers, got {text!r}") from None
    return seeds


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="amp-compare", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    c = sub.add_parser("compare", help="train the matrix in both frameworks and write a report")
    c.add_argument("--frameworks", default=",".join(FRAMEWORKS), help=f"comma list of {FRAMEWORKS}")
    c.add_argument("--precisions", default=",".join(DEFAULT_PRECISIONS), help=f"comma list of {PRECISIONS}")
    c.add_argument("--models", default=None, help=f"comma list of {MODELS} (default: simple_cnn CPU, resnet18 GPU)")
    c.add_argument("--datasets", default=None, help=f"comma list of {DATASETS} (default: digits CPU, cifar10 GPU)")
    c.add_argument("--seeds", default=None, help="comma list of seeds (default: 0,1,2 on CPU, 0 on GPU)")
    c.add_argument("--repeats", type=int, default=None, help="N runs per cell with seeds 0..N-1 (instead of --seeds)")
    c.add_argument("--data-dir", default=None, help="folder to look in first for dataset archives (CIFAR)")
    c.add_argument("--augment", action=argparse.BooleanOptionalAction, default=None,
                   help="random crop + flip, identical in both frameworks (default: on for GPU/CIFAR)")
    c.add_argument("--tf32", default="off", help="on|off: TF32 for fp32 matmul/conv on GPUs, both frameworks")
    c.add_argument("--compile", action="store_true", help="torch.compile / Keras jit_compile (XLA)")
    c.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="torch channels_last memory format (default: on for GPU)")
    c.add_argument("--device", default="auto", help="auto, cpu or cuda (auto: cuda when a GPU is visible)")
    c.add_argument("--epochs", type=int, default=None, help="epochs per cell (default: 12 on CPU, 40 on GPU)")
    c.add_argument("--batch-size", type=int, default=None, help="images per step (default: 64 CPU, 128 GPU)")
    c.add_argument("--steps-per-epoch", type=int, default=None, help="cap on steps per epoch (default: all)")
    c.add_argument("--optimizer", default="adam", help=f"one of {OPTIMIZERS}")
    c.add_argument("--comparison", default="aligned", help=f"one of {COMPARISONS} (see common/mapping.py)")
    c.add_argument("--init", default="shared", help=f"one of {INITS}: shared initial weights, or each framework's")
    c.add_argument("--width", type=int, default=RunConfig.width, help="resnet18 base width")
    c.add_argument("--lr", type=float, default=RunConfig.lr, help="learning rate")
    c.add_argument("--init-scale", type=float, default=RunConfig.init_scale, help="fp16 initial loss scale")
    c.add_argument("--growth-interval", type=int, default=RunConfig.growth_interval,
                   help="fp16: clean steps before the loss scale doubles")
    c.add_argument("--loss-scale", type=float, default=None, help="fp16-static's fixed loss scale")
    c.add_argument("--fp32-layers", default="", help="comma list of blocks forced to float32 (e.g. fc,layer4)")
    c.add_argument("--clip-grad-norm", type=float, default=None,
                   help="clip the global gradient norm (of the unscaled gradients) to this value")
    c.add_argument("--warmup-steps", type=int, default=RunConfig.warmup_steps, help="steps excluded from timing")
    c.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra/inter-op threads, both sides")
    c.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per cell before it is killed")
    c.add_argument("--out", type=Path, default=Path("reports"), help="folder for run folders (default: reports)")
    c.add_argument("--run-id", default=None, help="name of the run folder (default: date-time-device)")
    c.add_argument("--diverge-after", type=int, default=RunConfig.diverge_after,
                   help="stop a cell as diverged after this many consecutive non-finite losses")
    c.add_argument("--find-max-batch", action="store_true",
                   help="also search, per framework x precision, the largest batch that trains under the memory cap")
    c.add_argument("--memory-cap", default=None,
                   help="--find-max-batch cap: CPU memory per probe process (default 4GiB); on a GPU a cap on its "
                        "memory, enforced on the device (default: the GPU's whole memory)")
    c.add_argument("--max-batch-limit", type=int, default=2**14, help="largest batch --find-max-batch tries")
    c.add_argument("--step", default="plain", help="plain, tuned or plain,tuned: the training loop (README)")
    c.add_argument("--batch-sizes", default=None, help="comma list of batch sizes: a cell at each (e.g. 64,256,1024)")
    c.add_argument("--config", type=Path, default=None, help="JSON file of compare options (CLI overrides it)")
    c.add_argument("--resume", default=None, metavar="RUN_ID",
                   help="re-run only the missing or failed cells of reports/RUN_ID")
    r = sub.add_parser("report", help="re-render the report of one or more run folders")
    r.add_argument("run_dirs", nargs="+", type=Path)
    parser.compare_parser = c  # --config and --resume need the compare options' defaults
    return parser


def resolve_device(requested: str) -> str:
    from common.env import nvidia_gpu_present

    if requested not in ("auto", *DEVICES):
        raise ConfigError(f"unknown device {requested!r} (valid: auto, {', '.join(DEVICES)})")
    has_gpu = nvidia_gpu_present()
    if requested == "cuda" and not has_gpu:
        raise ConfigError("device 'cuda' requested but no NVIDIA GPU is visible (valid here: auto, cpu)")
    if requested == "auto":
        return "cuda" if has_gpu else "cpu"
    return requested


def _writable_dir(path: Path) -> None:
    probe = path.resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {str(path)!r} is not writable ({probe} is not a writable folder)")


def plan_compare(args: argparse.Namespace) -> tuple[str, list[RunConfig], dict]:
    """Validate everything and build the matrix; writes nothing."""
    from common.data import load_dataset, steps_per_epoch

    device = resolve_device(args.device)
    profile = PROFILES[device]
    frameworks = _list("frameworks", args.frameworks, FRAMEWORKS)
    precisions = _list("precisions", args.precisions, PRECISIONS)
    models = _list("models", args.models or profile["models"], MODELS)
    datasets = _list("datasets", args.datasets or profile["datasets"], DATASETS)
    if args.repeats is not None and args.seeds is not None:
        raise ConfigError("--repeats and --seeds both choose the seeds; give one of them")
    if args.repeats is not None and args.repeats < 1:
        raise ConfigError(f"--repeats must be a positive integer, got {args.repeats}")
    seeds = list(range(args.repeats)) if args.repeats else _seeds(args.seeds or profile["seeds"])
    notes = []
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout!r}")
    common = dict(device=device, epochs=args.epochs if args.epochs is not None else profile["epochs"],
                  batch_size=args.batch_size if args.batch_size is not None else profile["batch_size"],
                  steps_per_epoch=args.steps_per_epoch, optimizer=args.optimizer, lr=args.lr,
                  comparison=args.comparison, init=args.init, width=args.width,
                  init_scale=args.init_scale, growth_interval=args.growth_interval,
                  warmup_steps=args.warmup_steps, threads=args.threads, diverge_after=args.diverge_after,
                  data_dir=args.data_dir, augment=profile["augment"] if args.augment is None else args.augment,
                  tf32=args.tf32, compile=args.compile, clip_grad_norm=args.clip_grad_norm,
                  fp32_layers=tuple(n.strip() for n in args.fp32_layers.split(",") if n.strip()),
                  channels_last=profile["channels_last"] if args.channels_last is None else args.channels_last)
    if args.datasets is None and device == "cuda":
        try:
            load_dataset("cifar10", args.data_dir)
        except ConfigError as exc:  # the GPU default still runs, on data of CIFAR's shape, and says so
            datasets = ["synthetic_cifar"]
            notes.append(f"CIFAR-10 unavailable ({exc}); the GPU default used synthetic data of CIFAR's shape.")
    if args.loss_scale is not None and "fp16-static" not in precisions:
        raise ConfigError(f"--loss-scale {args.loss_scale:g} needs precision fp16-static among --precisions "
                          f"(got {','.join(precisions)})")
    cells = [RunConfig(framework=fw, model=m, dataset=d, precision=p, seed=s,
                       loss_scale=args.loss_scale if p == "fp16-static" else None, **common)
             for m in models for d in datasets for s in seeds for p in precisions for fw in frameworks]
    cells = expand_cells(cells, args.step, args.batch_sizes)  # common/perf.py
    for d in datasets:
        n_train = len(load_dataset(d, args.data_dir).x_train)
        if steps_per_epoch(n_train, max(c.batch_size for c in cells)) == 0:
            raise ConfigError(f"batch size {max(c.batch_size for c in cells)} is larger than the {n_train} training "
                              f"images of {d!r} (valid: 1..{n_train})")
    _writable_dir(args.out)
    run_id = args.run_id or f"{datetime.now():%Y%m%d-%H%M%S}-{device}"
    if any(c in run_id for c in "/\\") or run_id in (".", ".."):
        raise ConfigError(f"run id {run_id!r} must be a plain folder name")
    if (args.out / run_id).exists():
        raise ConfigError(f"run folder {str(args.out / run_id)!r} already exists (choose another --run-id)")
    if args.find_max_batch:
        from common.maxbatch import cap_label, parse_size

        cap = parse_size(args.memory_cap or "4GiB") if device == "cpu" or args.memory_cap else None
        if args.max_batch_limit < 1:
            raise ConfigError(f"--max-batch-limit must be a positive batch size, got {args.max_batch_limit}")
        notes.append(f"--find-max-batch: largest batch per framework x precision under {cap_label(device, cap)}.")
    matrix = {"frameworks": frameworks, "models": models, "datasets": datasets, "precisions": precisions,
              "seeds": seeds}
    defaults = {k: v for k, v in dataclasses.asdict(cells[0]).items()
                if k not in ("framework", "model", "dataset", "precision", "seed")}
    max_batch = ({"cap_bytes": cap, "cap": args.memory_cap, "limit": args.max_batch_limit}
                 if args.find_max_batch else None)
    return run_id, cells, {"matrix": matrix, "defaults": defaults, "device": device, "notes": notes,
                           "max_batch": max_batch}


# Options that define the matrix: with --resume the run's own saved configuration is used instead.
MATRIX_OPTIONS = ("frameworks", "precisions", "models", "datasets", "seeds", "repeats", "data_dir", "augment",
                  "find_max_batch", "memory_cap", "max_batch_limit", "step", "batch_sizes",
                  "loss_scale", "fp32_layers", "clip_grad_norm",
                  "tf32", "compile", "channels_last", "device", "epochs", "batch_size",
                  "steps_per_epoch", "optimizer", "comparison", "init", "width", "lr", "init_scale",
                  "growth_interval", "warmup_steps", "threads", "diverge_after", "run_id", "config")


def plan_resume(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Path, list[RunConfig], dict]:
    """The cells of an earlier run that are missing or failed; finished cells are left untouched."""
    import pandas as pd

    from common.report import load_manifest

    run_dir = args.out / args.resume
    if not (run_dir / "manifest.json").exists():
        known = sorted(p.name for p in args.out.glob("*") if (p / "manifest.json").exists())
        raise ConfigError(f"unknown run id {args.resume!r} in {str(args.out)!r} (valid: {', '.join(known) or 'none'})")
    given = [f"--{k.replace('_', '-')}" for k in MATRIX_OPTIONS
             if getattr(args, k) != parser.compare_parser.get_default(k)]
    if given:
        raise ConfigError(f"--resume reuses the run's saved configuration; drop {', '.join(given)} "
                          "(valid with --resume: --out, --timeout)")
    manifest = load_manifest(run_dir)
    todo = []
    for cfg in (RunConfig.from_dict(d) for d in manifest["configs"]):
        path = run_dir / "cells" / cfg.cell_id / "run.parquet"
        try:
            status = str(pd.read_parquet(path, columns=["status"])["status"].iloc[0]) if path.exists() else "missing"
        except Exception:  # an unreadable record is as good as none
            status = "corrupt"
        if status not in ("ok", "diverged"):  # a diverged run is a result, not a failure
            todo.append(cfg)
    return run_dir, todo, manifest


def compare(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser) -> int:
    from common.atomic import atomic_write_text
    from common.env import host_environment

    if args.resume:
        run_dir, cells, manifest = plan_resume(args, parser)
        manifest.setdefault("resumed", []).append(
            {"command": "python -m common " + " ".join(shlex.quote(a) for a in argv), "cells": len(cells)})
    else:
        run_id, cells, plan = plan_compare(args)
        run_dir = args.out / run_id
        run_dir.mkdir(parents=True)
        manifest = {"run_id": run_id, "command": "python -m common " + " ".join(shlex.quote(a) for a in argv),
                    **plan, "cells": [c.cell_id for c in cells], "configs": [c.to_dict() for c in cells],
                    "environment": host_environment(), "timeout_s": args.timeout}
    atomic_write_text(run_dir / "manifest.json", json.dumps(manifest, indent=2, default=str))
    console = _console()
    console.print(f"amp-compare: {len(cells)} cells on {manifest['device']} -> {run_dir}")
    start = time.monotonic()
    outcomes, interrupted = run_cells(cells, run_dir, manifest["run_id"], args.timeout, console)
    if manifest.get("max_batch") and not interrupted:
        interrupted = run_max_batch(cells, run_dir, manifest["max_batch"], args.timeout, console)
    index = _render(run_dir, console)
    done = [o for o in outcomes if o.status in ("ok", "diverged")]
    bad = [f"{o.cell_id} ({o.status}: {o.error})" for o in outcomes if o not in done]
    console.print(f"{len(done)} of {len(cells)} cells finished in {time.monotonic() - start:.0f} s"
                  + (f"; not finished: {'; '.join(bad)}" if bad else ""))
    print(index)
    if interrupted:
        console.print(f"Interrupted: {len(done)} finished cells are kept in {run_dir}. Resume with:\n"
                      f"  python -m common compare --resume {run_dir.name} --out {shlex.quote(str(args.out))}")
        return 130
    return 0


def run_max_batch(cells: list[RunConfig], run_dir: Path, settings: dict, timeout: float, console) -> bool:
    """--find-max-batch: one search per framework x precision (first model, dataset and seed), each written
    to maxbatch/<framework>-<precision>.parquet once it finishes. Returns True if interrupted."""
    from common.atomic import atomic_write_bytes
    from common.maxbatch import cap_label, find_max_batch, search_table

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
        except KeyboardInterrupt:
            return True
        except RuntimeError as exc:  # a probe that crashed for another reason than memory
            console.print(f"  search failed: {exc}")
            continue
        if result.stopped_early:
            console.print(f"  {result.stopped_early}: batch {result.max_ok}")
        buffer = io.BytesIO()
        search_table([result]).to_parquet(buffer, index=False)
        atomic_write_bytes(path, buffer.getvalue())
    return False


def run_cells(cells: list[RunConfig], run_dir: Path, run_id: str, timeout: float, console) -> tuple[list, bool]:
    """Each cell in its own child, with a progress bar over the matrix and one within each cell."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from common.runner import run_cell

    outcomes = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("matrix", total=len(cells))
        for cfg in cells:
            task = progress.add_task(f"  {cfg.cell_id}", total=None)

            def on_event(event: dict, task=task) -> None:
                if event.get("kind") == "step":
                    total = event["epochs"] * event["steps"]
                    progress.update(task, total=total, completed=event["epoch"] * event["steps"] + event["step"])

            try:
                outcome = run_cell(cfg, run_dir, run_id, timeout, on_event)
            except KeyboardInterrupt:
                progress.update(task, description=f"  {cfg.cell_id} [interrupted]")
                return outcomes, True
            outcomes.append(outcome)
            status = outcome.status if outcome.status == "ok" else f"{outcome.status.upper()}: {outcome.error}"
            progress.update(task, description=f"  {cfg.cell_id} [{status}]")
            progress.advance(overall)
    return outcomes, False


def _console():
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:  # logs and CI: wide enough for the summary table's 12 columns
        console.width = 500  # the summary table with issue 13's timing/MFU columns, unwrapped
    return console


def _render(run_dir: Path, console) -> Path:
    from rich.table import Table

    from common import records
    from common.report import load_manifest, render_report
    from common.summary import findings, formatted_summary, summary_table

    index = render_report(run_dir)
    tables = records.read_run(run_dir, warn=lambda msg: None)
    summary = formatted_summary(summary_table(tables["run"]))
    table = Table(title=f"amp-compare summary ({run_dir.name})")
    for col in summary.columns:
        table.add_column(col, justify="left" if col in ("Framework", "Model", "Dataset", "Precision") else "right")
    for row in summary.itertuples(index=False):
        table.add_row(*map(str, row))
    console.print(table)
    for sentence in findings(tables["run"], tables["steps"], load_manifest(run_dir)["environment"]):
        console.print(f"- {sentence}")
    return index


def report(args: argparse.Namespace) -> int:
    for run_dir in args.run_dirs:
        if not (run_dir / "manifest.json").exists():
            raise ConfigError(f"{str(run_dir)!r} is not a compare run folder (no manifest.json)")
    console = _console()
    if len(args.run_dirs) > 1:  # one combined report, the machine as a dimension
        from common.report import render_combined

        if len({d.resolve() for d in args.run_dirs}) != len(args.run_dirs):
            raise ConfigError("the same run folder was given twice to report (give each once)")
        out = args.run_dirs[0].parent / f"combined-{datetime.now():%Y%m%d-%H%M%S}"
        print(render_combined(args.run_dirs, out))
        return 0
    print(_render(args.run_dirs[0], console))
    return 0


def load_config_file(path: Path, parser: argparse.ArgumentParser) -> dict:
    """Compare options from a JSON object (keys as the option names); the command line overrides them."""
    compare_parser = parser.compare_parser
    valid = sorted(a.dest for a in compare_parser._actions if a.dest not in ("help", "config", "resume"))
    try:
        values = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"malformed config file {str(path)!r}: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a JSON object of options")
    values = {k.replace("-", "_"): v for k, v in values.items()}
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} in config file {str(path)!r} "
                          f"(valid: {', '.join(valid)})")
    lists = {k: ",".join(map(str, v)) for k, v in values.items() if isinstance(v, list)}
    compare_parser.set_defaults(**{**values, **lists})
    return values


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "compare":
            if args.config:
                load_config_file(args.config, parser)
                args = parser.parse_args(argv)
            return compare(args, argv, parser)
        return report(args)
    except ConfigError as exc:
        print(f"amp-compare: error: {exc}", file=sys.stderr)
        return 2
