import json

import pandas as pd
import pytest

from amp_compare.harness.report import answer, phrases, render, verdicts
from amp_compare.harness.report.findings import finding_parts
from amp_compare.harness.report.tables import formatted_summary, full_table, summary_table


def _runs():
    rows = []
    for fw in ("torch", "tf"):
        cells = (("fp32", 100.0, 200.0, 0.90), ("fp16", 25.0, 150.0, 0.88), ("bf16", 50.0, 100.0, 0.91))
        for prec, thr, mem, acc in cells:
            rows.append({"framework": fw, "model": "simple_cnn", "dataset": "digits", "precision": prec, "seed": 0,
                         "status": "ok", "throughput_img_s": thr, "peak_memory_bytes": mem * 2**20,
                         "final_val_accuracy": acc, "skipped_steps": 2 if prec == "fp16" else 0,
                         "cell_id": f"{fw}-{prec}", "memory_kind": "test", "cfg_device": "cpu"})
    rows.append({**rows[0], "status": "failed", "throughput_img_s": 1e9, "cell_id": "torch-fp32-s1", "seed": 1})
    return pd.DataFrame(rows)


def test_ratios_against_each_frameworks_fp32_ignoring_failed_cells():
    t = summary_table(_runs()).set_index(["framework", "precision"])
    assert t.loc[("torch", "fp16"), "speedup_vs_fp32"] == pytest.approx(0.25)
    assert t.loc[("tf", "bf16"), "memory_change_vs_fp32"] == pytest.approx(-0.5)
    assert t.loc[("torch", "fp32"), "runs"] == 1
    f = formatted_summary(summary_table(_runs()))
    # what the cells measured; each comparison with fp32 is a verdict, worded in the per-model tables only
    assert not {"Speed vs fp32", "Memory vs fp32", "Δ accuracy vs fp32"} & set(f.columns)


def test_findings_are_sentences_from_the_numbers():
    steps = pd.DataFrame({"cell_id": "torch-fp16", "framework": ["torch", "torch"], "precision": ["fp16", "fp16"],
                          "step": [0, 1], "step_time_s": [0.1, 0.1],
                          "loss_scale": [2.0**15, 2.0**14], "skipped": [True, False]})
    env = {"cpu_amp_flags": "avx2,f16c", "cpu_bf16_hardware": False, "cpu_fp16_hardware": False}
    text = finding_parts(_runs(), steps, env)
    assert not any("images/s" in s for s in text)  # no wall-time speed sentence: speed is the trials' verdict
    # said once, elsewhere: the CPU's flags in the Answer's first line, the skips and the scale the Loss scaling table
    assert answer.preface(env) == "This CPU's flags list no bfloat16 or float16 arithmetic."
    counts = render._scale_counts_table(_runs(), steps).iloc[0]
    assert (counts["Framework"], counts["Steps"], counts["Skipped"], counts["Final scale"]) == ("PyTorch", "2", "1",
                                                                                                 "16384")


# ---- findings worded from the statistics (issue 14) --------------------------------------------

import numpy as np  # noqa: E402

from amp_compare.contract.records import pack_correct  # noqa: E402

N_VAL = 400


def _cells(model="simple_cnn", dataset="digits", seeds=(0,), fp32_acc=0.95, lost=0, gained=0, curve=None,
           step_s=None, machine=None):
    """Finished cells of torch fp32 and fp16 with per-image results: fp16 loses `lost` and gains `gained`
    images against fp32 in every seed; `curve` is fp32's validation accuracy per epoch."""
    rng = np.random.default_rng(0)
    curve = curve or [fp32_acc - 0.01, fp32_acc]
    runs, epochs, steps = [], [], []
    for seed in seeds:
        base = np.zeros(N_VAL, bool)
        base[rng.choice(N_VAL, int(round(fp32_acc * N_VAL)), replace=False)] = True
        mixed = base.copy()
        mixed[np.flatnonzero(base)[:lost]] = False
        mixed[np.flatnonzero(~base)[:gained]] = True
        for prec, correct in (("fp32", base), ("fp16", mixed)):
            cell = f"torch-{model}-{dataset}-{prec}-s{seed}"
            acc = correct.mean()
            runs.append({"run_id": "r", "cell_id": cell, "framework": "torch", "model": model, "dataset": dataset,
                         "precision": prec, "seed": seed, "status": "ok", "throughput_img_s": 100.0,
                         "peak_memory_bytes": 2**20, "final_val_accuracy": acc, "skipped_steps": 0,
                         "memory_kind": "test", "cfg_device": "cpu", "val_samples": N_VAL,
                         "val_correct": pack_correct(correct), **({"machine": machine} if machine else {})})
            for e, a in enumerate(curve):
                epochs.append({"cell_id": cell, "framework": "torch", "precision": prec, "seed": seed, "epoch": e,
                               "val_accuracy": a if prec == "fp32" else acc, "train_time_s": 1.0})
            times = step_s(prec) if step_s else np.full(40, 0.01 if prec == "fp32" else 0.02)
            for i, t in enumerate(times):
                steps.append({"cell_id": cell, "framework": "torch", "precision": prec, "seed": seed, "step": i,
                              "step_time_s": t, "warmup": False, "loss_scale": 2.0**15 if prec == "fp16" else 1.0,
                              "skipped": False, "model": model, "dataset": dataset})
    return pd.DataFrame(runs), pd.DataFrame(epochs), pd.DataFrame(steps)


ENV = {"cpu_amp_flags": "avx2,f16c", "cpu_bf16_hardware": False, "cpu_fp16_hardware": False}


def _findings(runs, epochs, steps, env=ENV):
    return finding_parts(runs, steps, env, epochs)


def _verdict(runs, epochs, steps, metric: str, precision: str = "fp16"):
    v = verdicts.build(full_table(runs, epochs), runs)
    return v[(v["metric"] == metric) & (v["precision"] == precision)].iloc[0]


def test_no_significant_difference_is_undecided_without_a_floor_and_worded_once():
    runs, epochs, steps = _cells(lost=2, gained=1)
    acc = _verdict(runs, epochs, steps, "accuracy")
    assert (acc.status, acc.reason, acc.interval_kind) == ("undecided", "no_floor", "newcombe 95%")  # one fp32 seed
    assert phrases.cell(acc) == "-0.2 pp [-1.5, +0.9] undecided (one fp32 seed: no seed range)"
    assert phrases.interval_words(acc) == "95% Newcombe"
    assert not any("final validation accuracy" in s for s in _findings(runs, epochs, steps))  # said once, there


def test_a_significant_drop_is_lower_with_its_interval():
    runs, epochs, steps = _cells(seeds=(0, 1, 2), lost=12)
    acc = _verdict(runs, epochs, steps, "accuracy")
    assert (acc.status, acc.reason, acc.interval_kind) == ("lower", "interval_excludes_0", "bootstrap 95%")
    assert acc.estimate == pytest.approx(-3.0) and acc.high < 0
    assert phrases.cell(acc).startswith("-3.0 pp [") and phrases.cell(acc).endswith("] lower")


def test_near_chance_fp32_says_accuracy_cannot_be_compared_and_what_to_change():
    text = _findings(*_cells(fp32_acc=0.12, lost=20, curve=[0.1, 0.12]))
    assert not any("final validation accuracy" in s for s in text)
    short = [s for s in text if s.startswith("Accuracy cannot be compared")]
    assert short == ["Accuracy cannot be compared from this run for simple_cnn on digits: fp32 reached only 12.0% "
                     "after 2 epochs (chance is 10%). Train longer (more --epochs, no --steps-per-epoch cap) or on "
                     "the real dataset before reading accuracy differences."]


def test_no_wall_time_speed_ratio_is_worded_or_marked():
    """Speed verdicts are the speed trials' (verdicts.py): the findings say no training cell's wall-time ratio and
    mark none ⚠, however noisy its steps."""
    rng = np.random.default_rng(3)

    def noisy(prec):  # load switching on and off in stretches of 10 steps
        load = np.repeat(rng.random(8) < 0.5, 10) * 4 + 1
        return (0.01 if prec == "fp32" else 0.02) * load

    runs, epochs, steps = _cells(step_s=noisy)
    said = _findings(runs, epochs, steps)
    assert not any("images/s" in s or "fp16 at" in s for s in said)
    assert "speed_note" not in full_table(runs, epochs)


def test_time_to_accuracy_and_not_reached():
    runs, epochs, steps = _cells(fp32_acc=0.95, lost=40, curve=[0.94, 0.95])
    tta = _verdict(runs, epochs, steps, "time_to_target")
    assert (tta.status, tta.reason) == ("undecided", "not_reached")
    evidence = json.loads(tta.evidence)
    assert evidence["target"] == pytest.approx(0.9025) and evidence["reached_seeds"] == 0
    assert phrases.cell(tta) == "undecided (a seed never reached it)"


def test_the_reproduce_line_says_when_the_tree_had_uncommitted_changes():
    from amp_compare.harness.report.wording import reproduce_note

    assert reproduce_note({"git_sha": "87cbca71e3fc"}) == ""
    said = reproduce_note({"git_sha": "87cbca71e3fc-dirty"})
    assert "commit 87cbca71e3fc with uncommitted changes" in said and "does not rebuild this run" in said
    assert "87cbca71e3fc with" in reproduce_note({"machine A: git_sha": "87cbca71e3fc-dirty", "git_sha": "x"})


def test_an_interval_end_at_zero_reads_as_zero():
    """The audit: a bootstrap over one differing image gave "[95% bootstrap +0.0, +0.3]", read as excluding 0."""
    from types import SimpleNamespace

    from amp_compare.harness.report.phrases import accuracy, pp_bound

    r = SimpleNamespace(model="m", dataset="d", framework="torch", precision="bf16", diff_pp=0.0929, ci_low=0.0,
                        ci_high=0.2786, p_value=0.763, method="bootstrap", seeds=3, images=1000, too_short="",
                        floor_pp=0.2, floor_seeds=3)
    assert accuracy(r) == "+0.1 pp [0, +0.28] undecided (wide interval) (95% bootstrap, p = 0.76)"  # as the margin
    assert pp_bound(0.03) == "+0.03" and pp_bound(-0.4) == "-0.4"
