"""The twin contract: what each framework package (torch_impl, keras_impl) provides, with one signature.

Each Protocol below lists the functions one module of a framework package must define, written once:
parameter names, kinds and defaults are the contract (annotations are each framework's own types, so
`Any` here). tests/test_twins.py checks both packages against it with inspect.signature, so the two
implementations cannot drift apart again. Framework-free: nothing here imports a framework.

What is deliberately NOT one signature, because the frameworks' idioms differ (docs/ARCHITECTURE.md):
  amp.mixed_precision   torch: a context around each forward (device_type); Keras: a global policy set
                        before the model is built
  loss scaling          torch: amp.make_scaler(cfg), a GradScaler beside the optimizer; Keras:
                        amp.with_loss_scaling(cfg, optimizer), the optimizer wrapped (it is the "scaler")
  amp.clip_gradients    torch: unscale_ + clip_grad_norm_ inside the step; Keras: the optimizer's
                        global_clipnorm, applied after LossScaleOptimizer unscales
  amp.train_step        torch: the explicit scaled step; Keras: the core of AmpModel.train_step. Both
                        return kit/training.StepRecord (loss, logits, scale, skipped) of device tensors
  train.compile_model   torch: to the device, optimizer, scaler, torch.compile (a Compiled tuple);
                        Keras: model.compile
  the step loop itself  loop.py: torch run_epoch + StepClock; Keras fit() + AmpModel + the recorders,
                        both handing host values to kit/training.StepBook
  models.build_model    Keras adds model_class, stride2_padding and output_dtype
  numerics.loss_fn      each framework's own argument order (torch (logits, y), Keras (y, logits))
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

# The modules of each framework package this contract covers, by Protocol.
MODULES = ("amp", "train", "settings", "numerics", "probe", "models", "trial")


@runtime_checkable
class Amp(Protocol):
    """<framework>_impl/amp.py: the framework's AMP idiom."""

    def amp_setting(self, precision: str) -> Any:
        """What the framework's AMP switch takes for a mode (torch: autocast dtype; Keras: policy name)."""

    def current_scale(self, scaler: Any) -> Any:
        """The live loss scale as a device tensor (1.0: no loss scaling)."""

    def describe_amp(self, cfg: Any) -> str:
        """The AMP API a cell used, in words (the run table's amp_api)."""


@runtime_checkable
class Train(Protocol):
    """<framework>_impl/train.py: one cell's training, entered by kit/child.py."""

    def setup(self, cfg: Any) -> None:
        """Seeds, threads, TF32 and (Keras) the dtype policy, before anything is built."""

    def make_model(self, cfg: Any, data: Any) -> Any:
        """The cell's model (with --fp32-layers applied)."""

    def make_optimizer(self, cfg: Any, params: Any) -> Any:
        """The cell's optimizer for these parameters (Keras: built on them, loss scaling included)."""

    def make_dataset(self, cfg: Any, data: Any) -> tuple:
        """The dataset in the form the cell's step reads it (device tensors / batch indices and images)."""

    def train(self, cfg: Any, data: Any, progress: Any, shared_init: Any) -> Any:
        """Train one cell; returns kit/child.TrainResult."""


@runtime_checkable
class Settings(Protocol):
    """<framework>_impl/settings.py: what a cell trained with, for harness/report/settings_check.py."""

    def describe_defaults(self) -> dict[str, object]:
        """The framework's own defaults for each item of contract/mapping.DIFFERENCES, from fresh objects."""

    def settings_used(self, model: Any, optimizer: Any, scaler: Any, cfg: Any) -> dict:
        """The values the run trained with, read back from its live objects (scaler: torch's GradScaler;
        in Keras the optimizer itself, as amp.with_loss_scaling returned it)."""


@runtime_checkable
class Numerics(Protocol):
    """<framework>_impl/numerics.py: the numerics lab; the same rows from both frameworks."""

    def dtype_audit(self, model: Any, x: Any, y: Any, precision: str) -> list[dict]:
        """The dtype each op of one training step computes in, per layer."""

    def apply_fp32_layers(self, model: Any, names: Any) -> Any:
        """Keep the named blocks in float32 under mixed precision."""

    def gradient_underflow(self, model: Any, x: Any, y: Any, precision: str, loss_scale: float,
                           loss_weight: float = 1.0) -> list[dict]:
        """How many gradient elements float16 would flush to zero, with and without the loss scale."""

    def adam_formula_gap(self, model: Any, x: Any, y: Any, precision: str, optimizer: Any) -> dict:
        """One Adam step of torch's and Keras' formulas on this batch's real gradient (kit/adam_gap.py)."""

    def locate_nonfinite(self, model: Any, x: Any, y: Any, precision: str, loss_scale: float) -> dict | None:
        """The first layer whose output or gradient is inf/NaN on this batch."""


@runtime_checkable
class Probe(Protocol):
    """<framework>_impl/probe.py: one --find-max-batch probe child (kit/probe.py runs it)."""

    def two_steps(self, cfg: Any, data: Any, x: Any, y: Any) -> tuple[int, str]:
        """Two training steps as train() takes them; (peak bytes, what the peak measures)."""

    def limit_gpu(self, cap_bytes: int) -> str:
        """Make the framework refuse to allocate past cap_bytes on the GPU; says how."""

    def is_out_of_memory(self, exc: Exception) -> bool:
        """Whether an exception is the framework's out-of-memory error."""


@runtime_checkable
class Models(Protocol):
    """<framework>_impl/models.py: the twin models; weights in kit/weights.py's canonical numpy form."""

    def get_weights(self, model: Any) -> dict:
        """Canonical weights (torch names and layouts) as numpy arrays."""

    def set_weights(self, model: Any, weights: dict) -> None:
        """Load canonical weights."""


@runtime_checkable
class Trial(Protocol):
    """<framework>_impl/trial.py: a speed trial's models (kit/trial.py runs them)."""

    def steppers(self, cfgs: Any, data: Any, shared_init: Any) -> tuple[list, int]:
        """One kit/trial.Stepper per configuration (fp32 first), built and stepped by the cells' own functions, and
        the intra-op threads the process runs with."""


PROTOCOLS: dict[str, type] = {"amp": Amp, "train": Train, "settings": Settings, "numerics": Numerics,
                               "probe": Probe, "models": Models, "trial": Trial}


def _parameters(function: Any, drop_self: bool) -> list[tuple[str, str, object]]:
    params = list(inspect.signature(function).parameters.values())[1 if drop_self else 0:]
    return [(p.name, p.kind.name, p.default) for p in params]


def _show(params: list[tuple[str, str, object]]) -> str:
    return ", ".join(n + ("" if d is inspect.Parameter.empty else f"={d!r}") for n, _, d in params)


def mismatches(modules: dict[str, ModuleType]) -> list[str]:
    """Where one framework package breaks the contract: a missing function, or another signature
    (parameter names, kinds and defaults). modules: {"amp": <module>, "train": <module>, ...}."""
    out = []
    for key, protocol in PROTOCOLS.items():
        module = modules[key]
        for name in sorted(n for n in vars(protocol) if not n.startswith("_") and callable(getattr(protocol, n))):
            function = getattr(module, name, None)
            if not callable(function):
                out.append(f"{module.__name__}.{name}: missing")
                continue
            want, got = _parameters(getattr(protocol, name), True), _parameters(function, False)
            if got != want:
                out.append(f"{module.__name__}.{name}({_show(got)}): the contract says ({_show(want)})")
    return out


# The NaN/Inf locator hook both train() functions hand the run's kit/training.StepBook: called once, for the
# first step whose loss was non-finite or whose update was skipped (after the book found no non-finite parameter).
class Locate(Protocol):
    def __call__(self, epoch: int, batch: int, scale: float) -> dict | None:
        """Where the batch at (epoch, batch) of the plan first turns non-finite when trained at loss scale
        `scale` (the scale that step used): numerics.locate_nonfinite's finding, or None if not reproduced."""
