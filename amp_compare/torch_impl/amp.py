"""PyTorch's mixed-precision idiom, all of it: torch.autocast + torch.amp.GradScaler.

Read beside keras_impl/amp.py: the same functions in the same order (torch adds FixedScaler and
found_inf, what GradScaler lacks), so `diff` of the two files is the AMP difference between the
frameworks. train.py, probe.py, numerics.py and the benchmarks take their autocast, scaler and
scaled step from here. What each precision mode means is one row of
contract/precision.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import RunConfig
from amp_compare.contract.mapping import framework_settings


def amp_setting(precision: str) -> torch.dtype | None:
    """What torch's AMP switch takes for a mode: the autocast dtype (None: no autocast, float32 throughout)."""
    name = precisions.of(precision).torch_autocast
    return None if name is None else getattr(torch, name)


def mixed_precision(precision: str, device_type: str):
    """AMP: a context for the forward and the loss, casting op by op (convolutions and matmuls in the
    half dtype, reductions and cross_entropy in float32). The weights stay float32; outside it, float32."""
    amp_dtype = amp_setting(precision)
    return torch.autocast(device_type, dtype=amp_dtype, enabled=amp_dtype is not None)


class FixedScaler(torch.amp.GradScaler):
    """fp16-static: GradScaler's scaling, unscaling and skipping of non-finite steps, with the scale
    held fixed (GradScaler itself insists on growth > 1 and backoff < 1)."""

    def __init__(self, device: str, scale: float):
        super().__init__(device, init_scale=scale)
        self.fixed_scale = float(scale)  # update() takes a float or a tensor, not an int

    def update(self, new_scale=None) -> None:
        super().update(self.fixed_scale)


def make_scaler(cfg: RunConfig) -> torch.amp.GradScaler:
    """AMP: loss scaling, an object beside the optimizer (scaler.step(optimizer) takes it each step):
    fp16 dynamic, fp16-static fixed; a disabled scaler (fp32, bf16, fp16-noscale) makes
    scale/step/update pass through, so one loop serves every mode."""
    if cfg.loss_scaling == "static":
        return FixedScaler(cfg.device, cfg.loss_scale)
    settings = framework_settings(cfg)
    scaling = {k: settings[k] for k in ("init_scale", "growth_interval")} if settings else {}
    return torch.amp.GradScaler(cfg.device, enabled=cfg.loss_scaling == "dynamic", **scaling)


def current_scale(scaler: torch.amp.GradScaler) -> torch.Tensor:
    """The live loss scale as a device tensor (get_scale() would synchronise every step); 1.0: no scaling."""
    if not scaler.is_enabled():
        return torch.ones((), device=scaler._device)
    if scaler._scale is None:  # created lazily by the first scaler.scale()
        return torch.full((), scaler.get_scale(), device=scaler._device)
    return scaler._scale.detach().clone().reshape(())


def found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, device: torch.device) -> torch.Tensor:
    """Whether scaler.step skipped this step's update (non-finite gradients), as a device tensor: read
    between scaler.step() and scaler.update(), which clears it."""
    state = scaler._per_optimizer_states.get(id(optimizer), {}) if scaler.is_enabled() else {}
    found = state.get("found_inf_per_device")
    if not found:
        return torch.zeros((), dtype=torch.bool, device=device)
    return sum(v.to(device, non_blocking=True) for v in found.values()).reshape(()) > 0


def train_step(model, optimizer, scaler, x, y, amp_dtype, clip_grad_norm: float | None = None):
    """One scaled optimizer step. Returns (loss, correct, skipped) as device tensors."""
    with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):  # AMP: op-level casts
        logits = model(x)
        loss = F.cross_entropy(logits, y)  # autocast computes this in float32
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()  # AMP: backward of loss * scale
    if clip_grad_norm is not None:
        scaler.unscale_(optimizer)  # AMP: clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
    scaler.step(optimizer)  # AMP: unscale gradients; skip the update if any is inf/NaN
    skipped = found_inf(scaler, optimizer, x.device)
    scaler.update()  # AMP: halve the scale on overflow, double it after growth_interval good steps
    return loss.detach(), (logits.argmax(1) == y).sum(), skipped


def describe_amp(cfg: RunConfig) -> str:
    """The AMP API a cell used, in words (the run table's amp_api)."""
    return {"dynamic": "torch.autocast + torch.amp.GradScaler",
            "static": "torch.autocast + GradScaler held at a fixed scale"}.get(
        cfg.loss_scaling, "torch.autocast, no loss scaling" if cfg.mixed else "none")
