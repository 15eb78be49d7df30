"""PyTorch training for one amp-compare cell: an explicit loop, torch.amp end to end.

Read this file beside keras_impl/train.py: the functions of contract/twins.py have one signature in
both, the AMP idiom itself is amp.py, and the AMP lines here are marked `# AMP:`. Per-step values stay on the
device during an epoch and are copied to the host once at its end, so the loop has no
per-step host synchronisation on a GPU.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from amp_compare.contract.config import RunConfig
from amp_compare.contract.mapping import framework_settings
from amp_compare.kit.child import (
    CpuPeakMemory,
    DivergenceWatch,
    FirstStepWindow,
    Progress,
    SharedInit,
    TrainResult,
    check_final_weights,
    first_nonfinite_parameter,
)
from amp_compare.kit.data import Dataset, epoch_batches, epoch_images
from amp_compare.torch_impl import numerics, schedule, vit
from amp_compare.torch_impl.amp import FixedScaler, amp_setting, current_scale, describe_amp, make_scaler, train_step
from amp_compare.torch_impl.models import build_model, get_weights, set_weights

EVAL_BATCH = 512


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


def describe_defaults() -> dict[str, object]:
    """This torch's own defaults for each item of amp_compare.contract.mapping.DIFFERENCES, read from fresh objects."""
    adam = torch.optim.Adam([nn.Parameter(torch.zeros(1))])
    bn = nn.BatchNorm2d(1)
    scaler = torch.amp.GradScaler("cpu")
    return {
        "adam_epsilon": adam.defaults["eps"],
        "bn_momentum": bn.momentum,
        "bn_epsilon": bn.eps,
        "stride2_padding": "padding=1: symmetric",
        "weight_decay": f"L2 added to the gradient (default {adam.defaults['weight_decay']})",
        "loss_reduction": nn.CrossEntropyLoss().reduction,
        "init_scale": scaler.get_scale(),
        "growth_interval": scaler.get_growth_interval(),
        "initial_weights": "kaiming_uniform_(a=sqrt(5)) weights, uniform(±1/sqrt(fan_in)) biases",
        **vit.describe_defaults(),  # vit: LayerNorm, GELU, attention, AdamW, schedule, token stream
    }


def settings_used(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                  cfg: RunConfig) -> dict:
    """The values this run actually used, read back from the objects it trained with.

    Recorded in torch's own convention; harness/settings_check.py compares them with the Keras child's.
    cfg's precision gives the autocast dtype the run trains under, which decides the dtype of the final
    Linear (autocast runs linear/addmm in the half dtype).
    """
    group = optimizer.param_groups[0]
    used: dict[str, object] = {"loss_reduction": "mean", "weight_decay": group["weight_decay"]}
    if isinstance(optimizer, torch.optim.Adam):
        used.update(adam_epsilon=group["eps"], adam_beta_1=group["betas"][0], adam_beta_2=group["betas"][1],
                    adam_formula="torch")
    if isinstance(optimizer, torch.optim.SGD):
        used.update(sgd_momentum=group["momentum"], sgd_nesterov=group["nesterov"])
    used["learning_rate"] = group["lr"]
    used["lr_schedule"] = schedule.describe(optimizer)
    if isinstance(optimizer, torch.optim.AdamW):  # decoupled weight decay (contract/mapping.py adamw_weight_decay)
        used["adamw_weight_decay"] = group["weight_decay"]
    used.update(vit.settings_used(model, cfg))  # vit: LayerNorm eps, GELU form, token stream dtype
    bn = next((m for m in model.modules() if isinstance(m, nn.BatchNorm2d)), None)
    if bn is not None:
        used.update(bn_momentum=bn.momentum, bn_epsilon=bn.eps)
    strided = [m for m in model.modules()
               if isinstance(m, nn.Conv2d) and m.stride != (1, 1) and m.kernel_size == (3, 3)]
    if strided:
        pads = {m.padding for m in strided}
        used["stride2_padding"] = "symmetric" if pads == {(1, 1)} else "; ".join(map(str, sorted(pads)))
    used["output_dtype"] = str(amp_setting(cfg.precision) or torch.float32).removeprefix("torch.")
    if isinstance(scaler, FixedScaler):
        used["static_loss_scale"] = scaler.fixed_scale
    elif scaler.is_enabled():
        used.update(init_scale=scaler.get_scale(), growth_interval=scaler.get_growth_interval())
    # TF32 read back from torch (on, off, or mixed), as every Keras backend records it (keras_impl/backends.py)
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    used["tf32"] = "on" if matmul and cudnn else "off" if not (matmul or cudnn) else "mixed"
    return used


def make_model(cfg: RunConfig, data: Dataset) -> nn.Module:
    settings = framework_settings(cfg)  # empty in 'defaults' mode: torch's own BatchNorm defaults
    model = build_model(cfg.model, data.input_shape, data.num_classes, width=cfg.width,
                        bn_momentum=settings.get("bn_momentum"), bn_epsilon=settings.get("bn_epsilon"),
                        vit=vit.arguments(cfg, settings))
    if cfg.fp32_layers:  # AMP: these blocks run with autocast disabled, inputs cast to float32
        numerics.apply_fp32_layers(model, cfg.fp32_layers)
    return model


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


def compile_model(cfg: RunConfig, model: nn.Module, device: torch.device):
    """The model as the training step runs it, for train() and the probe alike: on the device (channels
    last with --channels-last), its optimizer and loss scaler, and the network the step calls
    (torch.compile for --compile or --step tuned; with tuned on a GPU, CUDA graphs: compile's
    reduce-overhead mode). It compiles (and records its CUDA graphs) during the first steps: see
    compile_warmup_s. Returns (model, optimizer, scaler, net, graphs)."""
    model = model.to(device, memory_format=torch.channels_last if cfg.channels_last else torch.preserve_format)
    optimizer = make_step_optimizer(cfg, model.parameters())
    scaler = make_scaler(cfg)
    graphs = cfg.step == "tuned" and device.type == "cuda"  # CUDA graphs hold their own memory pool
    net = (torch.compile(model, mode="reduce-overhead" if graphs else "default")
           if cfg.compile or cfg.step == "tuned" else model)
    return model, optimizer, scaler, net, graphs


def host_sync_per_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> int:
    """Host synchronisations per step the training step itself makes on a GPU (the loop adds none):
    GradScaler.step reads found_inf on the host unless the optimizer takes it on the device."""
    return int(scaler.is_enabled() and not getattr(optimizer, "_step_supports_amp_scaling", False))


@torch.no_grad()
def evaluate(model, x, y, amp_dtype) -> tuple[float, float, np.ndarray]:
    """Validation loss, accuracy and, per image, whether it was classified correctly (the last epoch's go to
    the paired tests of harness/stats.py), under the same precision as training."""
    model.eval()
    loss_sum = torch.zeros((), device=x.device)
    hits = []
    for i in range(0, len(x), EVAL_BATCH):
        xb, yb = x[i:i + EVAL_BATCH], y[i:i + EVAL_BATCH]
        with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(xb)
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").float()
        hits.append(logits.argmax(1) == yb)
    model.train()
    correct = torch.cat(hits).cpu().numpy()  # one read of the device per pass
    return loss_sum.item() / len(x), float(correct.mean()), correct


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


def device_info(device: torch.device) -> dict[str, object]:
    """What torch sees of the accelerator and its libraries."""
    info: dict[str, object] = {"torch_cuda_version": torch.version.cuda or "", "torch_cudnn_version":
                               torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else ""}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        info.update(device_name=torch.cuda.get_device_name(device), compute_capability=f"{major}.{minor}")
    else:
        info["device_name"] = "cpu"
    return info


class StepClock:
    """Per-step wall time: CUDA events on a GPU (read at epoch end, no sync), else perf_counter."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks; resets the clock."""
        if self.cuda:
            torch.cuda.synchronize()
            out = [a.elapsed_time(b) / 1000.0 for a, b in zip(self.marks, self.marks[1:])]
        else:
            out = list(np.diff(self.marks))
        self.marks = []
        return out


@dataclass
class EpochSteps:
    """What one epoch measured, per step, copied to the host once at its end."""

    loss: list[float]
    loss_scale: list[float]
    skipped: list[bool]
    step_time_s: list[float]
    correct: int
    diverged_at_step: int | None


def run_epoch(net, optimizer, scaler, x, y, plan, amp_dtype, clock: StepClock, watch: DivergenceWatch,
              first_step: int = 0, on_step=lambda step: None, clip_grad_norm: float | None = None,
              on_nonfinite=None, check_every: int | None = None, graphs: bool = False, epoch: int = 0) -> EpochSteps:
    """The instrumented training loop of one epoch (benchmarks/overhead.py measures what it costs).

    on_nonfinite(step, epoch, batch) (contract/twins.OnNonfinite) is called once for the first step whose
    loss was non-finite or whose update the scaler skipped (non-finite gradients); it returns True once it
    has handled one.
    Losses are read on the host every check_every steps (default: 25 on a GPU, where a read waits
    for the device; every step on a CPU, where it costs nothing); nothing else is read per step
    (tests/test_perf.py counts the reads). graphs: CUDA graphs (--step tuned on a GPU) start a step.
    """
    check_every = check_every or (25 if x.device.type == "cuda" else 1)
    losses, corrects, scales_used, skipped, checked, diverged = [], [], [], [], 0, None
    clock.mark()
    for step, idx in enumerate(plan):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        scales_used.append(current_scale(scaler))
        loss, correct, step_skipped = train_step(net, optimizer, scaler, x[idx], y[idx], amp_dtype, clip_grad_norm)
        skipped.append(step_skipped)
        losses.append(loss)
        corrects.append(correct)
        clock.mark()
        on_step(step)
        if len(losses) - checked >= check_every or step + 1 == len(plan):
            fresh = torch.stack(losses[checked:]).float().cpu().tolist()
            fresh_skipped = torch.stack(skipped[checked:]).cpu().tolist()
            if on_nonfinite is not None:
                for k, value in enumerate(fresh, start=checked):
                    if not np.isfinite(value) or fresh_skipped[k - checked]:
                        on_nonfinite = None if on_nonfinite(first_step + k, epoch, k) else on_nonfinite
                        break
            checked = len(losses)
            diverged = watch.update(fresh, first_step + step)
            if diverged is not None:
                break
    step_times = clock.intervals()  # synchronises once per epoch
    return EpochSteps(
        loss=torch.stack(losses).float().cpu().tolist(),
        loss_scale=torch.stack(scales_used).cpu().tolist(),
        skipped=torch.stack(skipped).cpu().tolist(),
        step_time_s=step_times,
        correct=int(torch.stack(corrects).sum().item()),
        diverged_at_step=diverged,
    )


def train(cfg: RunConfig, data: Dataset, progress: Progress, shared_init: SharedInit) -> TrainResult:
    setup(cfg)
    device = torch.device(cfg.device)
    amp_dtype = amp_setting(cfg.precision)
    model = make_model(cfg, data)
    init_source = shared_init.apply(model, get_weights, set_weights)
    model, optimizer, scaler, net, graphs = compile_model(cfg, model, device)
    compiled = net is not model
    peak = measure_peak(device, cfg)  # before the dataset and the memory window
    x_train, y_train, x_val, y_val = make_dataset(cfg, data)
    dataset_bytes = sum(t.nbytes for t in (x_train, y_train, x_val, y_val))

    result = TrainResult(info={
        "framework_version": torch.__version__,
        **device_info(device),
        "tf32": f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
                f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}",
        "compiled": (f"torch.compile(mode={'reduce-overhead' if graphs else 'default'})" if compiled else "eager"),
        "step_loop": cfg.step,
        "optimizer_impl": "fused" if optimizer.defaults.get("fused") else
                          ("foreach" if device.type == "cuda" else "for-loop") + " (torch default)",
        "host_syncs_per_step": host_sync_per_step(optimizer, scaler),
        **peak,
        "dataset_device_bytes": int(dataset_bytes) if device.type == "cuda" else 0,
        "amp_api": describe_amp(cfg),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "init_source": init_source,
        "framework_defaults": describe_defaults(),
        "settings_used": settings_used(model, optimizer, scaler, cfg),
    })
    # Numerics lab, outside the timed loop: dtype audit and gradient underflow on the first batch.
    first = torch.from_numpy(epoch_batches(len(x_train), cfg.batch_size, cfg.seed, 0, cfg.steps_per_epoch)[0])
    probe = (x_train[first.to(device)], y_train[first.to(device)])
    result.extra["dtypes"] = numerics.dtype_audit(model, *probe, cfg.precision)
    result.extra["underflow"] = underflow_rows(numerics, model, probe, cfg, scaler, "first step", 0)
    if cfg.comparison == "defaults" and cfg.optimizer == "adam":  # the two Adams, measured on this batch
        result.info.update(numerics.adam_formula_gap(model, *probe, cfg.precision, optimizer))

    def on_nonfinite(step: int, epoch: int, batch: int) -> bool:
        """NaN/Inf locator: where the first non-finite loss or gradient came from."""
        idx = plan[batch]  # the epoch's plan, on the device: the loop below runs `epoch`
        bad = first_nonfinite_parameter(get_weights(model))
        found = ({"where": "parameters", "layer": bad, "value": "nan/inf", "tensor": bad} if bad else
                 numerics.locate_nonfinite(model, x_train[idx], y_train[idx], cfg.precision,
                                           float(current_scale(scaler))))
        result.nonfinite = {"step": step, **(found or {"where": "not reproduced", "layer": "", "value": ""})}
        return True

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        cpu_memory = CpuPeakMemory()
    first_step = FirstStepWindow(cpu_memory if device.type == "cpu" else None)
    model.train()
    clock = StepClock(device)
    watch = DivergenceWatch(cfg.diverge_after)
    for epoch in range(cfg.epochs):
        plan = torch.from_numpy(epoch_batches(len(x_train), cfg.batch_size, cfg.seed, epoch,
                                              cfg.steps_per_epoch)).to(device)
        if cfg.augment:  # the same augmented pixels as the Keras side (kit/data.py)
            x_train = None  # freed before its replacement lands: one copy of the images in the peak
            x_train = to_device_images(epoch_images(data, cfg.seed, epoch, augment=True), device, cfg.channels_last)
        steps = run_epoch(net, optimizer, scaler, x_train, y_train, plan, amp_dtype, clock, watch,
                          first_step=len(result.step_loss),
                          on_step=lambda step, n=len(plan), e=epoch: (progress.step(e, cfg.epochs, step, n),
                                                                      first_step.after(e, step)),
                          clip_grad_norm=cfg.clip_grad_norm,
                          on_nonfinite=on_nonfinite if result.nonfinite is None else None, graphs=graphs,
                          epoch=epoch)
        if headroom := vit.read_headroom(model):  # vit: the epoch's maxima, one read of the device
            result.extra.setdefault("headroom", []).extend({**row, "epoch": epoch} for row in headroom)
        eval_start = time.perf_counter()
        val_loss, val_accuracy, result.val_correct = evaluate(net, x_val, y_val, amp_dtype)
        eval_time = time.perf_counter() - eval_start
        result.step_epoch += [epoch] * len(steps.loss)
        result.step_loss += steps.loss
        result.step_loss_scale += steps.loss_scale
        result.step_skipped += steps.skipped
        result.step_time_s += steps.step_time_s
        result.diverged_at_step = steps.diverged_at_step
        result.epochs.append({
            "epoch": epoch,
            "train_loss": float(np.mean(steps.loss)),
            "train_accuracy": steps.correct / (len(steps.loss) * cfg.batch_size),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "train_time_s": float(sum(steps.step_time_s)),
            "eval_time_s": eval_time,
        })
        if result.diverged_at_step is not None:
            break
    if graphs:  # reduce-overhead can fall back to plain kernels (e.g. mutated inputs): say so, not assume graphs
        from torch._dynamo.utils import counters

        result.info["cudagraph_skips"] = int(counters["inductor"]["cudagraph_skips"])
        if result.info["cudagraph_skips"]:
            result.info["compiled"] += (f"; CUDA graphs skipped {result.info['cudagraph_skips']} time(s), "
                                        "kernels ran without them there (TORCH_LOGS=cudagraphs says why)")
    if device.type == "cuda":  # peak of training and its validation passes (as Keras' fit), before the closing probe
        # the dataset held on the device is reported apart (dataset_device_bytes), not as training memory
        result.peak_memory_bytes = max(0, torch.cuda.max_memory_allocated(device) - dataset_bytes)
        result.memory_kind = "cuda_allocator_peak_minus_dataset"
    else:
        result.peak_memory_bytes = cpu_memory.peak_bytes()
        result.memory_kind = cpu_memory.kind + "_after_first_step"
    result.info["first_step_peak_memory_bytes"] = first_step.peak_bytes
    check_final_weights(result, get_weights(model))  # non-finite weights behind a finite loss: diverged
    result.extra["underflow"] += underflow_rows(numerics, model, probe, cfg, scaler, "last step",
                                                len(result.step_loss) - 1)
    return result


def measure_peak(device: torch.device, cfg: RunConfig) -> dict:
    """The device's matmul peak for this cell's dtype (kit/peak.py), measured before training."""
    from amp_compare.kit import peak

    def matmul_timer(name: str):
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}[name]

        def time_matmul(n: int, repeats: int) -> float:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            torch.mm(a, b)  # first call: kernel selection, not timed
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        return time_matmul

    return peak.measure_cell_peak(cfg.precision, cfg.tf32, device.type, device_info(device)["device_name"],
                                  matmul_timer)


def underflow_rows(numerics, model, probe, cfg: RunConfig, scaler, when: str, step: int) -> list[dict]:
    """Per-layer gradient magnitudes of one batch against float16's range, at the scale in use then."""
    scale = float(current_scale(scaler))
    rows = numerics.gradient_underflow(model, *probe, cfg.precision, loss_scale=scale)
    return [{**row, "when": when, "at_step": step, "log2_hist": json.dumps(row.get("log2_hist"))} for row in rows]
