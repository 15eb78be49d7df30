"""Keras' instrumented training loop: fit() over AmpModel.train_step, with one recording callback per run.

Read beside torch_impl/loop.py (an explicit loop). `train_step` is the Keras way to customise fit();
AmpModel's is amp.py's scaled step, returning what the callback records per step (the batch's own
loss, the loss scale it used, whether the update was skipped, its correct predictions), because Keras
logs only a running mean of the loss. The callback hands them to the run's StepBook (kit/training.py)
as torch's loop does:
  * host mode (CPU): fit() hands each step's values to StepRecorder as host values (TensorFlow converts
    them after every step anyway); it adds a clock mark and appends them, nothing more per step.
  * device mode (GPU): on TensorFlow train_step writes them into a device-side StepLog read once per
    epoch (DeviceStepRecorder); on JAX and torch an `async_safe` callback gets them on Keras' worker
    thread (AsyncStepRecorder). Per-step times are then missing (the epoch's time is measured).
Also here, the input side of fit(): DeviceImages (TensorFlow gathers each batch inside the step) and
HostImages / host_batches (the other backends' numpy batches).
"""

from __future__ import annotations

import threading
import time

import keras
import numpy as np

from amp_compare.keras_impl import backends, distributed, vit

if backends.TENSORFLOW:  # TensorFlow-only code below (DeviceImages, StepLog) runs on that backend only
    import tensorflow as tf

from amp_compare.keras_impl.amp import stateless_train_step as stateless_scaled_step  # noqa: E402
from amp_compare.keras_impl.amp import train_step as scaled_step  # noqa: E402
from amp_compare.kit.child import FirstStepWindow  # noqa: E402
from amp_compare.kit.data import Dataset, epoch_images  # noqa: E402
from amp_compare.kit.training import StepBook, StepRecord, untimed_steps  # noqa: E402

# What train_step hands the callback per step: one float32 row (fit() converts one value per step, not four).
STEP_VALUES = ("batch_loss", "loss_scale", "skipped", "correct")


def step_row(logs: dict) -> dict[str, float]:
    """A step's values from fit()'s logs, by STEP_VALUES name."""
    return dict(zip(STEP_VALUES, (float(v) for v in logs["step"])))


class DeviceImages:
    """The training set as device-resident variables; fit() then feeds only batch indices.

    This mirrors torch_impl, which gathers x_train[idx] from device tensors each step: measured
    here, a tf.data map that gathers batches cost 8-27% per step on a 2-core CPU against a batch
    already in memory, gathering inside the step about 0% (benchmarks/overhead.py). A plain
    holder object, so Keras does not track the images as model weights.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images = tf.Variable(images, trainable=False, name="train_images")
        self.labels = tf.constant(labels)

    def set_epoch(self, epoch: int, images: np.ndarray) -> None:
        """This epoch's (augmented) pixels, before the epoch's clock starts. Assigned in eighths: a whole-array
        assign builds a second full copy on the device beside the old one, inside the memory window (torch
        frees its old copy first, torch_impl/train.py)."""
        step = max(1, -(-len(images) // 8))
        for start in range(0, len(images), step):
            self.images[start:start + step].assign(images[start:start + step])


class HostImages:
    """The other backends' training set: numpy arrays that `host_batches` slices each step's batch from.

    With augmentation each epoch has its own pixels (kit/data.py), made by the recorder before the
    epoch's clock starts; the batch generator, which fit() may run ahead of the training loop, waits
    for them, so no epoch's augmentation falls inside another epoch's timed steps.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, augmented_first: np.ndarray | None = None):
        self.base, self.labels = images, labels
        self.augmented = augmented_first is not None
        self._by_epoch = {0: augmented_first} if self.augmented else {}
        self._ready = threading.Condition()

    def set_epoch(self, epoch: int, images: np.ndarray) -> None:
        with self._ready:
            if epoch not in self._by_epoch:
                self._by_epoch = {e: v for e, v in self._by_epoch.items() if e >= epoch - 1} | {epoch: images}
                self._ready.notify_all()

    def images(self, epoch: int) -> np.ndarray:
        if not self.augmented:
            return self.base
        with self._ready:
            if not self._ready.wait_for(lambda: epoch in self._by_epoch, timeout=3600):
                raise RuntimeError(f"the augmented images of epoch {epoch} never came")
            return self._by_epoch[epoch]


def host_batches(images: HostImages, plan: np.ndarray):
    """(x, y) numpy batches in exactly the order of amp_compare.kit.data.batch_plan, epoch after epoch.
    plan: (epochs, steps, batch) indices, or one epoch's (steps, batch)."""
    plan = plan.reshape(-1, *plan.shape[-2:])
    for epoch in range(plan.shape[0]):
        pixels = images.images(epoch)
        for idx in plan[epoch]:
            yield pixels[idx], images.labels[idx]


class StepLog:
    """Per-step values kept on the device (TensorFlow, device mode): written inside train_step, read once per
    epoch. Reading a step's values on the host every step would synchronise a GPU every step and hide the
    speed-up being measured. (TensorFlow's fit() still waits once per execution of the train function: see
    backends.host_syncs_per_step; the tuned loop runs an epoch per execution.)
    """

    def __init__(self, steps: int):
        # float32 throughout (skipped as 0/1, correct up to 2**24): TensorFlow registers no GPU kernel of
        # ResourceScatterNdUpdate for bool
        self.values = tf.Variable(tf.zeros([steps, len(STEP_VALUES)]), trainable=False)
        self.position = tf.Variable(0, dtype=tf.int32, trainable=False)

    def record(self, row) -> None:
        self.values.scatter_nd_update(tf.reshape(self.position, [1, 1]), row[tf.newaxis])
        self.position.assign_add(1)

    def drain(self) -> dict[str, np.ndarray]:
        """This epoch's values on the host (one synchronisation), and a reset for the next epoch."""
        n = int(self.position.numpy())
        values = self.values.numpy()[:n]
        self.position.assign(0)
        return {name: values[:, i] for i, name in enumerate(STEP_VALUES)}


class AmpModel(keras.Model):
    device_images: DeviceImages | None = None  # set by train.attach_dataset; None: fit() feeds (x, y) batches
    step_log: StepLog | None = None  # set for device-side step values (TensorFlow, device mode)

    def batch(self, data) -> tuple:
        """The (images, labels) of a step: gathered on the device from indices, or as fit() gave them."""
        if self.device_images is not None:
            return tf.gather(self.device_images.images, data), tf.gather(self.device_images.labels, data)
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)  # train_on_batch() passes (x, y, None)
        return x, y

    def step_values(self, record: StepRecord, y) -> dict:
        """What fit() hands the recording callback: the step's record and its correct predictions, as one
        float32 row (logs["step"], STEP_VALUES); on TensorFlow in device mode the row goes to the StepLog
        instead, and fit() gets the loss alone (its train function must return something). DATA PARALLEL: the
        row as fit()'s mean over replicas makes it the global batch's, and every worker's own values beside it
        (keras_impl/distributed.py)."""
        ops = keras.ops
        predicted = ops.argmax(record.logits, axis=-1)
        correct = ops.sum(ops.cast(ops.equal(predicted, ops.cast(y, predicted.dtype)), "int32"))
        values, workers = distributed.replica_step(record, correct)  # DATA PARALLEL: as they were for one worker
        row = ops.stack([ops.cast(v, "float32") for v in values])
        if self.step_log is None:
            return {"step": row, **workers}
        self.step_log.record(row)
        return {"batch_loss": record.loss}

    def get_metrics_result(self) -> dict:
        """fit() reads the model's metrics at each epoch's end. train_step updates none (its values go to the
        recorder, which counts correct predictions as torch's loop does): the compiled accuracy is built by
        the first validation pass, and until then has no result to give."""
        results = {}
        for metric in self.metrics:
            if getattr(metric, "built", True):
                result = metric.result()
                results.update(result if isinstance(result, dict) else {metric.name: result})
        return results

    if backends.JAX:
        def train_step(self, state, data):
            """One optimizer step: amp.py's scaled step in JAX's stateless form (the state goes in and comes out)."""
            x, y = self.batch(data)
            record, state = stateless_scaled_step(self, state, x, y)  # AMP (amp.py)
            return self.step_values(record, y), state

    else:
        def train_step(self, data):
            """One optimizer step: amp.py's scaled step, and the values the callback records."""
            x, y = self.batch(data)
            return self.step_values(scaled_step(self, x, y), y)  # AMP: the scaled step (amp.py)


class EpochRecorder(keras.callbacks.Callback):
    """Per-epoch records, validation timed apart from training; the base of the three step recorders."""

    def __init__(self, book: StepBook, steps: int, augment: tuple[Dataset, object] | None = None,
                 first_step: FirstStepWindow | None = None):
        super().__init__()
        self.book, self.steps, self.augment = book, steps, augment
        self.first_step = first_step or FirstStepWindow(None)  # train() passes the CPU's memory window

    def on_epoch_begin(self, epoch, logs=None):
        if self.augment:  # the same augmented pixels as the torch side, before the epoch's clock starts
            data, images = self.augment
            images.set_epoch(epoch, epoch_images(data, self.book.cfg.seed, epoch, augment=True))
        self.book.start_epoch(epoch, self.steps)
        self.correct, self.eval_time, self.step_times = 0, 0.0, []
        self.last = self.epoch_start = time.perf_counter()

    def on_test_begin(self, logs=None):
        self.eval_start = time.perf_counter()

    def on_test_end(self, logs=None):
        self.eval_time = time.perf_counter() - self.eval_start

    def add(self, values: dict) -> None:
        """Steps' values (lists or arrays by STEP_VALUES name) to the book; a divergence stops fit()."""
        self.correct += int(np.sum(values["correct"]))
        skipped = [bool(s) for s in values["skipped"]]
        if self.book.add(list(map(float, values["batch_loss"])), list(map(float, values["loss_scale"])), skipped):
            self.model.stop_training = True  # fit() stops after this batch (this epoch, in device mode)

    def close_epoch(self, logs: dict, train_time: float) -> None:
        self.book.headroom(vit.read_headroom(self.model))  # vit: the epoch's maxima, one read of the device
        self.book.end_epoch(self.step_times, train_time, self.eval_time, self.correct,
                            float(logs.get("val_loss", np.nan)), float(logs.get("val_accuracy", np.nan)))


class StepRecorder(EpochRecorder):
    """Host mode (CPU): every step's values and wall time, from fit()'s logs as each step ends."""

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()  # logs arrive as host values, so the step has finished
        self.step_times.append(now - self.last)
        self.last = now
        loss, scale, skipped, correct = logs["step"].tolist()
        self.correct += int(correct)
        if self.book.add([loss], [scale], [skipped > 0]):
            self.model.stop_training = True  # fit() stops after this batch
        self.first_step.after(self.book.epoch, batch)

    def on_epoch_end(self, epoch, logs=None):
        self.close_epoch(logs, float(sum(self.step_times)))


class DeviceStepRecorder(EpochRecorder):
    """Device mode (GPU): no per-step hook, so fit() never waits for a step; the StepLog is read once
    per epoch. Per-step times cannot be had without a wait per step: they are recorded as missing and
    the step-time statistics come from the epoch's training time."""

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self.drained = False

    def on_test_begin(self, logs=None):
        if not self.drained:  # first thing after the epoch's steps: wait for them, then stop the clock
            self.drain()
        super().on_test_begin(logs)

    def read_epoch(self) -> dict:
        return self.model.step_log.drain()  # the epoch's one synchronisation

    def drain(self) -> None:
        values = self.read_epoch()
        self.train_time = time.perf_counter() - self.epoch_start
        self.drained = True
        self.step_times = untimed_steps(len(values["batch_loss"]))  # as torch's StepClock in device mode
        self.add(values)

    def on_epoch_end(self, epoch, logs=None):
        if not self.drained:  # no validation ran
            self.drain()
        self.close_epoch(logs, self.train_time)


class AsyncStepRecorder(DeviceStepRecorder):
    """Device mode on JAX and Keras' torch backend: no wait per step either. These backends hand an
    `async_safe` callback each step's logs on a worker thread, which alone waits for the step's values;
    the training loop goes on dispatching. The epoch's clock stops once every dispatched step's values
    have arrived (the one wait per epoch), as DeviceStepRecorder's StepLog read does on TensorFlow."""

    async_safe = True

    def on_epoch_begin(self, epoch, logs=None):
        self.dispatched, self.arrived = 0, {}
        self.arrival = threading.Condition()
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):  # the training loop's thread: a count, no wait
        self.dispatched += 1
        if self.book.epoch == 0 and batch == 1:
            # Step 0's dispatch includes tracing and compiling the step (jax.jit / torch.compile happen on the host
            # before the first step is queued): compile time apart from the per-epoch step time.
            self.book.result.info["first_step_dispatch_s"] = time.perf_counter() - self.epoch_start

    def on_train_batch_end(self, batch, logs=None):  # a worker thread: the logs are host values now
        with self.arrival:
            self.arrived[batch] = logs["step"].tolist()
            self.arrival.notify_all()

    def read_epoch(self) -> dict:
        with self.arrival:
            if not self.arrival.wait_for(lambda: len(self.arrived) >= self.dispatched, timeout=3600):
                raise RuntimeError(f"only {len(self.arrived)} of {self.dispatched} steps' values arrived")
            rows = [self.arrived[k] for k in sorted(self.arrived)]
        columns = np.array(rows, dtype=float).reshape(len(rows), len(STEP_VALUES))
        return {name: columns[:, i] for i, name in enumerate(STEP_VALUES)}
