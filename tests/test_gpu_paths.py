"""What of the GPU paths (issue 26) a CPU can check: the logic that turns a GPU cell's measurements into records.

* Keras in device mode (the GPU default) has no per-step times, only each epoch's: its headline must leave the
  first epoch, which holds tracing and XLA / torch.compile compilation, out of the timed steps, as host mode's
  warm-up steps are (else a 30 s compile in a 3-epoch run made the headline a fraction of the real speed).
* MFU's data-sheet peak names the row of the table it came from, not only the device.
"""

import math

import numpy as np
import pytest

from amp_compare.contract.config import RunConfig
from amp_compare.kit import ceiling
from amp_compare.kit.child import TrainResult, build_tables, step_time_summary

NAN = float("nan")


def test_device_mode_headline_leaves_the_compiling_first_epoch_out():
    s = step_time_summary([NAN] * 12, warmup_steps=5, batch_size=10, train_time_s=32.0,
                          epoch_times=[(30.0, 4), (1.0, 4), (1.0, 4)])
    assert s["median_step_s"] == pytest.approx(2.0 / 8)
    assert s["throughput_img_s"] == s["median_step_throughput_img_s"] == pytest.approx(10 / 0.25)
    assert s["compile_warmup_s"] == pytest.approx(30.0 - 4 * 0.25)
    one = step_time_summary([NAN] * 4, warmup_steps=5, batch_size=10, train_time_s=30.0, epoch_times=[(30.0, 4)])
    assert one["median_step_s"] == pytest.approx(30.0 / 4) and math.isnan(one["compile_warmup_s"])  # nothing later


def test_the_run_record_of_a_device_mode_cell_times_the_later_epochs():
    """Through build_tables, as the child writes the run row (the epochs' times come from its epoch rows)."""
    from amp_compare.kit.data import load_dataset

    cfg = RunConfig(framework="keras-jax", dataset="synthetic", epochs=3, steps_per_epoch=4, batch_size=10)
    result = TrainResult(step_epoch=[0] * 4 + [1] * 4 + [2] * 4, step_loss=[1.0] * 12, step_loss_scale=[1.0] * 12,
                         step_skipped=[False] * 12, step_time_s=[NAN] * 12,
                         epochs=[{"epoch": e, "train_loss": 1.0, "train_accuracy": 0.1, "val_loss": 1.0,
                                  "val_accuracy": 0.1, "train_time_s": t, "eval_time_s": 0.1}
                                 for e, t in enumerate((30.0, 1.0, 1.0))],
                         val_correct=np.zeros(400, dtype=bool))
    run = build_tables("r", cfg, result, load_dataset("synthetic"), 40.0)["run"].iloc[0]
    assert run["throughput_img_s"] == pytest.approx(10 / 0.25)
    assert run["compile_warmup_s"] == pytest.approx(29.0)
    assert run["epoch_throughput_img_s"] == pytest.approx(120 / 32.0)  # all epochs, compilation included


def test_the_data_sheet_peak_names_its_row():
    info = ceiling.ceiling_info("NVIDIA H100 80GB HBM3", "bf16", "", 7.9e14, 8192)
    assert info["ceiling_flops_table"] == pytest.approx(989.4e12)
    assert info["ceiling_table_source"] == ("NVIDIA data sheet, dense (no sparsity): H100 row, bf16 989.4 TFLOP/s, for "
                                         "NVIDIA H100 80GB HBM3")
    assert ceiling.known_row("NVIDIA H100 PCIe") == "H100 PCIe" and ceiling.known_row("NVIDIA A100-SXM4-80GB") == "A100"
    assert "H100 row" in ceiling.ceiling_info("NVIDIA H100 NVL", "fp16", "", 1e14, 8192)["ceiling_table_source"]
    unknown = ceiling.ceiling_info("Tesla T4", "bf16", "", 1e13, 4096)
    assert math.isnan(unknown["ceiling_flops_table"]) and unknown["ceiling_table_source"] == ""
    assert ceiling.known_row("cpu") is None
