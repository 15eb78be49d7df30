"""How far the machine's own speed drifted during a run, judged robustly from its calibration checks, and
whether that drift could explain a speed ratio.

A VM changes speed by itself: 40 back-to-back checks in an idle process read 3.9 ms for 15 checks, then
5.3-6.2 ms. Taking the worst check (or max/min of all of them) then marks every ratio of every run. So:

- the run's level is the median of the checks, its spread their median absolute deviation (MAD, on the log
  scale, times 1.4826: a standard deviation that a few odd checks do not move);
- a check far above that median (STALL times it, or STALL_MADS typical check-to-check moves above it, whichever
  is further) is a stall: the machine stopped for a while, and the cells either side of that check (the one it
  followed, the one that followed it) may have stalled with it. A seed's ratio of such a cell is not supported
  where the stall could explain it: the seed's band (below) with the stalled check among the neighbouring checks
  holds its ratio (stall_note names the cell and asks for a re-run); a 4x stall cannot make an 8x slowdown. A
  stall never counts as the machine's level (it is not set aside as a harmless hiccup, and a normal check is
  never set aside because its neighbours moved);
- a check reads the machine after some framework's cell, and its level depends on that framework (a check read
  higher after TensorFlow cells than after PyTorch ones), so drift is judged only between checks that follow
  cells of the same framework: how far the machine moves (`step`) is the MAD of the changes from one such check to
  the next; a cell's neighbouring checks are the one after it and the one before it where that one follows a cell
  of the same framework;
- between a mixed cell and the fp32 cell it is compared with, the machine alone could have produced any speed
  ratio from the lowest to the highest quotient of their neighbouring checks (1 included), widened by
  K_STEPS x step either way: that is the seed's drift band.

A speed ratio is supported against drift when every seed's ratio lies outside its band; otherwise its ⚠ note
names the seeds whose band holds their ratio (seeds that disagree on the side of 1 leave the interval
including 1: stats.ratio_verdict marks that). The check (a numpy matmul in the parent) measures the machine
between cells, not a cell's own kernels: the band bounds what a machine-wide slowdown of the size seen could do,
nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from amp_compare.contract.config import FRAMEWORKS
from amp_compare.harness.common import REPS_PER_ROUND, ROUNDS, SIZE

MAD_TO_SD = 1.4826  # MAD x this estimates a normal standard deviation
WIDE_BAND = 4.0  # a seed's band wider than this end to end: the machine moved too much there to judge any ratio
K_STEPS = 3.0  # a band is the neighbouring checks' change widened by this many typical check-to-check moves
STALL = 3.0  # a check this many times the run's median check is a stall (normal VM drift stayed within 1.7x)...
STALL_MADS = 5.0  # ...or this many robust spreads above the median, whichever is further


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


def followed(when: str) -> str:
    """The cell a check followed ("after <cell-id>"), "" for the check before the matrix (or an old record)."""
    return when[len("after "):] if when.startswith("after ") else ""


def framework_of(cell_id: str) -> str:
    """The framework a cell id starts with (contract/config.py names cells "<framework>-<model>-…"), "" if none."""
    return next((f for f in sorted(FRAMEWORKS, key=len, reverse=True) if cell_id.startswith(f + "-")), "")


def _log_mad(values: np.ndarray) -> float:
    return MAD_TO_SD * float(np.median(np.abs(values - np.median(values)))) if values.size else 0.0


@dataclass
class Drift:
    """The machine's drift over a run, from its calibration checks (milliseconds, time order)."""
    ms: np.ndarray  # as recorded
    whens: list[str]  # each check's "when" ("before the matrix", "after <cell-id>", …)
    median_ms: float
    spread: float  # MAD of the log checks x 1.4826: their robust relative spread
    step: float  # MAD of the log changes between successive checks after one framework's cells x 1.4826
    stall: np.ndarray  # per check: True where it is a stall (far above the median)
    stall_factor: float = STALL  # a check above the median times this is a stall

    @property
    def floor(self) -> float:
        """The unseen drift a band allows for either way (log scale): K_STEPS typical check-to-check moves."""
        return K_STEPS * self.step

    @property
    def kept(self) -> np.ndarray:
        """The checks that read the machine's level (stalls left out)."""
        return self.ms[~self.stall]

    @property
    def low_ms(self) -> float:
        return float(self.kept.min())

    @property
    def high_ms(self) -> float:
        return float(self.kept.max())

    @property
    def frameworks(self) -> list[str]:
        """Per check, the framework of the cell it followed ("" before the matrix)."""
        return [framework_of(followed(w)) for w in self.whens]

    def stalled_cells(self) -> dict[str, float]:
        """Each cell next to a stall (the cell the stalled check followed, and the next one) -> that check's ms."""
        out: dict[str, float] = {}
        cells = [followed(w) for w in self.whens] + [""]
        for i in np.flatnonzero(self.stall):
            for cell in (cells[i], cells[i + 1]):
                if cell:
                    out[cell] = max(out.get(cell, 0.0), float(self.ms[i]))
        return out

    def window(self, cell_id: str, stalls: bool = False) -> list[float]:
        """A cell's neighbouring checks: the one after it, and the one before it where that one follows a cell of
        the same framework; every kept check where the records do not say which check followed the cell. Stalls
        are left out (stall_note speaks for them), or with `stalls` kept in, the one before the cell whatever
        framework it followed (stalled_cells names the cell after a stall as next to it)."""
        name = f"after {cell_id}"
        if name not in self.whens:
            return [float(v) for v in self.kept]
        i, fws = self.whens.index(name), self.frameworks
        near = [j for j in (i - 1, i) if j >= 0 and (stalls or not self.stall[j])
                and (j == i or fws[j] == fws[i] or (stalls and self.stall[j]))]
        return [float(self.ms[j]) for j in near] or [float(v) for v in self.kept]

    def band(self, fp32_cell: str, mixed_cell: str, stalls: bool = False) -> tuple[float, float]:
        """The speed ratios (mixed over fp32) the machine's drift alone could have produced between these two
        cells: a cell whose checks took longer ran on a slower machine. stalls: a stalled check next to either
        cell counts among its checks (what the stall, with the drift, could have produced)."""
        a, b = self.window(fp32_cell, stalls), self.window(mixed_cell, stalls)
        quotients = [x / y for x in a for y in b] + [1.0]
        widen = float(np.exp(self.floor))
        return min(quotients) / widen, max(quotients) * widen


def _step(logs: np.ndarray, fws: list[str], stall: np.ndarray) -> float:
    """The typical move between successive kept checks that follow cells of the same framework (every successive
    pair where no check names its cell's framework)."""
    moves = []
    for fw in dict.fromkeys(fws) if any(fws) else [None]:
        seq = logs[[j for j, f in enumerate(fws) if not stall[j] and (fw is None or (f == fw and f))]]
        moves += list(np.abs(np.diff(seq)))
    return MAD_TO_SD * float(np.median(moves)) if moves else 0.0


def drift_of(environment: dict) -> Drift | None:
    """The run's drift from its checks (None: fewer than two checks recorded)."""
    checks = checks_of(environment)
    if len(checks) < 2:
        return None
    ms = np.array([float(c["ms"]) for c in checks])
    whens = [str(c.get("when", "")) for c in checks]
    logs = np.log(ms)
    median, spread = float(np.median(ms)), _log_mad(logs)
    fws = [framework_of(followed(w)) for w in whens]
    # the limit scales with the typical move (robust to the stalls it is to find), not with the level's spread: a
    # machine that runs at two levels has a wide spread, yet a check 8x its median is still a stall
    rough = _step(logs, fws, np.zeros(ms.size, bool)) if ms.size > 2 else 0.0
    factor = max(STALL, float(np.exp(STALL_MADS * rough)))
    stall = ms > median * factor
    step = _step(logs, fws, stall) if ms.size > 2 else 0.0
    return Drift(ms, whens, median, spread, step, stall, factor)


def stall_note(drift: Drift | None, pairs: list[tuple[str, str, float, int]], time: bool = False) -> str:
    """"" unless, in some seed, a cell of the ratio (its fp32 or mixed cell) ran next to a stall and the stall could
    explain that seed's ratio: the seed's band with the stalled check among its checks (Drift.band, stalls=True)
    holds it. Then the ⚠ note naming each such cell, the check that caught the stall and the seed's band, and
    asking for a re-run. pairs: (fp32 cell, mixed cell, that seed's speed ratio, seed), as seed_note's; time: as
    seed_note's (the ratio and band quoted as time ratios)."""
    stalled = drift.stalled_cells() if drift is not None else {}
    hit: dict[str, float] = {}
    seeds = []
    for a, b, r, seed in pairs:
        near = [c for c in (a, b) if c in stalled]
        if not near or not np.isfinite(r):
            continue
        low, high = drift.band(a, b, stalls=True)
        if low <= r <= high:
            hit.update({c: stalled[c] for c in near})
            seeds.append((seed, 1 / r, 1 / high, 1 / low) if time else (seed, r, low, high))
    if not hit:
        return ""
    which = "; ".join(f"{c} ran next to a calibration check of {ms:,.0f} ms" for c, ms in hit.items())
    bands = ", ".join(f"seed {s}: {r:.2f}× within {lo:.2f}–{hi:.2f}×" for s, r, lo, hi in seeds)
    return (f"stalled cell: {which} (the run's median check: {drift.median_ms:.1f} ms), a stall that could explain "
            f"the ratio ({bands}), so it is not supported; re-run {'that cell' if len(hit) == 1 else 'those cells'}")


def seed_note(drift: Drift | None, pairs: list[tuple[str, str, float, int]], ratio: float, time: bool = False) -> str:
    """"" when drift cannot explain `ratio` (the geometric mean of the seeds' speed ratios): no seed's ratio lies
    inside its band. Otherwise the ⚠ note, naming the seeds whose drift could explain theirs. pairs: (fp32 cell,
    mixed cell, that seed's speed ratio, seed). Seeds on both sides of 1 are the interval's concern
    (stats.ratio_verdict). time: the note sits beside a time ratio (mixed's time over fp32's, the inverse of the
    speed ratio), so it quotes each seed's ratio and band that way round too."""
    if drift is None or not np.isfinite(ratio) or not pairs:
        return ""
    inside = []
    for a, b, r, seed in pairs:
        low, high = drift.band(a, b)
        if np.isfinite(r) and low <= r <= high:  # a seed beyond its band on 1's other side is the interval's case
            inside.append((seed, 1 / r, 1 / high, 1 / low) if time else (seed, r, low, high))
    if not inside:
        return ""
    seeds = ", ".join(f"seed {s}: {r:.2f}× within {lo:.2f}–{hi:.2f}×" for s, r, lo, hi in inside)
    if all(hi / lo > WIDE_BAND for _, _, lo, hi in inside):  # such a band would hold almost any ratio
        return (f"machine drift could explain it: the machine moved too much next to these cells to judge any ratio "
                f"from them (bands wider than {WIDE_BAND:g}× end to end: {seeds})")
    return f"machine drift could explain it ({seeds})"


def run_note(environment: dict, limit: float) -> str:
    """A run-wide note where the machine's level (stalls left out) moved by more than `limit` over the run
    ("" otherwise): for comparisons of cells that the per-seed bands do not cover."""
    d = drift_of(environment)
    if d is None or d.high_ms / d.low_ms - 1 <= limit:
        return ""
    return f"machine speed changed by {d.high_ms / d.low_ms - 1:.0%} between cells"


def _stalls_sentence(d: Drift) -> str:
    if not d.stall.any():
        return ""
    values = ", ".join(f"{m:,.0f}" for m in d.ms[d.stall])
    cells = ", ".join(d.stalled_cells())
    n = int(d.stall.sum())
    return (f" {n} check{'s' if n != 1 else ''} ({values} ms) read more than {d.stall_factor:.1f}× "
            f"the median: the machine stalled there, so the cells next to {'them' if n != 1 else 'it'} ({cells}) "
            "may have stalled too; a ratio of theirs is marked ⚠ (re-run the cell) where the stall, counted among the "
            "checks next to its cells, could explain it. Stalls are left out of the level below.")


def describe(environment: dict) -> str | None:
    """The drift in one sentence, with what it does to the speed ratios; None with fewer than two checks."""
    d = drift_of(environment)
    if d is None:
        return None
    listed = isinstance(environment.get("calibrations"), list) and environment["calibrations"]
    where = "before the matrix and after each cell" if listed else "before and after the matrix"
    by_framework = any(d.frameworks)
    return (f"Machine drift: {len(d.ms)} calibration checks, {where}, in the parent process while no cell ran; "
            f"each check times {ROUNDS} rounds of {REPS_PER_ROUND} products of a fixed {SIZE}×{SIZE} float32 matmul "
            f"and reads its median round. The median check took {d.median_ms:.1f} ms.{_stalls_sentence(d)} "
            f"{'The other checks' if d.stall.any() else 'The checks'} read {d.low_ms:.1f}–{d.high_ms:.1f} ms; "
            f"their robust spread (the median absolute deviation of their logarithms, times {MAD_TO_SD} to estimate "
            f"a standard deviation) was a factor of {np.exp(d.spread):.2f} and the machine typically moved by a "
            f"factor of {np.exp(d.step):.2f} (the same, of the changes between checks) from one check to the next"
            + (" of the same framework (only checks that follow the same framework's cells are compared, so a "
               "difference between the frameworks' cells is not counted as the machine's; with few checks, one "
               "move sets this figure)" if by_framework else "")
            + f". A speed ratio is marked ⚠ for drift only where, in some seed, the change between the checks next "
            f"to its two cells, widened {K_STEPS:.0f} typical moves either way (a factor of {np.exp(d.floor):.2f}), "
            "could have produced it; a ratio outside that band in every seed stands on this machine.")
