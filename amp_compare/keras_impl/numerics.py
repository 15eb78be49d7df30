"""Where mixed precision puts each number, in Keras 3: per-layer dtypes, gradient underflow, NaN/Inf.

Read this file beside torch_impl/numerics.py: the public functions have the same names, arguments
and result rows, and the numpy helpers both use are one copy in kit/fp16.py (gradient_stats,
nonfinite_kind; tests/test_numerics.py checks both files take that copy), so a row from one framework
can be compared with the same row from the other.

- `dtype_audit`: the dtype every TensorFlow op of one training step computes in, per layer (on the
  JAX and torch backends, which have no graph to read: each layer's dtype policy, see `policy_dtype_audit`).
- `apply_fp32_layers`: a copy of the model with named layers in float32 under a mixed policy.
- `gradient_underflow` / `underflow_summary`: how many gradient elements float16 would flush
  to zero or overflow, with and without a loss scale.
- `locate_nonfinite`: the first layer whose output (forward) or gradient (backward) is inf/NaN.

Keras fixes a layer's dtype policy when the layer is built, so these functions take a model
built under the policy of the precision asked for (keras_impl/amp.py amp_setting) and never change
the global policy for good. Layers are named like their torch twins ("conv1",
"layer1.0.bn1", "fc": "_" -> "."); layers Keras named itself ("max_pooling2d", "flatten") keep
their Keras name. "loss" is the loss after the model; "" is what belongs to no single layer
(in the backward, the AddN summing a residual's two gradient branches).
"""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # CUDA-driver chatter on GPU-less machines

import keras  # noqa: E402
import numpy as np  # noqa: E402

from amp_compare.keras_impl import backends  # noqa: E402

if backends.TENSORFLOW:  # the graph-op dtype audit reads TensorFlow's traced graph
    import tensorflow as tf

from amp_compare.contract import precision as precisions  # noqa: E402
from amp_compare.keras_impl.amp import amp_setting  # noqa: E402
from amp_compare.keras_impl.models import to_canonical  # noqa: E402
from amp_compare.keras_impl.vit import paused  # noqa: E402
from amp_compare.kit import weights as cw  # noqa: E402
from amp_compare.kit.fp16 import (  # noqa: E402
    gradient_stats,
    nonfinite_kind,
)
from amp_compare.kit.weights import check_layer_names, name_matches  # noqa: E402

LOSS = "loss"
GRADIENT_SCOPE = "gradient_tape"  # tape.gradient builds each op's gradient under this + the op's name
# Graph bookkeeping: constants, variable reads, shapes, placeholders move no numbers.
BOOKKEEPING_OPS = {"Const", "Identity", "IdentityN", "ReadVariableOp", "NoOp", "Placeholder", "StopGradient",
                   "Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike", "Fill", "BroadcastGradientArgs"}
# Pure layout changes, skipped as torch's audit skips view ops (func.is_view): a Flatten then shows no
# compute in either framework, and the two audits list the same layers.
VIEW_OPS = {"Reshape", "Squeeze", "ExpandDims", "StridedSlice"}  # StridedSlice: the vit's class token, x[:, 0]
VARIABLE_TO_TORCH = {"kernel": "weight", "bias": "bias", **cw.BN_TO_TORCH}
# How a backend's dtype audit is taken (the report names it per column).
AUDIT_METHODS = {"tensorflow": "ops of the traced training step (TensorFlow graph), by layer scope",
                 "jax": "each layer's dtype policy (compute_dtype) and variable dtypes; backward: the same "
                        "dtype, as autodiff keeps each tensor's dtype",
                 "torch": "each layer's dtype policy (compute_dtype) and variable dtypes; backward: the same "
                          "dtype, as autodiff keeps each tensor's dtype"}


def loss_fn(y, logits):
    """The training loss of keras_impl/train.py (a Loss object computes in float32, Keras' floatx)."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)


def _policy(precision: str) -> str:
    try:
        return amp_setting(precision)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def _check_policy(model: keras.Model, precision: str) -> None:
    """The model must have been built under the precision's policy: Keras cannot switch it later."""
    policy = _policy(precision)
    if model.dtype_policy.name != policy:
        raise ValueError(f"model {model.name!r} was built under the {model.dtype_policy.name!r} policy, not "
                         f"{policy!r}: build it after keras.config.set_dtype_policy({policy!r})")


def _snake_case(name: str) -> str:
    """Keras' own class name -> default layer name rule (keras.src.utils.naming.to_snake_case)."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def canonical_name(layer: keras.layers.Layer) -> str:
    """The torch module name of a layer ("layer1_0_conv1" -> "layer1.0.conv1").

    A layer Keras named itself ("max_pooling2d_1") has no torch twin and keeps its name.
    """
    if re.fullmatch(rf"{_snake_case(type(layer).__name__)}(_\d+)?", layer.name):
        return layer.name
    return cw.torch_module_name(layer.name)


def _layers(model: keras.Model) -> list[keras.layers.Layer]:
    """The model's layers in execution order, without the InputLayer (it computes nothing)."""
    return [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]


def _param_dtype(layer: keras.layers.Layer | None) -> str:
    """The dtype(s) of a layer's trainable variables ("" for none)."""
    if layer is None:
        return ""
    return ",".join(sorted({keras.backend.standardize_dtype(v.dtype) for v in layer.trainable_weights}))


@contextmanager
def _training_step_state(model: keras.Model) -> Iterator[None]:
    """The model as it was after a diagnosis: a training-mode call updates BatchNorm's moving
    statistics, so the non-trainable variables are put back."""
    saved = [keras.ops.convert_to_numpy(v) for v in model.non_trainable_variables]
    try:
        with paused(model):  # the vit's headroom recording off: the audit lists the model's own ops
            yield
    finally:
        for variable, value in zip(model.non_trainable_variables, saved):
            variable.assign(value)


# ---------------------------------------------------------------------------------------------
# dtype audit
# ---------------------------------------------------------------------------------------------

@contextmanager
def _recording_scopes(model: keras.Model) -> Iterator[dict[str, str]]:
    """Yields {TF name scope -> canonical layer name}, filled in as the model is traced.

    Keras opens a name scope per layer call, but TensorFlow makes scope names unique in a graph
    ("conv1_1", and "max_pooling2d_1" may be max_pooling2d's scope or max_pooling2d_1's), so
    the scope is read from inside each layer's call rather than guessed from its name.
    """
    scopes: dict[str, str] = {}

    def recording(layer, call):
        @functools.wraps(call)
        def wrapper(*args, **kwargs):
            scopes[tf.get_current_name_scope()] = names[id(layer)]
            return call(*args, **kwargs)
        return wrapper

    names = {id(layer): name for layer, name in _audit_layers(model)}
    layers = [layer for layer, _ in _audit_layers(model)]
    for layer in layers:  # object.__setattr__: past Keras' attribute tracking, undone below
        object.__setattr__(layer, "call", recording(layer, layer.call))
    try:
        yield scopes
    finally:
        for layer in layers:
            object.__delattr__(layer, "call")


def _common_parent(names: set[str], attentions: set[str]) -> str:
    """The attention several consumers belong to ("blocks.0.attn" for its query/key/value projections), else "":
    one cast of a MultiHeadAttention's input feeds its three projections (torch's autocast casts in each Linear)."""
    parents = {name.rpartition(".")[0] for name in names}
    return parents.pop() if len(parents) == 1 and parents <= attentions else ""


def _audit_layers(model: keras.Model) -> list[tuple[keras.layers.Layer, str]]:
    """(layer, canonical name) of every layer the audit attributes ops to: the model's layers, and inside each
    MultiHeadAttention its projections, named as torch's Linear layers ("blocks.0.attn.query", ".out")."""
    out = []
    for layer in _layers(model):
        out.append((layer, canonical_name(layer)))
        if isinstance(layer, keras.layers.MultiHeadAttention):
            for sub in (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense):
                out.append((sub, f"{canonical_name(layer)}.{cw.MHA_TO_TORCH[sub.name]}"))
    return out


def _owner(name: str, owners: dict[str, str]) -> str | None:
    """The owner of the longest prefix of an op name ("a/b/c" -> "a/b/c", "a/b", "a") in owners."""
    parts = name.split("/")
    for end in range(len(parts), 0, -1):
        owner = owners.get("/".join(parts[:end]))
        if owner is not None:
            return owner
    return None


def _dtypes(tensors) -> str:
    """The dtypes of an op's floating outputs (its dtype) or inputs (the dtype it computed in); "" for none."""
    return "+".join(dict.fromkeys(t.dtype.name for t in tensors if t.dtype.is_floating))


def _op_owners(forward: list, backward: list, owners: dict[str, str | None],
               attentions: set[str]) -> dict[str, str | None]:
    """The layer (canonical scope name, "" for none) each op of the traced step belongs to, from the name
    scopes recorded while tracing (owners: scope -> layer, filled in for every op and returned); attentions:
    the MultiHeadAttention layers, which own a cast shared by their own projections (_common_parent)."""
    for op in forward:
        owners[op.name] = _owner(op.name, owners)
    for op in forward:
        if owners[op.name] is None:
            # Layer.__call__ casts a layer's inputs to its compute dtype before opening the
            # layer's scope: such a cast belongs to the one layer that consumes it.
            consumers = {_owner(c.name, owners) for t in op.outputs for c in t.consumers()} - {None}
            owners[op.name] = consumers.pop() if len(consumers) == 1 else _common_parent(consumers, attentions)
    for op in backward:
        # A gradient op is named after the forward op it differentiates ("gradient_tape/<name>/…"):
        # same owner. Others (AddN summing the gradients of a tensor used twice) belong to the
        # layer whose gradients they sum, or to no layer if they sum several layers' gradients.
        differentiated = op.name.removeprefix(GRADIENT_SCOPE + "/")
        owner = _owner(differentiated, owners) if differentiated != op.name else None
        if owner is None:
            producers = {owners.get(t.op.name) for t in op.inputs} - {None}
            owner = producers.pop() if len(producers) == 1 else ""
        owners[op.name] = owner
    return owners


def dtype_audit(model: keras.Model, x, y, precision: str) -> list[dict]:
    """The dtype each op of one training step (forward, loss, backward) computes in, per layer.

    x: NHWC inputs, y: class indices. The step (GradientTape: forward, loss, gradients of the
    trainable variables) is traced with tf.function and never run, so the model is unchanged;
    each op of the graph is mapped to its layer through its name scope. Rows, in graph order:
    {"layer", "op" (TF op type), "phase", "compute_dtype" (the op's floating output dtypes), "input_dtype" (its
    floating inputs' dtypes: the dtype it computed in), "param_dtype" (the layer's trainable variables, "" for
    none), "count", "audit_method"}.
    On the JAX and torch backends: `policy_dtype_audit`.
    """
    _check_policy(model, precision)
    if not backends.TENSORFLOW:
        return policy_dtype_audit(model)
    marks: dict[str, Any] = {}

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            with tf.name_scope(LOSS):
                marks["loss_scope"] = tf.get_current_name_scope()
                loss = loss_fn(y, logits)
        # Ops are listed in creation order: those made from here on are the backward.
        marks["backward_start"] = len(tf.compat.v1.get_default_graph().get_operations())
        return tape.gradient(loss, model.trainable_variables)

    with _recording_scopes(model) as scopes, paused(model):  # the vit's headroom recording off
        ops = step.get_concrete_function(tf.constant(x), tf.constant(y)).graph.get_operations()
    forward, backward = ops[:marks["backward_start"]], ops[marks["backward_start"]:]
    attentions = {name for layer, name in _audit_layers(model) if isinstance(layer, keras.layers.MultiHeadAttention)}
    owners = _op_owners(forward, backward, {**scopes, marks["loss_scope"]: LOSS}, attentions)
    counts: Counter[tuple[str, str, str, str, str]] = Counter()
    for phase, phase_ops in (("forward", forward), ("backward", backward)):
        for op in phase_ops:
            dtype = _dtypes(op.outputs)
            if dtype and op.type not in BOOKKEEPING_OPS and op.type not in VIEW_OPS:
                counts[(audit_name(owners[op.name]), op.type, phase, dtype, _dtypes(op.inputs))] += 1
    layers = {name: layer for layer, name in _audit_layers(model)}
    return [{"layer": layer, "op": op, "phase": phase, "compute_dtype": dtype, "input_dtype": inputs,
             "param_dtype": _param_dtype(layers.get(layer)), "count": count,
             "audit_method": AUDIT_METHODS["tensorflow"]}
            for (layer, op, phase, dtype, inputs), count in counts.items()]


def policy_dtype_audit(model: keras.Model) -> list[dict]:
    """The backend-neutral audit (JAX, torch backends): per layer, the dtype its policy computes in.

    Keras casts a layer's inputs to its policy's compute_dtype and computes there; the loss computes
    in its own dtype (floatx, float32). Layers that compute nothing (Flatten, the aligned-mode padding)
    are listed under their torch module as the graph audit does (audit_name). One forward and one
    backward row per layer; "op" is the layer's class.
    """
    rows = []
    for layer in _layers(model):
        if isinstance(layer, (keras.layers.Flatten, keras.layers.Reshape)):
            continue  # pure layout changes, skipped as in the graph audit (VIEW_OPS)
        for phase in ("forward", "backward"):
            rows.append({"layer": audit_name(canonical_name(layer)), "op": type(layer).__name__, "phase": phase,
                         "compute_dtype": keras.backend.standardize_dtype(layer.compute_dtype),
                         # Keras casts a layer's inputs to its compute dtype: the dtype it computes in
                         "input_dtype": keras.backend.standardize_dtype(layer.compute_dtype),
                         "param_dtype": _param_dtype(layer), "count": 1,
                         "audit_method": AUDIT_METHODS[backends.BACKEND]})
    loss = getattr(model, "loss", None)
    if loss is not None:
        loss_dtype = keras.backend.standardize_dtype(getattr(loss, "dtype", None) or keras.config.floatx())
        for phase in ("forward", "backward"):
            rows.append({"layer": LOSS, "op": type(loss).__name__, "phase": phase,
                         "compute_dtype": loss_dtype, "input_dtype": loss_dtype, "param_dtype": "", "count": 1,
                         "audit_method": AUDIT_METHODS[backends.BACKEND]})
    return rows


# Keras layers whose work torch does inside another module: the explicit padding before a strided
# conv (torch's Conv2d pads itself), the residual add (torch's BasicBlock.forward adds), the Flatten
# after the aligned average pooling. The audit files their ops under torch's module.
AUDIT_ALIASES = (r"\.pad$", r"\.add$", r"\.flatten$")


def audit_name(layer: str) -> str:
    """The torch module a Keras layer's ops belong to in the dtype audit ("layer2.0.conv1.pad" -> "layer2.0.conv1")."""
    for pattern in AUDIT_ALIASES:
        layer = re.sub(pattern, "", layer)
    return layer


# ---------------------------------------------------------------------------------------------
# float32 overrides
# ---------------------------------------------------------------------------------------------

def _block_names(name: str) -> list[str]:
    """A canonical name and the blocks it sits in: "layer1.0.conv1" -> layer1, layer1.0, layer1.0.conv1."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def apply_fp32_layers(model: keras.Model, names: Iterable[str]) -> keras.Model:
    """A new model, the same class and weights, whose named layers compute in float32.

    A name matches that layer and every layer inside it ("layer4" matches "layer4_0_conv1").
    A layer's dtype policy is fixed when the layer is made, so the model is rebuilt from its
    config with those layers' `dtype` set to "float32", under the original model's policy (put
    back afterwards), and every variable is copied over by path. The new model is not compiled:
    compile it as the original was.
    """
    names = [names] if isinstance(names, str) else list(names)
    canonical = {layer.name: canonical_name(layer) for layer in _layers(model)}
    check_layer_names(names, {block for name in canonical.values() for block in _block_names(name)})
    forced = {layer for layer, name in canonical.items() if name_matches(name, names)}
    config = model.get_config()
    for layer_config in config["layers"]:
        if layer_config["config"]["name"] in forced:
            layer_config["config"]["dtype"] = "float32"
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(model.dtype_policy)  # the model's own (Functional) policy
    try:
        new = type(model).from_config(config)  # keeps the class, e.g. amp_compare.keras_impl.train.AmpModel
    finally:
        keras.config.set_dtype_policy(previous)
    variables = {v.path: v for v in new.weights}
    if set(variables) != {v.path for v in model.weights}:
        raise RuntimeError(f"rebuilt model {model.name!r} has different variables")
    for v in model.weights:
        variables[v.path].assign(v)
    return new


# ---------------------------------------------------------------------------------------------
# gradient underflow
# ---------------------------------------------------------------------------------------------

@contextmanager
def _float32_policy(model: keras.Model) -> Iterator[None]:
    """The model and every layer in it compute in float32 for the duration, then as built.

    The float32 reference of gradient_underflow: torch gets it by switching autocast off; a Keras
    layer reads its dtype policy at each call, so setting it to float32 on every layer does the same
    (the variables are float32 already). Eager calls only: a traced train_function keeps its graph.
    """
    layers = [model, *model._flatten_layers(include_self=False, recursive=True)]
    saved = [layer.dtype_policy for layer in layers]
    try:
        for layer in layers:
            layer.dtype_policy = keras.DTypePolicy("float32")
        yield
    finally:
        for layer, policy in zip(layers, saved):
            layer.dtype_policy = policy


def gradient_underflow(model: keras.Model, x, y, precision: str, loss_scale: float,
                       loss_weight: float = 1.0) -> list[dict]:
    """Per parameter: how its gradient of one batch fares in float16, by amp_compare.kit.fp16.UNDERFLOW_METHOD.

    Exactly as torch_impl/numerics.py measures it: the float32 reference gradient of the unscaled
    loss (times loss_weight, e.g. 1e-9 to make gradients tiny), forward and backward with every
    layer's policy float32, is rounded to float16 unscaled and times loss_scale; the real mixed
    backward (the model's own policy) of the same unscaled loss, and of loss * loss_scale as
    LossScaleOptimizer takes it, is read for exact zeros (see gradient_stats). A float32 run's
    mixed backward is the reference. Rows are in canonical naming (weight/bias, torch layout);
    the model is left unchanged.
    """
    _check_policy(model, precision)
    variables = model.trainable_variables

    def grads(scale: float) -> dict[str, np.ndarray]:
        def loss_of(logits):
            loss = loss_fn(y, logits) * loss_weight
            return loss * scale if scale != 1 else loss

        _, out = backends.gradients(model, loss_of, x)  # each backend's own autodiff, eager
        out = [np.zeros(v.shape, np.float32) if g is None else _numpy(g) for v, g in zip(variables, out)]
        return to_canonical(model, out, variables)

    with _training_step_state(model):
        with _float32_policy(model):
            reference = grads(1.0)
        mixed = grads(1.0) if precisions.of(precision).mixed else reference
        mixed_scaled = grads(loss_scale) if mixed is not reference and loss_scale != 1 else mixed
    rows = []
    for name, grad in reference.items():
        layer, param = name.rsplit(".", 1)
        rows.append(gradient_stats(layer, param, grad, loss_scale, mixed[name], mixed_scaled[name]))
    return rows


def adam_formula_gap(model: keras.Model, x, y, precision: str, optimizer) -> dict:
    """Defaults mode: how far torch's and Keras' Adam formulas move apart on this run's own first batch.

    The gradient is the real one of the first step (forward and backward under the model's policy,
    the unscaled loss, as the optimizer sees it once unscaled); one Adam step of each formula is
    applied to it with this optimizer's lr and betas, Keras' epsilon from the live optimizer
    (inside a LossScaleOptimizer) and torch's default epsilon (kit/adam_gap.py).
    The model is unchanged.
    """
    from amp_compare.kit.adam_gap import ADAM_DEFAULT_EPSILON, adam_first_step_gap

    _check_policy(model, precision)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    with _training_step_state(model):
        _, grads = backends.gradients(model, lambda logits: loss_fn(y, logits), x)
    lr = float(keras.ops.convert_to_numpy(inner.learning_rate))
    return adam_first_step_gap([_numpy(g) for g in grads if g is not None], lr, float(inner.beta_1),
                               float(inner.beta_2), eps_torch=ADAM_DEFAULT_EPSILON["torch"],
                               eps_keras=float(inner.epsilon))


# ---------------------------------------------------------------------------------------------
# NaN / Inf locator
# ---------------------------------------------------------------------------------------------

def _numpy(t) -> np.ndarray:
    return keras.ops.convert_to_numpy(keras.ops.cast(t, "float32"))


def locate_nonfinite(model: keras.Model, x, y, precision: str, loss_scale: float) -> dict | None:
    """The first place one forward/backward step goes inf or NaN, or None if it stays finite.

    The backward is of loss * loss_scale, the scale the run used at that step (as LossScaleOptimizer
    or a fixed fp16-static scale does; the caller passes 1.0 for a run without loss scaling). A
    functional model over the same layers (so the same variables) returns every layer's output,
    and the tape gives gradients w.r.t. those outputs and the variables.
    Forward: the first layer, in execution order, whose output is non-finite (then "loss").
    Backward (forward finite): the first layer from the loss backwards whose gradient w.r.t.
    its output, then w.r.t. its own variables, is non-finite. Returns {"where": "forward" |
    "backward", "layer", "tensor": "output" or the parameter name, "value": "inf" | "nan"}.
    """
    _check_policy(model, precision)
    layers = _layers(model)
    probe = keras.Model(model.input, [layer.output for layer in layers])  # model.input: its own structure
    logits_index = next(i for i, layer in enumerate(layers) if layer.output is model.outputs[0])
    variables = probe.trainable_variables  # the model's, in the order backends.gradients returns them
    with _training_step_state(model):
        outputs = probe(x, training=True)
        for layer, output in zip(layers, outputs):
            kind = nonfinite_kind(_numpy(output))
            if kind:
                return {"where": "forward", "layer": canonical_name(layer), "tensor": "output", "value": kind}
        kind = nonfinite_kind(_numpy(loss_fn(y, outputs[logits_index])))
        if kind:
            return {"where": "forward", "layer": LOSS, "tensor": "output", "value": kind}
    with _training_step_state(model):
        # the run's own scale: dynamic, fp16-static, or 1.0; gradients w.r.t. every layer's output too
        # (not on JAX, whose stateless autodiff differentiates w.r.t. inputs of the call only: variables alone)
        _, grads = backends.gradients(probe, lambda outs: loss_fn(y, outs[logits_index]) * loss_scale, x,
                                      extra_outputs=range(len(outputs)))
    output_grads, variable_grads = grads[:len(outputs)], dict(zip((v.path for v in variables), grads[len(outputs):]))
    for layer, grad in reversed(list(zip(layers, output_grads))):  # from the loss backwards
        candidates = [("output", grad)] + [(VARIABLE_TO_TORCH.get(v.name, v.name), variable_grads[v.path])
                                           for v in layer.trainable_weights]
        for tensor, g in candidates:
            kind = None if g is None else nonfinite_kind(_numpy(g))
            if kind:
                return {"where": "backward", "layer": canonical_name(layer), "tensor": tensor, "value": kind}
    return None
