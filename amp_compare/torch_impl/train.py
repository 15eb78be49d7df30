"""PyTorch training for one amp-compare cell: build, numerics lab, the timed loop, closing records.

Read this file beside the other framework's train.py: the functions of contract/twins.py have one signature in
both, the AMP idiom itself is amp.py, the instrumented loop loop.py (an explicit loop over
amp.train_step), and the AMP lines here are marked `# AMP:`.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from amp_compare.contract.config import RunConfig
from amp_compare.contract.mapping import framework_settings
from amp_compare.kit import training
from amp_compare.kit.build import Built, build
from amp_compare.kit.child import CpuPeakMemory, FirstStepWindow, Progress, SharedInit, TrainResult, check_final_weights
from amp_compare.kit.data import Dataset, epoch_batches, epoch_images
from amp_compare.kit.dataparallel import numerics_for
from amp_compare.kit.phases import lap
from amp_compare.kit.training import StepBook, first_batch_index
from amp_compare.torch_impl import amp, distributed, fp8, numerics, profile, schedule, vit
from amp_compare.torch_impl.device import (
    dataset_bytes,
    device_info,
    measure_ceiling,
    start_memory_window,
    training_peak,
)
from amp_compare.torch_impl.loop import StepClock, evaluate, host_syncs_per_step, run_epoch
from amp_compare.torch_impl.models import build_model, get_weights, set_weights
from amp_compare.torch_impl.settings import describe_defaults, settings_used


def setup(cfg: RunConfig) -> None:
    torch.manual_seed(cfg.seed)
    # TF32 decided here, as on the Keras side, so fp32 means the same thing in both frameworks.
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32 == "on"
    torch.backends.cudnn.allow_tf32 = cfg.tf32 == "on"
    torch.set_num_threads(cfg.threads)
    try:
        torch.set_num_interop_threads(cfg.threads)
    except RuntimeError:  # only settable before the first parallel work in the process
        pass


def make_model(cfg: RunConfig, data: Dataset) -> nn.Module:
    settings = framework_settings(cfg)  # empty in 'defaults' mode: torch's own BatchNorm defaults
    model = build_model(cfg.model, data.input_shape, data.num_classes, width=cfg.width,
                        bn_momentum=settings.get("bn_momentum"), bn_epsilon=settings.get("bn_epsilon"),
                        vit=vit.arguments(cfg, settings))
    if cfg.fp32_layers:  # AMP: these blocks run with autocast disabled, inputs cast to float32
        numerics.apply_fp32_layers(model, cfg.fp32_layers)
    return model


def assemble(cfg: RunConfig, data: Dataset, shared_init: SharedInit | None, compile) -> Built:
    """The cell's model in kit/build.py's order, with torch's steps: make_model, the shared initial weights,
    fp8.convert (torchao's Float8Linear for nn.Linear outside --fp32-layers), then compile(model)."""
    return build(cfg, data, shared_init, make_model=make_model, get_weights=get_weights, set_weights=set_weights,
                 convert_fp8=fp8.convert, compile=compile)


def make_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    settings = framework_settings(cfg)
    if cfg.optimizer == "adam":
        optimizer = torch.optim.Adam(params, lr=cfg.lr, **({"eps": settings["adam_epsilon"]} if settings else {}))
    elif cfg.optimizer == "adamw":  # decoupled weight decay, as Keras' (contract/mapping.py)
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                      **({"eps": settings["adam_epsilon"]} if settings else {}))
    else:
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
    return schedule.attach(optimizer, cfg)  # --lr-schedule warmup-cosine (torch_impl/schedule.py)


def make_step_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    """make_optimizer's optimizer; with --step tuned the same hyperparameters in its fused implementation,
    which takes GradScaler's found_inf on the device (the default one makes GradScaler.step read it on
    the host: one synchronisation per step on a GPU)."""
    params = list(params)
    optimizer = make_optimizer(cfg, params)
    if cfg.step == "tuned":
        optimizer = type(optimizer)(params, **{**optimizer.defaults, "foreach": None, "fused": True})
        optimizer = schedule.attach(optimizer, cfg)  # the new optimizer gets the schedule too
    return optimizer


class Compiled(NamedTuple):
    """What compile_model returns: the model as the training step runs it."""

    model: nn.Module  # on the device: its parameters, state dict and modes
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    net: nn.Module  # what the step calls: torch.compile's wrapper of model, or model itself
    graphs: bool  # CUDA graphs (reduce-overhead): each step marks its start


def compile_model(cfg: RunConfig, model: nn.Module, device: torch.device) -> Compiled:
    """The model as the training step runs it, for train() and the probe alike: on the device (channels
    last with --channels-last), its optimizer and loss scaler, and the network the step calls
    (torch.compile for --compile or --step tuned; with tuned on a GPU, CUDA graphs: compile's
    reduce-overhead mode). It compiles (and records its CUDA graphs) during the first steps: see
    compile_warmup_s."""
    model = model.to(device, memory_format=torch.channels_last if cfg.channels_last else torch.preserve_format)
    optimizer = make_step_optimizer(cfg, model.parameters())
    scaler = amp.make_scaler(cfg)
    graphs = cfg.step == "tuned" and device.type == "cuda"  # CUDA graphs hold their own memory pool
    net = (torch.compile(model, mode="reduce-overhead" if graphs else "default")
           if cfg.compile or cfg.step == "tuned" else model)
    return Compiled(model, optimizer, scaler, net, graphs)


def to_device_images(x: np.ndarray, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """NHWC numpy images -> NCHW device tensor, once per dataset (or per epoch when augmenting)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(memory_format=fmt).to(device)


def make_dataset(cfg: RunConfig, data: Dataset) -> tuple[torch.Tensor, ...]:
    """The whole dataset as device tensors (channels last with --channels-last); the loop gathers each
    batch from them by index, in the order of kit/data.py's batch plan."""
    device, channels_last = torch.device(cfg.device), cfg.channels_last
    return (to_device_images(data.x_train, device, channels_last), torch.from_numpy(data.y_train).to(device),
            to_device_images(data.x_val, device, channels_last), torch.from_numpy(data.y_val).to(device))


def train(cfg: RunConfig, data: Dataset, progress: Progress, shared_init: SharedInit) -> TrainResult:
    setup(cfg)
    worker = distributed.start(cfg)  # DATA PARALLEL: this process's place in a torchrun launch (distributed.py)
    logs = profile.start_logs(cfg)  # --profile: nothing to catch before the window in torch (profile.py)
    device = worker.device
    lap("setup")  # kit/phases.py: where the child's wall time goes
    # DATA PARALLEL: DDP + --allreduce's comm hook around the compiled model
    built = assemble(cfg, data, shared_init, lambda model: worker.wrap(compile_model(cfg, model, device)))
    run, init_source = built.compiled, built.init_source
    lap("init")
    ceiling = measure_ceiling(device, cfg)  # before the dataset and memory window; one per dtype (kit/reuse.py)
    lap("ceiling")
    tensors = make_dataset(cfg, data)
    lap("data")
    result = TrainResult(info=run_info(cfg, run, ceiling, tensors, init_source))
    lap("setup")
    first_batch = numerics_lab(cfg, run, tensors, result)  # outside the timed loop
    lap("audits")
    memory = start_memory_window(device)
    train_epochs(cfg, data, run, tensors, result, progress, memory, worker)
    lap("training")
    close_records(cfg, run, result, memory, tensors, first_batch)
    profile.profile_window(cfg, run, tensors, result, logs)  # --profile: extra steps after the timed ones (profile.py)
    worker.finish(result, first_batch, cfg.precision)  # DATA PARALLEL: all-reduce dtype read back, worker rows
    lap("closing")
    return result


def run_info(cfg: RunConfig, run: Compiled, ceiling: dict, tensors: tuple, init_source: str) -> dict:
    """The run's environment and settings, for the run table."""
    device = tensors[0].device
    return {
        "framework_version": torch.__version__,
        **device_info(device),
        "tf32": f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
                f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}",
        "compiled": (f"torch.compile(mode={'reduce-overhead' if run.graphs else 'default'})"
                     if run.net is not run.model else "eager"),
        "step_loop": cfg.step,
        "optimizer_impl": "fused" if run.optimizer.defaults.get("fused") else
                          ("foreach" if device.type == "cuda" else "for-loop") + " (torch default)",
        "host_syncs_per_step": host_syncs_per_step(run.optimizer, run.scaler),
        **ceiling,
        "dataset_device_bytes": dataset_bytes(tensors) if device.type == "cuda" else 0,
        "amp_api": amp.describe_amp(cfg),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "init_source": init_source,
        "framework_defaults": describe_defaults(),
        "settings_used": settings_used(run.model, run.optimizer, run.scaler, cfg),
        "fp8_settings": fp8.settings(run.model),  # fp8: the recipe read back from the live modules
    }


def numerics_lab(cfg: RunConfig, run: Compiled, tensors: tuple, result: TrainResult) -> tuple:
    """The numerics lab (kit/training.py) on the first batch, taken from the device-resident training set;
    returns that batch, which the closing underflow rows measure again."""
    x_train, y_train = tensors[:2]
    first = torch.from_numpy(first_batch_index(cfg, len(x_train))).to(x_train.device)
    first_batch = (x_train[first], y_train[first])
    training.numerics_lab(cfg, numerics, run.model, first_batch, float(amp.current_scale(run.scaler)), run.optimizer,
                          result)
    result.fp8_layers = fp8.layer_rows(run.model, *first_batch, cfg, "first step", 0)  # fp8: per-layer SQNR
    return first_batch


def train_epochs(cfg: RunConfig, data: Dataset, run: Compiled, tensors: tuple, result: TrainResult,
                 progress: Progress, memory: CpuPeakMemory | None, worker: distributed.Single) -> None:
    """The timed loop (loop.run_epoch), epoch by epoch, each followed by its validation pass. DATA PARALLEL:
    a worker trains on its slice of each global batch and its book sees every worker's steps (distributed.py)."""
    lab = numerics_for(cfg, numerics)
    x_train, y_train, x_val, y_val = tensors
    device = x_train.device
    epoch_data = {}  # the epoch's images and plan, for the locator

    def locate(epoch: int, batch: int, scale: float) -> dict | None:
        idx = epoch_data["plan"][batch]
        return lab.locate_nonfinite(run.model, epoch_data["x"][idx], y_train[idx], cfg.precision, scale)

    book = worker.book(StepBook(cfg, result, progress, lambda: get_weights(run.model), locate))
    first_step = FirstStepWindow(memory)
    clock = StepClock(device, training.times_each_step(cfg))  # host or device mode, as Keras' recorders
    trace = fp8.Trace(run.model, cfg)  # fp8: per-step amax of each converted layer, read once per epoch
    run.model.train()
    for epoch in range(cfg.epochs):
        plan = torch.from_numpy(epoch_batches(len(x_train), cfg.batch_size, cfg.seed, epoch,
                                              cfg.steps_per_epoch)).to(device)
        if cfg.augment:  # the same augmented pixels as the Keras side (kit/data.py)
            x_train = epoch_data["x"] = None  # freed before its replacement lands: one copy of the images in the peak
            x_train = to_device_images(epoch_images(data, cfg.seed, epoch, augment=True), device, cfg.channels_last)
        epoch_data.update(x=x_train, plan=plan)
        plan = worker.shard(plan)  # DATA PARALLEL: this worker's slice of each global batch
        book.start_epoch(epoch, len(plan))
        correct, step_times = run_epoch(run.net, run.optimizer, run.scaler, x_train, y_train, plan, cfg.precision,
                                        clock, book, cfg.clip_grad_norm, run.graphs, worker.read_every(len(plan)),
                                        first_step=first_step)
        book.headroom(vit.read_headroom(run.model))  # vit: the epoch's maxima, one read of the device
        result.fp8_trace.extend(trace.read())
        eval_start = time.perf_counter()
        val_loss, val_accuracy, result.val_correct = evaluate(run.net, x_val, y_val, cfg.precision)
        book.end_epoch(step_times, clock.elapsed, time.perf_counter() - eval_start, correct,
                       val_loss, val_accuracy)
        if result.diverged_at_step is not None or result.budget_done:  # diverged, or a budgeted cell's steps ran
            break
    result.info["first_step_peak_memory_bytes"] = first_step.peak_bytes


def close_records(cfg: RunConfig, run: Compiled, result: TrainResult, memory: CpuPeakMemory | None,
                  tensors: tuple, first_batch: tuple) -> None:
    """After training: CUDA-graph fallbacks, the training peak, final weights, underflow at the last step."""
    if run.graphs:  # reduce-overhead can fall back to plain kernels (e.g. mutated inputs): say so, not assume graphs
        from torch._dynamo.utils import counters

        result.info["cudagraph_skips"] = int(counters["inductor"]["cudagraph_skips"])
        if result.info["cudagraph_skips"]:
            result.info["compiled"] += (f"; CUDA graphs skipped {result.info['cudagraph_skips']} time(s), "
                                        "kernels ran without them there (TORCH_LOGS=cudagraphs says why)")
    # peak of training and its validation passes (as Keras' fit), before the closing probe
    result.peak_memory_bytes, result.memory_kind = training_peak(memory, tensors)
    check_final_weights(result, get_weights(run.model))  # non-finite weights behind a finite loss: diverged
    training.last_underflow(cfg, numerics, run.model, first_batch, float(amp.current_scale(run.scaler)), result)
    result.fp8_layers += fp8.layer_rows(run.model, *first_batch, cfg, "last step", len(result.step_loss) - 1)
