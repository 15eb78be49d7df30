"""The printed 95% intervals cover what they claim: a simulation of step-time tables with a known ratio (issue 28).

Each simulated run is a compare's timed steps for one framework's fp32 and mixed cells over 1, 3 or 5 seeds,
with the noise a shared CPU gives (the numbers are this project's model of it, chosen to be harder than an
idle machine, not fitted to pass):

- seed level: a factor shared by both cells of a seed (the machine's state during that seed, sd 10% in log),
  and one per cell (sd 8%);
- an occasional slow cell: with probability 0.1 per seed, one of its two cells (either, at random) runs
  1.2-1.8x slower throughout (load that came during one cell, as seed 0 of issue 28's bf16 row, 0.70x
  against 1.05x and 1.06x);
- step level: AR(1) noise on the log step time (phi 0.7, innovations sd 15%), and with probability 0.3 per
  cell a burst of 5-30 steps at 1.5-3x.

The true ratio is 1.3. With several seeds the interval claims the ratio itself; with one seed it claims
only that seed's two cells' ratio (its cell factors included: seed-to-seed spread is unknown and the
report says so), so that is what it is checked against. Observed coverage over 1000 runs must lie in
93-97% (the binomial standard error at 95% is 0.7 points). Seen here: 1 seed 94.8%, 3 seeds 96.5%,
5 seeds 95.8% (docs/ARCHITECTURE.md, measurement protocol).
"""

import numpy as np
import pytest

from amp_compare.harness.report import stats

RUNS, STEPS, RATIO = 1000, 200, 1.3


def simulate(rng: np.random.Generator, runs: int, seeds: int, ratio: float = RATIO, steps: int = STEPS):
    """Step times of shape (runs, seeds, 2 cells [fp32, mixed], steps) and each seed's own cell ratio."""
    shared = rng.normal(0, 0.10, (runs, seeds, 1))
    cell = rng.normal(0, 0.08, (runs, seeds, 2))
    slow = (rng.random((runs, seeds)) < 0.1) * rng.uniform(np.log(1.2), np.log(1.8), (runs, seeds))
    which = rng.integers(0, 2, (runs, seeds))
    cell[..., 0] += slow * (which == 0)
    cell[..., 1] += slow * (which == 1)
    phi, sigma = 0.7, 0.15
    innovations = rng.normal(0, sigma, (runs, seeds, 2, steps))
    noise = np.empty_like(innovations)
    noise[..., 0] = innovations[..., 0] / np.sqrt(1 - phi**2)
    for i in range(1, steps):
        noise[..., i] = phi * noise[..., i - 1] + innovations[..., i]
    start = rng.integers(0, steps, (runs, seeds, 2, 1))
    length = rng.integers(5, 31, (runs, seeds, 2, 1))
    idx = np.arange(steps)
    burst = ((rng.random((runs, seeds, 2, 1)) < 0.3) & (idx >= start) & (idx < start + length)) \
        * rng.uniform(np.log(1.5), np.log(3.0), (runs, seeds, 2, 1))
    base = np.array([0.010, 0.010 / ratio])[None, None, :, None]
    times = base * np.exp(shared[..., None] + cell[..., None] + noise + burst)
    return times, ratio * np.exp(cell[..., 0] - cell[..., 1])


def coverage(seeds: int, runs: int = RUNS, seed: int = 28) -> float:
    """The share of simulated runs whose printed 95% interval (stats.speed_interval, as the report makes it)
    holds what it claims: the true ratio, or with one seed that seed's own."""
    times, own = simulate(np.random.default_rng(seed + seeds), runs, seeds)
    hits = 0
    for r in range(runs):
        res = stats.speed_interval(list(times[r, :, 0]), list(times[r, :, 1]))
        target = own[r, 0] if seeds == 1 else RATIO
        hits += res["low"] <= target <= res["high"]
        assert res["basis"] == ("steps" if seeds == 1 else "seeds")
    return hits / runs


@pytest.mark.parametrize("seeds", [1, 3, 5])
def test_printed_interval_covers_the_true_ratio(seeds):
    observed = coverage(seeds)
    assert 0.93 <= observed <= 0.97, observed


def test_a_seed_level_bootstrap_alone_would_not_cover():
    """Why the interval is Student's t on the seeds' ratios: a percentile bootstrap over 3 seeds' ratios (what
    resampling seeds alone gives) covers far less than 95%, and the within-seed interval alone (step noise)
    less still, on the same simulated runs."""
    times, _ = simulate(np.random.default_rng(31), 400, 3)
    rng = np.random.default_rng(0)
    boot_hits = within_hits = 0
    for r in range(400):
        logs = np.log(times[r, :, 0].mean(axis=1) / times[r, :, 1].mean(axis=1))
        means = logs[rng.integers(0, 3, (2000, 3))].mean(axis=1)
        boot_hits += np.exp(np.percentile(means, 2.5)) <= RATIO <= np.exp(np.percentile(means, 97.5))
        one = stats.speed_interval([times[r, 0, 0]], [times[r, 0, 1]])
        within_hits += one["low"] <= RATIO <= one["high"]
    assert boot_hits / 400 < 0.85 and within_hits / 400 < 0.85, (boot_hits, within_hits)
