"""The fp8 training recipes, described once: what each framework's float8 training does to which tensor.

PyTorch trains in fp8 through torchao (`convert_to_float8_training`: every `nn.Linear` becomes a `Float8Linear`),
Keras 3 through `model.quantize("float8")` (every `Dense` and `EinsumDense` gets float8 scale and amax-history
variables). The two recipes differ in ways the precision name hides; this module writes them down, and each
framework's fp8.py reads the same facts back from the live objects (`settings`), so the report shows declared
beside used, as contract/mapping.py does for the hyperparameters that look equal but are not.

Framework-free: formats are ml_dtypes / numpy names ("float8_e4m3fn"); kit/fp8.py computes a float64 reference of
each recipe from these rows, and torch_impl/fp8.py / keras_impl/fp8.py convert a model to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from amp_compare.contract.precision import names as precision_names

# The largest finite value of each format (ml_dtypes.finfo(...).max; torch.finfo(...).max agrees).
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
ROLES = ("input", "kernel", "grad_output")  # the three tensors a converted layer quantizes
FP8_MODES = ("fp8", "fp8-rowwise")
PARTNER = "bf16"  # the precision an fp8 mode's answer pairs its accuracy with: the half format it would replace
# The models whose compute is Linear / Dense layers. The CNNs' compute is convolutions, which neither torchao's
# float8 training nor Keras' float8 quantization converts: their only Linear is the classifier head, and an "fp8"
# cell that ran every convolution in float32 would name a precision it did not train in. Refused (exit 2).
FP8_MODELS = ("vit",)
# Keras' float8 on its torch backend was not checked here; TensorFlow and JAX fit a float8 model on this CPU.
FP8_FRAMEWORKS = ("torch", "tf", "keras-jax")
# --fp8-outlier: added to one activation (the class token's first feature entering blocks.0.attn) in every cell of
# the run; large enough that a per-tensor scale pushes the other values of that tensor into e4m3's subnormals.
OUTLIER_VALUE = 2.0**14


@dataclass(frozen=True)
class Recipe:
    precision: str  # the mode's name (contract/precision.py)
    library: str  # what implements it, in words
    formats: tuple[str, str, str]  # the fp8 format of (input, kernel, grad_output), ROLES' order
    scaling: str  # "dynamic": the scale comes from this step's tensor; "delayed": from an amax history of past steps
    granularity: str  # "tensor": one scale per tensor; "row": one per row (input, grad_output) / output column
    amax_history: int  # steps of amax the scale is computed from (1: this step's own)
    power_of_2_scales: bool  # scales rounded down to a power of two
    scale_convention: str  # "multiply": fp8 = x * scale, scale = fmax / amax; "divide": fp8 = x / s, s = amax / fmax
    converts: str  # which layer types become fp8 (everything else keeps the base precision)
    base: str  # the precision of everything not converted, and of the matmul's accumulation on a CPU

    @property
    def format_of(self) -> dict[str, str]:
        return dict(zip(ROLES, self.formats))


RECIPES = {
    ("torch", "fp8"): Recipe("fp8", "torchao.float8 Float8LinearConfig recipe 'tensorwise' (emulate=True on a CPU)",
                             ("float8_e4m3fn", "float8_e4m3fn", "float8_e5m2"), "dynamic", "tensor", 1, False,
                             "multiply", "torch.nn.Linear", "float32"),
    ("torch", "fp8-rowwise"): Recipe("fp8-rowwise", "torchao.float8 Float8LinearConfig recipe 'rowwise' "
                                     "(emulate=True on a CPU)", ("float8_e4m3fn",) * 3, "dynamic", "row", 1, True,
                                     "multiply", "torch.nn.Linear", "float32"),
    ("keras", "fp8"): Recipe("fp8", "keras Model.quantize('float8'), policy float8_from_float32",
                             ("float8_e4m3fn", "float8_e4m3fn", "float8_e5m2"), "delayed", "tensor", 1024, False,
                             "divide", "keras.layers.Dense, keras.layers.EinsumDense", "float32"),
}
# The settings read back from the live objects that differ between the two recipes, and why it matters.
DIFFERENCES = {
    "scaling": "torchao scales each tensor by its own amax of this step; Keras by the largest amax of up to "
               "1,024 past steps (delayed): its first step quantizes with scale 1, and after a spike the large "
               "amax holds the scale down for 1,024 steps (small values lose precision).",
    "amax_history": "the length of Keras' amax-history variables (1 for torchao: no history).",
    "formats": "torchao's rowwise recipe quantizes output gradients to e4m3 (more precision, less range, one "
               "scale per row); tensorwise and Keras use e5m2 there.",
    "granularity": "rowwise keeps one scale per row, so one large activation does not flatten every other row's "
                   "values (the --fp8-outlier lesson).",
    "power_of_2_scales": "torchao's rowwise rounds scales down to powers of two (exact rescaling).",
    "scale_convention": "torchao stores fmax / amax and multiplies; Keras stores amax / fmax and divides "
                        "(the report shows both as fmax / amax).",
    "converted": "torchao swaps nn.Linear only; Keras converts Dense and EinsumDense (MultiHeadAttention's "
                 "projections too); convolutions stay in the base precision in both.",
}


def framework_family(framework: str) -> str:
    return "torch" if framework == "torch" else "keras"


def is_fp8(precision: str) -> bool:
    return precision in FP8_MODES


def recipe(framework: str, precision: str) -> Recipe | None:
    """The recipe a cell trains with; None where the framework has none for the mode (unavailable_reason says why)."""
    return RECIPES.get((framework_family(framework), precision))


def unavailable_reason(framework: str, precision: str, replicas: int = 1) -> str | None:
    """Why an fp8 cell cannot run on this framework (recorded as unavailable), or None."""
    if not is_fp8(precision):
        return None
    if recipe(framework, precision) is None:
        return (f"Keras 3 has no {precision} recipe: Model.quantize('float8') scales per tensor only "
                "(delayed scaling from an amax history); rowwise scaling is torchao's")
    if replicas > 1:
        return ("fp8 with --replicas > 1 is not offered: how each engine combines the per-replica amax and scale "
                "(torchao's dynamic scales per worker; Keras' amax-history variables written through the "
                "optimizer's overwrite-with-gradient) has not been read back and checked here")
    return None


def plan_error(frameworks, models, precisions, given: set[str]) -> str | None:
    """A bad combination of fp8 with the rest of a compare command (one line for exit 2), or None."""
    fp8 = [p for p in precisions if is_fp8(p)]
    if not fp8:
        return ("--fp8-outlier only applies to the fp8 precisions (valid: --precisions with fp8 or fp8-rowwise)"
                if "fp8_outlier" in given else None)
    if "fp8_outlier" in given and any(f != "torch" for f in frameworks):
        # Keras' injection (keras_impl/fp8.add_outlier) reaches the layer in-process but was not seen in a compare
        # child's records: refused until that is understood, rather than a Keras cell without the outlier
        return "--fp8-outlier runs with --frameworks torch only (valid: --frameworks torch)"
    bad_models = [m for m in models if m not in FP8_MODELS]
    if bad_models:
        return (f"precision {fp8[0]} cannot run model {bad_models[0]!r}: fp8 training converts Linear/Dense "
                f"layers only and its compute is convolutions (valid models for fp8: {', '.join(FP8_MODELS)})")
    bad_frameworks = [f for f in frameworks if f not in FP8_FRAMEWORKS]
    if bad_frameworks:
        return (f"precision {fp8[0]} cannot run framework {bad_frameworks[0]!r} (valid for fp8: "
                f"{', '.join(FP8_FRAMEWORKS)})")
    scaling = [o for o in ("init_scale", "growth_interval") if o in given]
    if scaling and not set(precision_names(loss_scaling="dynamic")) & set(precisions):
        return (f"--{scaling[0].replace('_', '-')} is fp16's loss-scaling option and fp8 trains without loss "
                "scaling (valid: drop it, or add fp16 to --precisions)")
    return None
