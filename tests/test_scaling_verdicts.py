"""The loss-scaling lab's verdict rows (harness/report/scaling.py, verdicts.LAB_RULES) and the answer's lines
(answer.experiment_items, phrases.lab_line), from small synthetic record tables; and the one classification of a mixed
backward's zeros (kit/fp16.py mixed_zero_kinds)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from amp_compare.harness.report import answer, phrases, scaling, verdicts
from amp_compare.kit.fp16 import gradient_stats, mixed_zero_kinds

PRECS = ("fp16", "fp16-noscale", "fp16-static")


def _scales(skip_at: int | None, n: int = 30) -> tuple[list[float], list[bool]]:
    """A dynamic scale from 2^15 doubling every 10 clean steps, halved after a skip at `skip_at`."""
    scale, clean, out, skipped = 2.0**15, 0, [], []
    for step in range(n):
        out.append(scale)
        skipped.append(step == skip_at)
        if step == skip_at:
            scale, clean = scale / 2, 0
        else:
            clean += 1
            if clean == 10:
                scale, clean = scale * 2, 0
    return out, skipped


def _records(keras_path_differs: bool = False, lost: int = 3, static_lost: int = 0):
    runs, steps, underflow, table = [], [], [], []
    for fw in ("torch", "tf"):
        for prec in PRECS:
            cell = f"{fw}-{prec}-s0"
            skip = 25 if prec == "fp16" else None
            located = prec == "fp16"
            runs.append({"cell_id": cell, "framework": fw, "model": "simple_cnn", "dataset": "digits",
                         "precision": prec, "seed": 0, "status": "ok", "cfg_growth_interval": 10,
                         "cfg_loss_scale": 1024.0 if prec == "fp16-static" else np.nan,
                         "nonfinite_step": 25 if located else -1, "nonfinite_where": "backward" if located else "",
                         "nonfinite_layer": "fc" if located else "", "nonfinite_tensor": "weight" if located else "",
                         "nonfinite_value": "inf" if located else ""})
            scale, skipped = (_scales(skip if not (keras_path_differs and fw == "tf") else 5) if prec == "fp16"
                              else ([1024.0] * 30 if prec == "fp16-static" else [1.0] * 30, [False] * 30))
            steps += [{"cell_id": cell, "step": i, "loss_scale": s, "skipped": k, "loss": 1.0}
                      for i, (s, k) in enumerate(zip(scale, skipped))]
            n = lost if prec == "fp16-noscale" else static_lost if prec == "fp16-static" else 0
            underflow += [{"cell_id": cell, "layer": "fc", "param": "weight", "when": when, "nonzero": 1000,
                           "lost_fraction_mixed_unscaled": n / 1000, "lost_fraction_mixed_scaled": n / 1000,
                           "log2_hist": json.dumps({"-3": 5, "-10": 900})} for when in ("first step", "last step")]
            key = {"model": "simple_cnn", "dataset": "digits", "step_loop": "plain", "batch_size": 64.0,
                   "framework": fw, "precision": prec}
            table.append({**key, "metric": "accuracy", "estimate": 0.1, "low": -0.2, "high": 0.3, "margin": 0.5,
                          "unit": "pp", "interval_kind": "bootstrap 95%", "status": "same", "reason": "within_floor",
                          "evidence": "{}"})
    return pd.DataFrame(table), pd.DataFrame(runs), pd.DataFrame(steps), pd.DataFrame(underflow)


def _lab(**kw) -> pd.DataFrame:
    table, runs, steps, underflow = _records(**kw)
    return pd.DataFrame(scaling.rows(table, runs, steps, underflow), columns=verdicts.COLUMNS)


def _one(lab: pd.DataFrame, fw: str, metric: str):
    return next(lab[(lab["framework"] == fw) & (lab["metric"] == metric)].itertuples())


def test_lab_rows_are_typed_and_closed():
    lab = _lab()
    assert set(lab["metric"]) == set(verdicts.LAB_METRICS)
    assert set(lab["status"]) <= set(verdicts.STATUSES) and set(lab["reason"]) <= set(verdicts.REASONS)
    for rules in verdicts.LAB_RULES.values():
        assert all(r.status in verdicts.STATUSES and r.reason in verdicts.REASONS for r in rules)
    path = _one(lab, "torch", "scale_path")
    assert (path.status, path.reason, path.estimate) == ("same", "same_path", 2.0**16)
    skips = _one(lab, "torch", "skipped_steps")
    assert (skips.status, skips.reason, skips.estimate) == ("skipped", "overflow_located", 1.0)
    under = _one(lab, "torch", "underflow")
    assert (under.status, under.reason, under.estimate) == ("lost", "accuracy_kept", 3.0)
    static = _one(lab, "torch", "static_scale")
    assert (static.status, static.reason) == ("sufficed", "no_overflow_no_underflow")


def test_a_different_path_or_a_lost_element_changes_the_verdict():
    lab = _lab(keras_path_differs=True, static_lost=2)
    assert _one(lab, "torch", "scale_path").reason == "different_path"
    assert _one(lab, "tf", "static_scale").reason == "underflowed"
    # the lab audit: "both probes, all seeds" read as every probe losing some; the line names whose did
    assert "2 at seed 0's first step, 2 at seed 0's last step;" in phrases.lab_line(_one(lab, "tf", "static_scale"))
    assert _one(_lab(lost=0), "tf", "underflow").reason == "nothing_lost"


def test_no_lab_without_noscale_or_static():
    table, runs, steps, underflow = _records()
    keep = runs["precision"] == "fp16"
    assert scaling.rows(table[table["precision"] == "fp16"], runs[keep], steps, underflow) == []


def test_answer_says_the_lab_first_one_line_per_finding():
    table, runs, steps, underflow = _records()
    lab = pd.DataFrame(scaling.rows(table, runs, steps, underflow), columns=verdicts.COLUMNS)
    ((header, lines),) = answer.experiment_items(pd.concat([table, lab]))
    assert header == verdicts.EXPERIMENTS[0][0] and len(lines) == len(lab)
    text = "\n".join(lines)
    assert "PyTorch fp16: loss scale 2^15, doubling after every 10 clean steps, final 2^16" in text
    assert "step by step the same as Keras (TF) in every seed" in text
    assert ("seed 0 step 25 at 2^17 (fc.weight went inf: either its largest |gradient| × 2^17 passed 65,504 "
            "(≥ 0.4997 unscaled) or a tensor before it in the backward did)") in text
    assert "3 of 1,000 (0.30%, seed 0)" in text and "no accuracy cost seen here" in text
    assert "PyTorch fp16-static: static scale 2^10 sufficed" in text
    keras_static = next(line for line in lines if line.startswith("Keras (TF) fp16-static"))
    # the static scale sufficed here: Keras' way with a non-finite update (applied, where PyTorch skips it) is the
    # Numerics section's general sentence, not a finding of this run
    assert "sufficed" in keras_static and "Keras applies" not in keras_static
    torch_static = next(line for line in lines if line.startswith("PyTorch fp16-static"))
    assert "Keras applies" not in torch_static
    # a Keras static scale applies every update: "no skip" would say a skip was possible (audit)
    assert "sufficed: no skip, every loss finite" in torch_static and "no skip" not in keras_static, keras_static


def test_scaling_up_cannot_make_a_lost_element():
    reference = np.array([1.0, 2.0, 0.0, 3.0, 4.0])
    unscaled = np.array([0.0, 2.0, 0.0, 0.0, 4.0])  # two underflowed, one exact zero of the reference
    scaled = np.array([0.0, 0.0, 0.0, 3.0, 4.0])  # index 1: zero only at the scale (cancellation)
    kinds = mixed_zero_kinds(reference != 0, unscaled == 0, scaled == 0)
    assert kinds["lost_unscaled"].tolist() == [True, False, False, True, False]
    assert kinds["lost_scaled"].tolist() == [True, False, False, False, False]
    assert kinds["cancelled_scaled"].tolist() == [False, True, False, False, False]
    row = gradient_stats("fc", "weight", reference, 1024.0, unscaled, scaled)
    assert row["lost_fraction_mixed_scaled"] <= row["lost_fraction_mixed_unscaled"]
    assert row["lost_fraction_mixed_scaled"] == 0.25 and row["cancelled_fraction_mixed_scaled"] == 0.25


def test_numerics_section_connects_the_skip_to_its_tensor_and_headroom():
    from amp_compare.harness.report.numerics import skip_cause_sentences

    _, runs, steps, underflow = _records()
    said = skip_cause_sentences(runs, steps, underflow)
    assert len(said) == 2  # one per framework's fp16 cell: the locator ran at its first skip
    assert said[0] == ("PyTorch fp16 seed 0: the skip at step 25 (scale 2^17) — fc.weight went inf: either its "
                       "largest |gradient| × 2^17 passed 65,504 (≥ 0.4997 unscaled) or a tensor before it in the "
                       "backward did; after the last step the probe measured its largest |gradient| below 2^-2, times "
                       "the scale the scaler held after that step (2^16) below 2^14, 4× under 65,504.")


def test_elements_lost_without_scaling_cost_no_accuracy_where_the_interval_excludes_a_loss():
    """An undecided accuracy verdict (its interval wider than fp32's seed range) can still exclude any loss: the lab
    says so instead of "not known whether it cost accuracy" (an outside audit: [0, +0.4] pp was worded as unknown)."""
    from types import SimpleNamespace

    def decide(low: float) -> tuple[str, str]:
        return verdicts.decide("underflow", SimpleNamespace(estimate=25.0, accuracy="undecided", accuracy_low=low))

    assert decide(0.0) == ("lost", "accuracy_not_lower")
    assert decide(-0.2) == ("lost", "accuracy_undecided")


def test_bounds_round_down_and_tiny_shares_keep_a_digit():
    """Audit: "≥ 0.2499" from 65,504 / 2^18 = 0.24988 (a bound rounded up), "(0.00%)" for 1 of 28,975."""
    from amp_compare.harness.report import phrases

    assert phrases._bound(65504 / 2**18, 4, up=False) == "0.2498"
    assert phrases._bound(65504 / 2**15, 4, up=False) == "1.999"
    assert phrases.share(1 / 28975) == "0.003%" and phrases.share(30 / 29000) == "0.10%"


def _lab_lines(table, runs, steps, underflow) -> dict:
    lab = pd.DataFrame(scaling.rows(table, runs, steps, underflow), columns=verdicts.COLUMNS)
    ((_, lines),) = answer.experiment_items(pd.concat([table, lab]))
    return {line.split(":")[0]: line for line in lines}


def test_exact_zeros_are_said_as_such_residue_apart_with_the_part_the_reference_flush_explains():
    """An outside audit (lab9): "lost to underflow" / "still rounded to 0" counted every exact zero of the float16
    backward, some of which no scale recovers and the float32 reference's flush does not explain, and counted an
    attention key bias's zeros (exact gradient 0: rounding residue) as underflow."""
    table, runs, steps, underflow = _records(lost=3, static_lost=2)
    underflow["flush_fraction_unscaled"] = underflow["flush_fraction_scaled"] = 0.001  # 1 of the 1,000 would flush
    residue = underflow[underflow["cell_id"] == "tf-fp16-noscale-s0"].assign(layer="blocks.0.attn.key", param="bias",
                                                                            nonzero=30)
    residue["lost_fraction_mixed_unscaled"] = 2 / 30
    lines = _lab_lines(table, runs, steps, pd.concat([underflow, residue], ignore_index=True))
    noscale = lines["PyTorch fp16-noscale"]
    assert "lost to underflow" not in noscale
    assert ("non-zero gradient elements that came out exactly zero in the float16 backward at the last step (the "
            "float32 reference's flush explains at most 1 of the 3): 3 of 1,000 (0.30%, seed 0)") in noscale
    assert "3 of 1,030 (0.29%, seed 0; 2 more are attention key-bias residue)" in lines["Keras (TF) fp16-noscale"]
    static = lines["PyTorch fp16-static"]
    # round 2 of the audit: the count is of elements zero both at the scale and without it, and says so
    assert ("4 gradient elements lost at it (exactly zero in the float16 backward both at it and without it; 2 at "
            "seed 0's first step, 2 at seed 0's last step; the float32 reference's flush explains at most 2 of the "
            "4)") in static \
        and "rounded" not in static
    # residue alone is nothing lost
    only_residue = underflow.assign(lost_fraction_mixed_unscaled=0.0)
    only_residue = pd.concat([only_residue, residue], ignore_index=True)
    lab = pd.DataFrame(scaling.rows(table, runs, steps, only_residue), columns=verdicts.COLUMNS)
    assert _one(lab, "tf", "underflow").reason == "nothing_lost"


def test_a_keras_sublayer_weight_is_not_named_as_a_parameter():
    """An outside audit (lab9): Keras' locator names the layer (blocks.0.attn) and the variable's own name (weight,
    of its query/key/value sublayer): "blocks.0.attn.weight" is no parameter; PyTorch's names are."""
    from amp_compare.harness.report.numerics import skip_cause_sentences

    table, runs, steps, underflow = _records()
    runs.loc[runs["nonfinite_layer"] == "fc", "nonfinite_layer"] = "blocks.0.attn"
    said = skip_cause_sentences(runs, steps, underflow)
    assert "PyTorch fp16 seed 0: the skip at step 25 (scale 2^17) — blocks.0.attn.weight went inf" in said[0]
    assert "Keras (TF) fp16 seed 0: the skip at step 25 (scale 2^17) — a weight of blocks.0.attn went inf" in said[1]
    assert "(a weight of blocks.0.attn went inf: either its largest" in _lab_lines(table, runs, steps, underflow)[
        "Keras (TF) fp16"]
    assert "(fc.weight went inf" in _lab_lines(*_records())["Keras (TF) fp16"]  # the probe holds fc.weight


def test_a_keras_static_scale_shows_no_skip_count():
    """An outside audit (lab9): Keras' static scale applies every update, so its "Skipped 0" is no observation."""
    from amp_compare.harness.report.render import _scale_counts_table

    _, runs, steps, _ = _records()
    steps = steps.merge(runs[["cell_id", "framework", "precision"]], on="cell_id")
    shown = _scale_counts_table(runs, steps).set_index(["Framework", "Precision"])["Skipped"]
    assert shown[("Keras (TF)", "fp16-static")] == "n/a (cannot skip)"
    assert shown[("PyTorch", "fp16-static")] == "0" and shown[("Keras (TF)", "fp16")] == "1"
    assert [scaling.cannot_skip(fw, p) for fw, p in (("tf", "fp16-noscale"), ("tf", "fp16"), ("torch", "fp16-static"))
            ] == [True, False, False]


def test_the_cross_framework_loss_gap_stops_at_the_first_skip():
    """An outside audit (lab9): after the two scalers skipped different steps the paths differ; the gap measured
    there is the scalers', not the attention core's."""
    from amp_compare.harness.report.numerics import cross_framework_loss_gap

    rows = [{"model": "vit", "framework": fw, "precision": "fp16", "seed": 0, "step": i,
             "loss": 1.0 + (0.5 if fw == "tf" and i >= 10 else 0.0), "skipped": i == (10 if fw == "tf" else 20)}
            for fw in ("torch", "tf") for i in range(30)]
    said = cross_framework_loss_gap(pd.DataFrame(rows))
    assert "before either cell's first non-finite loss or skipped update" in said
    assert "fp16 0 (only its first 10 of 30 steps: a skip or non-finite loss cut it short, not comparable)" in said


def test_a_cell_the_speed_budget_stopped_is_compared_over_the_steps_both_ran():
    """The lab audit: Keras' cells stopped at step 45 by the speed budget, PyTorch's ran 88 and grew its scale after
    step 45; the paths were equal over the steps both ran and "a different path" was false. A clean record of a cut
    cell says how far it reaches."""
    table, runs, steps, underflow = _records()
    runs["budget_steps"] = pd.array([40 if fw == "tf" else None for fw in runs["framework"]], dtype="Int64")
    ran = steps["cell_id"].str.startswith("tf-") & (steps["step"] >= 20)  # the cut cells' steps end at 20
    steps = steps[~ran]
    lab = pd.DataFrame(scaling.rows(table, runs, steps, underflow), columns=verdicts.COLUMNS)
    path = _one(lab, "torch", "scale_path")
    assert (path.status, path.reason) == ("same", "same_path_until_cut")
    line = phrases.lab_line(path)
    assert "over the 20 steps both ran (the speed budget stopped one of them there)" in line
    static = _one(lab, "tf", "static_scale")
    assert "sufficed (in the 20 steps a cell ran before the speed budget stopped it)" in phrases.lab_line(static)
    # unequal over the steps both ran is still a different path
    steps.loc[steps["cell_id"].eq("tf-fp16-s0") & steps["step"].eq(3), "loss_scale"] = 1.0
    lab = pd.DataFrame(scaling.rows(table, runs, steps, underflow), columns=verdicts.COLUMNS)
    assert _one(lab, "torch", "scale_path").reason == "different_path"


def test_a_twin_that_ended_early_without_a_budget_cut_is_a_different_path():
    """Only the speed budget's stop limits the comparison to the steps both ran: a twin that diverged and ended
    early has another path."""
    table, runs, steps = _records()[:3]
    underflow = _records()[3]
    steps = steps[~(steps["cell_id"].eq("tf-fp16-s0") & (steps["step"] >= 20))]
    lab = pd.DataFrame(scaling.rows(table, runs, steps, underflow), columns=verdicts.COLUMNS)
    assert _one(lab, "torch", "scale_path").reason == "different_path"
