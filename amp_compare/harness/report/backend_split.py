"""Keras or its backend? When one compare ran the Keras model on several backends, what the Keras cells share
(settings read back, defaults of fresh objects) is Keras' own doing and what differs is the backend's; one table
of each, from the run's own records. Framework-free."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from amp_compare.contract.config import DISPLAY_ORDER, KERAS_BACKENDS, framework_label
from amp_compare.harness.report.memory import MIB
from amp_compare.harness.report.settings_check import value_text
from amp_compare.harness.report.speed import milliseconds
from amp_compare.harness.report.stats import MIN_TIMED_STEPS


def _json(value) -> dict:
    if isinstance(value, str) and value:
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def keras_frameworks(runs: pd.DataFrame) -> list[str]:
    """The Keras frameworks with at least one finished cell, in display order."""
    if runs.empty or "framework" not in runs:
        return []
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    return sorted({fw for fw in ok["framework"] if fw in KERAS_BACKENDS}, key=lambda f: DISPLAY_ORDER.get(f, 99))


def keras_table(runs: pd.DataFrame, frameworks: list[str]) -> pd.DataFrame:
    """One row per Keras-level item: each backend's values (over its cells) and whether all backends agree."""
    ok = runs[(runs["status"] == "ok") & runs["framework"].isin(frameworks)]
    values: dict[str, dict[str, set]] = {}

    def add(item: str, fw: str, value) -> None:
        values.setdefault(item, {f: set() for f in frameworks})[fw].add(value_text(value))

    for row in ok.to_dict("records"):
        fw, prec = row["framework"], row["precision"]
        if row.get("amp_api"):
            add(f"AMP API ({prec})", fw, row["amp_api"])
        for key, value in _json(row.get("settings_used")).items():
            if key != "tf32":  # the backend's setting: the backend table shows it
                add(f"{key} ({prec})" if key == "output_dtype" else key, fw, value)
        for key, value in _json(row.get("framework_defaults")).items():
            add(f"Keras default: {key}", fw, value)
    rows = []
    for item, per_fw in sorted(values.items()):
        cells = {framework_label(fw): "; ".join(sorted(v)) or "not recorded" for fw, v in per_fw.items()}
        recorded = [v for v in per_fw.values() if v]
        same = len(recorded) == len(frameworks) and all(v == recorded[0] for v in recorded)
        rows.append({"item": item, **cells, "same on every backend": "✓" if same else "✗ differs"})
    return pd.DataFrame(rows)


INTRO = ("The same Keras model code, dtype policy, optimizer (LossScaleOptimizer for fp16), loss and records ran on "
         "each Keras backend, each in its own process with KERAS_BACKEND set before Keras was imported. What the "
         "Keras columns share is Keras' own; what differs between them belongs to the backend.")
BACKEND_MEASURES = {  # run-table column -> (label, how to show a median over cells)
    "throughput_img_s": ("throughput (img/s, median over seeds)", lambda v: f"{v:,.0f}"),
    "median_step_s": ("median step (ms)", lambda v: f"{v * 1e3:.1f}"),
    "compile_warmup_s": ("warm-up steps' time beyond as many median steps (ms)", milliseconds),
    "first_step_overhead_s": ("first step's time beyond the median step (ms)", milliseconds),
    "first_step_dispatch_s": ("first step's dispatch time, device mode (ms)", milliseconds),
    "peak_memory_bytes": ("peak memory (MiB)", lambda v: f"{v / MIB:,.1f}"),
}
BACKEND_TEXT = {"framework_version": "backend version", "compiled": "compilation", "tf32": "TF32 (read back)",
                "memory_kind": "memory measured as", "step_values": "per-step values"}


def backend_table(runs: pd.DataFrame, frameworks: list[str]) -> pd.DataFrame:
    """One row per measured quantity (per precision) and per backend setting, a column per Keras backend."""
    ok = runs[(runs["status"] == "ok") & runs["framework"].isin(frameworks)]
    rows = []
    for col, label in BACKEND_TEXT.items():
        if col in ok:
            rows.append({"quantity": label, **{
                framework_label(fw): ", ".join(dict.fromkeys(str(v) for v in ok.loc[ok["framework"] == fw, col].dropna()
                                                             if str(v))) or "-" for fw in frameworks}})
    precisions = sorted(set(ok["precision"]), key=lambda p: DISPLAY_ORDER.get(p, 99))
    for col, (label, show) in BACKEND_MEASURES.items():
        if col not in ok:
            continue
        for prec in precisions:
            cells = {}
            for fw in frameworks:
                v = pd.to_numeric(ok.loc[(ok["framework"] == fw) & (ok["precision"] == prec), col], errors="coerce")
                cells[framework_label(fw)] = show(float(v.median())) if v.notna().any() else "-"
            rows.append({"quantity": f"{label}, {prec}", **cells})
    return pd.DataFrame(rows)


def split_sentences(runs: pd.DataFrame, frameworks: list[str], keras: pd.DataFrame) -> list[str]:
    """What the two tables say, in words, from their own numbers."""
    ok = runs[(runs["status"] == "ok") & runs["framework"].isin(frameworks)]
    labels = ", ".join(framework_label(fw) for fw in frameworks)
    out = []
    if not keras.empty:
        same = keras["same on every backend"] == "✓"
        text = (f"Keras' side: {int(same.sum())} of {len(keras)} settings and defaults the Keras children read back "
                f"are identical on {labels}: those differences from PyTorch belong to Keras, not to TensorFlow.")
        if (~same).any():
            text += f" Differing between backends: {', '.join(keras.loc[~same, 'item'].head(8))}."
        out.append(text)
    for prec in sorted(set(ok["precision"]), key=lambda p: DISPLAY_ORDER.get(p, 99)):
        speeds = {fw: float(pd.to_numeric(ok.loc[(ok["framework"] == fw) & (ok["precision"] == prec),
                                                 "throughput_img_s"], errors="coerce").median())
                  for fw in frameworks}
        speeds = {fw: v for fw, v in speeds.items() if np.isfinite(v) and v > 0}
        if len(speeds) < 2:
            continue
        fast, slow = max(speeds, key=speeds.get), min(speeds, key=speeds.get)
        listed = ", ".join(f"{framework_label(fw)} {v:,.0f}" for fw, v in speeds.items())
        text = (f"Backend's side, {prec}: the same Keras model and settings trained at {listed} img/s; "
                f"{framework_label(fast)} was {speeds[fast] / speeds[slow]:.2f}× {framework_label(slow)} "
                f"(median over seeds; the kernels, the step's overhead and compilation are the backend's).")
        cells = ok[ok["precision"] == prec]
        seeds = int(cells.groupby("framework").size().min())
        if seeds < 2:
            text += (" One seed per backend: a single measurement each, with no interval; the Speed section's ratios "
                     "carry the intervals.")
        timed = pd.to_numeric(cells.get("steps_timed", pd.Series(dtype=float)), errors="coerce")
        if timed.notna().any() and timed.min() < MIN_TIMED_STEPS:
            text += (f" ⚠ Only {int(timed.min())} step(s) were timed in some of these cells (a run no longer than its "
                     f"warm-up times the warm-up too), so these figures include the first steps' extra time: not a "
                     f"steady-state speed comparison.")
        out.append(text)
    return out


def keras_backend_split(runs: pd.DataFrame) -> dict:
    """The report's "Keras or its backend?" part: tables and sentences, or a note when it cannot be told."""
    frameworks = keras_frameworks(runs)
    if len(frameworks) < 2:
        return {"note": ("Only one Keras backend ran, so what belongs to Keras and what to its backend cannot be "
                         "told apart here; add keras-jax or keras-torch to --frameworks.") if frameworks else "",
                "keras_table": pd.DataFrame(), "backend_table": pd.DataFrame(), "sentences": []}
    keras = keras_table(runs, frameworks)
    return {"note": "", "keras_table": keras, "backend_table": backend_table(runs, frameworks),
            "sentences": split_sentences(runs, frameworks, keras)}
