"""A stand-in framework child that fails on purpose.

AMP_COMPARE_TEST_MODE picks the failure (crash, hang, kill, unavailable; crash-rank1: under torchrun, worker 1
crashes and the others hang; kill-job: the process that started this child is killed, as a scheduler kills a
job that ran out of time or was pre-empted, and the child exits). With AMP_COMPARE_TEST_CELL set, only the cell
whose --out path contains that text misbehaves; every other cell runs the real torch child, so a test can break one
cell of a real matrix. With
AMP_COMPARE_TEST_PIDS set, a misbehaving process first leaves its pid there (a file named by it), so a test can
check that none is left alive.

A test may write the mode and the cell to SPEC ({"mode": ..., "cell": ...}) in the run's folder instead: the
variables are part of the environment that names a kept pre-imported parent (harness/run/forkserver.py), so each
test's own pair would start a parent of its own (a torch import, seconds of CPU), where a file read at the cell's
start lets every test's stand-in cells fork from one.
"""

import json
import os
import runpy
import sys
import time
from pathlib import Path

from tests.children.misbehave import SPEC

out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else ""


def _spec() -> dict:
    """The misbehaviour a test wrote beside its run: SPEC in the run's folder or in the folder it is in (compare's
    --out), read here at the cell's start; {} where there is none (the variables then say it)."""
    if not out:
        return {}
    cell_dir = Path(out).resolve()  # <run folder>/cells/<cell id>
    for folder in cell_dir.parents[1:3]:
        if (folder / SPEC).exists():
            return json.loads((folder / SPEC).read_text())
    return {}


spec = _spec()
mode = spec.get("mode", os.environ.get("AMP_COMPARE_TEST_MODE", "crash"))
only = spec.get("cell", os.environ.get("AMP_COMPARE_TEST_CELL"))
if only and only not in out:
    runpy.run_module("amp_compare.torch_impl", run_name="__main__")  # the real child; exits itself
if os.environ.get("AMP_COMPARE_TEST_PIDS"):
    open(os.path.join(os.environ["AMP_COMPARE_TEST_PIDS"], str(os.getpid())), "w").close()
print('@@amp-compare {"kind": "step", "epoch": 0, "epochs": 1, "step": 1, "steps": 2}', flush=True)
if mode == "crash-rank1":
    mode = "crash" if os.environ.get("RANK") == "1" else "hang"
if mode == "crash":
    print("Traceback: something broke inside the framework", file=sys.stderr)
    raise SystemExit(3)
if mode == "hang":
    time.sleep(600)
if mode == "kill-job":
    os.kill(os.getppid(), 9)
    raise SystemExit(1)
if mode == "kill":
    os.kill(os.getpid(), 9)
if mode == "unavailable":
    print("unavailable: amp_compare.torch_impl.train cannot import its framework (simulated)", file=sys.stderr)
    raise SystemExit(69)
