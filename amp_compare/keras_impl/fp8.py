"""Keras 3's fp8 training: `quantize("float8")` on every Dense and EinsumDense, read back and recorded.

The twin of torch_impl/fp8.py, function for function:
- `convert`: the built model's Dense / EinsumDense layers (MultiHeadAttention's projections too) outside --fp32-layers
  quantized to float8 in place, each with contract/fp8.py's amax-history length (the layer reads it from its dtype
  policy when it builds its float8 variables; Keras' default is 1,024). Delayed scaling: each layer keeps, per
  tensor (inputs, kernel, output gradient), a scale and an amax history in variables the optimizer overwrites with
  the values the layer's custom gradient returns (`overwrite_with_gradient`). The matmul runs in float32 on the
  quantized-dequantized operands (fp8 emulated: no fp8 matmul on a CPU; on a GPU XLA may fuse it into an fp8
  gemm, not run here).
- `settings`: the recipe read back from the live layers (formats from their quantized casts' dtypes as Keras'
  float8 call names them, history length from the variables' shapes, which layers).
- `capture_step`: one training step's tensors of every converted layer, eagerly on TensorFlow; `layer_rows` the
  per-layer SQNR with the layers' live scales.
- `TraceCallback`: each converted layer's scales and newest amax after every step (host values; a CPU run reads
  each step's logs anyway).
- `add_outlier`: --fp8-outlier, the same activation as torch_impl/fp8.add_outlier.
"""

from __future__ import annotations

import keras
import numpy as np

from amp_compare.contract import fp8 as contract
from amp_compare.contract.config import RunConfig
from amp_compare.kit import fp8 as ref
from amp_compare.kit.child import Unavailable
from amp_compare.kit.weights import name_matches, torch_module_name

# Keras' float8 variables per role (layers/core/dense.py and einsum_dense.py: _float8_build)
VARIABLES = {"input": "inputs", "kernel": "kernel", "grad_output": "outputs_grad"}
# MultiHeadAttention's sublayers -> the torch SelfAttention's Linear (kit/weights.py's mapping)
_SUBLAYERS = {"query": "query", "key": "key", "value": "value", "attention_output": "out"}


def _canonical_layers(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """Every Dense / EinsumDense by canonical (torch) name: "blocks.0.attn.query", "blocks.0.mlp.fc1", "fc"."""
    out = {}
    for top in model.layers:
        for layer in top._flatten_layers(include_self=True, recursive=True):
            if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
                name = torch_module_name(top.name)
                out[name if layer is top else f"{name}.{_SUBLAYERS.get(layer.name, layer.name)}"] = layer
    return out


def convert(model: keras.Model, cfg: RunConfig) -> keras.Model:
    """The model as the cell trains it: --fp8-outlier's activation, then (fp8 modes) float8 quantization of every
    Dense / EinsumDense outside --fp32-layers, with the recipe's amax-history length. In place; returns the model."""
    if cfg.fp8_outlier:
        add_outlier(model)
    if not contract.is_fp8(cfg.precision):
        return model
    reason = contract.unavailable_reason(cfg.framework, cfg.precision, cfg.replicas)
    if reason:
        raise Unavailable(reason)
    recipe = contract.recipe(cfg.framework, cfg.precision)
    for name, layer in _canonical_layers(model).items():
        if name_matches(name, cfg.fp32_layers):
            continue
        policy = keras.dtype_policies.DTypePolicy(layer.dtype_policy.name)
        policy.amax_history_length = recipe.amax_history  # what _float8_build reads (its default: 1,024)
        layer.dtype_policy = policy
        layer.quantize("float8")
    model.train_function = model.test_function = model.predict_function = None  # as Model.quantize does
    return model


def converted(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """The layers running in float8, by canonical name."""
    return {name: layer for name, layer in _canonical_layers(model).items() if layer.quantization_mode == "float8"}


def _formats(layer) -> list[str]:
    """The fp8 dtypes the layer's float8 call casts each role to, read from its source (Keras names them inline)."""
    import inspect

    source = inspect.getsource(type(layer)._float8_call)
    forward = "float8_e4m3fn" if '"float8_e4m3fn", self.compute_dtype' in source else "unknown"
    backward = "float8_e5m2" if 'upstream, scale, "float8_e5m2"' in source else "unknown"
    return [forward, forward, backward]


def settings(model: keras.Model) -> dict:
    """The fp8 recipe as the live layers hold it (contract/fp8.Recipe's fields), and the converted layers."""
    layers = converted(model)
    if not layers:
        return {}
    first = next(iter(layers.values()))
    lengths = sorted({int(getattr(layer, f"{v}_amax_history").shape[0]) for layer in layers.values()
                      for v in VARIABLES.values()})
    return {"formats": _formats(first),
            "scaling": "delayed" if lengths != [1] else "dynamic",
            "granularity": "tensor" if tuple(first.inputs_scale.shape) == () else "row",
            "amax_history": lengths[0] if len(lengths) == 1 else lengths,
            "power_of_2_scales": False,
            "scale_convention": "divide",  # keras.quantizers.quantize_and_dequantize: x / scale, then * scale
            "policy": first.dtype_policy.name,
            "converted": sorted(layers)}


def live_scales(layer) -> dict[str, float]:
    return {role: float(keras.ops.convert_to_numpy(getattr(layer, f"{v}_scale"))) for role, v in VARIABLES.items()}


def add_outlier(model: keras.Model) -> None:
    """--fp8-outlier: the class token's first feature entering blocks_0_attn (ln1's output) gets OUTLIER_VALUE
    added, in every precision of the run (torch_impl/fp8.add_outlier's twin)."""
    layer = model.get_layer("blocks_0_ln1")
    call = layer.call

    def with_outlier(*args, **kwargs):
        out = call(*args, **kwargs)
        bump = np.zeros((1,) + tuple(out.shape[1:]), dtype=keras.backend.standardize_dtype(out.dtype))
        bump[0, 0, 0] = contract.OUTLIER_VALUE
        return out + keras.ops.convert_to_tensor(bump, out.dtype)

    layer.call = with_outlier


def _flat(t, dims: int) -> np.ndarray:
    """A layer input or output as 2-D (tokens, features): its last `dims` axes are the features."""
    a = np.asarray(keras.ops.convert_to_numpy(t), np.float32)
    return a.reshape(-1, int(np.prod(a.shape[a.ndim - dims:])))


def _in_dims(inputs, kernel_shape) -> int:
    """How many leading kernel axes contract the input's trailing ones (Dense 1; attention_output's EinsumDense 2)."""
    shape = tuple(inputs.shape)
    return next(n for n in range(1, len(kernel_shape)) if shape[-n:] == tuple(kernel_shape[:n]))


def capture_step(model: keras.Model, x, y) -> dict[str, dict[str, np.ndarray]]:
    """One training step's forward and backward on TensorFlow (nothing of the model changes: the gradients are
    taken, not applied), with every converted layer's tensors as 2-D float32 numpy: input (tokens, in), kernel
    (in, out), bias, output, grad_output (tokens, out), grad_input, grad_kernel (in, out). Traced with tf.function,
    as fit() runs the step: Keras' float8 custom gradients do not run under an eager GradientTape."""
    import tensorflow as tf

    from amp_compare.keras_impl import numerics, vit

    layers, seen = converted(model), {}
    calls = {name: layer.quantized_call for name, layer in layers.items()}  # what Layer.__call__ runs once quantized
    for name, layer in layers.items():
        def keep(inputs, *args, name=name, **kwargs):
            inputs = tf.identity(inputs)  # a tensor of its own: its gradient is this layer's alone (q, k, v share one)
            out = calls[name](inputs, *args, **kwargs)
            seen[name] = (inputs, out)
            return out
        layer.quantized_call = keep

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = numerics.loss_fn(y, model(x, training=True))
        kernels = [layer._kernel for layer in layers.values()]
        grads = tape.gradient(loss, kernels + [seen[n][1] for n in layers] + [seen[n][0] for n in layers],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [seen[n][0] for n in layers], [seen[n][1] for n in layers], grads
    try:
        with vit.paused(model):
            inputs, outputs, grads = step(tf.convert_to_tensor(x), tf.convert_to_tensor(y))
    finally:
        for layer in layers.values():
            del layer.quantized_call  # the class's own again
    n, out = len(layers), {}
    for i, (name, layer) in enumerate(layers.items()):
        shape = tuple(layer._kernel.shape)
        n_in = _in_dims(inputs[i], shape)
        flat_in, n_out = _flat(inputs[i], n_in), len(shape) - n_in
        out[name] = {"input": flat_in,
                     "kernel": np.asarray(keras.ops.convert_to_numpy(layer._kernel), np.float32).reshape(
                         flat_in.shape[1], -1),
                     "bias": None if layer.bias is None else np.asarray(keras.ops.convert_to_numpy(layer.bias)).ravel(),
                     "output": _flat(outputs[i], n_out), "grad_output": _flat(grads[n + i], n_out),
                     "grad_input": _flat(grads[2 * n + i], n_in),
                     "grad_kernel": np.asarray(keras.ops.convert_to_numpy(grads[i])).reshape(flat_in.shape[1], -1)}
    return out


def layer_rows(model: keras.Model, x, y, cfg: RunConfig, when: str, step: int) -> list[dict]:
    """Per converted layer, the SQNR of its input, kernel and output gradient as the recipe quantizes them (with
    the layer's live scales), against the float32 tensors of one training step. Empty outside fp8, and on the
    backends other than TensorFlow (the capture is TensorFlow's GradientTape)."""
    from amp_compare.keras_impl import backends

    recipe = contract.recipe(cfg.framework, cfg.precision)
    if recipe is None or not converted(model) or not backends.TENSORFLOW:
        return []
    layers, rows = converted(model), []
    for name, t in capture_step(model, x, y).items():
        rows += ref.sqnr_rows(recipe, name, t, live_scales(layers[name]), when, step)
    return rows


class TraceCallback(keras.callbacks.Callback):
    """After every training step, each converted layer's scales and newest amax, as fmax / amax (torchao's
    convention, so the two frameworks' trajectories share an axis): host reads of the variables. TensorFlow only
    (JAX's fit keeps the variables' values apart until the epoch ends)."""

    def __init__(self, model: keras.Model, cfg: RunConfig, rows: list):
        super().__init__()
        self.recipe = contract.recipe(cfg.framework, cfg.precision)
        self.layers, self.rows, self.step = converted(model) if self.recipe else {}, rows, 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        for name, layer in self.layers.items():
            for role, v in VARIABLES.items():
                scale = float(keras.ops.convert_to_numpy(getattr(layer, f"{v}_scale")))
                history = keras.ops.convert_to_numpy(getattr(layer, f"{v}_amax_history"))
                fmax = contract.FP8_MAX[self.recipe.format_of[role]]
                self.rows.append({"layer": name, "role": role, "step": self.step, "amax": float(history[0]),
                                  "scale": 1.0 / scale if scale > 0 else float("nan"),
                                  "history_max": float(np.max(history)), "fmax": fmax})


def callbacks(cfg: RunConfig, model: keras.Model, rows: list) -> list:
    """The fp8 trace's callback for fit(): TensorFlow fp8 cells only."""
    from amp_compare.keras_impl import backends

    return [TraceCallback(model, cfg, rows)] if contract.is_fp8(cfg.precision) and backends.TENSORFLOW else []
