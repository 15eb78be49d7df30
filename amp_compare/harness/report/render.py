"""Render a compare run's folder into index.html, summary.md, figures/ and data/, from what the run wrote
only (manifest.json and the cells' records), partial results included: missing cells are named."""

from __future__ import annotations

import contextlib
import html
import itertools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract import records
from amp_compare.contract.atomic import atomic_write_text
from amp_compare.contract.config import display_order, framework_label, is_keras
from amp_compare.contract.env import ARITHMETIC_FLAGS
from amp_compare.contract.mapping import DIFFERENCES
from amp_compare.harness.report import answer as answer_block
from amp_compare.harness.report import dataparallel, glossary, phrases, scaling, speed, verdicts, wording
from amp_compare.harness.report import fp8 as fp8_report
from amp_compare.harness.report import numerics as nr
from amp_compare.harness.report import settings_check as sc
from amp_compare.harness.report import tables as tb
from amp_compare.harness.report.findings import finding_parts
from amp_compare.harness.report.hardware import ceiling_clauses, with_run_ceiling
from amp_compare.harness.report.stats import whole_epochs

JINJA = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"), autoescape=True,
                           undefined=jinja2.StrictUndefined)
LEFT = " class='l'"  # the first four columns of a table are left-aligned
SECTIONS = [("summary", "Summary"), ("speed", "Speed"), ("memory", "Memory"), ("accuracy", "Accuracy"),
            ("numerics", "Numerics"), ("data_parallel", "Data parallel"), ("differences", "Framework differences"),
            ("cells", "Cells"), ("environment", "Environment"), ("glossary", "Glossary"), ("reproduce", "Reproduce"),
            ("appendix", "Appendix")]  # the appendix: the package versions


def load_manifest(run_dir: Path) -> dict:
    if not (path := Path(run_dir) / "manifest.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a compare run folder (no manifest.json)")
    return json.loads(path.read_text())


def table_html(df: pd.DataFrame, highlight: str | None = None, grouped: bool = False) -> str:
    """An HTML table, `highlight` rows marked; `grouped`: columns named "group: name" share a header cell."""
    cols, top, sub, span = [c for c in df.columns if c != highlight], [], [], " rowspan='2'" * grouped
    for group, named in itertools.groupby(enumerate(cols), key=lambda ic: grouped and str(ic[1]).rpartition(": ")[0]):
        if not group:  # columns of their own
            top += [f"<th{span}{LEFT * (i < 4)}>{html.escape(str(c))}</th>" for i, c in named]
            continue
        top.append(f"<th colspan='{len(named := list(named))}'>{html.escape(group)}</th>")
        sub += [f"<th>{html.escape(str(c).rpartition(': ')[2])}</th>" for _, c in named]
    rows = "".join("<tr{}>{}</tr>".format(" class='differs'" if highlight and rec.get(highlight) else "", "".join(
        f"<td{LEFT * (i < 4)}>{html.escape(str(rec[c]))}</td>" for i, c in enumerate(cols)))
                   for rec in df.to_dict("records"))
    return "<table><tr>{}</tr>{}{}</table>".format("".join(top), f"<tr>{''.join(sub)}</tr>" * grouped, rows)


def _html_or_none(df: pd.DataFrame | None, grouped: bool = False) -> str | None:
    return table_html(df, grouped=grouped) if df is not None and not df.empty else None


TIMING_MS = {"p50 step (ms)": "median_step_s", "p90 (ms)": "p90_step_s", "p99 (ms)": "p99_step_s"}
TIMING_IMAGES = {"Images/s (wall, headline)": "throughput_img_s", "Images/s from p50": "median_step_throughput_img_s",
                 "Images/s from epoch time": "epoch_throughput_img_s"}


def _timing_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Step-time percentiles and both throughputs, medians over seeds (how many: the summary table's Runs)."""
    ok = tb.ok_runs(runs)
    if ok.empty or "p99_step_s" not in ok:
        return pd.DataFrame()
    loops = [c for c in ("cfg_step", "cfg_batch_size") if c in ok and ok[c].nunique() > 1]  # a sweep
    group = ["machine"] * ("machine" in ok and ok["machine"].nunique() > 1) + ["model", "dataset", "framework",
                                                                               *loops, "precision"]
    ok = ok.assign(median_step_throughput_img_s=ok.get(  # older records: throughput was the p50 figure
        "median_step_throughput_img_s", ok["throughput_img_s"]))
    cols = [*TIMING_MS.values(), *TIMING_IMAGES.values(), "first_step_overhead_s"]
    dispatch = "first_step_dispatch_s" in ok and ok["first_step_dispatch_s"].notna().any()  # Keras, device mode
    t = ok.groupby(group, sort=False)[cols + ["first_step_dispatch_s"] * dispatch].median()
    t = t.reset_index().sort_values(["model", "dataset", "framework", "precision"], key=display_order)
    return pd.DataFrame({  # one row per model and dataset: never a median over two models' cells
        **({"Machine": t["machine"]} if "machine" in group else {}),
        "Model": t["model"], "Dataset": t["dataset"], "Framework": t["framework"].map(framework_label),
        **{{"cfg_step": "Step", "cfg_batch_size": "Batch"}[c]: t[c].astype(str) for c in loops},
        "Precision": t["precision"],
        **{name: (t[c] * 1e3).map("{:.2f}".format) for name, c in TIMING_MS.items()},
        **{name: t[c].map("{:,.0f}".format) for name, c in TIMING_IMAGES.items()},
        "Epoch-time figure vs p50 figure": [speed.relation(e, m) for e, m in
                                           zip(t["epoch_throughput_img_s"], t["median_step_throughput_img_s"])],
        "First step's extra time (ms)": t["first_step_overhead_s"].map(tb.milliseconds),
        **({"First step's dispatch, device mode (ms)": t["first_step_dispatch_s"].map(tb.milliseconds)}
           if dispatch else {})})


def _identity(df: pd.DataFrame) -> dict:
    return {**{k.title(): df[k] for k in ("model", "dataset") if k in df},
            "Framework": df["framework"].map(framework_label), "Precision": df["precision"]}


def _maxbatch_table(maxbatch: pd.DataFrame) -> pd.DataFrame:
    """One row per --find-max-batch search: the largest batch that fit, its memory, the cap, how it ended."""
    if maxbatch.empty:
        return maxbatch
    keys = [k for k in ("model", "dataset") if k in maxbatch] + ["framework", "precision"]
    first = maxbatch.groupby(keys, sort=False).first().reset_index()
    peak = maxbatch[maxbatch["ok"]].groupby(keys)["peak_bytes"].max()
    return pd.DataFrame({
        **_identity(first), "Largest batch that fit": first["max_ok"].astype(str),
        "Smallest that did not": first["first_failed"].map(lambda v: "none up to the limit" if pd.isna(v) else str(v)),
        "Peak memory at the largest (MiB)": [f"{peak.get(tuple(k), float('nan')) / tb.MIB:,.0f}"
                                             for k in first[keys].itertuples(index=False)],
        "Cap": first["cap_bytes"].map(lambda v: "device memory" if pd.isna(v) else f"{v / 2**30:.2f} GiB"),
        "Probes": maxbatch.groupby(keys, sort=False).size().to_numpy().astype(str),
        "Search": first.get("stopped_early", pd.Series("", index=first.index)).fillna("").replace("", "converged")})


def _scale_counts_table(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per framework x loss-scaled mode: steps, skips, growth events (or "could not grow"), first and final scale."""
    if (counts := nr.scale_counts(steps).loc[lambda c: c["precision"].isin(precisions.scaled_names())]).empty:
        return counts

    def growth(r) -> str:
        if r.precision not in precisions.names(loss_scaling="dynamic"):
            return "n/a (fixed scale)"
        facts = nr.growth_facts(runs[(runs["framework"] == r.framework) & (runs["precision"] == r.precision)
                                     & (runs["model"] == getattr(r, "model", runs["model"]))], steps)
        return ("could not grow (--growth-interval ≥ clean steps in a row)" if facts and facts[1] <= facts[0]
                else f"{r.growth_events:.0f}")

    return pd.DataFrame({**_identity(counts), "Steps": counts["steps"].map("{:.0f}".format),
                         "Skipped": ["n/a (cannot skip)" if scaling.cannot_skip(r.framework, r.precision) else
                                     f"{r.skipped:.0f}" for r in counts.itertuples()],
                         "Growth events": [growth(r) for r in counts.itertuples()],
                         "First scale": counts["first_scale"].map("{:g}".format),
                         "Final scale": counts["final_scale"].map("{:g}".format)})


def _underflow_table(underflow: pd.DataFrame) -> pd.DataFrame:
    s = nr.underflow_summary(underflow)
    if s.empty:
        return s
    return pd.DataFrame({**_identity(s), "When": [f"{w} (step {n})" if n >= 0 else w
                                                  for w, n in zip(s["when"], s["at_step"])],
                         "Gradient elements": s["elements"].map(lambda n: f"{int(n):,}"),
                         "Loss scale": s["loss_scale"].map("{:g}".format),
                         "float32 reference: exactly zero": _share(s, "zero_fraction", 2),
                         "float32 reference: would flush in fp16, no scaling": _share(s, "flush_unscaled"),
                         "float32 reference: would flush at that scale": _share(s, "flush_scaled"),
                         "mixed backward: exactly zero (unscaled loss)": _share(s, "zero_fraction_mixed", 2),
                         "mixed backward: lost, no scaling": _share(s, "lost_unscaled"),
                         "mixed backward: lost at that scale": _share(s, "lost_scaled"),
                         "mixed backward: cancelled at that scale only": _share(s, "cancelled_scaled")})


def _share(s: pd.DataFrame, column: str, digits: int = 3) -> pd.Series:
    """A share as a percentage, with the part in attention key biases (zero exact gradient), if any, called residue."""
    residue = s.get(f"residue_{column}", pd.Series(0.0, index=s.index)).fillna(0.0)
    return pd.Series(["n/a" if pd.isna(v) else f"{v:.{digits}%}" + (
        "" if r <= 0 else " (all attention key-bias residue)" if np.isclose(r, v, rtol=1e-9, atol=0)
        else f" (of it {r:.3%} attention key-bias residue)") for v, r in zip(s[column], residue)], index=s.index)


def _nonfinite_table(runs: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    f = nr.nonfinite_findings(runs, steps)
    return pd.DataFrame({**_identity(f), "Seed": f["seed"], "Step (counting from 0)": f["nonfinite_step"],
                         "Where": f["nonfinite_where"], "Layer": f["nonfinite_layer"], "Value": f["nonfinite_value"],
                         "That step's loss": f["nonfinite_step_loss"].map(lambda v: "not recorded" if pd.isna(v)
                                                                          else f"{v:.4g}")})


def _accuracy_table(acc: pd.DataFrame, verdict_table: pd.DataFrame) -> pd.DataFrame:
    """Each mixed cell's paired comparison with fp32 and every cell's time to target, with its verdict."""
    if acc.empty:
        return acc

    def key(r) -> tuple:
        size = float(r.batch_size) if pd.notna(getattr(r, "batch_size", np.nan)) else -1.0
        return r.model, r.dataset, r.framework, r.precision, str(getattr(r, "step_loop", "")), size

    times = {key(v): v for v in verdict_table[verdict_table["metric"] == "time_to_target"].itertuples()}
    rows = []
    for r in acc.itertuples():
        cut = phrases.REASON["budget_cut"] if (getattr(r, "budget_cut", 0) or 0) > 0 else ""
        timed = np.isfinite(r.target) and not r.too_short and not cut
        rows.append({
            **({"Machine": r.machine} if "machine" in acc and acc["machine"].nunique() > 1 else {}),
            "Model": r.model, "Dataset": r.dataset, "Framework": framework_label(r.framework), "Precision": r.precision,
            "Accuracy vs fp32 (pp)": phrases.accuracy(r) if precisions.is_mixed(r.precision) else "",
            "Test": phrases.test(r.method, r.seeds) if isinstance(r.method, str) and not r.too_short else "",
            "Comparable": "no: " + (r.too_short or cut) if r.too_short or cut else "yes",
            "Target": f"{r.target * 100:.1f}%" if timed else "",
            "Time to target (s)": ("" if not timed else "not reached" if not np.isfinite(r.time_to_target_s)
                                   else f"{r.time_to_target_s:.1f}"),
            "vs fp32's time": phrases.cell(times[key(r)]) if timed and key(r) in times else "",
            "Seeds reaching it": f"{r.reached_seeds:.0f} of {r.timed_seeds:.0f}" if timed else "",
        })
    return pd.DataFrame(rows)


def table_markdown(df: pd.DataFrame) -> str:
    return "\n".join(["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns),
                      *("| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False))])


def _cells(runs: pd.DataFrame, epochs: pd.DataFrame, steps: pd.DataFrame) -> list[dict]:
    return [{"cell_id": r["cell_id"], "status": r["status"], "error": r.get("error") or "",
             "stderr_tail": r.get("stderr_tail") or "", "amp_api": fp8_report.api_text(r) or "not recorded",
             "no_stderr": "its own divergence watch stopped it and its child ended normally, so no stderr was kept "
             "(the step records and the NaN/Inf locator say what happened)" if r["status"] == "diverged"
             else "no stderr in its records",
             "epochs": int((epochs["cell_id"] == r["cell_id"]).sum()) if not epochs.empty else 0,
             "steps": int((steps["cell_id"] == r["cell_id"]).sum()) if not steps.empty else 0,
             "wall": f"{wall:.1f}" if isinstance(wall := r.get("child_wall_s"), float) and pd.notna(wall) else ""}
            for r in runs.sort_values("cell_id").to_dict("records")]


def framework_differences(runs: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[dict]:
    """Each item of contract.mapping.DIFFERENCES the run's models have: both frameworks' defaults and used values."""
    ok = tb.ok_runs(runs)
    recorded = runs[runs["settings_used"].fillna("").astype(str) != ""] if "settings_used" in runs else ok
    defaults = {"keras" if is_keras(r["framework"]) else r["framework"]: said for r in reversed(ok.to_dict("records"))
                if (said := phrases.evidence(r.get("framework_defaults")))}  # per engine: its first cell's
    used: dict[str, dict] = {}
    for row in recorded.to_dict("records"):
        mine = used.setdefault("keras" if is_keras(row["framework"]) else row["framework"], {})
        settings = phrases.evidence(row.get("settings_used"))
        if "attention" in settings:  # a vit cell: its attention items (the core is the --attention it ran)
            settings = {"mha_bias": "used (setting not recorded)", **settings,
                        "attention_core": f"--attention {settings['attention']}"}
        for key, value in settings.items():
            mine.setdefault(key, {}).setdefault(row.get("model", ""), set()).add(sc.value_text(value))
        if row.get("init_source"):  # " (this cell)" marks the cell that wrote the shared file: the same file
            mine.setdefault("initial_weights", {}).setdefault("", set()).add(
                str(row["init_source"]).removesuffix(" (this cell)"))
    measured = {"adam_formula": sc.adam_gap_text(ok.to_dict("records")),  # defaults mode: the two Adams
                "attention_core": nr.cross_framework_loss_gap(steps) if steps is not None else ""}
    has = [set(runs[c].dropna().astype(str)) if c in runs else None for c in ("model", "cfg_optimizer", "precision")]
    return [{"item": d.item, "why": d.why, "measured": measured.get(d.key, ""),
             **{f"{fw}_default": sc.value_text(defaults.get(fw, {}).get(d.key, "n/a")) for fw in ("torch", "keras")},
             **{f"{fw}_used": _used_text(used.get(fw, {}).get(d.key, {})) for fw in ("torch", "keras")}}
            for d in DIFFERENCES if sc.differences_apply(d.key, *has)]


def _used_text(by_model: dict[str, set]) -> str:
    """The values a framework's cells used, per model where the models differ ("simple_cnn 0; vit 0.05")."""
    if len({frozenset(vs) for vs in by_model.values()}) <= 1:
        return "; ".join(sorted({v for vs in by_model.values() for v in vs})) or "not used"
    return "; ".join(f"{model} {', '.join(sorted(vs))}" for model, vs in sorted(by_model.items()))


@dataclass
class Rendered:
    """What rendering a run wrote (index) and computed on the way, for the terminal summary to reuse."""

    index: Path
    table: pd.DataFrame  # tables.full_table
    findings: list[str]
    data_parallel: pd.DataFrame | None = None  # dataparallel.rows: the Data parallel section's rows
    answer: str = ""  # the answer the page opens with, as terminal text (answer.render)
    verdicts: pd.DataFrame | None = None  # verdicts.build: what the answer and the terminal's tables word
    conditions: tuple[str, str] = ("", "")  # how the training cells and the speed trials ran (speed.conditions)


def render(run_dir: Path, figures: bool = True) -> Rendered:
    """Render one compare run's folder from its manifest and cell records (figures=False: no figures drawn)."""
    tables = records.read_run(run_dir := Path(run_dir))
    searches = []
    for path in sorted((run_dir / "maxbatch").glob("*.parquet")):
        try:
            searches.append(pd.read_parquet(path))
        except Exception as exc:  # noqa: BLE001 — a broken search file must not stop the report
            print(f"skipping unreadable max-batch search {path}: {exc}", file=sys.stderr)
    if searches:
        tables["maxbatch"] = pd.concat(searches, ignore_index=True)
    return _render(run_dir, load_manifest(run_dir), tb.by_gpu_model(tables), draw=figures)


def render_combined(run_dirs: list[Path], out_dir: Path, figures: bool = True) -> Path:
    """One report over several compare runs: every table gains a `machine` column, every figure a column per machine."""
    if len({Path(d).resolve() for d in run_dirs}) != len(run_dirs):
        raise ValueError("the same run folder was given twice")
    manifests, parts, environment, hardware = [load_manifest(d) for d in run_dirs], {}, {}, set()
    for run_dir, manifest in zip(run_dirs, manifests):
        tables = records.read_run(run_dir)
        gpus = sorted(set(tables["run"].get("device_name", pd.Series(dtype=str)).dropna()) - {"", "cpu"})
        hardware.add(where := ", ".join(gpus) or manifest["environment"].get("cpu_model", "CPU"))  # accelerator or CPU
        label = f"{where} · {Path(run_dir).name}"  # how the run is named: its machine and its folder
        for name, df in tables.items():
            if "cell_id" in df:  # the speed trials' blocks have no cell
                df = df.assign(cell_id=Path(run_dir).name + "/" + df["cell_id"].astype(str))
            parts.setdefault(name, []).append(df.assign(machine=label))
        environment.update({f"{label}: {k}": v for k, v in manifest["environment"].items()})
    first, envs = manifests[0], [m["environment"] for m in manifests]
    environment.update({k: envs[0][k] for k in ("cpu_amp_flags", "cpu_bf16_hardware", "cpu_fp16_hardware",
                        "cpu_isa_limits") if k in envs[0] and len({str(e.get(k)) for e in envs}) == 1},  # runs agree
                       timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
                       cpu_model=" / ".join(dict.fromkeys(e.get("cpu_model", "?") for e in envs)))
    matrix = {k: list(dict.fromkeys(v for m in manifests for v in m["matrix"].get(k, []))) for k in first["matrix"]}
    seeds, devices = sorted({s for m in manifests for s in m["matrix"]["seeds"]}), {m["device"] for m in manifests}
    device = "several machines" if len(hardware) > 1 else devices.pop() if len(devices) == 1 else "several devices"
    cells = [f"{Path(d).name}/{c}" for d, m in zip(run_dirs, manifests) for c in m["cells"]]
    manifest = {"run_id": out_dir.name, "device": device, "cells": cells, "environment": environment,
                "matrix": {**matrix, "seeds": seeds}, "defaults": first["defaults"],
                "notes": [f"Combined report of {len(run_dirs)} runs: {', '.join(str(d) for d in run_dirs)}."],
                "command": "python -m amp_compare report " + " ".join(str(d) for d in run_dirs)
                + "\n# the runs: " + "\n# ".join(m["command"] for m in manifests),
                "sources": [str(d) for d in run_dirs]}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2, default=str))
    return _render(out_dir, manifest, {name: pd.concat(dfs, ignore_index=True) for name, dfs in parts.items()},
                   draw=figures).index


HOST_LABELS = {f"cpu_{short}_hardware": f"cpu_{short}_hardware ({' or '.join(flags)} in the CPU's flags; whether a "
               "framework's kernels use them shows in its speed)"
               for short, flags in (("bf16", ARITHMETIC_FLAGS["bfloat16"]), ("fp16", ARITHMETIC_FLAGS["float16"]))}
ENV_COLUMNS = {  # the run table's per-framework columns the Environment section shows, and their labels
    "framework_version": "version", "keras_version": "Keras version", "keras_backend": "Keras backend",
    "device_name": "device", "compute_capability": "compute capability",
    "torch_cuda_version": "CUDA version PyTorch was built with (torch.version.cuda; build info)",
    "torch_cudnn_version": "cuDNN version PyTorch loads (torch.backends.cudnn.version())",
    "tf_cuda_version": "CUDA version TensorFlow was built with (tf.sysconfig.get_build_info(); build info)",
    "tf_cudnn_version": "cuDNN version TensorFlow was built with (tf.sysconfig.get_build_info(); build info)",
    "torch_threads": "intra-op threads (training cells)", "torch_interop_threads": "inter-op threads (training cells)",
    "tf_intra_op_threads": "intra-op threads (training cells)",
    "tf_inter_op_threads": "inter-op threads (training cells)", "jax_threads": "threads (training cells)",
    "tf32": "TF32", "compiled": "compilation", "step_values": "per-step values", "amp_api": "AMP API per precision",
    "memory_kind": "memory measured as", "dataset_source": "dataset"}


def environment_rows(environment: dict, runs: pd.DataFrame, trials: pd.DataFrame | None = None
                     ) -> list[tuple[str, str | list[str]]]:
    """The Environment table: the host, each framework's speed trials' threads, then what its cells reported."""
    rows: list[tuple[str, str | list[str]]] = [(HOST_LABELS.get(k, k), str(phrases.as_written(environment[k])))
                                               for k in sorted(environment)]
    if trials is not None and {"framework", "threads"} <= set(trials):
        rows += [(f"{framework_label(fw)}: threads (speed trials)", ", ".join(dict.fromkeys(str(phrases.as_written(v))
                  for v in part["threads"].dropna()))) for fw, part in trials.groupby("framework", sort=False)]
    ordered = runs.sort_values(["framework", "precision"], key=display_order)
    if "amp_api" in ordered and "fp8_settings" in ordered:  # fp8: what ran is in its fp8_settings
        ordered = ordered.assign(amp_api=[fp8_report.api_text(r) for r in ordered.to_dict("records")])
    for col, label in ((c, label) for c, label in ENV_COLUMNS.items() if c in ordered):
        for fw, part in ordered.groupby("framework", sort=False):
            kept = part[part[col].notna()]  # amp_api: per precision, a list
            if values := list(dict.fromkeys(f"{p}: " * (col == "amp_api") + str(phrases.as_written(v))
                                            for p, v in zip(kept["precision"], kept[col]) if str(v))):
                cpu = set(part.get("device_name", pd.Series(dtype=str)).dropna().astype(str)) <= {"cpu", ""}
                rows.append((f"{framework_label(fw)}: {label}", values if col == "amp_api" else ", ".join(values) + (
                    " (describes the build only: this run used no GPU, so no CUDA or cuDNN was in use)"
                    if col.endswith(("_cuda_version", "_cudnn_version")) and cpu else "")))
    return rows


def _draw(run_dir: Path, tables: dict[str, pd.DataFrame], summary: dict, device: str) -> Callable[[], list]:
    """Every figure task of the page, started now (_in_parallel); the figures are those it gives, in page order."""
    from amp_compare.harness.report import figures as fg

    runs, underflow, headroom, out = tables["run"], tables["underflow"], tables["headroom"], run_dir / "figures"
    return _in_parallel([t for t in [
        (fg.make_speed_verdict_figure, (summary["verdicts"], out)),
        (fg.make_figures, (runs, tables["steps"], out, device, summary["full"])),
        (fg.make_underflow_figure, (underflow, out)) if not underflow.empty else None,
        (fg.make_headroom_figure, (headroom, runs, out)) if not headroom.empty else None,  # the vit
        (fg.make_gradient_histogram_figure, (underflow, out)) if not underflow.empty else None,
        (fg.make_time_to_accuracy_figure, (runs, tables["epochs"], summary["accuracy"], out, tables["trials"]))] if t])


def _themed(fn, args):
    """One figure task in a drawing process: the page's seaborn theme first (figures.make_figures sets it too)."""
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return fn(*args)


def _in_parallel(tasks: list) -> Callable[[], list]:
    """Each (function, args) task started on up to two forked processes; results(cancel=False) gives them in order."""
    def here(cancel: bool = False) -> list:
        return [] if cancel else [_themed(fn, args) for fn, args in tasks]

    # a process that loaded a framework may hold thread pools a fork cannot copy: it draws in turn
    if len(tasks) < 2 or len(os.sched_getaffinity(0)) < 2 or {"torch", "tensorflow", "jax"} & sys.modules.keys():
        return here
    import concurrent.futures
    import multiprocessing

    pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
    futures = [pool.submit(_themed, fn, args) for fn, args in tasks]

    def results(cancel: bool = False) -> list:
        try:
            return [] if cancel else [f.result() for f in futures]
        except concurrent.futures.process.BrokenProcessPool:  # a drawing process died: draw them here instead
            return here()
        finally:
            pool.shutdown(cancel_futures=True)

    return results


def _summary_context(run_dir: Path, manifest: dict, tables: dict[str, pd.DataFrame], said: list[dict],
                     evidence: dict) -> dict:
    """The answer, the Summary and Speed sections; `said`: verdict rows of cells these tables leave out."""
    runs, epochs, steps = tables["run"], tables["epochs"], tables["steps"]
    dirs = [Path(d) for d in manifest.get("sources", [])] or [run_dir]  # a combined report: its sources' cells
    logs = dict.fromkeys(line for d in dirs for line in speed.framework_log_lines(d, runs))  # about kernels
    evidence = {**evidence, "framework_logs": list(logs)}
    full = tb.full_table(runs, epochs, evidence, accuracy := tb.accuracy_statistics(runs, epochs))
    main_table, hardware, loop_text = tb.split_summary(summary := tb.formatted_summary(full))
    facts = wording.run_facts(manifest, runs, steps)
    seeds_text = tb.seed_counts_text(runs) or tb.seed_list_text(manifest["matrix"]["seeds"])
    verdict_table = verdicts.build(full, runs, tables.get("trials"))
    said = [*scaling.rows(verdict_table, runs, steps, tables.get("underflow")),  # the experiments' rows after its own
            *nr.naive_rows(verdict_table, runs, tables.get("headroom")),
            *fp8_report.verdict_rows(accuracy, runs, tables.get("fp8_layers")), *said]
    if said:
        verdict_table = pd.concat([verdict_table, pd.DataFrame(said, columns=verdicts.COLUMNS)], ignore_index=True)
    records.validate_table("verdicts", verdict_table)
    launcher = manifest.get("launcher", {})
    sentences = finding_parts(runs, steps, evidence, epochs, table=full) + speed.trial_and_cells(
        verdict_table, full, runs, tables["phases"])
    first = answer_block.preface(manifest["environment"], manifest["device"], verdict_table,
                                 bool(manifest["defaults"].get("profile")))
    per_model = [(f"{model} on {dataset}", phrases.table(part))
                 for (model, dataset), part in verdict_table.groupby(["model", "dataset"], sort=False)]
    cells = [t] if (t := manifest.get("defaults", {}).get("threads")) else []  # the trials': the launcher's
    conditions = speed.conditions(launcher, cells, [t] if (t := launcher.get("trial_threads")) else cells)
    return {"full": full, "verdicts": verdict_table, "accuracy": accuracy, "summary": summary, "sentences": sentences,
            "facts": facts, "intro": wording.summary_intro(facts, seeds_text + tb.fewer_seeds_note(runs), loop_text),
            "summary_html": table_html(main_table), "legend": tb.legend(full),
            "hardware_table": _html_or_none(hardware) if any(c in summary for c in tb.HARDWARE_COLUMNS) else None,
            "speed_words": {"timing": speed.timing_paragraph(manifest["defaults"]["warmup_steps"], conditions[0]),
                            "hardware": speed.hardware_paragraph(full, ceiling_clauses(tb.ok_runs(runs)))},
            "verdict_tables": [(title, table_html(t)) for title, t in per_model], "verdict_tables_md": per_model,
            "verdict_columns": phrases.columns_note(verdict_table, conditions) if per_model else "",
            "conditions": conditions,
            **{f"answer_{fmt}": answer_block.render(verdict_table, fmt, first) for fmt in ("html", "markdown", "text")}}


def _page_rest(run_dir: Path, manifest: dict, tables: dict[str, pd.DataFrame], summary: dict, draw: bool) -> dict:
    """The page's context but its figures, which are drawn meanwhile (_render)."""
    runs, steps, acc_stats = tables["run"], tables["steps"], summary["accuracy"]
    comparison, init = manifest["defaults"].get("comparison", "aligned"), manifest["defaults"].get("init", "shared")
    notes = manifest.get("notes", []) + ([] if draw else [
        "Figures were not drawn for this run (--no-figures): the tables below are complete; "
        f"python -m amp_compare report {run_dir} draws them."]) + sc.ignored_settings(runs.to_dict("records")) \
        + speed.budget_note(runs, manifest.get("cell_budget", {}).get("limit_s", float("nan")))
    checked = sc.side_by_side(tb.ok_runs(runs).to_dict("records"))
    underflow, dtypes = tables.get("underflow", pd.DataFrame()), tables.get("dtypes", pd.DataFrame())
    side = nr.dtype_side_by_side(dtypes)
    dtype_facts = nr.op_dtype_facts(dtypes, manifest["device"], side)
    underflow_table = _html_or_none(_underflow_table(underflow), grouped=True)
    return {
        **summary, "loss_scaling_intro": wording.loss_scaling_intro(summary["facts"]),
        "numerics_intro": wording.numerics_intro(summary["facts"]), "underflow_table": underflow_table,
        "scale_counts": _html_or_none(_scale_counts_table(runs, steps)), "underflow_methods": nr.UNDERFLOW_METHODS,
        "dtype_tables": {p: table_html(t.drop(columns="attributed", errors="ignore"), highlight="differs")
                         for p, t in side.items()},
        "vit_dtype_tables": {p: table_html(t, highlight="differs") for p, t in nr.vit_dtype_table(dtypes).items()},
        "nonfinite_table": _html_or_none(_nonfinite_table(runs, steps)),
        "said": nr.numerics_said(runs, underflow, steps, acc_stats), "comparison": comparison,
        "words": nr.section_words(summary["facts"], dtype_facts), "notes": notes, "manifest": manifest,
        "device_names": ", ".join(sorted(set(runs.get("device_name", pd.Series(dtype=str)).dropna()) - {""})) or "?",
        "accuracy_table": _html_or_none(_accuracy_table(acc_stats, summary["verdicts"])),
        "accuracy_words": tb.section_paragraph(acc_stats),
        "env_rows": environment_rows(manifest["environment"], runs, tables.get("trials")),  # packages: the appendix
        "reproduce_note": wording.reproduce_note(manifest["environment"]),
        "differences": framework_differences(runs, steps),
        "keras_split": {k: (_html_or_none(v) if isinstance(v, pd.DataFrame) else v)
                        for k, v in sc.keras_backend_split(runs).items()},
        "timing_table": _html_or_none(_timing_table(runs)),
        "trials_table": _html_or_none(speed.trials_table(tables.get("trials"))),
        "maxbatch_table": _html_or_none(_maxbatch_table(tables.get("maxbatch", pd.DataFrame()))),
        "differences_words": sc.differences_paragraph(comparison, init), "keras_split_intro": sc.INTRO,
        "settings_check": checked, "settings_words": sc.settings_paragraph(checked["cells"], comparison),
        "glossary_entries": glossary.entries(summary["facts"], dtype_facts, underflow_table is not None)
        + [glossary.Entry(f"gl-verdict-{i}", *entry) for i, entry in enumerate(phrases.glossary(summary["verdicts"]))]}


def _render(run_dir: Path, manifest: dict, tables: dict[str, pd.DataFrame], draw: bool = True) -> Rendered:
    # data/run: each cell's MFU against the run's one ceiling per device and dtype, as the report prints it
    records.export_tables(run_dir, {**tables, "run": with_run_ceiling(records.migrate(tables["run"]))})
    held = [name for name, df in tables.items() if not df.empty] + ["verdicts"]  # data/'s
    single, every = dataparallel.split(tables)  # the Data parallel section's cells (none without replicas): every
    evidence = {**manifest["environment"], "calibrations": manifest.get("calibrations", []),
                "device": manifest["device"]}  # what the statistics judge the machine from
    parallel = dataparallel.section(every, evidence, manifest["device"])  # DATA PARALLEL (None: none)
    said = dataparallel.verdict_rows(parallel and parallel["rows"])
    counted = every or single  # the page's counts are over every cell
    status = dict(zip(counted["run"]["cell_id"], counted["run"]["status"])) if not counted["run"].empty else {}
    summary = _summary_context(run_dir, manifest, single, said, evidence)
    figures = _draw(run_dir, single, summary, manifest["device"]) if draw else lambda cancel=False: []
    try:
        rest = _page_rest(run_dir, manifest, single, summary, draw)
    except BaseException:
        figures(cancel=True)  # no drawing process outlives a failed page
        raise
    context = {**rest, "figures": [f for made in figures() for f in (made if isinstance(made, list) else [made]) if f],
               "data_parallel": parallel and {**parallel, "table": _html_or_none(parallel["table"])},
               "sections": [s for s in SECTIONS if s[0] != "data_parallel" or parallel],
               "records": held, "n_ok": sum(v == "ok" for v in status.values()),
               "cells": _cells(counted["run"], whole_epochs(counted["epochs"], counted["steps"], counted["run"]),
                               counted["steps"]),
               "missing": [f"{c} ({status.get(c, 'missing')})" for c in manifest["cells"] if status.get(c) != "ok"]}
    if parallel:  # the summary's rows, figures and Runs column count the 1-worker cells alone
        context["legend"] += (" Rows, figures and the Runs column are the 1-worker cells'; the floor and N-worker "
                              "cells are in the Data parallel section.")
    profile = speed.profile_section(single)  # --profile: where the mixed cells' time went (report/speed.py)
    context["profile"] = profile and {**profile, "table": _html_or_none(profile["table"])}
    fp8 = fp8_report.section(single, manifest["device"])  # fp8 cells' section (report/fp8.py)
    context["fp8_html"] = fp8_report.html(fp8, fp8_report.figure(fp8, run_dir / "figures") if draw else None)
    page, used = glossary.expand_first_use(JINJA.get_template("report.html").render(**context))
    atomic_write_text(run_dir / "index.html", page.replace("<!--abbreviations-->", glossary.abbreviations_html(used)))
    md = [f"## amp-compare `{manifest['run_id']}` ({manifest['environment'].get('cpu_model', '')}, "
          f"{manifest['device']})", "",
          *(["### Answer", "", context["answer_markdown"], ""] if context["answer_markdown"] else []),
          *[part for title, t in context["verdict_tables_md"] for part in (f"#### {title}", "", table_markdown(t), "")],
          *([context["verdict_columns"], ""] if context["verdict_columns"] else []),
          table_markdown(context["summary"]), "", context["legend"], "", *[f"- {s}" for s in context["sentences"]],
          *(["", "### Data parallel", "", dataparallel.short_intro(), "", table_markdown(parallel["table"]), "",
             *[f"- {s}" for s in parallel["sentences"]]] if parallel and not parallel["table"].empty else []),
          *(["", "### Profile", "", speed.NONE_MOVED if profile["table"].empty else table_markdown(profile["table"]),
             "", *[f"- {s}" for s in profile["sentences"]]] if profile else []),
          *fp8_report.markdown(fp8, table_markdown),
          *(["", f"Cells without a result: {', '.join(context['missing'])}."] if context["missing"] else []),
          "", f"Reproduce: `{manifest['command']}`", *filter(None, [context["reproduce_note"]]), ""]
    atomic_write_text(run_dir / "summary.md", glossary.expand_first_use("\n".join(md), markdown=True)[0])
    records.export_tables(run_dir, {"verdicts": context["verdicts"]})
    render_runs_index(run_dir.parent)
    return Rendered(run_dir / "index.html", context["full"], context["sentences"], parallel and parallel["rows"],
                    context["answer_text"], context["verdicts"], context["conditions"])


def _index_headline(run_dir: Path, manifest: dict, runs: pd.DataFrame | None) -> str:
    """A run's headline in the runs index: its answer's uses, else its 1-worker cells' mixed speeds and accuracy."""
    if (stored := run_dir / "data" / "verdicts.parquet").exists():
        return "use " + answer_block.uses(pd.read_parquet(stored))
    single = runs[dataparallel.roles(runs) == "single"] if runs is not None and not runs.empty else pd.DataFrame()
    if single.empty or (table := tb.summary_table(single)).empty:
        return ""
    emulated = fp8_report.speed_emulated(table["precision"], manifest.get("device", "cpu"))
    several = len(table.groupby(["model", "dataset"])) > 1
    return "; ".join(
        f"{f'{r.model}/{r.dataset} ' if several else ''}{r.framework} {r.precision}: " + (
            fp8_report.EMULATED_SPEED if fake else f"{r.speedup_vs_fp32:.2f}× fp32 speed"
            if np.isfinite(r.speedup_vs_fp32) else "n/a")
        + (f", {r.val_accuracy:.1%} acc." if np.isfinite(r.val_accuracy) else ", accuracy n/a")
        for r, fake in zip(table.itertuples(), emulated) if precisions.is_mixed(r.precision))


def render_runs_index(reports_dir: Path) -> Path:
    """reports/index.html: every compare run in the folder with its headline, cached in each run's cache/."""
    rows = []
    for run_dir in sorted((p for p in Path(reports_dir).iterdir() if (p / "manifest.json").exists()), reverse=True):
        data = run_dir / "data"
        try:
            manifest = load_manifest(run_dir)
            runs = pd.read_csv(data / "run.csv") if (data / "run.csv").exists() else None
        except (OSError, ValueError, pd.errors.ParserError):
            continue
        sources = [run_dir / "manifest.json", data / "run.csv", data / "steps.parquet", data / "verdicts.parquet",
                   *sorted(Path(__file__).parent.glob("*.py"))]
        key = [[f.stat().st_size, f.stat().st_mtime_ns] if f.exists() else None for f in sources]
        headline, path = None, run_dir / "cache" / "index_headline.json"
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            headline = stored["headline"] if (stored := json.loads(path.read_text()))["key"] == key else None
        if headline is None:
            headline = _index_headline(run_dir, manifest, runs)
            with contextlib.suppress(OSError):  # a run folder this user cannot write: computed each time
                path.parent.mkdir(exist_ok=True)
                atomic_write_text(path, json.dumps({"key": key, "headline": headline}))
        rows.append({"run_id": manifest["run_id"], "timestamp": manifest["environment"].get("timestamp", ""),
                     "machine": f"{manifest['environment'].get('cpu_model', '')} / {manifest['device']}",
                     "matrix": " × ".join(",".join(map(str, manifest["matrix"][k])) for k in (
                         "frameworks", "models", "datasets", "precisions", "seeds")),  # every cell counted in ok
                     "ok": f"{int((runs['status'] == 'ok').sum()) if runs is not None else 0}/{len(manifest['cells'])}",
                     "headline": headline or "n/a"})
    atomic_write_text(path := Path(reports_dir) / "index.html", JINJA.get_template("index.html").render(runs=rows))
    return path
