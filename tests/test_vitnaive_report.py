"""The report of a naive-attention ViT whose fp16 cells diverged (`--models vit --attention naive --vit-dim 64
--vit-heads 1 --vit-depth 1 --datasets synthetic --epochs 2`), held to its own records, each through the function
the report calls: the NaN/Inf locator's forward finding beside that step's finite loss, the naive logit's limit
and the non-finite records the headroom figure names, the loss gap's step counts, the figures' left-out cells, the
diverged cells' timing and their empty stderr.

The records mirror that run's: steps 1-2 skipped with finite losses at 2^15, 2^14; step 5 and 7-26 non-finite;
the locator at step 1 in the forward of blocks.0.attn; ln2 and the final norm's input records NaN in epoch 1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from amp_compare.harness.report import numerics as nr
from amp_compare.harness.report import render

BAD = {5, *range(7, 27)}


def _steps(framework: str, precision: str, n: int) -> pd.DataFrame:
    scaled = precision == "fp16"
    scales, scale = [], 32768.0
    for i in range(n):
        scales.append(scale if scaled else 1.0)
        if scaled and (i in (1, 2) or i in BAD):
            scale /= 2
    return pd.DataFrame({"cell_id": f"{framework}-vit-synthetic-{precision}-s0", "framework": framework,
                         "model": "vit", "dataset": "synthetic", "precision": precision, "seed": 0,
                         "step": range(n), "epoch": [i // 25 for i in range(n)],
                         "loss": [np.nan if scaled and i in BAD else 2.47 - 0.001 * i + (framework == "tf") * 1e-4
                                  for i in range(n)],
                         "loss_scale": scales, "skipped": [scaled and (i in (1, 2) or i in BAD) for i in range(n)]})


def _runs() -> pd.DataFrame:
    rows = []
    for fw in ("torch", "tf"):
        for prec in ("fp32", "fp16"):
            bad = prec == "fp16"
            rows.append({"cell_id": f"{fw}-vit-synthetic-{prec}-s0", "framework": fw, "model": "vit",
                         "dataset": "synthetic", "precision": prec, "seed": 0, "cfg_attention": "naive",
                         "status": "diverged" if bad else "ok", "diverged_at_step": 7 if bad else -1,
                         "steps_total": 27 if bad else 50, "skipped_steps": 23 if bad else 0,
                         "nonfinite_step": 1 if bad else -1, "nonfinite_where": "forward" if bad else "",
                         "nonfinite_layer": "blocks.0.attn" if bad else "", "nonfinite_value": "nan" if bad else "",
                         "final_train_loss": np.nan if bad else 2.118, "final_val_accuracy": 0.205,
                         "throughput_img_s": 1345.0 if bad else 9071.0, "stderr_tail": ""})
    return pd.DataFrame(rows)


def _headroom() -> pd.DataFrame:
    rows = []
    for fw in ("torch", "tf"):
        for prec, values in (("fp32", (3.2, 56.7, 3.6, 4.3)), ("fp16", (3.047, 16.74, np.nan, np.nan))):
            for layer, quantity, value in zip(("blocks.0.ln1", "blocks.0.attn", "blocks.0.ln2", "norm"),
                                              ("layernorm_input", "attention_logit", "layernorm_input",
                                               "layernorm_input"), values):
                rows.append({"framework": fw, "precision": prec, "seed": 0, "cell_id": f"{fw}-vit-synthetic-{prec}-s0",
                             "epoch": 0, "layer": layer, "quantity": quantity, "max_abs": value})
    return pd.DataFrame(rows)


def _all_steps() -> pd.DataFrame:
    return pd.concat([_steps(fw, p, 27 if p == "fp16" else 50) for fw in ("torch", "tf") for p in ("fp32", "fp16")],
                     ignore_index=True)


def test_a_forward_finding_beside_a_finite_loss_says_the_loss_did_not_read_it():
    """The audit's vitnaive: "at step 1 … the NaN/Inf locator found the first non-finite value in the forward of
    layer 'blocks.0.attn' (nan)" beside step 1's finite loss 2.47, read as the wrong step. It is float16's doing:
    the head reads only the class token's row, the NaN sat in other rows and reached the update through the
    gradients. The locator's paragraph says so, its table gives that step's loss from the step records."""
    runs, steps = _runs(), _all_steps()
    words = nr.section_words(type("F", (), {"frameworks": ["torch", "tf"]})(), {})["nonfinite"]
    assert "A forward finding beside a finite loss of that step is one in elements the loss does not read (the " \
           "vit's head reads only the class token's row): it reached the update through the gradients." in words
    table = render._nonfinite_table(runs, steps)
    assert list(table["That step's loss"]) == ["2.469", "2.469"], table


def test_the_naive_logit_meets_exps_limit_and_the_figure_names_each_non_finite_layernorm(tmp_path, monkeypatch):
    """The audit's "attention logit 16.74 … 3.91e+03×" (against 65,504, for a softmax whose exp overflows past
    ln(65,504) = 11.1), and ln1 alone shown for the block though ln2's record was NaN: the sentence sets the logit
    against exp's limit, the headroom figure's caption names each LayerNorm record that went non-finite."""
    import matplotlib.pyplot as plt

    from amp_compare.harness.report import figures

    monkeypatch.setattr(figures, "_save", lambda fig, out_dir, key: plt.close(fig))
    caption = figures.make_headroom_figure(_headroom(), _runs(), tmp_path).caption
    assert "A value that went non-finite is left out (PyTorch fp16: blocks.0.ln2, norm from epoch 1; Keras (TF) " \
           "fp16: blocks.0.ln2, norm from epoch 1)." in caption, caption
    assert "ln(65,504) ≈ 11.1" in caption, caption


def test_the_loss_gap_says_how_many_steps_each_median_covers_and_marks_a_cut_short_cell():
    """The audit's "fp32 0.00082, fp16 0.00018, bf16 0.015 (fp32's gap is the floor)": fp16's median covered 6
    finite steps (0-4 and 6, the NaN steps dropped before the cut) against fp32's 50, and fell below the floor."""
    said = nr.cross_framework_loss_gap(_all_steps())
    assert "fp32 4.1e-05 (50 steps)" in said, said
    # the first skip (step 1) cuts it too: after it the two scalers' paths differ (audit lab9)
    assert "fp16 4e-05 (only its first 1 of 27 steps: a skip or non-finite loss cut it short, not comparable)" \
        in said, said
    # fp8: the frameworks run different recipes, so their gap is not the attention core's (audit)
    fp8 = _all_steps().query("precision == 'fp32'").assign(precision="fp8")
    assert "fp8" not in nr.cross_framework_loss_gap(pd.concat([_all_steps(), fp8], ignore_index=True))


def test_a_diverged_cell_is_named_where_left_out_timed_not_reported_and_has_no_empty_stderr(tmp_path):
    """The audit's vitnaive: loss_curves.png and val_accuracy.png dropped the fp16 cells under "each line is one
    precision"; "fp16: no speed measured" though run.parquet had its timings; "last lines of its stderr:" with
    nothing after it. A compare's folder with a diverged fp16 cell, rendered with figures as a compare renders it."""
    import html as html_lib

    from amp_compare.contract import records
    from amp_compare.harness.report import render as report
    from tests.test_report_sentences import write_run

    run_dir = write_run(tmp_path, frameworks=("torch",), precisions=("fp32", "fp16"), seeds=(0,), steps=27,
                        epochs=2)
    cell = next((run_dir / "cells").glob("torch-*-fp16-*"))
    run = pd.read_parquet(cell / "run.parquet")
    run["status"], run["stderr_tail"] = "diverged", ""
    run["error"] = "non-finite loss for 20 consecutive steps from step 7"
    run["diverged_at_step"] = 7
    records.atomic_write_table(cell / "run.parquet", run)
    steps = pd.read_parquet(cell / "steps.parquet")
    bad = steps["step"].isin(BAD)
    steps["loss"] = steps["loss"].where(~bad, np.nan)
    steps["skipped"] = bad | steps["step"].isin((1, 2))
    records.atomic_write_table(cell / "steps.parquet", steps)
    report.render(run_dir, figures=True)
    page = html_lib.unescape((run_dir / "index.html").read_text())
    name = cell.name
    title = "Training loss per step"
    caption = page[page.index(f"{title}.</b>"):page.index("<a href", page.index(f"{title}.</b>"))]
    assert f"Left out: {name} (diverged): it did not finish (a diverged cell's losses went non-finite), so its " \
           "curve is not drawn." in caption, caption
    assert "fp16: speed failed (diverged); accuracy failed (diverged)" in page  # the answer's line, from the verdicts
    assert "no speed measured" not in page
    assert f"{name} — last lines of its stderr" not in page
    assert f"{name} — diverged (non-finite loss for 20 consecutive steps from step 7): its own divergence watch " \
           "stopped it" in page
