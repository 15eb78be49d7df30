"""The Summary's findings: what the verdict tables and the other sections do not say."""

from __future__ import annotations

import pandas as pd

from amp_compare.contract.config import framework_label as _label
from amp_compare.harness.report import numerics as nr
from amp_compare.harness.report.speed import LogLine, log_sentences, machine_note
from amp_compare.harness.report.tables import LOOP, full_table, group_label, named_machines, varying_keys


def finding_parts(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict,
                  epochs: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> list[str]:
    """The findings' sentences: diverged cells, the machine's steadiness, log lines and, per group (machine,
    model/dataset, loop) whose fp32 did not learn enough, what to change to compare accuracy."""
    table = full_table(runs, epochs, environment) if table is None else table
    if table.empty:
        return ["No cell finished, so there is nothing to compare yet; see the failed cells below."]
    out = [note] if (note := machine_note(environment)) else []
    one_cpu = runs["cpu_model"].nunique() <= 1 if "cpu_model" in runs else "machine" not in runs
    if set(runs.get("cfg_device", pd.Series(dtype=str)).dropna()) == {"cpu"} and one_cpu:
        out += log_sentences(table, environment,
                             [line for line in environment.get("framework_logs", []) if isinstance(line, LogLine)])
    diverged = nr.with_loss_history(runs[runs["status"] == "diverged"], steps) if "status" in runs else runs.iloc[0:0]
    ended = [f"{r.model} on {r.dataset}, {_label(r.framework)} {r.precision} (seed {r.seed}) diverged: {r.error}"
             + (f"; {said}." if (said := nr.ending_text(r)) else ".") for r in diverged.itertuples()]
    keys = [k for k in ("machine", "model", "dataset", *LOOP) if k in table]
    multi, varying = named_machines(table), varying_keys(table)
    return ended[::-1] + out + [
        f"Accuracy cannot be compared from this run for {group_label(dict(zip(keys, k)), multi, varying)}: {short}. "
        "Train longer (more --epochs, no --steps-per-epoch cap) or on the real dataset before reading accuracy "
        "differences." for k, group in table.groupby(keys, sort=False, dropna=False)
        if (short := group["too_short"].iloc[0])]
