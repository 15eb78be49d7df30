"""The precision modes, described once: what each one means in both frameworks.

Every other module asks this table (`of(name)`, `names(...)`, `is_reference`) instead of comparing
precision strings, so adding a mode or changing what one does is one row here. Framework-free: the
dtypes are names ("float16"), which torch_impl/amp.py and keras_impl/amp.py turn into their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str  # the mode's name on the command line, in records and in reports
    label: str  # what it is, in words (help, captions)
    half: str | None  # the half-precision format mixed precision computes in; None: float32 throughout
    loss_scaling: str | None  # "dynamic" (grows and backs off), "static" (--loss-scale, fixed) or None
    keras_policy: str  # the Keras dtype policy
    torch_autocast: str | None  # the torch.autocast dtype; None: no autocast
    fp8: str | None = None  # fp8 training's scaling granularity on top of the base ("tensorwise"; contract/fp8.py)

    @property
    def mixed(self) -> bool:
        return self.half is not None


TABLE: tuple[Precision, ...] = (
    Precision("fp32", "float32 throughout", None, None, "float32", None),
    Precision("fp16", "mixed float16, dynamic loss scaling", "float16", "dynamic", "mixed_float16", "float16"),
    Precision("bf16", "mixed bfloat16, no loss scaling (float32's exponent range)", "bfloat16", None,
              "mixed_bfloat16", "bfloat16"),
    Precision("fp16-noscale", "mixed float16, no loss scaling (watch gradients underflow)", "float16", None,
              "mixed_float16", "float16"),
    Precision("fp16-static", "mixed float16, a fixed loss scale (--loss-scale), no growth or backoff", "float16",
              "static", "mixed_float16", "float16"),
    Precision("fp8", "fp8 training (e4m3 matmul inputs), each framework's own recipe on a float32 base", None,
              None, "float32", None, "tensorwise"),
    Precision("fp8-rowwise", "fp8 training with one scale per row (torchao's rowwise recipe) on a float32 base",
              None, None, "float32", None, "rowwise"),
)
BY_NAME = {p.name: p for p in TABLE}
NAMES = tuple(BY_NAME)  # in display order
REFERENCE = "fp32"  # the mode every mixed mode is compared with
SCALING_WORDS = {"dynamic": "dynamic", "static": "fixed"}  # a scaled mode's kind, as figure captions say it


def of(name: str) -> Precision:
    """The description of one mode; KeyError names the valid ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown precision {name!r} (valid: {', '.join(NAMES)})") from None


def names(**where: object) -> tuple[str, ...]:
    """The modes whose attributes equal every given value, in display order: names(half="float16")."""
    return tuple(p.name for p in TABLE if all(getattr(p, key) == value for key, value in where.items()))


def scaled_names() -> tuple[str, ...]:
    """The loss-scaled modes (dynamic or static), in display order."""
    return tuple(p.name for p in TABLE if p.loss_scaling is not None)


def is_reference(precision):
    """Whether a mode (a string, or each element of a pandas Series) is the float32 reference."""
    return precision == REFERENCE


def is_mixed(precision):
    """Whether a mode (a string, or each element of a pandas Series) is a mixed-precision one."""
    return precision != REFERENCE
