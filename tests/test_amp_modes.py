"""Loss-scaling modes, --fp32-layers, the NaN/Inf locator and gradient clipping, in both frameworks."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from amp_compare.contract.config import RunConfig
from amp_compare.kit.data import load_dataset

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    """fp16 (built to overflow: initial scale 2**40), fp16-noscale and fp16-static, fc forced to float32."""
    out = tmp_path_factory.mktemp("lab")
    proc = subprocess.run(
        [sys.executable, "-m", "amp_compare", "compare", "--precisions", "fp16,fp16-noscale,fp16-static",
         "--loss-scale", "1024", "--init-scale", str(2.0**40), "--fp32-layers", "fc", "--models", "simple_cnn",
         "--datasets", "synthetic", "--epochs", "1", "--steps-per-epoch", "4", "--batch-size", "16", "--seeds", "0",
         "--device", "cpu", "--warmup-steps", "1", "--no-figures", "--out", str(out), "--run-id", "lab"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = out / "lab" / "data"
    return {name: pd.read_parquet(data / f"{name}.parquet") for name in ("run", "steps", "dtypes", "underflow")}, \
        out / "lab"


def test_scaling_modes_record_their_scale(lab_run):
    tables, _ = lab_run
    steps = tables["steps"]
    for fw in ("torch", "tf"):
        mine = steps[steps["framework"] == fw]
        assert (mine[mine["precision"] == "fp16-static"]["loss_scale"] == 1024).all()
        assert (mine[mine["precision"] == "fp16-noscale"]["loss_scale"] == 1).all()
        dynamic = mine[mine["precision"] == "fp16"].sort_values("step")
        # 2**40 overflows float16 in the backward: the scaler skips and halves until it fits.
        assert dynamic["skipped"].iloc[0] and dynamic["loss_scale"].iloc[0] == 2.0**40
        assert (np.diff(np.log2(dynamic["loss_scale"].to_numpy()))[dynamic["skipped"].to_numpy()[:-1]] == -1).all()


def test_locator_names_the_layer_where_the_overflow_happened(lab_run):
    tables, _ = lab_run
    runs = tables["run"].set_index(["framework", "precision"])
    for fw in ("torch", "tf"):
        row = runs.loc[(fw, "fp16")]
        assert row["nonfinite_step"] == 0 and row["nonfinite_where"] == "backward"
        assert row["nonfinite_layer"] != "" and row["nonfinite_value"] in ("inf", "nan")
        assert runs.loc[(fw, "fp16-static"), "nonfinite_step"] == -1


def test_fp32_layers_took_effect_in_both_frameworks(lab_run):
    tables, _ = lab_run
    dtypes = tables["dtypes"]
    forward = dtypes[dtypes["phase"] == "forward"]
    for fw in ("torch", "tf"):
        mine = forward[forward["framework"] == fw]
        assert set(mine[mine["layer"] == "fc"]["compute_dtype"]) == {"float32"}, fw
        assert "float16" in set(mine[mine["layer"] == "conv1"]["compute_dtype"]), fw


def test_underflow_rows_for_every_layer_at_first_and_last_step(lab_run):
    tables, _ = lab_run
    under = tables["underflow"]
    assert set(under["when"]) == {"first step", "last step"}
    assert under["flush_fraction_unscaled"].between(0, 1).all()
    static = under[under["precision"] == "fp16-static"]
    assert (static["flush_fraction_scaled"] <= static["flush_fraction_unscaled"] + 1e-12).all()
    assert set(under["layer"]) >= {"conv1", "conv2", "fc"}


def test_report_has_the_numerics_sections(lab_run):
    _, run_dir = lab_run
    html = (run_dir / "index.html").read_text()
    for heading in (">Numerics</h2>", ">Loss scaling</h3>", ">Gradient underflow</h3>"):  # what happened, merged in
        assert heading in html
    assert "backward" in html  # the underflow figure is drawn in the shared tiny compare (test_end_to_end.py)


# Clipping: with a large loss scale the scaled gradients are 2**14 times the true ones. Clipping
# must see the true (unscaled) global norm: one SGD step (lr 1, no momentum) then moves the weights
# by exactly the clip norm. Had it clipped the scaled gradients, the move would be 2**14 smaller.
CLIP = 1e-3


def _cfg(framework: str) -> RunConfig:
    return RunConfig(framework=framework, dataset="synthetic", precision="fp16", optimizer="sgd", lr=1.0,
                     momentum=0.0, init_scale=2.0**14, clip_grad_norm=CLIP, init="framework")


def _move(before: dict, after: dict) -> float:
    return float(np.sqrt(sum(np.sum((after[k] - before[k]).astype(np.float64) ** 2) for k in before)))


def test_torch_clipping_sees_the_unscaled_gradient_norm():
    import torch

    from amp_compare.torch_impl.amp import make_scaler, train_step
    from amp_compare.torch_impl.models import get_weights
    from amp_compare.torch_impl.train import make_model, make_optimizer

    cfg, data = _cfg("torch"), load_dataset("synthetic")
    model = make_model(cfg, data)
    opt, scaler = make_optimizer(cfg, model.parameters()), make_scaler(cfg)
    x = torch.from_numpy(data.x_train[:16]).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(data.y_train[:16])
    before = get_weights(model)
    train_step(model, opt, scaler, x, y, "fp16", clip_grad_norm=CLIP)
    assert scaler.get_scale() == 2.0**14  # no overflow: the step was taken
    assert _move(before, get_weights(model)) == pytest.approx(CLIP, rel=1e-2)


def test_keras_clipping_sees_the_unscaled_gradient_norm():
    import keras

    from amp_compare.keras_impl.loop import step_row
    from amp_compare.keras_impl.models import get_weights
    from amp_compare.keras_impl.train import make_model, make_optimizer, setup

    cfg, data = _cfg("tf"), load_dataset("synthetic")
    setup(cfg)
    try:
        model = make_model(cfg, data)
        model.compile(optimizer=make_optimizer(cfg, model.trainable_variables),  # built, as train() builds it
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                      auto_scale_loss=False)
        before = get_weights(model)
        logs = step_row(model.train_on_batch(data.x_train[:16], data.y_train[:16], return_dict=True))
        assert logs["loss_scale"] == 2.0**14 and not logs["skipped"]
        assert _move(before, get_weights(model)) == pytest.approx(CLIP, rel=1e-2)
    finally:
        keras.config.set_dtype_policy("float32")
