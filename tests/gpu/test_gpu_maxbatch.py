"""--find-max-batch on a GPU under a given GPU memory cap: the search stops at the cap (an out-of-memory probe, not
the batch limit), every batch it calls a fit used no more than the cap, and the report's figure shows the cap.

On a GPU the cap is the framework's own (torch.cuda.set_per_process_memory_fraction in each probe child); nothing
samples host memory there (harness/run/maxbatch.py).
"""

from __future__ import annotations

import pandas as pd
import pytest

from tests.gpu.conftest import compare, explain, gpu_marks, no_cuda_reason, require

pytestmark = gpu_marks()

CAP = "512MiB"
CAP_BYTES = 512 * 2**20
PRECISIONS = ("fp32", "bf16")
ARGS = ["--frameworks", "torch", "--models", "resnet18", "--width", "32", "--datasets", "synthetic",
        "--precisions", ",".join(PRECISIONS), "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "32",
        "--warmup-steps", "0", "--seeds", "0", "--find-max-batch", "--memory-cap", CAP, "--max-batch-limit", "65536",
        "--timeout", "300", "--run-id", "maxbatch"]


@pytest.fixture(scope="module")
def maxbatch_run(tmp_path_factory):
    require(no_cuda_reason())
    out = tmp_path_factory.mktemp("gpu-maxbatch")
    proc = compare(out, *ARGS)
    return proc, out / "maxbatch"


def test_search_stops_under_the_gpu_cap(maxbatch_run):
    proc, run_dir = maxbatch_run
    assert proc.returncode == 0, explain(proc)
    searches = {p.stem: pd.read_parquet(p) for p in sorted((run_dir / "maxbatch").glob("*.parquet"))}
    assert sorted(searches) == sorted(f"torch-{p}" for p in PRECISIONS), (sorted(searches), explain(proc))
    for name, probes in searches.items():
        assert (probes["device"] == "cuda").all() and (probes["cap_bytes"] == CAP_BYTES).all(), name
        max_ok, first_failed = int(probes["max_ok"].iloc[-1]), probes["first_failed"].iloc[-1]
        assert not probes["stopped_early"].iloc[-1], (name, probes["stopped_early"].iloc[-1])
        # the cap stopped the search, not the batch limit: a probe ran out of GPU memory above the largest fit
        assert not pd.isna(first_failed) and 0 < max_ok < int(first_failed), (name, max_ok, first_failed)
        failed = probes[~probes["ok"]]
        assert failed["reason"].str.contains("OutOfMemoryError|out of memory", regex=True).all(), \
            failed["reason"].tolist()
        fits = probes[probes["ok"]]
        assert (fits["memory_kind"] == "torch_cuda_max_memory_allocated").all(), name
        assert (fits["peak_bytes"] <= CAP_BYTES).all(), fits[["batch", "peak_bytes"]].to_dict("records")
        largest = fits[fits["batch"] == max_ok]
        assert len(largest) == 1 and int(largest["peak_bytes"].iloc[0]) > CAP_BYTES // 4, \
            largest.to_dict("records")  # the fit was close to the cap, not far below it


def test_the_report_shows_the_gpu_cap(maxbatch_run):
    proc, run_dir = maxbatch_run
    html = (run_dir / "index.html").read_text()
    assert "a 512.00 MiB GPU memory cap" in html, ("the report does not name the GPU cap", explain(proc))
    assert "Largest batch that fit" in html
