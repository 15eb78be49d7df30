"""A combined report of two runs with different models and seed counts (issue 18: every finding names the
model/dataset its numbers belong to and counts its runs per group; "several machines" only when they differ)."""

import json

import numpy as np
import pandas as pd

from amp_compare.contract import records
from amp_compare.contract.records import pack_correct
from amp_compare.harness.report.render import render_combined

CPU = "Test CPU 9000"
ENV = {"cpu_model": CPU, "cpu_amp_flags": "avx2,f16c", "cpu_bf16_hardware": False, "cpu_fp16_hardware": False,
       "timestamp": "2026-11-22T20:00:00+00:00", "calibration_before_ms": 10.0, "calibration_after_ms": 10.5,
       "calibration_before_spread": 0.02, "calibration_after_spread": 0.03}


def _fake_run(run_dir, model, dataset, seeds, thr):
    """A finished compare run folder: manifest and torch/tf x fp32/fp16 cells with records."""
    rng = np.random.default_rng(len(seeds))
    cells = []
    for seed in seeds:
        base = rng.random(200) < 0.9
        for fw in ("torch", "tf"):
            for prec in ("fp32", "fp16"):
                cell = f"{fw}-{model}-{dataset}-{prec}-s{seed}"
                cells.append(cell)
                identity = {"run_id": run_dir.name, "cell_id": cell, "framework": fw, "model": model,
                            "dataset": dataset, "precision": prec, "seed": seed}
                run = {**identity, "schema_version": 1, "status": "ok", "error": "", "cfg_device": "cpu",
                       "throughput_img_s": thr * (1.0 if prec == "fp32" else 0.5), "peak_memory_bytes": 2**24,
                       "memory_kind": "cpu_peak_rss_above_baseline", "final_val_accuracy": float(base.mean()),
                       "skipped_steps": 0, "val_samples": 200, "val_correct": pack_correct(base), "cpu_model": CPU,
                       "child_wall_s": 1.0}
                epochs = pd.DataFrame([{**identity, "epoch": e, "train_loss": 1.0 - e / 10, "train_accuracy": 0.8,
                                        "val_loss": 0.5, "val_accuracy": float(base.mean()) - 0.005 * (2 - e),
                                        "train_time_s": 1.0, "eval_time_s": 0.1} for e in range(3)])
                n = 30
                steps = pd.DataFrame({**{k: [v] * n for k, v in identity.items()}, "epoch": [i // 10 for i in range(n)],
                                      "step": range(n), "loss": np.linspace(2, 1, n),
                                      "loss_scale": 2.0**15 if prec == "fp16" else 1.0, "skipped": False,
                                      "step_time_s": (64 / thr) * (1.0 if prec == "fp32" else 2.0)
                                      * (1 + 0.01 * rng.random(n)), "warmup": [i < 2 for i in range(n)]})
                records.write_cell(run_dir / "cells" / cell, {"run": pd.DataFrame([run]), "epochs": epochs,
                                                              "steps": steps})
    manifest = {"run_id": run_dir.name, "device": "cpu", "cells": cells, "environment": ENV,
                "matrix": {"frameworks": ["torch", "tf"], "models": [model], "datasets": [dataset],
                           "precisions": ["fp32", "fp16"], "seeds": list(seeds)},
                "defaults": {"warmup_steps": 2}, "command": f"python -m amp_compare compare --models {model}",
                "notes": []}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def test_combined_report_names_each_model_and_counts_its_seeds(tmp_path):
    reports = tmp_path / "reports"
    a = _fake_run(reports / "run-a", "simple_cnn", "digits", (0, 1, 2), 2000.0)
    b = _fake_run(reports / "run-b", "resnet18", "synthetic", (0,), 100.0)
    index = render_combined([a, b], reports / "combined", figures=False)  # figures: test_measurements.py
    manifest = json.loads((reports / "combined" / "manifest.json").read_text())
    assert manifest["device"] == "cpu"  # two runs on one machine are not "several machines"
    assert manifest["matrix"]["models"] == ["simple_cnn", "resnet18"]
    md = (reports / "combined" / "summary.md").read_text()
    found = [line[2:] for line in md.splitlines() if line.startswith("- ")]
    for sentence in found:
        # a finding names one model/dataset, never both, and no machine: each model ran on one
        assert not ("simple_cnn on digits" in sentence and "resnet18 on synthetic" in sentence), sentence
        assert "run-a" not in sentence and "run-b" not in sentence
    # each model's verdicts in a table of its own (phrases.table), titled by the model
    assert "#### simple_cnn on digits" in md and "#### resnet18 on synthetic" in md
    assert sum("flags list no" in line for line in md.splitlines()) == 1  # the CPU explanation once
    html = index.read_text()
    assert "3 seeds for simple_cnn on digits and 1 seed for resnet18 on synthetic" in html
    assert "over 4 runs" not in html and "several machines" not in html
    assert html.count("flags list no") == 1  # the Answer's first line
    # the loss-scaled steps per model and dataset: the Loss scaling table's rows (medians over seeds)
    for model, dataset in (("simple_cnn", "digits"), ("resnet18", "synthetic")):
        assert (f"<td class='l'>{model}</td><td class='l'>{dataset}</td><td class='l'>PyTorch</td><td class='l'>fp16"
                "</td><td>30</td><td>0</td>") in html
    runs_index = (reports / "index.html").read_text()
    assert "simple_cnn,resnet18" in runs_index  # the run list's Matrix column shows every run's models
