"""A small Vision Transformer in Keras 3, the idiomatic way (functional API, keras.layers.MultiHeadAttention).

The twin of torch_impl/vit.py, layer for layer, each Keras layer named after its torch module ("." -> "_"):
`patch` (Conv2D, kernel = stride = patch), `embed` (class token + learned position embedding),
`blocks_<i>_{ln1, attn, res1, ln2, mlp_fc1, mlp_act, mlp_fc2, res2}`, `norm`, `pool` (the class token) and
`fc`. MultiHeadAttention keeps its own sublayers (query, key, value, attention_output), whose kernels are
(dim, heads, head_dim) and (heads, head_dim, dim): kit/weights.py reshapes them to torch's (out, in) Linears.

`token_dtype`: the dtype of the layers that carry the token stream (embed, the residual adds, the LayerNorms,
pool). None follows the global policy (Keras' way: under a mixed policy the stream is half); "parameters" is
the policy's variable dtype (float32 under a mixed policy), where torch autocast's type promotion with the
float32 class token and position embedding keeps the stream (aligned mode, contract/mapping.py).

Headroom, as in torch_impl/vit.py: each LayerNorm keeps the largest |input| and each attention the largest
|Q·Kᵀ| (float32, before any scale) of the training steps in a non-trainable float32 variable, updated inside
the step; read_headroom reads and resets them once per epoch (loop.EpochRecorder, into the run's StepBook).
`paused(model)` turns the recording off.
`naive=True`: softmax(Q·Kᵀ) written out in the compute dtype, no max subtraction, no 1/√d (torch_impl/vit.py).
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import layers, ops

from amp_compare.contract import models as model_specs
from amp_compare.kit.training import recording_paused

PACKAGE = "amp_compare"
RECORDER_VARIABLES = ("max_in", "max_qk")  # headroom state, not weights (kit/weights.py leaves them out)


def _max_variable(layer: keras.layers.Layer, name: str):
    return layer.add_weight(name=name, shape=(), initializer="zeros", trainable=False, dtype="float32",
                            autocast=False)


def _record(variable, value) -> None:
    variable.assign(ops.maximum(variable, ops.cast(value, "float32")))


@keras.saving.register_keras_serializable(package=PACKAGE)
class Tokens(layers.Layer):
    """(B, h, w, D) patch features -> (B, 1 + h*w, D) tokens: class token first, position embedding added."""

    def build(self, input_shape):
        _, height, width, dim = input_shape
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.cls = self.add_weight(name="cls", shape=(1, 1, dim), initializer=init)
        self.pos = self.add_weight(name="pos", shape=(1, 1 + height * width, dim), initializer=init)

    def call(self, x):
        batch, dim = ops.shape(x)[0], x.shape[-1]
        x = ops.reshape(x, (batch, -1, dim))  # row-major (h, w), as torch's flatten(2)
        x = ops.concatenate([ops.broadcast_to(ops.cast(self.cls, x.dtype), (batch, 1, dim)), x], axis=1)
        return x + ops.cast(self.pos, x.dtype)

    def compute_output_shape(self, input_shape):
        batch, height, width, dim = input_shape
        return (batch, 1 + height * width, dim)


@keras.saving.register_keras_serializable(package=PACKAGE)
class LayerNorm(layers.LayerNormalization):
    """LayerNormalization that keeps the largest |input| of the training steps (read once per epoch)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.record = True

    def build(self, input_shape):
        super().build(input_shape)
        self.max_in = _max_variable(self, "max_in")

    def call(self, inputs, training=None):
        if training and self.record:
            _record(self.max_in, ops.max(ops.abs(inputs)))
        return super().call(inputs)


@keras.saving.register_keras_serializable(package=PACKAGE)
class SelfAttention(layers.MultiHeadAttention):
    """keras.layers.MultiHeadAttention (its projections and its attention), plus the headroom record; naive:
    the handwritten softmax(Q·Kᵀ) instead of MultiHeadAttention's attention."""

    def __init__(self, *args, naive: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.naive = naive
        self.record = True

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        self.max_qk = _max_variable(self, "max_qk")

    def get_config(self):
        return {**super().get_config(), "naive": self.naive}

    def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                           return_attention_scores=False, **kwargs):
        if training and self.record:  # |Q·Kᵀ| in float32, before the scale: its true size even past float16's
            qk = ops.einsum(self._dot_product_equation, ops.cast(key, "float32"), ops.cast(query, "float32"))
            _record(self.max_qk, ops.max(ops.abs(qk)))
        if not self.naive:
            return super()._compute_attention(query, key, value, attention_mask, training, return_attention_scores,
                                              **kwargs)
        scores = ops.einsum(self._dot_product_equation, key, query)  # compute dtype, no 1/sqrt(key_dim)
        weights = ops.exp(scores)  # no max subtraction: overflows float16 past ln(65504)
        weights = weights / ops.sum(weights, axis=-1, keepdims=True)
        return ops.einsum(self._combine_equation, weights, value), weights


@keras.saving.register_keras_serializable(package=PACKAGE)
class Gelu(layers.Layer):
    """GELU with its form explicit (keras.activations.gelu's `approximate`)."""

    def __init__(self, approximate: bool | None = None, **kwargs):
        super().__init__(**kwargs)
        if approximate is None:  # keras.activations.gelu's own default
            import inspect

            approximate = inspect.signature(keras.activations.gelu).parameters["approximate"].default
        self.approximate = bool(approximate)

    def call(self, x):
        if self.approximate:
            return keras.activations.gelu(x, approximate=True)
        # The exact form, as keras.activations.gelu computes it, with 1/sqrt(2) made in x's dtype: TensorFlow's
        # tf.nn.gelu casts it through float32, a 4e-9 relative error that float64 parity would otherwise see.
        return 0.5 * x * (1.0 + ops.erf(x * ops.convert_to_tensor(math.sqrt(0.5), x.dtype)))

    def get_config(self):
        return {**super().get_config(), "approximate": self.approximate}

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class ClassToken(layers.Layer):
    """The class token's features, (B, N, D) -> (B, D)."""

    def call(self, x):
        return x[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])


def vit(input_shape: tuple[int, int, int], num_classes: int, dim: int = 32, depth: int = 2, heads: int = 2,
        patch: int = 4, mlp_ratio: int = 2, ln_epsilon: float | None = None, gelu_approximate: bool | None = None,
        attention: str = "builtin", token_dtype: str | None = None,
        output_dtype: str | None = "float32") -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """The functional graph. ln_epsilon / gelu_approximate None: Keras' own defaults (defaults mode)."""
    if dim % heads:
        raise ValueError(f"vit width {dim} is not divisible by its {heads} heads")
    if patch > input_shape[0]:
        raise ValueError(f"vit patch size {patch} is larger than the {input_shape[0]}-pixel images")
    ln = {} if ln_epsilon is None else {"epsilon": ln_epsilon}
    gelu = {} if gelu_approximate is None else {"approximate": gelu_approximate}
    if token_dtype not in (None, "parameters"):
        raise ValueError(f"unknown token_dtype {token_dtype!r} (valid: None, 'parameters')")
    stream = {"dtype": keras.config.dtype_policy().variable_dtype} if token_dtype else {}
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(dim, patch, strides=patch, padding="valid", name="patch")(inputs)
    x = Tokens(name="embed", **stream)(x)
    for i in range(depth):
        name = f"blocks_{i}"
        h = LayerNorm(**ln, name=f"{name}_ln1", **stream)(x)
        h = SelfAttention(num_heads=heads, key_dim=dim // heads, naive=attention == "naive", name=f"{name}_attn")(h, h)
        x = layers.Add(name=f"{name}_res1", **stream)([x, h])
        h = LayerNorm(**ln, name=f"{name}_ln2", **stream)(x)
        h = layers.Dense(dim * mlp_ratio, name=f"{name}_mlp_fc1")(h)
        h = Gelu(**gelu, name=f"{name}_mlp_act")(h)
        h = layers.Dense(dim, name=f"{name}_mlp_fc2")(h)
        x = layers.Add(name=f"{name}_res2", **stream)([x, h])
    x = LayerNorm(**ln, name="norm", **stream)(x)
    x = ClassToken(name="pool", **stream)(x)
    outputs = layers.Dense(num_classes, dtype=output_dtype, name="fc")(x)
    return inputs, outputs


def _recorders(model: keras.Model) -> list:
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if isinstance(layer, (LayerNorm, SelfAttention))]


def paused(model: keras.Model):
    """No headroom recording for the duration (the numerics lab): the model's own work alone. Read when a step is
    traced, so it covers eager calls and the graphs traced inside it."""
    return recording_paused(_recorders(model))


def read_headroom(model: keras.Model) -> list[dict]:
    """The largest magnitudes since the last read, one row per LayerNorm / attention (canonical names), and
    reset them; the same rows as torch_impl/vit.read_headroom. Empty for a model without recorders."""
    from amp_compare.kit.weights import torch_module_name

    rows = []
    for layer in _recorders(model):
        variable = layer.max_in if isinstance(layer, LayerNorm) else layer.max_qk
        value = float(np.asarray(keras.ops.convert_to_numpy(variable)))
        name = torch_module_name(layer.name)
        if isinstance(layer, LayerNorm):
            rows.append({"layer": name, "quantity": "layernorm_input", "max_abs": value})
        else:
            scale = 1.0 if layer.naive else layer._inverse_sqrt_key_dim
            rows += [{"layer": name, "quantity": "qk_product", "max_abs": value},
                     {"layer": name, "quantity": "attention_logit", "max_abs": value * scale}]
        variable.assign(0.0)
    return rows


def arguments(cfg, settings: dict) -> dict | None:
    """build_model's `vit` keyword arguments for a cell (a RunConfig): its size, the mapped LayerNorm epsilon,
    GELU form and token-stream dtype (absent in defaults mode: Keras' own), the attention. None for a model
    without the "vit" hook (contract/models.py: the CNNs)."""
    if "vit" not in model_specs.spec(cfg.model).hooks:  # contract/models.py: the models that take these
        return None
    return {**cfg.vit_shape, "ln_epsilon": settings.get("ln_epsilon"),
            "gelu_approximate": settings.get("gelu_approximate"), "attention": cfg.attention,
            "token_dtype": settings.get("token_dtype")}


def describe_defaults() -> dict[str, object]:
    """This Keras' defaults for the vit's items of contract/mapping.DIFFERENCES, read from fresh objects."""
    import inspect

    mha = layers.MultiHeadAttention(num_heads=2, key_dim=2)
    gelu = {name: inspect.signature(f).parameters["approximate"].default
            for name, f in (("keras.activations.gelu", keras.activations.gelu), ("keras.ops.gelu", keras.ops.gelu))}
    return {
        "ln_epsilon": layers.LayerNormalization().epsilon,
        "gelu_approximate": ", ".join(f"{name} approximate={value}" for name, value in gelu.items()),
        "mha_bias": f"use_bias={mha.use_bias}",
        "mha_dropout": mha.dropout,
        "token_dtype": f"mixed_float16 policy: Add computes in {layers.Add(dtype='mixed_float16').compute_dtype}",
        "attention_core": "MultiHeadAttention -> keras.ops.dot_product_attention (without dropout)",
        "adamw_weight_decay": keras.optimizers.AdamW().weight_decay,
        "lr_schedule": "constant (a float learning_rate unless a LearningRateSchedule is given)",
    }


def settings_used(model: keras.Model, cfg) -> dict:
    """The vit's settings read back from the live model (empty for the CNNs), as torch_impl/vit.settings_used
    (cfg: the twin's signature; Keras reads the token stream's dtype from the layer, torch from cfg's precision)."""
    norm = next((layer for layer in model.layers if isinstance(layer, layers.LayerNormalization)), None)
    if norm is None:
        return {}
    gelu = next(layer for layer in model.layers if isinstance(layer, Gelu))
    attention = next(layer for layer in model.layers if isinstance(layer, SelfAttention))
    embed = next(layer for layer in model.layers if isinstance(layer, Tokens))
    return {"ln_epsilon": norm.epsilon, "gelu_approximate": gelu.approximate,
            "attention": "naive" if attention.naive else "builtin", "token_dtype": embed.compute_dtype,
            "mha_bias": bool(attention.use_bias)}
