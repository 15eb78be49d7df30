"""Each seed's speed ratio of every mixed cell against its fp32 cell, with the seed's own interval and the drift
band the machine's checks allow around it: what the answer says "in every seed" from, and what the forest plot
draws. One row per (machine x) model x dataset x step loop x batch size x framework x precision x seed, so no row
mixes two of any of them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.harness.report import stats
from amp_compare.harness.report.drift import drift_of, stall_note
from amp_compare.harness.report.tables import _keys, ok_runs, with_loop_columns

COLUMNS = ["framework", "precision", "seed", "ratio", "low", "high", "band_low", "band_high", "outside", "stalled"]


def _timed(steps: pd.DataFrame | None, cells: set) -> dict[str, np.ndarray]:
    """Each cell's timed step times (warm-up steps left out)."""
    if steps is None or "step_time_s" not in steps:
        return {}
    timed = steps[steps["cell_id"].isin(cells)]
    timed = timed[~timed["warmup"].astype(bool)] if "warmup" in timed else timed
    return {c: g["step_time_s"].to_numpy(float) for c, g in timed.groupby("cell_id")}


def seed_table(runs: pd.DataFrame, steps: pd.DataFrame | None, environment: dict) -> pd.DataFrame:
    """Per mixed cell: its seed's speed ratio (the run table's wall-time throughputs, as the summary's), that
    seed's 95% interval from batch means of both cells' timed steps (NaN where too few), and the drift band
    (harness/report/drift.py) with whether the ratio lies outside it, and whether a stall next to either
    cell could explain it (drift.stall_note: then the band is the one that note quotes, the stall counted)."""
    ok = with_loop_columns(ok_runs(runs).copy())
    keys = _keys(ok) + ["framework"] if not ok.empty else []
    if ok.empty:
        return pd.DataFrame(columns=COLUMNS)
    drift, by_cell, rows = drift_of(environment or {}), _timed(steps, set(ok["cell_id"])), []
    for key, group in ok.groupby(keys, sort=False, dropna=False):
        fp32 = {r.seed: r for r in group[precisions.is_reference(group["precision"])].itertuples()}
        for r in group[precisions.is_mixed(group["precision"])].itertuples():
            base = fp32.get(r.seed)
            if base is None or not (base.throughput_img_s > 0 and r.throughput_img_s > 0):
                continue
            ratio = float(r.throughput_img_s / base.throughput_img_s)
            res = stats.speed_interval([by_cell.get(base.cell_id, np.array([]))],
                                       [by_cell.get(r.cell_id, np.array([]))], [float(np.log(ratio))])
            # the band the text quotes for this seed: with the stalled check among its checks where stall_note
            # says the stall could explain the ratio (its marker then lies inside it), else drift's own band
            stalled = bool(stall_note(drift, [(base.cell_id, r.cell_id, ratio, r.seed)]))
            band = drift.band(base.cell_id, r.cell_id, stalls=stalled) if drift else (np.nan, np.nan)
            rows.append({**dict(zip(keys, key)), "precision": r.precision, "seed": r.seed, "ratio": ratio,
                         "low": res["low"], "high": res["high"], "band_low": band[0], "band_high": band[1],
                         "outside": bool(drift) and not band[0] <= ratio <= band[1], "stalled": stalled,
                         "fp32_cell": base.cell_id, "cell_id": r.cell_id})
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=COLUMNS)
