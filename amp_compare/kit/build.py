"""The order a cell's model is built in, written once for both frameworks' train(), speed trial and probe.

1. make_model: the architecture, with --fp32-layers applied (kept in float32 under mixed precision);
2. the shared initial weights (kit/child.SharedInit): loaded, or saved by the first cell of the seed, in
   kit/weights.py's canonical form, so every precision of both frameworks starts from the same values of the
   same unconverted layers;
3. fp8.convert: --fp8-outlier's activation and, in the fp8 modes, the float8 layers outside --fp32-layers,
   which take the loaded weights as they are;
4. compile: the optimizer (with the loss scaling) built on the converted model's parameters, and the
   framework's compilation.
Each framework supplies the steps (its train.py's functions); the order is this module's alone.
Framework-free: nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Built(NamedTuple):
    """What build() returns: the model, what compile made of it, and where its initial weights came from."""

    model: Any
    compiled: Any
    init_source: str


def build(cfg, data, shared_init, *, make_model: Callable, get_weights: Callable, set_weights: Callable,
          convert_fp8: Callable, compile: Callable) -> Built:
    """The cell's model in the order above. shared_init: a kit/child.SharedInit, or None where no weights are
    shared (the probe's random batch); compile(model) returns what the step runs (torch: the Compiled tuple;
    Keras: None, model.compile having set it up in place)."""
    model = make_model(cfg, data)
    init_source = (shared_init.apply(model, get_weights, set_weights) if shared_init is not None
                   else "not shared: the framework's own initialisers")
    model = convert_fp8(model, cfg)
    return Built(model, compile(model), init_source)
