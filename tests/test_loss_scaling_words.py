"""What the Numerics section says about loss scaling and float16, held to what the records show (each through the
function the report calls): overflow from the step records, never from the largest parameter gradient; accuracies
with their paired tests; each seed's own loss-scale line; a Model column where a run has two models; epochs counted
from 1."""

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from amp_compare.harness.report import numerics as nr
from amp_compare.harness.report import render
from amp_compare.harness.report.figures import loss_scale_grid, make_headroom_figure


def _probe(cell: str, precision: str, scale: float, top_log2: int = -5) -> list[dict]:
    """Underflow rows as a child writes them: a histogram whose largest |gradient| is below 2^(top_log2 + 1)."""
    hist = json.dumps({str(k): (10 if top_log2 - 10 <= k <= top_log2 else 0) for k in range(-40, 17)})
    return [{"cell_id": cell, "framework": "torch", "model": "simple_cnn", "dataset": "digits", "precision": precision,
             "seed": 0, "when": "last step", "layer": "conv1", "param": "weight", "elements": 1000, "nonzero": 1000,
             "zero_fraction": 0.0, "flush_fraction_unscaled": 0.0, "flush_fraction_scaled": 0.0,
             "overflow_fraction_scaled": 0.0, "zero_fraction_mixed": 0.0, "lost_fraction_mixed_unscaled": 0.0005,
             "lost_fraction_mixed_scaled": 0.0, "loss_scale": scale, "log2_hist": hist, "method": "test"}]


def _steps(cell: str, scales: list[float], skipped: set[int], seed: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"cell_id": cell, "framework": "torch", "model": "simple_cnn", "dataset": "digits",
                         "precision": "fp16", "seed": seed, "step": range(len(scales)), "loss_scale": scales,
                         "skipped": [i in skipped for i in range(len(scales))], "loss": 1.0})


def test_what_a_skip_means_is_said_once_across_the_cells_sentences():
    """The lab audit: "(non-finite gradients at the scale then in use: a backward overflow, …)" printed in every
    fp16 cell's sentence, five times on one page."""
    scales = [2.0**18] * 4 + [2.0**19] * 4
    steps = pd.concat([_steps("a", scales, skipped={7}), _steps("b", scales, skipped={6}).assign(framework="tf")])
    underflow = pd.DataFrame(_probe("a", "fp16", 2.0**18) + [{**_probe("b", "fp16", 2.0**18)[0], "framework": "tf"}])
    said = " ".join(nr.headroom_sentences(underflow, steps))
    assert said.count("a backward overflow, which a lower scale cures") == 1, said
    assert said.count("1 with a finite loss") == 2, said  # each cell still says its own skips


def test_overflow_is_said_from_the_step_records_not_from_the_largest_parameter_gradient():
    """The lab's seed 0: the last step ran at 2^19 and was skipped, yet the probe after it (at the halved 2^18)
    put the largest parameter gradient times the scale under 2^14 — which once read "so nothing overflowed"."""
    scales = [2.0**18] * 4 + [2.0**19] * 4 + [2.0**18] + [2.0**19]
    steps = _steps("c", scales, skipped={7, 9})
    underflow = pd.DataFrame(_probe("c", "fp16", 2.0**18, top_log2=-5))
    (said,) = nr.headroom_sentences(underflow, steps)  # what numerics_said puts in the Numerics section
    assert "nothing overflowed" not in said and "scale in use" not in said, said
    assert "after the last step (the first batch again): the largest |parameter gradient| was below 2^-4; times the " \
           "scale the scaler held after that step (2^18) below 2^14 — a bound on the parameter gradients " \
           "at this probe only, not on other steps' nor on the intermediate tensors of the backward" in said, said
    assert said.endswith("The step records: the scaler skipped 2 of 10 updates, 2 with a finite loss (non-finite "
                         "gradients at the scale then in use: a backward overflow, which a lower scale cures, or a "
                         "forward value the loss does not read, which it does not — the NaN/Inf locator says which "
                         "at the first): steps 7, 9, at 2^19 (2×); the last step (step 9, counting from 0) ran at "
                         "2^19 and was skipped, with a finite loss."), said
    clean = nr.scale_record_text(_steps("c", [2.0**15] * 5, skipped=set()))
    assert clean == "", clean  # no skip: the Loss scaling table and paragraph say so, not each probe again
    # Keras under a static scale applies every update: no skip is no evidence (audit: "no update of 88 was skipped")
    keras = nr.scale_record_text(_steps("k", [1024.0] * 5, skipped=set()).assign(framework="tf",
                                                                                   precision="fp16-static"))
    assert keras == ("The step records: every loss of its 5 steps was finite (a Keras static scale applies every "
                     "update, so no skip can show an overflow); the last step (step 4, counting from 0) ran at "
                     "2^10"), keras


def test_skips_with_a_non_finite_loss_are_said_apart_from_those_loss_scaling_answers():
    """The audit's vitnaive: "skipped 23 of 27 updates, each an overflow at the scale then in use" while only steps
    1-2 had finite losses; the other 21 had NaN losses from the forward, where no scale helps."""
    scales = [2.0**15, 2.0**15, 2.0**14, 2.0**13, 2.0**13, 2.0**13, 2.0**12] + [2.0**(12 - k) for k in range(20)]
    bad = {5, *range(7, 27)}
    steps = _steps("c", scales, skipped={1, 2, *bad})
    steps["loss"] = [np.nan if i in bad else 2.4 for i in range(27)]
    said = nr.scale_record_text(steps)
    assert "each an overflow" not in said, said
    assert "2 with a finite loss (non-finite gradients at the scale then in use: a backward overflow, which a " \
           "lower scale cures" in said and "): steps 1–2, at 2^15 (1×), 2^14 (1×); " in said, said
    assert "21 with a non-finite loss (the forward overflowed: no loss scale helps, since the scale multiplies only " \
           "the backward): steps 5, 7–26, at 21 scales from 2^13 down to 2^-7; from step 5 (the first non-finite " \
           "loss) on, the scale's fall could not help" in said, said
    assert said.endswith("ran at 2^-7 and was skipped, with a non-finite loss"), said


def _acc(precision: str, diff: float, low: float, high: float, p: float, model: str = "vit") -> dict:
    return {"model": model, "dataset": "digits", "framework": "torch", "precision": precision, "diff_pp": diff,
            "ci_low": low, "ci_high": high, "p_value": p, "method": "mcnemar", "seeds": 1, "too_short": "",
            "budget_cut": 0}


def test_loss_scaling_accuracies_carry_the_paired_test():
    """The lab's "94.2% with dynamic loss scaling, 95.5% without any", once printed bare beside a p = 0.125."""
    runs = pd.DataFrame([{"model": "vit", "dataset": "digits", "framework": "torch", "precision": p, "seed": 0,
                          "status": "ok", "final_val_accuracy": a}
                         for p, a in (("fp16", 0.942), ("fp16-noscale", 0.955))])
    acc = pd.DataFrame([_acc("fp16", -1.1, -2.7, 0.2, 0.125), _acc("fp16-noscale", 0.3, -0.8, 1.4, 1.0)])
    (said,) = nr.numerics_said(runs, pd.DataFrame(), None, acc)["loss_scaling"]
    assert said == ("PyTorch: validation accuracy 94.2% with dynamic loss scaling (against fp32: -1.1 pp [-2.7, +0.2] "
                    "undecided (one fp32 seed: no seed range) (95% Newcombe, p = 0.12)), 95.5% without any (against "
                    "fp32: +0.3 pp [-0.8, +1.4] undecided (one fp32 seed: no seed range) (95% Newcombe, p = 1)) — "
                    "each tested against fp32 "
                    "image by image, as the Accuracy section does."), said


def test_the_loss_scale_figure_draws_each_seeds_own_trajectory():
    """Three seeds that skipped at different steps: the median line of old halved where no seed skipped."""
    steps = pd.concat([_steps(f"s{seed}", [2.0 ** (15 + (i >= 4 + 3 * seed))for i in range(12)], skipped=set(),
                              seed=seed) for seed in range(3)])
    steps.loc[(steps["cell_id"] == "s2") & (steps["step"] == 11), "skipped"] = True
    grid = loss_scale_grid(steps)
    lines = [ln for ln in grid.ax.get_lines() if len(ln.get_xdata()) > 1]
    assert len(lines) == 3, len(lines)  # one per seed, not one median line
    drawn = sorted(tuple(np.asarray(ln.get_ydata(), float)) for ln in lines)
    own = sorted(tuple(np.log2(g.sort_values("step")["loss_scale"])) for _, g in steps.groupby("cell_id"))
    assert drawn == own
    plt.close(grid.figure)


def test_two_models_are_named_in_the_locator_and_dtype_tables():
    runs = pd.DataFrame([{"model": m, "dataset": "digits", "framework": "torch", "precision": "fp16", "seed": 0,
                          "nonfinite_step": s, "nonfinite_where": "backward", "nonfinite_layer": layer,
                          "nonfinite_value": "inf"} for m, s, layer in (("simple_cnn", 83, "fc"),
                                                                         ("vit", 42, "blocks.0.attn"))])
    table = render._nonfinite_table(runs)
    assert list(table["Model"]) == ["simple_cnn", "vit"] and "Step (counting from 0)" in table
    dtypes = pd.DataFrame([{"model": m, "framework": fw, "precision": "fp16", "seed": 0, "layer": layer,
                            "phase": "forward", "op": op, "compute_dtype": dt, "param_dtype": "float32"}
                           for fw in ("torch", "tf")
                           for m, layer, op, dt in (("simple_cnn", "fc", "addmm", "float16"),
                                                    ("simple_cnn", "loss", "nll_loss_forward", "float32"),
                                                    ("vit", "norm", "native_layer_norm", "float32"),
                                                    ("vit", "blocks.0.attn", "attn", "float16" if fw == "torch"
                                                     else "float32"))])
    side = nr.dtype_side_by_side(dtypes)["fp16"]
    assert list(side["model"]) == ["simple_cnn", "simple_cnn", "vit", "vit"]
    facts = nr.op_dtype_facts(dtypes, "cpu")
    assert facts["differing"]["fp16"]["models"]["vit"] == {"rows": 1, "of": 2, "unattributed": 0,
                                                           "layers": ["blocks.0.attn"]}
    assert "fp16: simple_cnn 0 of 2 rows, vit 1 of 2 rows (blocks.0.attn)" in nr.section_words(
        type("F", (), {"frameworks": ["torch", "tf"]})(), facts)["dtype_audit"]


def test_headroom_epochs_are_counted_from_1(tmp_path, monkeypatch):
    from amp_compare.harness.report import figures

    drawn = []
    monkeypatch.setattr(figures, "_save", lambda fig, out_dir, key: drawn.append(fig))
    headroom = pd.DataFrame([{"framework": "torch", "precision": "fp16", "seed": 0, "cell_id": "v", "epoch": e,
                              "layer": "blocks.0.attn", "quantity": "attention_logit", "max_abs": 4.0 + (e == 0)}
                             for e in range(3)])
    runs = pd.DataFrame([{"model": "vit", "framework": "torch", "precision": "fp16", "seed": 0, "cell_id": "v"}])
    make_headroom_figure(headroom, runs, tmp_path)
    (fig,) = drawn
    assert min(fig.axes[0].get_lines()[0].get_xdata()) == 1 and fig.axes[0].get_xlabel() == "Epoch (counting from 1)"
    plt.close(fig)
