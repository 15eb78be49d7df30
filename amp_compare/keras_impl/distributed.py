"""Data parallel for one Keras cell, inside its one child process: each backend's own engine or "unavailable".

* TensorFlow: `tf.distribute.MirroredStrategy` over N devices (on a CPU, N logical CPU devices made with
  `tf.config.set_logical_device_configuration` before TensorFlow starts: `prepare`). The model, its optimizer and
  fit() live in the strategy's scope (`scope`); fit() splits each global batch of indices into N contiguous slices
  (tf.distribute's rebatching), Keras divides each replica's loss by N and the optimizer all-reduces (sums) the
  gradients. The dtype the all-reduce got is read back from the tensors handed to the optimizer's all-reduce
  (`record_allreduce`): float32, the gradients of float32 variables. tf.distribute has no reduced-precision
  all-reduce (CommunicationOptions takes no dtype): fp16/bf16 are unavailable.
* JAX: `keras.distribution.DataParallel` over N devices (on a CPU, N host devices: XLA_FLAGS set by the parent,
  harness/run/launch.py). One SPMD program; XLA's partitioner places the gradient all-reduce where the backward computes
  the gradient, in whatever dtype the compiled step computes it (read back from its optimised HLO, `hlo_allreduce`:
  float16 under mixed_float16 on this CPU, float32 under mixed_bfloat16, whose dots XLA's CPU backend runs in
  float32). Keras offers no option to choose it: a cell asking for another dtype stops after its first step and is
  recorded unavailable with the dtype read back (`jax_allreduce_mismatch`).
* torch: Keras 3.15 has no data-parallel engine on its torch backend (keras.distribution has no backend library
  there): unavailable.

Per step every worker's loss scale and skipped flag is recorded (`replica_step`, called inside the step by
loop.AmpModel: `replica_values` in TensorFlow's replica context, `device_values` on JAX, each device's own copy of
the replicated values), with, on TensorFlow, each worker's own loss and whether its own gradients (before the
all-reduce) were finite. `WorkerRecorder` puts them in the `workers` table. N-worker cells record in host mode
(train.device_mode): the per-worker values come with fit()'s logs of each step.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from amp_compare.contract.config import ALLREDUCE_DTYPES, ALLREDUCE_REFERENCE, RunConfig
from amp_compare.keras_impl import backends
from amp_compare.kit.child import Unavailable

ENV_DUMP = "AMP_COMPARE_HLO_DUMP"  # harness/run/launch.py: where XLA dumps a keras-jax N-worker cell's compiled step
HLO_TYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}



@dataclass
class Engine:
    """This process's data-parallel state, an object as torch's Worker is (a Keras cell is one process: the
    module's functions, called from inside fit()'s step and the optimizer, share this one instance)."""

    strategy: Any = None  # TensorFlow's MirroredStrategy of an N-worker cell
    allreduce_dtypes: set[str] = field(default_factory=set)  # gradient dtypes handed to the all-reduce (traced)
    local_finite: dict[int, Any] = field(default_factory=dict)  # per replica context: its own gradients finite
    recorder: Any = None  # the WorkerRecorder of an N-worker cell


_engine = Engine()


def unavailable_reason(cfg: RunConfig) -> str | None:
    """Why this N-worker cell cannot run with this backend's own engine (None: it can). Read from the installed
    Keras/TensorFlow, not typed by hand, where they can say it."""
    if backends.TORCH:
        from keras.src import backend as keras_backend

        return (f"Keras {keras.__version__} has no data-parallel engine on its torch backend (keras.distribution's "
                f"backend library there is {keras_backend.distribution_lib!r}; MirroredStrategy is TensorFlow's); "
                "Keras' own guide wraps the model in torch DDP inside a hand-written torch loop, outside model.fit")
    if backends.TENSORFLOW and cfg.allreduce != ALLREDUCE_REFERENCE:
        import tensorflow as tf

        params = ", ".join(list(inspect.signature(tf.distribute.experimental.CommunicationOptions.__init__)
                                .parameters)[1:])  # after self
        return (f"tf.distribute has no reduced-precision all-reduce: CommunicationOptions({params}) takes no dtype, "
                "and Keras' optimizer all-reduces the gradients as the tape gives them, float32 for float32 "
                f"variables (an --allreduce fp32 cell reads it back); --allreduce {cfg.allreduce} would need a "
                "home-made cast")
    return None  # JAX: XLA decides, known once the step is compiled (`jax_allreduce_mismatch`)


def jax_allreduce_mismatch(cfg: RunConfig, readback: dict) -> str | None:
    """JAX: why the cell is unavailable when XLA's compiled step all-reduces in another dtype than --allreduce asks
    (None: it is the one asked for). DataParallel offers no option to change it."""
    dtype = readback.get("allreduce_dtype", "")
    if dtype == ALLREDUCE_DTYPES[cfg.allreduce]:
        return None
    params = ", ".join(inspect.signature(keras.distribution.DataParallel).parameters)
    return (f"keras.distribution.DataParallel({params}) has no all-reduce dtype option, and XLA's compiled step "
            f"all-reduces the {cfg.precision} gradients in {dtype or 'an unknown dtype'} (read back from its HLO, "
            f"{readback.get('allreduce_readback', '')}), not {ALLREDUCE_DTYPES[cfg.allreduce]}")


def prepare(cfg: RunConfig) -> None:
    """Before the backend starts (setup's first line): an N-worker cell this backend cannot run stops here as
    unavailable; TensorFlow on a CPU gets its N logical devices."""
    if cfg.replicas == 1:
        return
    reason = unavailable_reason(cfg)
    if reason:
        raise Unavailable(reason)
    if backends.TENSORFLOW and cfg.device == "cpu":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cfg.replicas)


def devices(cfg: RunConfig) -> list:
    """The N devices of the cell, as the backend names them; fewer than N is an error, not a smaller run."""
    if backends.TENSORFLOW:
        import tensorflow as tf

        found = [d.name for d in tf.config.list_logical_devices("GPU" if cfg.device == "cuda" else "CPU")]
    else:
        found = keras.distribution.list_devices("gpu" if cfg.device == "cuda" else "cpu")
    if len(found) < cfg.replicas:
        raise RuntimeError(f"--replicas {cfg.replicas} needs {cfg.replicas} {cfg.device} devices; Keras' "
                           f"{backends.BACKEND} backend sees {len(found)}: {found}")
    return found[:cfg.replicas]


def scope(cfg: RunConfig):
    """Where the model, optimizer and fit() live: the strategy's scope on TensorFlow; on JAX the distribution is
    global (set here, before the model is built); a 1-worker cell: the backend's device scope as before."""
    if cfg.replicas == 1:
        return backends.device_scope(cfg)
    if backends.TENSORFLOW:
        import tensorflow as tf

        _engine.strategy = tf.distribute.MirroredStrategy(devices(cfg))
        return _engine.strategy.scope()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices(cfg)))
    return contextlib.nullcontext()


def compiled(cfg: RunConfig, model, data) -> None:
    """After model.compile, TensorFlow N-worker cells only: the compiled loss and metrics built on an image batch's
    shapes (under a strategy fit() builds them from its first batch, and ours are indices that the step gathers
    images with), and the optimizer's all-reduce observed (`record_allreduce`)."""
    if not backends.TENSORFLOW or _engine.strategy is None:
        return
    model._symbolic_build(data_batch=(data.x_train[:cfg.batch_size], data.y_train[:cfg.batch_size]))
    record_allreduce(model.optimizer)


def record_allreduce(optimizer) -> None:
    """TensorFlow: wrap the (inner) optimizer's gradient all-reduce to note the dtypes it is handed (at trace time,
    the tensors' static dtypes) and, for `replica_values`, whether this replica's own gradients were finite."""
    import tensorflow as tf

    inner = getattr(optimizer, "inner_optimizer", optimizer)
    all_reduce = inner._all_reduce_sum_gradients

    def recording_all_reduce(grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        _engine.allreduce_dtypes |= {g.dtype.name for g, _ in grads_and_vars if g is not None}
        return all_reduce(grads_and_vars)

    inner._all_reduce_sum_gradients = recording_all_reduce
    apply = optimizer.apply

    def apply_noting_local_finite(grads, trainable_variables=None):
        # before the all-reduce: what this replica computed on its own slice of the batch. Per replica context:
        # MirroredStrategy traces the replicas in threads that interleave at the optimizer's merge_call.
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None])
        _engine.local_finite[id(tf.distribute.get_replica_context())] = finite
        return apply(grads, trainable_variables)

    optimizer.apply = apply_noting_local_finite


def replica_step(record, correct) -> tuple[tuple, dict]:
    """A step's (loss, scale, skipped, correct) for fit()'s logs, and every worker's own values beside them
    (loop.AmpModel.step_values calls this inside the step; a 1-worker cell: as they are, none beside)."""
    values = (record.loss, record.scale, record.skipped, correct)
    if backends.TENSORFLOW and _engine.strategy is not None:
        return replica_values(record, correct)
    if backends.JAX and keras.distribution.distribution() is not None:
        return values, device_values(record.scale, record.skipped)
    return values, {}


def replica_values(record, correct) -> tuple[tuple, dict]:
    """TensorFlow, in a replica context. fit() averages each log over the replicas: the row is made so that its
    mean is the global batch's (the replica's own loss, which Keras' compute_loss divided by N for the gradient
    sum, unscaled by Keras' own unscale_loss_for_distribution; the correct count times N); every replica's loss,
    scale, skipped flag and own-gradient finiteness gathered (the same vectors on all replicas)."""
    import tensorflow as tf
    from keras.src.losses.loss import unscale_loss_for_distribution

    ctx = tf.distribute.get_replica_context()
    loss = unscale_loss_for_distribution(record.loss)

    def gather(value):
        return ctx.all_gather(tf.reshape(tf.cast(value, tf.float32), [1]), axis=0)

    local_nonfinite = tf.logical_not(_engine.local_finite.get(id(ctx), tf.constant(True)))
    return ((loss, record.scale, record.skipped, correct * ctx.num_replicas_in_sync),
            {"worker_loss": gather(loss), "worker_scale": gather(record.scale),
             "worker_skipped": gather(record.skipped), "worker_local_nonfinite": gather(local_nonfinite)})


def device_values(scale, skipped) -> dict:
    """JAX, inside the jitted step: the replicated scale and skipped flag as a vector sharded over the devices, so
    element k is computed on device k from its own copy."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return {}
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = distribution.device_mesh.backend_mesh
    sharding = NamedSharding(mesh, PartitionSpec(distribution.batch_dim_name))

    def per_device(value):
        return jax.lax.with_sharding_constraint(jnp.broadcast_to(jnp.asarray(value, jnp.float32), (mesh.size,)),
                                                sharding)

    return {"worker_scale": per_device(scale), "worker_skipped": per_device(skipped)}


class WorkerRecorder(keras.callbacks.Callback):
    """Every worker's values per step, from the logs (`replica_values` / `device_values`), for the `workers` table."""

    async_safe = True  # JAX/torch device mode hands logs on a worker thread; nothing here waits

    def __init__(self, cfg: RunConfig, steps_per_epoch: int):
        super().__init__()
        self.cfg, self.steps_per_epoch, self.epoch, self.rows = cfg, steps_per_epoch, 0, []
        self.readback: dict | None = None
        self.unavailable: str | None = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        if "worker_scale" not in logs:
            return
        scale, skipped = np.asarray(logs["worker_scale"], float), np.asarray(logs["worker_skipped"], float)
        loss = np.asarray(logs.get("worker_loss", np.full(len(scale), np.nan)), float)
        local = np.asarray(logs.get("worker_local_nonfinite", np.full(len(scale), np.nan)), float)
        step = self.epoch * self.steps_per_epoch + batch
        if step == 0 and os.environ.get(ENV_DUMP):  # JAX: the step is compiled now; stop if XLA chose another dtype
            self.readback = hlo_allreduce(Path(os.environ[ENV_DUMP]))
            self.unavailable = jax_allreduce_mismatch(self.cfg, self.readback)
            if self.unavailable:
                self.model.stop_training = True
        for worker in range(len(scale)):
            self.rows.append({"worker": worker, "step": step, "loss": float(loss[worker]),
                              "loss_scale": float(scale[worker]), "skipped": bool(skipped[worker] > 0),
                              "local_nonfinite": float(local[worker])})


def callbacks(cfg: RunConfig, steps_per_epoch: int) -> list:
    """fit()'s extra callbacks for an N-worker cell (none for one worker)."""
    if cfg.replicas == 1:
        return []
    _engine.recorder = WorkerRecorder(cfg, steps_per_epoch)
    return [_engine.recorder]


def hlo_allreduce(dump: Path) -> dict:
    """The gradient all-reduces of the compiled training step, read from XLA's dump of its optimised HLO: their
    element types and element count (JAX names the backward's ops transpose(jvp(...)); the loss and metric sums
    are the other all-reduces)."""
    files = sorted(dump.glob("*train_step*after_optimizations.txt"))
    if not files:
        return {"allreduce_dtype": "not recorded", "allreduce_readback": f"no HLO dump of the train step in {dump}"}
    dtypes, elements, calls = set(), 0, 0
    for line in files[-1].read_text().splitlines():
        match = re.search(r"= (\(.*?\)|\S+) all-reduce(?:-start)?\(", line)
        if not match or "transpose(" not in line:
            continue
        calls += 1
        for kind, dims in re.findall(r"(\w+)\[([\d,]*)\]", match.group(1)):
            dtypes.add(HLO_TYPES.get(kind, kind))
            elements += int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
    return {"allreduce_dtype": ",".join(sorted(dtypes)) or "none found", "allreduce_calls": calls,
            "allreduce_elements": elements, "allreduce_readback": f"XLA HLO after optimizations: {files[-1].name}"}


def finish(cfg: RunConfig, result) -> None:
    """An N-worker cell's records: the engine, the all-reduce dtype read back, every worker's values."""
    if cfg.replicas == 1:
        return
    recorder = _engine.recorder
    info: dict = {"world_size": cfg.replicas, "allreduce_requested": cfg.allreduce,
                  "allreduce_time_s": float("nan"),
                  "allreduce_time_source": "not exposed by the framework", "threads_per_worker": 0}
    if backends.TENSORFLOW:
        strategy = _engine.strategy
        info.update(data_parallel=f"tf.distribute.MirroredStrategy ({strategy.num_replicas_in_sync} replicas, "
                                  f"{type(strategy.extended._cross_device_ops).__name__})",
                    allreduce_hook="Keras optimizer's replica all-reduce (SUM)",
                    allreduce_dtype=",".join(sorted(_engine.allreduce_dtypes)) or "not recorded",
                    allreduce_readback="dtypes of the gradients handed to the optimizer's all-reduce")
    else:
        info.update(data_parallel=f"keras.distribution.DataParallel ({cfg.replicas} devices)",
                    allreduce_hook="XLA SPMD partitioner's all-reduce")
        if os.environ.get(ENV_DUMP):
            shutil.rmtree(os.environ[ENV_DUMP], ignore_errors=True)
        if recorder and recorder.unavailable:
            raise Unavailable(recorder.unavailable)
        info.update(recorder.readback if recorder and recorder.readback else
                    {"allreduce_dtype": "not recorded", "allreduce_readback": "no HLO dump read"})
    result.info.update(info)
    result.workers = recorder.rows if recorder else []

