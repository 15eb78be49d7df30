"""Every run checks itself: settings read back from the live objects, compared across frameworks.

The records come from the functions a compare child calls (make_model, make_optimizer, make_scaler,
make_loss, settings_used); a deliberately wrong mapping must be flagged, in the comparison rows and
in the report's side-by-side table and note.
"""

from __future__ import annotations

import json

import pytest

from amp_compare.contract import mapping
from amp_compare.contract.config import RunConfig
from amp_compare.harness.report.settings_check import compare_settings, side_by_side
from amp_compare.kit.data import load_synthetic

keras = pytest.importorskip("keras")
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def restore_policy():
    previous = keras.config.dtype_policy().name
    yield
    keras.config.set_dtype_policy(previous)


def records(precision: str = "fp16", optimizer: str = "adam", comparison: str = "aligned") -> tuple[dict, dict]:
    """Both children's settings_used for one resnet18 cell, built as a compare run builds it."""
    from amp_compare.keras_impl import settings as ks
    from amp_compare.keras_impl import train as kt
    from amp_compare.torch_impl import settings as ps
    from amp_compare.torch_impl import train as pt
    from amp_compare.torch_impl.amp import make_scaler

    data = load_synthetic()
    kw = dict(model="resnet18", dataset="synthetic", width=4, precision=precision, optimizer=optimizer,
              comparison=comparison)
    cfg = RunConfig(framework="torch", **kw)
    pt.setup(cfg)  # as the child does: TF32 (read back into settings_used) among others
    model = pt.make_model(cfg, data)
    torch_used = ps.settings_used(model, pt.make_optimizer(cfg, model.parameters()), make_scaler(cfg), cfg)
    cfg = RunConfig(framework="tf", **kw)
    kt.setup(cfg)  # sets the policy, TF32, threads and seed as the child does
    kmodel = kt.make_model(cfg, data)
    kmodel.compile(optimizer=kt.make_optimizer(cfg, kmodel.trainable_variables), loss=kt.make_loss(cfg),
                   auto_scale_loss=False)
    return torch_used, ks.settings_used(kmodel, kmodel.optimizer, kmodel.optimizer, cfg)


def cell_records(torch_used: dict, keras_used: dict) -> list[dict]:
    cell = {"model": "resnet18", "dataset": "synthetic", "precision": "fp16", "seed": 0}
    return [{**cell, "framework": "torch", "settings_used": json.dumps(torch_used)},
            {**cell, "framework": "tf", "settings_used": json.dumps(keras_used)}]


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_aligned_settings_match_row_by_row(optimizer):
    rows = compare_settings(*records(optimizer=optimizer))
    assert [r["key"] for r in rows if not r["match"]] == [], rows
    keys = {r["key"] for r in rows}
    assert {"bn_momentum", "bn_epsilon", "stride2_padding", "output_dtype", "loss_reduction", "init_scale",
            "growth_interval", "learning_rate"} <= keys
    assert ({"adam_epsilon", "adam_beta_1", "adam_beta_2", "adam_formula"} if optimizer == "adam"
            else {"sgd_momentum"}) <= keys


def test_a_wrong_mapping_is_flagged(monkeypatch):
    """Keras given torch's BatchNorm momentum convention (0.1) and Keras' own padding: both rows flagged."""
    from amp_compare.keras_impl import train as kt

    def wrong(cfg):
        settings = mapping.framework_settings(cfg)
        return {**settings, "bn_momentum": mapping.BN_MOMENTUM_TORCH, "stride2_padding": "same"} if settings else {}

    monkeypatch.setattr(kt, "framework_settings", wrong)
    torch_used, keras_used = records()
    flagged = {r["key"] for r in compare_settings(torch_used, keras_used) if not r["match"]}
    assert flagged == {"bn_momentum", "stride2_padding"}
    table = side_by_side(cell_records(torch_used, keras_used))
    marks = {r["setting"]: r["match"] for r in table["rows"]}
    assert marks["bn_momentum"].startswith("✗ MISMATCH") and marks["bn_epsilon"] == "✓"
    assert "SETTINGS MISMATCH" in table["note"] and "bn_momentum" in table["note"]


def test_defaults_mode_differs_where_the_frameworks_do():
    flagged = {r["key"] for r in compare_settings(*records(comparison="defaults")) if not r["match"]}
    assert {"adam_epsilon", "adam_formula", "bn_momentum", "bn_epsilon", "stride2_padding", "output_dtype",
            "init_scale"} <= flagged


def test_a_match_of_differently_printed_values_says_it_matched_after_mapping():
    """Issue 32: "loss_reduction | mean | sum_over_batch_size | ✓" read as a match of two different values."""
    torch_used, keras_used = records()
    assert torch_used["loss_reduction"] != keras_used["loss_reduction"]  # the conventions differ, the meaning not
    marks = {r["setting"]: r["match"] for r in side_by_side(cell_records(torch_used, keras_used))["rows"]}
    assert marks["loss_reduction"] == "✓ each cell's two records equal in torch's convention (mean)", marks
    assert marks["bn_momentum"].startswith("✓ each cell's two records equal in torch's convention (")
    assert marks["bn_epsilon"] == "✓"  # printed the same: a bare ✓


def test_a_scheduled_learning_rate_shows_as_its_schedule_and_peak():
    """The audit: "learning_rate 0.000115385; 0.001" was the vit's first warm-up value (the optimizer's record),
    not its 3e-3 peak. The table shows each cell's rate as its config set it; the comparison stays on the
    optimizers' records."""
    torch_used, keras_used = records()
    vit = [{**r, "model": "vit", "cfg_lr": 0.003, "cfg_lr_schedule": "warmup-cosine"}
           for r in cell_records({**torch_used, "learning_rate": 0.003 / 26},
                                 {**keras_used, "learning_rate": 0.003 / 26})]
    cnn = [{**r, "cfg_lr": 0.001, "cfg_lr_schedule": "constant"} for r in cell_records(torch_used, keras_used)]
    row = next(r for r in side_by_side(vit + cnn)["rows"] if r["setting"] == "learning_rate")
    assert row["torch"] == row["keras"] == "constant 0.001; warmup-cosine, peak 0.003", row
    assert row["match"] == "✓"


def test_differences_table_lists_only_the_parts_the_run_has():
    from amp_compare.contract.mapping import DIFFERENCES
    from amp_compare.harness.report.settings_check import differences_apply

    def keys(models, optimizers, precisions):
        return {d.key for d in DIFFERENCES if differences_apply(d.key, models, optimizers, precisions)}

    cnn = keys({"simple_cnn"}, {"adam"}, {"fp32", "fp16", "fp16-noscale"})
    assert not cnn & {"ln_epsilon", "gelu_approximate", "mha_bias", "mha_dropout", "token_dtype", "attention_core",
                      "bn_momentum", "bn_epsilon", "stride2_padding", "adamw_weight_decay"}
    assert {"adam_epsilon", "weight_decay", "init_scale", "growth_interval", "initial_weights"} <= cnn
    vit = keys({"vit"}, {"adamw"}, {"fp32", "bf16"})
    assert {"ln_epsilon", "attention_core", "adamw_weight_decay"} <= vit
    assert not vit & {"bn_momentum", "weight_decay", "init_scale", "growth_interval"}
    assert {"bn_momentum", "stride2_padding"} <= keys({"resnet18"}, {"sgd"}, {"fp32"})


def test_a_weight_decay_the_optimizer_ignores_is_said_plainly():
    from amp_compare.harness.report.settings_check import ignored_settings

    cells = [{"model": "simple_cnn", "cfg_optimizer": "adam", "cfg_weight_decay": 0.05},
             {"model": "vit", "cfg_optimizer": "adamw", "cfg_weight_decay": 0.05}]
    assert ignored_settings(cells) == [
        "simple_cnn: weight decay 0.05 was configured but not used: its optimizer, adam, trains without weight decay "
        "in both frameworks; only adamw applies it (--optimizer adamw)."]
    assert ignored_settings([{**cells[0], "cfg_weight_decay": 0.0}]) == []


def test_records_that_do_not_say_keep_every_row():
    from amp_compare.contract.mapping import DIFFERENCES
    from amp_compare.harness.report.settings_check import differences_apply

    assert all(differences_apply(d.key, None, None, None) for d in DIFFERENCES)
