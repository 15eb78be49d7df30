"""PyTorch's mixed-precision idiom, all of it: torch.autocast + torch.amp.GradScaler.

Read beside the other framework's amp.py (torch_impl/, keras_impl/): the same functions in the same
order (torch adds FixedScaler, what GradScaler lacks), so `diff` of the two files is the
AMP difference between the frameworks. train.py, loop.py, probe.py, numerics.py and the benchmarks
take the AMP setting, loss scaling and scaled step from here. What each precision mode means is one
row of contract/precision.py.
GradScaler's private fields, which the step's record needs, are read in scaler_state.py only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import RunConfig
from amp_compare.contract.mapping import framework_settings
from amp_compare.kit.training import StepRecord
from amp_compare.torch_impl.scaler_state import constant, found_inf, peek


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
    """The live loss scale as a device tensor, read without waiting for the device; 1.0: no scaling.
    (GradScaler.get_scale() would wait: a Python float.)"""
    state = peek(scaler)  # GradScaler's private fields, read in torch_impl/scaler_state.py only
    if not scaler.is_enabled():
        return constant(state.device, 1.0, torch.float32)
    if state.scale is None:  # created lazily by the first scaler.scale()
        return torch.full((), scaler.get_scale(), device=state.device)
    return state.scale.reshape(()).clone()  # update() changes the scale in place


def clip_gradients(model, optimizer, scaler: torch.amp.GradScaler, max_norm: float | None) -> None:
    """--clip-grad-norm on the true gradients: unscaled first (clipping the scaled ones would clip at
    max_norm x scale); scaler.step then knows they are unscaled."""
    if max_norm is not None:
        scaler.unscale_(optimizer)  # AMP: clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def train_step(model, optimizer, scaler, x, y, precision: str, clip_grad_norm: float | None = None) -> StepRecord:
    """One scaled optimizer step. Returns its StepRecord (kit/training.py) of device tensors; a step is
    skipped when GradScaler found non-finite gradients and did not call optimizer.step."""
    scale_used = current_scale(scaler)
    with mixed_precision(precision, x.device.type):  # AMP: op-level casts
        logits = model(x)
        loss = F.cross_entropy(logits, y)  # autocast computes this in float32
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()  # AMP: backward of loss * scale
    clip_gradients(model, optimizer, scaler, clip_grad_norm)
    scaler.step(optimizer)  # AMP: unscale gradients; skip the update if any is inf/NaN
    skipped = found_inf(scaler, optimizer)  # GradScaler's own decision, read on the device (scaler_state.py)
    scaler.update()  # AMP: halve the scale on overflow, double it after growth_interval good steps
    return StepRecord(loss.detach(), logits.detach(), scale_used, skipped)


def describe_amp(cfg: RunConfig) -> str:
    """The AMP API a cell used, in words (the run table's amp_api)."""
    return {"dynamic": "torch.autocast + torch.amp.GradScaler",
            "static": "torch.autocast + GradScaler held at a fixed scale"}.get(
        cfg.loss_scaling, "torch.autocast, no loss scaling" if cfg.mixed else "none")
