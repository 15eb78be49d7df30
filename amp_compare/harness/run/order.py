"""The order cells run in: interleaved so that a slow drift of the machine does not land in a ratio.

Speed ratios compare cells that run one after another. If fp32 always ran first and bf16 last,
any change of load during a seed's cells (another process starting, thermal throttling) would
bias every ratio the same way. `interleaved_order` keeps cells of one model/dataset together and
runs their seeds (the repeats) one after another, but rotates the precision order with each seed
(seed i starts with precision i mod P: a Latin square over precisions and repeat positions), so
across repeats every precision runs in every position equally often and a linear drift cancels
out of the medians. Frameworks stay in their display order inside each precision (ratios are
within a framework; the first cell of a seed also makes the shared initial weights). A pure
function: the same matrix always runs in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

from amp_compare.contract.config import RunConfig


def interleaved_order(cells: Sequence[RunConfig]) -> list[RunConfig]:
    groups: dict[tuple, list[RunConfig]] = {}
    for cfg in cells:
        groups.setdefault((cfg.model, cfg.dataset), []).append(cfg)
    out = []
    for group in groups.values():
        seeds = list(dict.fromkeys(c.seed for c in group))
        precisions = list(dict.fromkeys(c.precision for c in group))
        # each (seed, precision): its frameworks, step loops and batch sizes in the matrix's own order
        index: dict[tuple, list[RunConfig]] = {}
        for c in group:
            index.setdefault((c.seed, c.precision), []).append(c)
        for i, seed in enumerate(seeds):
            k = i % len(precisions)
            for precision in precisions[k:] + precisions[:k]:
                out += index.get((seed, precision), [])
    assert len(out) == len(cells), "interleaved_order lost or duplicated a cell"
    return out
