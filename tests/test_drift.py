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


# the loss-scaling lab's checks (recorded): 316 ms after its first PyTorch fp32 cell, whose 390 images/s was a
# twentieth of the same cell's other seeds, 344 ms after a PyTorch fp16-noscale cell; ~4 ms otherwise
LAB_CELLS = ["torch-simple_cnn-digits-fp32-s0", "tf-simple_cnn-digits-fp32-s0", "torch-simple_cnn-digits-fp16-s0",
             "tf-simple_cnn-digits-fp16-s0", "torch-simple_cnn-digits-fp16-noscale-s0",
             "tf-simple_cnn-digits-fp16-noscale-s0", "torch-simple_cnn-digits-fp16-static-s0",
             "tf-simple_cnn-digits-fp16-static-s0", "torch-simple_cnn-digits-fp16-s1", "tf-simple_cnn-digits-fp16-s1",
             "torch-simple_cnn-digits-fp16-noscale-s1", "tf-simple_cnn-digits-fp16-noscale-s1",
             "torch-simple_cnn-digits-fp16-static-s1", "tf-simple_cnn-digits-fp16-static-s1"]
LAB = [6.433, 315.969, 9.338, 7.805, 7.771, 344.013, 3.771, 3.773, 3.737, 5.773, 4.388, 3.74, 3.937, 3.77, 6.39]


def test_a_check_far_above_the_median_is_a_stall_that_taints_its_neighbouring_cells():
    d = drift.drift_of(env(LAB, LAB_CELLS))
    assert list(d.ms[d.stall]) == [315.969, 344.013]  # both stalls, and no normal check set aside
    assert 6.39 in d.kept and 6.433 in d.kept and d.high_ms == 9.338
    assert set(d.stalled_cells()) == {"torch-simple_cnn-digits-fp32-s0", "tf-simple_cnn-digits-fp32-s0",
                                      "torch-simple_cnn-digits-fp16-noscale-s0",
                                      "tf-simple_cnn-digits-fp16-noscale-s0"}
    # fp16-static's seed 0 read 2.76x from a stalled fp32 cell: the stall (316 ms against 7.8 ms) could explain it
    note = drift.stall_note(d, [("torch-simple_cnn-digits-fp32-s0", "torch-simple_cnn-digits-fp16-static-s0",
                                 2.76, 0)])
    assert note.startswith("stalled cell: torch-simple_cnn-digits-fp32-s0 ran next to a calibration check of 316 ms")
    assert "re-run that cell" in note and "fp16-static-s0" not in note and "seed 0: 2.76× within" in note
    # a stall that slowed the fp32 cell can only raise the ratio: it cannot make fp16 read 0.25x
    assert drift.stall_note(d, [("torch-simple_cnn-digits-fp32-s0", "torch-simple_cnn-digits-fp16-s0", 0.25, 0)]) == ""
    assert drift.stall_note(d, [("torch-simple_cnn-digits-fp16-s1", "torch-simple_cnn-digits-fp16-static-s1",
                                 1.0, 1)]) == ""
    said = steadiness.describe(env(LAB, LAB_CELLS))
    assert "2 checks (316, 344 ms) read more than" in said and "hiccup" not in said
    assert "7 rounds of 20 products" in said and "timed 15 times" not in said


def test_a_lasting_change_is_kept_and_no_normal_check_is_a_stall():
    idle = drift.drift_of(env(IDLE_VM))
    assert not idle.stall.any() and idle.low_ms == 3.9 and idle.high_ms == 6.2
    assert idle.step < 0.1  # one jump in 39 moves is not the typical move
    loaded = drift.drift_of(env(LOADED_VM))
    assert list(loaded.ms[loaded.stall]) == [31.0] and loaded.low_ms == 3.7 and loaded.high_ms == 11.9
    said = steadiness.describe(env(LOADED_VM))
    assert "3.7–11.9 ms" in said and "busy" not in said and "Re-run on an idle machine" not in said


def test_drift_is_judged_between_checks_after_the_same_framework():
    """A check reads higher after TensorFlow cells than after PyTorch ones (6.3 vs 3.8 ms): that alternation is
    the check's, not the machine's, so it is no typical move and no cell's window mixes the two."""
    cells = [f"{fw}-simple_cnn-digits-{p}-s0" for p in ("fp32", "fp16", "bf16", "fp16-static")
             for fw in ("torch", "tf")]
    series = [3.8] + [3.8 if c.startswith("torch") else 6.3 for c in cells]
    d = drift.drift_of(env(series, cells))
    assert d.step == pytest.approx(0.0)
    assert d.window("torch-simple_cnn-digits-fp16-s0") == [3.8]  # the check before it followed a TF cell
    assert d.band("torch-simple_cnn-digits-fp32-s0", "torch-simple_cnn-digits-fp16-s0") == (1.0, 1.0)


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
    level = np.asarray(series[:len(cells) + 1], float)
    level = np.where(level > 3 * np.median(level), np.median(level), level)  # the hiccup: the check's alone
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
            if r.speed_note.startswith("stalled cell"):
                stalled = drift.drift_of(environment).stalled_cells()
                assert any(c in stalled for c in runs[(runs.framework == r.framework) & (runs.model == r.model)
                                                      & runs.precision.isin(["fp32", r.precision])].cell_id)
            if r.speed_note == "":
                assert truth != 1.0 and (ratio > 1) == (truth > 1), (r, ratio)
            supported.setdefault((r.model, r.framework, r.precision), []).append(r.speed_note == "")
    for model in MODELS:  # the one stall (31 ms) leaves the ratios of the cells either side of it unsupported
        assert all(supported[(model, "torch", "fp16")]) or series is LOADED_VM
        assert all(supported[(model, "tf", "fp16")]) or series is LOADED_VM
    assert sum(all(v) for v in supported.values()) >= (2 if series is IDLE_VM else 1)


def lab_run(fp32_s0: float = 390.0, fp16_s0: float = 97.0) -> tuple[pd.DataFrame, dict]:
    """The lab's PyTorch simple_cnn cells (recorded throughputs) with its checks: seed 0's fp32 cell ran as the
    machine stalled (316 ms check after it)."""
    speeds = {("fp32", 0): fp32_s0, ("fp32", 1): 7677, ("fp32", 2): 9273, ("fp16", 0): fp16_s0, ("fp16", 1): 1067,
              ("fp16", 2): 1027, ("fp16-static", 0): 1076, ("fp16-static", 1): 1140, ("fp16-static", 2): 1030}
    rows = [{"cell_id": f"torch-simple_cnn-digits-{p}-s{s}", "framework": "torch", "model": "simple_cnn",
             "dataset": "digits", "precision": p, "seed": s, "status": "ok", "peak_memory_bytes": 2**20,
             "throughput_img_s": float(v)} for (p, s), v in speeds.items()]
    order = [r["cell_id"] for r in rows]
    series = [6.4, 316.0, 9.3, 7.8, 7.8, 3.8, 3.8, 3.7, 5.8, 4.4]
    return pd.DataFrame(rows), env(series, order)


def test_a_ratio_next_to_a_stall_is_not_supported_and_names_the_cell_to_re_run():
    """The lab said "more seeds" for fp16-static's 0.00–29.53 interval that the stall made (seed 0: 2.76× against
    a stalled fp32 cell): it now names the stalled cell and asks for its re-run. fp16's seed 0 (0.25× against that
    same fp32 cell) is no stall's doing (a stall there raises the ratio); its only other check is the stall, so the
    run's whole level is its drift band, and that holds it."""
    from amp_compare.harness.report import answer

    runs, environment = lab_run()
    table = speed_statistics(runs, None, environment).set_index("precision")
    # its band (0.22-2.61x) is wider than drift.WIDE_BAND: the note says the machine moved too much to judge
    assert table.loc["fp16", "speed_note"].startswith("machine drift could explain it: the machine moved too much")
    assert "seed 0: 0.25× within 0.22–2.61×" in table.loc["fp16", "speed_note"]
    for prec in ("fp16-static",):
        note = table.loc[prec, "speed_note"]
        assert note.startswith("stalled cell: torch-simple_cnn-digits-fp32-s0 ran next to a calibration check of "
                               "316 ms"), note
        row = table.loc[[prec]].reset_index().iloc[0]
        verdict, decide = answer._verdict(row)
        assert verdict == "undecided" and decide == answer.DECIDE["stalled"] and "seeds" not in decide
    # the same seeds without the stall: fp16's 8x slowdown stands
    steady, environment = lab_run(8500.0, 1050.0)
    environment["calibrations"][1]["ms"] = 4.0
    assert speed_statistics(steady, None, environment).set_index("precision").loc["fp16", "speed_note"] == ""


def test_a_time_ratio_quotes_its_drift_note_the_same_way_round():
    d = drift.drift_of(env([4.0, 4.0, 8.0, 8.0], cells=["a", "b", "c"]))
    speed = drift.seed_note(d, [("a", "c", 0.6, 0)], 0.6)
    time = drift.seed_note(d, [("a", "c", 0.6, 0)], 0.6, time=True)
    assert "seed 0: 0.60× within" in speed and "seed 0: 1.67× within" in time  # the time ratio is 1 / 0.6


def test_the_forest_rows_of_a_stalled_seed_say_so():
    from amp_compare.harness.report.per_seed import seed_table

    runs, environment = lab_run()
    seeds = seed_table(runs, None, environment)
    # the 316 ms check came after fp32 seed 0 and before fp32 seed 1 (this table's order): it could explain seed 0's
    # 2.76× fp16-static ratio, not seed 0's 0.25× fp16 nor seed 1's 0.14–0.15× (a slower fp32 cell raises a ratio)
    stalled = seeds[seeds["stalled"]]
    assert list(zip(stalled["precision"], stalled["seed"])) == [("fp16-static", 0)]


# the loss-scaling lab's second run (recorded): two 16 ms checks against a 4.1 ms median, after PyTorch's and Keras'
# fp16 cells of seed 0; ~4 ms otherwise
# every cell in run order ("-digits-" left out here); the checks: the one before the matrix, then one after each
LAB2_CELLS = [c.replace("-", "-digits-", 2).replace("-digits-", "-", 1) for c in """
torch-simple_cnn-fp32-s0 tf-simple_cnn-fp32-s0 torch-simple_cnn-fp16-s0 tf-simple_cnn-fp16-s0
torch-simple_cnn-fp16-noscale-s0 tf-simple_cnn-fp16-noscale-s0 torch-simple_cnn-fp16-static-s0
tf-simple_cnn-fp16-static-s0 torch-simple_cnn-fp16-s1 tf-simple_cnn-fp16-s1 torch-simple_cnn-fp16-noscale-s1
tf-simple_cnn-fp16-noscale-s1 torch-simple_cnn-fp16-static-s1 tf-simple_cnn-fp16-static-s1 torch-simple_cnn-fp32-s1
tf-simple_cnn-fp32-s1 torch-simple_cnn-fp16-noscale-s2 tf-simple_cnn-fp16-noscale-s2 torch-simple_cnn-fp16-static-s2
tf-simple_cnn-fp16-static-s2 torch-simple_cnn-fp32-s2 tf-simple_cnn-fp32-s2 torch-simple_cnn-fp16-s2
tf-simple_cnn-fp16-s2 torch-vit-fp32-s0 tf-vit-fp32-s0 torch-vit-fp16-s0 tf-vit-fp16-s0 torch-vit-fp16-noscale-s0
tf-vit-fp16-noscale-s0 torch-vit-fp16-static-s0 tf-vit-fp16-static-s0
""".split()]
LAB2 = [4.287, 4.096, 3.784, 15.687, 16.25, 7.008, 4.248, 3.736, 4.028, 4.115, 3.807, 5.476, 3.772, 4.213, 4.116,
        3.937, 4.138, 3.964, 4.015, 5.717, 6.173, 6.287, 4.027, 6.374, 3.803, 3.742, 3.9, 3.904, 4.12, 6.201, 6.412,
        3.98, 6.435]


def test_a_stall_taints_only_the_ratios_its_size_could_explain():
    """A 16 ms stall (3.9x the median) next to PyTorch fp16's seed-0 cell cannot make its 0.111x (9x slower), nor
    fp16-noscale's 0.104x; it could make Keras fp16's 0.225x (the band with the stall: 0.16–1.50x)."""
    d = drift.drift_of(env(LAB2, LAB2_CELLS))
    assert list(d.ms[d.stall]) == [15.687, 16.25]
    for prec, ratio in (("fp16", 0.111), ("fp16-noscale", 0.104)):
        pair = ("torch-simple_cnn-digits-fp32-s0", f"torch-simple_cnn-digits-{prec}-s0", ratio, 0)
        assert drift.stall_note(d, [pair]) == "", prec
        assert drift.seed_note(d, [pair], ratio) == "", prec
    keras = drift.stall_note(d, [("tf-simple_cnn-digits-fp32-s0", "tf-simple_cnn-digits-fp16-s0", 0.225, 0)])
    assert keras.startswith("stalled cell: tf-simple_cnn-digits-fp16-s0 ran next to a calibration check of 16 ms")
    low, high = d.band("tf-simple_cnn-digits-fp32-s0", "tf-simple_cnn-digits-fp16-s0", stalls=True)
    assert low == pytest.approx(3.784 / 16.25 / np.exp(d.floor)) and low < 0.225 < high
