"""What a compare prints when it ends: the answer, per model a table of short verdicts, and where the report is."""

from __future__ import annotations

HEADERS = {"speed": "Speed", "memory": "Memory", "accuracy": "Accuracy", "time_to_target": "To target"}
# what the short headers' ratios are multiples of (the page's headers say it in each column: phrases.HEADER)
LEGEND = "Speed: × fp32's speed (<1×: slower). To target: × fp32's time (>1×: slower)."


def print_summary(console, title: str, rendered) -> None:
    """The answer, a table of short verdicts per model and the report's path (render.Rendered) on `console`."""
    from rich import box
    from rich.table import Column, Table
    from rich.text import Text

    from amp_compare.harness.report.phrases import HEADER
    from amp_compare.harness.report.phrases import table as verdict_table

    plain = {"markup": False, "highlight": False}
    console.print(title, markup=False)
    if rendered.answer:
        console.print(rendered.answer, **plain)
    for (model, dataset), part in (models := rendered.verdicts.groupby(["model", "dataset"], sort=False)):
        t = Table(*(Column(col, no_wrap=True) for col in ["Cells", *HEADERS.values()]), title=f"{model} on {dataset}",
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  title_justify="left")  # no blank edge lines: the answer fits 80x40
        for row in verdict_table(part, short=True)[["Cells", *(HEADER[m] for m in HEADERS)]].itertuples(index=False):
            t.add_row(*map(Text, row))  # Text: "[…]" is no rich markup
        console.print(t)
    if models.ngroups:
        console.print(LEGEND, **plain)
        cells, trial = rendered.conditions
        if cells:
            console.print(f"Speed from the speed trials ({trial}); to target from the training cells ({cells}).",
                          **plain)
    console.print(f"Report: {rendered.index}", soft_wrap=True, **plain)
