"""Where mixed precision puts each number, in PyTorch: per-layer dtypes, gradient underflow, NaN/Inf.

Read this file beside keras_impl/numerics.py: the public functions have the same names, arguments
and result rows, and the numpy helpers both use are one copy in kit/fp16.py (gradient_stats,
nonfinite_kind; tests/test_numerics.py checks both files take that copy), so a row from one framework
can be compared with the same row from the other.

- `dtype_audit`: the dtype every aten op of one training step computes in, per module.
- `apply_fp32_layers`: keep named blocks in float32 under autocast.
- `gradient_underflow` / `underflow_summary`: how many gradient elements float16 would flush
  to zero or overflow, with and without a loss scale.
- `locate_nonfinite`: the first layer whose output (forward) or gradient (backward) is inf/NaN.

Layers are named by their module name ("conv1", "layer1.0.bn1", "fc"), the canonical naming of
kit/weights.py; "loss" is the loss after the model, and "" what runs in no submodule: the
model's own code (SimpleCNN's functional relu and flatten) and, in the backward, the autograd
engine summing a residual's two gradient branches.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from amp_compare.contract import precision as precisions
from amp_compare.kit.fp16 import (
    gradient_stats,
    nonfinite_kind,
)
from amp_compare.kit.weights import check_layer_names
from amp_compare.torch_impl.amp import amp_setting, mixed_precision
from amp_compare.torch_impl.vit import paused

LOSS = "loss"
# Aliases and allocations: they move no numbers, and would drown the table.
BOOKKEEPING_OPS = {"detach", "alias", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
                   "new_empty_strided", "zeros_like", "ones_like", "fill_", "zero_"}

# Layout-only copies (a flatten of a channels-last tensor is clone + _unsafe_view): skipped as views
# are, and as keras_impl/numerics.py skips Reshape, so the two audits list the same layers.
LAYOUT_OPS = {"clone", "_unsafe_view", "contiguous"}


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss of torch_impl/amp.py's train_step (autocast computes it in float32)."""
    return F.cross_entropy(logits, y)


def _amp_dtype(precision: str) -> torch.dtype | None:
    try:
        return amp_setting(precision)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def _autocast(x: torch.Tensor, precision: str):
    _amp_dtype(precision)  # an unknown precision is a ValueError
    return mixed_precision(precision, x.device.type)


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's or module's result (a tensor, or a tuple/list of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _param_dtype(module: nn.Module | None) -> str:
    """The dtype(s) of a module's own parameters ("" for none)."""
    if module is None:
        return ""
    return ",".join(sorted({_dtype_name(p.dtype) for p in module.parameters(recurse=False)}))


@contextmanager
def _training_step_state(model: nn.Module) -> Iterator[None]:
    """Train mode for the duration, then the model as it was: a diagnosis leaves no trace.

    A training-mode forward updates BatchNorm's running statistics; they are put back. The vit's headroom
    recorders are paused.
    """
    was_training = model.training
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.train()
    try:
        with paused(model):  # the vit's headroom recording off: the audit lists the model's own ops
            yield
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])


def _as_tensors(model: nn.Module, x, y) -> tuple[torch.Tensor, torch.Tensor]:
    device = next(model.parameters()).device
    return torch.as_tensor(x, device=device), torch.as_tensor(y, device=device)


# ---------------------------------------------------------------------------------------------
# dtype audit
# ---------------------------------------------------------------------------------------------

class _OpRecorder(TorchDispatchMode):
    """Counts every aten op that runs, by (layer, op, phase, output dtype).

    A dispatch mode sits below autograd and autocast, so it sees the ops that really run: the
    casts autocast inserts (`_to_copy`), and each op with the dtype autocast chose for it.
    """

    def __init__(self):
        super().__init__()
        self.layer = ""  # set by the module and autograd-node hooks below
        self.phase = "forward"
        self.counts: Counter[tuple[str, str, str, str, str]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        # An op's dtype is the dtype of its floating outputs: BatchNorm's is "float16+float32"
        # (the normalised output, then the float32 batch statistics it saves for backward).
        dtypes = dict.fromkeys(_dtype_name(t.dtype) for t in _tensors(out) if t.is_floating_point())
        # Its inputs' floating dtypes are the dtype it computed in: a fused kernel's extra float32 output
        # (the attention's log-sum-exp) says nothing of the dtype its arithmetic read.
        inputs = dict.fromkeys(_dtype_name(t.dtype) for t in tree_leaves((args, kwargs or {}))
                               if isinstance(t, torch.Tensor) and t.is_floating_point())
        if dtypes and not func.is_view and name not in BOOKKEEPING_OPS and name not in LAYOUT_OPS:
            self.counts[(self.layer, name, self.phase, "+".join(dtypes), "+".join(inputs))] += 1
        return out


class _LayerTracker:
    """Knows which module is running, in the forward (a stack kept by module hooks) and in the
    backward (each autograd node is labelled with the module whose forward created it).

    Backward attribution uses autograd-node hooks rather than module full backward hooks: those
    fire at the wrong time for a module whose inputs need no gradient (the first conv), and
    clash with in-place ReLU (resnet18's `nn.ReLU(inplace=True)`). Nodes run one at a time, so a
    node's pre-hook names the module for the ops that follow.
    """

    def __init__(self, model: nn.Module, recorder: _OpRecorder):
        self.recorder = recorder
        self.stack: list[str] = []
        self.node_layer: dict[Any, str] = {}
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._enter(name)))
            self.handles.append(module.register_forward_hook(self._leave(name)))

    def claim(self, tensors: Iterable[torch.Tensor], layer: str) -> None:
        """Label the autograd nodes behind `tensors` made since the last module boundary.

        Called at every boundary (a module starting or finishing), so the unlabelled nodes are
        exactly those the running module made since the last one.
        """
        todo = [t.grad_fn for t in tensors if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or node in self.node_layer or hasattr(node, "variable"):  # labelled, or a leaf
                continue
            self.node_layer[node] = layer
            todo.extend(next_node for next_node, _ in node.next_functions)

    def _enter(self, name: str):
        def hook(module, args):
            self.claim(_tensors(args), self.stack[-1] if self.stack else "")
            self.stack.append(name)
            self.recorder.layer = name
        return hook

    def _leave(self, name: str):
        def hook(module, args, output):
            self.claim(_tensors(output), name)
            self.stack.pop()
            self.recorder.layer = self.stack[-1] if self.stack else ""
        return hook

    def label_backward(self) -> None:
        """From now on, ops run by an autograd node are recorded under the node's module."""
        def enter(layer):
            def hook(grad_outputs):
                self.recorder.layer = layer
            return hook

        def leave(grad_inputs, grad_outputs):
            self.recorder.layer = ""  # e.g. the engine summing the gradients of a tensor used twice

        for node, layer in self.node_layer.items():
            self.handles += [node.register_prehook(enter(layer)), node.register_hook(leave)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.node_layer.clear()  # the nodes hold the graph's saved tensors


def dtype_audit(model: nn.Module, x, y, precision: str) -> list[dict]:
    """The dtype each op of one training step (forward, loss, backward) computes in, per module.

    x: NCHW inputs, y: class indices (tensors or arrays). Nothing of the model changes: the
    gradients are taken with torch.autograd.grad (no .grad is written) and BatchNorm statistics
    are restored. Rows, in order of first appearance: {"layer", "op" (aten name), "phase",
    "compute_dtype" (the op's floating output dtypes), "input_dtype" (its floating inputs' dtypes: the
    dtype it computed in), "param_dtype" (the module's own
    parameters, "" for none), "count" (how many times that row's op ran)}.
    """
    x, y = _as_tensors(model, x, y)
    recorder = _OpRecorder()
    tracker = _LayerTracker(model, recorder)
    modules = dict(model.named_modules())
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        with _training_step_state(model), recorder:
            with _autocast(x, precision):
                logits = model(x)
                recorder.layer = LOSS
                loss = loss_fn(logits, y)
            tracker.claim([loss], LOSS)
            tracker.label_backward()
            recorder.phase, recorder.layer = "backward", LOSS
            torch.autograd.grad(loss, params)
    finally:
        tracker.remove()
    return [{"layer": layer, "op": op, "phase": phase, "compute_dtype": dtype, "input_dtype": inputs,
             "param_dtype": _param_dtype(modules.get(layer) if layer else None), "count": count}
            for (layer, op, phase, dtype, inputs), count in recorder.counts.items()]


# ---------------------------------------------------------------------------------------------
# float32 overrides
# ---------------------------------------------------------------------------------------------

def _float32(value: Any) -> Any:
    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _float32_forward(self: nn.Module, *args, **kwargs):
    """The module's own forward with autocast off and floating inputs cast to float32."""
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    device = tensors[0].device.type if tensors else "cpu"
    with torch.autocast(device, enabled=False):
        args = tuple(_float32(a) for a in args)
        kwargs = {k: _float32(v) for k, v in kwargs.items()}
        return type(self).forward(self, *args, **kwargs)


def apply_fp32_layers(model: nn.Module, names: Iterable[str]) -> nn.Module:
    """Make the named modules (and everything inside them) compute in float32 under autocast.

    Modifies the model in place and returns it. Each named module's forward runs with autocast
    disabled and its floating inputs cast to float32; its output stays float32, and the next
    autocast op casts it down again. A bound method, so copy.deepcopy keeps the override.
    """
    names = [names] if isinstance(names, str) else list(names)
    modules = dict(model.named_modules())
    check_layer_names(names, (n for n in modules if n))
    for name in names:
        modules[name].forward = types.MethodType(_float32_forward, modules[name])
    return model


# ---------------------------------------------------------------------------------------------
# gradient underflow
# ---------------------------------------------------------------------------------------------

def gradient_underflow(model: nn.Module, x, y, precision: str, loss_scale: float,
                       loss_weight: float = 1.0) -> list[dict]:
    """Per parameter: how its gradient of one batch fares in float16, by amp_compare.kit.fp16.UNDERFLOW_METHOD.

    Exactly as keras_impl/numerics.py measures it: the float32 reference gradient of the unscaled loss
    (times loss_weight, e.g. 1e-9 to make gradients tiny), forward and backward with autocast off,
    is rounded to float16 unscaled and times loss_scale; the real mixed backward (forward under
    `precision`'s autocast) of the same unscaled loss, and of loss * loss_scale as GradScaler takes
    it, is read for exact zeros (see gradient_stats). A float32 run's mixed backward is the
    reference. The model is left unchanged.
    """
    x, y = _as_tensors(model, x, y)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]

    def grads(amp_precision: str, scale: float) -> list[np.ndarray]:
        with _autocast(x, amp_precision):
            loss = loss_fn(model(x), y) * loss_weight
        out = torch.autograd.grad(loss * scale if scale != 1 else loss, params, allow_unused=True)
        return [_numpy(torch.zeros_like(p) if g is None else g) for p, g in zip(params, out)]

    with _training_step_state(model):
        reference = grads(precisions.REFERENCE, 1.0)
        mixed = grads(precision, 1.0) if _amp_dtype(precision) is not None else reference
        mixed_scaled = grads(precision, loss_scale) if mixed is not reference and loss_scale != 1 else mixed
    rows = []
    for (name, _), ref, mix, mix_scaled in zip(named, reference, mixed, mixed_scaled):
        layer, param = name.rsplit(".", 1)
        rows.append(gradient_stats(layer, param, ref, loss_scale, mix, mix_scaled))
    return rows


def adam_formula_gap(model: nn.Module, x, y, precision: str, optimizer: torch.optim.Optimizer) -> dict:
    """Defaults mode: how far torch's and Keras' Adam formulas move apart on this run's own first batch.

    The gradient is the real one of the first step (forward and backward under `precision`, the
    unscaled loss, as the optimizer sees it once unscaled); one Adam step of each formula is
    applied to it with this optimizer's lr and betas, torch's epsilon from the live optimizer and
    Keras' default epsilon (kit/adam_gap.py). The model is unchanged.
    """
    from amp_compare.kit.adam_gap import ADAM_DEFAULT_EPSILON, adam_first_step_gap

    x, y = _as_tensors(model, x, y)
    params = [p for p in model.parameters() if p.requires_grad]
    with _training_step_state(model):
        with _autocast(x, precision):
            loss = loss_fn(model(x), y)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    group = optimizer.param_groups[0]
    return adam_first_step_gap([_numpy(g) for g in grads if g is not None], float(group["lr"]),
                               float(group["betas"][0]), float(group["betas"][1]),
                               eps_torch=float(group["eps"]), eps_keras=ADAM_DEFAULT_EPSILON["tf"])


# ---------------------------------------------------------------------------------------------
# NaN / Inf locator
# ---------------------------------------------------------------------------------------------

def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def locate_nonfinite(model: nn.Module, x, y, precision: str, loss_scale: float) -> dict | None:
    """The first place one forward/backward step goes inf or NaN, or None if it stays finite.

    The backward is of loss * loss_scale under fp16 (as GradScaler does), of the loss otherwise.
    Forward: the first module, in execution order, that turned finite inputs into a non-finite output (else the
    first with a non-finite output; then "loss").
    Backward (forward finite): the first module from the loss backwards whose gradient w.r.t.
    its output, then w.r.t. its own parameters, is non-finite. Returns {"where": "forward" |
    "backward", "layer", "tensor": "output" or the parameter name, "value": "inf" | "nan"}.
    """
    x, y = _as_tensors(model, x, y)
    order: list[str] = []  # modules in the order their forward finished
    first_bad_output: list[tuple[str, str]] = []
    produced: list[tuple[str, str]] = []  # the first module whose finite inputs gave a non-finite output
    output_grads: dict[str, list[np.ndarray]] = {}

    def forward_hook(name):
        def hook(module, args, output):
            order.append(name)
            for t in _tensors(output):
                kind = nonfinite_kind(_numpy(t))
                if kind and not first_bad_output:
                    first_bad_output.append((name, kind))
                # A submodule finishes before its parent: the vit's attention computes its NaN in its own code, and
                # its out projection, which only passes it on, finishes first. The layer that made the value is the
                # one whose inputs were finite (Keras' locator, over top-level layers, names the same one).
                if kind and not produced and not any(nonfinite_kind(_numpy(a)) for a in _tensors(args)):
                    produced.append((name, kind))
                if t.requires_grad:  # runs when the gradient w.r.t. this output is computed
                    t.register_hook(lambda grad: output_grads.setdefault(name, []).append(_numpy(grad)))
        return hook

    handles = [m.register_forward_hook(forward_hook(n)) for n, m in model.named_modules() if n]
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    try:
        with _training_step_state(model):
            with _autocast(x, precision):
                loss = loss_fn(model(x), y)
            if first_bad_output or nonfinite_kind(_numpy(loss)):
                found = produced or first_bad_output
                layer, kind = found[0] if found else (LOSS, nonfinite_kind(_numpy(loss)))
                return {"where": "forward", "layer": layer, "tensor": "output", "value": kind}
            scale = loss_scale  # whatever scaled this run: dynamic, fp16-static, or 1.0
            grads = torch.autograd.grad(loss * scale, [p for _, p in named], allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    param_grads: dict[str, list[tuple[str, np.ndarray]]] = {}
    for (name, _), grad in zip(named, grads):
        if grad is not None:
            layer, param = name.rsplit(".", 1)
            param_grads.setdefault(layer, []).append((param, _numpy(grad)))
    for layer in dict.fromkeys(reversed(order)):  # from the loss backwards, each module once
        candidates = [("output", g) for g in output_grads.get(layer, [])] + param_grads.get(layer, [])
        for tensor, grad in candidates:
            kind = nonfinite_kind(grad)
            if kind:
                return {"where": "backward", "layer": layer, "tensor": tensor, "value": kind}
    return None
