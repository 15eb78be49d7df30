"""The tuned torch loop on a GPU, through the harness: fused Adam + torch.compile(mode="reduce-overhead"), CUDA
graphs recorded and replayed, `cudagraph_skips` recorded (and zero: a skip means kernels ran without graphs, so
the "tuned" figures would not be what they claim), no host wait per step, compile time reported apart.

The cells match tests/gpu/test_gpu_sync.py's configuration (narrow ResNet-18, synthetic data, batch 64, channels
last), so whichever runs second finds inductor's compiled graphs in its on-disk cache.
"""

from __future__ import annotations

import math

import pytest

from tests.gpu.conftest import compare, explain, gpu_marks, no_cuda_reason, require, run_table

pytestmark = gpu_marks()

PRECISIONS = ("fp16", "bf16")
ARGS = ["--frameworks", "torch", "--step", "tuned", "--models", "resnet18", "--width", "16", "--datasets", "synthetic",
        "--precisions", ",".join(PRECISIONS), "--epochs", "2", "--steps-per-epoch", "12", "--batch-size", "64",
        "--warmup-steps", "4", "--seeds", "0", "--timeout", "500", "--no-figures", "--run-id", "tuned"]


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory):
    require(no_cuda_reason())
    out = tmp_path_factory.mktemp("gpu-tuned")
    proc = compare(out, *ARGS)
    assert (out / "tuned" / "data" / "run.parquet").exists(), explain(proc)
    return proc, run_table(out / "tuned")


def test_tuned_cells_train_with_cuda_graphs_and_record_cudagraph_skips(tuned_run):
    proc, runs = tuned_run
    assert proc.returncode == 0, explain(proc)
    assert sorted(runs["precision"]) == sorted(PRECISIONS)
    for _, cell in runs.iterrows():
        assert cell["status"] == "ok", (cell["cell_id"], cell["error"])
        assert cell["step_loop"] == "tuned" and cell["optimizer_impl"] == "fused", cell["cell_id"]
        assert cell["compiled"].startswith("torch.compile(mode=reduce-overhead)"), cell["compiled"]
        assert "cudagraph_skips" in runs, "the tuned GPU cells do not record cudagraph_skips"
        assert cell["cudagraph_skips"] == 0, f"{cell['cell_id']}: {cell['compiled']}"


def test_tuned_cells_record_no_host_wait_and_their_compile_time(tuned_run):
    _, runs = tuned_run
    for _, cell in runs.iterrows():
        assert cell["host_syncs_per_step"] == 0, cell["cell_id"]  # fused Adam takes found_inf on the device
        # Compilation and graph capture happen in the warm-up steps (CUDA events see the host's compile time as a
        # gap): reported apart from the timed steps.
        assert math.isfinite(cell["compile_warmup_s"]) and cell["compile_warmup_s"] > 1.0, cell["compile_warmup_s"]
        assert cell["steps_timed"] == 2 * 12 - 4
        assert cell["throughput_img_s"] > 0 and cell["median_step_throughput_img_s"] > 0
