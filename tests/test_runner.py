"""A child that crashes, is killed or hangs is recorded as failed; the harness goes on."""

import pytest

from common import records, runner
from common.config import RunConfig


@pytest.mark.parametrize(
    ("mode", "timeout", "expected"),
    [("crash", 60, "exited with code 3"), ("kill", 60, "killed by signal SIGKILL"), ("hang", 2, "timed out after 2 s")],
)
def test_failed_child_leaves_a_failed_record(tmp_path, monkeypatch, mode, timeout, expected):
    monkeypatch.setitem(runner.FRAMEWORK_MODULES, "torch", "tests.children.misbehave")
    monkeypatch.setenv("AMP_COMPARE_TEST_MODE", mode)
    cfg = RunConfig(dataset="synthetic")
    events = []
    outcome = runner.run_cell(cfg, tmp_path, "r1", timeout, events.append)
    assert outcome.status == "failed" and outcome.error == expected
    assert events and events[0]["kind"] == "step"
    run = records.read_run(tmp_path)["run"]
    assert run.loc[0, "status"] == "failed" and run.loc[0, "error"] == expected
    if mode == "crash":
        assert "something broke" in run.loc[0, "stderr_tail"]
