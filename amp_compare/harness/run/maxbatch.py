"""`--find-max-batch`: the largest batch that trains a step without running out of memory.

For one cell (framework x model x dataset x precision) the search doubles the batch from `start`
until a probe fails, then bisects between the last batch that fit and the first that did not.
Every probe is a fresh `python -m amp_compare.torch_impl.probe|amp_compare.keras_impl.probe` child (each framework keeps
memory it once used, so one process per batch is the only honest measurement) that builds the
cell's model, optimizer and loss scaler exactly as training does and runs two steps on one
random batch; the second step holds the optimizer state, the steady state of training.

The memory cap:
  * CPU (cfg.device == "cpu"): a cap on the child process's resident memory. The parent
    enforces it with a watchdog that samples the child's VmRSS every WATCHDOG_INTERVAL_S and
    kills its process group above the cap; the child itself also compares its peak (VmHWM) with
    the cap at the end, which catches a spike shorter than the watchdog's interval.
  * GPU (cfg.device == "cuda"): the device's own memory is the cap. The watchdog and the child's
    RSS check are off; a probe fails only on the framework's out-of-memory error, and its peak is
    the framework allocator's (torch max_memory_allocated, TensorFlow get_memory_info).

This is the parent's side of the probe protocol (`probe`, `find_max_batch`, the watchdog); the
child's side (argument parsing and reporting, `probe_main`, which torch_impl/probe.py and
keras_impl/probe.py call with their framework's two training steps) is kit/probe.py, so a probe
child never imports the parent's process-killing code.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from amp_compare.contract.config import FRAMEWORK_MODULES, ConfigError, RunConfig
from amp_compare.contract.env import PROJECT_ROOT
from amp_compare.harness.run.runner import child_env, kill_group, signals_deferred, stderr_tail
from amp_compare.kit.probe import EXIT_OOM, format_size, rss_bytes

WATCHDOG_INTERVAL_S = 0.05
SAMPLED_RSS_KIND = "cpu_rss_sampled"  # the highest VmRSS the watchdog saw (a killed or timed-out child)


@dataclass(frozen=True)
class ProbeResult:
    """One child's answer: did two training steps at `batch` fit?"""

    batch: int
    ok: bool
    peak_bytes: int | None  # the child's peak; for a killed probe the highest RSS the watchdog saw
    reason: str = ""  # why it failed ("" when ok)
    memory_kind: str = ""  # what peak_bytes measures (PEAK_RSS_KIND, or a GPU allocator's peak)


@dataclass(frozen=True)
class SearchResult:
    """One cell's search: the largest batch that fit and every probe that found it."""

    max_ok: int  # largest batch that fit (0: not even a batch of 1)
    first_failed: int | None  # smallest batch that did not (None: `limit` fit)
    probes: list[ProbeResult]  # in the order they ran
    cap_bytes: int | None  # the cap searched under: CPU RSS per probe, or GPU memory (None: the GPU's own)
    cfg: RunConfig | None = None  # the cell searched, for search_table's identity columns
    stopped_early: str = ""  # why the search stopped before it converged ("" when it did)


def _last_json(text: str) -> dict | None:
    """The child's report: the last stdout line that is a JSON object (a library may print too)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def probe(cfg: RunConfig, batch: int, cap_bytes: int | None, timeout_s: float = 300) -> ProbeResult:
    """Run two training steps of `cfg` at `batch` in a fresh child under the memory cap.

    ok=False when the batch does not fit: the watchdog killed the child (CPU, RSS above the cap),
    the child reported EXIT_OOM, or it ran past `timeout_s`. Any other failure raises RuntimeError
    with the child's stderr tail: a crash must not look like a batch that is too large.
    """
    watch = cfg.device == "cpu" and cap_bytes is not None  # on a GPU the framework enforces the cap itself
    with tempfile.TemporaryDirectory(prefix="amp-compare-probe-") as tmp:
        config_path, out_path, err_path = Path(tmp) / "config.json", Path(tmp) / "stdout", Path(tmp) / "stderr"
        config_path.write_text(dataclasses.replace(cfg, batch_size=batch).to_json())
        cmd = [sys.executable, "-m", f"{FRAMEWORK_MODULES[cfg.framework]}.probe", "--config", str(config_path),
               "--batch", str(batch)]
        if cap_bytes is not None:
            cmd += ["--memory-cap", str(cap_bytes)]
        # Files, not pipes: nobody reads while the watchdog polls, and a full pipe would stall the child.
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc, start, seen, failure = None, time.monotonic(), 0, ""
            try:
                with signals_deferred():  # a signal inside Popen would leave its child running (runner.run_cell)
                    proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                            env=child_env(cfg), cwd=PROJECT_ROOT, start_new_session=True)
                while proc.poll() is None:
                    rss = rss_bytes(proc.pid)
                    seen = max(seen, rss)
                    if watch and rss > cap_bytes:
                        kill_group(proc)
                        failure = (f"killed: RSS above the cap ({format_size(rss)} > {format_size(cap_bytes)}, "
                                   "watchdog)")
                    elif time.monotonic() - start > timeout_s:
                        kill_group(proc)
                        failure = f"timed out after {timeout_s:g} s"
                    else:
                        time.sleep(WATCHDOG_INTERVAL_S)
            finally:  # Ctrl-C or any error here: never leave a child behind
                if proc is not None:
                    kill_group(proc)
        # The parent only sees host memory: on a GPU a failed probe has no peak to report.
        sampled = (seen or None) if cfg.device == "cpu" else None
        kind = SAMPLED_RSS_KIND if sampled else ""
        if failure:
            return ProbeResult(batch, False, sampled, failure, kind)
        report, tail = _last_json(out_path.read_text(errors="replace")), stderr_tail(err_path)
        if proc.returncode in (0, EXIT_OOM) and report is not None:
            return ProbeResult(batch, bool(report["ok"]) and proc.returncode == 0, report.get("peak_bytes"),
                               report.get("reason", ""), report.get("memory_kind", ""))
        if proc.returncode == -signal.SIGABRT and "std::bad_alloc" in tail:
            # TensorFlow's CPU runtime aborts on a failed allocation instead of raising: out of memory too.
            return ProbeResult(batch, False, sampled, "std::bad_alloc: the framework's C++ allocator failed", kind)
        raise RuntimeError(f"{cfg.framework} probe at batch {batch} failed (exit code {proc.returncode}, "
                           f"not an out-of-memory):\n{tail}")


class SearchBudgetSpent(Exception):
    pass


def find_max_batch(cfg: RunConfig, cap_bytes: int | None, start: int = 16, limit: int = 2**16,
                   resolution: float = 0.1, timeout_s: float = 300,
                   on_probe: Callable[[ProbeResult], None] = lambda result: None,
                   budget_s: float | None = 540.0) -> SearchResult:
    """The largest batch (up to `limit`) that trains two steps of `cfg` under the memory cap.

    Doubles from `start` until a probe fails or `limit` fits (if `start` itself fails, halves down
    to 1 first), then bisects between the last batch that fit and the first that failed until they
    are within max(1, resolution * fit) of each other. Memory grows with the batch, so every batch
    below `max_ok` is taken to fit. On a GPU the cap, if given, is enforced by the framework in the
    probe (cap_label); None: the device's own memory. The whole search stops once budget_s has passed
    (no new probe starts; a running probe is bounded by timeout_s) and says so in stopped_early.
    """
    if start < 1 or limit < 1:
        raise ConfigError(f"start and limit must be positive batch sizes, got start={start!r} limit={limit!r}")
    if not resolution >= 0:
        raise ConfigError(f"resolution must be a non-negative fraction, got {resolution!r}")
    probes: list[ProbeResult] = []
    deadline = None if budget_s is None else time.monotonic() + budget_s

    def fits(batch: int) -> bool:
        if deadline is not None and time.monotonic() > deadline:
            raise SearchBudgetSpent
        result = probe(cfg, batch, cap_bytes, timeout_s)
        probes.append(result)
        on_probe(result)
        return result.ok

    state = {"ok": 0, "failed": None}
    try:
        search(fits, start, limit, resolution, state)
    except SearchBudgetSpent:
        return SearchResult(state["ok"], state["failed"], probes, cap_bytes, cfg,
                            stopped_early=f"stopped early: the search's {budget_s:g} s budget was spent "
                                          f"after {len(probes)} probes (largest batch that fit so far)")
    return SearchResult(state["ok"], state["failed"], probes, cap_bytes, cfg)


def search(fits: Callable[[int], bool], start: int, limit: int, resolution: float, state: dict) -> None:
    """Doubling, halving, bisection; state["ok"] / state["failed"] are current after every probe."""
    ok, failed, batch = 0, None, min(start, limit)

    def seen(new_ok, new_failed):
        state.update(ok=new_ok, failed=new_failed)

    while True:  # doubling up
        if not fits(batch):
            failed = batch
            seen(ok, failed)
            break
        ok = batch
        seen(ok, failed)
        if batch >= limit:
            break
        batch = min(2 * batch, limit)
    if ok == 0:  # `start` was already too large: halving down
        batch = failed // 2
        while batch >= 1 and not fits(batch):
            failed, batch = batch, batch // 2
            seen(ok, failed)
        ok = batch  # 0: not even a batch of 1 fits
        seen(ok, failed)
    while failed is not None and ok > 0 and failed - ok > max(1.0, resolution * ok):  # bisection
        mid = (ok + failed) // 2
        if fits(mid):
            ok = mid
        else:
            failed = mid
        seen(ok, failed)


