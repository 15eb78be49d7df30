"""PyTorch's fp8 training: torchao.float8 (every nn.Linear becomes a Float8Linear), read back and recorded.

- `convert`: the cell's model with its Linear layers swapped by `convert_to_float8_training` under the recipe of
  contract/fp8.py (tensorwise or rowwise), --fp32-layers left out; `emulate=True` off a GPU (fp8 casts, a float32
  matmul of the dequantized operands). On a GPU it runs torchao's scaled matmuls without emulation, fast only under
  torch.compile (--compile): that path has not been run by this project (no GPU here), so no GPU figure is claimed.
- `settings`: the recipe read back from the live Float8Linear modules (formats, scaling, granularity, scales'
  rounding and convention, which layers), for the report's declared-versus-used table.
- `capture_step`: one training step's tensors of every converted layer (input, kernel, output gradient, output,
  input and kernel gradients), which `layer_rows` turns into per-layer SQNR and tests/test_fp8_reference.py
  checks against kit/fp8.py's float64 reference.
- `Trace`: per-step amax of each converted layer's input, kernel and output gradient, kept on the device and read
  once per epoch: the scale trajectory (torchao's scale is fmax / this step's amax).
- `add_outlier`: --fp8-outlier, in every precision of the run: one large activation entering blocks.0.attn.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from amp_compare.contract import fp8 as contract
from amp_compare.contract.config import RunConfig
from amp_compare.kit import fp8 as ref
from amp_compare.kit.child import Unavailable
from amp_compare.kit.weights import name_matches

_ROLE_DTYPE = {"input": "cast_config_input", "kernel": "cast_config_weight", "grad_output": "cast_config_grad_output"}


def _config(cfg: RunConfig):
    """contract/fp8.py's recipe as torchao's Float8LinearConfig (tests/test_fp8_reference.py checks it equals
    torchao's own named recipe); emulated off a GPU (a CPU has no fp8 matmul)."""
    from torchao.float8.config import CastConfig, Float8LinearConfig, ScalingGranularity

    recipe = contract.recipe(cfg.framework, cfg.precision)
    granularity = ScalingGranularity.AXISWISE if recipe.granularity == "row" else ScalingGranularity.TENSORWISE
    casts = {role: CastConfig(scaling_granularity=granularity, target_dtype=getattr(torch, fmt))
             for role, fmt in recipe.format_of.items()}
    return Float8LinearConfig(cast_config_input=casts["input"],
                              cast_config_weight=casts["kernel"],
                              cast_config_grad_output=casts["grad_output"],
                              round_scales_to_power_of_2=recipe.power_of_2_scales, emulate=cfg.device != "cuda")


def convert(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The model as the cell trains it: --fp8-outlier's activation, then (fp8 modes) torchao's Float8Linear in
    place of every nn.Linear outside --fp32-layers."""
    if cfg.fp8_outlier:
        add_outlier(model)
    if not contract.is_fp8(cfg.precision):
        return model
    reason = contract.unavailable_reason(cfg.framework, cfg.precision, cfg.replicas)
    if reason:
        raise Unavailable(reason)
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training(model, config=_config(cfg),
                                      module_filter_fn=lambda module, name: not name_matches(name, cfg.fp32_layers))


def converted(model: nn.Module) -> dict[str, nn.Module]:
    """The Float8Linear modules by canonical name (empty for a model that was not converted)."""
    from torchao.float8.float8_linear import Float8Linear

    return {name: m for name, m in model.named_modules() if isinstance(m, Float8Linear)}


def _format(dtype: torch.dtype) -> str:
    return {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}.get(dtype, str(dtype))


def _convention() -> str:
    """How torchao applies a scale, read from its own cast of a tensor: fp8 = x * scale (multiply) or x / scale."""
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    x = torch.tensor([2.0, -1.0])
    t = hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig())
    return "multiply" if float(t._data.float()[0]) == float(2.0 * t._scale) else "divide"


def settings(model: nn.Module) -> dict:
    """The fp8 recipe as the live modules hold it (contract/fp8.Recipe's fields), and the converted layers."""
    layers = converted(model)
    if not layers:
        return {}
    layer = next(iter(layers.values()))
    config = layer.config
    casts = [getattr(config, _ROLE_DTYPE[role]) for role in contract.ROLES]
    return {"module": f"{type(layer).__module__}.{type(layer).__qualname__}",  # the class the report names
            "formats": [_format(c.target_dtype) for c in casts],
            "scaling": casts[0].scaling_type.value,
            "granularity": "row" if casts[0].scaling_granularity.value == "axiswise" else "tensor",
            "amax_history": 1,  # torchao keeps no history: each cast takes its own tensor's amax
            "power_of_2_scales": bool(config.round_scales_to_power_of_2),
            "scale_convention": _convention(),
            "emulate": bool(config.emulate),
            "converted": sorted(layers)}


def add_outlier(model: nn.Module) -> None:
    """--fp8-outlier: the class token's first feature entering blocks.0.attn (ln1's output) gets OUTLIER_VALUE
    added, in every precision of the run, so fp8's cells differ from the others by their precision only."""
    def hook(module, args, output):
        bump = torch.zeros_like(output)
        bump[:, 0, 0] = contract.OUTLIER_VALUE
        return output + bump

    model.get_submodule("blocks.0.ln1").register_forward_hook(hook)


def capture_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, dict[str, np.ndarray]]:
    """One training step's forward and backward (nothing of the model changes: gradients by autograd.grad),
    with every converted layer's tensors as 2-D float32 numpy: input (tokens, in), kernel (in, out),
    bias, output, grad_output (tokens, out), grad_input, grad_kernel (in, out)."""
    from amp_compare.torch_impl import vit

    layers, seen, handles = converted(model), {}, []
    for name, module in layers.items():
        def own_input(m, args, name=name):  # a view of its own, so its gradient is this layer's alone (q, k, v
            seen[name] = {"input_t": args[0].view_as(args[0])}  # share one input tensor)
            return (seen[name]["input_t"], *args[1:])

        def keep(m, args, output, name=name):
            seen[name]["output_t"] = output
        handles += [module.register_forward_pre_hook(own_input), module.register_forward_hook(keep)]
    was_training = model.training
    try:
        model.train()
        with vit.paused(model):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        params = [m.weight for m in layers.values()]
        outputs = [seen[name]["output_t"] for name in layers]
        inputs = [seen[name]["input_t"] for name in layers]
        grads = torch.autograd.grad(loss, params + outputs + inputs, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    n = len(layers)

    def flat(t: torch.Tensor) -> np.ndarray:
        return t.detach().float().reshape(-1, t.shape[-1]).cpu().numpy()
    return {name: {"input": flat(seen[name]["input_t"]), "kernel": flat(m.weight).T.copy(),
                   "bias": m.bias.detach().cpu().numpy() if m.bias is not None else None,
                   "output": flat(seen[name]["output_t"]), "grad_output": flat(grads[n + i]),
                   "grad_input": flat(grads[2 * n + i]) if grads[2 * n + i] is not None else None,
                   "grad_kernel": flat(grads[i]).T.copy()}
            for i, (name, m) in enumerate(layers.items())}


def layer_rows(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: RunConfig, when: str,
               step: int) -> list[dict]:
    """Per converted layer, the SQNR of its input, kernel and output gradient as the recipe quantizes them,
    against the float32 tensors of one training step (the numerics lab's batch). Empty outside fp8."""
    recipe = contract.recipe(cfg.framework, cfg.precision)
    if recipe is None or not converted(model):
        return []
    rows = []
    for name, t in capture_step(model, x, y).items():
        rows += ref.sqnr_rows(recipe, name, t, None, when, step)
    return rows


class Trace:
    """Per training step, each converted layer's amax of input, kernel and output gradient, kept on the device
    (no host read in the step) and read once per epoch; torchao's scale of a step is fmax / that step's amax."""

    def __init__(self, model: nn.Module, cfg: RunConfig):
        self.recipe = contract.recipe(cfg.framework, cfg.precision)
        self.values: list[tuple[str, str, torch.Tensor]] = []
        self.counts: dict[tuple[str, str], int] = {}  # steps already read, per layer and role
        for name, module in (converted(model) if self.recipe else {}).items():
            module.register_forward_pre_hook(self._forward(name))
            module.register_full_backward_hook(self._backward(name))

    def _forward(self, name: str):
        def hook(module, args):
            if module.training and torch.is_grad_enabled():  # training steps only, not validation
                with torch.no_grad():
                    self.values.append((name, "input", args[0].detach().abs().amax().float()))
                    self.values.append((name, "kernel", module.weight.detach().abs().amax().float()))
        return hook

    def _backward(self, name: str):
        def hook(module, grad_input, grad_output):
            with torch.no_grad():
                self.values.append((name, "grad_output", grad_output[0].detach().abs().amax().float()))
        return hook

    def read(self) -> list[dict]:
        """The rows since the last read (layer, role, step, amax, scale = fmax / amax), then reset."""
        if not self.values:
            return []
        amaxes = torch.stack([v for _, _, v in self.values]).cpu().tolist()
        rows = []
        for (name, role, _), amax in zip(self.values, amaxes):
            step = self.counts[(name, role)] = self.counts.get((name, role), 0) + 1
            fmax = contract.FP8_MAX[self.recipe.format_of[role]]
            rows.append({"layer": name, "role": role, "step": step, "amax": amax, "scale": fmax / max(amax, ref.EPS)})
        self.values = []
        return rows
