"""Speed trials: fp32 and each mixed precision timed in one process, block by block, and what the blocks say.

A training cell's wall time tells what a run of that cell took; comparing two cells that ran minutes apart compares
the machine's two moments as much as the precisions. A trial holds the fp32 model and each mixed precision's model of
one framework × model × dataset × batch size × step loop in one process (built by the cells' own functions: each twin's
trial.py) and runs them in rounds: every round each precision runs one block of k steps, timed as wall time that ends
with a host read (one device synchronisation per block on a GPU), the process's CPU time beside it.

The order: rounds come in mirrored pairs (round 2u runs a rotation of the precisions, round 2u+1 the same rotation
reversed, and the rotation moves on each pair). A drift of the machine's speed biases a round's fp32 ÷ mixed ratio by
how far apart in time the two blocks ran; mirrored, that bias changes sign from one round to the next, so it widens
the rounds' spread instead of moving their median; the rotation keeps any one precision from always going first.

k: a block lasts at least BLOCK_S (timer and synchronisation costs stay small beside it); a precision 20× slower than
fp32 gets 20× fewer steps per block, not more time. The trial's rounds stop at its time budget (whole pairs only;
the budget counts rounds, not the models' building and warm-up, which took Keras' three ViT models 21 s on the AVX2-only
EPYC and would leave them no rounds), MIN_ROUNDS at least, or earlier once the rounds already decide every mixed
precision (decided, STOP_CONFIDENCE).

The estimate (trial_summary): per round, log(fp32 per-step time ÷ mixed per-step time); the ratio is exp of their
median, with the sign test's 95% interval (order statistics of the rounds: distribution-free, no symmetry assumed,
which stalls would break: they only ever slow a block, and a slow precision's long blocks meet more of them). A
stalled block moves one round, and the median does not follow it. Averaging each mirrored pair first cancels a linear
drift exactly but lets every stall spoil a pair, and twice as many rounds' worth of blocks share a pair: simulated
(tests/test_trials.py), 5% stalled blocks widened that interval from ±4% to ±35%. speed_status words an interval.

On a GPU the same protocol applies (the host read at each block's end is the block's one synchronisation); it has
been run on CPUs only so far.

This module never imports a framework.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from amp_compare.contract import records
from amp_compare.contract.config import ConfigError, RunConfig
from amp_compare.contract.precision import REFERENCE
from amp_compare.contract.tables import check

BLOCK_S = 0.05  # a block's shortest wall time
# Warm-up steps per model before the one timed step that sets its k: the first holds tracing / compilation and first
# allocations, the second the first-step leftovers (the cells drop --warmup-steps, 5, from their statistics; a trial's
# blocks are medians of many rounds, and a slow precision's extra warm-up steps would spend the budget)
WARMUP_STEPS = 2
CONFIDENCE = 0.95
# The fewest rounds a trial runs, past its budget if need be: the sign test's 95% interval needs 6 (its widest, the
# rounds' extremes, covers with 1 - 2 x 0.5^n); 8 make it hold at 99%. 8 rounds of the ViT's blocks (>= BLOCK_S each,
# three precisions) take about 1.2 s on the AVX2-only EPYC.
MIN_ROUNDS = 8
SAME_BAND = (0.95, 1.05)  # an interval inside this is "the same speed"
# A trial stops before its budget once every mixed precision's interval at this stricter confidence gives a verdict
# (checked after each pair of rounds from MIN_ROUNDS on; the verdict printed is still the 95% interval's, which the
# stricter one contains). Looking repeatedly costs some error: tests/test_trials.py simulates the rule with drift and
# stalls, and the 95% interval at the stop still covers the true ratio in >= 93% of trials. Where mixed precision is
# 6x slower than fp32 (this CPU without half arithmetic), 8 rounds decide it and the rest of the budget is not spent.
STOP_CONFIDENCE = 0.99
# A block is contended when the process got much less CPU than it can use: cpu_s / wall_s below CONTENDED_SHARE of a
# reference, the larger of that precision's own best blocks in the trial (their 90th percentile of cpu/wall) and
# CONTENDED_SHARE x threads; on a GPU, where the host mostly waits, its own best blocks alone. Measured on the 2-core
# AVX2 EPYC, training phases of two default compares (2 threads): PyTorch 1.93-1.98 CPU s per s idle, 0.98 for the
# cell that shared its cores with another process; Keras on TensorFlow 1.42-1.83 in its usual regime, 0.87-0.92 in a
# regime that took twice as long, and its ViT 1.22-1.29 throughout (its own best sets its reference, so it is not
# flagged); the thread bound flags a trial that was busy from start to end, where its best blocks were low too.
CONTENDED_SHARE = 0.75


@dataclass
class Stepper:
    """One precision's model as a trial runs it: run(k) takes k training steps (the cells' step function) and returns
    a host value read after the last (its loss as a Python float): the block has finished when run returns."""

    precision: str
    run: Callable[[int], float]


def trial_id(cfg: RunConfig) -> str:
    """The trial a cell's configuration belongs to (what the trial holds fixed: all but precision and seed)."""
    return f"{cfg.framework}-{cfg.model}-{cfg.dataset}-b{cfg.batch_size}-{cfg.step}"


# ---- scheduling ------------------------------------------------------------------------------------------------

def block_order(n: int, round_: int) -> list[int]:
    """The precisions' order (indices into the trial's list) in round `round_`: a rotation that moves on every pair of
    rounds, the pair's second round that rotation reversed (the module's docstring says why)."""
    shift = (round_ // 2) % n
    order = [*range(shift, n), *range(shift)]
    return order if round_ % 2 == 0 else order[::-1]


# The steps whose fastest sets k, where they fit in a K_STEPS-th of a block (a fast step timed alone, one scheduler
# tick beside it, gave blocks a quarter of BLOCK_S on a 2-core Xeon; their mean, one slow step among three, gave a
# fifth); a slow step is timed once
K_STEPS = 5


def block_steps(step_s: float, block_s: float = BLOCK_S) -> int:
    """k: the steps a block of a precision whose step takes step_s needs to last at least block_s."""
    return max(1, math.ceil(block_s / step_s)) if step_s > 0 and math.isfinite(step_s) else 1


def contended_flags(blocks: pd.DataFrame, gpu: bool = False) -> pd.Series:
    """Per block, whether it lost its cores (CONTENDED_SHARE's rule)."""
    share = blocks["cpu_s"] / blocks["wall_s"]
    best = share.groupby([blocks["trial_id"], blocks["precision"]]).transform(lambda s: s.quantile(0.9))
    reference = best if gpu else np.maximum(best, CONTENDED_SHARE * blocks["threads"])
    return share < CONTENDED_SHARE * reference


def run_blocks(steppers: list[Stepper], budget_s: float, warmup: int = WARMUP_STEPS, block_s: float = BLOCK_S,
               on_round: Callable[[int, int], None] = lambda done, planned: None,
               clock: Callable[[], float] = time.perf_counter,
               cpu_clock: Callable[[], float] = time.process_time, start: float | None = None) -> list[dict]:
    """Warm every model up (warmup steps: 0 where warm_up ran them already; then up to K_STEPS timed steps, the
    fastest setting its k),
    then mirrored pairs of rounds until the budget (seconds of rounds: from `start`, a `clock` time, where given,
    else from the end of the warm-up) would be
    passed, MIN_ROUNDS at least, or until the rounds decide every mixed precision (decided). Returns one dict per
    block: round, position, precision, steps, wall_s, cpu_s."""
    ks = {}
    for s in steppers:
        if warmup:
            s.run(warmup)
        times = []
        while not times or (len(times) < K_STEPS and sum(times) < block_s / K_STEPS):  # one jittered step misleads
            t0 = clock()
            s.run(1)
            times.append(clock() - t0)
        ks[s.precision] = block_steps(min(times), block_s)  # a block lasts block_s even at the fastest step
    start = clock() if start is None else start
    rows, round_ = [], 0
    pair_s = None
    while True:
        if round_ % 2 == 0 and round_ >= MIN_ROUNDS and (clock() - start + pair_s > budget_s
                                                         or decided(rows, [s.precision for s in steppers])):
            break
        pair_start = clock()
        for position, index in enumerate(block_order(len(steppers), round_)):
            s, k = steppers[index], ks[steppers[index].precision]
            c0, w0 = cpu_clock(), clock()
            value = s.run(k)  # ends with a host read: the block's steps have finished
            wall, cpu = clock() - w0, cpu_clock() - c0
            if not isinstance(value, float):  # a device value would let the block's time end before its steps did
                raise TypeError(f"{s.precision}'s block returned {type(value).__name__}, not a value read on the host")
            rows.append({"round": round_, "position": position, "precision": s.precision, "steps": k,
                         "wall_s": wall, "cpu_s": cpu})
        round_ += 1
        if round_ % 2 == 1:
            first_s = clock() - pair_start
        else:
            pair_s = first_s + clock() - pair_start
            elapsed = clock() - start
            on_round(round_, round_ + 2 * max(0, int((budget_s - elapsed) // pair_s)))
    return rows


def decided(rows: list[dict], precisions: list[str], confidence: float = STOP_CONFIDENCE) -> bool:
    """Whether the blocks so far already give every mixed precision a verdict (speed_status of its ratio_interval at
    `confidence`): the trial stops there instead of spending the rest of its budget. False without fp32."""
    if REFERENCE not in precisions:
        return False
    per_step = {p: np.array([r["wall_s"] / r["steps"] for r in rows if r["precision"] == p]) for p in precisions}
    return all(speed_status(*map(float, ratio_interval(per_step[REFERENCE], per_step[p], confidence))) != "undecided"
               for p in precisions if p != REFERENCE)


# ---- the child's side --------------------------------------------------------------------------------------------

GO = signal.SIGUSR1  # what a held trial waits for (harness/run/trials.py Ahead.release)


def warm_up(steppers: list[Stepper], steps: int = WARMUP_STEPS) -> None:
    """Every model's first steps (tracing, compilation, first allocations), untimed."""
    for s in steppers:
        s.run(steps)


def hold(progress, timeout_s: float) -> bool:
    """A trial set up ahead, beside the run's last cells: say so (with this process's id, which the harness re-pins
    to every core and signals) and wait for GO. False if it did not come within timeout_s (the harness is gone)."""
    progress.emit(kind="ready", pid=os.getpid())
    if signal.sigtimedwait({GO}, timeout_s) is None:
        return False
    progress.emit(kind="released", cpus=sorted(os.sched_getaffinity(0)))  # the cores its rounds run on
    return True

StepperFactory = Callable[[list[RunConfig], object, object], tuple[list[Stepper], int]]


def trial_main(make_steppers: StepperFactory, argv: list[str] | None = None,
               set_threads: Callable[[int], int] | None = None) -> int:
    """`python -m amp_compare.<twin> --trial trial.json --out trials/<trial-id> --run-id <id> [--init-file f]`: build
    the steppers (the twin's trial.steppers), run the blocks for the configs' trial_budget_s, write trials.parquet
    atomically."""
    from amp_compare.kit.child import Progress, SharedInit
    from amp_compare.kit.data import load_dataset

    parser = argparse.ArgumentParser(description="Run one amp-compare speed trial and write its blocks.")
    parser.add_argument("--trial", required=True, type=Path, help="trial JSON: its configs, fp32's first")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--init-file", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--hold", type=float, default=0.0, help="set up, then wait up to this many seconds for GO")
    args = parser.parse_args(argv)
    if args.hold:  # blocked before any thread starts, so that every thread inherits it and only sigtimedwait takes it
        signal.pthread_sigmask(signal.SIG_BLOCK, {GO})
    try:
        spec = json.loads(args.trial.read_text())
        cfgs = [RunConfig.from_dict(c) for c in spec["configs"]]
    except (OSError, ValueError, KeyError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    progress = Progress()
    data = load_dataset(cfgs[0].dataset, cfgs[0].data_dir)
    steppers, threads = make_steppers(cfgs, data, SharedInit(args.init_file, cfgs[0].framework, cfgs[0].seed))
    # held on one core: one intra-op thread while it warms up where the twin can change it later (torch: two OpenMP
    # threads on one core wait for each other at every op), its threads again once released, and one untimed step
    # each at that count (oneDNN picks its kernels per thread count) before run_blocks times the step that sets k
    adjust = set_threads if args.hold else None
    if adjust:
        adjust(1)
    warm_up(steppers)
    if args.hold and not hold(progress, args.hold):
        print(f"error: set up, but not released within {args.hold:g} s", file=sys.stderr)
        return 3
    if adjust:
        threads = adjust(threads)
        warm_up(steppers, 1)
    blocks = run_blocks(steppers, cfgs[0].trial_budget_s, warmup=0,  # the rounds' budget: set-up comes before it
                        on_round=lambda done, planned: progress.emit(kind="step", epoch=0, epochs=1, step=done,
                                                                     steps=max(planned, done)))
    table = trial_table(args.run_id, cfgs[0], blocks, threads)
    write_trial(args.out, table)
    rounds = max(b["round"] for b in blocks) + 1  # the bar ends full: the rounds run were the trial's (decided/timed)
    progress.emit(kind="step", epoch=0, epochs=1, step=rounds, steps=rounds)
    progress.emit(kind="done")
    return 0


def trial_table(run_id: str, cfg: RunConfig, blocks: list[dict], threads: int) -> pd.DataFrame:
    """The blocks as the trials table (contract/tables.py), contended flags set."""
    table = pd.DataFrame(blocks)
    for key, value in (("run_id", run_id), ("trial_id", trial_id(cfg)), ("framework", cfg.framework),
                       ("model", cfg.model), ("dataset", cfg.dataset), ("batch_size", cfg.batch_size),
                       ("step_loop", cfg.step), ("threads", threads)):
        table[key] = value
    table["contended"] = contended_flags(table, gpu=cfg.device == "cuda")
    return table[list(TRIAL_COLUMNS)]


TRIAL_COLUMNS = ("run_id", "trial_id", "framework", "model", "dataset", "batch_size", "step_loop", "round", "position",
                 "precision", "steps", "wall_s", "cpu_s", "threads", "contended")


def write_trial(out: Path, table: pd.DataFrame) -> None:
    check("trials", table, strict=True)
    out.mkdir(parents=True, exist_ok=True)
    records.atomic_write_table(out / "trials.parquet", table)


# ---- the estimate ------------------------------------------------------------------------------------------------

def sign_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """k: the interval for the median of n values runs from the (k+1)-th smallest to the (k+1)-th largest; -1 where n
    is too small for any interval at this confidence (fewer than 6 values at 95%). k is the largest count with
    P(Binomial(n, 1/2) <= k) <= (1 - confidence) / 2, so the interval covers the median with at least `confidence`
    whatever the values' distribution."""
    alpha, cdf, k = (1 - confidence) / 2, 0.0, -1
    for count in range(n + 1):
        cdf += math.comb(n, count) / 2.0 ** n
        if cdf > alpha:
            break
        k = count
    return k


def median_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, ...]:
    """The median of each row of `values` (..., n) with the sign test's interval; vectorised over the leading axes.
    Low and high are NaN where n is too small for the confidence."""
    values = np.sort(np.asarray(values, dtype=float), axis=-1)
    n = values.shape[-1]
    nan = np.full(values.shape[:-1], np.nan)
    if n == 0:
        return nan, nan, nan
    k = sign_rank(n, confidence)
    if k < 0:
        return np.median(values, axis=-1), nan, nan
    return np.median(values, axis=-1), values[..., k], values[..., n - 1 - k]


def ratio_interval(fp32_step_s: np.ndarray, mixed_step_s: np.ndarray,
                   confidence: float = CONFIDENCE) -> tuple[np.ndarray, ...]:
    """The speed ratio fp32 ÷ mixed per-step time (>1: the mixed precision is faster) with its interval, from the
    rounds' per-step times (..., rounds); vectorised over leading axes."""
    log_ratio = np.log(np.asarray(fp32_step_s, dtype=float)) - np.log(np.asarray(mixed_step_s, dtype=float))
    estimate, low, high = median_interval(log_ratio, confidence)
    return np.exp(estimate), np.exp(low), np.exp(high)


INTERVAL_KIND = "sign test 95% (median of per-round log ratios)"
SUMMARY_KEYS = ("trial_id", "framework", "model", "dataset", "batch_size", "step_loop")


def trial_summary(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per trial × mixed precision: ratio (fp32 per-step time ÷ the mixed one's, >1 faster), its interval, the
    rounds it rests on, the contended blocks among the two precisions' blocks, the median per-step times."""
    columns = [*SUMMARY_KEYS, "precision", "ratio", "low", "high", "interval_kind", "rounds", "contended_blocks",
               "contended_precisions", "fp32_step_s", "mixed_step_s"]
    rows = []
    if trials.empty:
        return pd.DataFrame(columns=columns)
    trials = trials.assign(step_s=trials["wall_s"] / trials["steps"])
    for keys, blocks in trials.groupby(list(SUMMARY_KEYS), sort=False):
        by = blocks.pivot_table(index="round", columns="precision", values="step_s", aggfunc="first")
        if REFERENCE not in by:
            continue
        for precision in [p for p in blocks["precision"].unique() if p != REFERENCE]:
            both = by[[REFERENCE, precision]].dropna()
            ratio, low, high = ratio_interval(both[REFERENCE].to_numpy(), both[precision].to_numpy())
            pair_blocks = blocks[blocks["precision"].isin([REFERENCE, precision])]
            contended = pair_blocks[pair_blocks["contended"].astype(bool)]
            rows.append({**dict(zip(SUMMARY_KEYS, keys)), "precision": precision, "ratio": float(ratio),
                         "low": float(low), "high": float(high), "interval_kind": INTERVAL_KIND,
                         "rounds": int(len(both)), "contended_blocks": int(len(contended)),
                         "contended_precisions": ",".join(sorted(contended["precision"].unique())),
                         "fp32_step_s": float(both[REFERENCE].median()),
                         "mixed_step_s": float(both[precision].median())})
    return pd.DataFrame(rows, columns=columns)


def speed_status(ratio: float, low: float, high: float) -> str:
    """faster (the interval lies above 1×), slower (below), same (inside 0.95-1.05×), else undecided."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "undecided"
    if low > 1:
        return "faster"
    if high < 1:
        return "slower"
    if SAME_BAND[0] <= low and high <= SAME_BAND[1]:
        return "same"
    return "undecided"
