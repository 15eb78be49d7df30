"""Where a compare run's time went: the children's phases (phases.parquet) and the parent's (manifest "phases").

    python benchmarks/phases.py reports/<run-id> [reports/<other-run-id> ...]

prints one table per run (docs/MEASUREMENT.md "Where a run's time goes" shows one): per phase, the seconds summed over
the run's cells (wall and the children's CPU), its share of the run's wall time, and per framework the mean seconds
a cell spent in it; "exit" is each cell's wall as the parent timed it beyond its child's phases (writing the tables,
the interpreter's end). Runs given together are compared phase by phase (ratio of the second to the first).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from amp_compare.contract import records
from amp_compare.kit.phases import ORDER

PARENT = ("parent start", "planning", "fork servers", "calibration", "between cells", "render")


def phase_table(run_dir: Path) -> pd.DataFrame:
    """One row per phase (the children's, then "exit", then the parent's): seconds, cpu_seconds, share of the
    run's wall time, and the mean seconds per cell of each framework."""
    run_dir = Path(run_dir)
    phases = records.read_run(run_dir, warn=lambda msg: None)["phases"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    parent = manifest.get("phases", {})
    walls = pd.Series(parent.get("cell_wall_s", {}), dtype=float)
    child = phases.groupby("cell_id")["seconds"].sum()
    exits = (walls - child.reindex(walls.index)).dropna().rename("seconds").rename_axis("cell_id").reset_index()
    exits["phase"], exits["cpu_seconds"] = "exit", float("nan")
    exits["framework"] = exits["cell_id"].map(phases.drop_duplicates("cell_id").set_index("cell_id")["framework"])
    columns = ["cell_id", "framework", "phase", "seconds", "cpu_seconds"]
    cells = pd.concat([phases.reindex(columns=columns), exits], ignore_index=True)
    rows = cells.groupby("phase", sort=False)[["seconds", "cpu_seconds"]].sum(min_count=1)
    per_fw = cells.pivot_table(index="phase", columns="framework", values="seconds", aggfunc="sum", sort=False)
    per_fw = per_fw / cells.groupby("framework")["cell_id"].nunique()
    table = rows.join(per_fw.add_prefix("per cell, ").add_suffix(" (s)"))
    for name in PARENT:
        if name in parent:
            table.loc[f"parent: {name}", "seconds"] = float(parent[name])
    order = [p for p in (*ORDER, "compile/warm-up", "flop count", "exit") if p in table.index]
    table = table.loc[order + [p for p in table.index if p not in order]]
    table["share"] = table["seconds"] / table["seconds"].sum()
    return table


def main(argv: list[str]) -> int:
    tables = [phase_table(Path(a)) for a in argv]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.2f}".format):
        for path, table in zip(argv, tables):
            print(f"{path}: {table['seconds'].sum():.0f} s in all")
            print(table, end="\n\n")
        if len(tables) == 2:
            ratio = (tables[1]["seconds"] / tables[0]["seconds"]).rename("second / first")
            print(pd.concat([tables[0]["seconds"], tables[1]["seconds"], ratio], axis=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
