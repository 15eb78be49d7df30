"""The statistics behind every accuracy and speed statement of a report (framework-free, scipy).

Accuracy. Cells of one model/dataset/seed start from the same weights and are scored on the
same validation images, so mixed precision against fp32 is a *paired* comparison. Each cell
records which validation images its final model classified correctly (`val_correct`, a packed
bit array, base64). From those:

- one seed: McNemar's exact test — of the images exactly one of the two models got right
  (the discordant pairs), is the split away from 50:50? (`scipy.stats.binomtest`). The interval
  is the Clopper-Pearson interval of that split, mapped to a difference in accuracy.
- several seeds: a paired bootstrap over validation images — each resample draws the same images
  for every seed and both precisions, and the statistic is the mean over seeds of the accuracy
  difference (`scipy.stats.bootstrap`); its two-sided p-value is read off the bootstrap
  distribution. A sign test of the per-seed differences (`binomtest`) is kept beside it.

A difference is "detectable" only when p < ALPHA *and* the 95% interval excludes zero.

Speed. A speed ratio is fp32's median step time over the mixed cell's. Its interval comes from a
moving-block bootstrap of the timed steps of every cell (blocks keep the slow stretches a load
change causes together), recomputing the summary's own statistic: the median over seeds of mixed's
throughput over the median over seeds of fp32's. A ratio is
marked noisy when that interval is wide (high/low > NOISY_WIDTH) or straddles 1, or when too few
steps were timed to judge.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as st

from amp_compare.contract import precision as precisions
from amp_compare.contract.records import unpack_correct

ALPHA = 0.05
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261122  # fixed: re-rendering a report gives the same intervals
NOISY_WIDTH = 1.3  # a speed interval whose high end exceeds its low end by more than 30% is noisy
MIN_TIMED_STEPS = 20  # fewer timed steps per cell than this: no speed ratio is stated with confidence
BLOCK = 10  # steps per bootstrap block


# ---- accuracy ----------------------------------------------------------------------------------

def no_discordance_bound(n: int) -> float:
    """No image differed: the 95% upper bound (Clopper-Pearson, 0 of n) on the share of images that could
    differ, in percentage points — the interval is ± this, not [0, 0]."""
    return 100.0 * (1.0 - ((1.0 - CONFIDENCE) / 2) ** (1.0 / n))


def mcnemar_exact(fp32: np.ndarray, mixed: np.ndarray) -> dict:
    """McNemar's exact test on one pair of per-example correctness vectors.

    diff_pp is mixed minus fp32 accuracy in percentage points, with a 95% interval."""
    fp32, mixed = np.asarray(fp32, bool), np.asarray(mixed, bool)
    n = len(fp32)
    lost = int(np.sum(fp32 & ~mixed))  # right in fp32, wrong in mixed
    gained = int(np.sum(~fp32 & mixed))
    k = lost + gained
    diff = 100.0 * (gained - lost) / n
    if k == 0:
        bound = no_discordance_bound(n)
        return {"diff_pp": 0.0, "ci_low": -bound, "ci_high": bound, "p_value": 1.0, "test": "McNemar exact",
                "discordant": 0, "images": n}
    res = st.binomtest(gained, k, 0.5)
    ci = res.proportion_ci(confidence_level=CONFIDENCE, method="exact")
    scale = 100.0 * k / n  # diff = k/n * (2*share_gained - 1)
    return {"diff_pp": diff, "ci_low": scale * (2 * ci.low - 1), "ci_high": scale * (2 * ci.high - 1),
            "p_value": float(res.pvalue), "test": "McNemar exact", "discordant": k, "images": n}


def paired_bootstrap(fp32: np.ndarray, mixed: np.ndarray) -> dict:
    """Several seeds: arrays of shape (seeds, images), paired by seed and image."""
    fp32, mixed = np.asarray(fp32, float), np.asarray(mixed, float)
    per_image = (mixed - fp32).mean(axis=0)  # mean over seeds, per validation image
    diff = 100.0 * float(per_image.mean())
    per_seed = 100.0 * (mixed - fp32).mean(axis=1)
    nonzero = per_seed[per_seed != 0]
    sign_p = float(st.binomtest(int((nonzero > 0).sum()), len(nonzero), 0.5).pvalue) if len(nonzero) else 1.0
    base = {"diff_pp": diff, "test": f"paired bootstrap over images, {len(fp32)} seeds", "images": fp32.shape[1],
            "discordant": int(np.sum(fp32 != mixed)), "sign_test_p": sign_p,
            "seeds_lower": int((per_seed < 0).sum()), "seeds_higher": int((per_seed > 0).sum())}
    if np.all(fp32 == mixed):  # no image differed in any seed
        bound = no_discordance_bound(fp32.shape[1])
        return {**base, "ci_low": -bound, "ci_high": bound, "p_value": 1.0}
    res = st.bootstrap((per_image,), np.mean, confidence_level=CONFIDENCE, n_resamples=BOOTSTRAP_RESAMPLES,
                       method="percentile", rng=np.random.default_rng(BOOTSTRAP_SEED))
    dist = res.bootstrap_distribution
    p = min(1.0, 2 * min(np.mean(dist <= 0), np.mean(dist >= 0)))
    return {**base, "ci_low": 100.0 * res.confidence_interval.low, "ci_high": 100.0 * res.confidence_interval.high,
            "p_value": float(max(p, 1.0 / BOOTSTRAP_RESAMPLES))}


def detectable(row) -> bool:
    return bool(row["p_value"] < ALPHA and (row["ci_low"] > 0 or row["ci_high"] < 0))


def accuracy_tests(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per mixed group (keys + precision): the paired test against the same framework's fp32.

    `runs` are finished cells with columns keys, precision, seed, val_samples and val_correct."""
    cols = [*keys, "precision", "diff_pp", "ci_low", "ci_high", "p_value", "test", "seeds", "images", "discordant"]
    if runs.empty or "val_correct" not in runs:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, group in runs.groupby(keys, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        fp32 = {r.seed: r for r in group[precisions.is_reference(group["precision"])].itertuples()}
        for prec, cells in group[precisions.is_mixed(group["precision"])].groupby("precision", sort=False):
            pairs = []
            for r in cells.itertuples():
                base = fp32.get(r.seed)
                if base is None or not isinstance(r.val_correct, str) or not isinstance(base.val_correct, str) \
                        or not r.val_correct or not base.val_correct:
                    continue
                n = int(r.val_samples)
                pairs.append((unpack_correct(base.val_correct, n), unpack_correct(r.val_correct, n)))
            if not pairs:
                continue
            if len(pairs) == 1:
                res = mcnemar_exact(*pairs[0])
            else:
                res = paired_bootstrap(np.stack([a for a, _ in pairs]), np.stack([b for _, b in pairs]))
            rows.append({**dict(zip(keys, key)), "precision": prec, "seeds": len(pairs), **res})
    out = pd.DataFrame(rows)
    return out if not out.empty else pd.DataFrame(columns=cols)


def chance_accuracy(dataset: str) -> float:
    from amp_compare.kit.data import NUM_CLASSES

    return 1.0 / NUM_CLASSES.get(dataset, 10)


NEAR_CHANCE = 0.25  # fp32 below chance + 25% of the way from chance to 100%: near chance
STEEP_PP = 2.0  # fp32 still gaining more than this many points in its last epoch: still improving steeply


def too_short(epochs: pd.DataFrame, dataset: str) -> str | None:
    """Why accuracy cannot be compared from these fp32 learning curves (epochs of the fp32 cells of one
    model/dataset, all seeds), or None when it can."""
    if epochs.empty:
        return "fp32 recorded no validation accuracy"
    chance = chance_accuracy(dataset)
    curves = [g.sort_values("epoch")["val_accuracy"].to_numpy(float) for _, g in epochs.groupby("cell_id")]
    final = float(np.median([c[-1] for c in curves]))
    n_epochs = int(np.median([len(c) for c in curves]))
    if final < chance + NEAR_CHANCE * (1 - chance):
        return (f"fp32 reached only {final:.1%} after {n_epochs} epoch{'s' if n_epochs != 1 else ''} "
                f"(chance is {chance:.0%})")
    if n_epochs < 2:
        return f"fp32 trained for a single epoch ({final:.1%}), so whether it had finished learning is unknown"
    gain = float(np.median([100 * (c[-1] - c[-2]) for c in curves]))
    if gain > STEEP_PP:
        return f"fp32 was still improving steeply ({gain:+.1f} points in its last epoch, at {final:.1%})"
    return None


# ---- time to accuracy ---------------------------------------------------------------------------

TARGET_FRACTION = 0.95  # default target: this fraction of the fp32 median final validation accuracy


def time_to_accuracy(epochs: pd.DataFrame, target: float) -> float:
    """Training wall time (s, cumulative over epochs, validation excluded) until val accuracy >= target;
    inf when not reached."""
    if epochs.empty or "epoch" not in epochs:
        return float("nan")  # no per-epoch record: unknown, not "not reached"
    e = epochs.sort_values("epoch")
    reached = (e["val_accuracy"].to_numpy(float) >= target)
    if not reached.any():
        return float("inf")
    return float(np.cumsum(e["train_time_s"].to_numpy(float))[int(np.argmax(reached))])


# ---- speed --------------------------------------------------------------------------------------

def _block_resample(times: np.ndarray, rng: np.random.Generator, reps: int) -> np.ndarray:
    """Moving-block bootstrap medians: shape (reps,)."""
    n = len(times)
    block = min(BLOCK, max(1, n // 4))
    starts = rng.integers(0, n - block + 1, size=(reps, -(-n // block)))
    idx = (starts[..., None] + np.arange(block)).reshape(reps, -1)[:, :n]
    return np.median(times[idx], axis=1)


def speed_interval(fp32_steps: list[np.ndarray], mixed_steps: list[np.ndarray], reps: int = 1000) -> dict:
    """Mixed's speed-up against fp32 as the summary table computes it (median over seeds of each cell's
    throughput, batch / median step, mixed over fp32) with a 95% block-bootstrap interval of that same
    statistic; lists hold one array of timed step times per seed."""
    pairs = [(np.asarray(a, float), np.asarray(b, float)) for a, b in zip(fp32_steps, mixed_steps)]
    pairs = [(a[np.isfinite(a)], b[np.isfinite(b)]) for a, b in pairs]
    pairs = [(a, b) for a, b in pairs if len(a) and len(b)]
    if not pairs:
        return {"ratio": float("nan"), "low": float("nan"), "high": float("nan"), "timed_steps": 0,
                "spread_p90_p50": float("nan")}
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    # The summary's ratio: median over seeds of mixed's throughput (1 / median step) over the same for fp32.
    point = float(np.median([1 / np.median(b) for _, b in pairs]) / np.median([1 / np.median(a) for a, _ in pairs]))
    fp32_boot = np.median(np.stack([1 / _block_resample(a, rng, reps) for a, _ in pairs]), axis=0)
    mixed_boot = np.median(np.stack([1 / _block_resample(b, rng, reps) for _, b in pairs]), axis=0)
    boot = mixed_boot / fp32_boot
    spread = max(float(np.percentile(x, 90) / np.median(x)) for pair in pairs for x in pair)
    return {"ratio": point, "low": float(np.percentile(boot, 2.5)), "high": float(np.percentile(boot, 97.5)),
            "timed_steps": int(min(min(len(a), len(b)) for a, b in pairs)), "spread_p90_p50": spread}


def speed_verdict(ratio: float, low: float, high: float, timed_steps: int, machine_drift: float | None = None) -> str:
    """"" when the ratio stands; otherwise why it does not (shown next to the number)."""
    if timed_steps < MIN_TIMED_STEPS:
        return f"too few timed steps ({timed_steps}) to judge"
    if not (np.isfinite(low) and np.isfinite(high)) or low <= 0:
        return "no interval"
    if machine_drift is not None and machine_drift > CALIBRATION_DRIFT:
        return f"machine speed changed by {machine_drift:.0%} during the run"
    if high / low > NOISY_WIDTH:
        return f"noisy: interval {low:.2f}–{high:.2f}×"
    if low < 1 < high and abs(ratio - 1) > 0.05:
        return f"noisy: interval {low:.2f}–{high:.2f}× includes 1×"
    return ""


CALIBRATION_DRIFT = 0.25  # calibration before and after the matrix differing by more than this: unsteady
