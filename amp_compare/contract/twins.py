"""The twin contract: what each framework package (torch_impl, keras_impl) provides, with one signature.

Every module the two packages both have (MODULES: tests/test_twins.py checks the list against the packages'
files) has a Protocol below listing the functions it must define, written once: parameter names, kinds and
defaults are the contract (annotations are each framework's own types, so `Any` here). Beyond the Protocols,
a public function that both twins of a module define under one name must have one signature too
(`shared_mismatches`), unless OWN_SIGNATURES names it with its reason. tests/test_twins.py checks both packages
with inspect.signature, so the two implementations cannot drift apart again. Framework-free: nothing here
imports a framework.

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

# The modules both framework packages have (every twin pair): these, each covered by its Protocol, and
# SOURCE_MODULES. tests/test_twins.py checks TWIN_MODULES against the packages' files.
MODULES = ("amp", "train", "settings", "numerics", "probe", "models", "trial", "fp8", "vit", "profile", "loop",
           "distributed")
# Twin pairs whose import changes the importing process (entry.py marks modules missing before the framework
# loads, for the child alone): checked from their source, for the names kit/child.py and kit/zygote.py read.
SOURCE_MODULES: dict[str, tuple[str, ...]] = {"entry": ("TRAIN_MODULE", "PRELOAD")}
TWIN_MODULES = MODULES + tuple(SOURCE_MODULES)


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

    def assemble(self, cfg: Any, data: Any, shared_init: Any, compile: Any) -> Any:
        """The cell's model in kit/build.py's order with this framework's steps; a kit/build.Built."""

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

    def set_threads(self, n: int) -> int:
        """Intra-op threads from here on, where the framework can still change them; the count in use."""


@runtime_checkable
class Fp8(Protocol):
    """<framework>_impl/fp8.py: the fp8 recipes on the framework's layers (contract/fp8.py, kit/fp8.py)."""

    def convert(self, model: Any, cfg: Any) -> Any:
        """--fp8-outlier's activation and, in the fp8 modes, the float8 layers outside --fp32-layers."""

    def converted(self, model: Any) -> dict:
        """The layers running in fp8, by canonical name."""

    def settings(self, model: Any) -> dict:
        """The fp8 recipe as the live layers hold it (contract/fp8.Recipe's fields), and the converted layers."""

    def add_outlier(self, model: Any) -> None:
        """--fp8-outlier: OUTLIER_VALUE added to the class token's first feature entering blocks.0.attn."""

    def capture_step(self, model: Any, x: Any, y: Any) -> dict:
        """One training step's tensors of every converted layer, as 2-D float32 numpy."""

    def layer_rows(self, model: Any, x: Any, y: Any, cfg: Any, when: str, step: int) -> list[dict]:
        """Per converted layer: the SQNR of its fp8 operands on this batch (the report's fp8 section)."""


@runtime_checkable
class Vit(Protocol):
    """<framework>_impl/vit.py: the vit's layers and what train() and settings read of them."""

    def paused(self, model: Any) -> Any:
        """A context in which the vit's headroom recorders record nothing."""

    def read_headroom(self, model: Any) -> list[dict]:
        """The epoch's overflow-headroom maxima per recorded tensor, one read of the device."""

    def arguments(self, cfg: Any, settings: dict) -> dict | None:
        """What models.build_model's vit argument gets for this cell (None for the CNNs)."""

    def describe_defaults(self) -> dict[str, object]:
        """The framework's own defaults for the vit's mapped settings, from fresh objects."""

    def settings_used(self, model: Any, cfg: Any) -> dict:
        """The vit's settings read back from the live model (empty for the CNNs)."""


@runtime_checkable
class Profile(Protocol):
    """<framework>_impl/profile.py: --profile's windows after the timed epochs (kit/profile.py: their order)."""

    def start_logs(self, cfg: Any) -> Any:
        """What the window needs caught from the child's start (torch: nothing; TensorFlow: oneDNN's log)."""

    def profile_window(self, cfg: Any, trained: Any, data: Any, result: Any, logs: Any) -> None:
        """Profile a few steps of what train() trained; rows and columns into result."""


@runtime_checkable
class Loop(Protocol):
    """<framework>_impl/loop.py: no function of one signature; what they share is kit/training.py (StepBook,
    times_each_step, untimed_steps). The step loop is each framework's idiom (see above)."""


@runtime_checkable
class Distributed(Protocol):
    """<framework>_impl/distributed.py: no function of one signature; each framework's data-parallel engine
    (torch: torchrun workers and DDP; Keras: a tf.distribute strategy or JAX's distribution), and what they share
    is kit/dataparallel.py."""


PROTOCOLS: dict[str, type] = {"amp": Amp, "train": Train, "settings": Settings, "numerics": Numerics,
                               "probe": Probe, "models": Models, "trial": Trial, "fp8": Fp8, "vit": Vit,
                               "profile": Profile, "loop": Loop, "distributed": Distributed}

# Public functions both twins of a module define under one name but with each framework's own signature: the
# idioms of the docstring above, the model builders (Keras' extra build arguments) and train()'s phases, which take
# each framework's objects (torch: the Compiled tuple and device tensors; Keras: the model and its dataset).
OWN_SIGNATURES: dict[str, set[str]] = {
    "amp": {"mixed_precision", "clip_gradients", "train_step"},
    "models": {"build_model", "simple_cnn", "resnet18", "vit"},
    "numerics": {"loss_fn"},
    "train": {"compile_model", "run_info", "numerics_lab", "train_epochs", "close_records"},
}


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


def public_functions(module: ModuleType) -> dict[str, Any]:
    """The functions a module defines itself (not imported), by name, less the _private ones."""
    return {name: f for name, f in vars(module).items()
            if not name.startswith("_") and inspect.isfunction(f) and f.__module__ == module.__name__}


def shared_mismatches(torch_modules: dict[str, ModuleType], keras_modules: dict[str, ModuleType]) -> list[str]:
    """Functions both twins of a module define under one name with another signature, outside OWN_SIGNATURES.
    Each argument: {"amp": <module>, ...} of one framework package."""
    out = []
    for key in MODULES:
        ours, theirs = public_functions(torch_modules[key]), public_functions(keras_modules[key])
        for name in sorted(ours.keys() & theirs.keys() - OWN_SIGNATURES.get(key, set())):
            a, b = _parameters(ours[name], False), _parameters(theirs[name], False)
            if a != b:
                out.append(f"{key}.{name}: ({_show(a)}) against ({_show(b)})")
    return out


def source_mismatches(key: str, module_name: str, source: str) -> list[str]:
    """The names SOURCE_MODULES[key] asks for that a twin's source (module_name: for the message) does not assign
    at module level."""
    import ast

    assigned = set()
    for node in ast.parse(source).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        assigned |= {t.id for t in targets if isinstance(t, ast.Name)}
    return [f"{module_name}.{name}: missing" for name in SOURCE_MODULES[key] if name not in assigned]


# The NaN/Inf locator hook both train() functions hand the run's kit/training.StepBook: called once, for the
# first step whose loss was non-finite or whose update was skipped (after the book found no non-finite parameter).
class Locate(Protocol):
    def __call__(self, epoch: int, batch: int, scale: float) -> dict | None:
        """Where the batch at (epoch, batch) of the plan first turns non-finite when trained at loss scale
        `scale` (the scale that step used): numerics.locate_nonfinite's finding, or None if not reproduced."""
