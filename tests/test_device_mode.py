"""Keras' device mode (the GPU default) records the same per-step values as host mode, without reading
them on the host every step; forced here on the CPU, where both modes can run."""

import numpy as np
import pandas as pd

from amp_compare.contract import records
from amp_compare.contract.config import RunConfig
from amp_compare.harness.run.runner import run_cell


def test_device_mode_records_what_host_mode_records(tmp_path):
    tables = {}
    for mode in ("host", "device"):
        cfg = RunConfig(framework="tf", dataset="synthetic", precision="fp16", epochs=2, steps_per_epoch=4,
                        batch_size=16, init="framework", init_scale=2.0**40, step_values=mode)
        outcome = run_cell(cfg, tmp_path / mode, "r", 300)
        assert outcome.status == "ok", outcome.error
        tables[mode] = records.read_run(tmp_path / mode)
    host, device = tables["host"]["steps"], tables["device"]["steps"]
    np.testing.assert_allclose(device["loss"], host["loss"], rtol=1e-6)
    np.testing.assert_array_equal(device["loss_scale"], host["loss_scale"])
    np.testing.assert_array_equal(device["skipped"], host["skipped"])
    assert host["skipped"].sum() > 0  # 2**40 overflows: the device log saw the skips too
    assert device["step_time_s"].isna().all() and host["step_time_s"].notna().all()
    run = tables["device"]["run"].iloc[0]
    assert np.isfinite(run["median_step_s"]) and pd.isna(run["p90_step_s"]) and run["throughput_img_s"] > 0
    assert run["nonfinite_step"] == tables["host"]["run"].iloc[0]["nonfinite_step"] == 0
    pd.testing.assert_series_equal(tables["device"]["epochs"]["val_loss"], tables["host"]["epochs"]["val_loss"],
                                   rtol=1e-5)


def test_fit_waits_for_the_device_as_often_as_the_run_records(monkeypatch):
    """Keras' TensorFlow backend converts fit()'s logs to host values after every execution of the train
    function (CallbackList.pythonify_logs: it never dispatches callbacks asynchronously there), so
    device mode alone does not spare a wait per step. The run's host_syncs_per_step must say so, and the
    tuned loop, which runs each epoch as one execution, must wait once per epoch. Counted in train() itself."""
    import io

    from tests.parity_backend_child import FAST_XLA_FLAGS

    # the tuned loop's jit_compile: XLA compiles this tiny model less hard (half the test's CPU); what is counted,
    # fit()'s conversions of its logs, is the same (read by XLA when TensorFlow first compiles, in this process)
    monkeypatch.setenv("XLA_FLAGS", FAST_XLA_FLAGS)
    from keras.src import backend as keras_backend
    from keras.src.callbacks import callback_list

    from amp_compare.keras_impl.train import train
    from amp_compare.kit.child import Progress, SharedInit
    from amp_compare.kit.data import load_dataset

    waits = []
    original = callback_list.CallbackList._on_train_batch_end

    def counting(self, batch, logs=None):
        waits.append(any(keras_backend.is_tensor(v) for v in (logs or {}).values()))
        return original(self, batch, logs)

    monkeypatch.setattr(callback_list.CallbackList, "_on_train_batch_end", counting)
    # 2 epochs of 3 steps: a wait per step (6) against one per epoch (2); few fp16 steps (docs/DEVELOPMENT.md: fp16
    # convolution backward is ~100x fp32 on a Xeon with AVX-512 FP16)
    for step, expected_waits in (("plain", 6), ("tuned", 2)):
        cfg = RunConfig(framework="tf", dataset="synthetic", precision="fp16", epochs=2, steps_per_epoch=3,
                        batch_size=16, init="framework", step_values="device", step=step)
        waits.clear()
        result = train(cfg, load_dataset(cfg.dataset), Progress(stream=io.StringIO()), SharedInit(None, "tf", 0))
        steps = len(result.step_loss)
        assert steps == 6 and np.isfinite(result.step_loss).all(), step
        assert sum(waits) == expected_waits, (step, waits)
        assert result.info["host_syncs_per_step"] * steps == expected_waits, (step, result.info)


def test_torch_times_steps_by_the_same_rule(tmp_path):
    """kit/training.times_each_step holds for torch too: host mode times each step; device mode (forced here on the
    CPU) records every step's time as missing and times the epoch, as Keras' device mode does."""
    from amp_compare.kit.training import times_each_step

    assert times_each_step(RunConfig(device="cpu")) and not times_each_step(RunConfig(device="cuda"))
    assert times_each_step(RunConfig(device="cuda", step_values="host"))
    assert not times_each_step(RunConfig(device="cpu", step_values="device"))
    assert times_each_step(RunConfig(device="cuda", step_values="device", replicas=2))  # per-worker values each step
    tables = {}
    for mode in ("host", "device"):
        cfg = RunConfig(framework="torch", dataset="synthetic", precision="fp32", epochs=2, steps_per_epoch=4,
                        batch_size=16, init="framework", step_values=mode)
        outcome = run_cell(cfg, tmp_path / mode, "r", 300)
        assert outcome.status == "ok", outcome.error
        tables[mode] = records.read_run(tmp_path / mode)
    assert tables["device"]["steps"]["step_time_s"].isna().all()
    assert tables["host"]["steps"]["step_time_s"].notna().all()
    np.testing.assert_allclose(tables["device"]["steps"]["loss"], tables["host"]["steps"]["loss"], rtol=1e-6)
    run = tables["device"]["run"].iloc[0]
    assert np.isfinite(run["median_step_s"]) and pd.isna(run["p90_step_s"]) and run["throughput_img_s"] > 0
    assert (tables["device"]["epochs"]["train_time_s"] > 0).all()
