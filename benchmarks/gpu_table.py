"""The GPU check's table and targets, from compare runs' records, on the package's own summary table.

Runs wherever the records are (no framework): `python benchmarks/gpu_check.py table RUN_DIR...` or at the end of
`gpu_check.py run`. Each row is a cell of the report's summary table (medians over seeds, speed paired with each
seed's fp32 cell of the same loop and batch size), with the speed over the plain loop's fp32 cell, EXTRA, and the
reference loop run beside it in the same call (benchmarks/reference_loops.py).
"""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def package() -> SimpleNamespace:
    """What the GPU check takes from the package, in one place: imported after its install, which may bring the
    package's own needs (pydantic) from a wheelhouse."""
    sys.path.insert(0, str(ROOT))
    importlib.invalidate_caches()
    from amp_compare.contract.records import read_run
    from amp_compare.harness.report.render import table_markdown
    from amp_compare.harness.report.tables import _fmt, formatted_summary, ok_runs, summary_table, with_loop_columns
    from amp_compare.harness.run.launch import kill_tree

    return SimpleNamespace(read_run=read_run, kill_tree=kill_tree, table_markdown=table_markdown, fmt=_fmt,
                           formatted_summary=formatted_summary, ok_runs=ok_runs, summary_table=summary_table,
                           with_loop_columns=with_loop_columns)


# Beside the package's summary table: medians over seeds of these run-table columns (name, scale, format).
EXTRA = {"host_syncs_per_step": ("host syncs/step", 1, "g"), "cudagraph_skips": ("cudagraph skips", 1, ".0f"),
         "dataset_device_bytes": ("data on device (MiB)", 2**-20, ",.0f")}
ADDED = ["plain_fp32", "reference_img_s", "speedup_vs_plain_fp32", "reference_over_this"]
SHOWN = ["Framework", "Step", "Batch", "Precision", "Images/s", "Images/s (median step)", "Speed vs fp32",
         "× plain fp32", "reference img/s (ref ÷ this)", "MFU", "MFU (data-sheet ceiling)", "Peak memory (MiB)",
         *[name for name, _, _ in EXTRA.values()], "Compile/warm-up (s)", "Timing note"]


def read_runs(run_dirs: list[Path], phases: list[str] | None = None):
    """The run tables of compare runs, each with its phase (its folder's name unless given)."""
    import pandas as pd

    phases = phases or [d.name for d in run_dirs]
    runs = [package().read_run(d)["run"].assign(phase=p) for d, p in zip(run_dirs, phases)]
    return pd.concat([r for r in runs if not r.empty] or [pd.DataFrame()], ignore_index=True)


def build_table(runs, references: list[dict]):
    """The package's summary table (medians over seeds, speed paired with each seed's fp32 cell of the same loop
    and batch), with the speed over the plain loop's fp32, EXTRA, and each plain row's reference."""
    import pandas as pd

    p, keys = package(), ["framework", "model", "dataset", "step_loop", "batch_size", "precision"]
    table = p.summary_table(runs)
    if table.empty:
        return table.reindex(columns=[*table.columns, *EXTRA, *ADDED])
    ok = p.with_loop_columns(p.ok_runs(runs).copy())
    extra = ok.reindex(columns=[*keys, *EXTRA]).groupby(keys, dropna=False)[list(EXTRA)].median().reset_index()
    plain = table[(table["step_loop"] == "plain") & (table["precision"] == "fp32")]
    plain = plain[keys[:3] + ["batch_size", "throughput_img_s"]].rename(columns={"throughput_img_s": "plain_fp32"})
    ref = pd.DataFrame([{"framework": "torch" if r["reference"].startswith("torch") else "keras-jax",
                         "batch_size": r["batch"], "precision": r["precision"], "step_loop": "plain",
                         "reference_img_s": r["img_s"]} for r in references],
                       columns=["framework", "batch_size", "precision", "step_loop", "reference_img_s"])
    table = table.merge(extra, on=keys, how="left").merge(plain, on=keys[:3] + ["batch_size"], how="left").merge(
        ref, on=["framework", "batch_size", "precision", "step_loop"], how="left")
    return table.assign(speedup_vs_plain_fp32=table["throughput_img_s"] / table["plain_fp32"],
                        reference_over_this=table["reference_img_s"] / table["throughput_img_s"])


def table_markdown(table) -> str:
    """The package's formatted summary, EXTRA and the reference's columns beside it."""
    p = package()
    shown = p.formatted_summary(table).assign(**{
        "Speed vs fp32": [p.fmt(v, ".2f", "×") for v in table["speedup_vs_fp32"]],  # the cells' wall-time ratio
        "× plain fp32": [p.fmt(v, ".2f", "×") for v in table["speedup_vs_plain_fp32"]],
        "reference img/s (ref ÷ this)": [p.fmt(v, ",.0f") + f" ({q:.3f})" * (q > 0) for v, q in
                                         zip(table["reference_img_s"], table["reference_over_this"])],
        **{name: [p.fmt(v * scale, spec) for v in table[c]] for c, (name, scale, spec) in EXTRA.items()}})
    return p.table_markdown(shown[[c for c in SHOWN if c in shown]])


def targets(table) -> list[tuple[str, str, str]]:
    """(target, verdict, the figures behind it) on an H100-class GPU (TF32 off, resnet18, CIFAR-shaped data);
    "not measured" where this run has no such row. Nothing here is estimated."""
    import numpy as np

    f = package().fmt

    def rows(**where):
        return table[np.logical_and.reduce([table[k] == v for k, v in where.items()])]

    def judged(name, r, column, met, figures):
        if r.empty or not np.isfinite(r[column].iloc[0]):
            return name, "not measured", ""
        return name, "met" if met(r.iloc[0]) else "missed", figures(r.iloc[0])

    def against(r, limit, name):  # every precision's reference ÷ harness throughput at or under limit
        r = r.dropna(subset=["reference_over_this"])
        return judged(name, r, "reference_over_this", lambda _: (r["reference_over_this"] <= limit).all(),
                      lambda _: ", ".join(f"{p}: reference ÷ harness {v:.3f}"
                                          for p, v in zip(r["precision"], r["reference_over_this"])))

    out = [judged(f"tuned torch {p}, batch 256: ≥ 55,000 img/s and ≥ 8× fp32",
                  rows(framework="torch", step_loop="tuned", batch_size=256, precision=p), "throughput_img_s",
                  lambda r: r.throughput_img_s >= 55_000 and max(r.speedup_vs_fp32, r.speedup_vs_plain_fp32) >= 8,
                  lambda r: f"{r.throughput_img_s:,.0f} img/s; {f(r.speedup_vs_fp32, '.2f', '×')} tuned fp32, "
                            f"{f(r.speedup_vs_plain_fp32, '.2f', '×')} plain fp32") for p in ("fp16", "bf16")]
    out += [against(rows(framework="torch", step_loop="plain", batch_size=b), 1.05,
                    f"plain torch loop within 1.05× of the tutorial's loop, batch {b}") for b in (256, 1024)]
    out.append(judged("tuned torch bf16, batch 1024: MFU ≥ 35%",
                      rows(framework="torch", step_loop="tuned", batch_size=1024, precision="bf16"), "mfu_measured",
                      lambda r: r.mfu_measured >= 0.35,
                      lambda r: f"{r.mfu_measured:.1%} of the measured bf16 matmul peak ({r.ceiling_flops / 1e12:.0f} "
                                f"TFLOP/s); {f(r.mfu_table * 100, '.1f')}% of the data sheet's"))
    return out + [against(rows(framework="keras-jax", batch_size=b), 1.10,
                          f"keras-jax within 10% of a bare Keras-on-JAX fit, batch {b}") for b in (256, 1024)]

