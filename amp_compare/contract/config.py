"""One typed source of truth for what a run is.

`RunConfig` describes one cell of a compare matrix (one framework, model, dataset, precision
and seed). It is frozen, validated on construction, saved as JSON next to every result and
read back by the framework child, so the parent and both frameworks can never disagree about
a hyperparameter. Everything here is framework-free: no torch, no tensorflow.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

from amp_compare.contract import fp8
from amp_compare.contract import models as model_specs
from amp_compare.contract import precision as precisions

# Frameworks: native PyTorch, and the same Keras model code on each of Keras 3's backends ("tf" is Keras on
# TensorFlow; "keras-tf" is accepted for it and normalised to "tf", so old runs and new ones read the same).
FRAMEWORKS = ("torch", "tf", "keras-jax", "keras-torch")
DEFAULT_FRAMEWORKS = ("torch", "tf")
FRAMEWORK_ALIASES = {"keras-tf": "tf"}
# Keras' backend per Keras framework: the child's KERAS_BACKEND, set before Keras is imported (harness/run/runner.py).
KERAS_BACKENDS = {"tf": "tensorflow", "keras-jax": "jax", "keras-torch": "torch"}
# Precision modes, named the same in both frameworks.
#   fp32: no autocast / float32 policy.
#   fp16: mixed float16 with dynamic loss scaling (GradScaler / LossScaleOptimizer).
#   bf16: mixed bfloat16, no loss scaling (bfloat16 has float32's exponent range).
#   fp16-noscale: mixed float16 with no loss scaling at all (watch gradients underflow).
#   fp16-static: mixed float16 with a fixed scale (--loss-scale), no growth or backoff.
PRECISIONS = precisions.NAMES  # contract/precision.py describes each
DEFAULT_PRECISIONS = ("fp32", "fp16", "bf16")
# The models, one declaration each (contract/models.py): these views follow its registry.
MODELS = model_specs.Names()
MODEL_BLOCKS = model_specs.Field("blocks")  # blocks --fp32-layers may name (a dotted sub-block such as layer1.0 too)
DATASETS = ("digits", "synthetic", "synthetic_cifar", "cifar10", "cifar100")
# Each dataset's square image side in pixels (kit/data.py makes them; tests/test_profile_inputs.py checks the two
# agree): the vit's patch must divide it, as ViT implementations require.
IMAGE_SIZES = {"digits": 16, "synthetic": 16, "synthetic_cifar": 32, "cifar10": 32, "cifar100": 32}
DEVICES = ("cpu", "cuda")
OPTIMIZERS = ("auto", "adam", "adamw", "sgd")
LR_SCHEDULES = ("auto", "constant", "warmup-cosine")
# What "auto" means per model: the recipe each model trains well with (its spec's, contract/models.py). The CNNs
# keep the project's Adam at a constant rate; the ViT trains as transformers do (AdamW, warm-up + cosine).
MODEL_RECIPES = model_specs.Field("recipe")
# builtin: each framework's own attention (torch F.scaled_dot_product_attention, Keras MultiHeadAttention);
# naive: a handwritten softmax(Q·Kᵀ) in the compute dtype, no max subtraction, no 1/sqrt(d) (the numerics lesson)
ATTENTIONS = ("builtin", "naive")
# aligned: the hyperparameter mapping of contract/mapping.py applied, both sides configured equal.
# defaults: each framework with its own out-of-the-box defaults (what a user switching sees).
COMPARISONS = ("aligned", "defaults")
# shared: every cell of a (model, dataset, seed) starts from the same weights, made once by the
# first cell and handed to the others through numpy; framework: each framework initialises its own.
INITS = ("shared", "framework")
# plain: the tutorial loop (eager, the default optimizer); tuned: what the framework offers to go fast
# (torch fused optimizer + torch.compile, CUDA graphs on a GPU; Keras jit_compile/XLA). See docs/MEASUREMENT.md.
STEPS = ("plain", "tuned")
# The gradient all-reduce's precision in a data-parallel cell (--replicas N > 1; harness/run/launch.py). fp32, or a half
# format where the framework's own engine all-reduces in it (torch DDP's fp16/bf16 compress hooks; Keras on JAX in
# the policy's compute dtype); elsewhere the cell is recorded unavailable with the reason (no home-made casts).
ALLREDUCES = ("fp32", "fp16", "bf16")
ALLREDUCE_REFERENCE = ALLREDUCES[0]  # what a reduced-precision all-reduce is compared with (float32)
ALLREDUCE_DTYPES = dict(zip(ALLREDUCES, ("float32", "float16", "bfloat16")))  # the dtype each one all-reduces in

# Framework package that runs each framework's child process.
FRAMEWORK_MODULES = {"torch": "amp_compare.torch_impl", **{fw: "amp_compare.keras_impl" for fw in KERAS_BACKENDS}}
# What each child must be able to import (its Keras backend's library first, then keras).
FRAMEWORK_LIBRARIES = {"torch": ("torch",), "tf": ("tensorflow", "keras"), "keras-jax": ("jax", "keras"),
                       "keras-torch": ("torch", "keras")}
# The pip extra that installs a framework's libraries (pyproject.toml's optional dependencies).
FRAMEWORK_EXTRAS = {"torch": "compare", "tf": "compare", "keras-jax": "jax", "keras-torch": "compare"}
FRAMEWORK_LABELS = {"torch": "PyTorch", "tf": "Keras (TF)", "keras-jax": "Keras (JAX)", "keras-torch": "Keras (torch)"}
# The order every table and figure lists frameworks and precisions in.
DISPLAY_ORDER = {**{f: i for i, f in enumerate(FRAMEWORKS)}, **{p: i for i, p in enumerate(PRECISIONS)}}


def ordered(values) -> list:
    """The distinct values, frameworks and precisions in DISPLAY_ORDER (others last)."""
    return sorted(set(values), key=lambda x: DISPLAY_ORDER.get(x, 99))


def framework_label(framework: str) -> str:
    return FRAMEWORK_LABELS.get(framework, framework)


def is_keras(framework: str) -> bool:
    """Whether a framework is the Keras model code (on any backend), not native PyTorch."""
    return framework in KERAS_BACKENDS


def display_order(column):
    """A sort key for DataFrame.sort_values: framework and precision columns in DISPLAY_ORDER."""
    return column.map(DISPLAY_ORDER) if column.name in ("framework", "precision") else column


class ConfigError(ValueError):
    """A bad user-supplied value. The message is one line naming the value and valid choices."""


# ---------------------------------------------------------------------------------------------
# One declaration of every option
#
# Every option is one dataclass field declared with `option(...)`: its type (the annotation),
# default (and per-device defaults for the CLI), valid range or choices, and help. From those
# fields come the argparse options (harness/run/cli.py), the strict `--config` JSON file, RunConfig's
# own validation (pydantic, strict: a string is never a number or a boolean) and docs/OPTIONS.md's
# options table. Adding an option is one `option(...)` field here (a value of each cell) or in
# harness/run/cli.py's CompareOptions (a value of the harness).
# ---------------------------------------------------------------------------------------------

INT64_MAX = 2**63 - 1  # records store integers as int64: nothing larger passes validation
_UNSET = object()


@dataclass(frozen=True)
class OptionSpec:
    help: str
    choices: Sequence | None = None  # valid values (of each item, for a list option); MODELS: a live view
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    per_device: dict | None = None  # the command line's default per resolved device, where it differs
    default_text: str | None = None  # how help and docs/OPTIONS.md show the default, where repr would not do
    cli: bool = True  # a command-line / --config option (False: set by the harness, e.g. the matrix axes)
    matrix: bool = True  # defines the run (refused with --resume, which reuses the run's saved values)
    flag: str | None = None  # "--name-with-dashes" by default
    metavar: str | None = None
    empty_ok: bool = False  # a list option that may be empty
    aliases: dict | None = None  # other accepted spellings of a choice, normalised to it before validation
    path: bool = False  # a file or folder given as text: made absolute before a child starts (Path-typed ones are)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: taskset, a container's cpuset), not all the machine has:
    more threads than that only contend (and OpenMP spins) for the same cores."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """--threads' default: $OMP_NUM_THREADS where it is set to a positive integer (the usual way to say how many
    threads a process may use; its first field where it lists one per nesting level), else usable_cpus()."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else usable_cpus()


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, cpu: Any = _UNSET,
           cuda: Any = _UNSET, **spec: Any) -> Any:
    """A dataclass field that declares one option (see OptionSpec for the keywords)."""
    per_device = {k: v for k, v in (("cpu", cpu), ("cuda", cuda)) if v is not _UNSET} or None
    metadata = {"option": OptionSpec(help=help, per_device=per_device, **spec)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Declared:
    """One declared option, as the CLI, the config file and the validators see it."""

    name: str
    type: Any  # the resolved annotation, e.g. int, float | None, tuple[str, ...]
    spec: OptionSpec
    default: Any

    @property
    def flag(self) -> str:
        return self.spec.flag or "--" + self.name.replace("_", "-")

    @property
    def base(self) -> Any:
        """The type without None: int, float, bool, str, Path or tuple[X, ...]."""
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        return args[0] if typing.get_origin(self.type) in (types.UnionType, typing.Union) else self.type

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.type)

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self.base) is tuple

    @property
    def item(self) -> Any:
        return typing.get_args(self.base)[0] if self.is_list else self.base

    def default_for(self, device: str | None) -> Any:
        if self.spec.per_device and device in self.spec.per_device:
            return self.spec.per_device[device]
        return self.default

    def describe(self) -> str:
        """What a valid value is, in words: "a positive int (1..9223372036854775807)"."""
        s, item = self.spec, self.item
        if s.choices:
            what = f"one of {', '.join(map(str, s.choices))}"
        elif item is bool:
            what = "true or false"
        elif item in (int, float):
            noun = "int" if item is int else "finite float"
            lo = s.gt if s.gt is not None else s.ge
            sign = ("positive " if s.gt == 0 else "non-negative " if s.ge == 0 else "")
            hi = s.lt if s.lt is not None else s.le
            if item is int:
                lo_i = (int(s.gt) + 1) if s.gt is not None else (int(s.ge) if s.ge is not None else -INT64_MAX - 1)
                hi_i = (int(s.lt) - 1) if s.lt is not None else (int(s.le) if s.le is not None else INT64_MAX)
                what = f"a {sign}{noun} ({lo_i}..{hi_i})"
            elif hi is not None:
                what = (f"a float in {'(' if s.gt is not None else '['}{lo:g}, {hi:g}"
                        f"{')' if s.lt is not None else ']'}")
            else:
                what = f"a {sign}{noun}" if lo in (None, 0) else f"a {noun} > {lo:g}"
        elif item is Path:
            what = "a path"
        else:
            what = "a string"
        if self.is_list:
            what = (f"a {'' if s.empty_ok else 'non-empty '}list (or comma-separated text) of distinct values, "
                    f"each {what}")
        return what + (" or null" if self.optional else "")


def declared(cls: type) -> dict[str, Declared]:
    """The declared options of a dataclass, by field name, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("option")
        if spec is None:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = Declared(f.name, hints[f.name], spec, default)
    return out


def _annotation(d: Declared) -> Any:
    """The pydantic type of a declared option: choices as Literal, ranges as constraints."""
    s = d.spec
    item: Any = d.item
    if s.choices:
        item = Literal[tuple(s.choices)]  # type: ignore[valid-type]  (a live view, such as MODELS, as it is now)
    elif item is int:
        item = Annotated[int, pydantic.Field(gt=s.gt, lt=s.lt, ge=s.ge if s.ge is not None else (
            None if s.gt is not None else -INT64_MAX - 1), le=s.le if s.le is not None else (
            None if s.lt is not None else INT64_MAX))]
    elif item is float:
        item = Annotated[float, pydantic.Field(gt=s.gt, ge=s.ge, lt=s.lt, le=s.le, allow_inf_nan=False)]
    if d.is_list:
        item = Annotated[tuple[item, ...], pydantic.Field(min_length=0 if s.empty_ok else 1)]
    return item | None if d.optional else item


_VALIDATORS: dict[tuple, type[pydantic.BaseModel]] = {}


def _validator(options: dict[str, Declared]) -> type[pydantic.BaseModel]:
    """A strict pydantic model of these options (made once per set of options and of their choices: a model
    registered later, contract/models.py, is a new choice)."""
    key = tuple((name, tuple(d.spec.choices or ())) for name, d in options.items())
    if key not in _VALIDATORS:
        fields: dict[str, Any] = {d.name: (_annotation(d), ...) for d in options.values()}
        _VALIDATORS[key] = pydantic.create_model(
            "Options", __config__=pydantic.ConfigDict(strict=True, extra="forbid"), **fields)
    return _VALIDATORS[key]


def from_text(d: Declared, value: Any) -> Any:
    """The one lenience, the same on the command line and in a config file: a list option may be
    given as comma-separated text (or a JSON list), a path as a string. Everything else is strict."""
    if d.is_list and isinstance(value, str):
        items = [s.strip() for s in value.split(",") if s.strip()]
        if d.item is int:
            try:
                items = [int(s) for s in items]
            except ValueError:
                raise ConfigError(f"{d.flag} must be comma-separated integers, got {value!r} "
                                  f"(valid: {d.describe()})") from None
        return tuple(items)
    if d.is_list and isinstance(value, list):
        return tuple(value)
    if d.item is Path and isinstance(value, str):
        return Path(value)
    return value


def validate_options(options: dict[str, Declared], values: dict[str, Any]) -> dict[str, Any]:
    """Validate values (name -> value, every option present) against their declarations, strictly.

    Returns the validated values; raises ConfigError with one line naming the option, the bad
    value and what is valid (duplicates in a list included)."""
    values = dict(values)
    for name, d in options.items():  # accepted aliases become their canonical choice (keras-tf -> tf)
        if d.spec.aliases and name in values:
            value = values[name]
            if d.is_list and isinstance(value, (tuple, list)):
                values[name] = type(value)(d.spec.aliases.get(v, v) if isinstance(v, str) else v for v in value)
            elif isinstance(value, str):
                values[name] = d.spec.aliases.get(value, value)
    try:
        model = _validator(options).model_validate(values)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0])
        d = options[name]
        value = values.get(name) if len(err["loc"]) == 1 else err["input"]
        if d.spec.choices and err["type"] == "literal_error":
            noun = name.rstrip("s") if d.is_list else name
            raise ConfigError(f"unknown {noun} {err['input']!r} (valid: {', '.join(map(str, d.spec.choices))})")\
                from None
        if d.is_list and err["type"] == "too_short":
            raise ConfigError(f"{name} is empty (valid: {d.describe()})") from None
        raise ConfigError(f"{name} must be {d.describe()}, got {value!r}") from None
    out = {name: getattr(model, name) for name in options}
    for name, value in out.items():
        if options[name].is_list and value is not None and len(set(value)) != len(value):
            twice = next(v for v in value if value.count(v) > 1)
            raise ConfigError(f"{name} lists {twice!r} more than once, got {values[name]!r} "
                              f"(valid: {options[name].describe()})")
    return out


def model_layer_names(model: str, depth: int = 2) -> tuple[str, ...]:
    """Every block and sub-block --fp32-layers may name in `model`: the names both frameworks give
    the same module (torch's module names; Keras' layer names canonicalised), from its spec
    (contract/models.py). tests/test_config.py checks this list against both real models. depth: the vit's
    number of blocks."""
    return model_specs.spec(model).layer_names({"vit": {**model_specs.VIT_SIZE, "depth": depth}})


@dataclass(frozen=True)
class RunConfig:
    """One training run: a cell of the compare matrix. Units in the help texts.

    Each field is a declared option (see `option`); `cli=False` ones are set by the harness."""

    framework: str = option("torch", "framework of this cell", choices=FRAMEWORKS, cli=False,
                            aliases=FRAMEWORK_ALIASES)
    model: str = option("simple_cnn", "model of this cell", choices=MODELS, cli=False)
    dataset: str = option("digits", "dataset of this cell", choices=DATASETS, cli=False)
    precision: str = option("fp32", "precision mode of this cell", choices=PRECISIONS, cli=False)
    seed: int = option(0, "seed of this cell", ge=0, cli=False)
    device: str = option("cpu", "resolved device, never auto", choices=DEVICES, cli=False)
    comparison: str = option("aligned", "aligned: hyperparameters that look equal but are not are mapped (Adam eps, "
                             "BatchNorm momentum convention and eps, stride-2 padding, loss-scale init/growth; "
                             "contract/mapping.py); defaults: each framework's own defaults", choices=COMPARISONS)
    init: str = option("shared", "shared: every cell of a model/dataset/seed starts from the same weights; "
                       "framework: each framework's own initialisers", choices=INITS)
    width: int = option(64, "resnet18 base width (channels of the first stage); simple_cnn and vit ignore it", gt=0)
    # The ViT's size (--models vit; the CNNs ignore these). Defaults: small enough for a 2-core CPU, and it
    # reaches >= 90% validation accuracy on digits in the default epochs (README, "The ViT").
    vit_dim: int = option(32, "vit embedding width (features per token); a multiple of --vit-heads", gt=0)
    vit_depth: int = option(2, "vit transformer blocks", gt=0, le=64)
    vit_heads: int = option(2, "vit attention heads per block", gt=0)
    vit_patch: int = option(4, "vit patch size in pixels (the strided conv's kernel and stride)", gt=0)
    vit_mlp_ratio: int = option(2, "vit MLP hidden width as a multiple of --vit-dim", gt=0)
    attention: str = option("builtin", "vit attention: builtin (torch F.scaled_dot_product_attention, Keras "
                            "MultiHeadAttention) or naive (a handwritten softmax(Q·Kᵀ) in the compute dtype, no max "
                            "subtraction, no 1/sqrt(d): overflows float16)", choices=ATTENTIONS)
    data_dir: str | None = option(None, "folder to look in first for dataset archives (CIFAR)", path=True)
    augment: bool = option(False, "random crop (4-pixel padding) + horizontal flip, identical in both frameworks",
                           cpu=False, cuda=True)
    tf32: str = option("off", "TF32 for float32 matmul/conv on NVIDIA GPUs, set the same in every framework and "
                       "backend (JAX: jax_default_matmul_precision)",
                       choices=("on", "off"))
    compile: bool = option(False, "torch.compile / Keras jit_compile=True (XLA); compile time reported apart")
    profile: bool = option(False, "after the timed epochs, profile a few extra steps with the framework's own profiler "
                           "(trace kept in the cell's folder; top ops, casts, oneDNN vs native/Eigen path; "
                           "docs/MEASUREMENT.md)")
    channels_last: bool = option(False, "torch only: NHWC memory format for convolutions (Keras is NHWC already)",
                                 cpu=False, cuda=True)
    # Where per-step values live during an epoch, and with it how both frameworks time the steps
    # (kit/training.times_each_step). "host": read after each step (each step timed; on a GPU a wait per step);
    # "device": kept on the device between reads (Keras: once per epoch; torch: every 25 steps), no step timed
    # alone, the epoch is; "auto": device on a GPU, host on a CPU (where reading costs nothing).
    step_values: str = option("auto", "per-step values read after each step, each step timed (host), or kept on "
                              "the device between reads, the epoch timed (device); auto: device on a GPU, host on a "
                              "CPU", choices=("auto", "host", "device"))
    epochs: int = option(8, "epochs per cell; when not given, on a CPU simple_cnn trains 4 and vit 6 (where recorded "
                         "12-epoch runs' fp32 accuracy was within 1-3 points of its end)", gt=0, cpu=12, cuda=15)
    batch_size: int = option(64, "images per optimizer step", gt=0, cpu=64, cuda=256)
    steps_per_epoch: int | None = option(None, "cap on steps per epoch (null: the whole training set)", gt=0)
    optimizer: str = option("auto", "optimizer, set explicitly and equally on both sides; auto: adamw for vit, adam "
                            "for the CNNs", choices=OPTIMIZERS)
    lr: float | None = option(None, "learning rate (the peak of a schedule); null: the model's, 0.001 for the CNNs, "
                              "0.003 for vit", gt=0, default_text="0.001 (simple_cnn, resnet18), 0.003 (vit)")
    lr_schedule: str = option("auto", "learning-rate schedule, the same step-indexed function in both frameworks "
                              "(kit/schedule.py); warmup-cosine: linear warm-up over --lr-warmup of the run's "
                              "updates, then cosine decay to 0; auto: warmup-cosine for vit, constant for the CNNs",
                              choices=LR_SCHEDULES)
    lr_warmup: float = option(0.1, "warmup-cosine: share of the run's optimizer updates spent warming up", ge=0,
                              lt=1)
    weight_decay: float = option(0.05, "adamw's decoupled weight decay (adam and sgd train without any)", ge=0)
    adam_epsilon: float = option(1e-7, "Adam epsilon, set on both sides (defaults: torch 1e-8, Keras 1e-7)", gt=0)
    momentum: float = option(0.9, "SGD momentum (torch convention; Keras uses the same one for SGD)", ge=0, lt=1)
    warmup_steps: int = option(5, "first steps of the run, excluded from step-time statistics", ge=0)
    diverge_after: int = option(20, "stop a cell, recorded as diverged, after this many consecutive non-finite "
                                "losses", gt=0)
    # A precision this machine runs pathologically slowly (seen: fp16 convolutions 50-100x slower than fp32 on CPUs
    # with AVX-512 FP16) is timed over a bounded number of steps, not its full epochs (kit/training.py SpeedBudget)
    speed_budget: bool = option(True, "stop a cell whose training its first measured steps project past "
                                "--speed-budget-s, once it has timed enough steps for a speed interval (its accuracy "
                                "is then not compared); --no-speed-budget runs every cell in full")
    speed_budget_s: float = option(60.0, "the cell budget: seconds of training a cell may be projected to take "
                                   "before the speed budget stops it early", gt=0)
    # Speed trials (kit/trial.py, harness/run/trials.py): per framework x model x dataset x batch size x step loop, fp32
    # and each mixed precision timed block by block in one process, after the cells
    trial_budget_s: float = option(10.0, "seconds of timed rounds each speed trial may take (one per framework x "
                                   "model x dataset x batch size x step loop with fp32 and a mixed precision; building "
                                   "and warming its models up come before); it stops sooner once its rounds decide "
                                   "every mixed precision; longer can decide an undecided one; 0 runs no trials", ge=0)
    # Set by the harness (harness/run/runner.py speed_reference) from the cells already finished: the median step of
    # this framework's fp32 cell of the same model, data and loop; the budget stops only a cell that much slower
    speed_reference_step_s: float | None = option(None, "median step (s) of the same framework's fp32 cell in this "
                                                  "run, where one finished first", gt=0, cli=False)
    # Dynamic loss scaler for fp16, set explicitly on both sides
    # (defaults: torch GradScaler 2**16 / 2000 steps, Keras LossScaleOptimizer 2**15 / 2000).
    init_scale: float = option(2.0**15, "fp16's initial dynamic loss scale", gt=0)
    growth_interval: int = option(2000, "fp16: steps without overflow before the loss scale doubles", gt=0)
    loss_scale: float | None = option(None, "fp16-static's fixed loss scale (required there, refused elsewhere)",
                                      gt=0)
    fp32_layers: tuple[str, ...] = option((), "blocks forced to float32 under mixed precision in both frameworks, "
                                          "e.g. fc or layer4 or layer1.0.conv1; the dtype audit shows it took "
                                          "effect", default_text="none",
                                          empty_ok=True)
    fp8_outlier: bool = option(False, "vit: add one large activation (the class token's first feature entering "
                               "blocks.0.attn) in every cell, the lesson of per-tensor versus per-row fp8 scaling; "
                               "needs an fp8 precision")
    clip_grad_norm: float | None = option(None, "global gradient-norm clipping on the unscaled gradients "
                                          "(torch: scaler.unscale_ then clip_grad_norm_; Keras: global_clipnorm "
                                          "inside the LossScaleOptimizer)", gt=0)
    threads: int = option(help="intra- and inter-op threads, both frameworks: the speed trials', and each cell's "
                          "(without it, on a CPU, cells run at once with one thread each: --parallel)", gt=0,
                          factory=default_threads,
                          default_text="$OMP_NUM_THREADS where set, else the CPUs this process may run on")
    target_accuracy: float | None = option(None, "time-to-accuracy target as a fraction in (0, 1] (null: 95% of "
                                           "what fp32 reaches)", gt=0, le=1)
    # Set by the harness from --step and --batch-sizes (harness/run/compare.py expand_cells expands the matrix).
    step: str = option("plain", "the training loop: plain or tuned (harness/report/hardware.py)",
                       choices=STEPS, cli=False)
    batch_sweep: bool = option(False, "a cell of a --batch-sizes sweep: its batch size is part of its cell id",
                               cli=False)
    # Data parallel (harness/run/launch.py expands --replicas / --allreduce; docs/DATA_PARALLEL.md).
    replicas: int = option(1, "data-parallel workers: N > 1 adds, beside each 1-worker cell, N-worker cells at the "
                           "same global batch (torch: torchrun + DistributedDataParallel; Keras on TF: "
                           "MirroredStrategy; Keras on JAX: keras.distribution.DataParallel) and the 1-worker cell "
                           "at another thread count (the run-to-run floor)", gt=0, le=1024)
    allreduce: str = option(ALLREDUCE_REFERENCE, "this cell's gradient all-reduce precision (N-worker cells)",
                            choices=ALLREDUCES, cli=False)
    thread_floor: bool = option(False, "the 1-worker cell again at another thread count: the floor a --replicas "
                                "run's loss gap is judged against", cli=False)

    def __post_init__(self) -> None:
        # Strict: JSON's list is the one other form of a tuple (comma text is the CLI's, not RunConfig's).
        values = {name: tuple(v) if d.is_list and isinstance(v := getattr(self, name), list) else getattr(self, name)
                  for name, d in run_options().items()}
        for name, value in validate_options(run_options(), values).items():
            object.__setattr__(self, name, value)
        static = precisions.names(loss_scaling="static")
        if self.loss_scaling == "static" and self.loss_scale is None:
            raise ConfigError(f"precision {self.precision!r} needs --loss-scale (a fixed loss scale, e.g. 1024)")
        if self.loss_scale is not None and self.loss_scaling != "static":
            raise ConfigError(f"--loss-scale {self.loss_scale:g} only applies to precision {', '.join(static)} "
                              f"(got {self.precision!r}; {', '.join(precisions.names(loss_scaling='dynamic'))} "
                              "scales dynamically from --init-scale)")
        for name in ("optimizer", "lr_schedule", "lr"):  # auto (lr: null): the model's recipe, stored resolved
            if getattr(self, name) in ("auto", None):
                object.__setattr__(self, name, MODEL_RECIPES[self.model][name])
        if self.vit_dim % self.vit_heads:
            raise ConfigError(f"--vit-dim {self.vit_dim} is not a multiple of --vit-heads {self.vit_heads} "
                              "(each head gets vit_dim / vit_heads features)")
        if self.model == "vit":
            check_vit_patch(self.vit_patch, self.dataset)
        valid = model_specs.spec(self.model).layer_names(self.model_size)
        for name in self.fp32_layers:
            if name not in valid:
                example = model_specs.spec(self.model).sub_block
                sub = f", or a sub-block such as {example}" if example else ""
                raise ConfigError(f"unknown layer {name!r} for --fp32-layers of {self.model} "
                                  f"(valid: {', '.join(MODEL_BLOCKS[self.model])}{sub})")
        fp8_error = fp8.plan_error((self.framework,), (self.model,), (self.precision,), set())
        if fp8_error or (self.fp8_outlier and self.model not in fp8.FP8_MODELS):
            raise ConfigError(fp8_error or f"--fp8-outlier needs the vit (got {self.model!r})")

    @property
    def cell_id(self) -> str:
        """Unique, readable name of this cell inside a compare run (identity also lives in columns)."""
        return (f"{self.framework}-{self.model}-{self.dataset}-{self.precision}-s{self.seed}"
                + (f"-b{self.batch_size}" if self.batch_sweep else "") + ("-tuned" if self.step == "tuned" else "")
                + (f"-r{self.replicas}-ar{self.allreduce}" if self.replicas > 1 else "")
                + (f"-floor-t{self.threads}" if self.thread_floor else ""))

    @property
    def vit_shape(self) -> dict[str, int]:
        """The ViT's size as both models.py build_model and kit/flops.py take it."""
        return {"dim": self.vit_dim, "depth": self.vit_depth, "heads": self.vit_heads, "patch": self.vit_patch,
                "mlp_ratio": self.vit_mlp_ratio}

    @property
    def model_size(self) -> dict:
        """The size options every model spec reads its part of (contract/models.py): width, the vit's shape."""
        return {"width": self.width, "vit": self.vit_shape}

    @property
    def precision_spec(self) -> precisions.Precision:
        """What this cell's precision mode is (contract/precision.py)."""
        return precisions.of(self.precision)

    @property
    def mixed(self) -> bool:
        return self.precision_spec.mixed

    @property
    def half(self) -> str | None:
        """The half-precision format of a mixed mode: "float16", "bfloat16" or None (fp32)."""
        return self.precision_spec.half

    @property
    def loss_scaling(self) -> str | None:
        """"dynamic", "static" or None."""
        return self.precision_spec.loss_scaling

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config key(s) {', '.join(unknown)} (valid: {', '.join(sorted(known))})")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"malformed config JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)


def check_vit_patch(patch: int, dataset: str) -> None:
    """A patch that tiles the dataset's images exactly: a larger one has no patch to embed, one that does not divide
    the side would silently drop the border pixels."""
    side = IMAGE_SIZES[dataset]
    valid = ", ".join(str(p) for p in range(1, side + 1) if side % p == 0)
    if patch > side:
        raise ConfigError(f"--vit-patch {patch} is larger than the {side}x{side} images of {dataset!r} "
                          f"(valid: a divisor of {side}: {valid})")
    if side % patch:
        raise ConfigError(f"--vit-patch {patch} does not divide the {side}x{side} images of {dataset!r}: "
                          f"{side % patch} border pixel(s) would be dropped (valid: {valid})")


@dataclass(frozen=True)
class DataParallelOptions:
    """The data-parallel matrix axis, a harness option beside RunConfig's `replicas` (harness/run/cli.py's
    compare_options reads it; harness/run/launch.py turns it into cells with their own `allreduce`)."""

    allreduce: tuple[str, ...] = option((ALLREDUCE_REFERENCE,), "gradient all-reduce precisions of the --replicas "
                                        "N-worker cells (a matrix axis like --precisions): fp32, or fp16/bf16 where "
                                        "the framework's own engine offers it (torch DDP's compress hooks; Keras on "
                                        "JAX: the policy's compute dtype); elsewhere the cell is recorded unavailable "
                                        "with the reason", choices=ALLREDUCES)


def run_options() -> dict[str, Declared]:
    """RunConfig's declared fields (cached)."""
    return _run_options()


@functools.cache
def _run_options() -> dict[str, Declared]:
    return declared(RunConfig)
