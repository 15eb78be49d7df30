"""The report's "Keras or its backend?" part is made from the run's own records (harness/report/settings_check.py)."""

from __future__ import annotations

import json

import pandas as pd

from amp_compare.harness.report.settings_check import keras_backend_split


def runs(frameworks: tuple[str, ...], eps: dict[str, float]) -> pd.DataFrame:
    rows = [{"framework": fw, "precision": "fp32", "status": "ok", "amp_api": "none",
             "settings_used": json.dumps({"adam_epsilon": eps.get(fw, 1e-7), "tf32": "off"}),
             "framework_defaults": json.dumps({"init_scale": 32768.0})} for fw in frameworks]
    rows.append({"framework": "torch", "precision": "fp32", "status": "ok",
                 "settings_used": json.dumps({"adam_epsilon": 1e-7})})
    return pd.DataFrame(rows)


def test_keras_settings_come_from_the_records():
    split = keras_backend_split(runs(("tf", "keras-jax", "keras-torch"), eps={"keras-torch": 1e-8}))
    keras = split["keras_table"].set_index("item")
    assert keras.loc["Keras default: init_scale", "same on every backend"] == "✓"
    assert keras.loc["adam_epsilon", "same on every backend"] == "✗ differs"  # keras-torch's record differs
    assert keras.loc["adam_epsilon", "Keras (torch)"] == "1e-08"
    assert "tf32" not in keras.index  # the backend's setting, in the Environment table
    assert "PyTorch" not in keras.columns  # native torch is no Keras backend
    sentences = " ".join(split["sentences"])
    assert "2 of 3 settings" in sentences and "adam_epsilon" in sentences


def test_one_backend_cannot_be_split():
    alone = keras_backend_split(runs(("tf",), eps={}))
    assert alone["keras_table"].empty and "cannot be told apart" in alone["note"]
