"""Keras 3 models, written the idiomatic Keras way (NHWC, functional API).

Each model has a twin of the same name in torch_impl/models.py with the same layers, shapes
and parameter counts; tests/test_models.py checks the counts layer by layer. Layer names are
the twin's module names with "." -> "_", and `get_weights` / `set_weights` move weights in
the framework-free format of kit/weights.py (torch naming and layout).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

from amp_compare.contract import models as model_specs
from amp_compare.kit import weights as cw

STRIDE2_PADDINGS = ("symmetric", "same")


def simple_cnn(input_shape: tuple[int, int, int], num_classes: int,
               output_dtype: str | None = "float32") -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """The tutorial network: conv3x3(32)-ReLU-maxpool2 -> conv3x3(64)-ReLU-maxpool2 -> flatten -> dense."""
    inputs = keras.Input(shape=input_shape)
    # Layer names as the torch twin's modules, so the dtype audits align row by row.
    x = layers.Conv2D(32, 3, padding="same", name="conv1")(inputs)
    x = layers.MaxPooling2D(2, name="pool1")(layers.ReLU(name="relu1")(x))
    x = layers.Conv2D(64, 3, padding="same", name="conv2")(x)
    x = layers.MaxPooling2D(2, name="pool2")(layers.ReLU(name="relu2")(x))
    x = layers.Flatten(name="flatten")(x)  # flattens (H, W, C): NHWC order
    # output_dtype "float32": Keras' mixed-precision idiom (float32 logits). None: the global policy,
    # so under a mixed policy the output matmul runs in the half dtype, as torch autocast's Linear.
    outputs = layers.Dense(num_classes, dtype=output_dtype, name="fc")(x)
    return inputs, outputs


def _conv3x3(x, filters: int, stride: int, name: str, stride2_padding: str):
    if stride > 1 and stride2_padding == "symmetric":
        # TF's "same" pads an even input only at the bottom/right when striding; torch's padding=1 pads
        # every side by one. Explicit padding then "valid" computes exactly what torch does.
        x = layers.ZeroPadding2D(1, name=f"{name}_pad")(x)
        return layers.Conv2D(filters, 3, strides=stride, padding="valid", use_bias=False, name=name)(x)
    return layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False, name=name)(x)


def _basic_block(x, filters: int, stride: int, name: str, bn_args: dict, stride2_padding: str):
    """Two 3x3 convs with BatchNorm and an identity (or 1x1 conv + BN) shortcut."""
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        # A 1x1 kernel needs no padding ("valid" == torch's padding=0, whatever the input size).
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False, name=f"{name}_downsample_0")(x)
        shortcut = layers.BatchNormalization(**bn_args, name=f"{name}_downsample_1")(shortcut)
    x = _conv3x3(x, filters, stride, f"{name}_conv1", stride2_padding)
    x = layers.BatchNormalization(**bn_args, name=f"{name}_bn1")(x)
    x = layers.ReLU(name=f"{name}_relu1")(x)
    x = _conv3x3(x, filters, 1, f"{name}_conv2", stride2_padding)
    x = layers.BatchNormalization(**bn_args, name=f"{name}_bn2")(x)
    x = layers.Add(name=f"{name}_add")([x, shortcut])
    return layers.ReLU(name=f"{name}_relu2")(x)


def resnet18(input_shape: tuple[int, int, int], num_classes: int, width: int = 64,
             bn_momentum: float | None = None, bn_epsilon: float | None = None,
             stride2_padding: str = "symmetric",
             output_dtype: str | None = "float32") -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """ResNet-18 for small images (the CIFAR variant): 3x3 stride-1 stem, no max-pool."""
    if stride2_padding not in STRIDE2_PADDINGS:
        raise ValueError(f"unknown stride2_padding {stride2_padding!r} (valid: {', '.join(STRIDE2_PADDINGS)})")
    # None: leave the argument out and keep Keras' default.
    bn_args = {k: v for k, v in (("momentum", bn_momentum), ("epsilon", bn_epsilon)) if v is not None}
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(width, 3, padding="same", use_bias=False, name="conv1")(inputs)
    x = layers.BatchNormalization(**bn_args, name="bn1")(x)
    x = layers.ReLU(name="relu")(x)
    for i, (mult, stride) in enumerate([(1, 1), (2, 2), (4, 2), (8, 2)], start=1):
        x = _basic_block(x, width * mult, stride, f"layer{i}_0", bn_args, stride2_padding)
        x = _basic_block(x, width * mult, 1, f"layer{i}_1", bn_args, stride2_padding)
    if output_dtype is None:
        # Aligned: average pooling in the policy's dtype, as torch autocast's adaptive_avg_pool2d
        # (GlobalAveragePooling2D's mean casts half inputs to float32 and back). Same numbers up to rounding.
        x = layers.AveragePooling2D(pool_size=tuple(x.shape[1:3]), name="avgpool")(x)
        x = layers.Flatten(name="avgpool_flatten")(x)
    else:
        x = layers.GlobalAveragePooling2D(name="avgpool")(x)
    outputs = layers.Dense(num_classes, dtype=output_dtype, name="fc")(x)  # see simple_cnn
    return inputs, outputs


def vit(input_shape: tuple[int, int, int], num_classes: int, output_dtype: str | None = "float32",
        vit: dict | None = None) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    from amp_compare.keras_impl.vit import vit as build_vit

    return build_vit(input_shape, num_classes, **(vit or {}), output_dtype=output_dtype)


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int,
                model_class: type[keras.Model] = keras.Model, width: int = 64,
                bn_momentum: float | None = None, bn_epsilon: float | None = None,
                stride2_padding: str = "symmetric", output_dtype: str | None = "float32",
                vit: dict | None = None) -> keras.Model:
    """input_shape is (H, W, C). model_class lets loop.py's AmpModel add its train_step to the same graph. The
    model's spec (contract/models.py) names its builder here (or in any module), which returns (inputs, outputs)
    and takes the arguments below that apply to it.

    output_dtype: the final Dense layer's dtype policy. "float32" (the default, Keras' recommended
    mixed-precision idiom) gives float32 logits; None follows the global policy, i.e. the half dtype
    under a mixed policy, which is what torch autocast does with the final Linear (aligned mode);
    resnet18's average pooling then also stays in the half dtype, as torch's does.

    bn_momentum / bn_epsilon are in Keras' convention (see contract/mapping.py); None keeps Keras'
    default. stride2_padding: "symmetric" pads like torch, "same" is Keras' own padding.
    simple_cnn has no BatchNorm, no strided conv and a fixed width, so it ignores all four.
    vit: keras_impl/vit.py's keyword arguments (size from RunConfig.vit_shape, ln_epsilon, gelu_approximate,
    attention, token_dtype); the CNNs ignore it.
    """
    inputs, outputs = model_specs.build(name, "keras", input_shape, num_classes, width=width,
                                        bn_momentum=bn_momentum, bn_epsilon=bn_epsilon,
                                        stride2_padding=stride2_padding, output_dtype=output_dtype, vit=vit)
    return model_class(inputs=inputs, outputs=outputs, name=name)


def _flatten_chw(model: keras.Model) -> dict[str, tuple[int, int, int]]:
    """(C, H, W) flattened into each Dense layer that follows a Flatten, keyed by torch module name."""
    out = {}
    for layer in model.layers:
        if isinstance(layer, layers.Flatten):
            height, width, channels = layer.input.shape[1:]
            for dense in model.layers:
                if isinstance(dense, layers.Dense) and dense.input is layer.output:
                    out[cw.torch_module_name(dense.name)] = (channels, height, width)
    return out


def _heads(model: keras.Model) -> dict[str, int]:
    """The head count of each MultiHeadAttention, keyed by torch module name (kit/weights.py's `heads`)."""
    return {cw.torch_module_name(layer.name): layer.num_heads for layer in model.layers
            if isinstance(layer, layers.MultiHeadAttention)}


def _weights(model: keras.Model) -> list:
    """The model's variables that are weights (not the vit's headroom recorders)."""
    return [v for v in model.weights if v.name not in cw.RECORDERS]


def to_canonical(model: keras.Model, values, variables=None) -> dict[str, np.ndarray]:
    """Arrays aligned with `variables` (default: the model's weights) in canonical naming and layout.

    For gradients: to_canonical(model, grads, model.trainable_variables).
    """
    variables = _weights(model) if variables is None else variables
    by_layer: cw.KerasWeights = {}
    for variable, value in zip(variables, values, strict=True):
        if variable.name in cw.RECORDERS:  # state, not a weight (e.g. float8 scales among trainable_variables)
            continue
        layer, name = variable.path.rsplit("/", 1)
        by_layer.setdefault(layer, {})[name] = keras.ops.convert_to_numpy(value)
    return cw.to_torch(by_layer, _flatten_chw(model))


def get_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """The model's weights in the canonical format of kit/weights.py (torch naming and layout)."""
    return to_canonical(model, _weights(model))


def set_weights(model: keras.Model, weights: dict[str, np.ndarray]) -> None:
    """Load canonical weights; every weight of the model must be given, and nothing else."""
    given = cw.to_keras(weights, _flatten_chw(model), _heads(model))
    expected = {tuple(v.path.rsplit("/", 1)) for v in _weights(model)}
    provided = {(layer, name) for layer, variables in given.items() for name in variables}
    if provided != expected:
        raise KeyError(f"weights do not match the model: missing {sorted(expected - provided)}, "
                       f"unexpected {sorted(provided - expected)}")
    pairs = [(variable, given[layer][name]) for variable in _weights(model)
             for layer, name in [variable.path.rsplit("/", 1)]]
    for variable, value in pairs:  # check every shape before changing anything
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{variable.path}: shape {tuple(value.shape)}, model has {tuple(variable.shape)}")
    for variable, value in pairs:
        variable.assign(value)
