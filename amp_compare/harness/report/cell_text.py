"""The words of one table cell that both the statistics tables (tables.py) and the findings (findings.py) use:
the ⚠ mark beside a ratio the run cannot support, and the table's short form of a paired accuracy change."""

from __future__ import annotations

import numpy as np

from amp_compare.harness.report import stats


def mark(note) -> str:
    return " ⚠" if isinstance(note, str) and note else ""


def pp_bound(value: float) -> str:
    """One end of an accuracy interval in percentage points: an end at exactly 0 prints as 0 (the interval
    includes no change), one that rounds to ±0.0 without being 0 gets a digit more (+0.03). A bootstrap over one
    differing image ends at exactly 0, and "+0.0" read as if it excluded zero."""
    if value == 0:
        return "0"
    return f"{value:+.2f}" if abs(value) < 0.05 else f"{value:+.1f}"


def short_accuracy_text(r) -> str:
    """The table's form of accuracy_text: the change with its interval, or why there is none."""
    if getattr(r, "budget_note", ""):
        return "not compared (speed budget) ⚠"
    if getattr(r, "too_short", ""):
        return "too short ⚠"  # the run is too short to judge (accuracy_text says so in words)
    if not np.isfinite(getattr(r, "p_value", np.nan)):
        return "n/a"
    mark = "" if stats.detectable({"p_value": r.p_value, "ci_low": r.ci_low, "ci_high": r.ci_high}) else " (n.s.)"
    kind = accuracy_interval_kind(getattr(r, "test", ""))
    return f"{r.diff_pp:+.1f} [{kind} {pp_bound(r.ci_low)}, {pp_bound(r.ci_high)}] pp{mark}"


def interval_kind(basis: str, seeds) -> str:
    """What a ratio's bracket is, said inside it: "95% t over 3 seeds", or with one seed that it covers the noise
    between that seed's steps only (batch means), not how the ratio varies from seed to seed."""
    if basis == "seeds":
        return f"95% t over {int(seeds)} seeds"
    return "95% batch means: step-to-step noise within one seed's two cells only" if basis == "steps" else "95%"


def accuracy_interval_kind(test) -> str:
    """What an accuracy change's bracket is, from the test that made it."""
    test = str(test or "")
    if test == stats.NO_DIFFERENCE:
        return "exact 95% bound"
    return "95% bootstrap" if test.startswith("paired bootstrap") else "95% Newcombe" if test.startswith("McNemar") \
        else "95%"


def ratio_number(value: float, basis: str = "seeds") -> str:
    """A speed ratio's number: three significant digits where it rests on one seed's steps ("0.162"), so a
    narrow one-seed interval does not print as "0.16–0.16"; two decimals otherwise."""
    if not np.isfinite(value) or value <= 0:
        return "n/a"
    if basis != "steps":
        return f"{value:.2f}"
    return f"{value:.{max(0, 2 - int(np.floor(np.log10(value))))}f}"
