"""--find-max-batch: size parsing, the search algorithm, the probe protocol, and real searches on CPU.

The real searches train simple_cnn on digits in both frameworks under a cap set between the peaks of two
batches, measured by a real child first, so that they end after five children in all (each imports its
framework: TensorFlow ~8 s of CPU); the search's doubling, halving and bisection are tested with fake probes.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from amp_compare.contract.config import ConfigError, RunConfig
from amp_compare.harness.report.tables import search_table
from amp_compare.harness.run import maxbatch
from amp_compare.harness.run.maxbatch import ProbeResult, SearchResult, find_max_batch, probe
from amp_compare.kit import probe as probe_child
from amp_compare.kit.probe import parse_size
from tests.conftest import ROOT

MiB = 2**20
# Two batches of digits whose peak RSS lies far enough apart for a cap between them (where this was written: torch
# 545 and 668 MiB, TensorFlow 819 and 955 MiB; a batch of one 386 and 675 MiB), a cap far above any of them, and
# how far from a measured peak the caps between them are set
SMALL, LARGE = 1024, 2048
BIG_CAP = 8 * 2**30
MARGIN = 60 * MiB
LIMIT = 2**15


@pytest.mark.parametrize("text, size", [
    ("4GiB", 4 * 2**30), ("4gib", 4 * 2**30), ("1.5 GiB", 3 * 2**29), (" 2 MiB ", 2 * MiB), ("1KiB", 1024),
    ("512MB", 512_000_000), ("1kb", 1000), ("3GB", 3_000_000_000), ("100B", 100), ("100b", 100), ("1TiB", 2**40),
    (".5KiB", 512),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["4", "", "GiB", "4 GB GB", "-1GiB", "0GiB", "0.1B", "4XB", "abc", "4 G", "1e3MB"])
def test_parse_size_refuses_bad_text_in_one_line(text):
    with pytest.raises(ConfigError) as info:
        parse_size(text)
    message = str(info.value)
    assert "\n" not in message and repr(text) in message
    assert all(unit in message for unit in ("B", "KB", "MB", "GB", "KiB", "MiB", "GiB"))


# --- the search algorithm, with a fake probe -----------------------------------------------------


@pytest.fixture
def fake_probe(monkeypatch):
    """A probe that fits iff batch <= fits_up_to; records the batches asked for."""
    asked: list[int] = []

    def install(fits_up_to: int) -> list[int]:
        def fake(cfg, batch, cap_bytes, timeout_s=300):
            asked.append(batch)
            ok = batch <= fits_up_to
            return ProbeResult(batch, ok, 1000 * batch, "" if ok else "killed: RSS above the cap", "fake")

        monkeypatch.setattr(maxbatch, "probe", fake)
        return asked

    return install


def test_search_doubles_then_bisects(fake_probe):
    asked = fake_probe(300)
    seen = []
    result = find_max_batch(RunConfig(), 10**9, start=16, on_probe=seen.append)
    # Doubling until 512 fails, then bisection of [256, 512] until the gap is within 10% of the fit.
    assert asked == [16, 32, 64, 128, 256, 512, 384, 320, 288, 304]
    assert (result.max_ok, result.first_failed) == (288, 304)
    assert result.first_failed - result.max_ok <= max(1, 0.1 * result.max_ok) and result.max_ok <= 300
    assert [p.batch for p in result.probes] == asked and seen == result.probes
    assert [p.ok for p in result.probes] == [True] * 5 + [False, False, False, True, False]


def test_search_halves_when_start_does_not_fit(fake_probe):
    asked = fake_probe(300)
    result = find_max_batch(RunConfig(), 10**9, start=1024)
    assert asked == [1024, 512, 256, 384, 320, 288, 304]
    assert (result.max_ok, result.first_failed) == (288, 304)


def test_search_resolution_zero_is_exact(fake_probe):
    fake_probe(300)
    result = find_max_batch(RunConfig(), 10**9, start=16, resolution=0)
    assert (result.max_ok, result.first_failed) == (300, 301)


def test_search_stops_at_the_limit(fake_probe):
    asked = fake_probe(10**6)
    result = find_max_batch(RunConfig(), 10**9, start=16, limit=100)
    assert asked == [16, 32, 64, 100]
    assert (result.max_ok, result.first_failed) == (100, None)


def test_search_when_nothing_fits(fake_probe):
    asked = fake_probe(0)
    result = find_max_batch(RunConfig(), 10**9, start=16)
    assert asked == [16, 8, 4, 2, 1]
    assert (result.max_ok, result.first_failed) == (0, 1)


def test_search_table_is_tidy(fake_probe):
    fake_probe(300)
    results = [find_max_batch(RunConfig(framework=fw, precision=p), 10**9) for fw in ("torch", "tf")
               for p in ("fp32", "bf16")]
    table = search_table(results)
    assert len(table) == sum(len(r.probes) for r in results)
    for column in ("framework", "precision", "model", "dataset", "batch", "ok", "peak_bytes", "reason", "cap_bytes",
                   "max_ok"):
        assert column in table.columns
    assert set(table.groupby(["framework", "precision"])["max_ok"].unique().explode()) == {288}
    assert table["ok"].dtype == bool and table["batch"].dtype == "int64"
    assert search_table([SearchResult(16, None, [ProbeResult(16, True, None)], None)])["peak_bytes"].isna().all()


# --- the probe protocol ---------------------------------------------------------------------------


def _run_probe_main(tmp_path, capsys, two_steps, cap="1MiB", device="cpu"):
    config = tmp_path / "config.json"
    config.write_text(RunConfig(device=device).to_json())
    argv = ["--config", str(config), "--batch", "8", "--memory-cap", cap]
    code = probe_child.probe_main(two_steps, lambda exc: False, argv)
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_child_reports_a_peak_above_the_cap_as_out_of_memory(tmp_path, capsys):
    code, report = _run_probe_main(tmp_path, capsys, lambda cfg, data, x, y: (2 * MiB, "fake"))
    assert code == maxbatch.EXIT_OOM
    assert report["ok"] is False and report["batch"] == 8 and report["peak_bytes"] == 2 * MiB
    assert report["reason"] == "peak RSS 2.00 MiB above the cap 1.00 MiB"
    code, report = _run_probe_main(tmp_path, capsys, lambda cfg, data, x, y: (MiB // 2, "fake"))
    assert code == 0 and report == {"batch": 8, "ok": True, "peak_bytes": MiB // 2, "memory_kind": "fake"}


def test_child_checks_no_rss_on_a_gpu(tmp_path, capsys):
    code, report = _run_probe_main(tmp_path, capsys, lambda cfg, data, x, y: (2 * MiB, "gpu"), device="cuda")
    assert code == 0 and report["ok"] is True


def test_child_turns_only_out_of_memory_errors_into_exit_75(tmp_path, capsys):
    def out_of_memory(cfg, data, x, y):
        assert x.shape == (8, 16, 16, 1) and x.dtype == "float32" and set(y) <= set(range(10))
        raise MemoryError("cannot allocate 12 GiB")

    code, report = _run_probe_main(tmp_path, capsys, out_of_memory)
    assert code == maxbatch.EXIT_OOM and report["reason"] == "MemoryError: cannot allocate 12 GiB"

    def tf_style(cfg, data, x, y):  # the informative line is not the first one
        raise MemoryError("Graph execution error:\n\nTraceback...\nOOM when allocating tensor with shape[8,16]\nHint")

    code, report = _run_probe_main(tmp_path, capsys, tf_style)
    assert code == maxbatch.EXIT_OOM and report["reason"] == "MemoryError: OOM when allocating tensor with shape[8,16]"

    def bug(cfg, data, x, y):
        raise ValueError("a real bug")

    with pytest.raises(ValueError, match="a real bug"):
        _run_probe_main(tmp_path, capsys, bug)


def test_watchdog_kills_a_child_above_the_cap():
    start = time.monotonic()
    result = probe(RunConfig(framework="torch", threads=1), 16, cap_bytes=40 * MiB, timeout_s=60)
    assert not result.ok and result.reason.startswith("killed: RSS above the cap")
    assert result.peak_bytes > 40 * MiB and result.memory_kind == maxbatch.SAMPLED_RSS_KIND
    assert time.monotonic() - start < 10  # killed while importing, long before a step


@pytest.fixture
def fake_child(monkeypatch, tmp_path):
    """Replace the child's interpreter with a shell script: probe() runs `<script> -m ... --batch N ...`."""

    def install(body: str) -> None:
        script = tmp_path / "fake-python"
        script.write_text("#!/bin/sh\n" + body + "\n")
        script.chmod(0o755)
        monkeypatch.setattr(sys, "executable", str(script))

    return install


@pytest.mark.parametrize("body, expected", [
    ('echo "Traceback: something broke inside the framework" >&2; exit 3', "(?s)exit code 3.*something broke"),
    ("kill -KILL $$", "exit code -9"),  # killed by someone else (not our watchdog): not taken for a full batch
    ("exit 75", "exit code 75"),  # EXIT_OOM without its report
    ("exit 0", "exit code 0"),  # success without its report
])
def test_probe_raises_on_failures_that_are_not_out_of_memory(fake_child, body, expected):
    fake_child(body)
    with pytest.raises(RuntimeError, match=expected):
        probe(RunConfig(), 16, 10**12, timeout_s=60)


def test_probe_timeout_and_abort_on_bad_alloc(fake_child):
    fake_child("exec sleep 600")
    result = probe(RunConfig(), 16, 10**12, timeout_s=1)
    assert not result.ok and result.reason == "timed out after 1 s"
    fake_child("echo \"terminate called after throwing an instance of 'std::bad_alloc'\" >&2; kill -ABRT $$")
    result = probe(RunConfig(framework="tf"), 16, 10**12, timeout_s=60)
    assert not result.ok and result.reason.startswith("std::bad_alloc")


def test_real_cpu_allocation_failure_is_out_of_memory(monkeypatch):
    """With its address space capped (RLIMIT_AS), torch's CPU allocator fails: a RuntimeError it must recognise.

    (TensorFlow's CPU runtime, capped the same way, raises ResourceExhaustedError, aborts with
    std::bad_alloc or segfaults, depending on where the allocation fails: not repeatable enough to test.)
    """
    # Room for torch itself (a CUDA build maps several GB of libraries), not for the first activation of
    # 250,000 images (16 GB): the allocation fails at once, without touching memory. resnet18, whose first conv
    # has 64 channels (simple_cnn's 32): half the images for the same activation, and the child's random batch
    # (0.25 GB, drawn before the first step) half as long to draw.
    limit = 12 * 2**30
    popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", functools.partial(
        popen, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))))
    result = probe(RunConfig(framework="torch", model="resnet18", threads=1), 250_000, cap_bytes=None, timeout_s=120)
    assert not result.ok
    assert result.reason.startswith("RuntimeError:") and "DefaultCPUAllocator" in result.reason, result.reason


def test_an_out_of_memory_error_wrapped_by_the_compiler_is_still_out_of_memory():
    """torch.compile (the tuned loop) can hand an allocator failure on wrapped, e.g. as BackendCompilerFailed."""
    import torch

    from amp_compare.torch_impl.probe import is_out_of_memory

    class BackendCompilerFailed(RuntimeError):  # torch._dynamo.exc's wrapper has this shape
        pass

    def wrapped(inner: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException as exc:
                raise BackendCompilerFailed("backend='inductor' raised: ...") from exc
        except BackendCompilerFailed as outer:
            return outer

    assert is_out_of_memory(wrapped(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")))
    assert is_out_of_memory(wrapped(RuntimeError("CUDA out of memory. Tried to allocate 20 MiB")))
    assert not is_out_of_memory(wrapped(ValueError("shape mismatch")))
    assert not is_out_of_memory(RuntimeError("expected scalar type Half"))


def test_keras_on_torch_recognises_the_cpu_allocators_error_as_torch_does():
    """Keras on torch meets torch's allocators: the CPU one's plain RuntimeError is out of memory there too."""
    pytest.importorskip("torch")
    # keras_impl.entry first, as in a probe child (keras_impl/probe.py's __main__): Keras without scikit-learn
    code = ("import amp_compare.keras_impl.entry\n"
            "from amp_compare.keras_impl.probe import is_out_of_memory\n"
            "assert is_out_of_memory(RuntimeError(\"[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: "
            "can't allocate memory: you tried to allocate 8589934592 bytes.\"))\n"
            "assert not is_out_of_memory(RuntimeError('expected scalar type Half'))\n")
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_jax_gpu_cap_is_set_before_jax_starts(tmp_path):
    """JAX reads XLA_PYTHON_CLIENT_MEM_FRACTION once, when its backend starts: limit_gpu must learn the device's
    memory without starting it (a stand-in nvidia-smi reports an 80 GiB GPU here)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 81920\n")
    smi.chmod(0o755)
    # keras_impl.entry first, as in a probe child (keras_impl/probe.py's __main__): Keras without scikit-learn
    code = ("import os, amp_compare.keras_impl.entry; from amp_compare.keras_impl.probe import limit_gpu; "
            "print(limit_gpu(20 * 2**30)); "
            "from jax._src import xla_bridge; print(os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'], "
            "bool(xla_bridge._backends))")
    env = {**os.environ, "KERAS_BACKEND": "jax", "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["XLA_PYTHON_CLIENT_MEM_FRACTION", "0.2500", "False"], proc.stdout


# --- real searches on CPU -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_searches():
    """Per framework, two real batches (SMALL fits, LARGE does not) under a cap set from a real child's peak.

    torch: a search under a cap far above it (LARGE fits at once) gives LARGE's peak; the search from SMALL under
    that peak less MARGIN then fits SMALL and not LARGE. TensorFlow: SMALL's peak, then LARGE under it plus
    MARGIN, probed directly (the search around the probes is framework-free: test_search_* and torch's here).
    Five children in all, each importing its framework; the two frameworks side by side (threads=1 per child).
    """
    cfgs = {fw: RunConfig(framework=fw, model="simple_cnn", dataset="digits", precision="fp32", device="cpu",
                          threads=1) for fw in ("torch", "tf")}

    def torch_searches() -> tuple[SearchResult, SearchResult]:
        larger = find_max_batch(cfgs["torch"], BIG_CAP, start=LARGE, limit=LARGE, resolution=1.0, timeout_s=120)
        cap = larger.probes[0].peak_bytes - MARGIN
        return larger, find_max_batch(cfgs["torch"], cap, start=SMALL, limit=LIMIT, resolution=1.0, timeout_s=120)

    def tf_probes() -> tuple[ProbeResult, int, ProbeResult]:
        fit = probe(cfgs["tf"], SMALL, BIG_CAP, timeout_s=120)
        cap = fit.peak_bytes + MARGIN
        return fit, cap, probe(cfgs["tf"], LARGE, cap, timeout_s=120)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        tf = pool.submit(tf_probes)
        larger, small = torch_searches()
        tf = tf.result()
    print(f"\ntorch: {LARGE} under {BIG_CAP / MiB:.0f} MiB peaks at {larger.probes[0].peak_bytes / MiB:.0f} MiB; "
          f"under {small.cap_bytes / MiB:.0f} MiB: max_ok {small.max_ok} (first failed {small.first_failed}); "
          f"tf: {SMALL} peaks at {tf[0].peak_bytes / MiB:.0f} MiB, {LARGE} under {tf[1] / MiB:.0f} MiB: "
          f"{tf[2].reason or 'fits'}; {time.monotonic() - start:.0f} s")
    return larger, small, tf


def _peak_of_a_whole_child(result: ProbeResult) -> None:
    """A child that fit reports its own peak RSS (VmHWM), framework and all."""
    assert result.ok and result.memory_kind == probe_child.PEAK_RSS_KIND and result.peak_bytes > 100 * MiB


def _stopped_at_the_cap(result: ProbeResult, cap: int) -> None:
    """Stopped by the watchdog or by the child's own check, with the peak seen above the cap."""
    assert not result.ok and result.reason.startswith(("killed: RSS above the cap", "peak RSS")), result.reason
    assert result.peak_bytes > cap


def test_real_search_finds_a_max_batch_under_the_cap(real_searches):
    larger, result, _ = real_searches
    _peak_of_a_whole_child(larger.probes[0])
    assert (result.max_ok, result.first_failed) == (SMALL, LARGE)
    assert [p.batch for p in result.probes] == [SMALL, LARGE]  # doubling first
    for p in result.probes:
        if p.ok:  # everything that fit stayed under the cap
            assert p.batch <= result.max_ok and p.peak_bytes <= result.cap_bytes
            _peak_of_a_whole_child(p)
        else:  # and what did not was stopped by the watchdog or by the child's own check
            assert p.batch >= result.first_failed
            _stopped_at_the_cap(p, result.cap_bytes)
    table = search_table([result])
    assert (table["framework"] == "torch").all() and (table["max_ok"] == result.max_ok).all()
    assert table["ok"].any() and not table["ok"].all()


def test_real_keras_probe_stops_a_batch_above_the_cap(real_searches):
    """TensorFlow's child: its peak grows with the batch, and the batch above the cap is stopped."""
    _, _, (fit, cap, above) = real_searches
    _peak_of_a_whole_child(fit)
    assert (fit.batch, above.batch) == (SMALL, LARGE)
    _stopped_at_the_cap(above, cap)


def test_real_search_larger_cap_larger_batch(real_searches):
    larger, small, _ = real_searches
    assert len(larger.probes) == 1 and larger.probes[0].ok and larger.max_ok > small.max_ok
    assert larger.cap_bytes > small.cap_bytes
    assert isinstance(search_table([small, larger]), pd.DataFrame)
