"""The reference loops the benchmarks judge the project's own loops against, in one place.

  tutorial_step     PyTorch's AMP tutorial step: forward and loss under autocast, GradScaler-scaled backward,
                    step, update. overhead.py's "minimal" loop and the torch reference below both step with it.
  tutorial_model    Keras' tutorial step on TensorFlow (GradientTape, the optimizer's scale_loss), as a
                    keras.Model subclass: overhead.py's "minimal" Keras loop.
  time_keras_fit    a bare Keras `fit` as Keras' guides write it, on whatever backend KERAS_BACKEND names.

Model, data, batch plan and precision mapping are the package's own (torch_impl/, keras_impl/, kit/data.py,
contract/precision.py), so a reference differs from the project's loop by the loop alone.

As a script, one reference timed over the project's model and data, one JSON line per precision (gpu_check.py
runs it beside each compare it judges):

    python -m benchmarks.reference_loops torch|keras --device cuda --model resnet18 --dataset synthetic_cifar \\
        --precisions fp32,fp16,bf16 --batch-size 256 --epochs 3 --warmup 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_compare.contract.config import RunConfig, declared  # noqa: E402
from amp_compare.kit.data import batch_plan, load_dataset, steps_per_epoch  # noqa: E402


def tutorial_step(model, optimizer, scaler, precision: str, device_type: str, xb, yb):
    """One step of the PyTorch AMP tutorial's loop; returns the loss (a device tensor: reading it waits)."""
    import torch.nn.functional as F

    from amp_compare.torch_impl.amp import mixed_precision

    with mixed_precision(precision, device_type):
        loss = F.cross_entropy(model(xb), yb)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


def tutorial_model():
    """A keras.Model class whose train_step is the Keras tutorial's (TensorFlow backend); given `images` (the
    suite's device-resident images), it gathers each batch from them by index as the suite's step does."""
    import keras
    import tensorflow as tf

    class Tutorial(keras.Model):
        images = None

        def train_step(self, data):
            if self.images is not None:
                data = (tf.gather(self.images.images, data), tf.gather(self.images.labels, data))
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
                scaled = self.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}  # fit() needs some output

    return Tutorial


def config(framework: str, args, precision: str) -> RunConfig:
    """The cell the reference mirrors: the compare's settings for this device (channels last on a GPU), TF32 off."""
    return RunConfig(framework=framework, model=args.model, dataset=args.dataset, precision=precision,
                     batch_size=args.batch_size, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch or None,
                     device=args.device, tf32="off", init="framework",
                     channels_last=declared(RunConfig)["channels_last"].default_for(args.device))


def time_torch(cfg: RunConfig, warmup: int) -> dict:
    """The tutorial's loop over the compare's batch plan, data on the device; no records, no per-step clock: wall
    time of the steps after the warm-up, one synchronisation at each end."""
    import torch

    from amp_compare.torch_impl.train import compile_model, make_dataset, make_model, setup

    setup(cfg)  # seed, threads, TF32 as the compare sets them
    device = torch.device(cfg.device)
    data = load_dataset(cfg.dataset)
    x, y, _, _ = make_dataset(cfg, data)
    run = compile_model(cfg, make_model(cfg, data).train(), device)  # plain step: no compile, default Adam
    plan = batch_plan(len(x), cfg.batch_size, cfg.seed, cfg.epochs, cfg.steps_per_epoch)
    plan = torch.from_numpy(plan.reshape(-1, cfg.batch_size)).to(device)
    for idx in plan[:warmup]:
        tutorial_step(run.model, run.optimizer, run.scaler, cfg.precision, device.type, x[idx], y[idx])
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for idx in plan[warmup:]:
        loss = tutorial_step(run.model, run.optimizer, run.scaler, cfg.precision, device.type, x[idx], y[idx])
    final = float(loss)  # waits for the last step
    seconds, timed = time.perf_counter() - start, len(plan) - warmup
    return {"reference": "torch reference loop", "steps_timed": timed, "seconds": seconds,
            "img_s": timed * cfg.batch_size / seconds, "final_loss": final}


def time_keras_fit(cfg: RunConfig) -> dict:
    """A bare fit on numpy arrays: the precision's policy, compile (Keras wraps the optimizer in a
    LossScaleOptimizer for mixed_float16 itself), no callback but an epoch timer. The first epoch (tracing,
    compilation) is left out; the later epochs' wall time over their images is the figure."""
    import keras

    from amp_compare.keras_impl import amp, backends
    from amp_compare.keras_impl.models import build_model

    backends.set_tf32(cfg.tf32)
    amp.mixed_precision(cfg.precision)
    keras.utils.set_random_seed(cfg.seed)
    data = load_dataset(cfg.dataset)
    steps = steps_per_epoch(len(data.x_train), cfg.batch_size, cfg.steps_per_epoch)
    n = steps * cfg.batch_size  # whole batches only, as the compare: one shape, no second compilation
    times: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):  # the logs are host values by now: the epoch's steps have run
            times.append(time.perf_counter() - self.start)

    model = build_model(cfg.model, data.input_shape, data.num_classes, width=cfg.width)
    model.compile(optimizer=keras.optimizers.Adam(cfg.lr), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data.x_train[:n], data.y_train[:n], batch_size=cfg.batch_size, epochs=cfg.epochs, shuffle=True,
              verbose=0, callbacks=[EpochTimer()])
    later = times[1:] or times
    keras.backend.clear_session()
    return {"reference": f"bare Keras fit ({keras.backend.backend()})", "steps_timed": steps * len(later),
            "seconds": sum(later), "img_s": steps * len(later) * cfg.batch_size / sum(later),
            "first_epoch_s": times[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loop", choices=("torch", "keras"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--dataset", default="synthetic_cifar")
    parser.add_argument("--precisions", default="fp32,fp16,bf16")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10, help="torch: steps left out of the timing")
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="cap (0: the whole training set)")
    args = parser.parse_args(argv)
    for precision in args.precisions.split(","):
        if args.loop == "torch":
            row = time_torch(config("torch", args, precision), args.warmup)
        else:
            row = time_keras_fit(config("keras-jax", args, precision))
        print(json.dumps({**row, "precision": precision, "batch": args.batch_size}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
