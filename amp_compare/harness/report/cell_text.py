"""The words several report modules share: the ⚠ mark beside a ratio the run cannot support and a paired accuracy
change in words (accuracy_text)."""

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


def accuracy_text(r) -> str:
    """A mixed cell's accuracy change, worded from its paired test: never a difference without its interval."""
    if getattr(r, "budget_note", ""):
        return f"not comparable ({r.budget_note})"
    if getattr(r, "too_short", ""):
        return "not comparable (run too short)"
    p = getattr(r, "p_value", np.nan)
    if not np.isfinite(p):
        return "no paired test (no per-image results)"
    ptext, kind = f"p = {p:.2g}", accuracy_interval_kind(getattr(r, "test", ""))
    if getattr(r, "test", "") == stats.NO_DIFFERENCE:  # no test ran, so there is no p to print
        return f"classified every image right or wrong exactly as fp32 did ({kind} ±{r.ci_high:.1f} pp)"
    if not stats.detectable({"p_value": p, "ci_low": r.ci_low, "ci_high": r.ci_high}):
        return (f"no detectable difference ({r.diff_pp:+.1f} pp [{kind} {pp_bound(r.ci_low)}, {pp_bound(r.ci_high)}], "
                f"{ptext})")
    if r.diff_pp < 0:
        return f"lower by {-r.diff_pp:.1f} pp [{kind} {-r.ci_high:.1f}, {-r.ci_low:.1f}] ({ptext})"
    return f"higher by {r.diff_pp:.1f} pp [{kind} {r.ci_low:.1f}, {r.ci_high:.1f}] ({ptext})"


def accuracy_interval_kind(test) -> str:
    """What an accuracy change's bracket is, from the test that made it."""
    test = str(test or "")
    if test == stats.NO_DIFFERENCE:
        return "exact 95% bound"
    return "95% bootstrap" if test.startswith("paired bootstrap") else "95% Newcombe" if test.startswith("McNemar") \
        else "95%"
