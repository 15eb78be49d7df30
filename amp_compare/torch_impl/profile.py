"""--profile for PyTorch: torch.profiler around a short window of training steps after the timed epochs.

The windows (kit/profile.windows: warm-up steps, then PLAIN_STEPS steps timed bare; warm-up steps again, then
WINDOW_STEPS steps under torch.profiler with oneDNN's verbose log on, torch.backends.mkldnn.verbose, for those
steps only) run amp.train_step on the cell's own batches. The chrome trace (`trace.json`, Perfetto opens it)
stays in the cell's profile folder; the rows go to the profile_ops / profile_primitives tables and the run
table's profile_* columns.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from amp_compare.contract.config import RunConfig
from amp_compare.kit import profile as kit
from amp_compare.kit.child import TrainResult
from amp_compare.kit.data import epoch_batches
from amp_compare.torch_impl.amp import train_step
from amp_compare.torch_impl.loop import StepClock


def start_logs(cfg: RunConfig) -> None:
    """The logs the window needs caught from the child's start: none in torch, whose oneDNN log is switched on
    for the profiled steps alone (keras_impl/profile.start_logs catches TensorFlow's from the start)."""
    return None


def profile_window(cfg: RunConfig, trained, data: tuple, result: TrainResult, logs: None) -> None:
    """Profile a few steps of the trained model (a --profile cell of one worker; nothing otherwise). trained:
    train()'s Compiled tuple; data: its device tensors (make_dataset); logs: start_logs' (nothing in torch)."""
    out = kit.profile_dir() if cfg.profile and cfg.replicas == 1 else None
    if out is None:
        return
    run, (x, y) = trained, data[:2]
    plan = torch.from_numpy(epoch_batches(len(x), cfg.batch_size, cfg.seed, 0, cfg.steps_per_epoch)).to(x.device)
    (_, plain_at), (_, profiled_at) = kit.windows(len(plan))

    def steps(chosen) -> list[float]:
        clock = StepClock(x.device, each_step=True)  # each profiled step timed (a wait per step on a GPU)
        clock.mark()
        for idx in chosen:
            train_step(run.net, run.optimizer, run.scaler, x[idx], y[idx], cfg.precision, cfg.clip_grad_norm)
            clock.mark()
        return clock.intervals()

    steps(plan[plain_at[:kit.WARM_STEPS]])
    plain = steps(plan[plain_at[kit.WARM_STEPS:]])
    steps(plan[profiled_at[:kit.WARM_STEPS]])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if x.device.type == "cuda" else [])
    tee = kit.FdTee(1, (kit.ONEDNN_PREFIX,)).start()  # oneDNN prints its log on stdout, the parent's pipe
    try:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON), \
                profile(activities=activities, record_shapes=True) as prof:
            profiled = steps(plan[profiled_at[kit.WARM_STEPS:]])
    finally:
        lines = tee.stop()
    prof.export_chrome_trace(str(out / "trace.json"))
    primitives = kit.parse_onednn(lines)
    ops, cast_share = kit.op_evidence(op_rows(prof, primitives, x.device.type == "cuda"))
    result.profile_ops, result.profile_primitives = ops or [], primitives or []
    result.info.update(kit.window_info(plain, profiled, f"{out.name}/trace.json", f"torch.profiler {torch.__version__}",
                                       cast_share, []))


def op_rows(prof, primitives: list[dict], cuda: bool = False) -> list[dict]:
    """One row per (op, input dtypes) from the profiler's events: self time (device time on a GPU), calls."""
    rows: dict[tuple, dict] = {}
    for event in prof.events():
        if event.is_user_annotation or event.name.startswith("ProfilerStep"):
            continue
        dtypes = ",".join(d for d in (event.input_dtypes or []) if d and d not in ("Scalar", "ScalarList"))
        row = rows.setdefault((event.name, dtypes), {"op": event.name, "dtypes": dtypes, "calls": 0,
                                                     "self_time_s": 0.0})
        row["calls"] += 1
        row["self_time_s"] += float(event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
    for row in rows.values():
        row["library"] = kit.torch_library(row["op"], row["dtypes"], primitives)
    return list(rows.values())
