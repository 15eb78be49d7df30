"""What the report (and the console) say of a --find-max-batch search: its memory cap in words and its probes as
one tidy table. The search itself is harness/run/maxbatch.py."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from amp_compare.kit.probe import format_size


def cap_label(device: str, cap_bytes: int | None) -> str:
    """What a search's memory cap is, in words (console, report note, figure caption)."""
    if device == "cuda":
        return ("the GPU's whole memory" if cap_bytes is None else
                f"a {format_size(cap_bytes)} GPU memory cap (torch set_per_process_memory_fraction, "
                "TensorFlow logical-device memory limit)")
    return f"a {format_size(cap_bytes)} cap on each probe process's CPU memory (RSS)" if cap_bytes else "no cap"


def search_table(results: Iterable) -> pd.DataFrame:
    """One row per probe of every search (harness/run/maxbatch.py SearchResult objects), identity in columns
    (tidy: filter, group and plot as is)."""
    rows = []
    for result in results:
        cfg = result.cfg
        identity = ({"framework": cfg.framework, "model": cfg.model, "dataset": cfg.dataset,
                     "precision": cfg.precision, "device": cfg.device} if cfg is not None else {})
        for order, p in enumerate(result.probes):
            rows.append({**identity, "probe": order, "batch": p.batch, "ok": p.ok, "peak_bytes": p.peak_bytes,
                         "memory_kind": p.memory_kind, "reason": p.reason, "cap_bytes": result.cap_bytes,
                         "max_ok": result.max_ok, "first_failed": result.first_failed,
                         "stopped_early": result.stopped_early})
    columns = ["framework", "model", "dataset", "precision", "device", "probe", "batch", "ok", "peak_bytes",
               "memory_kind", "reason", "cap_bytes", "max_ok", "first_failed", "stopped_early"]
    table = pd.DataFrame(rows, columns=columns)
    for name in ("peak_bytes", "cap_bytes", "first_failed"):  # None stays missing, not a float NaN
        table[name] = table[name].astype("Int64")
    return table.astype({"batch": "int64", "ok": "bool", "max_ok": "int64", "probe": "int64"})
