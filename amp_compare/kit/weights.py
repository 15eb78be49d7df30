"""Model weights as plain numpy arrays, and the layout conversions between PyTorch and Keras.

The canonical format is a dict `name -> np.ndarray` in torch `state_dict` naming and layout:
`conv1.weight` (O, I, H, W), `fc.weight` (out, in), BatchNorm `weight`, `bias`, `running_mean`
and `running_var` (`num_batches_tracked` left out: Keras has no such counter). Both
frameworks' `get_weights` / `set_weights` speak it, so weights (and gradients) made by one
framework can be loaded into, or compared with, the other. This module never imports a
framework: the frameworks hand it arrays.

Names: a Keras layer is named after its torch module with "." replaced by "_"
(`layer1.0.conv1` <-> `layer1_0_conv1`), so torch module names never contain "_".

Attention (the vit): torch's SelfAttention holds four Linear layers `<attn>.query/key/value/out` (out, in);
Keras' MultiHeadAttention `<attn>` holds the sublayers query/key/value (kernel (dim, heads, head_dim), bias
(heads, head_dim)) and attention_output (kernel (heads, head_dim, dim), bias (dim,)), whose variables' paths
are `<attn>/<sublayer>/kernel`. Feature h * head_dim + d of torch's projection is head h's d-th in Keras, so the
kernels are transposed and reshaped (`heads` names each attention module's head count). The class token and
position embedding (`embed.cls`, `embed.pos`) have the same layout in both.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

Weights = dict[str, np.ndarray]
KerasWeights = dict[str, dict[str, np.ndarray]]  # layer name -> variable name -> array

# torch BatchNorm entry -> Keras BatchNormalization variable.
BN_TO_KERAS = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
BN_TO_TORCH = {v: k for k, v in BN_TO_KERAS.items()}
SKIPPED = ("num_batches_tracked",)  # torch-only bookkeeping, not a weight
# Headroom recorders (the vit's running maxima, keras_impl/vit.py; torch keeps them as non-persistent buffers)
RECORDERS = ("max_in", "max_qk",
             # Keras' float8 state (model.quantize("float8")): scales and amax histories, not weights
             *(f"{role}_{kind}" for role in ("inputs", "kernel", "outputs_grad") for kind in ("scale", "amax_history")))
# Keras MultiHeadAttention sublayer -> the torch SelfAttention's Linear, and back
MHA_TO_TORCH = {"query": "query", "key": "key", "value": "value", "attention_output": "out"}
MHA_TO_KERAS = {v: k for k, v in MHA_TO_TORCH.items()}
AS_IS = ("cls", "pos")  # the vit's token parameters: the same array in both frameworks


def keras_layer_name(module: str) -> str:
    if "_" in module:
        raise ValueError(f"torch module name {module!r} contains '_': the Keras name would not map back")
    return module.replace(".", "_")


def torch_module_name(layer: str) -> str:
    return layer.replace("_", ".")


def conv_kernel_to_keras(weight: np.ndarray) -> np.ndarray:
    """(O, I, H, W) -> (H, W, I, O)."""
    return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))


def conv_kernel_to_torch(kernel: np.ndarray) -> np.ndarray:
    """(H, W, I, O) -> (O, I, H, W)."""
    return np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))


def dense_kernel_to_keras(weight: np.ndarray, flatten_chw: tuple[int, int, int] | None = None) -> np.ndarray:
    """(out, in) -> (in, out). flatten_chw: the (C, H, W) flattened into this layer's input, if any.

    torch flattens an NCHW activation in (C, H, W) order, Keras an NHWC one in (H, W, C) order:
    the same input feature sits at a different row, so the rows are permuted to match.
    """
    if flatten_chw is not None:
        weight = weight.reshape(weight.shape[0], *flatten_chw).transpose(0, 2, 3, 1).reshape(weight.shape[0], -1)
    return np.ascontiguousarray(weight.T)


def dense_kernel_to_torch(kernel: np.ndarray, flatten_chw: tuple[int, int, int] | None = None) -> np.ndarray:
    """(in, out) -> (out, in), undoing dense_kernel_to_keras."""
    weight = kernel.T
    if flatten_chw is not None:
        c, h, w = flatten_chw
        weight = weight.reshape(weight.shape[0], h, w, c).transpose(0, 3, 1, 2).reshape(weight.shape[0], -1)
    return np.ascontiguousarray(weight)


def _kernel_to_keras(module: str, weight: np.ndarray, flatten_chw: Mapping[str, tuple[int, int, int]]) -> np.ndarray:
    if weight.ndim == 4:
        return conv_kernel_to_keras(weight)
    if weight.ndim == 2:
        return dense_kernel_to_keras(weight, flatten_chw.get(module))
    raise ValueError(f"{module}.weight: no Keras layout for a {weight.ndim}-d kernel")


def _kernel_to_torch(module: str, kernel: np.ndarray, flatten_chw: Mapping[str, tuple[int, int, int]]) -> np.ndarray:
    if kernel.ndim == 4:
        return conv_kernel_to_torch(kernel)
    if kernel.ndim == 2:
        return dense_kernel_to_torch(kernel, flatten_chw.get(module))
    raise ValueError(f"{module}: no torch layout for a {kernel.ndim}-d kernel")


def _attention_parts(module: str, heads: Mapping[str, int]) -> tuple[str, str, int] | None:
    """(attention module, projection, heads) when `module` is a projection of an attention in `heads`."""
    parent, _, part = module.rpartition(".")
    if parent in heads and part in MHA_TO_KERAS:
        return parent, part, heads[parent]
    return None


def attention_to_keras(part: str, entry: str, value: np.ndarray, heads: int) -> np.ndarray:
    """A torch projection's weight (out, in) or bias (out,) in MultiHeadAttention's layout."""
    if entry == "bias":
        return np.ascontiguousarray(value if part == "out" else value.reshape(heads, -1))
    if part == "out":  # (dim, heads * head_dim) -> (heads, head_dim, dim)
        return np.ascontiguousarray(value.T.reshape(heads, -1, value.shape[0]))
    return np.ascontiguousarray(value.T.reshape(value.shape[1], heads, -1))  # (heads * head_dim, dim) -> (dim, h, d)


def attention_to_torch(part: str, name: str, value: np.ndarray) -> np.ndarray:
    """MultiHeadAttention's kernel / bias of one sublayer in torch's (out, in) / (out,) layout."""
    if name == "bias":
        return np.ascontiguousarray(value.reshape(-1))
    if part == "out":  # (heads, head_dim, dim) -> (dim, heads * head_dim)
        return np.ascontiguousarray(value.reshape(-1, value.shape[-1]).T)
    return np.ascontiguousarray(value.reshape(value.shape[0], -1).T)  # (dim, heads, head_dim) -> (h * d, dim)


def to_keras(weights: Mapping[str, np.ndarray],
             flatten_chw: Mapping[str, tuple[int, int, int]] | None = None,
             heads: Mapping[str, int] | None = None) -> KerasWeights:
    """Canonical weights -> {Keras layer: {variable: array}}.

    flatten_chw maps a torch module name (e.g. "fc") to the (C, H, W) flattened into it; heads maps an
    attention module (e.g. "blocks.0.attn") to its head count. A module with a 1-d `weight` is a BatchNorm or
    a LayerNorm (conv and linear weights are 4-d and 2-d).
    """
    flatten_chw, heads = flatten_chw or {}, heads or {}
    modules: dict[str, dict[str, np.ndarray]] = {}
    for key, value in weights.items():
        module, entry = key.rsplit(".", 1)
        if entry not in SKIPPED:
            modules.setdefault(module, {})[entry] = np.asarray(value)
    out: KerasWeights = {}
    for module, entries in modules.items():
        attention = _attention_parts(module, heads)
        if attention is not None:
            parent, part, n_heads = attention
            layer = out.setdefault(f"{keras_layer_name(parent)}/{MHA_TO_KERAS[part]}", {})
            for entry, value in entries.items():
                if entry not in ("weight", "bias"):
                    raise ValueError(f"{module}.{entry}: unknown entry")
                layer["kernel" if entry == "weight" else "bias"] = attention_to_keras(part, entry, value, n_heads)
            continue
        is_bn = "running_mean" in entries or ("weight" in entries and entries["weight"].ndim == 1)
        layer = out.setdefault(keras_layer_name(module), {})
        for entry, value in entries.items():
            if entry in AS_IS:
                layer[entry] = value
            elif is_bn:
                layer[BN_TO_KERAS[entry]] = value
            elif entry == "weight":
                layer["kernel"] = _kernel_to_keras(module, value, flatten_chw)
            elif entry == "bias":
                layer["bias"] = value
            else:
                raise ValueError(f"{module}.{entry}: unknown entry")
    return out


def to_torch(layers: Mapping[str, Mapping[str, np.ndarray]],
             flatten_chw: Mapping[str, tuple[int, int, int]] | None = None) -> Weights:
    """{Keras layer: {variable: array}} -> canonical weights; the inverse of to_keras.

    Works on any subset of a layer's variables, e.g. gradients of the trainable ones only.
    """
    flatten_chw = flatten_chw or {}
    out: Weights = {}
    for layer, variables in layers.items():
        parent, _, sublayer = layer.rpartition("/")
        if parent:  # a MultiHeadAttention sublayer: <attn>/query ...
            if sublayer not in MHA_TO_TORCH:
                raise ValueError(f"{layer}: unknown attention sublayer")
            module = f"{torch_module_name(parent)}.{MHA_TO_TORCH[sublayer]}"
            for name, value in variables.items():
                if name not in ("kernel", "bias"):
                    raise ValueError(f"{layer}/{name}: unknown Keras variable")
                out[f"{module}.{'weight' if name == 'kernel' else 'bias'}"] = attention_to_torch(
                    MHA_TO_TORCH[sublayer], name, np.asarray(value))
            continue
        module = torch_module_name(layer)
        for name, value in variables.items():
            value = np.asarray(value)
            if name in AS_IS:
                out[f"{module}.{name}"] = value
            elif name in BN_TO_TORCH:
                out[f"{module}.{BN_TO_TORCH[name]}"] = value
            elif name == "kernel":
                out[f"{module}.weight"] = _kernel_to_torch(module, value, flatten_chw)
            elif name == "bias":
                out[f"{module}.bias"] = value
            else:
                raise ValueError(f"{layer}/{name}: unknown Keras variable")
    return out


def name_matches(name: str, names) -> bool:
    """Canonical `name` is one of `names` or inside one of them ("layer4" matches "layer4.0.conv1")."""
    return any(name == n or name.startswith(n + ".") for n in names)


def check_layer_names(names: list[str], valid) -> None:
    """Refuse names that are not canonical layer or block names of the model."""
    valid = set(valid)
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"unknown layer name(s) {', '.join(map(repr, unknown))} "
                         f"(valid: {', '.join(sorted(valid))})")
