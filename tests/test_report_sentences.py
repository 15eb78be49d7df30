"""Every sentence of a report fits the run that was made (issue 28): reports rendered from synthetic tables.

Each run folder here is written through contract/records.py as a child would write it, with the manifest a
compare writes (cells in harness/run/order.py's order), and rendered by the same `report.render` a compare calls
(no figures: seconds, no training). The cases are the runs issue 28 audited: one seed; the loss-scaling lab
without bf16; a busy machine; a single framework; and a three-seed run whose seeds disagree.
"""

import html as html_lib
import json

import numpy as np
import pandas as pd
import pytest

from amp_compare.contract import records
from amp_compare.contract.config import RunConfig
from amp_compare.harness.report import render as report
from amp_compare.harness.run.order import interleaved_order

CPU = {"cpu_model": "Test CPU", "cpu_amp_flags": "avx2,fma,f16c", "cpu_bf16_hardware": False,
       "cpu_fp16_hardware": False}
STEADY = [{"when": "before the matrix", "ms": 3.0, "spread": 0.04}, {"when": "after a", "ms": 3.05, "spread": 0.05}]
BUSY = [{"when": "before the matrix", "ms": 7.9, "spread": 1.84}, {"when": "after a", "ms": 8.0, "spread": 0.3}]
N_VAL = 200


def _histogram(scale_log2: int) -> str:
    """A log2-magnitude histogram as the children record it (kit/fp16.py: JSON of {floor(log2|g|): count})."""
    counts = {k: 0 for k in range(-40, 17)}
    for k, n in zip(range(-27, -4), [1, 2, 4, 8, 16, 30, 50, 80, 120, 160, 200, 220, 200, 160, 120, 80, 50, 30, 16,
                                     8, 4, 2, 1]):
        counts[k] = n
    return json.dumps({str(k): v for k, v in counts.items()})


def _tables(cfg: RunConfig, speed: float, steps: int, rng, epochs: int,
            memory_mib: float | None = None) -> dict[str, pd.DataFrame]:
    identity = {"run_id": "r", "cell_id": cfg.cell_id, "framework": cfg.framework, "model": cfg.model,
                "dataset": cfg.dataset, "precision": cfg.precision, "seed": cfg.seed}
    times = 0.01 / speed * (1 + 0.05 * rng.random(steps))
    dynamic, static = cfg.precision == "fp16", cfg.precision == "fp16-static"
    scale = 2.0**15 if dynamic else cfg.loss_scale if static else 1.0
    step_rows = pd.DataFrame({**{k: [v] * steps for k, v in identity.items()}, "epoch": np.arange(steps) * epochs
                              // steps, "step": np.arange(steps), "loss": 2.0 - np.arange(steps) / steps,
                              "loss_scale": scale, "skipped": False, "step_time_s": times, "warmup": False})
    correct = rng.random(N_VAL) < 0.9
    run = {**identity, "schema_version": records.SCHEMA_VERSION, "status": "ok", "error": "",
           **{f"cfg_{k}": v for k, v in cfg.to_dict().items() if k not in identity},
           "throughput_img_s": 64 * steps / times.sum(), "median_step_throughput_img_s": 64 / np.median(times),
           "median_step_s": np.median(times), "p90_step_s": np.percentile(times, 90),
           "final_val_loss": 1.0 + 0.01 * (cfg.precision != "fp32"),
           "p99_step_s": np.percentile(times, 99), "epoch_throughput_img_s": 64 * steps / times.sum(),
           "first_step_overhead_s": 0.0,
           "peak_memory_bytes": round(2**20 * (memory_mib or 100 * (0.9 if cfg.precision != "fp32" else 1))),
           "memory_kind": "cpu_peak_rss_above_baseline_after_first_step", "final_val_accuracy": correct.mean(),
           "val_samples": N_VAL, "val_correct": records.pack_correct(correct), "skipped_steps": 0,
           "steps_total": steps, "cpu_model": CPU["cpu_model"]}
    curve = 0.9 - 0.1 * 0.1 ** np.arange(epochs)[::-1]  # levelled off: 0.8, 0.89, 0.899 for 3 epochs
    epoch_rows = pd.DataFrame([{**identity, "epoch": e, "train_loss": 1.0, "train_accuracy": 0.9, "val_loss": 1.0,
                                "val_accuracy": curve[e] if e < epochs - 1 else correct.mean(),
                                "train_time_s": times.sum() / epochs, "eval_time_s": 0.1} for e in range(epochs)])
    tables = {"run": pd.DataFrame([run]), "epochs": epoch_rows, "steps": step_rows}
    if cfg.precision.startswith("fp16"):
        tables["underflow"] = pd.DataFrame([
            {**identity, "layer": layer, "param": "weight", "when": when, "elements": 1000, "nonzero": 1000,
             "zero_fraction": 0.0, "flush_fraction_unscaled": 0.02, "subnormal_fraction_unscaled": 0.1,
             "flush_fraction_scaled": 0.0 if scale > 1 else 0.02, "subnormal_fraction_scaled": 0.01,
             "overflow_fraction_scaled": 0.0, "zero_fraction_mixed": lost, "lost_fraction_mixed_unscaled": lost,
             "lost_fraction_mixed_scaled": lost if scale == 1 else 0.0, "loss_scale": scale,
             "log2_hist": _histogram(0), "method": "test"}
            for when in ("first step", "last step") for layer, lost in (("conv1", 0.03), ("fc", 0.001))])
    return tables


def write_run(tmp_path, frameworks=("torch", "tf"), precisions=("fp32", "fp16", "bf16"), seeds=(0, 1, 2),
              speeds=None, steps=200, calibrations=STEADY, loss_scale=None, epochs=3, memory=None, model="simple_cnn"):
    """A finished compare's folder from synthetic tables; speeds[(framework, precision)] -> per-seed speed,
    memory[(framework, precision)] -> per-seed peak memory in MiB (else 100 MiB fp32, 90 MiB mixed)."""
    rng = np.random.default_rng(0)
    run_dir = tmp_path / "r"
    cells = interleaved_order([RunConfig(framework=fw, precision=p, seed=s, dataset="synthetic", epochs=epochs,
                                         model=model,
                                         loss_scale=loss_scale if p == "fp16-static" else None)
                               for s in seeds for p in precisions for fw in frameworks])
    for cfg in cells:
        speed = (speeds or {}).get((cfg.framework, cfg.precision), [1.0 if cfg.precision == "fp32" else 0.5] * 9)
        mib = (memory or {}).get((cfg.framework, cfg.precision))
        records.write_cell(run_dir / "cells" / cfg.cell_id,
                           _tables(cfg, speed[cfg.seed], steps, rng, epochs, mib[cfg.seed] if mib else None))
    manifest = {"run_id": "r", "command": "python -m amp_compare compare (synthetic)", "device": "cpu", "notes": [],
                "matrix": {"frameworks": list(frameworks), "models": [model], "datasets": ["synthetic"],
                           "precisions": list(precisions), "seeds": list(seeds)},
                "defaults": {"warmup_steps": 0, "comparison": "aligned", "init": "shared"},
                "cells": [c.cell_id for c in cells], "configs": [c.to_dict() for c in cells],
                "environment": {**CPU, "timestamp": "2026-11-23T00:00:00+00:00"}, "calibrations": calibrations}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def make_run(tmp_path, **kwargs) -> tuple:
    """write_run, rendered as a compare renders it (no figures): (report.Rendered, the page's text)."""
    run_dir = write_run(tmp_path, **kwargs)
    rendered = report.render(run_dir, figures=False)
    return rendered, html_lib.unescape((run_dir / "index.html").read_text())


def section(html: str, name: str) -> str:
    """The text of one report section (from its heading to the next)."""
    start = html.index(f'<h2 id="{name}">')
    end = html.find("<h2 ", start + 1)
    return html[start:end if end > 0 else None]


def one(sentences: list[str], text: str) -> str:
    found = [s for s in sentences if text in s]
    assert len(found) == 1, (text, sentences)
    return found[0]


def test_one_seed_says_its_spread_is_unknown_and_names_no_method_it_did_not_use(tmp_path):
    rendered, html = make_run(tmp_path, seeds=(0,))
    said = rendered.findings
    # one reading per precision and no identical cells anywhere: the run cannot resolve a memory difference
    memory = rendered.verdicts[rendered.verdicts["metric"] == "memory"]
    assert set(memory["reason"]) == {"no_resolution"} and set(memory["status"]) == {"undecided"}
    text = " ".join(said) + section(html, "speed") + section(html, "summary")
    for absent in ("rotated", "Student's t", "bootstrap over step times and seeds", "seeds'"):
        assert absent not in text, absent
    assert "medians over one seed (0)" in section(html, "summary")
    # one fp32 seed: no measured floor for accuracy, no interval over seeds for time to target; each says so
    v = rendered.verdicts.set_index(["framework", "precision", "metric"])
    assert {v.loc[(fw, p, "accuracy"), "reason"] for fw in ("torch", "tf") for p in ("fp16", "bf16")} <= {
        "no_floor", "no_image_differed"}
    assert v.loc[("torch", "fp16", "time_to_target"), "reason"] == "one_seed"
    assert "undecided (one seed)" in html


def test_the_loss_scaling_lab_without_bf16_explains_only_its_own_modes(tmp_path):
    rendered, html = make_run(tmp_path, precisions=("fp32", "fp16", "fp16-noscale", "fp16-static"), seeds=(0,),
                              loss_scale=1024.0, steps=264)
    intro = section(html, "summary").split("</p>")[0]
    assert "trained the same network on the same data in 4 precision modes: fp32 (everything in float32); fp16 (" \
        in intro
    assert "fp16-static (autocast in PyTorch and a dtype policy in Keras, computing most layers in float16, with " \
           "the fixed loss scale 1024 (--loss-scale), never grown or backed off)" in intro
    for part in (intro, section(html, "glossary"), section(html, "numerics")):
        assert "bf16" not in part and "bfloat16" not in part and "three precision modes" not in part
    scaling = section(html, "numerics")  # loss scaling is the Numerics section's first part
    assert ("No dynamically scaled cell had more than 264 clean steps in a row, so in this run the scale could not "
            "grow, only back off.") in scaling
    assert "could not grow (--growth-interval ≥ clean steps in a row)" in scaling  # no "0 growth events"
    assert "No step was skipped in this run." in scaling and "No loss-scaled cell" not in scaling
    assert "grew the scale 0 times" not in html
    table = rendered.table.set_index(["framework", "precision"])["skipped_steps"]
    assert np.isnan(table[("torch", "fp16-noscale")]) and np.isnan(table[("torch", "fp32")])
    assert table[("torch", "fp16")] == 0 and table[("torch", "fp16-static")] == 0
    assert "| fp16-noscale | 1 |" in (tmp_path / "r" / "summary.md").read_text()
    happened = section(html, "numerics")  # what happened is said in the Numerics part it belongs to
    assert ("PyTorch fp16-noscale, after the last step: 31 of the 2,000 non-zero gradient elements (1.55%) came out "
            "exactly zero in the real float16 backward (no loss scaling); most (30 of 31) were in conv1.weight, then "
            "fc.weight (1).") in happened
    assert ("PyTorch fp16, after the last step (the first batch again): the largest |parameter gradient| was below "
            "2^-4; times the scale the scaler held after that step (2^15) below 2^11 — a bound, like each below, on "
            "the parameter gradients at its probe only, not on other steps' nor on the intermediate tensors of the "
            "backward, where overflow can also happen (the NaN/Inf locator names the tensor at a cell's first skip), "
            "so it does not say whether a step overflowed.") in happened
    assert "no update of" not in happened  # a cell that skipped nothing: said once, in the Loss scaling part
    # the caveat is said once (audit T7: four times verbatim); the other cells' sentences keep their numbers
    assert happened.count("not on other steps'") == 1, happened
    assert "fp16-static, after the last step (the first batch again): the largest |parameter gradient| was below " \
           "2^-4; times the scale the scaler held after that step (2^10) below 2^6. The step records:" in happened
    assert "nothing overflowed" not in html
    # the accuracies with and without scaling carry the Accuracy section's paired test against fp32
    assert "PyTorch: validation accuracy " in scaling and "with dynamic loss scaling (against fp32: " in scaling \
        and "without any (against fp32: " in scaling, scaling


def test_a_single_framework_run_speaks_of_that_framework_only(tmp_path):
    rendered, html = make_run(tmp_path, frameworks=("torch",))
    intro = section(html, "summary").split("</p>")[0]
    assert "PyTorch trained the same network on the same data in 3 precision modes" in intro
    assert "Each framework" not in intro and "Keras" not in intro
    for part in (section(html, "glossary"), section(html, "numerics")):
        assert "Keras" not in part and "LossScaleOptimizer" not in part
    assert not any("Keras" in s for s in rendered.findings)


def test_seeds_that_disagree_get_their_geometric_mean_and_no_verdict(tmp_path):
    """Issue 28's default run, re-made: PyTorch bf16 per-seed ratios 0.70, 1.05, 1.06 ("1.04× [1.02–1.05]"),
    Keras fp16 0.22, 0.14, 0.26 ("0.23× [0.22–0.23]"), with the precision order rotated per seed."""
    speeds = {("torch", "bf16"): [0.70, 1.05, 1.06], ("tf", "fp16"): [0.22, 0.14, 0.26]}
    rendered, html = make_run(tmp_path, speeds=speeds, steps=200)
    t = rendered.table.set_index(["framework", "precision"])
    assert t.loc[("torch", "bf16"), "speedup_vs_fp32"] == pytest.approx(0.92, abs=0.01)  # the seeds' geometric mean
    # what training took, never a verdict: no ⚠, no sentence on these wall-time ratios (speed is the trials')
    assert "speed_note" not in t and not any("against fp32's" in s for s in rendered.findings)


def test_a_collapsed_loss_scale_is_said_from_the_step_records(tmp_path):
    """Issue 32: "so nothing overflowed" was printed beside a scale the loss scaler had cut to 2^-8. The largest
    parameter gradient bounds nothing inside the backward: the cell's skipped updates, at the scales each used,
    and its last step's scale and skip (its step records) say what overflowed."""
    run_dir = write_run(tmp_path, precisions=("fp32", "fp16"), seeds=(0,), frameworks=("torch",), steps=30)
    cell = next((run_dir / "cells").glob("torch-*-fp16-*"))
    steps = pd.read_parquet(cell / "steps.parquet")
    skipped = steps["step"].isin(range(5, 30))
    steps["skipped"] = skipped
    steps["loss_scale"] = 32768.0 / 2.0 ** skipped.cumsum().shift(fill_value=0)
    records.atomic_write_table(cell / "steps.parquet", steps)
    report.render(run_dir, figures=False)
    happened = section(html_lib.unescape((run_dir / "index.html").read_text()), "numerics")
    assert "nothing overflowed" not in happened
    assert "so it does not say whether a step overflowed. The step records: the scaler skipped 25 of 30 updates, " \
           "25 with a finite loss (non-finite gradients at the scale then in use" in happened, happened
    assert "steps 5–29, at 25 scales from 2^15 down to 2^-9" in happened, happened
    assert "; the last step (step 29, counting from 0) ran at 2^-9 and was skipped, with a finite loss." in happened


def test_lost_elements_spread_thinly_are_counted_not_called_most():
    """Issue 32: "most were in blocks.0.attn.query.weight (1, 33%)" for 1 of 3 lost elements."""
    from amp_compare.harness.report import numerics

    rows = [{"framework": "tf", "precision": "fp16", "seed": 0, "when": "last step", "loss_scale": 32768.0,
             "layer": layer, "param": "weight", "nonzero": 6200, "lost_fraction_mixed_scaled": lost / 6200,
             "lost_fraction_mixed_unscaled": 0.0} for layer, lost in (("a", 1), ("b", 1), ("c", 1))]
    (said,) = numerics.lost_sentences(pd.DataFrame(rows))
    assert "most (" not in said and "most were" not in said, said
    assert said.endswith("they were spread over 3 layers, none holding most of them: a.weight (1), b.weight (1), "
                         "c.weight (1)."), said


def test_zeros_by_cancellation_at_the_scale_are_counted_apart_from_the_lost():
    """Audit F10: "none of the 29,005 non-zero gradient elements came out exactly zero ... at the scale" beside a
    table whose "cancelled at that scale only" column held 1 of them."""
    from amp_compare.harness.report import numerics

    rows = [{"framework": "tf", "precision": "fp16", "seed": 0, "when": "last step", "loss_scale": 32768.0,
             "layer": "conv2", "param": "weight", "nonzero": 18432, "lost_fraction_mixed_scaled": 0.0,
             "lost_fraction_mixed_unscaled": 0.0, "cancelled_fraction_mixed_scaled": 1 / 18432}]
    (said,) = numerics.lost_sentences(pd.DataFrame(rows))
    assert said == ("Keras (TF) fp16, after the last step: none of the 18,432 non-zero gradient elements came out "
                    "exactly zero in the real float16 backward both at the scale held after the last step (2^15) and "
                    "without it (lost); 1 (0.005%) did only at the scale (float16 cancellation)."), said
    # audit (a Xeon's default run): "none ... (lost)" beside a table whose no-scaling column held 9 of them
    (said,) = numerics.lost_sentences(pd.DataFrame([{**rows[0], "lost_fraction_mixed_unscaled": 9 / 18432}]))
    assert "without it (lost; without the scale alone, 9 did); 1 (0.005%) did only at the scale" in said, said


def test_exact_zeros_of_a_key_bias_are_named_as_residue():
    """The lab audit: "3 of the 18,601 ... came out exactly zero" for fp16-noscale, all attention key-bias residue
    (an exact gradient of zero), which the table beside it marks and the sentence did not."""
    from amp_compare.harness.report import numerics

    rows = [{"framework": "tf", "precision": "fp16-noscale", "seed": 0, "when": "last step", "loss_scale": 1.0,
             "layer": layer, "param": param, "nonzero": n, "lost_fraction_mixed_unscaled": lost,
             "lost_fraction_mixed_scaled": lost}
            for layer, param, n, lost in (("blocks.0.attn.key", "bias", 32, 2 / 32), ("fc", "weight", 640, 1 / 640))]
    (said,) = numerics.lost_sentences(pd.DataFrame(rows))
    assert said.endswith("blocks.0.attn.key.bias, then fc.weight (1) (2 of them attention key-bias residue)."), said
    (alone,) = numerics.lost_sentences(pd.DataFrame(rows[:1]))
    assert alone.endswith("(all attention key-bias residue)."), alone
    # round 2: a key bias zero only at the scale is residue too, not "float16 cancellation"
    scaled = [{**r, "precision": "fp16", "loss_scale": 32768.0, "lost_fraction_mixed_scaled": 0.0,
               "cancelled_fraction_mixed_scaled": r["lost_fraction_mixed_unscaled"]} for r in rows[:1]]
    (said,) = numerics.lost_sentences(pd.DataFrame(scaled))
    assert "cancellation" not in said, said


def test_the_dtype_audit_counts_the_rows_that_differ_instead_of_saying_every_row_should_match():
    from amp_compare.harness.report import numerics
    from amp_compare.harness.report.wording import RunFacts

    facts = RunFacts(frameworks=["torch", "tf"], precisions=["fp32", "fp16"], device="cpu")
    differing = {"fp16": {"rows": 3, "of": 72, "layers": ["(unnamed)", "blocks.1.attn", "blocks.0.attn"]},
                 "bf16": {"rows": 2, "of": 72, "layers": ["blocks.1.attn", "blocks.0.attn"]}}
    said = numerics.section_words(facts, {"differing": differing})["dtype_audit"]
    assert "should match" not in said, said
    assert "5 rows differ between the frameworks, marked in red, counted over the rows both attribute — " \
           "fp16: 3 of 72 rows ((unnamed), blocks.1.attn, " \
           "blocks.0.attn); bf16: 2 of 72 rows" in said, said
    none = numerics.section_words(facts, {"differing": {"fp16": {"rows": 0, "of": 72, "layers": []}}})
    assert "No row both frameworks attribute differs between them." in none["dtype_audit"]


def test_a_dtype_audit_row_one_framework_does_not_attribute_is_no_difference():
    """Audit: "fp8: 34 of 59 rows differ" counted rows Keras' audit has no op for ("-") as differences."""
    import pandas as pd

    from amp_compare.harness.report import numerics
    from amp_compare.harness.report.wording import RunFacts

    dtypes = pd.DataFrame([{"framework": fw, "precision": "fp8", "seed": 0, "layer": layer, "phase": "forward",
                            "op": op, "compute_dtype": dt, "param_dtype": "float32"}
                           for fw, layer, op, dt in (("torch", "fc", "addmm", "float32"),
                                                     ("torch", "blocks.0.mlp.fc1", "mm", "float32"),
                                                     ("tf", "fc", "MatMul", "float32"),
                                                     ("torch", "blocks.0.attn", "sdpa", "float32"),
                                                     ("tf", "blocks.0.attn", "Einsum", "bfloat16"))])
    side = numerics.dtype_side_by_side(dtypes)["fp8"]
    assert dict(zip(side["layer"], side["differs"])) == {"fc": False, "blocks.0.mlp.fc1": False,
                                                         "blocks.0.attn": True}
    facts = numerics.op_dtype_facts(dtypes, "cpu")
    assert facts["differing"]["fp8"] == {"rows": 1, "of": 2, "unattributed": 1, "layers": ["blocks.0.attn"]}
    rf = RunFacts(frameworks=["torch", "tf"], precisions=["fp32", "fp8"], device="cpu")
    said = numerics.section_words(rf, facts)["dtype_audit"]
    assert "fp8: 1 of 2 rows (blocks.0.attn)" in said and "1 row (fp8: 1) one framework's audit does not " \
           "attribute" in said, said


def test_whether_the_scale_could_grow_counts_clean_steps_in_a_row_not_steps():
    """Audit (naive attention): 27 steps with skips at most 2 steps apart; the report advised a --growth-interval
    below 27, where only one of 2 or less could have doubled the scale."""
    import pandas as pd

    from amp_compare.harness.report import numerics
    from amp_compare.harness.report.wording import RunFacts, loss_scaling_intro

    def said(growth):  # the Loss scaling paragraph of a run with these growth facts
        return loss_scaling_intro(RunFacts(frameworks=["torch"], precisions=["fp32", "fp16"], device="cpu",
                                           growth=growth, halves={"float16"}))[0]

    runs = pd.DataFrame({"cell_id": ["a"], "precision": ["fp16"], "cfg_growth_interval": [20]})
    skipped = [False, True, False, False, True, False, True] + [True] * 20
    steps = pd.DataFrame({"cell_id": "a", "step": range(len(skipped)), "skipped": skipped})
    assert numerics.growth_facts(runs, steps) == (20, 2)
    assert "No dynamically scaled cell had more than 2 clean steps in a row" in said((20, 2))
    clean = steps.assign(skipped=False)
    assert numerics.growth_facts(runs, clean) == (20, 27)
    assert said((20, 27)).endswith("A dynamically scaled cell had 27 clean steps in a row, so in this run the scale "
                                   "could grow.")
