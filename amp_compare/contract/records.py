"""Tidy long-format records: what a run wrote, and how to read it back.

One compare run is a folder `reports/<run-id>/`. Each cell (framework x model x dataset x
precision x seed) writes its own three tables under `cells/<cell-id>/` once, atomically
(temporary file, fsync, rename: contract/atomic.py), so a crash never leaves a half-written table behind and a
finished cell is never rewritten:

- run.parquet    one row: identity, config, environment, status and summary numbers
- epochs.parquet one row per epoch
- steps.parquet  one row per optimizer step

Identity lives in columns (IDENTITY), never only in file names. `read_run` concatenates all
cells, and the run's speed trials (`trials/<trial-id>/trials.parquet`, kit/trial.py) as the `trials` table;
`export_tables` writes the combined tables as Parquet and CSV under `data/`.
"""

from __future__ import annotations

import base64
import io
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from amp_compare.contract import tables as declared_tables
from amp_compare.contract.atomic import atomic_write_bytes

SCHEMA_VERSION = 1
TABLES = ("run", "epochs", "steps")
# the numerics lab's rows, where a cell wrote them; workers: a data-parallel cell's per-worker values per step;
# headroom: the vit's per-epoch maxima (LayerNorm inputs, Q·Kᵀ); phases: where the child's wall time went
# (kit/phases.py)
OPTIONAL_TABLES = ("dtypes", "underflow", "workers", "headroom", "profile_ops", "profile_primitives",
                   "fp8_layers", "fp8_trace", "phases")
IDENTITY = list(declared_tables.IDENTITY)

# Columns every table must have (beyond IDENTITY); readers rely on these. Every column, with its kind and unit, is
# declared in contract/tables.py.
REQUIRED = declared_tables.REQUIRED


def atomic_write_table(path: Path, df: pd.DataFrame) -> None:
    """Write a DataFrame as Parquet (or CSV by suffix) through contract/atomic.py's one atomic write
    (temporary file, fsync, rename): the table is serialised in memory first, so a full disk or a value
    the format cannot store fails before any file is touched."""
    buffer = io.BytesIO()
    if Path(path).suffix == ".csv":
        df.to_csv(buffer, index=False)
    else:
        df.to_parquet(buffer, index=False)
    atomic_write_bytes(path, buffer.getvalue())


# Run-table columns recorded under older names, renamed on read (read_cell, migrate): the FLOP/s ceiling was
# called "peak" until "peak" meant only peak memory.
RENAMED = {"peak_dtype": "ceiling_dtype", "peak_basis": "ceiling_basis",
           "peak_flops_measured": "ceiling_flops_measured", "peak_matmul_size": "ceiling_matmul_size",
           "peak_flops_table": "ceiling_flops_table", "peak_table_source": "ceiling_table_source"}


# A half format the CPU has no arithmetic for is measured against the fp32 matmul's ceiling (kit/ceiling.py), labelled
# "fp32 (no bf16 arithmetic)"; records written before said "fp32 (bf16 emulated)", a claim about kernels no record
# shows.
_OLD_CEILING = re.compile(r"^fp32 \((\w+) emulated\)$")
# Records written before ceiling_fp32_for and ceiling_isa_limit said both in the label alone.
_FP32_CEILING = r"^fp32 \((?:no (\w+) arithmetic|(\w+) arithmetic limited by (.+))\)$"


def migrate(df: pd.DataFrame) -> pd.DataFrame:
    """A table read from any schema version with today's column names (RENAMED), ceiling labels (_OLD_CEILING) and
    ceiling columns (_FP32_CEILING)."""
    renames = {old: new for old, new in RENAMED.items() if old in df.columns and new not in df.columns}
    df = df.rename(columns=renames) if renames else df
    if "ceiling_dtype" in df and df["ceiling_dtype"].astype(str).str.match(_OLD_CEILING.pattern).any():
        df = df.assign(ceiling_dtype=df["ceiling_dtype"].map(
            lambda v: v if pd.isna(v) else _OLD_CEILING.sub(r"fp32 (no \1 arithmetic)", str(v))))
    if "ceiling_dtype" in df and "ceiling_fp32_for" not in df:
        parts = df["ceiling_dtype"].astype(str).str.extract(_FP32_CEILING).fillna("")
        df = df.assign(ceiling_fp32_for=parts[0] + parts[1], ceiling_isa_limit=parts[2])
    return df


def validate_table(name: str, df: pd.DataFrame) -> None:
    """The table against its declaration (contract/tables.py): required columns present, each declared column of
    its kind; a TableError (a ValueError) names the table and the column."""
    declared_tables.check(name, df)


def write_cell(cell_dir: Path, tables: dict[str, pd.DataFrame]) -> None:
    """Write one cell's tables. `run` is written last: its presence marks the cell complete."""
    for name in tables:
        validate_table(name, tables[name])
    for name in ("epochs", "steps", *OPTIONAL_TABLES):
        if name in tables:
            atomic_write_table(cell_dir / f"{name}.parquet", tables[name])
    atomic_write_table(cell_dir / "run.parquet", tables["run"])


def read_cell(cell_dir: Path) -> dict[str, pd.DataFrame]:
    out = {}
    for name in (*TABLES, *OPTIONAL_TABLES):
        path = cell_dir / f"{name}.parquet"
        if path.exists():
            df = migrate(pd.read_parquet(path))
            validate_table(name, df)
            out[name] = df
    if "run" not in out:
        raise ValueError("no run.parquet (the cell never finished writing)")
    return out


def read_run(run_dir: Path, warn=None) -> dict[str, pd.DataFrame]:
    """All cells of one compare run, concatenated. A corrupt cell is named and skipped."""
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    parts: dict[str, list[pd.DataFrame]] = {name: [] for name in (*TABLES, *OPTIONAL_TABLES)}
    cells_dir = Path(run_dir) / "cells"
    for cell_dir in sorted(p for p in cells_dir.glob("*") if p.is_dir()) if cells_dir.exists() else []:
        if not (cell_dir / "run.parquet").exists():
            warn(f"skipping unfinished cell {cell_dir.name} (no run.parquet: interrupted or still running)")
            continue
        try:
            cell = read_cell(cell_dir)
        except Exception as exc:  # a corrupt file must not hide the other cells
            warn(f"skipping unreadable cell {cell_dir}: {exc}")
            continue
        for name, df in cell.items():
            parts[name].append(df)
    tables = {
        name: (pd.concat(dfs, ignore_index=True) if dfs else pd.DataFrame(columns=IDENTITY + REQUIRED[name]))
        for name, dfs in parts.items()
    }
    tables["trials"] = read_trials(run_dir, warn)
    return tables


def read_trials(run_dir: Path, warn=None) -> pd.DataFrame:
    """The run's speed trials' blocks (kit/trial.py: trials/<trial-id>/trials.parquet), concatenated; an unreadable
    trial is named and skipped; no trials: an empty table with the declared columns."""
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    parts = []
    for path in sorted((Path(run_dir) / "trials").glob("*/trials.parquet")):
        try:
            df = pd.read_parquet(path)
            validate_table("trials", df)
            parts.append(df)
        except Exception as exc:  # a corrupt trial must not hide the others
            warn(f"skipping unreadable trial {path.parent.name}: {exc}")
    columns = [*declared_tables.TRIAL_IDENTITY, *REQUIRED["trials"]]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def export_tables(run_dir: Path, tables: dict[str, pd.DataFrame]) -> list[Path]:
    """Combined tables of a run as Parquet and CSV under data/ (derived, rebuilt on each render)."""
    written = []
    for name, df in tables.items():
        for suffix in (".parquet", ".csv"):
            path = Path(run_dir) / "data" / f"{name}{suffix}"
            atomic_write_table(path, df)
            written.append(path)
    return written


# ---- per-example correctness, compact in the records (the run table's val_correct column) --------

def pack_correct(correct: np.ndarray) -> str:
    """Booleans (one per validation image, in order) as base64 of a packed bit array: 1 bit per image."""
    return base64.b64encode(np.packbits(np.asarray(correct, dtype=bool)).tobytes()).decode("ascii")


def unpack_correct(text: str, n: int) -> np.ndarray:
    """The inverse of pack_correct for n images."""
    bits = np.unpackbits(np.frombuffer(base64.b64decode(text), dtype=np.uint8))
    if len(bits) < n:
        raise ValueError(f"val_correct holds {len(bits)} bits, fewer than the {n} validation images")
    return bits[:n].astype(bool)
