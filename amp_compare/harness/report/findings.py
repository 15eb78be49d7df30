"""The findings: the Summary's sentences on what the verdict tables and the other sections do not say (diverged
cells, the machine's steadiness, the frameworks' own log lines on their half-precision path, runs too short to
judge accuracy), from full_table and the records."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from amp_compare.contract.config import framework_label as _label
from amp_compare.harness.report import numerics as nr
from amp_compare.harness.report.speed import LogLine, log_sentences, machine_note
from amp_compare.harness.report.tables import LOOP, full_table, group_label, named_machines, varying_keys


@dataclass
class Groups:
    """The aggregated table cut into the groups every sentence is about (model/dataset, loop, machine)."""

    table: pd.DataFrame
    items: list  # [(key dict, rows of the group)]
    multi: set  # (model, dataset) pairs that ran on several machines: their sentences name it
    varying: set  # loop keys that take several values: sentences name them

    @classmethod
    def of(cls, table: pd.DataFrame) -> Groups:
        keys = [k for k in ("machine", "model", "dataset", *LOOP) if k in table]
        items = [(dict(zip(keys, k if isinstance(k, tuple) else (k,))), g)
                 for k, g in table.groupby(keys, sort=False, dropna=False)]
        return cls(table, items, named_machines(table), varying_keys(table))

    def label(self, key: dict) -> str:
        return group_label(key, self.multi, self.varying)


def slowdown_scope(runs: pd.DataFrame) -> bool:
    """Whether every cell ran on a CPU, one CPU model: the flags and the frameworks' log lines are then that CPU's."""
    devices = set(runs.get("cfg_device", pd.Series(dtype=str)).dropna())
    one_cpu = runs["cpu_model"].nunique() <= 1 if "cpu_model" in runs else "machine" not in runs
    return devices == {"cpu"} and bool(one_cpu)


def machine_findings(groups: Groups, runs: pd.DataFrame, environment: dict) -> list[str]:
    """The machine's steadiness and the frameworks' own log lines on their half-precision path (one CPU only)."""
    out = [note] if (note := machine_note(environment)) else []
    table = groups.table
    if slowdown_scope(runs):
        logs = [line for line in environment.get("framework_logs", []) if isinstance(line, LogLine)]
        out += log_sentences(table, environment, logs)
    return out


def too_short_findings(groups: Groups) -> list[str]:
    """Per model/dataset whose fp32 did not learn enough: that accuracy cannot be compared, and what to change."""
    out = []
    for key, group in groups.items:
        short = group["too_short"].iloc[0]
        if short:
            out.append(f"Accuracy cannot be compared from this run for {groups.label(key)}: {short}. Train longer "
                       "(more --epochs, no --steps-per-epoch cap) or on the real dataset before reading accuracy "
                       "differences.")
    return out


@dataclass
class Findings:
    """The findings as facts the page lays out: every sentence in order."""

    sentences: list[str]


def finding_parts(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict,
                  epochs: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> Findings:
    """The findings' sentences in order, each naming its model and dataset (and machine) and its seed count."""
    table = full_table(runs, epochs, environment) if table is None else table
    if table.empty:
        return Findings(["No cell finished, so there is nothing to compare yet; see the failed cells below."])
    groups = Groups.of(table)
    out = [*machine_findings(groups, runs, environment), *too_short_findings(groups)]
    diverged = nr.with_loss_history(runs[runs["status"] == "diverged"], steps) if "status" in runs else runs.iloc[0:0]
    ended = [f"{r.model} on {r.dataset}, {_label(r.framework)} {r.precision} (seed {r.seed}) diverged: {r.error}"
             + (f"; {nr.ending_text(r, since=False)}." if nr.ending_text(r) else ".") for r in diverged.itertuples()]
    return Findings(ended[::-1] + out)
