"""The report's "Keras or its backend?" part is made from the run's own records (harness/report/backend_split.py)."""

from __future__ import annotations

import json

import pandas as pd

from amp_compare.harness.report.backend_split import keras_backend_split


def runs(fp32_speeds: dict[str, float], eps: dict[str, float], steps_timed: int = 50) -> pd.DataFrame:
    rows = []
    for fw, speed in fp32_speeds.items():
        rows.append({"framework": fw, "precision": "fp32", "status": "ok", "throughput_img_s": speed,
                     "median_step_s": 16 / speed, "steps_timed": steps_timed, "compiled": f"{fw} compile",
                     "amp_api": "none", "settings_used": json.dumps({"adam_epsilon": eps.get(fw, 1e-7), "tf32": "off"}),
                     "framework_defaults": json.dumps({"init_scale": 32768.0})})
    rows.append({"framework": "torch", "precision": "fp32", "status": "ok", "throughput_img_s": 999.0,
                 "settings_used": json.dumps({"adam_epsilon": 1e-7})})
    return pd.DataFrame(rows)


def test_keras_settings_and_backend_speeds_come_from_the_records():
    split = keras_backend_split(runs({"tf": 100.0, "keras-jax": 400.0, "keras-torch": 50.0},
                                     eps={"keras-torch": 1e-8}))
    keras = split["keras_table"].set_index("item")
    assert keras.loc["Keras default: init_scale", "same on every backend"] == "✓"
    assert keras.loc["adam_epsilon", "same on every backend"] == "✗ differs"  # keras-torch's record differs
    assert keras.loc["adam_epsilon", "Keras (torch)"] == "1e-08"
    assert "tf32" not in keras.index  # the backend's setting, in the backend table
    backend = split["backend_table"].set_index("quantity")
    assert backend.loc["throughput (img/s, median over seeds), fp32", "Keras (JAX)"] == "400"
    assert "PyTorch" not in backend.columns  # native torch is no Keras backend
    sentences = " ".join(split["sentences"])
    assert "2 of 3 settings" in sentences and "adam_epsilon" in sentences
    assert "Keras (JAX) was 8.00× Keras (torch)" in sentences and "⚠" not in sentences
    assert "One seed per backend" in sentences  # a single measurement is said to be one


def test_untimed_steps_are_called_out_and_one_backend_cannot_be_split():
    split = keras_backend_split(runs({"tf": 100.0, "keras-jax": 400.0}, eps={}, steps_timed=0))
    assert "not a steady-state speed comparison" in " ".join(split["sentences"])
    alone = keras_backend_split(runs({"tf": 100.0}, eps={}))
    assert alone["keras_table"].empty and "cannot be told apart" in alone["note"]
