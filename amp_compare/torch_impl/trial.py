"""PyTorch's side of a speed trial (kit/trial.py): each precision's model as a cell builds and steps it.

The model, shared initial weights, fp8 conversion, optimizer, loss scaler and compiled network come from
train.assemble (kit/build.py's order) and each step is amp.train_step, the step loop.run_epoch takes; the batches are
the cell's first batches, gathered from the same device tensors (make_dataset), the same for every precision.
"""

from __future__ import annotations

import torch

from amp_compare.contract.config import RunConfig
from amp_compare.kit.child import SharedInit
from amp_compare.kit.data import Dataset, epoch_batches
from amp_compare.kit.trial import Stepper
from amp_compare.torch_impl import amp
from amp_compare.torch_impl.train import assemble, compile_model, make_dataset, setup

BATCHES = 8  # the cell's first batches, which every block cycles through


def steppers(cfgs: list[RunConfig], data: Dataset, shared_init: SharedInit) -> tuple[list[Stepper], int]:
    """One Stepper per configuration (fp32 first), and the intra-op threads the process runs with."""
    setup(cfgs[0])
    device = torch.device(cfgs[0].device)
    x_train, y_train, _, _ = make_dataset(cfgs[0], data)
    plan = torch.from_numpy(epoch_batches(len(x_train), cfgs[0].batch_size, cfgs[0].seed, 0)[:BATCHES]).to(device)
    batches = (x_train, y_train, plan)
    out = []
    for cfg in cfgs:
        setup(cfg)
        run = assemble(cfg, data, shared_init, lambda model, cfg=cfg: compile_model(cfg, model, device)).compiled
        out.append(Stepper(cfg.precision, _runner(cfg, run, batches)))
    return out, torch.get_num_threads()


def set_threads(n: int) -> int:
    """Intra-op threads from here on (kit/trial.py: a held trial warms up at one), and the number torch then uses."""
    torch.set_num_threads(n)
    return torch.get_num_threads()


def _runner(cfg: RunConfig, run, batches: tuple):
    run.model.train()
    x_train, y_train, plan = batches
    position = [0]

    def run_steps(k: int) -> float:
        for _ in range(k):
            idx = plan[position[0] % len(plan)]
            x, y = x_train[idx], y_train[idx]  # gathered per step, as loop.run_epoch does
            position[0] += 1
            if run.graphs:  # as loop.run_epoch: CUDA graphs start a step
                torch.compiler.cudagraph_mark_step_begin()
            record = amp.train_step(run.net, run.optimizer, run.scaler, x, y, cfg.precision, cfg.clip_grad_norm)
        return float(record.loss.item())  # the host read that ends the block

    return run_steps


