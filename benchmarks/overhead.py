"""Benchmark: does the suite distort what it measures?

For each framework and precision, three loops train copies of the same model (same initial
weights) on the same batches, interleaved round by round in one process so machine noise hits
them alike:

  suite     the instrumented loop compare runs (torch: loop.run_epoch with its StepBook; Keras:
            AmpModel.fit with the StepRecorder callback and its StepBook), real input pipeline
  minimal   the tutorial's plain loop (forward, loss, scaled backward, step; Keras: a model
            whose train_step is just that, fit with no callback; both in benchmarks/reference_loops.py),
            same real input pipeline
  in-memory the minimal loop stepping on one batch already in memory: no input pipeline at all

Printed ratios (targets: both <= 1.05): instrumentation overhead = suite / minimal; input pipeline
cost = minimal / in-memory. Each round gives one paired ratio (the loops ran back to back); the printed
ratio is their geometric mean with a 95% t-interval. Rounds continue past --rounds until the overhead
interval is narrower than --target-width (5%: narrower than the 5% it judges) or the cell's --budget-s is
spent; the table says which, so a cell that could not be resolved on a noisy machine is visible.

Scheduling regimes (CPU runs). Each timed call also records the process's CPU time, so cores busy = CPU / wall. On the
2-core VM this was built on, TensorFlow ran each fit() call either on ~1.9 cores or on ~1.0 (the same CPU
work, up to 1.9x the wall time), at random from call to call, in each of the three loops (measured 2026-11-23:
bf16 steps 62 or 116 ms, fp32 9.5 or 14.2 ms; pinning its busiest threads to separate cores did not change
it). A compare run, one model per process, was not hit: the median step of every Keras epoch, 72 of 72 (fp32
and bf16, 3 seeds, 12 epochs), was at the fast regime's time; the bench, which holds three models in one
process, was hit in about half its calls. A round whose two calls ran in different regimes measures the
scheduler, not the loop. Where a cell's calls fall into two such clusters (`regimes`), the overhead is
judged on the rounds where both loops ran in the same regime (the "pairs" column: those rounds / all
rounds), the all-rounds ratio is kept in the CSV, and the verdict says how often each side landed in the
slow regime: if the suite landed there significantly more often (binomial test over the mixed rounds), that
is overhead, and the verdict says so. The CPU-time ratio beside it is the work the instrumentation adds,
which no regime changes; it is not the headline, since a sync costs wall time without costing CPU.

--device cuda runs the same comparison on a GPU (the loops wait for the device at the end of each timed
call). --step picks the optimizer both loops use: plain = the framework's default (on a GPU, torch's
GradScaler reads found_inf on the host every fp16 step, in both loops), tuned = torch's fused optimizer
(the fastest plain loop measured in issue 13) / Keras jit_compile. torch.compile is left out on both
sides: it would apply identically to both loops and costs minutes per loop on a CPU.

    python benchmarks/overhead.py [--device cpu|cuda] [--step plain|tuned] [--model simple_cnn]
                                  [--rounds 15] [--budget-s 60] [--precisions fp32,fp16,bf16]
"""

from __future__ import annotations

import argparse
import io
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
from amp_compare.kit.child import Progress, TrainResult  # noqa: E402
from amp_compare.kit.data import batch_plan, load_dataset  # noqa: E402
from amp_compare.kit.training import StepBook  # noqa: E402
from benchmarks.reference_loops import tutorial_model, tutorial_step  # noqa: E402
from benchmarks.results import ratio_interval, write_csv  # noqa: E402

EPOCHS_PER_ROUND = 2  # each timed call trains this many epochs of the batch plan


def _book(cfg: RunConfig) -> StepBook:
    """The suite's StepBook as train() makes it: progress to a sink; the locator's check runs until the first
    non-finite or skipped step (as in a run, once), which finds nothing to locate here."""
    return StepBook(cfg, TrainResult(), Progress(stream=io.StringIO()), lambda: {}, lambda epoch, batch, scale: None)


def _torch_loops(cfg: RunConfig, data, plan: np.ndarray) -> dict:
    import torch

    from amp_compare.torch_impl.amp import make_scaler
    from amp_compare.torch_impl.loop import StepClock, run_epoch
    from amp_compare.torch_impl.models import get_weights, set_weights
    from amp_compare.torch_impl.train import make_dataset, make_model, make_step_optimizer, setup

    setup(cfg)
    device = torch.device(cfg.device)
    x, y, _, _ = make_dataset(cfg, data)
    plans = [torch.from_numpy(p).to(device) for p in plan]
    first = make_model(cfg, data)
    weights = get_weights(first)

    def fresh():
        model = make_model(cfg, data)
        set_weights(model, weights)
        model = model.to(device).train()
        return model, make_step_optimizer(cfg, model.parameters()), make_scaler(cfg)

    suite_model, suite_opt, suite_scaler = fresh()
    clock, book = StepClock(device), _book(cfg)

    def suite():  # as torch_impl/train.py's train_epochs, validation left out
        for epoch, epoch_plan in enumerate(plans):
            book.start_epoch(epoch, len(epoch_plan))
            correct, step_times = run_epoch(suite_model, suite_opt, suite_scaler, x, y, epoch_plan, cfg.precision,
                                            clock, book)
            book.end_epoch(step_times, clock.elapsed, 0.0, correct, float("nan"), float("nan"))

    def minimal_loop(model, optimizer, scaler, batches):
        for xb, yb in batches:  # the tutorial's loop
            loss = tutorial_step(model, optimizer, scaler, cfg.precision, device.type, xb, yb)
        float(loss.detach())  # wait for the last step

    min_state, mem_state = fresh(), fresh()
    xb, yb = x[plans[0][0]], y[plans[0][0]]
    n_steps = sum(len(p) for p in plans)
    return {
        "suite": suite,
        "minimal": lambda: minimal_loop(*min_state, ((x[idx], y[idx]) for p in plans for idx in p)),
        "in-memory": lambda: minimal_loop(*mem_state, ((xb, yb) for _ in range(n_steps))),
    }


def _tf_loops(cfg: RunConfig, data, plan: np.ndarray) -> dict:
    import keras
    import tensorflow as tf

    from amp_compare.keras_impl.loop import AmpModel, StepRecorder
    from amp_compare.keras_impl.models import build_model, get_weights, set_weights
    from amp_compare.keras_impl.train import make_dataset, make_model, make_optimizer, setup

    setup(cfg)
    weights = get_weights(make_model(cfg, data))
    steps = plan.shape[0] * plan.shape[1]
    indices, device_images = make_dataset(cfg, data)  # cfg's batch plan: every epoch's batches in a row, as `plan`
    Tutorial = tutorial_model()  # noqa: N806 - a class

    def compiled(model_class, images=None):
        model = build_model(cfg.model, data.input_shape, data.num_classes, model_class=model_class)
        set_weights(model, weights)
        model.compile(optimizer=make_optimizer(cfg, model.trainable_variables),  # built, as train() builds it
                      metrics=["accuracy"] if model_class is AmpModel else None,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), auto_scale_loss=False,
                      jit_compile=cfg.step == "tuned")
        if images is not None:
            model.device_images = images
            model.images = images
        return model

    suite_model = compiled(AmpModel, device_images)
    min_model, mem_model = compiled(Tutorial, device_images), compiled(Tutorial)
    recorder = StepRecorder(_book(cfg), steps)
    first = plan[0, 0]
    fixed = tf.data.Dataset.from_tensors((data.x_train[first], data.y_train[first])).repeat()
    kw = {"epochs": 1, "steps_per_epoch": steps, "verbose": 0, "shuffle": False}
    return {
        "suite": lambda: suite_model.fit(indices, callbacks=[recorder], **kw),
        "minimal": lambda: min_model.fit(indices, **kw),
        "in-memory": lambda: mem_model.fit(fixed, **kw),
    }


REGIME_GAP = 0.10  # two clusters of cores-in-use at least this far apart (relative) are two scheduling regimes


def regimes(cores: np.ndarray) -> np.ndarray | None:
    """Each call's scheduling regime (0: fewer cores busy, 1: more), or None when the calls form one cluster.

    cores = the process's CPU time / wall time of each timed call. On this 2-core VM, TensorFlow runs a whole
    fit() call either on ~1.9 cores or on ~1.0 (same CPU work, ~1.9x the wall time), at random from call to
    call and whatever the loop: a pair of calls that landed in different regimes measures the scheduler,
    not the loop. Two clusters: split at the widest gap between sorted values; they count as two regimes
    where that gap is over REGIME_GAP of the lower value and over twice the wider cluster's own range.
    """
    cores = np.asarray(cores, dtype=float)
    if cores.size < 2:
        return None
    s = np.sort(cores)
    k = int(np.argmax(np.diff(s)))
    gap, lo, hi = s[k + 1] - s[k], s[:k + 1], s[k + 1:]
    if gap <= REGIME_GAP * s[k] or gap <= 2 * max(np.ptp(lo), np.ptp(hi)):
        return None
    return (cores > s[k]).astype(int)


def paired(wall: dict, cpu: dict, num: str, den: str, split: bool = True) -> dict:
    """The paired num/den ratio of a cell: over all rounds, and over the rounds where both calls ran in the
    same scheduling regime (if the cell's calls fell into two), with the CPU-time ratio beside them.
    split=False (a GPU run: the host's CPU time there is waiting as much as working) keeps all rounds."""
    w_num, w_den = np.asarray(wall[num]), np.asarray(wall[den])
    c_num, c_den = np.asarray(cpu[num]), np.asarray(cpu[den])
    out = {"all": ratio_interval(w_num, w_den), "cpu": ratio_interval(c_num, c_den), "pairs": int(w_num.size)}
    names = list(wall)
    cores = np.concatenate([np.asarray(cpu[n]) / np.asarray(wall[n]) for n in names])
    labels = regimes(cores) if split else None
    if labels is None:
        out.update(same=out["all"], same_pairs=out["pairs"], bimodal=False)
        return out
    by = dict(zip(names, np.split(labels, len(names))))
    same = by[num] == by[den]
    mixed = ~same
    out.update(same=ratio_interval(w_num[same], w_den[same]), same_pairs=int(same.sum()), bimodal=True,
               cores=(float(np.median(cores[labels == 0])), float(np.median(cores[labels == 1]))),
               slow_calls={n: int((by[n] == 0).sum()) for n in names},
               # of the mixed pairs, how many had the numerator's loop in the slow regime: about half if the
               # regime does not depend on the loop
               num_slow_of_mixed=(int((by[num][mixed] == 0).sum()), int(mixed.sum())))
    return out


def child(framework: str, model: str, precision: str, batch_size: int, rounds: int, warmup: int,
          device: str = "cpu", step: str = "plain", budget_s: float = 60.0, target_width: float = 0.05) -> None:
    cfg = RunConfig(framework=framework, model=model, precision=precision, batch_size=batch_size, init="framework",
                    device=device, step=step)
    data = load_dataset(cfg.dataset)
    plan = batch_plan(len(data.x_train), batch_size, cfg.seed, EPOCHS_PER_ROUND)
    loops = (_torch_loops if framework == "torch" else _tf_loops)(cfg, data, plan)
    steps = plan.shape[0] * plan.shape[1]
    wall: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    split = device == "cpu"  # scheduling regimes are a CPU matter (see the module docstring)
    r, deadline = 0, None
    while True:
        # rotate the order every round, so whatever one loop leaves behind (GC, prefetch threads) hits all alike
        for name in names[r % len(names):] + names[:r % len(names)]:
            loop = loops[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            loop()
            if r >= warmup:
                wall[name].append((time.perf_counter() - start) / steps)
                cpu[name].append((time.process_time() - start_cpu) / steps)
        r += 1
        if r == warmup:
            deadline = time.perf_counter() + budget_s  # the budget counts timed rounds only
        if r >= warmup + rounds:
            _, lo, hi = paired(wall, cpu, "suite", "minimal", split)["same"]
            if (np.isfinite(lo) and hi / lo - 1 < target_width) or time.perf_counter() > deadline:
                break
    print(json.dumps({"rounds": len(wall["suite"]), **{name: float(np.median(t)) for name, t in wall.items()},
                      "overhead": paired(wall, cpu, "suite", "minimal", split),
                      "pipeline": paired(wall, cpu, "minimal", "in-memory", split)}))


def verdict(m: dict, target_width: float) -> str:
    """Judge the overhead against 1.05 from its interval (same-regime pairs where the cell was bimodal)."""
    ov = m["overhead"]
    _, lo, hi = ov["same"]
    words = "<= 1.05" if hi <= 1.05 else "> 1.05" if lo > 1.05 else "straddles 1.05"
    if not (np.isfinite(lo) and hi / lo - 1 < target_width):
        words += f"; interval wider than {target_width:.0%} (budget spent: noisy machine)"
    if ov["bimodal"]:
        from scipy import stats

        k, n = ov["num_slow_of_mixed"]
        words += (f"; two scheduling regimes ({ov['cores'][0]:.2f} vs {ov['cores'][1]:.2f} cores busy), judged "
                  f"on the {ov['same_pairs']} of {ov['pairs']} rounds where both loops ran in the same one")
        if n and stats.binomtest(k, n).pvalue < 0.05:
            words += f"; but the suite ran in the slower regime in {k} of {n} mixed rounds: the regime follows the loop"
    return words


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--step", default="plain", choices=("plain", "tuned"))
    parser.add_argument("--frameworks", default="torch,tf")
    parser.add_argument("--budget-s", type=float, default=60.0, help="seconds of timed rounds per cell at most")
    parser.add_argument("--target-width", type=float, default=0.05, help="stop once the interval is this narrow")
    parser.add_argument("--child", nargs=2, metavar=("FRAMEWORK", "PRECISION"))
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench")
    args, _ = parser.parse_known_args()  # `nox -s bench -- …` hands amp_speed.py's options here too
    if args.child:
        child(args.child[0], args.model, args.child[1], args.batch_size, args.rounds, args.warmup,
              args.device, args.step, args.budget_s, args.target_width)
        return 0
    rows = []
    print(f"Instrumentation and input-pipeline cost, {args.model}, batch {args.batch_size}, {args.device}, "
          f"{args.step} step, at least {args.rounds} rounds interleaved per cell (median ms per step; ratios: "
          "geometric mean of per-round ratios [95% interval]):")
    print(f"{'framework':<10}{'precision':<10}{'pairs':>7}{'suite ms':>10}{'minimal ms':>12}{'in-mem ms':>11}"
          f"{'overhead [95%]':>24}{'CPU-time overhead':>24}{'pipeline [95%]':>24}  verdict")
    for framework in args.frameworks.split(","):
        for precision in args.precisions.split(","):
            proc = subprocess.run([sys.executable, __file__, "--child", framework, precision, "--model", args.model,
                                   "--batch-size", str(args.batch_size), "--rounds", str(args.rounds),
                                   "--warmup", str(args.warmup), "--device", args.device, "--step", args.step,
                                   "--budget-s", str(args.budget_s), "--target-width", str(args.target_width)],
                                  capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(f"{framework} {precision}: benchmark child failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            m = json.loads(proc.stdout.strip().splitlines()[-1])
            ov, pi = m["overhead"], m["pipeline"]
            (o, o_lo, o_hi), (p, p_lo, p_hi), (c, c_lo, c_hi) = ov["same"], pi["same"], ov["cpu"]
            row = {"framework": framework, "precision": precision, "model": args.model, "batch_size": args.batch_size,
                   "device": args.device, "step": args.step, "rounds": m["rounds"],
                   "suite_ms": m["suite"] * 1e3, "minimal_ms": m["minimal"] * 1e3, "in_memory_ms": m["in-memory"] * 1e3,
                   "overhead_ratio": o, "overhead_lo": o_lo, "overhead_hi": o_hi, "overhead_pairs": ov["same_pairs"],
                   "overhead_all_rounds": ov["all"][0], "overhead_all_lo": ov["all"][1],
                   "overhead_all_hi": ov["all"][2], "overhead_cpu": c, "overhead_cpu_lo": c_lo, "overhead_cpu_hi": c_hi,
                   "pipeline_ratio": p, "pipeline_lo": p_lo, "pipeline_hi": p_hi, "pipeline_pairs": pi["same_pairs"],
                   "bimodal": ov["bimodal"], "slow_calls": json.dumps(ov.get("slow_calls", {})),
                   "verdict": verdict(m, args.target_width)}
            rows.append(row)
            pairs = f"{ov['same_pairs']}/{m['rounds']}"
            print(f"{framework:<10}{precision:<10}{pairs:>7}{row['suite_ms']:>10.2f}{row['minimal_ms']:>12.2f}"
                  f"{row['in_memory_ms']:>11.2f}{f'{o:.3f} [{o_lo:.3f}, {o_hi:.3f}]':>24}"
                  f"{f'{c:.3f} [{c_lo:.3f}, {c_hi:.3f}]':>24}{f'{p:.3f} [{p_lo:.3f}, {p_hi:.3f}]':>24}"
                  f"  {row['verdict']}", flush=True)
    write_csv(rows, args.out, "overhead")
    return 0


if __name__ == "__main__":
    sys.exit(main())
