"""One declaration per model: the framework-free facts every other part derives from.

A `ModelSpec` holds what a model is apart from any framework: the blocks --fp32-layers may name, every
layer name both twins share, the FLOP count of one image's training step, the training recipe "auto"
means, which hooks it takes, and where its two twins are (a builder in each framework's package, named
"module:function", imported by that framework's child only). contract/config.py's registries (`MODELS`,
`MODEL_BLOCKS`, `MODEL_RECIPES`, `model_layer_names`), kit/flops.py's count, each framework's
`models.build_model` and the tests' parametrisation read the registry here, so a new model is its spec plus
its two twins. `registered(spec)` adds one for a while (the test-only MLP of tests/model_mlp.py).

A "size" is the dict `RunConfig.model_size` gives ({"width": ..., "vit": {...}}): each model reads its part.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# ---- FLOP counting helpers (kit/flops.py sums what each spec's flop_layers lists) ----------------------------


@dataclass(frozen=True)
class Layer:
    name: str
    macs: int  # multiply-adds of one image's forward pass


def conv(name: str, size: int, c_in: int, c_out: int, kernel: int, stride: int = 1) -> tuple[Layer, int]:
    """A square convolution's layer and output size; the models pad 3x3 convs by 1 and 1x1 convs by 0."""
    padding = kernel // 2
    out = (size + 2 * padding - kernel) // stride + 1
    return Layer(name, out * out * c_out * c_in * kernel * kernel), out


@dataclass(frozen=True)
class Example:
    """The smallest instance that builds every layer: the dataset tests train it on, and the size they build it at
    (RunConfig fields: width, vit_*)."""

    dataset: str = "digits"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    blocks: tuple[str, ...]  # the top-level names --fp32-layers lists as valid
    layer_names: Callable[[Mapping], tuple[str, ...]]  # (size) -> every name both twins give the same module
    flop_layers: Callable[[tuple[int, int, int], int, Mapping], list[Layer]]  # (H, W, C), classes, size
    recipe: Mapping[str, Any]  # what "auto" means for optimizer and lr_schedule, and lr's null
    twins: Mapping[str, str]  # "torch" / "keras": "module:function" building this model in that framework
    sub_block: str = ""  # an example sub-block name for the --fp32-layers hint ("" where there is none)
    hooks: tuple[str, ...] = ()  # "vit": takes the vit's arguments (size, attention, LayerNorm mapping)
    example: Example = Example()


_SPECS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    if spec.name in _SPECS and _SPECS[spec.name] is not spec:
        raise ValueError(f"model {spec.name!r} is registered twice")
    _SPECS[spec.name] = spec
    return spec


@contextmanager
def registered(*specs: ModelSpec) -> Iterator[None]:
    """These specs registered for the duration (models registered already stay)."""
    added = [s for s in specs if s.name not in _SPECS]
    for s in added:
        register(s)
    try:
        yield
    finally:
        for s in added:
            _SPECS.pop(s.name, None)


def names() -> tuple[str, ...]:
    return tuple(_SPECS)


def spec(name: str) -> ModelSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (valid: {', '.join(_SPECS)})") from None


class Names(Sequence):
    """The registered models' names as they are now (a choices list that sees a model registered later)."""

    def __getitem__(self, index):
        return names()[index]

    def __len__(self) -> int:
        return len(_SPECS)

    def __repr__(self) -> str:
        return repr(names())


class Field(Mapping):
    """One field of every registered spec, by model name (MODEL_BLOCKS, MODEL_RECIPES)."""

    def __init__(self, attribute: str):
        self.attribute = attribute

    def __getitem__(self, name: str):
        if name not in _SPECS:
            raise KeyError(name)
        return getattr(_SPECS[name], self.attribute)

    def __iter__(self):
        return iter(names())

    def __len__(self) -> int:
        return len(_SPECS)


def build(name: str, framework: str, *args, **offered):
    """Call `framework`'s twin of model `name` with args and the offered keywords its signature names (each
    builder takes the build arguments that apply to it: width, bn_*, vit, output_dtype, ...)."""
    target = spec(name).twins[framework]
    module, _, function = target.partition(":")
    builder = getattr(importlib.import_module(module), function)
    accepted = inspect.signature(builder).parameters
    return builder(*args, **{k: v for k, v in offered.items() if k in accepted})


# ---- the project's models -----------------------------------------------------------------------------------

CNN_RECIPE = {"optimizer": "adam", "lr_schedule": "constant", "lr": 1e-3}


def _simple_cnn_layers(input_shape, num_classes, size) -> list[Layer]:
    side, _, channels = input_shape
    conv1, s = conv("conv1", side, channels, 32, 3)
    conv2, s = conv("conv2", s // 2, 32, 64, 3)
    return [conv1, conv2, Layer("fc", 64 * (s // 2) ** 2 * num_classes)]


RESNET18_STAGES = ((1, 1), (2, 2), (4, 2), (8, 2))  # (width multiple, first block's stride) per stage, 2 blocks each


def _resnet18_names(size) -> tuple[str, ...]:
    names = ["conv1", "bn1", "relu"]
    for stage in range(1, len(RESNET18_STAGES) + 1):
        names.append(f"layer{stage}")
        for block in range(2):
            prefix = f"layer{stage}.{block}"
            names += [prefix, *(f"{prefix}.{part}" for part in ("conv1", "bn1", "conv2", "bn2", "relu1", "relu2"))]
            if stage > 1 and block == 0:
                names += [f"{prefix}.downsample", f"{prefix}.downsample.0", f"{prefix}.downsample.1"]
    return (*names, "avgpool", "fc")


def _resnet18_layers(input_shape, num_classes, size) -> list[Layer]:
    side, _, channels = input_shape
    width = size.get("width", 64)
    stem, s = conv("conv1", side, channels, width, 3)
    out, planes = [stem], width
    for i, (mult, stride) in enumerate(RESNET18_STAGES, start=1):
        for b in range(2):
            first, block_stride = planes, (stride if b == 0 else 1)
            c1, s_out = conv(f"layer{i}.{b}.conv1", s, first, width * mult, 3, block_stride)
            c2, _ = conv(f"layer{i}.{b}.conv2", s_out, width * mult, width * mult, 3)
            out += [c1, c2]
            if block_stride != 1 or first != width * mult:
                out.append(conv(f"layer{i}.{b}.downsample", s, first, width * mult, 1, block_stride)[0])
            s, planes = s_out, width * mult
    return out + [Layer("fc", planes * num_classes)]


VIT_SIZE = {"dim": 32, "depth": 2, "heads": 2, "patch": 4, "mlp_ratio": 2}  # RunConfig's vit_* defaults


def _vit_names(size) -> tuple[str, ...]:
    names = ["patch", "embed", "blocks"]
    for block in range((size.get("vit") or VIT_SIZE)["depth"]):
        prefix = f"blocks.{block}"
        names += [prefix, *(f"{prefix}.{part}" for part in ("ln1", "attn", "res1", "ln2", "mlp", "mlp.fc1",
                                                             "mlp.act", "mlp.fc2", "res2"))]
    return (*names, "norm", "pool", "fc")


def _vit_layers(input_shape, num_classes, size) -> list[Layer]:
    """The ViT's matrix products per image: the patch conv, per block the four projections, the attention's two
    batched products (Q·Kᵀ and weights·V: heads x tokens x tokens x head_dim each, heads * head_dim = dim) and
    the MLP, then the head on the class token. LayerNorm, softmax, GELU and the adds are not counted."""
    side, _, channels = input_shape
    vit = size.get("vit") or VIT_SIZE
    dim, patch, mlp_ratio = vit["dim"], vit["patch"], vit["mlp_ratio"]
    patches = (side // patch) ** 2
    tokens = 1 + patches
    out = [Layer("patch", patches * dim * channels * patch * patch)]
    for b in range(vit["depth"]):
        out += [Layer(f"blocks.{b}.attn.{proj}", tokens * dim * dim) for proj in ("query", "key", "value")]
        out += [Layer(f"blocks.{b}.attn.scores", tokens * tokens * dim),  # Q·Kᵀ over all heads
                Layer(f"blocks.{b}.attn.mix", tokens * tokens * dim),  # softmax weights · V
                Layer(f"blocks.{b}.attn.out", tokens * dim * dim),
                Layer(f"blocks.{b}.mlp.fc1", tokens * dim * dim * mlp_ratio),
                Layer(f"blocks.{b}.mlp.fc2", tokens * dim * mlp_ratio * dim)]
    return out + [Layer("fc", dim * num_classes)]


def _twins(function: str) -> dict[str, str]:
    return {"torch": f"amp_compare.torch_impl.models:{function}", "keras": f"amp_compare.keras_impl.models:{function}"}


register(ModelSpec(
    "simple_cnn", blocks=("conv1", "conv2", "fc"),
    layer_names=lambda size: ("conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten", "fc"),
    flop_layers=_simple_cnn_layers, recipe=CNN_RECIPE, twins=_twins("simple_cnn")))
register(ModelSpec(
    "resnet18", blocks=("conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "fc"),
    layer_names=_resnet18_names, flop_layers=_resnet18_layers, recipe=CNN_RECIPE, twins=_twins("resnet18"),
    sub_block="layer1.0.conv1", example=Example("synthetic", {"width": 4})))
# The vit trains as transformers do: AdamW with decoupled weight decay and a linear warm-up into a cosine decay
# (kit/schedule.py; both frameworks run the same step-indexed schedule). Its peak rate: 3e-3 reaches 93.6-95.3%
# validation accuracy on digits in 12 epochs (fp32, seeds 0-2; 1e-3: 89.4% at seed 0), measured with
# torch_impl/train.py on this project's 2-core CPU.
register(ModelSpec(
    "vit", blocks=("patch", "embed", "blocks", "norm", "fc"), layer_names=_vit_names, flop_layers=_vit_layers,
    recipe={"optimizer": "adamw", "lr_schedule": "warmup-cosine", "lr": 3e-3}, twins=_twins("vit"),
    sub_block="blocks.0.attn", hooks=("vit",)))
