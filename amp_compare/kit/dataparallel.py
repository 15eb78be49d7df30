"""What both frameworks' data-parallel modules share (framework-free): the numerics lab's place in a --replicas run.

The numerics lab (dtype audit, gradient underflow, the NaN/Inf locator, the Adam gap) measures a cell's arithmetic on
its raw model outside the timed loop. An N-worker cell trains the same model in the same precision as its 1-worker
cell, which runs the lab; the report's numerics sections read the 1-worker cells only (harness/report/dataparallel.py).
So an N-worker cell's train() takes `NumericsInOneWorkerCell` as its numerics module (`numerics_for`, called by
both train.py's): it measures nothing and says so (TensorFlow's mirrored variables could not even be differentiated
outside the strategy's replica context).
"""

from __future__ import annotations

WHERE = "measured in the 1-worker cell of this configuration (an N-worker cell runs the same arithmetic)"


class NumericsInOneWorkerCell:
    """The numerics module of an N-worker cell: no rows, and the locator's answer names where to look."""

    @staticmethod
    def dtype_audit(*args, **kwargs) -> list[dict]:
        return []

    @staticmethod
    def gradient_underflow(*args, **kwargs) -> list[dict]:
        return []

    @staticmethod
    def adam_formula_gap(*args, **kwargs) -> dict:
        return {}

    @staticmethod
    def locate_nonfinite(*args, **kwargs) -> dict:
        return {"where": f"not located here: {WHERE}", "layer": "", "value": ""}


def numerics_for(cfg, numerics):
    """The numerics module a cell measures with: the framework's own, or for an N-worker cell none."""
    return numerics if cfg.replicas == 1 else NumericsInOneWorkerCell
