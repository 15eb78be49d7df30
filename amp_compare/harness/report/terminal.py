"""The summary a compare prints to the terminal: a table that fits the terminal it is printed on.

The report holds every column with its interquartile range; the terminal gets the same strings
(`amp_compare.harness.report.tables.formatted_summary`, so both agree) in the most detailed layout that fits the
console's width: one table per model x dataset (and machine) with those values in its title,
short headers that wrap, the ranges dropped first and then the least important columns. Nothing
is cut mid-value: a column that does not fit is left out and the footnote says where to find it.
"""

from __future__ import annotations

import re

import pandas as pd

from amp_compare.harness.report.tables import HARDWARE_COLUMNS, formatted_summary, summary_table

# Display columns of formatted_summary, in the order they are given up when the table is too wide.
GROUP_COLUMNS = ("Machine", "Model", "Dataset", "Step", "Batch")  # shown in each table's title, not as columns
# The report's hardware-efficiency detail (issue 13), never in the terminal: the report and summary.md have it.
REPORT_ONLY = (*HARDWARE_COLUMNS, "Images/s (median step)")
DROP_ORDER = ("Runs", "Skipped steps", "Memory vs fp32", "Peak memory (MiB)")
SHORT_HEADERS = {  # the terminal's headers, on two lines so that no header is wider than its values
    "Framework": "Framework", "Precision": "Precision", "Runs": "Runs", "Images/s": "Images/s",
    "Speed vs fp32": "Speed\nvs fp32", "Peak memory (MiB)": "Peak\nMiB", "Memory vs fp32": "Memory\nvs fp32",
    "Val. accuracy": "Val.\naccuracy", "Δ accuracy vs fp32": "Δ accuracy\nvs fp32", "Skipped steps": "Skipped\nsteps",
}
LEFT = ("Framework", "Precision")
WRAP = ("Δ accuracy vs fp32",)
_RANGE = re.compile(r" \[[^\]]*\]$")


def console_for_stderr():
    """A rich console on stderr. When stderr is no terminal (a log, CI), rich's own width applies
    (the COLUMNS variable, else 80); nothing is forced wider than the reader's screen."""
    from rich.console import Console

    return Console(stderr=True)


def _layouts(columns: list[str]):
    """(columns kept, ranges kept) from the most detailed layout to the narrowest."""
    yield columns, True
    kept = list(columns)
    yield kept, False
    for col in DROP_ORDER:
        if col in kept:
            kept = [c for c in kept if c != col]
            yield kept, False


def _table(title: str, part: pd.DataFrame, columns: list[str], ranges: bool):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), title_justify="left")
    for col in columns:
        wrap = col in WRAP  # a difference keeps its interval: it wraps onto a second line rather than being cut
        table.add_column(SHORT_HEADERS.get(col, col), justify="left" if col in LEFT else "right",
                         no_wrap=not wrap, overflow="fold" if wrap else "ellipsis")
    for row in part.itertuples(index=False):
        values = dict(zip(part.columns, row))
        # Text, not markup: "[min–max 6,173–6,296]" would otherwise be read as a rich style tag and vanish
        table.add_row(*[Text(str(values[c]) if ranges else _RANGE.sub("", str(values[c]))) for c in columns])
    return table


def summary_tables(runs: pd.DataFrame, width: int, table: pd.DataFrame | None = None) -> tuple[list, str | None]:
    """The terminal's summary tables (rich renderables) for `width` columns, and a footnote naming
    what the report shows that they leave out (None when nothing was left out). `table` is the
    aggregated table the report's summary is formatted from (harness/report/tables.py full_table), when known."""
    from rich.console import Console

    summary = formatted_summary(summary_table(runs) if table is None else table)
    if summary.empty:
        return [], None
    groups = [c for c in GROUP_COLUMNS if c in summary.columns]
    columns = [c for c in summary.columns if c not in groups and c not in REPORT_ONLY]
    measure = Console(width=10_000, color_system=None)
    parts = list(summary.groupby(groups, sort=False)) if groups else [((), summary)]
    titles = {"Step": "{} step", "Batch": "batch {}"}  # the loop's values named, not bare
    titled = [(" · ".join(titles.get(g, "{}").format(v) for g, v in zip(groups, key if isinstance(key, tuple)
                                                                           else (key,))), part)
              for key, part in parts]
    chosen = None
    for kept, ranges in _layouts(columns):
        tables = [_table(title, part, kept, ranges) for title, part in titled]
        if all(measure.measure(t).maximum <= width for t in tables):
            chosen = kept, ranges, tables
            break
    if chosen is None:  # narrower than the narrowest layout: rich shortens the widest cells with "…"
        chosen = kept, ranges, tables
    kept, ranges, tables = chosen
    left_out = [c.lower().replace("mib", "MiB") for c in columns if c not in kept]
    notes = ([] if ranges or summary.get("Runs", pd.Series(["1"])).astype(str).eq("1").all()
             else ["interquartile ranges"]) + left_out
    footnote = f"The report also shows {', '.join(notes)}." if notes else None
    return tables, footnote


def print_summary(console, title: str, runs: pd.DataFrame, sentences: list[str],
                  table: pd.DataFrame | None = None, answer: str = "") -> None:
    """The answer (harness/report/answer.py), the summary tables, their footnote and the findings, fitted to
    `console`'s width."""
    tables, footnote = summary_tables(runs, console.width, table)
    console.print(title, markup=False)
    if answer:
        console.print(answer, markup=False, highlight=False)
    for table in tables:
        console.print(table)
    if footnote:
        console.print(footnote, markup=False)
    for sentence in sentences:  # "[min–max …]" and "[95% t …]" are the report's brackets, not rich markup
        console.print(f"- {sentence}", markup=False, highlight=False)
