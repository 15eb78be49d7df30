"""Framework-free numpy helpers of the numerics lab, shared by torch_impl/numerics.py and keras_impl/numerics.py.

float16's range, the non-finite check and the per-layer gradient statistics against it, so a
row from one framework can be compared with the same row from the other.
"""

from __future__ import annotations

import numpy as np

FP16_MIN_SUBNORMAL = 2.0**-24  # smallest positive float16
FP16_ROUNDS_TO_ZERO = 2.0**-25  # half the smallest subnormal: |x| at or below it rounds to 0 (ties to even)
FP16_MIN_NORMAL = 2.0**-14  # below this float16 is subnormal: fewer significant bits
FP16_MAX = 65504.0  # largest finite float16; from 65520 up rounds to inf
FP16_EXP_LIMIT = float(np.log(FP16_MAX))  # exp(x) overflows float16 past this (~11.09)
FP32_EXP_LIMIT = float(np.log(np.finfo(np.float32).max))  # ... and float32 and bfloat16 past this (~88.72)
LOG2_BINS = range(-40, 17)  # histogram bins of floor(log2|g|); values outside go to the edge bins


def nonfinite_kind(values: np.ndarray) -> str | None:
    """ "nan" if any value is NaN, else "inf" if any is infinite, else None."""
    values = np.asarray(values, dtype=np.float32)
    if np.isnan(values).any():
        return "nan"
    if np.isinf(values).any():
        return "inf"
    return None


# How gradient_underflow measures, the same in both frameworks (tests/test_numerics.py holds both to it):
# the float32 reference gradient (forward and backward in float32, as if mixed precision were off) is
# rounded to float16 to count what *would* flush, and the real mixed backward (forward and backward
# under the run's precision, unscaled and at the scale in use) is read for exact zeros, to count what
# *did* underflow on the way. Both numbers, both frameworks: a row says which method it holds.
UNDERFLOW_METHOD = "float32 reference rounded to float16; mixed backward exact zeros"


def gradient_stats(layer: str, param: str, grad: np.ndarray, loss_scale: float,
                   mixed: np.ndarray | None = None, mixed_scaled: np.ndarray | None = None) -> dict:
    """How one gradient fares in float16, by the two methods of UNDERFLOW_METHOD.

    grad: the float32 reference gradient (forward and backward in float32) of the unscaled loss.
    The would-flush fractions are of its non-zero elements and come from actually rounding it to
    float16: "flush" = becomes 0 (|g| <= 2**-25, half the smallest subnormal, rounds to 0),
    "subnormal" = becomes less than the smallest normal 2**-14 (zeros included: precision is lost or
    gone), "overflow" = becomes inf (|g| >= 65520, just above float16's max 65504); unscaled and
    times loss_scale.
    mixed / mixed_scaled: the same parameter's gradient from the real mixed backward (forward and
    backward under the run's precision) of the unscaled loss / of loss * loss_scale (None: the
    reference itself, i.e. a float32 run). "lost" = the share of the reference's non-zero elements
    that came out exactly zero there: underflowed inside the half-precision backward, where no
    rounding of a float32 gradient can show it. Zeros are classified once, here (mixed_zero_kinds):
    an element the reference holds as exactly 0 is cancellation, never a loss; and since scaling
    up cannot underflow, an element zero at the scale but not in the unscaled backward is
    "cancelled" (float16 arithmetic summed it to 0), so the scaled "lost" count never exceeds
    the unscaled one.
    """
    magnitude = np.abs(np.asarray(grad, dtype=np.float64)).ravel()
    nonzero_mask = magnitude != 0
    nonzero = magnitude[nonzero_mask]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        unscaled = nonzero.astype(np.float16)
        scaled = (nonzero * loss_scale).astype(np.float16)
        exponents = np.floor(np.log2(nonzero[~np.isnan(nonzero)]))
    bins = np.clip(exponents, LOG2_BINS[0], LOG2_BINS[-1]).astype(np.int64) - LOG2_BINS[0]
    counts = np.bincount(bins, minlength=len(LOG2_BINS))

    def fraction(mask: np.ndarray) -> float:
        return float(mask.sum() / len(nonzero)) if len(nonzero) else 0.0

    mixed_zero = _exact_zeros(mixed, nonzero_mask, f"{layer}.{param}")
    scaled_zero = _exact_zeros(mixed if mixed_scaled is None else mixed_scaled, nonzero_mask, f"{layer}.{param}")
    kinds = mixed_zero_kinds(nonzero_mask, mixed_zero, scaled_zero)
    return {
        "layer": layer,
        "param": param,
        "method": UNDERFLOW_METHOD,
        "elements": int(magnitude.size),
        "nonzero": int(len(nonzero)),
        "zero_fraction": float(1 - len(nonzero) / magnitude.size) if magnitude.size else 0.0,
        "flush_fraction_unscaled": fraction(unscaled == 0),
        "subnormal_fraction_unscaled": fraction(unscaled < FP16_MIN_NORMAL),
        "flush_fraction_scaled": fraction(scaled == 0),
        "subnormal_fraction_scaled": fraction(scaled < FP16_MIN_NORMAL),
        "overflow_fraction_scaled": fraction(np.isinf(scaled)),
        "zero_fraction_mixed": float(mixed_zero.mean()) if magnitude.size else 0.0,
        "lost_fraction_mixed_unscaled": fraction(kinds["lost_unscaled"][nonzero_mask]),
        "lost_fraction_mixed_scaled": fraction(kinds["lost_scaled"][nonzero_mask]),
        "cancelled_fraction_mixed_scaled": fraction(kinds["cancelled_scaled"][nonzero_mask]),
        "loss_scale": float(loss_scale),
        "log2_hist": dict(zip(LOG2_BINS, counts.tolist())),
    }


def _exact_zeros(values: np.ndarray | None, reference_nonzero: np.ndarray, name: str) -> np.ndarray:
    """Exact zeros of a gradient of the reference's shape (flattened); the reference's own zeros for None."""
    if values is None:
        return ~reference_nonzero
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.shape != reference_nonzero.shape:
        raise ValueError(f"{name}: mixed gradient has {values.size} elements, the reference {reference_nonzero.size}")
    return values == 0


def mixed_zero_kinds(reference_nonzero: np.ndarray, unscaled_zero: np.ndarray,
                     scaled_zero: np.ndarray) -> dict[str, np.ndarray]:
    """Each exact zero of the mixed backward, by cause (boolean masks over the elements):

    - lost_unscaled: the reference is not 0 and the unscaled mixed backward gave 0 (underflow on the way);
    - lost_scaled: the same at the scale, and also lost unscaled: scaling up cannot make an underflow, so an
      element lost at the scale is one lost without it as well;
    - cancelled_scaled: the reference is not 0, the scaled backward gave 0 and the unscaled one did not: a sum
      float16 arithmetic cancelled to 0 at that magnitude, not an underflow.
    A reference of exactly 0 is the gradient's own cancellation: in none of them."""
    lost_unscaled = reference_nonzero & unscaled_zero
    return {"lost_unscaled": lost_unscaled, "lost_scaled": lost_unscaled & scaled_zero,
            "cancelled_scaled": reference_nonzero & scaled_zero & ~unscaled_zero}


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
        "zero_fraction_mixed": (sum(r["zero_fraction_mixed"] * r["elements"] for r in rows) / elements
                                if elements else 0.0),
        **{key: overall(key) for key in ("flush_fraction_unscaled", "subnormal_fraction_unscaled",
                                         "flush_fraction_scaled", "subnormal_fraction_scaled",
                                         "overflow_fraction_scaled", "lost_fraction_mixed_unscaled",
                                         "lost_fraction_mixed_scaled", "cancelled_fraction_mixed_scaled")},
    }
