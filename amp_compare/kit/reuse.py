"""Work that is the same for every seed of a cell, done by the first seed's child and reused by the later ones.

The run folder's `cache/` holds one JSON file per result (harness/run/runner.py passes the folder as --cache-dir;
kit/child.py sets CACHE_DIR). What is reused, and why it does not depend on the seed:
  * the dtype audit (which op ran in which dtype in one training step): the model, precision and framework decide
    it, not the weights or the batch;
  * the matmul FLOP/s ceiling (kit/ceiling.py): a property of the machine, the framework and the dtype the matmul
    runs in, so it is keyed by those alone (MACHINE_FIELDS and the dtype: on a CPU without float16 arithmetic the
    fp32 and fp16 cells of every model share one measurement).
The dtype audit's key is the cell's whole configuration less its seed (and the harness's per-cell speed reference),
so any option that could change the result keeps cells apart. The gradient-underflow rows depend on the weights
and stay per cell.
Files are written atomically (contract/atomic.py): a child that dies while writing leaves no half file, and two
children writing the same key write the same content.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amp_compare.contract.atomic import atomic_write_text
from amp_compare.contract.config import RunConfig

CACHE_DIR: Path | None = None  # set by kit/child.py from --cache-dir; None: nothing is reused
PER_CELL = ("seed", "speed_reference_step_s")  # configuration fields that do not change a reused result
# What a matmul's speed on this machine depends on, of a cell's configuration (its dtype is passed beside them)
MACHINE_FIELDS = ("framework", "device", "tf32", "threads", "replicas", "thread_floor")


def key_of(cfg: RunConfig, fields: tuple[str, ...] | None = None, **extra: Any) -> str:
    """The cache key of `cfg` (its configuration less PER_CELL, or only `fields`) and anything else the result
    depends on."""
    config = {k: v for k, v in cfg.to_dict().items() if (k in fields if fields else k not in PER_CELL)}
    text = json.dumps({**config, **extra}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def per_machine(name: str, cfg: RunConfig) -> Callable[[str, Callable[[], Any]], Any]:
    """remember(dtype, compute): compute()'s result cached by MACHINE_FIELDS and the dtype alone (the ceiling)."""
    return lambda dtype, compute: cached(name, cfg, compute, fields=MACHINE_FIELDS, dtype=dtype)


def cached(name: str, cfg: RunConfig, compute: Callable[[], Any], fields: tuple[str, ...] | None = None,
           **extra: Any) -> Any:
    """compute()'s result for this configuration (or its `fields` alone), from the run's cache where an earlier cell
    saved it (JSON), else computed and saved. Without a cache folder, computed."""
    if CACHE_DIR is None:
        return compute()
    path = CACHE_DIR / f"{name}-{key_of(cfg, fields, **extra)}.json"
    try:
        return json.loads(path.read_text())["value"]
    except (OSError, ValueError, KeyError):  # not there yet, or unreadable: computed again
        pass
    value = compute()
    atomic_write_text(path, json.dumps({"name": name, "made_by": cfg.cell_id, "value": value}))
    return value
