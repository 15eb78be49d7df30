"""The statistics behind every accuracy and speed statement of a report (framework-free; scipy imported where used).

Accuracy: paired by seed and image (one seed: McNemar's exact test, Newcombe's interval; several: a paired bootstrap).
Ratios: a mixed cell over its fp32 cell of the same seed, geometric mean with Student's t over seeds (one seed: speed's
interval from batch means of its timed steps)."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.records import unpack_correct
from amp_compare.kit.data import NUM_CLASSES

ALPHA = 0.05
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261122  # fixed: re-rendering a report gives the same intervals
NOISY_WIDTH = 1.3  # a speed interval whose high end exceeds its low end by more than 30% is noisy
SAME = 0.05  # a ratio within this of 1 whose narrow interval includes 1 is "no difference", not noisy
BLOCK = 20  # steps per batch mean, at least (a load burst of up to ~20 steps stays inside one batch)
MAX_BATCHES = 10  # batch means per cell, at most (longer runs get longer batches)
# The `method` of a paired accuracy comparison (phrases.METHOD words it).
MCNEMAR, BOOTSTRAP, NO_DIFFERENCE = "mcnemar", "bootstrap", "exact_bound"
# What a paired accuracy comparison gives, per mixed group (accuracy_tests' columns beyond the group's keys).
ACC_COLS = ["diff_pp", "ci_low", "ci_high", "p_value", "method", "seeds", "images", "discordant"]


def _no_difference(n: int) -> dict:
    """No image differed: ± the 95% upper bound (Clopper-Pearson, 0 of n) on the share that could differ, in pp."""
    bound = 100.0 * (1.0 - ((1.0 - CONFIDENCE) / 2) ** (1.0 / n))
    return {"ci_low": -bound, "ci_high": bound, "p_value": 1.0, "method": NO_DIFFERENCE}


def _wilson(successes: int, n: int) -> tuple[float, float]:
    z = statistics.NormalDist().inv_cdf(1 - (1 - CONFIDENCE) / 2)
    p = successes / n
    centre, half = (p + z * z / (2 * n)), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def paired_difference_interval(both: int, lost: int, gained: int, neither: int) -> tuple[float, float]:
    """Mixed minus fp32 accuracy's 95% interval from the paired 2x2 counts: Newcombe's method 10 (1998)."""
    n = both + lost + gained + neither
    p_mixed, p_fp32 = (both + gained) / n, (both + lost) / n
    (l1, u1), (l2, u2) = _wilson(both + gained, n), _wilson(both + lost, n)
    den = np.sqrt(float((both + lost) * (gained + neither) * (both + gained) * (lost + neither)))
    phi = (both * neither - lost * gained) / den if den > 0 else 0.0
    d1, e1, d2, e2 = p_mixed - l1, u1 - p_mixed, p_fp32 - l2, u2 - p_fp32
    diff = p_mixed - p_fp32
    return (diff - np.sqrt(max(d1 * d1 - 2 * phi * d1 * e2 + e2 * e2, 0.0)),
            diff + np.sqrt(max(e1 * e1 - 2 * phi * e1 * d2 + d2 * d2, 0.0)))


def sign_test_p(successes: int, n: int) -> float:
    """The exact two-sided binomial test of `successes` in `n` against one half (scipy's binomtest)."""
    tail = sum(math.comb(n, i) for i in range(min(successes, n - successes) + 1))
    return min(1.0, 2 * tail / 2**n)


def mcnemar_exact(fp32: np.ndarray, mixed: np.ndarray) -> dict:
    """McNemar's exact test on one pair of correctness vectors; diff_pp (mixed − fp32, points) with its 95% interval."""
    fp32, mixed = np.asarray(fp32, bool), np.asarray(mixed, bool)
    n, lost, gained = len(fp32), int(np.sum(fp32 & ~mixed)), int(np.sum(~fp32 & mixed))
    if lost + gained == 0:
        return {"diff_pp": 0.0, **_no_difference(n), "discordant": 0, "images": n}
    low, high = paired_difference_interval(int(np.sum(fp32 & mixed)), lost, gained, int(np.sum(~fp32 & ~mixed)))
    return {"diff_pp": 100.0 * (gained - lost) / n, "ci_low": 100.0 * low, "ci_high": 100.0 * high,
            "p_value": sign_test_p(gained, lost + gained), "method": MCNEMAR, "discordant": lost + gained, "images": n}


def paired_bootstrap(fp32: np.ndarray, mixed: np.ndarray) -> dict:
    """Several seeds: arrays of shape (seeds, images), paired by seed and image."""
    fp32, mixed = np.asarray(fp32, float), np.asarray(mixed, float)
    per_image = (mixed - fp32).mean(axis=0)  # mean over seeds, per validation image
    base = {"diff_pp": 100.0 * float(per_image.mean()), "method": BOOTSTRAP, "images": fp32.shape[1],
            "discordant": int(np.sum(fp32 != mixed))}
    if np.all(fp32 == mixed):  # no image differed in any seed: no bootstrap is drawn, the bound is exact
        return {**base, **_no_difference(fp32.shape[1])}
    from scipy import stats as st  # imported here: its import is a quarter of a one-seed report's rendering

    res = st.bootstrap((per_image,), np.mean, confidence_level=CONFIDENCE, n_resamples=BOOTSTRAP_RESAMPLES,
                       method="percentile", rng=np.random.default_rng(BOOTSTRAP_SEED))
    dist = res.bootstrap_distribution
    p = min(1.0, 2 * min(np.mean(dist <= 0), np.mean(dist >= 0)))
    return {**base, "ci_low": 100.0 * res.confidence_interval.low, "ci_high": 100.0 * res.confidence_interval.high,
            "p_value": float(max(p, 1.0 / BOOTSTRAP_RESAMPLES))}


def correct_pairs(base: pd.DataFrame, mine: pd.DataFrame) -> list[tuple[np.ndarray, np.ndarray]]:
    """(base, mine) correctness vectors for each row of `mine` whose seed has a `base` row, both recorded."""
    ref = dict(zip(base["seed"], base["val_correct"]))
    return [(unpack_correct(ref[r.seed], int(r.val_samples)), unpack_correct(r.val_correct, int(r.val_samples)))
            for r in mine.itertuples() if isinstance(ref.get(r.seed), str) and ref[r.seed]
            and isinstance(r.val_correct, str) and r.val_correct]


def paired_test(pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """[(fp32, mixed) correctness per seed]: McNemar's exact test for one seed, the paired bootstrap for several."""
    if len(pairs) == 1:
        return mcnemar_exact(*pairs[0])
    return paired_bootstrap(np.stack([a for a, _ in pairs]), np.stack([b for _, b in pairs]))


def detectable(row) -> bool:
    """p < ALPHA and the 95% interval excludes zero."""
    return bool(row["p_value"] < ALPHA and (row["ci_low"] > 0 or row["ci_high"] < 0))


def ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished cells' rows (none where the table has no status)."""
    return runs[runs["status"] == "ok"] if "status" in runs else runs.iloc[0:0]


def finished(runs: pd.DataFrame) -> pd.DataFrame:
    """The cells that ran to an end, ok or diverged (all where the table has no status)."""
    return runs[runs["status"].isin(["ok", "diverged"])] if "status" in runs else runs


def budgeted(runs: pd.DataFrame) -> pd.Series:
    """Per run row, whether the speed budget stopped the cell early (the run table's budget_steps)."""
    return runs["budget_steps"].notna() if "budget_steps" in runs else pd.Series(False, index=runs.index)


def cut_groups(runs: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Per run row, whether a cell of its group (`keys`, e.g. framework, precision) was stopped by the speed budget."""
    return budgeted(runs).groupby([runs[k] for k in keys], sort=False, dropna=False).transform("any")


def whole_epochs(epochs: pd.DataFrame, steps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """`epochs` less the last, partial one of each cell the speed budget stopped inside an epoch."""
    cut = set(runs.loc[budgeted(runs), "cell_id"])
    if not cut or epochs.empty or steps.empty:
        return epochs
    counts = steps[steps["cell_id"].isin(cut)].groupby(["cell_id", "epoch"]).size()
    partial = set(counts[counts < counts.groupby(level=0).transform("max")].index)
    return epochs[[(c, e) not in partial for c, e in zip(epochs["cell_id"], epochs["epoch"])]]


def accuracy_tests(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per mixed group (keys + precision): the paired test against fp32, budget-cut cells left out."""
    cols = [*keys, "precision", *ACC_COLS]
    runs = runs[~budgeted(runs)]
    if runs.empty or "val_correct" not in runs:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, group in runs.groupby(keys, sort=False, dropna=False):
        fp32 = group[precisions.is_reference(group["precision"])]
        for prec, cells in group[precisions.is_mixed(group["precision"])].groupby("precision", sort=False):
            if pairs := correct_pairs(fp32, cells):
                rows.append({**dict(zip(keys, key)), "precision": prec, "seeds": len(pairs), **paired_test(pairs)})
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=cols)


def chance_accuracy(dataset: str) -> float:
    return 1.0 / NUM_CLASSES.get(dataset, 10)


NEAR_CHANCE = 0.25  # fp32 below chance + 25% of the way from chance to 100%: near chance
STEEP_PP = 2.0  # fp32 still gaining more than this many points in its last epoch: still improving steeply


def too_short(epochs: pd.DataFrame, dataset: str) -> str | None:
    """Why accuracy cannot be compared from these fp32 learning curves (one model/dataset, all seeds), or None."""
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


TARGET_FRACTION = 0.95  # default target: this fraction of the fp32 median final validation accuracy


def time_to_accuracy(epochs: pd.DataFrame, target: float) -> float:
    """Training wall time (s, summed over epochs, validation excluded) until val accuracy >= target; inf if never."""
    if epochs.empty or "epoch" not in epochs:
        return float("nan")  # no per-epoch record: unknown, not "not reached"
    e = epochs.sort_values("epoch")
    reached = e["val_accuracy"].to_numpy(float) >= target
    return float(np.cumsum(e["train_time_s"].to_numpy(float))[np.argmax(reached)]) if reached.any() else float("inf")


def _log_mean_variance(t: np.ndarray) -> tuple[float, float]:
    """(variance, df) of log mean step time from batch means of >= BLOCK steps (delta method); NaN, 0 below two."""
    size = max(BLOCK, -(-t.size // MAX_BATCHES))
    k = t.size // size
    if k < 2:
        return float("nan"), 0.0
    means = t[t.size - k * size:].reshape(k, size).mean(axis=1)  # the remainder dropped from the start
    return float(means.var(ddof=1) / k / float(t.mean()) ** 2), float(k - 1)


def ratio_interval(log_ratios, within_var: float = float("nan"), within_df: float = 0.0) -> dict:
    """Geometric mean of per-seed log ratios, 95% t interval over seeds, else within one (`basis`: which)."""
    r = np.asarray(log_ratios, float)
    r = r[np.isfinite(r)]
    point = float(r.mean()) if r.size else float("nan")
    out = {"ratio": float(np.exp(point)), "low": float("nan"), "high": float("nan"), "seeds": int(r.size), "basis": ""}
    if r.size >= 2:
        se, df, basis = float(r.std(ddof=1) / np.sqrt(r.size)), r.size - 1.0, "seeds"
    elif r.size and np.isfinite(within_var) and within_var >= 0 and (within_df >= 1 or within_var == 0):
        se, df, basis = float(np.sqrt(within_var)), max(float(within_df), 1.0), "steps"  # 0: steps all alike
    else:
        return out
    from scipy import special

    q = float(special.stdtrit(df, 0.5 + CONFIDENCE / 2))  # Student's t quantile (st.t.ppf, without its overhead)
    return {**out, "low": float(np.exp(point - q * se)), "high": float(np.exp(point + q * se)), "basis": basis}


def speed_interval(fp32_steps: list[np.ndarray], mixed_steps: list[np.ndarray],
                   log_ratios: list[float] | None = None) -> dict:
    """Mixed's speed-up over fp32 (ratio_interval) from paired per-seed step times, or given `log_ratios`."""
    fp32, mixed = ([a[np.isfinite(a) & (a > 0)] for a in (np.asarray(x, float) for x in steps)]
                   for steps in (fp32_steps, mixed_steps))
    if log_ratios is None:  # log(mean fp32 step / mean mixed step) = log(mixed / fp32 throughput)
        log_ratios = [float(np.log(a.mean() / b.mean())) if a.size and b.size else float("nan")
                      for a, b in zip(fp32, mixed)]
    within, df = float("nan"), 0.0
    if len(fp32) == 1:  # one seed: its interval can only come from its own steps; Welch-Satterthwaite's df
        (v1, d1), (v2, d2) = _log_mean_variance(fp32[0]), _log_mean_variance(mixed[0])
        den = sum(v * v / d for v, d in ((v1, d1), (v2, d2)) if d > 0)
        within, df = v1 + v2, float((v1 + v2) ** 2 / den) if den > 0 else 0.0
    res = ratio_interval(log_ratios, within, df)
    return {**res, "timed_steps": int(min((min(a.size, b.size) for a, b in zip(fp32, mixed)), default=0))}


def ratio_verdict(ratio: float, low: float, high: float, seeds: int, as_change: bool = False,
                  direction: bool = False) -> str:
    """"" when a ratio stands, else why not (shown with ⚠). as_change: the interval worded as a change (memory);
    direction: a wide interval that excludes 1 stands (speed)."""
    if not np.isfinite(ratio):
        return "no paired cells"
    if not (np.isfinite(low) and np.isfinite(high)) or low <= 0:
        return "one seed: seed-to-seed spread unknown, no interval" if seeds == 1 else "no interval"
    interval = f"{low - 1:+.0%} to {high - 1:+.0%}" if as_change else f"{low:.2f}–{high:.2f}×"
    if high / low > NOISY_WIDTH and not (direction and (low > 1 or high < 1)):
        return f"noisy: interval {interval}"
    if low < 1 < high and abs(ratio - 1) > SAME:
        return f"noisy: interval {interval} includes {'no change' if as_change else '1×'}"
    return ""


MORE_SEEDS = "--seeds 0,1,2 given explicitly"  # by default a CPU runs the vit on one seed (DEFAULT_MODEL_SEEDS)


def log2_histogram(text) -> dict[int, int]:
    """A row's log2_hist (JSON text of {floor(log2|g|): count}) as a dict; {} where absent."""
    try:
        return {int(k): int(v) for k, v in json.loads(text).items()}
    except (TypeError, ValueError):
        return {}
