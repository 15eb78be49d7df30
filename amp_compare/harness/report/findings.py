"""The findings: the Summary's sentences on what the verdict tables and the other sections do not say (diverged
cells, the machine's steadiness, the frameworks' own log lines on their half-precision path, MFU over 100%, runs
too short to judge accuracy), from full_table and the records."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from amp_compare.contract import precision as precisions
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
    """The machine's steadiness, the frameworks' own log lines on their half-precision path (one CPU only), and
    any MFU over 100%."""
    out = [note] if (note := machine_note(environment)) else []
    table = groups.table
    if slowdown_scope(runs):
        logs = [line for line in environment.get("framework_logs", []) if isinstance(line, LogLine)]
        out += log_sentences(table, environment, logs)
    return out + mfu_findings(table)


def too_short_findings(groups: Groups) -> list[str]:
    """Per model/dataset whose fp32 did not learn enough: that accuracy cannot be compared, and what to change
    (the accuracy section repeats these as its warnings)."""
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
    """The findings as facts the page lays out: every sentence in order, the accuracy warnings among them, and
    whether a mixed row of the summary read below fp32's throughput on one CPU (the page then shows no separate
    flags note)."""

    sentences: list[str]
    accuracy_warnings: list[str]
    slower_on_cpu: bool


def finding_parts(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict,
                  epochs: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> Findings:
    """The findings' sentences in order, each naming its model and dataset (and machine) and its seed count."""
    table = full_table(runs, epochs, environment) if table is None else table
    if table.empty:
        return Findings(["No cell finished, so there is nothing to compare yet; see the failed cells below."], [],
                        False)
    groups = Groups.of(table)
    short = too_short_findings(groups)
    out = [*machine_findings(groups, runs, environment), *short]
    diverged = nr.with_loss_history(runs[runs["status"] == "diverged"], steps) if "status" in runs else runs.iloc[0:0]
    mixed = table[precisions.is_mixed(table["precision"])]
    ended = [f"{r.model} on {r.dataset}, {_label(r.framework)} {r.precision} (seed {r.seed}) diverged: {r.error}"
             + (f"; {nr.ending_text(r, since=False)}." if nr.ending_text(r) else ".") for r in diverged.itertuples()]
    return Findings(ended[::-1] + out, short, slowdown_scope(runs) and bool((mixed["speedup_vs_fp32"] < 1).any()))



def findings(runs: pd.DataFrame, steps: pd.DataFrame, environment: dict,
             epochs: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> list[str]:
    """finding_parts' sentences (the terminal and summary.md show these)."""
    return finding_parts(runs, steps, environment, epochs, table).sentences


def mfu_findings(table: pd.DataFrame) -> list[str]:
    """Any MFU over 100% (the measured matmul is then not the ceiling of the path the cell ran: the number is shown,
    flagged)."""
    over = table[table["mfu_measured"] > 1]
    if over.empty:
        return []
    cells = ", ".join(f"{_label(r.framework)} {r.precision} batch {r.batch_size:.0f} ({r.mfu_measured:.0%})"
                      for r in over.itertuples())
    return [f"MFU above 100% in {len(over)} cell(s) ({cells}): the model trained faster than the matmul measured as "
            "the ceiling, so that matmul is not the ceiling of the kernels these cells ran; read their MFU as a ratio "
            "of two measured rates, not as a fraction of the hardware."]
