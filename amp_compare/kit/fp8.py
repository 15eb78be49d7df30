"""fp8 recipes in float64 numpy: the reference each framework's converted layers are checked against, and SQNR.

Each recipe of contract/fp8.py quantizes a tensor as: a scale from its amax (this step's for torchao, an amax
history's for Keras), the scaled tensor clipped to the format's largest value and rounded to the fp8 format
(ml_dtypes' float8 types, round to nearest even), then scaled back. `linear_reference` is one converted layer's
three matmuls (output, input gradient, kernel gradient) from the quantized operands, accumulated in float64, so
a live layer that reproduces it to float32 rounding ran its own recipe. `sqnr_db` is the quantization error the
report shows per layer. Framework-free: numpy and ml_dtypes only (TensorFlow and JAX install ml_dtypes).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from amp_compare.contract.fp8 import FP8_MAX, Recipe

EPS = 1e-12  # torchao's floor under an amax of zero (float8_utils.EPS)


def fp8_round(x: np.ndarray, fmt: str) -> np.ndarray:
    """x (already scaled) clipped to the format's range and rounded to it, back as float64."""
    limit = FP8_MAX[fmt]
    return np.clip(x, -limit, limit).astype(getattr(ml_dtypes, fmt)).astype(np.float64)


def dynamic_scale(x: np.ndarray, fmt: str, axis: int | None = None, power_of_2: bool = False) -> np.ndarray:
    """torchao's scale (multiply convention): fmax / amax of x (over `axis`, kept; None: the whole tensor),
    computed in float64 and held in float32; rounded down to a power of two when the recipe says so."""
    amax = np.max(np.abs(x.astype(np.float64)), axis=axis, keepdims=axis is not None)
    scale = (FP8_MAX[fmt] / np.maximum(amax, EPS)).astype(np.float32)
    return np.exp2(np.floor(np.log2(scale))).astype(np.float32) if power_of_2 else scale



def quantize(x: np.ndarray, fmt: str, scale, convention: str) -> np.ndarray:
    """x quantized to fmt with a scale and dequantized (float64). The scaled value is formed in float32, as the
    frameworks do; multiply: round(x * scale) / scale (torchao); divide: round(x / scale) * scale (Keras)."""
    x32, s32 = np.asarray(x, np.float32), np.asarray(scale, np.float32)
    if convention == "multiply":
        return fp8_round((x32 * s32).astype(np.float64), fmt) / s32.astype(np.float64)
    return fp8_round((x32 / s32).astype(np.float64), fmt) * s32.astype(np.float64)


def _dynamic(recipe: Recipe, x: np.ndarray, role: str, axis: int) -> np.ndarray:
    fmt = recipe.format_of[role]
    scale = dynamic_scale(x, fmt, axis if recipe.granularity == "row" else None, recipe.power_of_2_scales)
    return quantize(x, fmt, scale, recipe.scale_convention)


def linear_reference(recipe: Recipe, x: np.ndarray, kernel: np.ndarray, grad_output: np.ndarray,
                     scales: dict | None = None) -> dict[str, np.ndarray]:
    """One converted layer's matmuls in float64 from its recipe's quantized operands.

    x: (tokens, in), kernel: (in, out) (Keras' layout; torch's weight transposed), grad_output: (tokens, out).
    scales: the delayed recipe's live scales per role (Keras' variables before the step); None: dynamic.
    Returns "output" (without bias), "grad_input" (tokens, in) and "grad_kernel" (in, out).
    """
    if recipe.scaling == "delayed":
        q = {role: quantize(t, recipe.format_of[role], scales[role], recipe.scale_convention)
             for role, t in (("input", x), ("kernel", kernel), ("grad_output", grad_output))}
        return {"output": q["input"] @ q["kernel"], "grad_input": q["grad_output"] @ q["kernel"].T,
                "grad_kernel": q["input"].T @ q["grad_output"]}
    # torchao: each matmul casts its own operands, rowwise along the axis that matmul reduces over
    return {"output": _dynamic(recipe, x, "input", -1) @ _dynamic(recipe, kernel, "kernel", 0),
            "grad_input": _dynamic(recipe, grad_output, "grad_output", -1) @ _dynamic(recipe, kernel, "kernel", -1).T,
            "grad_kernel": _dynamic(recipe, x, "input", 0).T @ _dynamic(recipe, grad_output, "grad_output", 0)}


def role_quantized(recipe: Recipe, role: str, t: np.ndarray, scale=None) -> np.ndarray:
    """A tensor as the recipe quantizes it for the forward (input, kernel) or the input gradient (grad_output):
    the live scale for the delayed recipe, this tensor's own for a dynamic one."""
    if recipe.scaling == "delayed":
        return quantize(t, recipe.format_of[role], scale, recipe.scale_convention)
    return _dynamic(recipe, t, role, 0 if role == "kernel" else -1)


def sqnr_db(reference: np.ndarray, quantized: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum x^2 / sum (x - q)^2); inf when exact."""
    ref = np.asarray(reference, np.float64)
    noise = float(np.sum((ref - np.asarray(quantized, np.float64)) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0.0:
        return float("inf")
    return 10.0 * float(np.log10(signal / noise)) if signal > 0 else float("-inf")


def sqnr_rows(recipe: Recipe, layer: str, tensors: dict[str, np.ndarray], scales: dict | None, when: str,
              step: int) -> list[dict]:
    """The report's per-layer rows: SQNR of each role's tensor as the recipe quantizes it, against float32.
    tensors: {"input", "kernel" (in, out), "grad_output"} as 2-D float32 arrays."""
    rows = []
    for role in ("input", "kernel", "grad_output"):
        t = tensors[role]
        q = role_quantized(recipe, role, t, None if scales is None else scales[role])
        rows.append({"layer": layer, "role": role, "format": recipe.format_of[role], "when": when, "step": step,
                     "amax": float(np.max(np.abs(t))), "sqnr_db": sqnr_db(t, q),
                     "zero_share": float(np.mean((q == 0) & (t != 0)))})
    return rows

