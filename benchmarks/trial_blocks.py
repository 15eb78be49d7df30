"""Benchmark: does a speed trial's block length change its ratio (do interleaved models lose their warm caches)?

A trial (kit/trial.py) switches between the fp32 model and each mixed precision's model every block; a block lasts at
least BLOCK_S (50 ms). If switching cost each model its caches (weights, activations, allocator pools), short blocks
would read slower than long ones, and by different amounts per precision, moving the ratio. This runs, in one process
per framework, the trial's own steppers (the twin's trial.steppers: the cells' build and step functions) through
kit/trial.run_blocks at two block lengths, alternated short, long, long, short so that a drift of the machine falls
on both alike, and prints per mixed precision the ratio (fp32 time ÷ mixed time per step) with its 95% interval at
each length, and whether the two lengths' intervals overlap. Writes the table as CSV under reports/bench/.

    python benchmarks/trial_blocks.py [--framework torch] [--model simple_cnn] [--dataset digits]
                                      [--block-s 0.05,0.25] [--budget-s 8]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from amp_compare.contract.config import DEFAULT_PRECISIONS, FRAMEWORK_MODULES, RunConfig  # noqa: E402
from amp_compare.kit.child import SharedInit  # noqa: E402
from amp_compare.kit.data import load_dataset  # noqa: E402
from amp_compare.kit.trial import run_blocks, speed_status, trial_summary, trial_table  # noqa: E402
from benchmarks.amp_speed import overlap  # noqa: E402
from benchmarks.results import write_csv  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", default="torch", choices=sorted(FRAMEWORK_MODULES))
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--block-s", default="0.05,0.25", help="two block lengths (s), the first the trial's own")
    parser.add_argument("--budget-s", type=float, default=8.0, help="each run of blocks' budget")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench")
    args, _ = parser.parse_known_args()
    lengths = [float(v) for v in args.block_s.split(",")]
    if len(lengths) != 2 or min(lengths) <= 0:
        parser.error(f"--block-s {args.block_s!r}: give two positive lengths in seconds, e.g. 0.05,0.25")
    cfgs = [RunConfig(framework=args.framework, model=args.model, dataset=args.dataset, precision=p, seed=0,
                      batch_size=args.batch_size, device="cpu") for p in DEFAULT_PRECISIONS]
    twin = importlib.import_module(f"{FRAMEWORK_MODULES[args.framework]}.trial")
    steppers, threads = twin.steppers(cfgs, load_dataset(args.dataset), SharedInit(None, args.framework, 0))
    blocks = {length: [] for length in lengths}
    for length in [lengths[0], lengths[1], lengths[1], lengths[0]]:
        rows = run_blocks(steppers, args.budget_s, block_s=length)
        offset = len(blocks[length]) and max(r["round"] for r in blocks[length]) + 1
        blocks[length] += [{**r, "round": r["round"] + offset} for r in rows]
    summaries = {length: trial_summary(trial_table("bench", cfgs[0], rows, threads)).set_index("precision")
                 for length, rows in blocks.items()}
    out = []
    print(f"{args.framework} {args.model} on {args.dataset}, batch {args.batch_size}: ratio fp32 ÷ mixed time per "
          "step [95% interval] (rounds) per block length")
    for precision in summaries[lengths[0]].index:
        row = {"framework": args.framework, "model": args.model, "precision": precision}
        for length in lengths:
            s = summaries[length].loc[precision]
            row.update({f"{length:g}s ratio": s["ratio"], f"{length:g}s low": s["low"], f"{length:g}s high": s["high"],
                        f"{length:g}s rounds": s["rounds"],
                        f"{length:g}s status": speed_status(s["ratio"], s["low"], s["high"])})
        row["overlap"] = overlap([(row[f"{v:g}s low"], row[f"{v:g}s high"]) for v in lengths])
        row["long / short"] = row[f"{lengths[1]:g}s ratio"] / row[f"{lengths[0]:g}s ratio"]
        out.append(row)
        print(f"  {precision:<6}" + " | ".join(
            f"{v:g} s: {row[f'{v:g}s ratio']:.3f}× [{row[f'{v:g}s low']:.3f}, {row[f'{v:g}s high']:.3f}] "
            f"({row[f'{v:g}s rounds']})" for v in lengths)
            + f" | long ÷ short {row['long / short']:.3f} | overlap: {'yes' if row['overlap'] else 'NO'}")
    write_csv(pd.DataFrame(out).to_dict("records"), args.out, f"trial_blocks_{args.framework}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
