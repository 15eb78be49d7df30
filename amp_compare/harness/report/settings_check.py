"""The settings both frameworks trained with (`settings_used`), in torch's convention, compared per cell and shown;
Keras or its backend? (what the Keras backends of a compare share is Keras' own doing, what differs, its backend's)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precision_table
from amp_compare.contract.config import FRAMEWORK_LABELS, KERAS_BACKENDS, framework_label, is_keras, ordered
from amp_compare.contract.mapping import keras_bn_momentum
from amp_compare.harness.report.phrases import evidence
from amp_compare.harness.report.stats import ok_runs

TORCH_CONVENTION = {"weight_decay": lambda v: 0.0 if v in (None, 0, 0.0) else v}  # per key; absent: as recorded
KERAS_CONVENTION = {**TORCH_CONVENTION, "bn_momentum": keras_bn_momentum,  # Keras weights the old average: 1 - m
                    "loss_reduction": lambda v: "mean" if v == "sum_over_batch_size" else v}


def compare_settings(torch_used: Mapping[str, object], keras_used: Mapping[str, object]) -> list[dict]:
    """One row per setting either side recorded: both raw values, both in torch's convention, and match."""
    rows = []
    for key in sorted(set(torch_used) | set(keras_used)):
        t, k = torch_used.get(key), keras_used.get(key)
        t_norm = TORCH_CONVENTION.get(key, lambda v: v)(t) if key in torch_used else None
        k_norm = KERAS_CONVENTION.get(key, lambda v: v)(k) if key in keras_used else None
        numbers = isinstance(t_norm, (int, float)) and isinstance(k_norm, (int, float)) and not isinstance(t_norm, bool)
        same = math.isclose(t_norm, k_norm, rel_tol=1e-6) if numbers else t_norm == k_norm  # Keras: lr ~1e-8 off
        rows.append({"key": key, "torch": t, "keras": k, "torch_as_torch": t_norm, "keras_as_torch": k_norm,
                     "recorded": {"torch": key in torch_used, "keras": key in keras_used},
                     "match": key in torch_used and key in keras_used and same})
    return rows


def value_text(value) -> str:
    """A recorded value as the settings tables print it (floats as %g)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def side_by_side(records: Iterable[Mapping]) -> dict:
    """The settings-used table (per setting: its values over the cells, whether they match) and its note."""
    cells: dict[tuple, dict[str, tuple[dict, str | None]]] = {}  # (settings, learning rate shown) per framework
    for record in records:
        settings, framework = evidence(record.get("settings_used")), record.get("framework")
        if settings and (framework == "torch" or is_keras(str(framework))):
            cell = tuple(record.get(k) for k in ("model", "dataset", "precision", "seed"))
            lr, schedule = record.get("cfg_lr"), str(record.get("cfg_lr_schedule") or "constant")  # as configured
            cells.setdefault(cell, {})[framework] = (settings, None if lr is None or lr != lr else f"constant {lr:g}"
                                                     if schedule == "constant" else f"{schedule}, peak {lr:g}")
    pairs = [(cell, by_fw, fw) for cell, by_fw in sorted(cells.items(), key=lambda item: tuple(map(str, item[0])))
             if "torch" in by_fw for fw in sorted(filter(is_keras, by_fw))]  # torch beside each Keras framework
    by_key: dict[str, dict] = {}
    bad: dict[str, list[str]] = {}  # each mismatching cell's settings
    for cell, by_fw, fw in pairs:
        name = "/".join(map(str, cell)) + ("" if fw == "tf" else f" ({fw})")
        for row in compare_settings(by_fw["torch"][0], by_fw[fw][0]):
            entry = by_key.setdefault(row["key"], {"torch": set(), "keras": set(), "mapped": set(), "bad": []})
            for side, (_, lr) in (("torch", by_fw["torch"]), ("keras", by_fw[fw])):
                shown = lr if row["key"] == "learning_rate" else None  # as scheduled (compared as recorded)
                entry[side].add(shown or (value_text(row[side]) if row["recorded"][side] else "not recorded"))
            if row["recorded"]["torch"] and row["recorded"]["keras"]:
                entry["mapped"].add(value_text(row["torch_as_torch"]))
            if not row["match"]:
                entry["bad"].append(name)
                bad.setdefault(name, []).append(row["key"])
    rows = [{"setting": key, "torch": "; ".join(sorted(e["torch"])), "keras": "; ".join(sorted(e["keras"])),
             "match": f"✗ MISMATCH ({', '.join(e['bad'])})" if e["bad"] else "✓" if e["torch"] == e["keras"] else
             f"✓ each cell's two records equal in torch's convention ({'; '.join(sorted(e['mapped']))})",
             "ok": not e["bad"]} for key, e in sorted(by_key.items())]
    listed = "; ".join(f"{name}: {', '.join(keys)}" for name, keys in bad.items())
    note = (f"SETTINGS MISMATCH in aligned mode: {len(bad)} of {len(pairs)} cells trained with settings that differ "
            f"between the frameworks ({listed}). Their differences are not AMP alone.") if bad else ""
    return {"rows": rows, "cells": len(pairs), "note": note}


def differences_paragraph(comparison: str, init: str) -> str:
    """The Framework differences section's first paragraph: the comparison mode and the initial weights."""
    mode = (" — the mapping below applied, both frameworks configured to the same behaviour" if comparison == "aligned"
            else " — each framework with its own out-of-the-box defaults")
    shared = (" — every cell of a model, dataset and seed started from the same weights, copied between frameworks "
              "through numpy" if init == "shared" else "")
    return (f"Comparison mode: {comparison}{mode}. Initial weights: {init}{shared}. Defaults are read from the "
            "installed versions by each framework's child, not typed by hand.")


def settings_paragraph(cells: int, comparison: str) -> str:
    """The paragraph above the settings-used table."""
    return ("Each child read these back from the model, optimizer and scaler it trained with, in its own framework's "
            "convention; harness/report/settings_check.py maps the conventions (BatchNorm momentum m in torch is "
            "1 − m in Keras; Keras' sum_over_batch_size is torch's mean) and compares the two records of each of the "
            f"{cells} cells both frameworks ran."
            + (" In aligned mode every row must match." if comparison == "aligned" else
               " In defaults mode differences are expected: they are the framework differences above."))


def adam_gap_text(records: Iterable[Mapping]) -> str:
    """The defaults-mode Adam gap per framework, median (and max) over the cells that recorded it ("" if none)."""
    by_fw: dict[str, list[Mapping]] = {}
    for r in records:
        if isinstance(value := r.get("adam_gap_max"), (int, float)) and math.isfinite(value):
            by_fw.setdefault(r.get("framework"), []).append(r)
    parts = [f"on {label}'s gradients ({len(rows)} cell{'s' * (len(rows) > 1)}): max "
             f"{max(r['adam_gap_max'] for r in rows):.3g}, median "
             f"{float(np.median([r['adam_gap_median'] for r in rows])):.3g}, "
             f"{float(np.median([r['adam_gap_over_1pct'] for r in rows])):.2%} of elements above 1%"
             for fw, label in FRAMEWORK_LABELS.items() if (rows := by_fw.get(fw))]
    return ("Measured in this run: one Adam step of both formulas (each framework's default epsilon) applied to "
            "each cell's own first-batch gradient; relative difference |torch − Keras| / |torch| of the "
            "update, " + "; ".join(parts) + ".") if parts else ""


# The models, optimizers or precisions that have what a framework-differences row is about (differences_apply).
PART_MODELS = {**dict.fromkeys(("bn_momentum", "bn_epsilon", "stride2_padding"), {"resnet18"}), **dict.fromkeys(
    ("ln_epsilon", "gelu_approximate", "mha_bias", "mha_dropout", "token_dtype", "attention_core"), {"vit"})}
OPTIMIZER_ROWS = {"adam_epsilon": {"adam", "adamw"}, "adam_formula": {"adam", "adamw"},
                  "weight_decay": {"adam"}, "adamw_weight_decay": {"adamw"}}
DYNAMIC_ROWS = dict.fromkeys(("init_scale", "growth_interval"), set(precision_table.names(loss_scaling="dynamic")))


def differences_apply(key: str, models: set | None, optimizers: set | None, precisions: set | None) -> bool:
    """Whether a framework-differences row is about something the run has; a None set: the records do not say."""
    for rows, have in ((PART_MODELS, models), (OPTIMIZER_ROWS, optimizers), (DYNAMIC_ROWS, precisions)):
        if key in rows:
            return have is None or bool(rows[key] & have)
    return True


def ignored_settings(records: Iterable[Mapping]) -> list[str]:
    """A configured --weight-decay that the chosen optimizer ignores, said once per (value, optimizer)."""
    said = {}
    for r in records:
        wd, optimizer = r.get("cfg_weight_decay"), str(r.get("cfg_optimizer") or "")
        if isinstance(wd, (int, float)) and math.isfinite(wd) and wd > 0 and optimizer in ("adam", "sgd"):
            said.setdefault((float(wd), optimizer), set()).add(str(r.get("model", "")))
    return [f"{', '.join(sorted(models))}: weight decay {wd:g} was configured but not used: its optimizer, "
            f"{optimizer}, trains without weight decay in both frameworks; only adamw applies it (--optimizer adamw)."
            for (wd, optimizer), models in sorted(said.items())]


INTRO = ("The same Keras model code, dtype policy, optimizer (LossScaleOptimizer for fp16), loss and records ran on "
         "each Keras backend, each in its own process with KERAS_BACKEND set before Keras was imported. What the "
         "Keras columns share is Keras' own; what differs between them belongs to the backend.")


def keras_backend_split(runs: pd.DataFrame) -> dict:
    """The "Keras or its backend?" part: each Keras-level item's values per backend and whether all agree; or a note."""
    ok = ok_runs(runs)
    frameworks = ordered(set(ok.get("framework", ())) & set(KERAS_BACKENDS))
    if len(frameworks) < 2:
        return {"note": ("Only one Keras backend ran, so what belongs to Keras and what to its backend cannot be "
                         "told apart here; add keras-jax or keras-torch to --frameworks.") if frameworks else "",
                "keras_table": pd.DataFrame(), "sentences": []}
    values: dict[str, dict[str, set]] = {}
    for row in ok[ok["framework"].isin(frameworks)].to_dict("records"):
        prec = row["precision"]
        items = [*([(f"AMP API ({prec})", row["amp_api"])] if row.get("amp_api") else []),
                 *((f"{key} ({prec})" if key == "output_dtype" else key, value)  # tf32: the Environment table's
                   for key, value in evidence(row.get("settings_used")).items() if key != "tf32"),
                 *((f"Keras default: {key}", value) for key, value in evidence(row.get("framework_defaults")).items())]
        for item, value in items:
            values.setdefault(item, {f: set() for f in frameworks})[row["framework"]].add(value_text(value))
    rows = []
    for item, per_fw in sorted(values.items()):
        cells = {framework_label(fw): "; ".join(sorted(v)) or "not recorded" for fw, v in per_fw.items()}
        agree = all(per_fw.values()) and len({frozenset(v) for v in per_fw.values()}) == 1
        rows.append({"item": item, **cells, "same on every backend": "✓" if agree else "✗ differs"})
    keras = pd.DataFrame(rows)
    same = keras.get("same on every backend", pd.Series(dtype=str)) == "✓"
    said = (f"Keras' side: {int(same.sum())} of {len(keras)} settings and defaults the Keras children read back are "
            f"identical on {', '.join(framework_label(fw) for fw in frameworks)}: those differences from PyTorch "
            "belong to Keras, not to TensorFlow."
            + (f" Differing between backends: {', '.join(keras.loc[~same, 'item'].head(8))}." if (~same).any() else ""))
    return {"note": "", "keras_table": keras, "sentences": [said] if len(keras) else []}
