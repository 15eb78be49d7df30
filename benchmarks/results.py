"""Where benchmark tables go: one timestamped CSV per run under reports/bench/ (git-ignored)."""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path


def write_csv(rows: list[dict], out_dir: Path, name: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{datetime.now():%Y%m%d-%H%M%S}.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"written: {path}")
    return path
