"""Speed verdicts that hold on a VM that changes speed by itself (issue 32): the drift judgement of
harness/report/drift.py replayed on recorded calibration series, and simulated runs over them judged by the same
tables.speed_statistics a report calls. No training: synthetic run tables, well under a second each."""

import numpy as np
import pandas as pd
import pytest

from amp_compare.contract.config import RunConfig
from amp_compare.harness.report import drift, steadiness
from amp_compare.harness.report.tables import speed_statistics
from amp_compare.harness.run.order import interleaved_order

# 40 back-to-back checks in an idle process, no child running: 3.9 ms for 15 checks, then 5.3-6.2 ms
IDLE_VM = [3.9] * 15 + [5.6, 5.3, 6.1, 5.8, 5.4, 6.2, 5.7, 5.5, 5.9, 6.0, 5.3, 5.8, 6.1, 5.6, 5.4, 5.9, 6.2, 5.5,
                        5.7, 6.0, 5.4, 5.8, 5.6, 6.1, 5.5]
# a default run's between-cell checks: 3.7-11.9 ms (a load that came and went) and one 31 ms hiccup
LOADED_VM = [3.7, 4.0, 4.4, 3.9, 5.1, 6.8, 7.5, 9.2, 11.9, 10.4, 8.1, 6.6, 5.9, 31.0, 5.2, 4.8, 4.3, 4.1, 3.9, 4.6,
             5.5, 4.9, 4.2, 4.0, 3.8, 4.1, 4.4, 4.0, 3.9, 4.2, 4.5, 4.1, 3.8, 4.0, 4.3, 4.1, 3.9, 4.0]


def env(series, cells=None):
    whens = ["before the matrix"] + [f"after {c}" for c in cells or []]
    whens += [f"check {i}" for i in range(len(whens), len(series))]
    return {"calibrations": [{"when": w, "ms": ms, "spread": 0.05} for w, ms in zip(whens, series)]}


def test_a_hiccup_is_set_aside_and_a_lasting_change_is_kept():
    idle = drift.drift_of(env(IDLE_VM))
    assert idle.hiccups == [] and idle.low_ms == 3.9 and idle.high_ms == 6.2
    assert idle.step < 0.1  # one jump in 39 moves is not the typical move
    loaded = drift.drift_of(env(LOADED_VM))
    assert loaded.hiccups == [31.0] and loaded.low_ms == 3.7 and loaded.high_ms == 11.9
    said = steadiness.describe(env(LOADED_VM))
    assert "1 isolated hiccup (31.0 ms) set aside" in said and "3.7–11.9 ms over the run" in said
    assert "busy" not in said and "Re-run on an idle machine" not in said


def test_each_cell_is_judged_against_its_own_neighbouring_checks():
    d = drift.drift_of(env([4.0, 4.0, 8.0, 8.0], cells=["a", "b", "c"]))
    assert d.window("a") == [4.0, 4.0] and d.window("c") == [8.0, 8.0]
    low, high = d.band("a", "c")  # c ran on a machine half as fast: drift alone could give c/a down to 0.5
    assert low < 0.5 * 1.01 and high == pytest.approx(np.exp(d.floor))
    assert drift.seed_note(d, [("a", "c", 0.45, 0)], 0.45) == ""  # beyond what the drift could do
    assert drift.seed_note(d, [("a", "c", 0.6, 0)], 0.6).startswith("machine drift could explain it (seed 0: 0.60×")
    assert drift.seed_note(d, [("a", "c", 1.3, 0)], 1.3) == ""  # drift slowed c: it cannot explain c being faster


FRAMEWORKS, PRECISIONS, SEEDS, MODELS = ("torch", "tf"), ("fp32", "fp16", "bf16"), (0, 1, 2), ("simple_cnn", "vit")
TRUTH = {("torch", "fp16"): 0.12, ("torch", "bf16"): 1.26, ("tf", "fp16"): 0.25, ("tf", "bf16"): 1.0}


def simulated_run(series, rng) -> tuple[pd.DataFrame, dict]:
    """A default-shaped run (2 models x 2 frameworks x 3 precisions x 3 seeds, in the compare's order) whose cells
    ran on a machine as slow as the checks around them say: each cell's speed from a point between its two
    checks (where a jump fell inside the cell is unknown), the hiccup a check-only event, 3% cell noise."""
    cells = [c for m in MODELS for c in interleaved_order(
        [RunConfig(framework=f, precision=p, seed=s, model=m) for s in SEEDS for p in PRECISIONS for f in FRAMEWORKS])]
    level = drift.smoothed(np.asarray(series[:len(cells) + 1], float))
    rows = []
    for i, c in enumerate(cells):
        machine_ms = level[i] + rng.random() * (level[i + 1] - level[i])
        true = TRUTH.get((c.framework, c.precision), 1.0)
        rows.append({"cell_id": c.cell_id, "framework": c.framework, "model": c.model, "dataset": c.dataset,
                     "precision": c.precision, "seed": c.seed, "status": "ok", "peak_memory_bytes": 2**20,
                     "throughput_img_s": 1000 * true / machine_ms * np.exp(rng.normal(0, 0.03))})
    return pd.DataFrame(rows), env(series, [c.cell_id for c in cells])


@pytest.mark.parametrize("series", [IDLE_VM, LOADED_VM], ids=["idle VM", "loaded VM"])
def test_supported_verdicts_agree_between_runs_on_a_drifting_vm(series):
    """Every verdict a run supports has the true direction, so two runs never disagree on one; fp16's 8x slowdown
    is supported in every run, on either machine."""
    rng = np.random.default_rng(32)
    supported: dict[tuple, list[bool]] = {}
    for _ in range(6):
        runs, environment = simulated_run(series, rng)
        stats = speed_statistics(runs, None, environment)
        assert len(stats) == len(MODELS) * len(TRUTH)
        for r in stats.itertuples():
            truth = TRUTH[(r.framework, r.precision)]
            seeds = runs[(runs.framework == r.framework) & (runs.model == r.model)]
            ratio = float(np.exp((np.log(seeds[seeds.precision == r.precision].throughput_img_s.to_numpy())
                                  - np.log(seeds[seeds.precision == "fp32"].throughput_img_s.to_numpy())).mean()))
            if r.speed_note == "":
                assert truth != 1.0 and (ratio > 1) == (truth > 1), (r, ratio)
            supported.setdefault((r.model, r.framework, r.precision), []).append(r.speed_note == "")
    for model in MODELS:
        assert all(supported[(model, "torch", "fp16")]) and all(supported[(model, "tf", "fp16")])
