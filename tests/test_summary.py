import pandas as pd
import pytest

from common.summary import findings, formatted_summary, summary_table


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
    assert t.loc[("torch", "fp16"), "accuracy_change_pp"] == pytest.approx(-2.0)
    assert t.loc[("torch", "fp32"), "runs"] == 1
    f = formatted_summary(summary_table(_runs()))
    assert list(f["Speed vs fp32"][:3]) == ["1.00×", "0.25×", "0.50×"]


def test_findings_are_sentences_from_the_numbers():
    steps = pd.DataFrame({"framework": ["torch", "torch"], "precision": ["fp16", "fp16"], "step": [0, 1],
                          "loss_scale": [2.0**15, 2.0**14], "skipped": [True, False]})
    env = {"cpu_amp_flags": "avx2,f16c", "cpu_bf16_hardware": False, "cpu_fp16_hardware": False}
    text = findings(_runs(), steps, env)
    assert 3 <= len(text) <= 6
    assert any("fp16 at 0.25× (25 images/s)" in s for s in text)
    assert any("emulate" in s for s in text)
    assert any("skipped 1 of 2 steps" in s and "2^14" in s for s in text)
