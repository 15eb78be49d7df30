"""Benchmark: how much faster (or slower) is each mixed-precision mode than fp32, per framework?

Each framework runs in its own child process. Inside it the fp32, fp16 and bf16 versions of the
same model train on the same in-memory batch, interleaved step by step (fp32, fp16, bf16, fp32,
…), so machine noise hits all three alike. Each round gives one paired ratio fp32 step / mode step; the
result is their geometric mean with a 95% t-interval, and the verdict says whether the interval supports
"faster" or "slower" at all and flags one wider than WIDE (then re-run with more --rounds on an idle
machine). This uses the project's own train_step code. Prints a table and writes it as CSV.

    python benchmarks/amp_speed.py [--model simple_cnn] [--batch-size 64] [--rounds 40]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_compare.contract.config import DEFAULT_PRECISIONS as PRECISIONS  # noqa: E402
from amp_compare.contract.config import RunConfig  # noqa: E402
from amp_compare.kit.data import load_dataset  # noqa: E402
from benchmarks.results import ratio_interval, write_csv  # noqa: E402

WIDE = 0.10  # an interval wider than this (high / low - 1) is flagged as too wide to support the ratio


def _torch_steppers(model_name: str, batch_size: int, device: str = "cpu", step: str = "plain"):
    from amp_compare.torch_impl.amp import make_scaler, train_step
    from amp_compare.torch_impl.train import make_dataset, make_model, make_step_optimizer, setup

    data = load_dataset("digits")
    x, y, _, _ = make_dataset(RunConfig(framework="torch", model=model_name, device=device), data)
    xb, yb = x[:batch_size], y[:batch_size]
    out = {}
    for precision in PRECISIONS:
        cfg = RunConfig(framework="torch", model=model_name, precision=precision, batch_size=batch_size,
                        device=device, step=step)
        setup(cfg)
        model = make_model(cfg, data).to(device)
        optimizer, scaler = make_step_optimizer(cfg, model.parameters()), make_scaler(cfg)
        out[precision] = (lambda m=model, o=optimizer, s=scaler, p=precision:
                          train_step(m, o, s, xb, yb, p).loss.item())
    return out


def _tf_steppers(model_name: str, batch_size: int, device: str = "cpu", step: str = "plain"):
    import keras
    import tensorflow as tf

    from amp_compare.keras_impl.train import compile_model, make_model, setup

    data = load_dataset("digits")
    xb, yb = data.x_train[:batch_size], data.y_train[:batch_size]
    out = {}
    for precision in PRECISIONS:
        cfg = RunConfig(framework="tf", model=model_name, precision=precision, batch_size=batch_size,
                        device=device, step=step)
        setup(cfg)  # sets the global dtype policy the model is built under
        with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
            model = make_model(cfg, data)
            compile_model(cfg, model)  # as amp_compare.keras_impl.train does before fit()
        out[precision] = lambda m=model: m.train_on_batch(xb, yb, return_dict=True)
    keras.config.set_dtype_policy("float32")
    return out


def child(framework: str, model_name: str, batch_size: int, rounds: int, warmup: int, device: str = "cpu",
          step: str = "plain") -> None:
    steppers = (_torch_steppers if framework == "torch" else _tf_steppers)(model_name, batch_size, device, step)
    times: dict[str, list[float]] = {p: [] for p in steppers}
    for r in range(warmup + rounds):
        for precision, step in steppers.items():
            start = time.perf_counter()
            step()  # returns host values, so the step has finished
            if r >= warmup:
                times[precision].append(time.perf_counter() - start)
    print(json.dumps({"median": {p: float(np.median(t)) for p, t in times.items()},
                      "speedup": {p: ratio_interval(times["fp32"], t) for p, t in times.items()}}))


def speed_verdict(ratio: float, lo: float, hi: float) -> str:
    """What a speed-up interval supports: faster, slower or neither, and whether it is too wide to lean on."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "too few rounds for an interval"
    words = "faster" if lo > 1 else "slower" if hi < 1 else "not distinguishable from fp32"
    wide = hi / lo - 1 > WIDE
    return words + (f"; ⚠ interval wider than {WIDE:.0%}: re-run idle, with more --rounds" if wide else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--child", choices=["torch", "tf"])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--step", default="plain", choices=("plain", "tuned"), help="the optimizer / XLA of the step")
    parser.add_argument("--frameworks", default="torch,tf")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench")
    args, _ = parser.parse_known_args()  # `nox -s bench -- …` hands overhead.py's options here too
    if args.child:
        child(args.child, args.model, args.batch_size, args.rounds, args.warmup, args.device, args.step)
        return 0
    rows = []
    for framework in args.frameworks.split(","):
        proc = subprocess.run([sys.executable, __file__, "--child", framework, "--model", args.model,
                               "--batch-size", str(args.batch_size), "--rounds", str(args.rounds),
                               "--warmup", str(args.warmup), "--device", args.device, "--step", args.step],
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(f"{framework}: benchmark child failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        medians = measured["median"]
        for precision, median in medians.items():
            ratio, lo, hi = measured["speedup"][precision]
            rows.append({"framework": framework, "model": args.model, "batch_size": args.batch_size,
                         "precision": precision, "median_step_ms": median * 1000,
                         "speedup_vs_fp32": ratio, "speedup_lo": lo, "speedup_hi": hi,
                         "verdict": speed_verdict(ratio, lo, hi) if precision != "fp32" else ""})
    print(f"Mixed precision vs fp32, interleaved in one process per framework ({args.rounds} rounds; speed-up: "
          "geometric mean of per-round fp32/mode step-time ratios [95% interval]):")
    print(f"{'framework':<10}{'precision':<10}{'median step (ms)':>18}{'speed-up vs fp32 [95%]':>28}  verdict")
    for r in rows:
        interval = f"{r['speedup_vs_fp32']:.2f}× [{r['speedup_lo']:.2f}, {r['speedup_hi']:.2f}]"
        print(f"{r['framework']:<10}{r['precision']:<10}{r['median_step_ms']:>18.2f}{interval:>28}  {r['verdict']}")
    write_csv(rows, args.out, "amp_speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
