"""What both benchmarks share: paired-ratio intervals, and where their tables go (one timestamped CSV per run
under reports/bench/, git-ignored)."""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

import numpy as np


def write_csv(rows: list[dict], out_dir: Path, name: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{datetime.now():%Y%m%d-%H%M%S}.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"written: {path}")
    return path


def ratio_interval(num, den) -> tuple[float, float, float]:
    """Geometric mean of the per-round ratios num/den and its 95% t-interval: (ratio, low, high)."""
    from scipy import stats

    logs = np.log(np.asarray(num, dtype=float) / np.asarray(den, dtype=float))
    if logs.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(logs.mean())
    if logs.size < 2:
        return float(np.exp(mean)), float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, logs.size - 1) * logs.std(ddof=1) / np.sqrt(logs.size))
    return float(np.exp(mean)), float(np.exp(mean - half)), float(np.exp(mean + half))
