"""Command line: `python -m amp_compare compare …` runs a matrix; `python -m amp_compare report DIR` re-renders.

compare validates the whole matrix before anything is written (bad input: one line, exit 2),
then runs each cell in its own child process with a progress bar, renders the report and
prints the summary table and the path of reports/<run-id>/index.html.

This module is the command line's declaration: the options (one declaration each, from which argparse, the
--config file's check and docs/OPTIONS.md are made), the parser and the exit codes. What runs them is
compare.py (`main`), which imports this module and never the other way round.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from amp_compare.contract.config import (
    DATASETS,
    DEFAULT_FRAMEWORKS,
    DEFAULT_PRECISIONS,
    DEVICES,
    FRAMEWORK_ALIASES,
    FRAMEWORKS,
    MODELS,
    PRECISIONS,
    STEPS,
    ConfigError,
    DataParallelOptions,
    Declared,
    declared,
    from_text,
    option,
    run_options,
    validate_options,
)

# Exit status of `compare` (documented in docs/RELIABILITY.md).
EXIT_OK = 0  # every cell finished (a diverged cell is a result: it finished)
EXIT_BAD_INPUT = 2  # refused before anything ran: nothing written
EXIT_CELLS_FAILED = 3  # the run completed but some cells failed, timed out or were unavailable
EXIT_REPORT_UNWRITTEN = 4  # the cells' records are kept but the disk filled while the report was written
EXIT_INTERRUPTED = 130  # Ctrl-C: finished cells kept, report rendered, resume command printed
EXIT_TERMINATED = 143  # SIGTERM: the same as Ctrl-C


@dataclass
class CompareOptions:
    """The harness's own options: the matrix axes, where results go, limits. Each cell's options are
    RunConfig's fields (contract/config.py); the command line and --config accept both."""

    frameworks: tuple[str, ...] = option(DEFAULT_FRAMEWORKS, "which frameworks: torch (native PyTorch) and the one "
                                         "Keras model on Keras' backends: tf (alias keras-tf), keras-jax, keras-torch",
                                         choices=FRAMEWORKS, aliases=FRAMEWORK_ALIASES)
    precisions: tuple[str, ...] = option(DEFAULT_PRECISIONS, "which precision modes", choices=PRECISIONS)
    models: tuple[str, ...] = option(("simple_cnn", "vit"), "which models", choices=MODELS,
                                     cpu=("simple_cnn", "vit"), cuda=("resnet18", "vit"))
    datasets: tuple[str, ...] = option(("digits",), "which datasets (cuda's default falls back to "
                                       "synthetic_cifar when CIFAR-10 cannot be had, and says so)",
                                       choices=DATASETS, cpu=("digits",), cuda=("cifar10",))
    seeds: tuple[int, ...] = option((0, 1, 2), "seeds; each seed is a cell (the report shows medians with "
                                 "interquartile ranges); on a CPU the vit runs seed 0 only unless seeds are given "
                                 "(DEFAULT_MODEL_SEEDS)", ge=0, cpu=(0, 1, 2), cuda=(0,))
    repeats: int | None = option(None, "N runs per cell with seeds 0..N-1 (instead of --seeds)", gt=0, le=1000)
    device: str = option("auto", "auto: cuda when an NVIDIA GPU is visible", choices=("auto", *DEVICES))
    timeout: float = option(1800.0, "seconds per cell before it is killed and recorded as failed", gt=0,
                            matrix=False)
    out: Path = option(Path("reports"), "folder for run folders", matrix=False)
    run_id: str | None = option(None, "name of the run folder", default_text="date-time-device")
    find_max_batch: bool = option(False, "also search, per framework x precision, the largest batch that trains "
                                  "under the memory cap")
    memory_cap: str | None = option(None, "--find-max-batch cap: CPU memory per probe process; on a GPU a cap on "
                                    "its memory, enforced on the device",
                                    default_text="4GiB on cpu, the GPU's whole memory on cuda")
    max_batch_limit: int = option(2**14, "largest batch --find-max-batch tries", gt=0)
    step: tuple[str, ...] = option(("plain",), "the training loop: plain (the tutorials' eager loop, default "
                                   "optimizer) or tuned (fused optimizer + torch.compile / CUDA graphs; Keras XLA); "
                                   "plain,tuned runs both side by side", choices=STEPS)
    batch_sizes: tuple[int, ...] | None = option(None, "a cell at each of these batch sizes (e.g. 64,256,1024) "
                                                 "instead of --batch-size: the speed-up-vs-batch figure", gt=0)
    config: Path | None = option(None, "JSON file of compare options (keys as the option names; the command "
                                 "line overrides it)", metavar="FILE")
    resume: str | None = option(None, "re-run only the missing, failed or incomplete cells of OUT/RUN_ID",
                                metavar="RUN_ID", matrix=False)
    figures: bool = option(True, "draw the report's figures (PNG + SVG, about 10-20 s of CPU); --no-figures writes "
                           "the tables, findings and data only, and `report RUN` draws them later", matrix=False)


def compare_options() -> dict[str, Declared]:
    """Every option of `compare`: the harness's, then each cell's (RunConfig fields with cli=True)."""
    from amp_compare.harness.run.launchers import LauncherOptions

    harness = {**declared(CompareOptions), **declared(DataParallelOptions),  # DATA PARALLEL: --allreduce
               **declared(LauncherOptions)}  # where the cells run (harness/run/launchers.py)
    return {**harness, **{n: d for n, d in run_options().items() if d.spec.cli and n not in harness}}


NOT_IN_CONFIG_FILE = ("config", "resume")
PATH_OPTIONS = tuple(n for n, d in compare_options().items() if d.item is Path or d.spec.path)
# Options that define the matrix: with --resume the run's own saved configuration is used instead.
MATRIX_OPTIONS = tuple(n for n, d in compare_options().items() if d.spec.matrix)


def default_text(d: Declared) -> str:
    """A default as help and docs/OPTIONS.md show it."""
    def show(v):
        if isinstance(v, bool):
            return "on" if v else "off"
        if isinstance(v, tuple):
            return ",".join(map(str, v)) or "none"
        if isinstance(v, float):
            return f"{v:g}"
        return "none" if v is None else str(v)

    if d.spec.default_text:
        return d.spec.default_text
    if d.spec.per_device:
        return ", ".join(f"{show(v)} on {dev}" for dev, v in d.spec.per_device.items())
    return show(d.default)


def help_text(d: Declared) -> str:
    choices = f"; one of {', '.join(map(str, d.spec.choices))}" if d.spec.choices else ""
    if d.is_list:
        choices = f"; comma list{choices.replace('; one', ', each one')}"
    return f"{d.spec.help}{choices} (default: {default_text(d)})".replace("%", "%%")


OPTIONS_MARKERS = ("<!-- options: generated from the declaration -->", "<!-- end of options -->")
OPTIONS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "OPTIONS.md"


def options_markdown() -> str:
    """docs/OPTIONS.md's table, from the declaration (tests/test_cli.py checks the page holds it)."""
    rows = ["| option | default | valid values | what it does |", "|---|---|---|---|"]
    for d in compare_options().values():
        flag = f"`{d.flag}` / `--no-{d.flag[2:]}`" if d.item is bool else f"`{d.flag}`"
        cells = [flag, default_text(d), d.describe(), d.spec.help]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def update_options_page(path: Path = OPTIONS_PAGE) -> None:
    """Rewrite docs/OPTIONS.md's table from the declaration."""
    text = path.read_text()
    start, end = OPTIONS_MARKERS
    head, rest = text.split(start)
    path.write_text(f"{head}{start}\n{options_markdown()}{end}{rest.split(end)[1]}")


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage over several)
        print(f"amp-compare: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> ArgumentParser:
    """argparse generated from the declared options; an option not given is absent from the result."""
    parser = ArgumentParser(prog="amp-compare", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    c = sub.add_parser("compare", help="train the matrix in both frameworks and write a report",
                       argument_default=argparse.SUPPRESS)
    for d in compare_options().values():
        kwargs: dict = {"help": help_text(d)}
        if d.item is bool and not d.is_list:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = d.item if d.item in (int, float) and not d.is_list else str
            kwargs["metavar"] = d.spec.metavar or d.name.upper()
        c.add_argument(d.flag, dest=d.name, **kwargs)
    r = sub.add_parser("report", help="re-render the report of one or more run folders")
    r.add_argument("run_dirs", nargs="+", type=absolute_path)  # the user's folder, not the children's
    figures = compare_options()["figures"]  # the same declared option as compare's
    r.add_argument(figures.flag, dest=figures.name, action=argparse.BooleanOptionalAction, default=figures.default,
                   help=help_text(figures))
    return parser


def load_config_file(path: Path) -> dict:
    """Compare options from a JSON object (keys as the option names), typed as strictly as the command
    line: a string is never a number or a boolean, null only where an option allows it."""
    options = compare_options()
    valid = sorted(n for n in options if n not in NOT_IN_CONFIG_FILE)
    try:
        values = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"malformed config file {str(path)!r}: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a JSON object of options")
    values = {k.replace("-", "_"): v for k, v in values.items()}
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} in config file {str(path)!r} "
                          f"(valid: {', '.join(valid)})")
    values = {k: from_text(options[k], v) for k, v in values.items()}
    try:
        validate_options(options, {**{n: d.default_for("cpu") for n, d in options.items()}, **values})
    except ConfigError as exc:
        raise ConfigError(f"{exc} (in config file {str(path)!r})") from None
    return values


def compare_settings(args: argparse.Namespace) -> argparse.Namespace:
    """Every compare option: the command line over the --config file over the declared defaults (per
    resolved device), validated before anything runs. `given` holds the options the user set."""
    options = compare_options()
    cli = {k: from_text(options[k], v) for k, v in vars(args).items() if k in options}
    given = {**(load_config_file(cli["config"]) if cli.get("config") else {}), **cli}
    requested = given.get("device", "auto")
    validate_options({"device": options["device"]}, {"device": requested})
    device = resolve_device(requested)
    values = validate_options(options, {**{n: d.default_for(device) for n, d in options.items()}, **given})
    return argparse.Namespace(**absolute_paths(values), command="compare", given=set(given), resolved_device=device)


def absolute_path(text: str) -> Path:
    """A path from the command line resolved against the user's working directory (the children run elsewhere)."""
    return Path(text).expanduser().absolute()


def absolute_paths(values: dict) -> dict:
    """The path options (declared Path, or path=True) resolved against the user's working directory: the children run
    in the project's folder (harness/run/runner.py), so a relative --out or --data-dir would name another folder."""
    resolved = dict(values)
    for name in PATH_OPTIONS:
        if resolved.get(name) is not None:
            path = absolute_path(resolved[name])
            resolved[name] = path if isinstance(values[name], Path) else str(path)
    return resolved


def resolve_device(requested: str) -> str:
    from amp_compare.contract.env import nvidia_gpu_present

    if requested not in ("auto", *DEVICES):
        raise ConfigError(f"unknown device {requested!r} (valid: auto, {', '.join(DEVICES)})")
    has_gpu = nvidia_gpu_present()
    if requested == "cuda" and not has_gpu:
        raise ConfigError("device 'cuda' requested but no NVIDIA GPU is visible (valid here: auto, cpu)")
    if requested == "auto":
        return "cuda" if has_gpu else "cpu"
    return requested


