"""The benchmarks' statistics (benchmarks/overhead.py, amp_speed.py), on recorded-style numbers.

The timings below have the shape measured on a 2-core VM (2026-11-23): TensorFlow ran each fit() call on
either ~1.9 or ~1.0 cores, at random, so a round whose two calls landed in different regimes compares the
scheduler, not the loops. The bench's own functions are tested: regimes, paired, verdict.
"""

from __future__ import annotations

import numpy as np

from benchmarks.overhead import paired, regimes, verdict

CPU_STEP = 0.121  # s of CPU per step, the same in both regimes
FAST, SLOW = 0.062, 0.116  # s of wall per step on ~1.9 and ~1.0 cores


def _cell(suite_slow, minimal_slow, overhead=1.0, rng=None):
    """wall and cpu dicts of one cell: per-round seconds per step, a regime chosen per call."""
    rng = rng or np.random.default_rng(0)
    wall, cpu = {}, {}
    for name, slow, extra in (("suite", suite_slow, overhead), ("minimal", minimal_slow, 1.0),
                              ("in-memory", [False] * len(suite_slow), 1.0)):
        jitter = 1 + rng.normal(0, 0.003, len(slow))
        wall[name] = list(np.where(slow, SLOW, FAST) * extra * jitter)
        cpu[name] = list(CPU_STEP * extra * jitter)
    return wall, cpu


def test_one_regime_is_not_split():
    rng = np.random.default_rng(1)
    assert regimes(1.9 + rng.normal(0, 0.02, 30)) is None
    assert regimes(np.array([1.9])) is None


def test_two_regimes_are_found_even_when_close():
    # fp16's two regimes were 1.86 and 1.60 cores busy
    cores = np.array([1.86, 1.61, 1.85, 1.59, 1.86, 1.60])
    assert list(regimes(cores)) == [1, 0, 1, 0, 1, 0]


def test_mixed_regime_rounds_are_set_aside_and_the_ratio_comes_from_the_rest():
    suite_slow = [False, True, False, True, True, False, False, True, False, True, False, True]
    minimal_slow = [True, False, False, True, False, False, True, True, True, False, False, True]
    wall, cpu = _cell(suite_slow, minimal_slow, overhead=1.02)
    ov = paired(wall, cpu, "suite", "minimal")
    same = sum(a == b for a, b in zip(suite_slow, minimal_slow))
    assert ov["bimodal"] and ov["same_pairs"] == same < ov["pairs"]
    ratio, lo, hi = ov["same"]
    assert lo < 1.02 < hi and hi / lo - 1 < 0.02  # tight around the true overhead
    all_ratio, all_lo, all_hi = ov["all"]
    assert all_hi / all_lo - 1 > 0.5  # all rounds: the scheduler's 1.9x swamps it
    assert abs(ov["cpu"][0] - 1.02) < 0.005
    assert ov["slow_calls"] == {"suite": sum(suite_slow), "minimal": sum(minimal_slow), "in-memory": 0}
    text = verdict({"overhead": ov}, 0.05)
    assert text.startswith("<= 1.05") and "two scheduling regimes" in text and "follows the loop" not in text


def test_a_regime_that_follows_the_loop_is_called_overhead():
    # the suite lands in the slow regime in every mixed round: that is the suite's cost, not noise
    suite_slow = [True] * 8 + [False] * 4
    minimal_slow = [False] * 8 + [False] * 4
    wall, cpu = _cell(suite_slow, minimal_slow)
    ov = paired(wall, cpu, "suite", "minimal")
    assert ov["num_slow_of_mixed"] == (8, 8)
    assert "the regime follows the loop" in verdict({"overhead": ov}, 0.05)


def test_a_unimodal_cell_is_judged_on_all_rounds():
    wall, cpu = _cell([False] * 10, [False] * 10, overhead=1.10)
    ov = paired(wall, cpu, "suite", "minimal")
    assert not ov["bimodal"] and ov["same"] == ov["all"] and ov["same_pairs"] == 10
    assert verdict({"overhead": ov}, 0.05).startswith("> 1.05")


def test_the_speed_benchmark_says_whether_its_intervals_overlap():
    from benchmarks.amp_speed import overlap

    assert overlap([(0.14, 0.16), (0.15, 0.17), (0.155, 0.2)])
    assert not overlap([(0.14, 0.16), (0.15, 0.17), (0.165, 0.2)])  # the first and the last share no point
    assert overlap([(0.14, 0.16), (float("nan"), float("nan")), (0.15, 0.2)]) is None  # one trial without an interval


def test_a_gpu_run_is_not_split_into_regimes():
    # on a GPU the host's CPU time is waiting as much as working: two clusters of it mean nothing
    wall, cpu = _cell([False, True] * 5, [True, False] * 5)
    ov = paired(wall, cpu, "suite", "minimal", split=False)
    assert not ov["bimodal"] and ov["same_pairs"] == ov["pairs"] == 10
