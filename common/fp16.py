"""Framework-free numpy helpers of the numerics lab, shared by torch_impl/numerics.py and tf_impl/numerics.py.

float16's range, the non-finite check and the per-layer gradient statistics against it, so a
row from one framework can be compared with the same row from the other.
"""

from __future__ import annotations

import numpy as np

FP16_MIN_SUBNORMAL = 2.0**-24  # smallest positive float16; half of it and less rounds to zero
FP16_MIN_NORMAL = 2.0**-14  # below this float16 is subnormal: fewer significant bits
FP16_MAX = 65504.0  # largest finite float16; from 65520 up rounds to inf
LOG2_BINS = range(-40, 17)  # histogram bins of floor(log2|g|); values outside go to the edge bins


def nonfinite_kind(values: np.ndarray) -> str | None:
    """ "nan" if any value is NaN, else "inf" if any is infinite, else None."""
    values = np.asarray(values, dtype=np.float32)
    if np.isnan(values).any():
        return "nan"
    if np.isinf(values).any():
        return "inf"
    return None


def gradient_stats(layer: str, param: str, grad: np.ndarray, loss_scale: float) -> dict:
    """How one float32 gradient would fare in float16, unscaled and times loss_scale.

    The fractions are of the non-zero elements and come from actually rounding to float16:
    "flush" = becomes 0 (|g| <= 2**-25, half the smallest subnormal, rounds to 0), "subnormal" =
    becomes less than the smallest normal 2**-14 (zeros included: precision is lost or gone),
    "overflow" = becomes inf (|g| >= 65520, just above float16's max 65504).
    """
    magnitude = np.abs(np.asarray(grad, dtype=np.float64)).ravel()
    nonzero = magnitude[magnitude != 0]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        unscaled = nonzero.astype(np.float16)
        scaled = (nonzero * loss_scale).astype(np.float16)
        exponents = np.floor(np.log2(nonzero[~np.isnan(nonzero)]))
    bins = np.clip(exponents, LOG2_BINS[0], LOG2_BINS[-1]).astype(np.int64) - LOG2_BINS[0]
    counts = np.bincount(bins, minlength=len(LOG2_BINS))

    def fraction(mask: np.ndarray) -> float:
        return float(mask.sum() / len(nonzero)) if len(nonzero) else 0.0

    return {
        "layer": layer,
        "param": param,
        "elements": int(magnitude.size),
        "nonzero": int(len(nonzero)),
        "zero_fraction": float(1 - len(nonzero) / magnitude.size) if magnitude.size else 0.0,
        "flush_fraction_unscaled": fraction(unscaled == 0),
        "subnormal_fraction_unscaled": fraction(unscaled < FP16_MIN_NORMAL),
        "flush_fraction_scaled": fraction(scaled == 0),
        "subnormal_fraction_scaled": fraction(scaled < FP16_MIN_NORMAL),
        "overflow_fraction_scaled": fraction(np.isinf(scaled)),
        "loss_scale": float(loss_scale),
        "log2_hist": dict(zip(LOG2_BINS, counts.tolist())),
    }


def underflow_summary(rows: list[dict]) -> dict:
    """The whole model's fractions: each row weighted by its number of non-zero elements."""
    nonzero = sum(r["nonzero"] for r in rows)
    elements = sum(r["elements"] for r in rows)

    def overall(key: str) -> float:
        return sum(r[key] * r["nonzero"] for r in rows) / nonzero if nonzero else 0.0

    return {
        "elements": elements,
        "nonzero": nonzero,
        "zero_fraction": 1 - nonzero / elements if elements else 0.0,
        **{key: overall(key) for key in ("flush_fraction_unscaled", "subnormal_fraction_unscaled",
                                         "flush_fraction_scaled", "subnormal_fraction_scaled",
                                         "overflow_fraction_scaled")},
    }
