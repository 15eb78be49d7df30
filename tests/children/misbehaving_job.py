"""A submitit job that runs its cell through tests/children/misbehave/ instead of the real torch child.

The harness submits `launchers.cell_job` by reference; a test that sets `launchers.cell_job` to this function in
the harness's process makes every job run it, on the job's side of the process boundary, where a patch made in
the harness would not reach. Everything else is the real job.
"""

from amp_compare.harness.run import launchers, runner


def cell_job(*args):
    runner.FRAMEWORK_MODULES["torch"] = "tests.children.misbehave"
    return launchers.cell_job(*args)
