"""The ViT's table of computed dtypes: per part, framework and mixed precision, the dtype its arithmetic read."""

from __future__ import annotations

import re

import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import framework_label as _label
from amp_compare.contract.config import ordered

# The parts of a vit, by canonical layer name (both audits name layers alike); "core" is the attention core:
# its ops are split into the matmuls (Q·Kᵀ, ·V) and the rest (the logits' scale and the softmax).
VIT_COMPONENTS = (
    ("LayerNorm", r"\.ln[12]$|^norm$", "all"),
    ("attention: Q/K/V/output projections", r"\.attn\.(?:query|key|value|out)$", "all"),
    ("Q·Kᵀ", r"\.attn$", "matmul"),
    ("softmax (with the logits' scale)", r"\.attn$", "softmax"),
    ("·V", r"\.attn$", "matmul"),
    ("GELU", r"\.mlp\.act$", "all"),
    ("residual adds", r"\.res[12]$", "all"),
    ("class token + position embedding", r"^embed$", "all"),
    ("head (fc)", r"^fc$", "all"),
)
CAST_OPS = {"_to_copy", "Cast"}
LAYOUT_OPS = {"Transpose"}  # TensorFlow's transpose of K moves data, computes nothing (torch's is a view)
MATMUL_OPS = {"bmm", "mm", "matmul", "baddbmm", "einsum", "BatchMatMulV2", "BatchMatMulV3", "MatMul", "Einsum"}
FUSED_ATTENTION = re.compile(r"scaled_dot_product|dot_product_attention|flash_attention", re.IGNORECASE)
# What a fused kernel does inside, where its source says so (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp).
FUSED_INSIDE = {"_scaled_dot_product_flash_attention_for_cpu":
                "float32 accumulation inside (PyTorch's CPU flash-attention kernel accumulates in at::opmath_type, "
                "float32 for half inputs; its float32 output is the log-sum-exp it keeps for the backward)"}


def _dtypes(values) -> str:
    return ", ".join(sorted({x for v in values for x in str(v).split("+") if x}))


def _computed_in(rows: pd.DataFrame) -> pd.Series:
    """The dtype each op computed in: its floating inputs' dtype; where they mix, its (first) output's; with no
    input recorded, its outputs'."""
    inputs = rows["input_dtype"].fillna("").astype(str) if "input_dtype" in rows else pd.Series("", rows.index)
    out = []
    for i, o in zip(inputs, rows["compute_dtype"].astype(str)):
        ins, outs = {x for x in i.split("+") if x}, [x for x in o.split("+") if x]
        out.append(ins.pop() if len(ins) == 1 else outs[0] if outs and (ins or len(outs) == 1) else o)
    return pd.Series(out, index=rows.index, dtype=object)


def _cell(rows: pd.DataFrame, kind: str) -> tuple[str, str]:
    """One framework's (ops text, computed-in text) for one part."""
    math = rows[~rows["op"].isin(CAST_OPS | LAYOUT_OPS)]
    fused = math[math["op"].astype(str).str.contains(FUSED_ATTENTION)]
    if kind != "all" and not fused.empty:  # named once, in the middle row of the three the kernel does
        op, inputs = str(fused["op"].iloc[0]), _dtypes(_computed_in(fused))
        inside = f"; {FUSED_INSIDE[op]}" if op in FUSED_INSIDE else ""
        return (f"fused kernel {op}, inputs {inputs}{inside}" if kind == "softmax" else
                f"the fused kernel, inputs {inputs}"), inputs
    if kind != "all":
        math = math[math["op"].isin(MATMUL_OPS) == (kind == "matmul")]
    per_op = math.assign(computed=_computed_in(math)).groupby("op", sort=False)["computed"].agg(_dtypes)
    text = "; ".join(f"{op}: {dt}" for op, dt in per_op.items()) or "-"
    if kind == "matmul" and per_op.str.contains(",").any():
        text += " (the audit counts both attention matmuls as one op: which is which is not recorded)"
    casts = _dtypes(rows.loc[rows["op"].isin(CAST_OPS), "compute_dtype"])
    if casts and kind == "all":  # the attention core's casts serve its input and its softmax: not said per row
        text += f" (casts to {casts})"
    return text, _dtypes(per_op) or "-"


def vit_dtype_table(dtypes: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per mixed precision: each vit part (VIT_COMPONENTS) with, per framework, the ops that did its arithmetic and
    the dtype each computed in; `differs` where the frameworks' "computed in" differ. Empty for the CNNs."""
    out: dict[str, pd.DataFrame] = {}
    if dtypes.empty or not dtypes["layer"].astype(str).str.match(r"blocks\.\d+\.attn$").any():
        return out
    first = dtypes[(dtypes["seed"] == dtypes["seed"].min()) & (dtypes["phase"] == "forward")]
    first = first[first["layer"].astype(str).str.match(r"blocks\.|embed$|norm$|fc$")]
    for prec in ordered(set(first["precision"]) - {precisions.REFERENCE}):
        d = first[first["precision"] == prec]
        rows = []
        for component, pattern, kind in VIT_COMPONENTS:
            part = d[d["layer"].astype(str).str.contains(pattern, regex=True)]
            row = {"part": component}
            for fw in ordered(d["framework"]):
                row[_label(fw)], row[f"{_label(fw)} computed in"] = _cell(part[part["framework"] == fw], kind)
            computed = [row[c] for c in row if c.endswith(" computed in")]
            # "-": that framework's audit attributes no op to this part: not attributed, so no difference
            row["differs"] = "-" not in computed and len(set(computed)) > 1
            rows.append(row)
        out[prec] = pd.DataFrame(rows)
    return out
