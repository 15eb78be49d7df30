"""--profile for Keras: the backend's own profiler around a short window of fit() steps after the timed epochs.

TensorFlow: tf.profiler.experimental.start/stop writes `plugins/profile/<run>/<host>.xplane.pb` (TensorBoard's
profile plugin opens it); JAX: jax.profiler's trace writes the same xplane.pb and a `.trace.json.gz` that Perfetto
opens. XProf (the `profile` extra) reads the xplane's per-op statistics (its framework_op_stats tool); without it
the cell keeps its trace and the library path from oneDNN's log, and says the op table needs XProf.
On TensorFlow oneDNN's creation log and TensorFlow's Eigen-fallback line are caught for the whole child
(start_logs; the log cannot be switched on for the window alone there), which adds nothing per step: a line
is written when a primitive is made. Keras on torch is not profiled (no op table; the cell says so).
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import keras
import numpy as np

from amp_compare.contract.config import RunConfig
from amp_compare.keras_impl import backends
from amp_compare.kit import profile as kit
from amp_compare.kit.child import TrainResult
from amp_compare.kit.data import Dataset, epoch_batches

if backends.TENSORFLOW:
    import tensorflow as tf


class Logs:
    """oneDNN's log (fd 1) and TensorFlow's fallback line (fd 2), caught from the start of a profiled TF child."""

    def __init__(self, cfg: RunConfig):
        self.on = cfg.profile and backends.TENSORFLOW and kit.profile_dir() is not None
        self.out = kit.FdTee(1, (kit.ONEDNN_PREFIX,)).start() if self.on else None
        self.err = kit.FdTee(2, (), (kit.EIGEN_FALLBACK,)).start() if self.on else None

    def stop(self) -> tuple[list[str], list[str]]:
        return (self.out.stop(), self.err.stop()) if self.on else ([], [])


def start_logs(cfg: RunConfig) -> Logs:
    return Logs(cfg)


class Window(keras.callbacks.Callback):
    """Marks each step's end; starts the profiler after `warm` steps, stops it after the last."""

    def __init__(self, warm: int, start=None, stop=None):
        super().__init__()
        self.warm, self.start, self.stop, self.marks = warm, start, stop, []

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.warm and self.start:
            self.start()
        if self.stop and batch + 1 == self.params["steps"]:
            self.stop()
        self.marks.append(time.perf_counter())

    def step_times(self) -> list[float]:
        return np.diff(self.marks[self.warm - 1:]).tolist()


def run_steps(model: keras.Model, data: Dataset, batches: np.ndarray, window: Window) -> list[float]:
    """fit() over the given batches of the cell's plan, as the timed epochs ran them (TensorFlow: indices the
    model gathers on the device; other backends: numpy batches)."""
    source = (tf.data.Dataset.from_tensor_slices(batches) if backends.TENSORFLOW
              else ((data.x_train[i], data.y_train[i]) for i in batches))
    model.fit(source, epochs=1, steps_per_epoch=len(batches), verbose=0, shuffle=False, callbacks=[window])
    return window.step_times()


def profile_window(cfg: RunConfig, trained: keras.Model, data: Dataset, result: TrainResult, logs: Logs) -> None:
    """Profile a few steps of the trained model (a --profile cell of one worker on TF or JAX; nothing otherwise).
    trained: the compiled model; data: the cell's Dataset; logs: what start_logs caught since the child began."""
    model = trained
    out = kit.profile_dir() if cfg.profile and cfg.replicas == 1 else None
    if out is None or not (backends.TENSORFLOW or backends.JAX):
        lines = logs.stop()
        if out is not None:
            result.info.update(kit.window_info([], [], "", f"none: Keras on {backends.BACKEND} is not profiled",
                                               float("nan"), lines[1]))
        return
    plan = epoch_batches(len(data.x_train), cfg.batch_size, cfg.seed, 0, cfg.steps_per_epoch)
    (_, plain_at), (_, profiled_at) = kit.windows(len(plan))  # each: its warm-up steps, then its measured ones
    plain = run_steps(model, data, plan[plain_at], Window(kit.WARM_STEPS))
    start, stop = profiler(out)
    profiled = run_steps(model, data, plan[profiled_at], Window(kit.WARM_STEPS, start, stop))
    onednn, fallback = logs.stop()
    primitives = kit.parse_onednn(onednn)
    trace = next(iter(sorted(out.rglob("*.xplane.pb"))), None)
    ops, tool = op_stats(trace, bool(fallback))
    ops, cast_share = kit.op_evidence(ops)
    result.profile_ops, result.profile_primitives = ops or [], primitives or []
    shown = next(iter(sorted(out.rglob("*.trace.json.gz"))), trace)  # JAX: Perfetto's file; TF: the xplane
    result.info.update(kit.window_info(plain, profiled, str(shown.relative_to(out.parent)) if shown else "", tool,
                                       cast_share, fallback))


def profiler(out: Path):
    """(start, stop) of the backend's own profiler, writing into `out`."""
    if backends.TENSORFLOW:
        return (lambda: tf.profiler.experimental.start(str(out))), tf.profiler.experimental.stop
    import jax

    return (lambda: jax.profiler.start_trace(str(out), create_perfetto_trace=True)), jax.profiler.stop_trace


def op_stats(xplane: Path | None, eigen_fallback: bool) -> tuple[list[dict], str]:
    """Per-op self time: TensorFlow's from the xplane through XProf's framework_op_stats tool; JAX's from the
    trace's XLA CPU threads (XProf's op statistics hold no CPU ops of XLA). The tool's name in words."""
    name = f"{backends.BACKEND} profiler"
    if backends.JAX:
        trace = next(iter(sorted(xplane.parent.glob("*.trace.json.gz"))), None) if xplane else None
        return (xla_ops(trace) if trace else []), f"{name}, XLA CPU thread events of its trace"
    try:
        from xprof.convert import _pywrap_profiler_plugin as xprof
    except ImportError:
        return [], f"{name} (trace only: op statistics need XProf, pip install '.[profile]')"
    if xplane is None:
        return [], f"{name} (no xplane.pb written)"
    data, ok = xprof.xspace_to_tools_data([str(xplane)], "framework_op_stats", {})
    table = json.loads(data)[0] if ok and data else {"cols": [], "rows": []}
    cols = [c["id"] for c in table["cols"]]
    rows = []
    for raw in table["rows"]:
        r = dict(zip(cols, (c.get("v") for c in raw["c"])))
        if r.get("type") in ("IDLE", None):
            continue
        rows.append({"op": r["type"], "calls": int(r.get("occurrences") or 0), "dtypes": "",
                     "self_time_s": float(r["total_self_time"]) / 1e6,
                     "library": kit.tf_library(r["type"], eigen_fallback)})
    return rows, f"{name} + XProf framework_op_stats"


def xla_ops(trace: Path) -> list[dict]:
    """XLA's CPU ops (thunks) from a JAX trace: the complete events of its XLAEigen threads, by name."""
    events = json.loads(gzip.decompress(trace.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    threads = {(e.get("pid"), e.get("tid")) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
               and str(e.get("args", {}).get("name", "")).startswith("tf_XLAEigen")}
    rows: dict[str, dict] = {}
    for e in events:
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in threads and not e["name"].startswith("Thunk"):
            row = rows.setdefault(e["name"], {"op": e["name"], "calls": 0, "self_time_s": 0.0, "dtypes": "",
                                              "library": kit.xla_library(e["name"])})
            row["calls"] += 1
            row["self_time_s"] += float(e.get("dur", 0.0)) / 1e6
    return list(rows.values())
