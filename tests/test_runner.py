"""A child that crashes, is killed or hangs is recorded as failed; the harness goes on."""

import json

import pytest

from amp_compare.contract import records
from amp_compare.contract.config import RunConfig
from amp_compare.harness.run import runner
from tests.children import misbehave


@pytest.mark.parametrize(
    ("mode", "timeout", "expected"),
    [("crash", 60, "exited with code 3"), ("kill", 60, "killed by signal SIGKILL"), ("hang", 2, "timed out after 2 s"),
     ("unavailable", 60, "unavailable: amp_compare.torch_impl.train cannot import its framework (simulated)")],
)
def test_failed_child_leaves_a_failed_record(tmp_path, monkeypatch, mode, timeout, expected):
    monkeypatch.setitem(runner.FRAMEWORK_MODULES, "torch", "tests.children.misbehave")
    # the mode in a file the stand-in reads at the cell's start: in the environment it would name a pre-imported
    # parent per mode (a torch import each); every mode's cell forks from one
    (tmp_path / misbehave.SPEC).write_text(json.dumps({"mode": mode}))
    cfg = RunConfig(dataset="synthetic")
    events = []
    outcome = runner.run_cell(cfg, tmp_path, "r1", timeout, events.append)
    status = "unavailable" if mode == "unavailable" else "failed"
    assert outcome.status == status and outcome.error == expected
    assert events and events[0]["kind"] == "step"
    run = records.read_run(tmp_path)["run"]
    assert run.loc[0, "status"] == status and run.loc[0, "error"] == expected
    if mode == "crash":
        assert "something broke" in run.loc[0, "stderr_tail"]


def test_missing_framework_is_found_without_importing_it(tmp_path, monkeypatch):
    monkeypatch.setitem(runner.FRAMEWORK_LIBRARIES, "tf", "no_such_framework_xyz")
    outcome = runner.run_cell(RunConfig(framework="tf", dataset="synthetic"), tmp_path, "r1", 60)
    assert outcome.status == "unavailable" and "no_such_framework_xyz is not installed" in outcome.error
    assert records.read_run(tmp_path)["run"].loc[0, "status"] == "unavailable"


def test_a_signal_while_a_child_starts_is_acted_on_once_it_has_started(monkeypatch):
    """run_cell starts its child inside signals_deferred: a SIGTERM (or Ctrl-C) that lands inside Popen used to
    raise there, before run_cell held the handle that stops the child, and left the child running (seen: the
    SIGTERM test found its hanging child alive 60 s after the harness had exited)."""
    import os
    import signal

    from amp_compare.harness.run.runner import signals_deferred

    class Stop(Exception):
        pass

    def on_term(signum, frame):
        raise Stop()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        finished = False
        with pytest.raises(Stop):
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # give Python every chance to run a handler here
                    sum(range(100))
                finished = True
        assert finished  # the body ran to its end; the signal was acted on after it
        assert signal.getsignal(signal.SIGTERM) is on_term
    finally:
        signal.signal(signal.SIGTERM, previous)
