"""Issue 13: the timed loop adds no per-step host sync, the wall-time headline, FLOPs counted once,
ceilings, the --step / --batch-sizes matrix, the bound verdict, and a sweep rendered into the report."""

import dataclasses
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from amp_compare.contract import env
from amp_compare.contract.config import ConfigError, RunConfig
from amp_compare.harness.report.hardware import bound_verdicts, timing_note
from amp_compare.harness.run.cli import build_parser, compare_settings
from amp_compare.harness.run.compare import plan_compare
from amp_compare.kit import ceiling, flops
from amp_compare.kit.child import step_time_summary
from tests import model_registry
from tests.conftest import ROOT

torch = pytest.importorskip("torch")

SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


# The CNNs at chosen sizes, and every other model without the vit's hook (tests/model_registry.py's test-only MLP)
# at its example's (the vit has its own test below: its attention needs the math backend)
FLOP_CASES = [("simple_cnn", (8, 8, 1), 64), ("resnet18", (32, 32, 3), 8),
              *[(name, model_registry.example_shape(name), 64) for name in model_registry.names()
                if name not in ("simple_cnn", "resnet18") and "vit" not in model_registry.spec(name).hooks]]


@pytest.mark.usefixtures("test_models")
@pytest.mark.parametrize("model, shape, width", FLOP_CASES)
def test_flops_from_shared_shapes_match_torch_flop_counter(model, shape, width):
    from torch.utils.flop_counter import FlopCounterMode

    from amp_compare.torch_impl.models import build_model

    net = build_model(model, shape, 10, width=width)
    x = torch.randn(2, shape[2], shape[0], shape[1])
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(net(x), torch.tensor([1, 2])).backward()
    assert flops.train_flops(model, shape, 10, width) == counter.get_total_flops() / 2  # per image


def test_vit_flops_from_shared_shapes_match_torch_flop_counter():
    """The ViT's count, attention's two products included, is what FlopCounterMode sees of a torch training step.
    The math SDPA backend: the counter has no formula for the CPU flash kernel (it would count its products as 0);
    the math backend runs them as batched matmuls it counts. Headroom recording paused: the model's own work."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from amp_compare.torch_impl.models import build_model
    from amp_compare.torch_impl.vit import paused

    shape, size = (16, 16, 1), {"dim": 16, "depth": 2, "heads": 2, "patch": 4, "mlp_ratio": 2}
    net = build_model("vit", shape, 10, vit=size)
    x = torch.randn(2, 1, 16, 16)
    with paused(net), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(net(x), torch.tensor([1, 2])).backward()
    assert flops.train_flops("vit", shape, 10, vit=size) == counter.get_total_flops() / 2  # per image
    attention = sum(layer.macs for layer in flops.layers("vit", shape, 10, vit=size) if "attn.s" in layer.name
                    or "attn.m" in layer.name)
    assert attention == 2 * 2 * 17 * 17 * 16  # two blocks, Q·Kᵀ and weights·V, 17 tokens, width 16


def _epoch(cfg: RunConfig, steps: int, counts: dict | None = None, read_every: int = 25):
    """run_epoch as train() calls it, on a tiny model; counts host reads of tensors made during the steps.
    Returns the run's records (TrainResult), the optimizer and the scaler."""
    import io

    from amp_compare.kit.child import Progress, TrainResult
    from amp_compare.kit.training import StepBook
    from amp_compare.torch_impl import loop
    from amp_compare.torch_impl import train as tt
    from amp_compare.torch_impl.amp import make_scaler
    from amp_compare.torch_impl.models import build_model

    torch.manual_seed(0)
    model = build_model("simple_cnn", (8, 8, 1), 10)
    optimizer = tt.make_step_optimizer(cfg, model.parameters())
    scaler = make_scaler(cfg)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    plan = torch.arange(steps * 8).reshape(steps, 8) % 64
    clock = loop.StepClock(torch.device("cpu"))
    book = StepBook(cfg, TrainResult(), Progress(stream=io.StringIO()), lambda: {}, None)
    book.start_epoch(0, steps)
    originals = {}
    if counts is not None:  # only inside the loop: count every way a tensor's value reaches the host
        def counting(name, original):
            def wrapper(self, *args, **kwargs):
                counts[name] = counts.get(name, 0) + 1
                return original(self, *args, **kwargs)
            return wrapper

        originals = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}
        for name, original in originals.items():
            setattr(torch.Tensor, name, counting(name, original))
    try:
        loop.run_epoch(model, optimizer, scaler, x, y, plan, cfg.precision, clock, book, read_every=read_every)
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return book.result, optimizer, scaler


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_tuned_loop_reads_nothing_on_the_host_per_step(precision):
    """The loop's host reads do not grow with the steps (GPU check interval), in every precision mode."""
    cfg = RunConfig(precision=precision, step="tuned", steps_per_epoch=24, warmup_steps=0)
    few, many = {}, {}
    _epoch(cfg, 3, few)
    _epoch(cfg, 12, many)
    assert sum(many.values()) == sum(few.values()), (few, many)


def test_plain_fp16_records_the_gradscaler_sync_and_tuned_avoids_it():
    from amp_compare.torch_impl.loop import host_syncs_per_step

    for step, expected in (("plain", 1), ("tuned", 0)):
        cfg = RunConfig(precision="fp16", step=step)
        _, optimizer, scaler = _epoch(cfg, 2)
        assert host_syncs_per_step(optimizer, scaler) == expected
        assert bool(optimizer.defaults.get("fused")) == (step == "tuned")
    _, optimizer, scaler = _epoch(RunConfig(precision="bf16", step="plain"), 2)
    assert host_syncs_per_step(optimizer, scaler) == 0  # no scaler: GradScaler.step passes through


@pytest.mark.parametrize("step", ["plain", "tuned"])
def test_skipped_steps_are_seen_with_either_optimizer(step):
    """fp16 with a scale that overflows: the first steps are skipped (found_inf on the device with fused)."""
    cfg = RunConfig(precision="fp16", step=step, init_scale=2.0**100)
    out, _, _ = _epoch(cfg, 4, read_every=1)
    assert out.step_skipped[0] is True and out.step_loss_scale[1] < out.step_loss_scale[0]
    cfg = RunConfig(precision="fp16", step=step)
    assert not any(_epoch(cfg, 3)[0].step_skipped)


def test_headline_is_wall_time_and_a_stall_is_called_out():
    s = step_time_summary([5.0, 1.0, 1.0, 1.0, 1.0, 6.0], warmup_steps=1, batch_size=10)
    assert s["throughput_img_s"] == pytest.approx(50 / 10.0)  # 5 timed steps of 10 images in 10 s
    assert s["median_step_throughput_img_s"] == pytest.approx(10.0)
    assert s["compile_warmup_s"] == pytest.approx(4.0)
    assert "stalled" in timing_note(s["throughput_img_s"], s["median_step_throughput_img_s"])
    assert timing_note(95.0, 100.0) == ""


def test_known_ceilings_pick_the_right_gpu():
    assert ceiling.known_ceiling("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert ceiling.known_ceiling("NVIDIA H100 PCIe", "fp16") == pytest.approx(756e12)
    assert ceiling.known_ceiling("NVIDIA A100-SXM4-80GB", "fp32") == pytest.approx(19.5e12)  # not the A10
    assert ceiling.known_ceiling("cpu", "fp32") is None and ceiling.known_ceiling("Tesla T4", "bf16") is None
    assert ceiling.matmul_dtype("fp16-static") == "fp16" and ceiling.matmul_dtype("fp32", "on") == "tf32"
    # one named size per device type, whatever the device's speed: a device doing 1e10 FLOP/s at any size
    sizes = []
    flops_s, n = ceiling.measure(lambda n, r: sizes.append(n) or r * 2 * n**3 / 1e10, size=1024, budget_s=0.2)
    assert flops_s == pytest.approx(1e10) and n == 1024 and set(sizes) == {1024}
    assert ceiling.measure_on("cpu", lambda n, r: r * 2 * n**3 / 1e10)[1] == ceiling.SIZES["cpu"][0]


def test_an_emulated_half_format_is_measured_against_the_fp32_ceiling():
    no_half = {"cpu_bf16_hardware": False, "cpu_fp16_hardware": False}
    bf16_only = {"cpu_bf16_hardware": True, "cpu_fp16_hardware": False}
    # what the ceiling is and why, not a claim of which kernels ran (no record shows that)
    assert ceiling.ceiling_dtype("bf16", "off", "cpu", no_half) == ("fp32", "no bf16 arithmetic on this CPU, so its "
                                                                    "cells are measured against the fp32 matmul")
    assert ceiling.ceiling_dtype("fp16-static", "off", "cpu", bf16_only)[0] == "fp32"
    assert ceiling.ceiling_dtype("bf16", "off", "cpu", bf16_only) == ("bf16", "")
    assert ceiling.ceiling_dtype("bf16", "off", "cuda", no_half) == ("bf16", "")  # a GPU's half formats: its own
    assert ceiling.ceiling_dtype("fp32", "on", "cpu", no_half) == ("tf32", "")
    info = ceiling.ceiling_info("cpu", "fp32", ceiling.ceiling_dtype("bf16", "off", "cpu", no_half)[1], 8e10, 1024)
    assert info["ceiling_dtype"] == "fp32 (no bf16 arithmetic)" and info["ceiling_flops_measured"] == 8e10
    choice = ceiling.ceiling_choice("bf16", "off", "cpu", no_half)
    assert (choice["fp32_for"], choice["isa_limit"]) == ("bf16", "")


def test_both_frameworks_mfu_is_against_one_ceiling_per_device_and_dtype():
    """Issue 28: torch's own fp32 matmul read 0.20 TFLOP/s and Keras' 0.43 on the same CPU, so torch showed MFU
    51.5% and Keras 27.1% although Keras achieved more. Both are now measured against the run's best."""
    from amp_compare.contract.records import migrate
    from amp_compare.harness.report import speed
    from amp_compare.harness.report.hardware import ceiling_clauses, with_run_ceiling

    runs = pd.DataFrame({"framework": ["torch", "tf", "torch", "tf"], "precision": ["fp32", "fp32", "bf16", "bf16"],
                         "device_name": "cpu", "achieved_flops": [1.03e11, 1.17e11, 0.5e11, 0.6e11],
                         "peak_dtype": ["fp32", "fp32", "fp32 (bf16 emulated)", "fp32 (bf16 emulated)"],
                         "peak_flops_measured": [2.0e11, 4.3e11, 2.1e11, 3.9e11], "peak_matmul_size": 1024})
    runs = with_run_ceiling(migrate(runs))  # records written before "ceiling": renamed on read
    assert (runs["ceiling_flops"] == 4.3e11).all()
    # and older records' "emulated" label is printed as what it is: the fp32 ceiling of a format with no arithmetic
    assert list(runs["ceiling_dtype"]) == ["fp32", "fp32", "fp32 (no bf16 arithmetic)", "fp32 (no bf16 arithmetic)"]
    assert list(runs["ceiling_fp32_for"]) == ["", "", "bf16", "bf16"] and set(runs["ceiling_isa_limit"]) == {""}
    assert list(runs["mfu_measured"].round(3)) == [round(1.03e11 / 4.3e11, 3), round(1.17e11 / 4.3e11, 3),
                                                   round(0.5e11 / 4.3e11, 3), round(0.6e11 / 4.3e11, 3)]
    said = ceiling_clauses(runs)
    assert said == ["fp32 0.430 TFLOP/s, the best of the run's 4 timings of a 1024×1024 matmul, one per cell (each "
                    "framework's own best: PyTorch 0.210, Keras (TF) 0.430)"]
    # the Hardware efficiency caption states it
    assert f"the same ceiling. This run's ceiling: {said[0]}. The verdict" in speed.hardware_paragraph(runs, said)
    # a data-sheet MFU is promised only where a row has one
    assert "data-sheet" not in speed.hardware_paragraph(runs, said)
    assert "; MFU against the device's data-sheet ceiling too. This run's" in speed.hardware_paragraph(
        runs.assign(mfu_table=0.4), said)
    # cells that reuse an earlier cell's timing (kit/reuse.py) share it: counted once
    shared = runs.assign(ceiling_flops_measured=[2.0e11, 4.3e11, 2.0e11, 4.3e11])
    assert "the best of the run's 2 timings of a 1024×1024 matmul, which its cells share" in ceiling_clauses(
        shared)[0]


def test_an_mfu_over_100_percent_is_flagged_not_passed_off():
    from types import SimpleNamespace

    from amp_compare.harness.report import speed
    from amp_compare.harness.report.tables import _hardware_cells

    row = SimpleNamespace(flops_per_image=1e6, achieved_flops=5.56e11, ceiling_flops=1e11, ceiling_dtype="bf16",
                          mfu_measured=5.56, mfu_table=float("nan"), bound="undetermined", compile_warmup_s=0.0,
                          timing_note="")
    assert _hardware_cells(row, False)["MFU"] == "556.0% ⚠"
    assert _hardware_cells(SimpleNamespace(**{**vars(row), "mfu_measured": 0.29}), False)["MFU"] == "29.0%"
    assert "An MFU over 100% is marked ⚠" in speed.hardware_paragraph(pd.DataFrame())


def test_bound_verdict_from_the_sweep():
    t = pd.DataFrame({"framework": "torch", "precision": "fp16", "step_loop": "plain",
                      "batch_size": [64, 256, 1024], "throughput_img_s": [100.0, 300.0, 330.0],
                      "mfu_measured": [0.01, 0.03, 0.04]})
    assert list(bound_verdicts(t, ["framework", "step_loop", "batch_size", "precision"])) == [
        "host-bound", "compute-bound", "compute-bound"]
    one = t.iloc[:1].assign(mfu_measured=0.7)  # no sweep: the verdict carries its rule
    assert list(bound_verdicts(one, ["framework", "batch_size"])) == ["compute-bound (MFU ≥ 50%, no --batch-sizes "
                                                                      "sweep)"]
    assert list(bound_verdicts(one.assign(mfu_measured=0.3), ["framework", "batch_size"])) == [
        "undetermined (run --batch-sizes)"]
    # an MFU above 100% (a ceiling timed on another path than the cell ran, e.g. under ONEDNN_MAX_CPU_ISA) is no
    # evidence of a compute-bound cell: the audit of such a run found "compute-bound" beside MFU 960%
    assert list(bound_verdicts(one.assign(mfu_measured=9.6), ["framework", "batch_size"])) == [
        "undetermined (MFU above 100%: the ceiling is not this path's; run --batch-sizes)"]


def _args(*extra):
    """The validated settings a compare plans from (the one option declaration, harness/run/cli.py)."""
    return compare_settings(build_parser().parse_args(["compare", "--device", "cpu", "--datasets", "synthetic",
                                                       "--models", "simple_cnn", "--seeds", "0", "--frameworks",
                                                       "torch", "--precisions", "fp32", *extra]))


def test_step_and_batch_sizes_expand_the_matrix(tmp_path):
    _, cells, _ = plan_compare(_args("--out", str(tmp_path), "--step", "plain,tuned", "--batch-sizes", "16,8"))
    assert [c.cell_id for c in cells] == [
        "torch-simple_cnn-synthetic-fp32-s0-b8", "torch-simple_cnn-synthetic-fp32-s0-b8-tuned",
        "torch-simple_cnn-synthetic-fp32-s0-b16", "torch-simple_cnn-synthetic-fp32-s0-b16-tuned"]
    for bad, word in ((("--step", "fast"), "'fast'"), (("--batch-sizes", "64,x"), "'64,x'")):
        with pytest.raises(ConfigError, match=word):
            plan_compare(_args("--out", str(tmp_path), *bad))


def test_bad_step_is_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "amp_compare", "compare", "--device", "cpu", "--step", "fast",
                           "--out", str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "plain" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_batch_sweep_renders_speedup_figure_and_mfu_columns(tmp_path, unsaved_figures):
    """The sweep's compare writes its tables, not its figures (--no-figures: drawing and writing every figure of the
    page was half this test's CPU); the report's figures are then drawn from its records by make_figures, as the
    report draws them, but not written (unsaved_figures: the files are checked in test_end_to_end.py)."""
    from amp_compare.contract import records
    from amp_compare.harness.report.figures import make_figures

    proc = subprocess.run(
        [sys.executable, "-m", "amp_compare", "compare", "--device", "cpu", "--frameworks", "torch",
         "--models", "simple_cnn", "--datasets", "synthetic", "--precisions", "fp32,bf16", "--batch-sizes", "8,16",
         "--epochs", "1", "--steps-per-epoch", "3", "--warmup-steps", "1", "--seeds", "0", "--out", str(tmp_path),
         "--run-id", "sweep", "--no-figures",
         "--trial-budget-s", "0"],  # no speed trials (one per batch size): this reads the cells
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "sweep"
    tables = records.read_run(run)
    drawn = [f.key for f in make_figures(tables["run"], tables["steps"], run / "figures")]
    assert "speedup_vs_batch" in drawn, drawn
    summary = (run / "summary.md").read_text()
    for column in ("MFU", "Ceiling TFLOP/s (measured)", "Bound", "Images/s (median step)", "Batch", "Step"):
        assert column in summary
    runs = pd.concat(pd.read_parquet(p) for p in (run / "cells").glob("*/run.parquet"))
    assert sorted(runs["cfg_batch_size"]) == [8, 8, 16, 16]
    assert (runs["ceiling_flops_measured"] > 0).all() and np.isfinite(runs["mfu_measured"]).all()
    assert set(runs["ceiling_matmul_size"]) == {ceiling.SIZES["cpu"][0]}  # one named size in every cell
    # the ceiling is that of the dtype the arithmetic runs in: fp32 where this CPU emulates bf16 or the run keeps
    # the frameworks from its bf16 instructions (ONEDNN_MAX_CPU_ISA=AVX2 on a CPU that has them), as the detection
    # the cells use decides it
    expected = ceiling.ceiling_choice("bf16", "off", "cpu", env.cpu_info())
    emulated = expected["fp32_for"] == "bf16"
    bf16 = runs[runs["precision"] == "bf16"]
    reason = expected["basis"].split(" on ")[0]  # "no bf16 arithmetic", "bf16 arithmetic limited by ..."
    assert set(bf16["ceiling_dtype"]) == ({f"fp32 ({reason})"} if emulated else {"bf16"})
    page = (run / "index.html").read_text()
    assert "This run&#39;s ceiling" in page  # the Hardware efficiency caption names it
    if emulated:  # the fp32 cells' ceiling (no timing ratio asserted here: timings belong in benchmarks)
        assert "cells are measured against the fp32 matmul&#39;s ceiling" in page
    timed = [pd.read_parquet(p.parent / "steps.parquet") for p in (run / "cells").glob("*/run.parquet")]
    for r, steps in zip(runs.itertuples(), timed):  # the headline is wall time of the timed steps
        t = steps.loc[~steps["warmup"], "step_time_s"]
        assert r.throughput_img_s == pytest.approx(r.cfg_batch_size * len(t) / t.sum())


def test_max_batch_search_stops_at_its_time_budget_and_says_so(monkeypatch, tmp_path):
    from amp_compare.harness.report.tables import search_table
    from amp_compare.harness.run import maxbatch

    calls = []

    def fake_probe(cfg, batch, cap, timeout_s):
        calls.append(batch)
        return maxbatch.ProbeResult(batch, batch <= 100, batch * 1000, "" if batch <= 100 else "OOM", "test")

    monkeypatch.setattr(maxbatch, "probe", fake_probe)
    done = maxbatch.find_max_batch(RunConfig(), None, start=16, budget_s=None)
    assert 90 <= done.max_ok <= 100 < done.first_failed and done.stopped_early == ""
    calls.clear()
    clock = iter(range(0, 10**6, 10))  # a clock that advances 10 s per reading: each probe "takes" 10 s
    monkeypatch.setattr(maxbatch.time, "monotonic", lambda: next(clock))
    early = maxbatch.find_max_batch(RunConfig(), None, start=16, budget_s=25)
    assert calls == [16, 32] and early.max_ok == 32 and "25 s budget" in early.stopped_early
    table = search_table([done])
    assert "stopped_early" in table
    from amp_compare.harness.report.render import _maxbatch_table

    shown = _maxbatch_table(search_table([early, dataclasses.replace(done, cfg=RunConfig(precision="bf16"))]))
    assert list(shown["Search"]) == [early.stopped_early, "converged"]


def test_gpu_cap_is_enforced_by_the_framework_in_the_probe(tmp_path, capsys):
    from amp_compare.harness.report.tables import cap_label
    from amp_compare.harness.run import maxbatch
    from amp_compare.kit import probe as probe_child

    config = tmp_path / "cfg.json"
    config.write_text(RunConfig(device="cuda").to_json())
    limits = []

    def two_steps(cfg, data, x, y):
        raise MemoryError("CUDA out of memory")

    code = probe_child.probe_main(two_steps, lambda exc: False, ["--config", str(config), "--batch", "8",
                                                              "--memory-cap", "1GiB"], limit_gpu=limits.append)
    assert limits == [2**30] and code == maxbatch.EXIT_OOM
    assert cap_label("cuda", None) == "the GPU's whole memory"
    assert "GPU memory cap" in cap_label("cuda", 2**30) and "CPU" in cap_label("cpu", 2**30)
