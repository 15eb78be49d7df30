"""The GPU check in one command: the `gpu` test suite, then the plain/tuned speed table, on a CUDA machine.

The machine needs an NVIDIA driver, Python >= 3.11 with pip, and torch and JAX as CUDA builds (what the check
measures: it never installs a framework). It may have no package index; what else it lacks comes in a wheelhouse
(benchmarks/wheelhouse.py) made where there is one:

  there:  python3 -m pip list --format=freeze > target-packages.txt        (and `python3 --version`)
  here:   python benchmarks/gpu_check.py prepare --installed target-packages.txt --python-version 3.12
  there, in a copy of the checkout with its wheelhouse/:  python3 benchmarks/gpu_check.py run --out gpu-check

`run` (the standard library and pip until its install) installs from the wheelhouse, runs `pytest -m gpu tests/gpu`
with AMP_COMPARE_REQUIRE_GPU=1 (a missing GPU or framework fails, not skips), then PHASES: each a real compare
beside the reference loop it is judged against (benchmarks/reference_loops.py). It writes OUTPUT_FILES into --out
(check.md: phases, table, targets, what did not run) and the compare runs into --work. `run --device cpu --smoke
--no-install`: the same with tiny settings on a CPU. `table RUN_DIR...`: the table of earlier compare runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: benchmarks.* from the checkout

from benchmarks import wheelhouse  # noqa: E402
from benchmarks.gpu_table import build_table, package, read_runs, table_markdown, targets  # noqa: E402

OUTPUT_FILES = ("check.md", "table.csv", "runs.csv", "pytest.txt", "log.txt", "env.json")  # pytest.txt: if run


@dataclass(frozen=True)
class Phase:
    """One step of `run`: the gpu tests (no frameworks), or one compare beside its reference loop (if any)."""

    name: str
    limit_s: float  # stopped after this long
    min_s: float  # not started with less than this left
    frameworks: str = ""
    steps: str = "plain"
    batch: int = 256
    epochs: int = 3  # batch 256: 39 steps an epoch, 1024: 9; less 10 warm-up steps: 107 and 26 timed steps (4 epochs)
    reference: str = ""  # "torch": the tutorial loop; "keras": a bare Keras fit on JAX
    cuda_only: str = ""  # why a CPU smoke run skips it


PHASES = (  # most important first: the budget cuts from the end
    Phase("tests", 300, 60),
    Phase("torch-256", 300, 120, "torch", "plain,tuned", reference="torch"),
    Phase("keras-jax-256", 200, 90, "keras-jax", reference="keras"),
    Phase("torch-1024", 300, 120, "torch", "plain,tuned", 1024, 4, "torch"),
    Phase("keras-torch-256", 150, 60, "keras-torch"),
    Phase("keras-jax-1024", 200, 90, "keras-jax", batch=1024, epochs=4, reference="keras"),
    Phase("keras-torch-tuned", 240, 90, "keras-torch", "tuned",
          cuda_only="Keras' torch.compile step is a GPU figure; on a CPU it compiles for minutes"),
)
PHASE_NAMES = tuple(p.name for p in PHASES)
GPU = {"model": "resnet18", "dataset": "synthetic_cifar", "precisions": "fp32,fp16,bf16", "warmup": 10}
SMOKE = {"model": "simple_cnn", "dataset": "synthetic", "precisions": "fp32,bf16", "warmup": 1, "steps_per_epoch": 3,
         "batch": {256: 16, 1024: 32}, "epochs": 2, "limit_scale": 4, "min_scale": 0.1}
RESERVE_S, REFERENCE_S, GRACE_S = 20, 60, 60  # for the outputs; for a phase's reference; after SIGTERM


def limit_for(phase: Phase, device: str, smoke: bool, left: float) -> tuple[float, str]:
    """The phase's time limit with `left` seconds of the budget left, or (0, why it is skipped)."""
    s = SMOKE if smoke else {}
    left -= RESERVE_S
    if device != "cuda" and phase.cuda_only:
        return 0, f"needs CUDA: {phase.cuda_only}"
    if left < phase.min_s * s.get("min_scale", 1):
        return 0, f"budget: {max(0, left):.0f} s left, the phase needs at least {phase.min_s:.0f} s"
    return min(phase.limit_s * s.get("limit_scale", 1), left), ""


@dataclass
class Result:
    name: str
    status: str  # ok | failed | cut short
    seconds: float = 0.0
    note: str = ""
    run_dir: Path | None = None
    references: list = field(default_factory=list)


def run_limited(cmd: list[str], env: dict, limit_s: float, out: Path, log: list, grace_s: float = GRACE_S):
    """cmd with its output in `out`; SIGTERM at limit_s (a compare keeps its finished cells and renders), its
    whole tree killed grace_s later. Returns (exit code, seconds, whether it was stopped)."""
    start, stopped = time.monotonic(), False
    with open(out, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            stopped = True
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                package().kill_tree(proc.pid)
                proc.wait()
    seconds = time.monotonic() - start
    log.append(f"==== exit {proc.returncode}{' (stopped at its time limit)' * stopped} after {seconds:.0f} s\n$ "
               + " ".join(cmd) + "\n" + out.read_text(errors="replace")[-20000:])
    return proc.returncode, seconds, stopped


def child_env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


def tests_phase(phase: Phase, device: str, limit_s: float, work: Path, log: list) -> Result:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-p", "no:cacheprovider", "--durations=15"]
    env = child_env()
    if device == "cuda":
        env["AMP_COMPARE_REQUIRE_GPU"] = "1"
        if importlib.util.find_spec("xdist"):  # the four files side by side on the one GPU
            cmd += ["-n", "4", "--dist", "loadfile"]
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # JAX's 75% of the GPU at start would starve the others
    code, seconds, stopped = run_limited(cmd, env, limit_s, work / "pytest.txt", log)
    tail = [ln for ln in (work / "pytest.txt").read_text(errors="replace").splitlines()
            if re.search(r"\b(passed|failed|skipped|errors?)\b", ln)]
    return Result(phase.name, "cut short" if stopped else "ok" if code == 0 else "failed", seconds,
                  tail[-1].strip("= ") if tail else f"exit {code}")


def compare_phase(phase: Phase, device: str, s: dict, limit_s: float, work: Path, log: list, end: float) -> Result:
    """One compare run within limit_s less REFERENCE_S, then its reference loop in what is left."""
    steps, notes, start = phase.steps.split(","), [], time.monotonic()
    if device != "cuda" and "tuned" in steps:
        steps, notes = [x for x in steps if x != "tuned"], ["tuned loop skipped: its CUDA graphs need a GPU"]
    sizes = {"--batch-size": s.get("batch", {}).get(phase.batch, phase.batch),
             "--epochs": s.get("epochs", phase.epochs), "--steps-per-epoch": s.get("steps_per_epoch")}
    shared = ["--device", device, "--precisions", s["precisions"], *[str(a) for k, v in sizes.items() if v
                                                                     for a in (k, v)]]
    cmd = [sys.executable, "-m", "amp_compare", "compare", *shared, "--frameworks", phase.frameworks,
           "--step", ",".join(steps), "--models", s["model"], "--width", "64", "--datasets", s["dataset"],
           "--seeds", "0", "--warmup-steps", str(s["warmup"]), "--tf32", "off", "--no-augment", "--no-figures",
           "--timeout", str(int(max(60, min(400, limit_s)))), "--out", str(work / "runs"), "--run-id", phase.name]
    code, _, stopped = run_limited(cmd, child_env(), limit_s - REFERENCE_S * bool(phase.reference),
                                   work / f"{phase.name}.out", log)
    result = Result(phase.name, "cut short" if stopped else "ok" if code == 0 else "failed",
                    run_dir=work / "runs" / phase.name)
    notes += [f"compare exited {code} (3: some cells failed; see log.txt)"] * (code not in (0, None) and not stopped)
    left = min(limit_s - (time.monotonic() - start), end - time.monotonic())
    if phase.reference and left < 20:
        notes.append(f"{phase.reference} reference skipped: {left:.0f} s left")
    elif phase.reference:
        cmd = [sys.executable, "-m", "benchmarks.reference_loops", phase.reference, *shared, "--model", s["model"],
               "--dataset", s["dataset"], "--warmup", str(s["warmup"])]
        result.references, note = reference(phase, cmd, s["precisions"].split(","), left, work, log)
        notes += [note] * bool(note)
    result.seconds, result.note = time.monotonic() - start, "; ".join(notes)
    return result


def reference(phase: Phase, cmd: list[str], precisions: list[str], limit_s: float, work: Path, log: list):
    """The reference loop's JSON lines, and what it did not finish."""
    env = child_env(**({"KERAS_BACKEND": "jax"} if phase.reference == "keras" else {}),
                    **({"JAX_PLATFORMS": "cpu"} if "cpu" in cmd else {}))
    out = work / f"{phase.name}-reference.out"
    code, _, stopped = run_limited(cmd, env, limit_s, out, log)
    rows = [{**json.loads(ln), "phase": phase.name} for ln in out.read_text(errors="replace").splitlines()
            if ln.startswith('{"reference"')]
    missing = [p for p in precisions if p not in {r["precision"] for r in rows}]
    return rows, (f"{phase.reference} reference {'stopped at its time limit' if stopped else f'exited {code}'} "
                  f"before {', '.join(missing)}") * bool(missing)


def environment(device: str) -> dict:
    """Versions (package metadata: nothing imported), the GPU as nvidia-smi names it, the host CPU."""
    versions = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = re.search(r"model name\s*: (.*)", cpuinfo)
    smi = ["nvidia-smi", "--format=csv,noheader", "--query-gpu=name,driver_version,memory.total,clocks.max.sm"]
    return {"device": device, "started": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
            "cpu": cpu.group(1) if cpu else platform.processor(), "python": platform.python_version(),
            "versions": {n: versions.get(n) for n in ("torch", "jax", "jaxlib", "keras", "pydantic", "numpy")},
            "gpu": shutil.which(smi[0]) and subprocess.run(smi, capture_output=True, text=True).stdout.strip()}


def check_markdown(table, runs, results: list[Result], skipped: list, info: dict, smoke: bool) -> str:
    s, failed = SMOKE if smoke else GPU, runs[runs["status"] != "ok"] if "status" in runs else runs
    rest = [name for name, _ in skipped] + [r.name for r in results if r.status == "cut short"]
    return "\n".join([
        f"# amp-compare GPU check ({info['gpu'] or info['device']})", "",
        f"`{' '.join(sys.argv)}` · started {info['started']} · {info['elapsed_s']} s · host CPU: {info['cpu']} "
        f"({info['cpus']} cores)" + " · SMOKE RUN: tiny settings on a CPU, no GPU figure" * smoke, "",
        "Every figure below comes from this run's records (runs.csv: every column); nothing is estimated.", "",
        "## Phases", "", "| phase | status | seconds | note |", "|---|---|---|---|",
        *[f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.note or '—'} |" for r in results],
        *[f"| {name} | skipped | 0 | {why} |" for name, why in skipped], "", "## Table", "",
        f"{s['model']} (width 64), {s['dataset']}, TF32 off, no augmentation, one seed; the report's own summary "
        "columns, with the speed over the plain loop's fp32 cell and the reference run in the same call: the "
        "tutorial's loop (torch plain rows) or a bare Keras fit (keras-jax rows), same model and data.", "",
        table_markdown(table) if len(table) else "(no compare phase produced a cell)",
        *[f"- failed: {r.framework} {r.precision} ({r.cell_id}): {str(r.error)[:200]}" for r in failed.itertuples()],
        "", "## Targets (an H100-class GPU)", "", "| target | verdict | figures |", "|---|---|---|",
        *[f"| {name} | {verdict} | {figures or '—'} |" for name, verdict, figures in targets(table)],
        *["", "## Not finished", "", "`python3 benchmarks/gpu_check.py run --out NEW_FOLDER --phases "
          f"{','.join(dict.fromkeys(rest))}`"] * bool(rest), ""])


def write_outputs(out: Path, results: list[Result], skipped: list, info: dict, log: list, smoke: bool) -> None:
    done = [r for r in results if r.run_dir]
    runs = read_runs([r.run_dir for r in done], [r.name for r in done])
    info["references"] = [ref for r in results for ref in r.references]
    table = build_table(runs, info["references"])
    table.to_csv(out / "table.csv", index=False)
    runs.drop(columns=["val_correct"], errors="ignore").to_csv(out / "runs.csv", index=False)
    (out / "log.txt").write_text("\n".join(log))
    info["phases"] = [{"name": r.name, "status": r.status, "seconds": round(r.seconds, 1), "note": r.note}
                      for r in results]
    (out / "env.json").write_text(json.dumps(info, indent=2, default=str))
    (out / "check.md").write_text(check_markdown(table, runs, results, skipped, info, smoke))


def run(args) -> int:
    started, out, log = time.monotonic(), Path(args.out), []
    names = args.phases.split(",") if args.phases else ["tests", "torch-256"] if args.smoke else list(PHASE_NAMES)
    unknown = [n for n in names if n not in PHASE_NAMES]
    error = (f"unknown phase {unknown[0]!r} (valid: {', '.join(PHASE_NAMES)})" if unknown else
             f"--budget-s must be positive, got {args.budget_s:g}" if args.budget_s <= 0 else
             f"output folder {str(out)!r} is not empty (valid: a new or empty folder)"
             if out.exists() and any(out.iterdir()) else "")
    if error:
        print(f"gpu_check: error: {error}", file=sys.stderr)
        return 2
    if not (args.no_install or wheelhouse.install(args.wheelhouse, log)):
        return 1
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="amp-compare-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    info = {**environment(args.device), "smoke": args.smoke, "work": str(work)}
    results, skipped, end = [], [], started + args.budget_s
    for phase in (p for p in PHASES if p.name in names):
        limit, why = limit_for(phase, args.device, args.smoke, end - time.monotonic())
        if not limit:
            skipped.append((phase.name, why))
            continue
        results.append(tests_phase(phase, args.device, limit, out, log) if phase.name == "tests" else compare_phase(
            phase, args.device, SMOKE if args.smoke else GPU, limit, work, log, end - RESERVE_S))
        print(f"gpu_check: phase {phase.name}: {results[-1].status} in {results[-1].seconds:.0f} s "
              f"{results[-1].note}", flush=True)
    info["elapsed_s"] = round(time.monotonic() - started, 1)
    write_outputs(out, results, skipped, info, log, args.smoke)
    print((out / "check.md").read_text())
    return 0 if all(r.status == "ok" for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="download what the target lacks into a wheelhouse (needs a package index)")
    p.add_argument("--installed", type=Path, required=True, help="the target's `pip list --format=freeze` output")
    p.add_argument("--python-version", required=True, help="the target's Python, e.g. 3.12")
    p.add_argument("--platform", action="append", help=f"repeatable (default: {', '.join(wheelhouse.PLATFORMS)})")
    p.add_argument("--dest", type=Path, default=wheelhouse.WHEELHOUSE, help="the wheelhouse (default wheelhouse/)")
    r = sub.add_parser("run", help="install from the wheelhouse, run the gpu tests and the table, write --out")
    r.add_argument("--out", type=Path, required=True, help="folder for the check's few files (new or empty)")
    r.add_argument("--work", help="folder for the compare runs (default: a new temporary folder)")
    r.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    r.add_argument("--smoke", action="store_true", help="tiny settings (a CPU test of the plumbing)")
    r.add_argument("--phases", help=f"comma list, run in this order (default: all): {','.join(PHASE_NAMES)}")
    r.add_argument("--budget-s", type=float, default=float("inf"),
                   help="seconds for the whole check: phases that do not fit are skipped")
    r.add_argument("--wheelhouse", type=Path, default=wheelhouse.WHEELHOUSE, help="default wheelhouse/")
    r.add_argument("--no-install", action="store_true", help="use the packages already there")
    t = sub.add_parser("table", help="the table from compare run folders made earlier")
    t.add_argument("run_dirs", nargs="+", type=Path)
    t.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return wheelhouse.prepare(args.installed, args.python_version, args.dest, args.platform or wheelhouse.PLATFORMS)
    if args.command == "run":
        return run(args)
    table = build_table(read_runs(args.run_dirs), [])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "table.csv", index=False)
    print(table_markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
