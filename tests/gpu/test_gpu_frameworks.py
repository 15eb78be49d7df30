"""Every framework column a GPU machine can run trains a short CUDA cell through the harness, in fp32, fp16 and
bf16, and the report renders; what those cells record about the GPU is checked against what was asked.

One compare (the CLI a user runs) of torch, keras-jax and keras-torch x fp32/fp16/bf16 on a narrow ResNet-18
(the GPU default model: BatchNorm, channels last, augmentation on) and the small synthetic dataset; the tests
read its records. The GPU check needs no TensorFlow (docs/GPU.md), so `tf` is not among the columns.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.gpu.conftest import (
    GPU_FRAMEWORKS,
    compare,
    explain,
    gpu_marks,
    missing_for,
    no_cuda_reason,
    require,
    run_table,
)

pytestmark = gpu_marks()

PRECISIONS = ("fp32", "fp16", "bf16")
LABELS = {"torch": "PyTorch", "keras-jax": "Keras (JAX)", "keras-torch": "Keras (torch)"}
# What each framework's GPU cell measures its peak memory with: an accelerator allocator, never the CPU's RSS.
GPU_MEMORY_KINDS = {"torch": "cuda_allocator_peak_minus_dataset", "keras-jax": "jax_peak_bytes_in_use_since_start",
                    "keras-torch": "torch_cuda_max_memory_allocated"}
ARGS = ["--models", "resnet18", "--width", "16", "--datasets", "synthetic", "--precisions", ",".join(PRECISIONS),
        "--epochs", "2", "--steps-per-epoch", "6", "--batch-size", "64", "--warmup-steps", "2", "--seeds", "0",
        "--timeout", "400", "--run-id", "gpu"]


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    require(no_cuda_reason())
    frameworks = [fw for fw in GPU_FRAMEWORKS if not missing_for(fw)]
    out = tmp_path_factory.mktemp("gpu-frameworks")
    proc = compare(out, "--frameworks", ",".join(frameworks), *ARGS)
    return proc, out / "gpu", frameworks


def _cells(gpu_run, framework: str):
    require(missing_for(framework))
    proc, run_dir, _ = gpu_run
    assert (run_dir / "data" / "run.parquet").exists(), explain(proc)
    runs = run_table(run_dir)
    cells = runs[runs["framework"] == framework].set_index("precision")
    assert sorted(cells.index) == sorted(PRECISIONS), explain(proc)
    bad = cells[cells["status"] != "ok"]
    assert bad.empty, f"{framework}: {bad[['status', 'error']].to_dict('records')}\n{explain(proc)}"
    return cells


@pytest.mark.parametrize("framework", list(GPU_FRAMEWORKS))
def test_each_framework_trains_on_the_gpu_in_every_precision(gpu_run, framework):
    cells = _cells(gpu_run, framework)
    _, run_dir, _ = gpu_run
    for precision, cell in cells.iterrows():
        assert cell["device_name"] not in ("", "cpu"), (framework, precision, cell["device_name"])
        assert json.loads(cell["settings_used"])["tf32"] == "off", (framework, precision)  # --tf32 off, read back
    import pandas as pd

    steps = pd.read_parquet(run_dir / "data" / "steps.parquet")
    steps = steps[steps["framework"] == framework]
    assert np.isfinite(steps["loss"]).all(), framework
    assert len(steps) == len(PRECISIONS) * 2 * 6
    fp16 = steps[steps["precision"] == "fp16"]
    assert (fp16["loss_scale"] > 1).all(), "fp16 trained without its dynamic loss scale"
    assert (steps[steps["precision"] != "fp16"]["loss_scale"] == 1.0).all()


def test_the_report_renders_with_every_framework(gpu_run):
    proc, run_dir, frameworks = gpu_run
    assert proc.returncode == 0, explain(proc)
    md = (run_dir / "summary.md").read_text()
    for fw in frameworks:
        assert md.count(f"| {LABELS[fw]} |") == len(PRECISIONS), (fw, md)
    for key in ("memory", "loss_scale"):
        assert (run_dir / "figures" / f"{key}.png").stat().st_size > 1000, key
    html = (run_dir / "index.html").read_text()
    assert "cuda" in html and ">Environment</h2>" in html


@pytest.mark.parametrize("framework", list(GPU_FRAMEWORKS))
def test_peak_memory_is_the_gpu_allocators_with_the_dataset_apart(gpu_run, framework):
    """Like for like: every GPU cell reports an accelerator allocator's peak (never the host's RSS), and the
    training set a framework holds on the device is reported apart, to the byte, not inside the peak."""
    from amp_compare.kit.data import load_dataset

    cells = _cells(gpu_run, framework)
    data = load_dataset("synthetic")
    on_device = sum(a.nbytes for a in (data.x_train, data.y_train, data.x_val, data.y_val))
    for precision, cell in cells.iterrows():
        assert cell["memory_kind"] == GPU_MEMORY_KINDS[framework], (precision, cell["memory_kind"])
        assert 0 < cell["peak_memory_bytes"] < 64 * 2**30, (precision, cell["peak_memory_bytes"])
        # torch holds the whole dataset on the device; the Keras backends other than TensorFlow stream batches
        expected = on_device if framework == "torch" else 0
        assert cell["dataset_device_bytes"] == expected, (precision, cell["dataset_device_bytes"], expected)


@pytest.mark.parametrize("framework", list(GPU_FRAMEWORKS))
def test_mfu_uses_a_measured_matmul_peak_and_names_the_data_sheet_row(gpu_run, framework):
    from amp_compare.kit import ceiling

    cells = _cells(gpu_run, framework)
    for precision, cell in cells.iterrows():
        dtype = ceiling.matmul_dtype(precision, "off")
        assert cell["ceiling_dtype"] == dtype, (precision, cell["ceiling_dtype"])  # a GPU emulates no format
        measured = cell["ceiling_flops_measured"]
        assert measured > 0 and cell["ceiling_matmul_size"] >= 1024, (precision, measured, cell["ceiling_matmul_size"])
        assert cell["mfu_measured"] == pytest.approx(cell["achieved_flops"] / measured, rel=1e-9)
        assert 0 < cell["mfu_measured"] < 1, (precision, cell["mfu_measured"])
        table = ceiling.known_ceiling(cell["device_name"], dtype)
        if table is None:  # a GPU the data-sheet table lacks: no row, no table MFU, and the record says none
            assert math.isnan(cell["ceiling_flops_table"]) and cell["ceiling_table_source"] == ""
            continue
        row = ceiling.known_row(cell["device_name"])
        assert cell["ceiling_flops_table"] == pytest.approx(table)
        assert f"{row} row" in cell["ceiling_table_source"] and dtype in cell["ceiling_table_source"], \
            cell["ceiling_table_source"]
        assert cell["mfu_table"] == pytest.approx(cell["achieved_flops"] / table, rel=1e-9)
        # A matmul timed faster than the data sheet allows was not waited for (or ran in TF32 under an fp32
        # label: H100 fp32 67 TFLOP/s, TF32 495); one far below it timed too small a product.
        assert 0.25 * table < measured < 1.1 * table, (precision, measured / 1e12, table / 1e12)
