"""Keras or its backend? What the Keras backends of a compare share is Keras' own doing, what differs, its backend's."""

from __future__ import annotations

import pandas as pd

from amp_compare.contract.config import KERAS_BACKENDS, framework_label, ordered
from amp_compare.harness.report.phrases import evidence
from amp_compare.harness.report.settings_check import value_text
from amp_compare.harness.report.stats import ok_runs

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
