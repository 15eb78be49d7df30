"""How far the machine's own speed drifted during a run, judged robustly from its calibration checks, and
whether that drift could explain a speed ratio.

A VM changes speed by itself: 40 back-to-back checks in an idle process read 3.9 ms for 15 checks, then
5.3-6.2 ms; one check in 25 may hit a 31 ms hiccup. Taking the worst check (or max/min of all of them) then
marks every ratio of every run. So:

- an isolated hiccup (a check far from both of its neighbours, which agree with each other) is set aside
  (replaced by its neighbours' mean); a lasting change is kept;
- the run's level is the median of the checks, its spread their median absolute deviation (MAD, on the log
  scale, times 1.4826: a standard deviation that one odd check does not move);
- how far the machine moves over one cell's time, seen or unseen (a cell runs between two checks), is the
  MAD of the changes from one check to the next (`step`), a lasting jump counting once;
- each cell is judged against its neighbouring checks, the one before it and the one after it. Between a
  mixed cell and the fp32 cell it is compared with, the machine alone could have produced any speed ratio
  from the lowest to the highest quotient of their neighbouring checks (1 included), widened by
  K_STEPS x step either way: that is the seed's drift band.

A speed ratio is supported against drift when every seed's ratio lies outside its band; otherwise its ⚠ note
names the seeds whose band holds their ratio (seeds that disagree on the side of 1 leave the interval
including 1: stats.ratio_verdict marks that). The check (a numpy matmul in the
parent) measures the machine between cells, not a cell's own kernels: the band bounds what a machine-wide
slowdown of the size seen could do, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from amp_compare.harness.common import SIZE

MAD_TO_SD = 1.4826  # MAD x this estimates a normal standard deviation
K_STEPS = 3.0  # a band is the neighbouring checks' change widened by this many typical check-to-check moves
HICCUP = 1.5  # a check this many times off both of its neighbours, which agree within it, is a hiccup


def checks_of(environment: dict) -> list[dict]:
    """Every check of a run in time order: its `calibrations` list, or (runs recorded before it) the
    before/after pair of its environment."""
    listed = environment.get("calibrations")
    if isinstance(listed, list) and listed:
        return [c for c in listed if isinstance(c, dict) and c.get("ms")]
    out = []
    for when in ("before", "after"):
        if environment.get(f"calibration_{when}_ms"):
            out.append({"when": when, "ms": float(environment[f"calibration_{when}_ms"]),
                        "spread": float(environment.get(f"calibration_{when}_spread", 0) or 0)})
    return out


def smoothed(ms: np.ndarray) -> np.ndarray:
    """The checks with each isolated hiccup replaced by its neighbours' mean: a check off both of its neighbours by
    more than HICCUP while they agree with each other within it. A lasting change, or a machine jumping about,
    is kept as it was recorded."""
    level = ms.astype(float).copy()
    odd = np.zeros(ms.size, bool)
    for i in range(1, ms.size - 1):
        a, m, b = ms[i - 1], ms[i], ms[i + 1]
        odd[i] = max(a, b) / min(a, b) <= HICCUP and min(max(m / a, a / m), max(m / b, b / m)) > HICCUP
    for i in np.flatnonzero(odd):
        if not odd[i - 1] and not odd[i + 1]:  # isolated: a machine that alternates is drifting, not hiccupping
            level[i] = (ms[i - 1] + ms[i + 1]) / 2
    return level


@dataclass
class Drift:
    """The machine's drift over a run, from its calibration checks (milliseconds, time order)."""
    ms: np.ndarray  # as recorded
    level: np.ndarray  # hiccups set aside (smoothed)
    whens: list[str]  # each check's "when" ("before the matrix", "after <cell-id>", …)
    median_ms: float
    spread: float  # MAD of the log checks x 1.4826: their robust relative spread
    step: float  # MAD of the log check-to-check changes x 1.4826: how far the machine moves over one cell
    hiccups: list[float]  # the checks set aside, in ms

    @property
    def floor(self) -> float:
        """The unseen drift a band allows for either way (log scale): K_STEPS typical check-to-check moves."""
        return K_STEPS * self.step

    @property
    def kept(self) -> np.ndarray:
        """The checks as recorded, hiccups left out."""
        return np.array([m for m in self.ms if m not in self.hiccups])

    @property
    def low_ms(self) -> float:
        return float(self.kept.min())

    @property
    def high_ms(self) -> float:
        return float(self.kept.max())

    def window(self, cell_id: str) -> list[float]:
        """A cell's neighbouring checks (the one before it, the one after it; hiccups set aside); every check
        where the records do not say which check followed the cell."""
        name = f"after {cell_id}"
        if name in self.whens:
            i = self.whens.index(name)
            return [float(v) for v in self.level[max(i - 1, 0):i + 1]]
        return [float(v) for v in self.level]

    def band(self, fp32_cell: str, mixed_cell: str) -> tuple[float, float]:
        """The speed ratios (mixed over fp32) the machine's drift alone could have produced between these two
        cells: a cell whose checks took longer ran on a slower machine."""
        a, b = self.window(fp32_cell), self.window(mixed_cell)
        quotients = [x / y for x in a for y in b] + [1.0]
        widen = float(np.exp(self.floor))
        return min(quotients) / widen, max(quotients) * widen


def drift_of(environment: dict) -> Drift | None:
    """The run's drift from its checks (None: fewer than two checks recorded)."""
    checks = checks_of(environment)
    if len(checks) < 2:
        return None
    ms = np.array([float(c["ms"]) for c in checks])
    level = smoothed(ms)
    hiccups = [float(m) for m, s in zip(ms, level) if m != s]
    logs = np.log(level)
    spread = MAD_TO_SD * float(np.median(np.abs(logs - np.median(logs))))
    step = MAD_TO_SD * float(np.median(np.abs(np.diff(np.log(ms))))) if ms.size > 2 else 0.0
    return Drift(ms, level, [str(c.get("when", "")) for c in checks], float(np.median(ms)), spread, step, hiccups)


def seed_note(drift: Drift | None, pairs: list[tuple[str, str, float, int]], ratio: float) -> str:
    """"" when drift cannot explain `ratio` (the geometric mean of the seeds' ratios): no seed's ratio lies inside
    its band. Otherwise the ⚠ note, naming the seeds whose drift could explain theirs. pairs: (fp32 cell, mixed
    cell, that seed's ratio, seed). Seeds on both sides of 1 are the interval's concern (stats.ratio_verdict)."""
    if drift is None or not np.isfinite(ratio) or not pairs:
        return ""
    inside = []
    for a, b, r, seed in pairs:
        low, high = drift.band(a, b)
        if np.isfinite(r) and low <= r <= high:  # a seed beyond its band on 1's other side is the interval's case
            inside.append((seed, r, low, high))
    if not inside:
        return ""
    seeds = ", ".join(f"seed {s}: {r:.2f}× within {lo:.2f}–{hi:.2f}×" for s, r, lo, hi in inside)
    return f"machine drift could explain it ({seeds})"


def run_note(environment: dict, limit: float) -> str:
    """A run-wide note where the machine's level (hiccups set aside) moved by more than `limit` over the run
    ("" otherwise): for comparisons of cells that the per-seed bands do not cover."""
    d = drift_of(environment)
    if d is None or d.high_ms / d.low_ms - 1 <= limit:
        return ""
    return f"machine speed changed by {d.high_ms / d.low_ms - 1:.0%} between cells"


def describe(environment: dict) -> str | None:
    """The drift in one sentence, with what it does to the speed ratios; None with fewer than two checks."""
    d = drift_of(environment)
    if d is None:
        return None
    listed = isinstance(environment.get("calibrations"), list) and environment["calibrations"]
    where = (f"{len(d.ms)} times, before the matrix and after each cell" if listed else
             "before and after the matrix")
    set_aside = (f"; {len(d.hiccups)} isolated hiccup{'s' if len(d.hiccups) != 1 else ''} "
                 f"({', '.join(f'{h:.1f}' for h in d.hiccups)} ms) set aside" if d.hiccups else "")
    return (f"Machine drift: a fixed {SIZE}×{SIZE} float32 matmul, timed {where}, took a median {d.median_ms:.1f} ms, "
            f"{d.low_ms:.1f}–{d.high_ms:.1f} ms over the run{set_aside}; its robust spread (median absolute "
            f"deviation) was a factor of {np.exp(d.spread):.2f} and it typically moved by a factor of "
            f"{np.exp(d.step):.2f} "
            f"from one check to the next. A speed ratio is marked ⚠ for drift only where, in some seed, the change "
            f"between the checks next to its two cells, widened {K_STEPS:.0f} typical moves either way (a factor of "
            f"{np.exp(d.floor):.2f}), "
            "could have produced it; a ratio outside that band in every seed stands on this machine.")
