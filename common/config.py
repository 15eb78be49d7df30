"""One typed source of truth for what a run is.

`RunConfig` describes one cell of a compare matrix (one framework, model, dataset, precision
and seed). It is frozen, validated on construction, saved as JSON next to every result and
read back by the framework child, so the parent and both frameworks can never disagree about
a hyperparameter. Everything here is framework-free: no torch, no tensorflow.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

FRAMEWORKS = ("torch", "tf")
# Precision modes, named the same in both frameworks.
#   fp32: no autocast / float32 policy.
#   fp16: mixed float16 with dynamic loss scaling (GradScaler / LossScaleOptimizer).
#   bf16: mixed bfloat16, no loss scaling (bfloat16 has float32's exponent range).
#   fp16-noscale: mixed float16 with no loss scaling at all (watch gradients underflow).
#   fp16-static: mixed float16 with a fixed scale (--loss-scale), no growth or backoff.
PRECISIONS = ("fp32", "fp16", "bf16", "fp16-noscale", "fp16-static")
DEFAULT_PRECISIONS = ("fp32", "fp16", "bf16")
# Blocks --fp32-layers may name (a dotted sub-block such as layer1.0 is allowed too).
MODEL_BLOCKS = {"simple_cnn": ("conv1", "conv2", "fc"),
                "resnet18": ("conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "fc")}
MODELS = ("simple_cnn", "resnet18")
DATASETS = ("digits", "synthetic", "synthetic_cifar", "cifar10", "cifar100")
DEVICES = ("cpu", "cuda")
OPTIMIZERS = ("adam", "sgd")
# aligned: the hyperparameter mapping of common/mapping.py applied, both sides configured equal.
# defaults: each framework with its own out-of-the-box defaults (what a user switching sees).
COMPARISONS = ("aligned", "defaults")
# shared: every cell of a (model, dataset, seed) starts from the same weights, made once by the
# first cell and handed to the others through numpy; framework: each framework initialises its own.
INITS = ("shared", "framework")
# plain: the tutorial loop (eager, the default optimizer); tuned: what the framework offers to go fast
# (torch fused optimizer + torch.compile, CUDA graphs on a GPU; Keras jit_compile/XLA). See README.
STEPS = ("plain", "tuned")

# Framework package that runs each framework's child process.
FRAMEWORK_MODULES = {"torch": "torch_impl", "tf": "tf_impl"}
FRAMEWORK_LIBRARIES = {"torch": "torch", "tf": "tensorflow"}  # what each child must be able to import
FRAMEWORK_LABELS = {"torch": "PyTorch", "tf": "TensorFlow/Keras"}
# The order every table and figure lists frameworks and precisions in.
DISPLAY_ORDER = {**{f: i for i, f in enumerate(FRAMEWORKS)}, **{p: i for i, p in enumerate(PRECISIONS)}}


def framework_label(framework: str) -> str:
    return FRAMEWORK_LABELS.get(framework, framework)


def display_order(column):
    """A sort key for DataFrame.sort_values: framework and precision columns in DISPLAY_ORDER."""
    return column.map(DISPLAY_ORDER) if column.name in ("framework", "precision") else column


class ConfigError(ValueError):
    """A bad user-supplied value. The message is one line naming the value and valid choices."""


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {name} {value!r} (valid: {', '.join(choices)})")


def _positive(name: str, value: Any, kind: type = int) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok:
        raise ConfigError(f"{name} must be a positive {kind.__name__}, got {value!r}")


@dataclass(frozen=True)
class RunConfig:
    """One training run: a cell of the compare matrix. Units in the comments."""

    framework: str = "torch"
    model: str = "simple_cnn"
    dataset: str = "digits"
    precision: str = "fp32"
    seed: int = 0
    device: str = "cpu"  # resolved device, never "auto"
    comparison: str = "aligned"  # one of COMPARISONS
    init: str = "shared"  # one of INITS
    width: int = 64  # resnet18 base width (channels of the first stage); simple_cnn ignores it
    data_dir: str | None = None  # where to look first for dataset archives (CIFAR)
    augment: bool = False  # random crop (4-pixel padding) + horizontal flip, identical in both frameworks
    tf32: str = "off"  # TF32 for float32 matmul/conv on NVIDIA GPUs, set the same in both frameworks
    compile: bool = False  # torch.compile / Keras jit_compile=True (XLA); compile time reported apart
    channels_last: bool = False  # torch only: NHWC memory format for convolutions (Keras is NHWC already)
    # Keras only: where per-step values live during an epoch. "host": read after each step (exact step
    # times; on a GPU a wait per step); "device": kept on the device, read once per epoch (no per-step
    # times); "auto": device on a GPU, host on a CPU (where reading costs nothing).
    step_values: str = "auto"
    epochs: int = 8
    batch_size: int = 64  # images per optimizer step
    steps_per_epoch: int | None = None  # cap on steps per epoch (None: the whole training set)
    optimizer: str = "adam"
    lr: float = 1e-3
    adam_epsilon: float = 1e-7  # set explicitly on both sides (defaults: torch 1e-8, Keras 1e-7)
    momentum: float = 0.9  # SGD momentum (torch convention; Keras uses the same one for SGD)
    warmup_steps: int = 5  # first steps of the run, excluded from step-time statistics
    diverge_after: int = 20  # stop, recorded as diverged, after this many consecutive non-finite losses
    # Dynamic loss scaler for fp16, set explicitly on both sides
    # (defaults: torch GradScaler 2**16 / 2000 steps, Keras LossScaleOptimizer 2**15 / 2000).
    init_scale: float = 2.0**15
    growth_interval: int = 2000  # steps without overflow before the scale doubles
    loss_scale: float | None = None  # fp16-static's fixed scale (required there, refused elsewhere)
    fp32_layers: tuple[str, ...] = ()  # blocks forced to float32 under mixed precision, in both frameworks
    clip_grad_norm: float | None = None  # global gradient-norm clipping, applied to unscaled gradients
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)  # intra- and inter-op
    step: str = "plain"  # one of STEPS: the training loop (common/perf.py, README "plain and tuned steps")
    batch_sweep: bool = False  # a cell of a --batch-sizes sweep: its batch size is part of its cell id

    def __post_init__(self) -> None:
        _choice("framework", self.framework, FRAMEWORKS)
        _choice("model", self.model, MODELS)
        _choice("dataset", self.dataset, DATASETS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("device", self.device, DEVICES)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("comparison", self.comparison, COMPARISONS)
        _choice("init", self.init, INITS)
        _choice("tf32 setting", self.tf32, ("on", "off"))
        _choice("step_values", self.step_values, ("auto", "host", "device"))
        _choice("step", self.step, STEPS)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        for name in ("epochs", "batch_size", "growth_interval", "threads", "width", "diverge_after"):
            _positive(name, getattr(self, name))
        if self.steps_per_epoch is not None:
            _positive("steps_per_epoch", self.steps_per_epoch)
        for name in ("lr", "adam_epsilon", "init_scale"):
            _positive(name, getattr(self, name), float)
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ConfigError(f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")
        if self.precision == "fp16-static" and self.loss_scale is None:
            raise ConfigError("precision 'fp16-static' needs --loss-scale (a fixed loss scale, e.g. 1024)")
        if self.loss_scale is not None:
            if self.precision != "fp16-static":
                raise ConfigError(f"--loss-scale {self.loss_scale:g} only applies to precision fp16-static "
                                  f"(got {self.precision!r}; fp16 scales dynamically from --init-scale)")
            _positive("loss_scale", self.loss_scale, float)
        if self.clip_grad_norm is not None:
            _positive("clip_grad_norm", self.clip_grad_norm, float)
        object.__setattr__(self, "fp32_layers", tuple(self.fp32_layers))  # JSON gives a list
        for name in self.fp32_layers:
            blocks = MODEL_BLOCKS[self.model]
            if name.split(".")[0] not in blocks:
                raise ConfigError(f"unknown layer {name!r} for --fp32-layers of {self.model} "
                                  f"(valid: {', '.join(blocks)}, or a dotted sub-block)")
        if not (isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1):
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum!r}")

    @property
    def cell_id(self) -> str:
        """Unique, readable name of this cell inside a compare run (identity also lives in columns)."""
        return (f"{self.framework}-{self.model}-{self.dataset}-{self.precision}-s{self.seed}"
                + (f"-b{self.batch_size}" if self.batch_sweep else "") + ("-tuned" if self.step == "tuned" else ""))

    @property
    def mixed(self) -> bool:
        return self.precision != "fp32"

    @property
    def half(self) -> str | None:
        """The half-precision format of a mixed mode: "float16", "bfloat16" or None (fp32)."""
        return None if self.precision == "fp32" else ("bfloat16" if self.precision == "bf16" else "float16")

    @property
    def loss_scaling(self) -> str | None:
        """"dynamic", "static" or None."""
        return {"fp16": "dynamic", "fp16-static": "static"}.get(self.precision)

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
