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


_IDENTITY = ("framework", "model", "dataset", "precision", "device")  # of a search's cfg
_PROBE = ("batch", "ok", "peak_bytes", "memory_kind", "reason")  # of each probe
_SEARCH = ("cap_bytes", "max_ok", "first_failed", "stopped_early")  # of the search


def search_table(results: Iterable) -> pd.DataFrame:
    """One row per probe of every search (harness/run/maxbatch.py SearchResult objects), identity in columns."""
    rows = [{**({k: getattr(r.cfg, k) for k in _IDENTITY} if r.cfg is not None else {}), "probe": order,
             **{k: getattr(p, k) for k in _PROBE}, **{k: getattr(r, k) for k in _SEARCH}}
            for r in results for order, p in enumerate(r.probes)]
    table = pd.DataFrame(rows, columns=[*_IDENTITY, "probe", *_PROBE, *_SEARCH])
    return table.astype({"batch": "int64", "ok": "bool", "max_ok": "int64", "probe": "int64",
                         **dict.fromkeys(("peak_bytes", "cap_bytes", "first_failed"), "Int64")})  # None: missing
