"""The GPU check of issue 26 in one command: the `gpu` test suite, then the one-run speed table, on a bare GPU machine.

Two steps, on two machines:

  python benchmarks/gpu_check.py prepare
      HERE (PyPI reachable): downloads into .whl/ (git-ignored) the wheels, for CPython 3.12 on manylinux x86_64,
      of the packages the project imports that the lent GPU image lacks (WHEELS: Keras and pydantic with their
      needs), and checks every wheel's Requires-Dist against the image's package list (IMAGE_PACKAGES).

  python3 benchmarks/gpu_check.py run --out $OUT/gpu-check
      THERE (torch and JAX, no TensorFlow, no package index), in the repository root with .whl carried:
      1. install the carried wheels into a target folder (--site) put on PYTHONPATH for every child;
      2. `pytest -m gpu tests/gpu` with AMP_COMPARE_REQUIRE_GPU=1 (a missing GPU or Keras fails there, not skips);
      3. the table of issue 26 item 3, phase by phase (PHASES, most important first): each phase is a real
         `python -m amp_compare compare` (resnet18, CIFAR-shaped synthetic data, TF32 off, fp32/fp16/bf16) plus, in
         the same call, the plain reference loop (torch) or a bare Keras `fit` (keras-jax) it is judged against;
      4. writes at most 8 small files into --out: check.md (what ran, the table, the targets met or missed, what
         was skipped and the command that runs it), table.csv, runs.csv (every run-table row, all columns),
         summaries.md (each phase's report summary), pytest.txt, log.txt, env.json. The report folders themselves
         (figures, init weights, parquet) stay in --work.
      The whole check keeps to --budget-s (default 540 s, inside the device tool's 10-minute call): a phase starts
      only with its minimum time left and is stopped (SIGTERM: the harness keeps every finished cell and renders)
      at its own limit or the budget's end; check.md lists what was skipped or cut short.

  python benchmarks/gpu_check.py run --device cpu --smoke --no-install --out DIR
      The same phases with tiny settings on a CPU, to test the plumbing (tests/test_gpu_check.py); what needs CUDA
      (the tuned loop's CUDA graphs) is skipped and check.md says so.

  python benchmarks/gpu_check.py table RUN_DIR [RUN_DIR ...] [--out DIR]
      The table (table.csv, and Markdown on stdout) from compare run folders made earlier.

`run` itself needs only the standard library and pandas (the image has both): it imports no framework and not
amp_compare (whose pydantic arrives with the wheels); the reference loops run as children of this file
(`reference-torch`, `reference-keras`) with the installed wheels on their path.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEEL_DIR = ROOT / ".whl"

# --- prepare ------------------------------------------------------------------------------------------------------

# What the project imports (pyproject's dependencies and the compare/jax extras, the tests' imports) that the lent
# GPU image lacks (/work/.library/device/KINDS.md, "Python packages already there"), with what those need that the
# image lacks in turn. Versions: the ones the project's own environment runs (.nox/frameworks), so the GPU runs
# the code the CPU suite tested. typing-extensions is on the image, but pydantic 2.14 needs >= 4.16.0 and the
# image's version is not listed: carried, it shadows the image's (a newer typing-extensions only adds).
WHEELS = {
    "keras": "3.15.1",
    "namex": "0.1.0",
    "optree": "0.20.0",
    "pydantic": "2.14.3",
    "pydantic-core": "2.50.4",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "typing-extensions": "4.16.0",
}
# The lent GPU image's Python packages (KINDS.md, read on a machine running it on 2026-11-17), normalised names.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp""".split())
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> tuple[str, str]:
    """(normalised distribution name, version) from a wheel's file name."""
    name, version = path.name.split("-")[:2]
    return normalise(name), version


def requires_dist(path: Path) -> list[str]:
    """A wheel's Requires-Dist lines that apply to CPython 3.12 on Linux x86_64 without extras."""
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = [line.split(":", 1)[1].strip() for line in zf.read(meta).decode().splitlines()
                 if line.startswith("Requires-Dist:")]
    try:
        from packaging.requirements import Requirement
    except ImportError:  # no packaging: keep what has no environment marker
        return [line for line in lines if ";" not in line]
    return [line for line in lines if Requirement(line).marker is None or Requirement(line).marker.evaluate(TARGET_ENV)]


def unmet_requirements(wheels: list[Path]) -> list[str]:
    """Requirements of the carried wheels that neither another carried wheel nor the image provides."""
    carried = {wheel_name(p)[0] for p in wheels}
    unmet = []
    for path in wheels:
        for req in requires_dist(path):
            name = normalise(re.match(r"[A-Za-z0-9._-]+", req).group(0))
            if name not in carried and name not in IMAGE_PACKAGES:
                unmet.append(f"{path.name} needs {req}")
    return unmet


def prepare(dest: Path, dry_run: bool = False) -> int:
    """Download WHEELS into dest (one version of each: other versions there are removed), check their needs."""
    specs = [f"{name}=={version}" for name, version in WHEELS.items()]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest), *specs]
    print(" ".join(cmd))
    if dry_run:
        return 0
    dest.mkdir(parents=True, exist_ok=True)
    if subprocess.run(cmd).returncode != 0:
        print("gpu_check prepare: pip download failed (see above)", file=sys.stderr)
        return 1
    wanted = {normalise(n): v for n, v in WHEELS.items()}
    for path in sorted(dest.glob("*.whl")):
        name, version = wheel_name(path)
        if wanted.get(name) != version:  # an older download, or a stray wheel: two versions stop the install there
            print(f"removing {path.name} (not one of WHEELS)")
            path.unlink()
    wheels = sorted(dest.glob("*.whl"))
    missing = sorted(set(wanted) - {wheel_name(p)[0] for p in wheels})
    unmet = unmet_requirements(wheels)
    total = sum(p.stat().st_size for p in wheels)
    for path in wheels:
        print(f"{path.stat().st_size / 2**20:8.2f} MiB  {path.name}")
    print(f"{total / 2**20:8.2f} MiB  in {len(wheels)} wheels in {dest} (the device call carries at most 64 MiB)")
    if missing or unmet:
        print("gpu_check prepare: " + "; ".join([f"missing: {', '.join(missing)}"] * bool(missing) + unmet),
              file=sys.stderr)
        return 1
    print("every Requires-Dist of these wheels is another of them or on the GPU image (versions of the image's own "
          "packages are not listed there, so not checked)")
    return 0


# --- run: phases ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    """One step of `run`. kind "tests": the gpu suite; "compare": one compare run (+ its reference, if any)."""

    name: str
    kind: str
    limit_s: float  # stopped after this long
    min_s: float  # not started with less than this left
    frameworks: str = ""
    steps: str = "plain"
    batch: int = 256
    epochs: int = 3
    reference: str = ""  # "torch": the plain reference loop; "keras-jax": a bare Keras fit on JAX
    cuda_only: str = ""  # why this phase needs CUDA ("" when a CPU smoke run can do it)
    what: str = ""


# Most important first (issue 26 item 3's targets): the budget cuts from the end. Epochs: at batch 256 the 10,000
# training images of synthetic_cifar are 39 steps an epoch, at 1024 nine; WARMUP steps (compilation, CUDA-graph
# capture) are excluded, so 3 and 4 epochs leave 107 and 26 timed steps (the report flags fewer than 20).
WARMUP = 10
PHASES = (
    Phase("tests", "tests", limit_s=300, min_s=60, what="pytest -m gpu tests/gpu"),
    Phase("torch-256", "compare", limit_s=300, min_s=120, frameworks="torch", steps="plain,tuned", batch=256,
          epochs=3, reference="torch", what="torch plain vs tuned at batch 256, and the plain reference loop"),
    Phase("keras-jax-256", "compare", limit_s=200, min_s=90, frameworks="keras-jax", batch=256, epochs=3,
          reference="keras-jax", what="Keras on JAX at batch 256, and a bare Keras fit on JAX"),
    Phase("torch-1024", "compare", limit_s=300, min_s=120, frameworks="torch", steps="plain,tuned", batch=1024,
          epochs=4, reference="torch", what="torch plain vs tuned at batch 1024 (the MFU target), reference loop"),
    Phase("keras-torch-256", "compare", limit_s=150, min_s=60, frameworks="keras-torch", batch=256, epochs=3,
          what="Keras on torch at batch 256"),
    Phase("keras-jax-1024", "compare", limit_s=200, min_s=90, frameworks="keras-jax", batch=1024, epochs=4,
          reference="keras-jax", what="Keras on JAX at batch 1024, and a bare Keras fit"),
    Phase("keras-torch-tuned", "compare", limit_s=240, min_s=90, frameworks="keras-torch", steps="tuned", batch=256,
          epochs=3, cuda_only="Keras' torch.compile step is a GPU figure; on a CPU it compiles for minutes",
          what="Keras on torch, tuned (jit_compile: torch.compile) at batch 256"),
)
PHASE_NAMES = tuple(p.name for p in PHASES)
SMOKE_PHASES = ("tests", "torch-256")
SMOKE_LIMIT_SCALE = 4
PRECISIONS = ("fp32", "fp16", "bf16")
RESERVE_S = 20  # kept back at the end for writing the outputs
REFERENCE_S = 60  # kept back in a phase for its reference loop (one process, three precisions, ~120 short steps each)
GRACE_S = 60  # after SIGTERM, how long a compare may take to record and render before it is killed
TOKEN_VAR = "AMP_COMPARE_GPU_CHECK_TOKEN"  # every process a phase starts inherits it: leftovers are found by it
OUTPUT_FILES = ("check.md", "table.csv", "runs.csv", "summaries.md", "pytest.txt", "log.txt", "env.json")


@dataclass
class Settings:
    """What a phase's compare and reference runs are given (the GPU's, or --smoke's tiny ones on a CPU)."""

    device: str
    model: str = "resnet18"
    dataset: str = "synthetic_cifar"
    precisions: tuple[str, ...] = PRECISIONS
    warmup: int = WARMUP
    steps_per_epoch: int | None = None
    batch: dict = field(default_factory=dict)  # phase batch -> the batch used (smoke: tiny)
    epochs: int | None = None  # None: the phase's own

    @classmethod
    def for_run(cls, device: str, smoke: bool) -> Settings:
        if not smoke:
            return cls(device)
        return cls(device, model="simple_cnn", dataset="synthetic", precisions=("fp32", "bf16"), warmup=1,
                   steps_per_epoch=3, batch={256: 16, 1024: 32}, epochs=2)

    def batch_for(self, phase: Phase) -> int:
        return self.batch.get(phase.batch, phase.batch)

    def epochs_for(self, phase: Phase) -> int:
        return self.epochs or phase.epochs


@dataclass
class PhaseResult:
    name: str
    status: str  # ok | failed | cut short | skipped
    seconds: float = 0.0
    note: str = ""
    run_dir: Path | None = None
    references: list = field(default_factory=list)


class Log:
    """log.txt: every command a phase ran, with its output's tail."""

    def __init__(self):
        self.parts: list[str] = []

    def add(self, title: str, text: str = "", limit: int = 20000) -> None:
        text = text if len(text) <= limit else f"[... {len(text) - limit} characters left out ...]\n" + text[-limit:]
        self.parts.append(f"==== {title}\n{text}".rstrip() + "\n")
        print(f"gpu_check: {title}", flush=True)

    def text(self) -> str:
        return "\n".join(self.parts)


def kill_marked(token: str) -> list[int]:
    """SIGKILL every process that inherited this phase's token (its descendants, whatever session they started):
    a stopped phase leaves no training child holding the GPU for the next one."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"{TOKEN_VAR}={token}".encode() in environ.split(b"\0"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except OSError:
                pass
    return killed


def run_limited(cmd: list[str], env: dict, limit_s: float, out_path: Path, log: Log, title: str,
                cwd: Path = ROOT) -> tuple[int | None, float, bool]:
    """Run cmd with its output in out_path; SIGTERM at limit_s, SIGKILL (its whole marked tree) GRACE_S later.
    Returns (exit code or None when killed, seconds, whether it was stopped)."""
    token = uuid.uuid4().hex
    env = {**env, TOKEN_VAR: token, "PYTHONUNBUFFERED": "1"}
    start, stopped = time.monotonic(), False
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            stopped = True
            proc.send_signal(signal.SIGTERM)  # compare: keeps finished cells, renders, exits 143
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            kill_marked(token)
    seconds = time.monotonic() - start
    log.add(f"{title}: exit {proc.returncode}{' (stopped at its time limit)' if stopped else ''} after {seconds:.0f} s"
            f"\n$ {' '.join(cmd)}", out_path.read_text(errors="replace"))
    return proc.returncode, seconds, stopped


def child_env(site: Path | None) -> dict:
    """The environment of every child: the installed wheels first on the path, then the project."""
    env = dict(os.environ)
    paths = [str(site)] if site is not None else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), *filter(None, [env.get("PYTHONPATH", "")])])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def install(wheels: Path, site: Path, log: Log, dry_run: bool) -> dict:
    """Install the carried wheels into site (no index, no dependencies: they are all carried)."""
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        return {"status": "skipped", "note": f"no wheels in {wheels}: nothing installed (the image's packages only)"}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *map(str, files)]
    if dry_run:
        log.add("install (dry run)", " ".join(cmd))
        return {"status": "dry run", "note": " ".join(cmd), "wheels": [p.name for p in files]}
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.add(f"install: exit {proc.returncode}\n$ {' '.join(cmd)}", proc.stdout + proc.stderr)
    return {"status": "ok" if proc.returncode == 0 else "failed", "wheels": [p.name for p in files],
            "note": (proc.stdout + proc.stderr)[-2000:]}


VERSION_PROBE = """
import importlib.metadata as m, json, platform
names = ["torch", "jax", "jaxlib", "keras", "pydantic", "pydantic-core", "optree", "numpy", "pandas", "pyarrow",
         "tensorflow", "typing-extensions", "pytest", "pytest-xdist"]
def version(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return None
print(json.dumps({"python": platform.python_version(), **{n: version(n) for n in names}}))
"""


def environment(env: dict, device: str) -> dict:
    """Versions (from package metadata, nothing heavy imported) and the GPU as nvidia-smi names it."""
    info: dict = {"device": device, "started": datetime.now(UTC).isoformat(timespec="seconds")}
    proc = subprocess.run([sys.executable, "-c", VERSION_PROBE], env=env, capture_output=True, text=True, timeout=120)
    try:
        info["versions"] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info["versions"] = {"error": proc.stderr[-1000:]}
    smi = shutil.which("nvidia-smi")
    if smi:
        query = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
        info["gpu"] = query.stdout.strip() or query.stderr.strip()
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                           if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = ""
    info["cpus"] = len(os.sched_getaffinity(0))
    return info


def tests_phase(phase: Phase, settings: Settings, env: dict, limit_s: float, work: Path, log: Log) -> PhaseResult:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-p", "no:cacheprovider", "--durations=15"]
    env = dict(env)
    if settings.device == "cuda":
        env["AMP_COMPARE_REQUIRE_GPU"] = "1"
        if env_has(env, "xdist"):  # the four files in parallel: the GPU is shared, the host has 16 cores
            cmd += ["-n", "4", "--dist", "loadfile"]
            # JAX takes 75% of the GPU's memory when it starts; beside three other files' processes it may not
            # find it. Its recorded peak (peak_bytes_in_use) counts buffers in use, whatever it preallocated.
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    out = work / "pytest.txt"
    code, seconds, stopped = run_limited(cmd, env, limit_s, out, log, f"phase {phase.name}")
    text = out.read_text(errors="replace")
    tail = [line for line in text.splitlines() if re.search(r"\b(passed|failed|skipped|error|errors)\b", line)]
    summary = tail[-1].strip("= ") if tail else f"exit {code}"
    status = "cut short" if stopped else "ok" if code == 0 else "failed"
    return PhaseResult(phase.name, status, seconds, summary)


def env_has(env: dict, module: str) -> bool:
    proc = subprocess.run([sys.executable, "-c", f"import importlib.util, sys; "
                           f"sys.exit(importlib.util.find_spec({module!r}) is None)"], env=env, capture_output=True)
    return proc.returncode == 0


def compare_phase(phase: Phase, settings: Settings, env: dict, limit_s: float, work: Path, log: Log,
                  deadline: float) -> PhaseResult:
    """One compare run (and its reference loop) within limit_s."""
    steps = phase.steps
    notes = []
    if settings.device != "cuda" and "tuned" in steps.split(","):
        steps = ",".join(s for s in steps.split(",") if s != "tuned")
        notes.append("tuned loop skipped: its CUDA graphs need a GPU")
    batch, epochs = settings.batch_for(phase), settings.epochs_for(phase)
    runs = work / "runs"
    cell_timeout = max(60, min(400, limit_s))
    cmd = [sys.executable, "-m", "amp_compare", "compare", "--device", settings.device,
           "--frameworks", phase.frameworks, "--step", steps, "--models", settings.model, "--width", "64",
           "--datasets", settings.dataset, "--precisions", ",".join(settings.precisions), "--seeds", "0",
           "--batch-size", str(batch), "--epochs", str(epochs), "--warmup-steps", str(settings.warmup),
           "--tf32", "off", "--no-augment", "--no-figures", "--timeout", str(cell_timeout),
           "--out", str(runs), "--run-id", phase.name]
    if settings.steps_per_epoch:
        cmd += ["--steps-per-epoch", str(settings.steps_per_epoch)]
    # the compare may use the phase's time less REFERENCE_S; the reference gets what is left
    start = time.monotonic()
    code, seconds, stopped = run_limited(cmd, env, limit_s - (REFERENCE_S if phase.reference else 0),
                                         work / f"{phase.name}.out", log, f"phase {phase.name}: compare")
    result = PhaseResult(phase.name, "cut short" if stopped else "ok" if code == 0 else "failed", seconds,
                         run_dir=runs / phase.name)
    if code not in (0, None) and not stopped:
        notes.append(f"compare exited {code} (3: some cells failed; see log.txt)")
    if phase.reference:
        left = min(limit_s - (time.monotonic() - start), deadline - time.monotonic())
        if left < 20:
            notes.append(f"{phase.reference} reference skipped: {left:.0f} s left")
        else:
            refs, ref_note = reference(phase, settings, env, left, work, log, batch, epochs)
            result.references = refs
            notes += [ref_note] if ref_note else []
    result.seconds = time.monotonic() - start
    result.note = "; ".join(notes)
    return result


def reference(phase: Phase, settings: Settings, env: dict, limit_s: float, work: Path, log: Log, batch: int,
              epochs: int) -> tuple[list[dict], str]:
    """The phase's reference run in a child of this file; its JSON lines."""
    steps_per_epoch = settings.steps_per_epoch or 0
    cmd = [sys.executable, str(Path(__file__).resolve()),
           "reference-torch" if phase.reference == "torch" else "reference-keras",
           "--device", settings.device, "--model", settings.model, "--dataset", settings.dataset,
           "--precisions", ",".join(settings.precisions), "--batch", str(batch), "--epochs", str(epochs),
           "--warmup", str(settings.warmup), "--steps-per-epoch", str(steps_per_epoch)]
    env = dict(env)
    if phase.reference == "keras-jax":
        env["KERAS_BACKEND"] = "jax"
        if settings.device == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
    out = work / f"{phase.name}-reference.out"
    code, _, stopped = run_limited(cmd, env, limit_s, out, log, f"phase {phase.name}: {phase.reference} reference")
    rows = []
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"reference"' in line:
            rows.append({**json.loads(line), "phase": phase.name})
    missing = [p for p in settings.precisions if p not in {r["precision"] for r in rows}]
    note = ""
    if missing:
        note = (f"{phase.reference} reference {'stopped at its time limit' if stopped else f'exited {code}'} "
                f"before {', '.join(missing)}")
    return rows, note


# --- the reference loops (children of `run`) ---------------------------------------------------------------------

def plan_indices(n_train: int, batch: int, epochs: int, steps_per_epoch: int | None) -> list:
    from amp_compare.kit.data import epoch_batches

    return [idx for e in range(epochs) for idx in epoch_batches(n_train, batch, 0, e, steps_per_epoch or None)]


def reference_torch(args) -> int:
    """The plain loop of the PyTorch AMP tutorial on the project's model and data: forward under autocast, loss,
    GradScaler-scaled backward, the default Adam, data on the device, channels last on a GPU. No records, no
    progress, no per-step clock: wall time of the steps after the warm-up, one synchronisation at each end."""
    import torch
    import torch.nn.functional as F

    from amp_compare.kit.data import load_dataset
    from amp_compare.torch_impl.models import build_model

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 off, as the compare runs (--tf32 off)
    torch.backends.cudnn.allow_tf32 = False
    data = load_dataset(args.dataset)
    fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format  # the harness's GPU default
    x = torch.from_numpy(data.x_train).permute(0, 3, 1, 2).contiguous(memory_format=fmt).to(device)
    y = torch.from_numpy(data.y_train).to(device)
    plan = [torch.from_numpy(idx).to(device) for idx in
            plan_indices(len(x), args.batch, args.epochs, args.steps_per_epoch)]
    for precision in args.precisions.split(","):
        amp_dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        torch.manual_seed(0)
        model = build_model(args.model, data.input_shape, data.num_classes).to(device, memory_format=fmt).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

        def step(idx, model=model, optimizer=optimizer, scaler=scaler, amp_dtype=amp_dtype):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            return loss

        for idx in plan[:args.warmup]:
            step(idx)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for idx in plan[args.warmup:]:
            loss = step(idx)
        final = float(loss)  # waits for the last step
        seconds = time.perf_counter() - start
        timed = len(plan) - args.warmup
        print(json.dumps({"reference": "torch reference loop", "precision": precision, "batch": args.batch,
                          "steps_timed": timed, "seconds": seconds, "img_s": timed * args.batch / seconds,
                          "final_loss": final, "device": torch.cuda.get_device_name() if device.type == "cuda" else
                          "cpu"}), flush=True)
        del model, optimizer, scaler
    return 0


def reference_keras(args) -> int:
    """A bare Keras fit as its guides write it, on the backend KERAS_BACKEND names: the mixed policy, compile
    (Keras wraps the optimizer in a LossScaleOptimizer for mixed_float16 itself), fit on numpy arrays with no
    callback but an epoch timer. The first epoch (tracing, XLA compilation) is left out; the later epochs' wall
    time over their images is the figure. The project's model, width and data; TF32 off."""
    import keras

    from amp_compare.keras_impl.models import build_model
    from amp_compare.kit.data import load_dataset

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "float32")
    elif backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    data = load_dataset(args.dataset)
    steps = len(data.x_train) // args.batch
    if args.steps_per_epoch:
        steps = min(steps, args.steps_per_epoch)
    n = steps * args.batch  # whole batches only, as the harness: one shape, no second compilation
    x, y = data.x_train[:n], data.y_train[:n]

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):  # the logs are host values by now: the epoch's steps have run
            self.times.append(time.perf_counter() - self.start)

    for precision in args.precisions.split(","):
        keras.config.set_dtype_policy({"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}[precision])
        keras.utils.set_random_seed(0)
        model = build_model(args.model, data.input_shape, data.num_classes)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        timer = EpochTimer()
        timer.times = []
        model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=True, verbose=0, callbacks=[timer])
        later = timer.times[1:] or timer.times
        print(json.dumps({"reference": f"bare Keras fit ({backend})", "precision": precision, "batch": args.batch,
                          "steps_timed": steps * len(later), "seconds": sum(later),
                          "img_s": steps * len(later) * args.batch / sum(later), "first_epoch_s": timer.times[0],
                          "optimizer": type(model.optimizer).__name__}), flush=True)
        keras.backend.clear_session()
    return 0


# --- the table ----------------------------------------------------------------------------------------------------

TABLE_COLUMNS = ["phase", "framework", "step", "batch", "precision", "status", "img_s", "img_s_median_step",
                 "speedup_vs_fp32", "speedup_vs_plain_fp32", "reference_img_s", "reference_over_this", "mfu_pct",
                 "mfu_datasheet_pct", "ceiling_tflops_measured", "ceiling_dtype", "datasheet_row", "peak_memory_mib",
                 "memory_kind", "dataset_on_device_mib", "host_syncs_per_step", "compile_warmup_s", "cudagraph_skips",
                 "compiled", "steps_timed", "device_name", "error"]


def read_cells(run_dir: Path):
    """Every cell's run row of one compare run, straight from cells/*/run.parquet (no render needed)."""
    import pandas as pd

    rows = []
    for path in sorted(Path(run_dir).glob("cells/*/run.parquet")):
        try:
            rows.append(pd.read_parquet(path))
        except Exception as exc:  # noqa: BLE001 - a corrupt record is named and skipped, the rest still count
            print(f"gpu_check: skipping unreadable {path}: {exc}", file=sys.stderr)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def build_table(runs, references: list[dict]):
    """Issue 26 item 3's table: one row per compare cell, with its reference beside it where one ran."""
    import numpy as np
    import pandas as pd

    if runs.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)

    def col(name, default=np.nan):
        return runs[name] if name in runs else pd.Series(default, index=runs.index)

    t = pd.DataFrame({
        "phase": col("phase", ""), "framework": runs["framework"], "step": col("cfg_step", "plain"),
        "batch": col("cfg_batch_size"), "precision": runs["precision"], "status": runs["status"],
        "img_s": col("throughput_img_s"), "img_s_median_step": col("median_step_throughput_img_s"),
        "mfu_pct": col("mfu_measured") * 100, "mfu_datasheet_pct": col("mfu_table") * 100,
        "ceiling_tflops_measured": col("ceiling_flops_measured") / 1e12, "ceiling_dtype": col("ceiling_dtype", ""),
        "datasheet_row": col("ceiling_table_source", ""), "peak_memory_mib": col("peak_memory_bytes") / 2**20,
        "memory_kind": col("memory_kind", ""), "dataset_on_device_mib": col("dataset_device_bytes") / 2**20,
        "host_syncs_per_step": col("host_syncs_per_step"), "compile_warmup_s": col("compile_warmup_s"),
        "cudagraph_skips": col("cudagraph_skips"), "compiled": col("compiled", ""), "steps_timed": col("steps_timed"),
        "device_name": col("device_name", ""), "error": col("error", ""),
    })
    t.loc[t["status"] != "ok", "img_s"] = np.nan
    key = ["framework", "step", "batch"]
    fp32 = t[t["precision"] == "fp32"].set_index(key)["img_s"]
    t["speedup_vs_fp32"] = [r.img_s / fp32.get((r.framework, r.step, r.batch), np.nan) for r in t.itertuples()]
    plain = t[(t["precision"] == "fp32") & (t["step"] == "plain")].set_index(["framework", "batch"])["img_s"]
    t["speedup_vs_plain_fp32"] = [r.img_s / plain.get((r.framework, r.batch), np.nan) for r in t.itertuples()]
    ref = {(r["precision"], r["batch"], "torch" if r["reference"].startswith("torch") else "keras-jax"): r["img_s"]
           for r in references}
    t["reference_img_s"] = [ref.get((r.precision, r.batch, r.framework), np.nan) if r.step == "plain" or
                            r.framework != "torch" else np.nan for r in t.itertuples()]
    t["reference_over_this"] = t["reference_img_s"] / t["img_s"]
    order = {f: i for i, f in enumerate(("torch", "keras-jax", "keras-torch", "tf"))}
    t = t.assign(_f=t["framework"].map(order), _p=t["precision"].map({p: i for i, p in enumerate(PRECISIONS)}))
    return t.sort_values(["batch", "_f", "step", "_p"]).drop(columns=["_f", "_p"])[TABLE_COLUMNS].reset_index(drop=True)


def fmt(value, spec: str, suffix: str = "") -> str:
    try:
        import math

        return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:{spec}}{suffix}"
    except (TypeError, ValueError):
        return str(value)


def table_markdown(table) -> str:
    rows = ["| framework | step | batch | precision | img/s (wall) | img/s (median step) | × fp32 | × plain fp32 | "
            "reference img/s (ref ÷ this) | MFU (measured peak) | MFU (data sheet) | peak memory MiB (+ data on "
            "device) | host syncs/step | compile+warm-up s | cudagraph skips | status |",
            "|" + "---|" * 16]
    for r in table.itertuples():
        rows.append("| " + " | ".join([
            r.framework, r.step, fmt(r.batch, ".0f"), r.precision, fmt(r.img_s, ",.0f"),
            fmt(r.img_s_median_step, ",.0f"), fmt(r.speedup_vs_fp32, ".2f", "×"),
            fmt(r.speedup_vs_plain_fp32, ".2f", "×"),
            fmt(r.reference_img_s, ",.0f") + (f" ({r.reference_over_this:.3f})" if r.reference_over_this ==
                                               r.reference_over_this else ""),
            fmt(r.mfu_pct, ".1f", "%"), fmt(r.mfu_datasheet_pct, ".1f", "%"),
            fmt(r.peak_memory_mib, ",.0f") + (f" (+{r.dataset_on_device_mib:,.0f})" if r.dataset_on_device_mib
                                              and r.dataset_on_device_mib == r.dataset_on_device_mib else ""),
            fmt(r.host_syncs_per_step, "g"), fmt(r.compile_warmup_s, ".1f"), fmt(r.cudagraph_skips, ".0f"),
            str(r.status) + (f": {str(r.error)[:80]}" if r.status != "ok" else "")]) + " |")
    return "\n".join(rows)


def _against_reference(r, limit: float, reference: str, name: str) -> tuple[str, str, str]:
    """One target row: every precision's reference ÷ harness throughput at or under `limit`."""
    ratios = r["reference_over_this"].dropna()
    if ratios.empty:
        return name, "not measured", ""
    return (name, "met" if (ratios <= limit).all() else "missed",
            ", ".join(f"{p}: {reference} ÷ harness {v:.3f}" for p, v in zip(r.loc[ratios.index, "precision"], ratios)))


def targets(table, references: list[dict]) -> list[tuple[str, str, str]]:
    """Issue 26 item 3's targets on an H100-class GPU: (target, verdict, the figures behind it). "not measured"
    where this run has no such row; nothing here is estimated."""
    import numpy as np

    out = []

    def rows(**where):
        sel = table
        for k, v in where.items():
            sel = sel[sel[k] == v]
        return sel

    for precision in ("fp16", "bf16"):
        r = rows(framework="torch", step="tuned", batch=256, precision=precision)
        name = f"tuned torch {precision}, batch 256: ≥ 55,000 img/s and ≥ 8× fp32"
        if r.empty or not np.isfinite(r["img_s"].iloc[0]):
            out.append((name, "not measured", ""))
            continue
        img, x_tuned, x_plain = r["img_s"].iloc[0], r["speedup_vs_fp32"].iloc[0], r["speedup_vs_plain_fp32"].iloc[0]
        met = img >= 55_000 and np.nanmax([x_tuned, x_plain]) >= 8
        out.append((name, "met" if met else "missed",
                    f"{img:,.0f} img/s; {fmt(x_tuned, '.2f', '×')} tuned fp32, {fmt(x_plain, '.2f', '×')} plain fp32"))
    for batch in (256, 1024):
        out.append(_against_reference(rows(framework="torch", step="plain", batch=batch), 1.05, "ref",
                                       f"plain torch loop within 1.05× of the plain reference loop, batch {batch}"))
    r = rows(framework="torch", step="tuned", batch=1024, precision="bf16")
    name = "tuned torch bf16, batch 1024: MFU ≥ 35%"
    if r.empty or not np.isfinite(r["mfu_pct"].iloc[0]):
        out.append((name, "not measured", ""))
    else:
        mfu = r["mfu_pct"].iloc[0]
        out.append((name, "met" if mfu >= 35 else "missed", f"{mfu:.1f}% of the measured bf16 matmul peak "
                    f"({r['ceiling_tflops_measured'].iloc[0]:.0f} TFLOP/s); "
                    f"{fmt(r['mfu_datasheet_pct'].iloc[0], '.1f')}% "
                    "of the data sheet's"))
    for batch in (256, 1024):
        out.append(_against_reference(rows(framework="keras-jax", batch=batch), 1.10, "bare",
                                      f"keras-jax within 10% of a bare Keras-on-JAX fit, batch {batch}"))
    return out


# --- run ----------------------------------------------------------------------------------------------------------

def write_outputs(out: Path, results: list[PhaseResult], info: dict, log: Log, work: Path, args, started: float,
                  skipped: list[tuple[str, str]]) -> None:
    """The few small files that come back (OUTPUT_FILES), nothing else."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    runs, references, summaries = [], [], []
    for r in results:
        references += r.references
        if r.run_dir is not None and r.run_dir.exists():
            cells = read_cells(r.run_dir)
            if not cells.empty:
                runs.append(cells.assign(phase=r.name))
            md = r.run_dir / "summary.md"
            summaries.append(f"# phase {r.name}\n\n" + (md.read_text() if md.exists() else
                                                          "(no summary.md: the report was not rendered)\n"))
    runs_df = pd.concat(runs, ignore_index=True) if runs else pd.DataFrame()
    table = build_table(runs_df, references)
    table.to_csv(out / "table.csv", index=False)
    if not runs_df.empty:
        runs_df.drop(columns=[c for c in ("val_correct",) if c in runs_df]).to_csv(out / "runs.csv", index=False)
    else:
        (out / "runs.csv").write_text("")
    (out / "summaries.md").write_text("\n\n".join(summaries) or "(no compare phase ran)\n")
    pytest_out = work / "pytest.txt"
    text = pytest_out.read_text(errors="replace") if pytest_out.exists() else "(the tests phase did not run)\n"
    (out / "pytest.txt").write_text(text[-400_000:])
    (out / "log.txt").write_text(log.text()[-2_000_000:])
    info["phases"] = [{"name": r.name, "status": r.status, "seconds": round(r.seconds, 1), "note": r.note}
                      for r in results]
    info["references"] = references
    info["elapsed_s"] = round(time.monotonic() - started, 1)
    (out / "env.json").write_text(json.dumps(info, indent=2, default=str))
    (out / "check.md").write_text(check_markdown(table, references, results, info, args, skipped,
                                                 Settings.for_run(args.device, args.smoke)))


CIFAR_NOTE = {"synthetic_cifar": " (10,000 training images of CIFAR's shape)"}


def check_markdown(table, references, results, info, args, skipped, settings: Settings) -> str:
    device = info.get("gpu") or info.get("device")
    lines = [f"# amp-compare GPU check ({device})", "",
             f"`{' '.join(sys.argv)}` · started {info['started']} · {info['elapsed_s']} s of a {args.budget_s:g} s "
             f"budget · host CPU: {info.get('cpu', '')} ({info.get('cpus')} usable)" +
             (" · SMOKE RUN: tiny settings on a CPU, no GPU figure" if args.smoke else ""), "",
             "Every figure below comes from this run's records (runs.csv holds every column); nothing is estimated.",
             "", "## Phases", "", "| phase | status | seconds | note |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.note or '—'} |")
    for name, why in skipped:
        lines.append(f"| {name} | skipped | 0 | {why} |")
    lines += ["", "## Table (issue 26 item 3)", "",
              f"{settings.model} (width 64), {settings.dataset}{CIFAR_NOTE.get(settings.dataset, '')}, TF32 off, no "
              "augmentation, one seed. img/s (wall): images of the timed steps over their summed wall time (the "
              "headline); median step: batch ÷ median step time; MFU: achieved FLOP/s over the matmul peak the cell "
              "measured in its own dtype (data sheet: over the NVIDIA data-sheet row named in runs.csv's "
              "peak_table_source); peak memory: the framework allocator's peak, with the dataset held on the device "
              "apart; host syncs/step: as the run table records it (tests/gpu/test_gpu_sync.py counts torch's); "
              "reference: the plain reference loop (torch plain rows) or a bare Keras fit (keras-jax rows), same "
              "call, same data.", "", table_markdown(table) if len(table) else "(no compare phase produced a cell)"]
    if references:
        lines += ["", "References run in the same call:", ""]
        lines += [f"- {r['phase']}: {r['reference']} {r['precision']} batch {r['batch']}: {r['img_s']:,.0f} img/s "
                  f"({r['steps_timed']} steps in {r['seconds']:.2f} s)" for r in references]
    lines += ["", "## Targets (an H100-class GPU, TF32 off, resnet18 CIFAR)", "", "| target | verdict | figures |",
              "|---|---|---|"]
    lines += [f"| {name} | {verdict} | {figures or '—'} |" for name, verdict, figures in targets(table, references)]
    lines += ["", "A missed target needs a torch.profiler trace of that cell before anything is changed (issue 26)."]
    rest = [name for name, _ in skipped] + [r.name for r in results if r.status == "cut short"]
    if rest:
        lines += ["", "## Not finished in this call", "",
                  f"Run them in another call: `python3 benchmarks/gpu_check.py run --out $OUT/gpu-check --phases "
                  f"{','.join(dict.fromkeys(rest))}`"]
    lines += ["", "## Files", "", *[f"- {name}" for name in OUTPUT_FILES], ""]
    return "\n".join(lines)


def run(args) -> int:
    started = time.monotonic()
    deadline = started + args.budget_s
    out, work = Path(args.out), Path(args.work or f"/tmp/amp-compare-gpu-check-{os.getpid()}")
    if out.exists() and any(out.iterdir()):
        print(f"gpu_check: error: output folder {str(out)!r} is not empty (valid: a new or empty folder)",
              file=sys.stderr)
        return 2
    names = args.phases.split(",") if args.phases else list(SMOKE_PHASES if args.smoke else PHASE_NAMES)
    unknown = [n for n in names if n not in PHASE_NAMES]
    if unknown:
        print(f"gpu_check: error: unknown phase {unknown[0]!r} (valid: {', '.join(PHASE_NAMES)})", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    log = Log()
    site = Path(args.site)
    installed = ({"status": "skipped", "note": "--no-install"} if args.no_install else
                 install(Path(args.wheels), site, log, args.dry_run))
    if installed["status"] == "failed":
        print("gpu_check: the wheels did not install (log.txt); going on with the image's packages", file=sys.stderr)
    env = child_env(site if installed["status"] == "ok" else None)
    info = {**environment(env, args.device), "install": installed, "budget_s": args.budget_s, "smoke": args.smoke}
    settings = Settings.for_run(args.device, args.smoke)
    results, skipped = [], []  # skipped: (phase, why)
    for phase in (p for p in PHASES if p.name in names):
        left = deadline - time.monotonic() - RESERVE_S
        if args.device != "cuda" and phase.cuda_only:
            skipped.append((phase.name, f"needs CUDA: {phase.cuda_only}"))
            continue
        if left < phase.min_s * (0.1 if args.smoke else 1):
            skipped.append((phase.name, f"budget: {max(0, left):.0f} s left, the phase needs at least "
                                        f"{phase.min_s:.0f} s"))
            continue
        # a smoke run on a CPU compiles XLA far slower than the GPU machine's 16 cores: the limits are the GPU's
        limit = min(phase.limit_s * (SMOKE_LIMIT_SCALE if args.smoke else 1), left)
        if phase.kind == "tests":
            results.append(tests_phase(phase, settings, env, limit, work, log))
        else:
            results.append(compare_phase(phase, settings, env, limit, work, log, deadline - RESERVE_S))
        print(f"gpu_check: phase {phase.name}: {results[-1].status} in {results[-1].seconds:.0f} s "
              f"{results[-1].note}", flush=True)
    write_outputs(out, results, info, log, work, args, started, skipped)
    print((out / "check.md").read_text())
    return 0 if all(r.status == "ok" for r in results) else 1


def table_command(args) -> int:
    import pandas as pd

    runs = [read_cells(Path(d)).assign(phase=Path(d).name) for d in args.run_dirs]
    runs = [r for r in runs if not r.empty]
    table = build_table(pd.concat(runs, ignore_index=True) if runs else pd.DataFrame(), [])
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        table.to_csv(Path(args.out) / "table.csv", index=False)
    print(table_markdown(table))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="download the wheels the GPU image lacks into .whl/ (here, with PyPI)")
    p.add_argument("--dest", type=Path, default=WHEEL_DIR)
    p.add_argument("--dry-run", action="store_true", help="print the pip command only")
    r = sub.add_parser("run", help="install the wheels, run the gpu tests and the table, write --out")
    r.add_argument("--out", required=True, help="folder for the few files that come back (new or empty)")
    r.add_argument("--work", help="folder for everything else: report folders, outputs (default /tmp/…)")
    r.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    r.add_argument("--smoke", action="store_true", help="tiny settings (a CPU test of the plumbing)")
    r.add_argument("--phases", help=f"comma list, run in PHASES' order (default: all): {','.join(PHASE_NAMES)}")
    r.add_argument("--budget-s", type=float, default=540.0, help="seconds for the whole check (default 540)")
    r.add_argument("--wheels", default=str(WHEEL_DIR), help="folder of carried wheels (default .whl)")
    r.add_argument("--site", default="/tmp/amp-compare-site", help="where the wheels are installed (--target)")
    r.add_argument("--no-install", action="store_true", help="use the packages already there")
    r.add_argument("--dry-run", action="store_true", help="print the install command instead of running it")
    t = sub.add_parser("table", help="the item-3 table from existing compare run folders")
    t.add_argument("run_dirs", nargs="+")
    t.add_argument("--out")
    for name in ("reference-torch", "reference-keras"):
        c = sub.add_parser(name, help="a reference loop (a child of run)")
        c.add_argument("--device", default="cuda")
        c.add_argument("--model", default="resnet18")
        c.add_argument("--dataset", default="synthetic_cifar")
        c.add_argument("--precisions", default=",".join(PRECISIONS))
        c.add_argument("--batch", type=int, default=256)
        c.add_argument("--epochs", type=int, default=3)
        c.add_argument("--warmup", type=int, default=WARMUP)
        c.add_argument("--steps-per-epoch", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.dest, args.dry_run)
    if args.command == "run":
        if args.budget_s <= 0:
            print(f"gpu_check: error: --budget-s must be positive, got {args.budget_s:g}", file=sys.stderr)
            return 2
        return run(args)
    if args.command == "table":
        return table_command(args)
    sys.path.insert(0, str(ROOT))
    return reference_torch(args) if args.command == "reference-torch" else reference_keras(args)


if __name__ == "__main__":
    sys.exit(main())
