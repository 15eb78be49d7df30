"""Where a child's wall time goes, phase by phase (stdlib only: it runs before any framework is imported).

One process-wide stopwatch, `PHASES`: `lap(name)` gives the time since the previous lap to `name` (a name may
collect several laps). The child's first lap starts when the parent started it: the parent passes the wall-clock
time it spawned the process in SPAWNED_AT_ENV, so "process start" holds the interpreter's start and the imports of
the project's own modules (numpy, pandas, pydantic), "framework import" the import of the framework package.
The laps end at the record tables' build (kit/child.py writes them as `phases.parquet`); what follows (writing the
tables, the interpreter's exit) is the parent's "exit" phase of the cell (harness/run/runner.py), from its own clock.
The twins' train() mark their phases with `lap` between their steps, so the phases are consecutive and their sum is
the child's wall time from spawn to records (tests/test_phases.py checks the sum against that wall).
"""

from __future__ import annotations

import os
import sys
import time

SPAWNED_AT_ENV = "AMP_COMPARE_SPAWNED_AT"  # time.time() in the parent just before it started the child
# Test hook (kit/training.simulated_slow_step): "fp16=0.05" sleeps 0.05 s in every step of precision fp16, a stand-in
# for a CPU where it is slow; read as the step runs
SLOW_STEP_ENV = "AMP_COMPARE_TEST_SLOW_STEP"

# The phases in the order a cell runs them; a phase a cell does not run is absent from its table.
ORDER = ("process start", "framework import", "config", "data", "setup", "init", "ceiling", "audits",
         "training", "evaluation", "closing", "records")


class Phases:
    """Consecutive laps of one process: seconds per phase name, in the order they were first lapped."""

    def __init__(self, started_at: float | None = None):
        # perf_counter is monotonic but has no epoch; the parent's spawn time is on the wall clock
        self._last = time.perf_counter() - (time.time() - started_at if started_at is not None else 0.0)
        # process_time counts from the process's start: the first lap's CPU seconds are the start's
        self._last_cpu = 0.0 if started_at is not None else time.process_time()
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}

    def restart(self, started_at: float | None) -> None:
        """Start over from `started_at` (a child forked from a pre-imported parent, kit/zygote.py: its phases begin
        at the harness's spawn time, as a fresh process's do; its CPU clock starts at the fork)."""
        self.__init__(started_at)

    def lap(self, name: str) -> float:
        """The time since the previous lap (wall, and this process's CPU), added to `name`; returns the wall."""
        now, cpu = time.perf_counter(), time.process_time()
        spent, self._last = now - self._last, now
        self.seconds[name] = self.seconds.get(name, 0.0) + spent
        self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + cpu - self._last_cpu
        self._last_cpu = cpu
        return spent

    def move(self, seconds: float, source: str, target: str) -> None:
        """Move `seconds` of wall time already lapped into `source` over to `target` (a part measured inside a lap:
        the evaluation passes inside Keras' fit, the first steps' compilation inside training); its CPU seconds
        move in the same proportion."""
        seconds = max(0.0, min(seconds, self.seconds.get(source, 0.0)))
        if seconds:
            cpu = self.cpu_seconds.get(source, 0.0) * seconds / self.seconds[source]
            for book, amount in ((self.seconds, seconds), (self.cpu_seconds, cpu)):
                book[source] -= amount
                book[target] = book.get(target, 0.0) + amount

    def rows(self) -> list[dict]:
        """One row per phase: wall seconds and CPU seconds (all threads of this process; a busy machine stretches
        the wall, less so the CPU)."""
        return [{"phase": name, "seconds": float(s), "cpu_seconds": float(self.cpu_seconds.get(name, 0.0))}
                for name, s in self.seconds.items()]


def spawned_at() -> float | None:
    """The parent's spawn time of this process, where it passed one."""
    try:
        return float(os.environ[SPAWNED_AT_ENV])
    except (KeyError, ValueError):
        return None


PHASES = Phases(spawned_at())


def lap(name: str) -> float:
    """PHASES.lap: the twins call this between the steps of train()."""
    return PHASES.lap(name)


def exit_now(code: int) -> None:
    """End a child process at once with `code` (the `python -m` entry points of the twins and their probes only,
    never in-process).

    Its records are written and synced by then (contract/atomic.py), a probe's line printed: the interpreter's
    shutdown (a framework's thread pools and atexit handlers, freeing every object) adds nothing to them, only time
    to the cell (its "exit" phase, docs/MEASUREMENT.md: 4-5 s a cell on a busy 2-core machine)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
