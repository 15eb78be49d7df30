"""The Profile section: the ops and library path behind a mixed cell's step time outside SPEED_BAND of fp32's."""

from __future__ import annotations

import math

import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.kit.profile import PLAIN_STEPS

SPEED_BAND = 1.1  # mixed vs fp32 median step ratio outside [1/1.1, 1.1]: a slowdown or speed-up worth explaining
BAND_TEXT = f"{SPEED_BAND - 1:.0%}"
SHOWN_OPS = 3  # operations named per cell
NO_PROFILE = "unexplained: no profile evidence for this cell or its fp32 cell (run with --profile)"
NONE_MOVED = f"No mixed cell ran more than {BAND_TEXT} slower or faster than its fp32 cell."


def explain(run: pd.Series, base: pd.Series, ratio: float, ops: pd.DataFrame, prims: pd.DataFrame) -> dict:
    """The ops that moved most in the direction of a mixed cell's step `ratio` to its fp32 cell (>1: it is faster)."""
    row = {"cell": run["cell_id"], "vs fp32": f"{ratio:.2f}x ({'faster' if ratio > 1 else 'slower'})"}
    mine, theirs = (ops[ops["cell_id"] == c["cell_id"]].groupby("op")["self_time_s"].sum()  # self time per step
                    / max(c.get("profile_steps", float("nan")), 1.0) for c in (run, base))
    if mine.empty or theirs.empty:
        return {**row, "operations behind the difference": NO_PROFILE, "library path": "", "casts": ""}
    moved = mine.sub(theirs, fill_value=0.0).sort_values(ascending=ratio > 1).head(SHOWN_OPS)
    moved = moved[(moved < 0) if ratio > 1 else (moved > 0)]
    total = mine.sum() - theirs.sum()
    lib = ops[ops["cell_id"].isin([run["cell_id"], base["cell_id"]])].drop_duplicates("op").set_index("op")["library"]
    share = moved.sum() / total if total and math.isfinite(total) and (total > 0) == (ratio < 1) else float("nan")
    text = "; ".join(f"{op} {d * 1e3:+.1f} ms/step" for op, d in moved.items()) + (
        f" ({share:.0%} of the window's {total * 1e3:+.1f} ms/step)" if math.isfinite(share) else "")
    # oneDNN's reference (non-JIT) kernels the cell ran: the library path that makes a half precision crawl
    slow = prims[(prims["cell_id"] == row["cell"]) & prims["impl"].str.startswith("ref")] if not prims.empty else prims
    paths = [f"{op}: {lib.get(op) or 'not reported'}" for op in moved.index] + [
        f"oneDNN ran its reference kernel {r.impl} for {r.kind} {r.prop_kind} ({r.dtype})" for r in slow.itertuples()]
    return {**row, "operations behind the difference": text or "no op moved in that direction in the window",
            "library path": "; ".join(paths), "casts": f"{run.get('profile_cast_share', math.nan):.1%} vs fp32 "
                                                       f"{base.get('profile_cast_share', math.nan):.1%}"}


def section(tables: dict[str, pd.DataFrame]) -> dict | None:
    """The section's table and sentences, or None when no cell of the run was profiled."""
    runs = tables.get("run", pd.DataFrame())
    if runs.empty or "profile_step_s" not in runs.columns:
        return None
    ops = tables.get("profile_ops", pd.DataFrame(columns=["cell_id", "op", "self_time_s", "library"]))
    prims = tables.get("profile_primitives", pd.DataFrame(columns=["cell_id", "impl"]))
    ok = runs[runs["status"] == "ok"].set_index("cell_id", drop=False)
    rows = []
    for _, run in ok[ok["precision"] != precisions.REFERENCE].iterrows():
        fp32 = run["cell_id"].replace(f"-{run['precision']}-", f"-{precisions.REFERENCE}-", 1)  # its fp32 cell's id
        ratio = ok.loc[fp32, "median_step_s"] / run["median_step_s"] if fp32 in ok.index and run["median_step_s"] > 0 \
            else 1.0  # no fp32 cell or no step time: nothing to explain
        if not 1 / SPEED_BAND <= ratio <= SPEED_BAND:
            rows.append(explain(run, ok.loc[fp32], ratio, ops, prims))
    profiled = ok[ok["profile_step_s"].notna()]
    traces = [f"{c}: cells/{c}/{t}" for c, t in zip(profiled["cell_id"], profiled["profile_trace"]) if t]
    over = profiled["profile_overhead"].dropna()  # how the window was kept out of the timed steps, and its cost
    cost = (f"a profiled step took {over.median():.2f}x a bare one (median over {len(over)} cells, range "
            f"{over.min():.2f}-{over.max():.2f}x)" if len(over) else "no cell timed both windows")
    said = [f"The profiled steps ran after each cell's timed epochs, never among them: {PLAIN_STEPS} bare steps, "
            f"then {int(profiled['profile_steps'].max())} under the profiler; {cost}."] if not profiled.empty else []
    return {"table": pd.DataFrame(rows), "sentences": said, "traces": traces, "none_moved": NONE_MOVED,
            "band": BAND_TEXT}


def markdown(profile: dict | None, table_markdown) -> list[str]:
    return ["", "### Profile", "", table_markdown(profile["table"]) if not profile["table"].empty else NONE_MOVED, "",
            *[f"- {s}" for s in profile["sentences"]]] if profile else []
