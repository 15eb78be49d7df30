"""The report's "Data parallel" section: a --replicas run's N-worker cells against their 1-worker cells (`rows`)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd

from amp_compare.contract.config import ALLREDUCE_REFERENCE, ALLREDUCES, display_order, framework_label
from amp_compare.harness.common import UNSTEADY
from amp_compare.harness.report import phrases, stats, verdicts, wording
from amp_compare.harness.report.speed import calibration_checks

KEY = ["model", "dataset", "framework", "precision", "seed"]
POOL = ["model", "dataset", "framework", "precision", "cfg_replicas"]  # what an all-reduce's accuracy pools over
NEAR_CHANCE_PP = 10.0  # validation accuracy this close to chance: a difference between two guessers
STALL_FACTOR = 2.0  # a 1-worker cell whose floor cell ran this many times faster stalled
AT_FLOOR_FACTOR = 2.0  # a loss gap within this factor of the floor's, or FLOAT32_ULPS of the loss, is at the floor
FLOAT32_ULPS = 4
_REL_ULP = float(np.finfo(np.float32).eps)  # the float32 spacing at 1, relative: the largest relative ulp of a value
STEP_COLUMN = "Median step time vs --allreduce fp32 (same seed; <1×: shorter)"
TEST_KEYS = ("diff_pp", "ci_low", "ci_high", "p_value", "method", "detectable", "near_chance")


def _flag(runs: pd.DataFrame, column: str, default) -> pd.Series:
    """A cfg_ column of the run table, with its default where the records predate it (or a failed row lacks it)."""
    return runs[column].where(runs[column].notna(), default) if column in runs else pd.Series(default, index=runs.index)


def roles(runs: pd.DataFrame) -> pd.Series:
    """Each run row's role: "single" (a 1-worker cell, every other section's), "floor" or "workers" (N workers)."""
    floor = np.where(_flag(runs, "cfg_thread_floor", False).astype(bool), "floor", "single")
    return pd.Series(np.where(_flag(runs, "cfg_replicas", 1).astype(int) > 1, "workers", floor), index=runs.index)


def split(tables: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """(the tables without the floor and N-worker cells, all tables) — the first for every other section."""
    runs = tables["run"]
    if not (extra := set(runs.loc[roles(runs) != "single", "cell_id"]) if "cell_id" in runs else set()):
        return tables, {}
    return {name: (df[~df["cell_id"].isin(extra)] if "cell_id" in df else df) for name, df in tables.items()}, tables


def relative_gap(a: pd.Series, b: pd.Series) -> float:
    """The largest relative difference between two per-step loss series (by step; finite steps of both)."""
    return float((gap := (a - b).abs() / b.abs())[np.isfinite(gap)].max())  # aligned by step


def worker_agreement(workers: pd.DataFrame) -> dict:
    """Whether a cell's workers agree on loss scale and skips and skip each step one overflowed (`disagreement`)."""
    if workers.empty:
        return {"agree": False, "workers": 0, "steps": 0, "disagreement": "no per-worker records"}
    w = workers.sort_values(["step", "worker"])
    n_workers, per_step = w["worker"].nunique(), w.groupby("step")
    failed = {"agree": False, "workers": n_workers, "steps": w["step"].nunique()}
    if len(short := (counts := per_step["worker"].nunique())[counts != n_workers]):
        return {**failed, "disagreement": f"step {int(short.index[0])}: {int(short.iloc[0])} of {n_workers} workers "
                                          "recorded it"}
    differs = per_step[["skipped", "loss_scale"]].nunique().gt(1).stack()  # by step, the skipped flag first
    if differs.any():
        step, column = differs.idxmax()
        values = ", ".join(f"worker {int(r.worker)}: {getattr(r, column)}" for r in w[w["step"] == step].itertuples())
        what = {"loss_scale": "loss scale", "skipped": "skipped flag"}[column]
        return {**failed, "disagreement": f"step {step}: {what} differs ({values})"}
    local = w["local_nonfinite"] if "local_nonfinite" in w else pd.Series(np.nan, index=w.index)
    checked = bool(local.notna().any())
    overflow, skipped = (local.fillna(0) > 0).groupby(w["step"]).any(), per_step["skipped"].all()
    if (missed := overflow & ~skipped).any():  # none where no worker recorded its own overflow
        step = int(missed.idxmax())
        bad = ", ".join(str(int(r.worker)) for r in w[(w["step"] == step) & (local > 0)].itertuples())
        return {**failed, "local_checked": True, "disagreement": f"step {step}: worker {bad}'s own gradients were "
                "non-finite before the all-reduce, yet the update was applied (the overflow decision was not taken "
                "over every worker's gradients)"}
    return {**failed, "agree": True, "local_checked": checked, "overflows": int(overflow.sum()) if checked else None,
            "skipped_steps": int(skipped.sum()), "disagreement": ""}


def _agreement_text(a: dict, framework: str, workers: pd.DataFrame) -> str:
    if not a["agree"]:
        return f"NO: {a['disagreement']}"
    if framework == "keras-jax":  # one compiled program for every device: one scale, one skip decision
        lost = "loss" in workers and bool(workers["loss"].isna().all())
        return (f"yes by construction: JAX runs one compiled step for all {a['workers']} devices, so the loss scale "
                f"and the skip decision are replicated, not each worker's own ({a['steps']} steps, "
                f"{a['skipped_steps']} skipped)" + ("; per-worker losses were not recorded" if lost else ""))
    text = f"yes: {a['workers']} workers × {a['steps']} steps, same scale and skips ({a['skipped_steps']} skipped)"
    if a.get("local_checked"):
        text += (f"; {a['overflows']} step(s) where a worker's own gradients overflowed, each skipped everywhere"
                 if a["overflows"] else "; no worker's own gradients overflowed")
    return text


def _accuracy_vs_fp32_allreduce(cell: pd.Series, n_cells: pd.DataFrame) -> tuple[str, int, dict]:
    """(a cell's accuracy against the fp32 all-reduce cell of its workers, seeds paired, the paired test)."""
    if cell["cfg_allreduce"] == ALLREDUCE_REFERENCE:
        return "reference", 0, {}
    group = n_cells[(n_cells["status"] == "ok") & (n_cells[POOL] == cell[POOL]).all(axis=1)]
    base, mine = (group[group["cfg_allreduce"] == a] for a in (ALLREDUCE_REFERENCE, cell["cfg_allreduce"]))
    if not (pairs := stats.correct_pairs(base, mine)):
        return "no fp32 all-reduce cell to pair with", 0, {}
    res = stats.paired_test(pairs)
    accuracy = 100.0 * float(np.mean([c.mean() for pair in pairs for c in pair]))
    test = {**res, "detectable": stats.detectable(res),
            "near_chance": bool(accuracy - 100.0 * stats.chance_accuracy(str(cell["dataset"])) <= NEAR_CHANCE_PP)}
    return phrases.paired(test, len(pairs)), len(pairs), test


def _speed(cell: pd.Series, one: pd.Series, floor: pd.DataFrame, timed: dict, environment: dict) -> dict:
    """N vs 1 for one seed's pair of cells, with its interval and its ⚠ note (see intro for the rules)."""
    ratio = float(cell["throughput_img_s"]) / float(one["throughput_img_s"])
    speed = stats.speed_interval(*([timed.get(c["cell_id"], np.array([]))] for c in (one, cell)), [np.log(ratio)])
    rerun = float(floor["throughput_img_s"].iloc[0]) / float(one["throughput_img_s"]) if len(floor) else np.nan
    notes = []
    if rerun > STALL_FACTOR:
        notes.append(f"1-worker baseline stalled: its own rerun (floor cell) was {rerun:.1f}× faster")
    # on the 1-worker cell's cores? torch: where N × its threads fit them; Keras: one process's devices, always
    n, per = int(cell["cfg_replicas"]), cell.get("threads_per_worker")
    if ratio / n > 1 and (cell["framework"] != "torch" or pd.notna(per) and int(per) * n <= int(one["cfg_threads"])):
        notes.append(f"more than {n}× faster with {n} workers sharing the 1-worker cell's cores: impossible unless "
                     "the 1-worker baseline ran slow")
    if not verdicts.finite(speed["low"], speed["high"]):
        notes.append(f"no interval: {speed['timed_steps']} timed steps per cell give fewer than two batch means")
    elif noisy := stats.ratio_verdict(ratio, speed["low"], speed["high"], 1, direction=True):
        notes.append(noisy)
    if not notes and (machine := machine_range(environment)):
        notes.append(f"the machine was unsteady over the run ({machine}) and the two cells ran at different times")
    return dict(speed_ratio=ratio, speed_low=speed["low"], speed_high=speed["high"], speed_note="; ".join(notes))


def machine_range(environment: dict) -> str:
    """The calibration checks' range over the run where it exceeds common.UNSTEADY ("" where steady or unchecked)."""
    ms = calibration_checks(environment or {})
    steady = len(ms) < 2 or max(ms) / min(ms) - 1 <= UNSTEADY
    return "" if steady else f"calibration checks ranged {min(ms):,.1f}–{max(ms):,.1f} ms over the run"


def floor_kind(one: pd.Series, floor: pd.Series) -> str:
    """What the floor cell was, from the threads both cells recorded: a plain rerun or another thread count."""
    column = {"torch": "torch_threads", "tf": "tf_intra_op_threads", "keras-jax": "jax_threads"}.get(one["framework"])
    a, b = (phrases.as_written(cell.get(column)) for cell in (one, floor))
    if pd.notna(a) and pd.notna(b):
        return f"a plain rerun (both recorded threads: {a})" if str(a) == str(b) else \
            f"a rerun at another thread count ({b} against {a})"
    return f"a rerun with --threads {int(floor['cfg_threads'])} against {int(one['cfg_threads'])}"


def rows(tables: dict[str, pd.DataFrame], environment: dict | None = None) -> pd.DataFrame:
    """One row per N-worker cell, judged against its 1-worker cell and that cell's floor (machine_range)."""
    runs, steps, workers = tables["run"], tables["steps"], tables.get("workers", pd.DataFrame())
    if runs.empty:
        return pd.DataFrame()
    runs = runs.assign(role=roles(runs), cfg_allreduce=_flag(runs, "cfg_allreduce", ALLREDUCE_REFERENCE),
                       cfg_replicas=_flag(runs, "cfg_replicas", 1).astype(int))
    n_cells = runs[runs["role"] == "workers"]
    loss = {cell: g.set_index("step")["loss"] for cell, g in steps.groupby("cell_id")} if not steps.empty else {}
    timed = ({cell: g.loc[~g["warmup"], "step_time_s"].to_numpy(float) for cell, g in steps.groupby("cell_id")}
             if not steps.empty and "warmup" in steps else {})
    pooled, out, none = {}, [], pd.Series(dtype=float)
    for _, cell in n_cells.sort_values(KEY[:4], key=display_order).iterrows():
        same = (runs[KEY] == cell[KEY]).all(axis=1)
        single, floor = (runs[same & (runs["role"] == role) & (runs["status"] == "ok")] for role in ("single", "floor"))
        row = {**{k: cell[k] for k in KEY}, "workers": int(cell["cfg_replicas"]),
               "allreduce": cell["cfg_allreduce"], "status": cell["status"],
               "error": recorded_error(cell.get("error"), cell.get("stderr_tail"))}
        if cell["status"] != "ok" or single.empty:
            out.append({**row, "error": row["error"] or "no finished 1-worker cell to compare with"})
            continue
        key = tuple(str(cell[k]) for k in [*POOL, "cfg_allreduce"])
        pooled[key] = pooled.get(key) or _accuracy_vs_fp32_allreduce(cell, n_cells)  # once per group of seeds
        one, losses_1 = single.iloc[0], loss.get(single.iloc[0]["cell_id"], none)
        mine = workers[workers["cell_id"] == cell["cell_id"]] if not workers.empty else workers
        agreement = worker_agreement(mine)
        out.append({
            **row, "skipped_1": int(one.get("skipped_steps", 0)), "skipped_n": int(cell.get("skipped_steps", 0)),
            "threads_1": int(one["cfg_threads"]), "threads_per_worker": cell.get("threads_per_worker"),
            "throughput_1": float(one["throughput_img_s"]), "throughput_n": float(cell["throughput_img_s"]),
            **_speed(cell, one, floor, timed, environment or {}),
            "allreduce_dtype": str(cell.get("allreduce_dtype") or "not recorded"),
            "loss_gap": relative_gap(loss.get(cell["cell_id"], none), losses_1),
            "floor_gap": relative_gap(loss.get(None if floor.empty else floor.iloc[0]["cell_id"], none), losses_1),
            "loss_scale": float(losses_1[np.isfinite(losses_1) & (losses_1 != 0)].abs().min()),
            "floor_threads": int(floor.iloc[0]["cfg_threads"]) if not floor.empty else None,
            "floor_kind": floor_kind(one, floor.iloc[0]) if not floor.empty else "",
            "agree": agreement["agree"], "agreement": _agreement_text(agreement, str(cell["framework"]), mine),
            **dict(zip(("accuracy", "accuracy_seeds", "accuracy_test"), pooled[key])),
            "step_s": float(np.median(timed[cell["cell_id"]])) if len(timed.get(cell["cell_id"], [])) else np.nan,
            "engine": str(cell.get("data_parallel") or "")})
    return pd.DataFrame(out)


def recorded_error(error, stderr_tail) -> str:
    """A cell's error as recorded; where that is only the exit code, the last exception line of its stderr."""
    text = str(error or "").strip()
    if text and not re.fullmatch(r"exited with code -?\d+", text):
        return text
    found = [ln.strip() for ln in str(stderr_tail or "").splitlines()
             if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*:", ln.strip())]
    return found[-1] + (f" ({text})" if text else "") if found else text


def at_floor(gap: float, floor: float, loss_level: float = float("nan")) -> bool:
    """Whether `gap` is within AT_FLOOR_FACTOR × `floor` or FLOAT32_ULPS float32 ulps of `loss_level` (least |loss|)."""
    ulps = FLOAT32_ULPS * _REL_ULP * (2.0 ** np.floor(np.log2(loss_level)) / loss_level) \
        if np.isfinite(loss_level) and loss_level > 0 else FLOAT32_ULPS * _REL_ULP
    return bool(gap <= AT_FLOOR_FACTOR * floor or gap <= ulps)


def table(dp: pd.DataFrame) -> pd.DataFrame:
    """The section's table, as a reader sees it."""
    ok = dp[dp["status"] == "ok"] if not dp.empty else dp
    if ok.empty or "speed_ratio" not in ok:
        return pd.DataFrame()
    several = ok[["model", "dataset"]].drop_duplicates().shape[0] > 1
    reference = ok["step_s"].where(ok["allreduce"] == ALLREDUCE_REFERENCE).groupby(
        [ok[k] for k in (*KEY, "workers")]).transform("first")
    return pd.DataFrame({
        **({"Model": ok["model"], "Dataset": ok["dataset"]} if several else {}),
        "Framework": ok["framework"].map(framework_label), "Precision": ok["precision"],
        "Seed": ok["seed"].astype(str), "Workers": ok["workers"].astype(str),
        "All-reduce asked": ok["allreduce"], "All-reduce dtype (read back)": ok["allreduce_dtype"],
        "Images/s, 1 worker": ok["throughput_1"].map("{:,.0f}".format),
        "Images/s, N workers": ok["throughput_n"].map("{:,.0f}".format),
        "N vs 1": [f"{r:.2f}×" + (f" [{lo:.2f}–{hi:.2f}]" if verdicts.finite(lo, hi) else "")
                   + (f" ⚠ {n}" if n else "")
                   for r, lo, hi, n in zip(ok["speed_ratio"], ok["speed_low"], ok["speed_high"], ok["speed_note"])],
        STEP_COLUMN: ["reference" if a == ALLREDUCE_REFERENCE else
                      f"{s / b:.2f}× ({1e3 * s:.1f} against {1e3 * b:.1f} ms)" if b > 0 and np.isfinite(s * b) else
                      "no --allreduce fp32 cell to compare with"
                      for a, s, b in zip(ok["allreduce"], ok["step_s"], reference)],
        # the gap beside its floor, as numbers: the answer's line words the verdict on them
        "Loss gap vs 1 worker (max rel.)": ["n/a" if not np.isfinite(g) else f"{g:.2e} against floor " + (
            f"{f:.2e} ({k or 'a rerun'})" if np.isfinite(f) else "none (no floor measured)")
            for g, f, k in zip(ok["loss_gap"], ok["floor_gap"], ok["floor_kind"])],
        "Workers agree": ok["agreement"],
        # pooled over a group's seeds: shown on the group's first row, the others point to it
        "Accuracy vs fp32 all-reduce": ok["accuracy"].where(
            ~(ok["accuracy_seeds"] > 1) | ~ok[[*KEY[:4], "workers", "allreduce"]].duplicated(),
            "same pooled comparison as the group's first row"),
    })


def sentences(dp: pd.DataFrame, environment: dict, device: str) -> list[str]:
    """What the section says beside its table and the answer's lines: what the workers were and their threads."""
    workers = wording.data_parallel_workers(set(dp.get("framework", ())), device, environment.get("cpu_model", ""))
    out = [workers] if workers else []
    ok = dp[(dp["status"] == "ok") & dp["speed_ratio"].notna()] if "speed_ratio" in dp else dp.iloc[0:0]
    if ok.empty:  # no N-worker cell was judged: the answer's lines say why
        return out
    per_worker = next((int(t) for t in ok.loc[ok["framework"] == "torch", "threads_per_worker"].dropna()), None)
    floors = [int(t) for t in ok["floor_threads"].dropna()]
    return out + [wording.data_parallel_threads(set(ok["framework"]), threads, per_worker, machine_range(environment),
                                                floors) for threads in sorted(set(ok["threads_1"].astype(int)))]


def section(tables: dict[str, pd.DataFrame], environment: dict, device: str) -> dict | None:
    """What the template's Data parallel section shows (None: not a --replicas run); its intro names the engines."""
    if not tables:
        return None
    dp = rows(tables, environment)
    engines = "; ".join(e for e in dp.get("engine", pd.Series(dtype=str)).dropna().unique() if e)
    intro = (f"{short_intro()} Each N-worker cell ran through the framework's own engine ({engines}). Its per-step "
             "losses are compared with the 1-worker run's and judged against the floor: the same difference between "
             "the 1-worker run and its floor cell (a rerun of it; the Loss gap column says, from the records, whether "
             f"at another thread count or a plain rerun); a gap within {AT_FLOOR_FACTOR:g}× the floor or "
             f"{FLOAT32_ULPS} float32 ulps of the loss is at the floor, no evidence either way. Where each worker "
             "records its own loss scale and skipped flag (torch, TensorFlow) they must be the same on every worker; "
             "JAX runs one compiled step for all devices, so they agree by construction. The all-reduce dtype is what "
             "the child read back from what ran (torch: the profiler's record of the backend's all_reduce; TensorFlow: "
             "the gradients handed to the optimizer's all-reduce; JAX: the compiled step's HLO), and a "
             "reduced-precision all-reduce is paired image by image with the fp32 all-reduce of the same workers, "
             "pooled over seeds, as the Accuracy section pairs mixed precision with fp32. Each row is one seed's pair: "
             "its N vs 1 is the two cells' recorded throughputs, with a 95% interval from batch means of their timed "
             "steps where each cell has enough of them for two batch means (else the row says no interval, and why).")
    return {"rows": dp, "table": table(dp), "sentences": sentences(dp, environment, device), "intro": intro}


def short_intro() -> str:
    """What a row is and what ⚠ on N vs 1 means: the section's and summary.md's table both open with it."""
    return ("Each N-worker cell trains the same experiment as its 1-worker cell of the same seed: the same fixed "
            "global batch from the same seeded order, split across the workers (each takes its contiguous 1/N). N vs 1 "
            "is marked ⚠ where the 1-worker baseline stalled (its own rerun, the floor cell, ran more than "
            f"{STALL_FACTOR:g}× faster), where N workers ran more than N× faster though they share the 1-worker cell's "
            "cores, where there is no interval or a noisy one, or where the machine was unsteady over the run.")


def verdict_rows(dp: pd.DataFrame | None) -> list[dict]:
    """The Data parallel answer's verdict rows (verdicts.DATA_PARALLEL), one per N-worker cell of `dp` (rows())."""
    if dp is None or dp.empty:
        return []
    out = []
    rank = dp["allreduce"].map(lambda a: ALLREDUCES.index(a) if a in ALLREDUCES else len(ALLREDUCES))  # fp32 first
    for r in dp.assign(_a=rank).sort_values([*KEY[:4], "_a", "seed"], kind="stable").to_dict("records"):
        gap, floor = float(r.get("loss_gap", np.nan)), float(r.get("floor_gap", np.nan))
        judged = r["status"] == "ok" and np.isfinite(gap)
        facts = SimpleNamespace(status=r["status"], ok=judged, agree=not judged or bool(r.get("agree", True)),
                                estimate=gap, margin=floor, at_floor=judged and np.isfinite(floor)
                                and at_floor(gap, floor, r.get("loss_scale", np.nan)))
        key = {**{k: r[k] for k in KEY[:4]}, "step_loop": "", "batch_size": np.nan}
        said = {k: r.get(k) for k in ("seed", "workers", "allreduce", "allreduce_dtype", "floor_threads", "skipped_n",
                                      "skipped_1", "error", "accuracy_test", "accuracy_seeds")}
        error = re.sub(r"^unavailable(?::|\s*—)?", "", str(r.get("error") or "").strip()).strip()
        said.update(allreduce_dtype=r.get("allreduce_dtype") or "",  # the error without a dump file the run lacks
                    error=re.sub(r",?\s*XLA HLO after optimizations: \S+\.txt", "", error),
                    accuracy_test={k: v for k, v in (r.get("accuracy_test") or {}).items() if k in TEST_KEYS})
        out.append(verdicts.row(key, "data_parallel", facts, said))
    return out
