"""GradScaler's live state as device tensors: the one place that reads GradScaler's private fields.

Why private: GradScaler's public API hands its state to Python (get_scale() is a float; whether step()
skipped the update is decided inside step() and never returned), and reading a Python value waits for
the device. The loop records the scale each step used and whether it was skipped without waiting, so
it reads the tensors behind them here. Field names of torch 2.x; a rename fails tests/test_perf.py
(skipped steps) and the parity suite's loss-scaler sequence.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch


class ScalerState(NamedTuple):
    device: str  # where the scaler keeps its tensors
    scale: torch.Tensor | None  # the live scale; None until the first scaler.scale() creates it, or disabled
    found_inf: list[torch.Tensor]  # step()'s non-finite-gradient flags for the optimizer, one per device


def peek(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer | None = None) -> ScalerState:
    """The scaler's tensors; found_inf (for `optimizer`) only between scaler.step() and scaler.update(),
    which clears it. A disabled scaler (fp32, bf16, fp16-noscale) has neither."""
    if not scaler.is_enabled():
        return ScalerState(scaler._device, None, [])
    states = scaler._per_optimizer_states.get(id(optimizer), {}) if optimizer is not None else {}
    return ScalerState(scaler._device, scaler._scale, list(states.get("found_inf_per_device", {}).values()))


@functools.cache
def constant(device: str, value: float | bool, dtype: torch.dtype) -> torch.Tensor:
    """A 0-d tensor made once per device and value: what a disabled scaler reports every step (scale 1.0,
    never skipped) without two allocations per step. Never written to; the loop copies records it reads."""
    return torch.tensor(value, dtype=dtype, device=device)


def found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """Whether scaler.step skipped this step's update (non-finite gradients), as a device tensor: read
    between scaler.step() and scaler.update(), which clears it."""
    state = peek(scaler, optimizer)
    if not state.found_inf:  # a disabled scaler never skips
        return constant(state.device, False, torch.bool)
    flags = state.found_inf[0] if len(state.found_inf) == 1 else sum(
        f.to(state.device, non_blocking=True) for f in state.found_inf)
    return flags.reshape(()) > 0
