"""Benchmark: does the speed trial give the same answer on an idle machine and beside a busy process?

The compare's own speed trial (kit/trial.py, run as a compare runs it: harness/run/trials.run_trial, a child forked
from the framework's pre-imported parent) runs three times per framework: twice on an idle machine, then once beside a
bounded busy process pinned to one core (a spinning interpreter that stops by itself after the trial's timeout at
most, and is stopped as soon as the trial ends). Per mixed precision it prints the three ratios (fp32 time ÷ mixed
time, >1 faster) with their 95% intervals, the status each supports (kit/trial.speed_status), the busy run's
contended blocks, and whether the three intervals overlap. Writes the table as CSV under reports/bench/.

    python benchmarks/amp_speed.py [--frameworks torch,tf] [--model simple_cnn] [--dataset digits] [--batch-size 64]
                                   [--budget-s 10]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_compare.contract.config import DEFAULT_PRECISIONS, RunConfig  # noqa: E402
from amp_compare.contract.records import read_trials  # noqa: E402
from amp_compare.harness.run import forkserver, runner, trials  # noqa: E402
from amp_compare.kit.trial import speed_status, trial_summary  # noqa: E402
from benchmarks.results import write_csv  # noqa: E402

RUNS = ("idle 1", "idle 2", "busy")
OVERLAP_WORDS = {True: "yes", False: "NO", None: "n/a (too few rounds for an interval: a longer --budget-s)"}
# The busy process: one interpreter pinned to one of this process's cores, spinning until its deadline
SPIN = ("import os, sys, time\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "end = time.monotonic() + float(sys.argv[1])\n"
        "while time.monotonic() < end:\n"
        "    pass\n")


def overlap(intervals: list[tuple[float, float]]) -> bool | None:
    """Whether every interval shares a point with every other (one common point, for intervals on a line); None where
    a trial had too few rounds for an interval."""
    if any(math.isnan(v) for interval in intervals for v in interval):
        return None
    return max(low for low, _ in intervals) <= min(high for _, high in intervals)


def run_one(cfgs: list[RunConfig], run_dir: Path, busy: bool, timeout: float) -> dict:
    spinner = None
    if busy:
        spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(timeout)])
    try:
        return trials.run_trial(cfgs, run_dir, run_dir.name, timeout)
    finally:
        if spinner is not None:
            spinner.terminate()
            spinner.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="torch,tf")
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--budget-s", type=float, default=10.0, help="each trial's budget (--trial-budget-s)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench")
    args, _ = parser.parse_known_args()  # `nox -s bench -- …` hands overhead.py's options here too
    root = args.out / f"trials-{datetime.now():%Y%m%d-%H%M%S}"
    groups = {fw: [RunConfig(framework=fw, model=args.model, dataset=args.dataset, precision=p, seed=0,
                             batch_size=args.batch_size, device=args.device, trial_budget_s=args.budget_s)
                   for p in DEFAULT_PRECISIONS] for fw in args.frameworks.split(",")}
    timeout = trials.TIMEOUT_MARGIN_S + trials.TIMEOUT_FACTOR * args.budget_s
    runner.prestart_fork_servers([c for cfgs in groups.values() for c in cfgs], root)
    summaries = {}
    try:
        for label in RUNS:
            run_dir = root / label.replace(" ", "-")
            for fw, cfgs in groups.items():
                outcome = run_one(cfgs, run_dir, label == "busy", timeout)
                if outcome["status"] != "ok":
                    print(f"{fw} trial ({label}) {outcome['status']}: {outcome['error']}", file=sys.stderr)
                    return 1
            summaries[label] = trial_summary(read_trials(run_dir)).set_index(["framework", "precision"])
    finally:
        forkserver.close_all()
    rows = []
    for key in summaries[RUNS[0]].index:
        row = {"framework": key[0], "model": args.model, "batch_size": args.batch_size, "precision": key[1]}
        for label in RUNS:
            s = summaries[label].loc[key]
            status = speed_status(s["ratio"], s["low"], s["high"])
            row.update({f"{label} ratio": s["ratio"], f"{label} low": s["low"], f"{label} high": s["high"],
                        f"{label} rounds": s["rounds"], f"{label} status": status,
                        f"{label} contended": s["contended_blocks"]})
        row["overlap"] = overlap([(row[f"{label} low"], row[f"{label} high"]) for label in RUNS])
        rows.append(row)
    print(f"Speed trials ({args.model}, {args.dataset}, batch {args.batch_size}, budget {args.budget_s:g} s each): "
          "ratio fp32 ÷ mixed time per step [95% interval] (rounds, contended blocks), status")
    for r in rows:
        cells = [f"{r[f'{label} ratio']:.2f}× [{r[f'{label} low']:.2f}, {r[f'{label} high']:.2f}] "
                 f"({r[f'{label} rounds']}, {r[f'{label} contended']}) {r[f'{label} status']}" for label in RUNS]
        print(f"{r['framework']:<6}{r['precision']:<6}" + " | ".join(f"{label}: {c}" for label, c in zip(RUNS, cells))
              + f" | overlap: {OVERLAP_WORDS[r['overlap']]}")
    write_csv(rows, args.out, "amp_speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
