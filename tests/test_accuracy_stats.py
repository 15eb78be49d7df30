"""The statistics behind accuracy and speed statements, the cell order and the calibration (issue 14)."""

import numpy as np
import pandas as pd
import pytest

from amp_compare.contract import records
from amp_compare.contract.config import RunConfig
from amp_compare.harness.report import speed, stats
from amp_compare.harness.run import calibrate
from amp_compare.harness.run.order import interleaved_order
from amp_compare.kit.data import load_synthetic, load_synthetic_cifar


def test_correctness_round_trips_in_one_bit_per_image():
    correct = np.random.default_rng(0).random(359) < 0.9
    packed = records.pack_correct(correct)
    assert len(packed) <= 4 * (359 // 8 + 1) // 3 + 4  # base64 of 45 bytes
    assert np.array_equal(records.unpack_correct(packed, 359), correct)
    with pytest.raises(ValueError, match="fewer than"):
        records.unpack_correct(packed, 400)


def test_mcnemar_matches_the_exact_binomial_on_discordant_pairs():
    fp32 = np.ones(400, bool)
    mixed = fp32.copy()
    mixed[:12] = False  # 12 images lost, 2 gained
    fp32[398:] = False
    res = stats.mcnemar_exact(fp32, mixed)
    assert res["discordant"] == 14
    assert res["diff_pp"] == pytest.approx(100 * (2 - 12) / 400)
    # two-sided exact binomial P(X <= 2 or X >= 12 | n=14, 1/2) = 2 * 106 / 16384
    assert res["p_value"] == pytest.approx(2 * (1 + 14 + 91) / 2**14)
    assert res["ci_low"] < res["diff_pp"] < res["ci_high"] < 0
    # every differing image went one way: the interval of the accuracy difference still reaches past the
    # estimate (the discordant split's own interval, which holds their number fixed, ended exactly at it)
    one_way = fp32.copy()
    one_way[:2] = ~fp32[:2] | True
    one_way[398:] = True
    res = stats.mcnemar_exact(fp32, one_way)
    assert res["discordant"] == 2 and res["diff_pp"] == pytest.approx(0.5)
    assert res["ci_low"] < 0 < res["diff_pp"] < res["ci_high"] - 0.5, res
    # large counts: Newcombe's interval is close to the Wald interval of a paired difference
    low, high = stats.paired_difference_interval(800, 30, 50, 120)
    wald = 1.96 * np.sqrt(80 / 1000**2 - 20**2 / 1000**3)
    assert low == pytest.approx(0.02 - wald, abs=1e-3) and high == pytest.approx(0.02 + wald, abs=1e-3)
    same = stats.mcnemar_exact(fp32, fp32)
    # no image differed: the interval is the 0-of-400 Clopper-Pearson bound, not a false [0, 0]
    assert same["p_value"] == 1.0 and same["diff_pp"] == 0.0
    assert same["ci_high"] == -same["ci_low"] == pytest.approx(100 * (1 - 0.025 ** (1 / 400)))


def test_the_sign_test_is_scipys_exact_binomial_test_at_one_half():
    from scipy.stats import binomtest  # stats.py does without it: its import is a quarter of a report's rendering

    for n in (1, 2, 7, 14, 40, 101):
        for k in range(n + 1):
            assert stats.sign_test_p(k, n) == pytest.approx(binomtest(k, n, 0.5).pvalue, rel=1e-12), (k, n)


def test_paired_bootstrap_over_seeds_finds_a_consistent_drop_and_not_noise():
    rng = np.random.default_rng(1)
    fp32 = rng.random((3, 400)) < 0.9
    drop = fp32.copy()
    drop[:, :20] = False  # every seed loses the same 20 (or fewer) images
    res = stats.paired_bootstrap(fp32, drop)
    assert res["p_value"] < 0.01 and res["ci_high"] < 0 and stats.detectable(res)
    noise = fp32.copy()
    for s in range(3):  # three images flip each way in each seed
        noise[s, rng.choice(np.flatnonzero(fp32[s]), 3, replace=False)] = False
        noise[s, rng.choice(np.flatnonzero(~fp32[s]), 3, replace=False)] = True
    res = stats.paired_bootstrap(fp32, noise)
    assert not stats.detectable(res) and res["ci_low"] < 0 < res["ci_high"]


def test_too_short_names_near_chance_single_epoch_and_steep_curves():
    def epochs(curve):
        return pd.DataFrame({"cell_id": "c", "epoch": range(len(curve)), "val_accuracy": curve})

    assert "only 12.0% after 3 epochs (chance is 10%)" in stats.too_short(epochs([0.1, 0.11, 0.12]), "digits")
    assert "single epoch" in stats.too_short(epochs([0.8]), "digits")
    assert "still improving steeply (+10.0 points" in stats.too_short(epochs([0.5, 0.7, 0.8]), "digits")
    assert stats.too_short(epochs([0.95, 0.985, 0.99]), "digits") is None


def test_time_to_accuracy_is_training_time_until_the_first_epoch_at_target():
    e = pd.DataFrame({"epoch": [0, 1, 2], "val_accuracy": [0.5, 0.91, 0.95], "train_time_s": [2.0, 3.0, 4.0]})
    assert stats.time_to_accuracy(e, 0.9) == 5.0
    assert stats.time_to_accuracy(e, 0.99) == float("inf")


def test_speed_interval_is_narrow_on_steady_steps_and_flagged_on_noisy_ones():
    rng = np.random.default_rng(2)
    steady = stats.speed_interval([0.010 + rng.normal(0, 1e-4, 200)], [0.020 + rng.normal(0, 2e-4, 200)])
    assert steady["ratio"] == pytest.approx(0.5, rel=0.02) and steady["basis"] == "steps"
    # load switching on and off in stretches: step times jump 5x for blocks of steps
    load = np.repeat(rng.random(20) < 0.5, 10) * 4 + 1
    noisy = stats.speed_interval([0.010 * load], [0.012 * load[::-1]])
    assert noisy["low"] < 1 < noisy["high"]
    # as wide, but wholly below 1: the direction stands (issue 32), the interval printed beside it says how well
    wide = stats.speed_interval([0.010 * load], [0.020 * load[::-1]])
    assert wide["high"] / wide["low"] > stats.NOISY_WIDTH and wide["high"] < 1


def test_several_seeds_give_an_interval_that_holds_their_own_ratios():
    """Issue 28's default run: PyTorch bf16 per-seed ratios 0.70, 1.05, 1.06 were printed "1.04× [1.02–1.05]",
    two of three seeds outside. The interval over seeds holds every seed's ratio and is flagged."""
    rng = np.random.default_rng(5)
    fp32 = [0.010 * (1 + 0.01 * rng.random(200)) for _ in range(3)]
    mixed = [a / r for a, r in zip(fp32, (0.70, 1.05, 1.06))]
    res = stats.speed_interval(fp32, mixed)
    assert res["basis"] == "seeds" and res["seeds"] == 3
    assert res["ratio"] == pytest.approx(np.exp(np.mean(np.log([0.70, 1.05, 1.06]))), rel=1e-3)  # 0.92
    assert res["low"] < 0.70 and res["high"] > 1.06
    keras = stats.speed_interval(fp32, [a / r for a, r in zip(fp32, (0.22, 0.14, 0.26))])
    assert keras["low"] < 0.14 and keras["high"] > 0.26  # issue 28: "0.23× [0.22–0.23]"
    # one seed: the interval is its own steps', and a missing interval says why
    one = stats.ratio_interval([np.log(0.9)])
    assert np.isnan(one["low"]) and stats.ratio_verdict(one["ratio"], one["low"], one["high"], 1) == \
        "one seed: seed-to-seed spread unknown, no interval"


def test_interleaved_order_rotates_precisions_over_seeds_and_keeps_every_cell():
    cells = [RunConfig(framework=fw, precision=p, seed=s) for s in (0, 1, 2) for p in ("fp32", "fp16", "bf16")
             for fw in ("torch", "tf")]
    order = interleaved_order(cells)
    assert sorted(c.cell_id for c in order) == sorted(c.cell_id for c in cells)
    firsts = [[c.precision for c in order if c.seed == s][::2] for s in (0, 1, 2)]
    assert firsts == [["fp32", "fp16", "bf16"], ["fp16", "bf16", "fp32"], ["bf16", "fp32", "fp16"]]
    # every precision in every position exactly once over the three repeats (a Latin square)
    for position in range(3):
        assert sorted(f[position] for f in firsts) == ["bf16", "fp16", "fp32"]
    assert [c.framework for c in order[:2]] == ["torch", "tf"]
    assert interleaved_order(cells) == order  # pure: same matrix, same order


def test_the_machine_note_is_one_line_from_the_recorded_checks():
    """How busy the machine was is a note (speed.machine_note) from the checks the run recorded; no verdict reads it."""
    check = calibrate.check("before the matrix")
    assert check["ms"] > 0 and check["spread"] >= 0 and check["when"] == "before the matrix"
    assert speed.machine_note({}) == "" and speed.machine_note({"calibrations": [{"ms": 3.0}]}) == ""
    whens = ("before the matrix", "after torch-a", "after tf-a", "after the matrix")
    checks = {"calibrations": [{"when": w, "ms": ms} for w, ms in zip(whens, (3.0, 31.0, 3.1, 3.1))]}
    assert speed.machine_note(checks) == ("How busy the machine was: 4 calibration checks (a fixed 256×256 float32 "
                                          "matmul timed before the cells, between them and after them, while no cell "
                                          "ran) read 3.0–31.0 ms, median 3.1 ms.")
    # cells at once: no check between them, and the note does not say there was one
    at_once = {"calibrations": [{"when": w, "ms": 6.0} for w in ("before the matrix", "after the matrix")]}
    assert speed.machine_note(at_once) == ("How busy the machine was: 2 calibration checks (a fixed 256×256 float32 "
                                           "matmul timed while no cell ran) read 6.0 ms before the cells and 6.0 ms "
                                           "after them.")  # two: in order, no median
    # round 2 of the audit: two checks whose own rounds varied several-fold say little about load without that
    busy = {"calibrations": [{"when": w, "ms": ms, "spread": sp}
                             for w, ms, sp in (("before the matrix", 66.0, 3.862), ("after the matrix", 47.9, 2.231))]}
    assert speed.machine_note(busy).endswith("read 66.0 ms before the cells and 47.9 ms after them; within a check "
                                             "its rounds varied by up to 386% of their median (p10 to p90), more than "
                                             "the 25% of a steady machine."), speed.machine_note(busy)
    old = {"calibration_before_ms": 10.0, "calibration_after_ms": 15.0}  # recorded before the checks between cells
    assert "2 calibration checks" in speed.machine_note(old) and "\n" not in speed.machine_note(old)


def _phase_free_features(x: np.ndarray) -> np.ndarray:
    """Magnitude spectrum of the channel mean: drops the per-image phase, keeps orientation and frequency."""
    return np.abs(np.fft.fft2(x.mean(axis=-1))).reshape(len(x), -1)


@pytest.mark.parametrize("loader", [load_synthetic, load_synthetic_cifar])
def test_synthetic_data_is_seeded_and_its_classes_have_learnable_structure(loader):
    a, b = loader(), loader()
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_val, b.y_val)
    assert a.source.startswith("synthetic") and "stripes" in a.source
    assert np.bincount(a.y_train, minlength=10).min() > len(a.y_train) / 20  # every class present
    # A nearest-centroid classifier on phase-free features: the class lives in the image structure.
    ftr, fva = _phase_free_features(a.x_train), _phase_free_features(a.x_val)
    centroids = np.stack([ftr[a.y_train == c].mean(0) for c in range(10)])
    pred = np.argmin(((fva[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (pred == a.y_val).mean() > 0.6


def test_a_target_accuracy_outside_0_1_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    from amp_compare.harness.run.compare import main

    code = main(["compare", "--device", "cpu", "--target-accuracy", "95", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "target_accuracy must be a float in (0, 1] or null, got 95.0" in err
    assert not (tmp_path / "r").exists()


def test_the_summary_speed_ratio_is_the_geometric_mean_of_the_seeds_wall_time_ratios():
    """The summary's wall-time speed ratio is the geometric mean of the per-seed throughput ratios, seeds at
    different speeds and steps with stalls alike."""
    from amp_compare.harness.report.tables import full_table

    rng = np.random.default_rng(4)
    rows = []
    for seed, (t32, t16) in enumerate([(0.01, 0.05), (0.1, 0.4), (0.02, 0.09)]):  # seeds at different speeds
        for prec, base in (("fp32", t32), ("fp16", t16)):
            times = base * (1 + 0.3 * rng.random(60)) * np.where(np.arange(60) % 7 == 0, 3, 1)  # stalls
            cell = f"torch-{prec}-s{seed}"
            rows.append({"cell_id": cell, "framework": "torch", "model": "m", "dataset": "d", "precision": prec,
                         "seed": seed, "status": "ok", "throughput_img_s": 64 * 60 / times.sum(),
                         "peak_memory_bytes": 2**20, "final_val_accuracy": 0.9, "skipped_steps": 0})
    table = full_table(pd.DataFrame(rows)).set_index("precision")
    r = table.loc["fp16"]
    per_seed = [rows[i + 1]["throughput_img_s"] / rows[i]["throughput_img_s"] for i in (0, 2, 4)]
    assert r["speedup_vs_fp32"] == pytest.approx(np.exp(np.mean(np.log(per_seed))))
