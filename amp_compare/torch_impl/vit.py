"""A small Vision Transformer in PyTorch, the idiomatic way (nn.Module, F.scaled_dot_product_attention).

The twin of keras_impl/vit.py, layer for layer: patch embedding (a strided conv, `patch`), class token and
learned position embedding (`embed`), pre-LN blocks (`blocks.<i>`: `ln1` -> `attn` -> `res1`; `ln2` ->
`mlp.fc1` -> `mlp.act` (GELU) -> `mlp.fc2` -> `res2`), the final LayerNorm (`norm`), the class token
(`pool`) and a linear head (`fc`). Module names are the canonical layer names of kit/weights.py, so the
two dtype audits, the NaN/Inf locator and --fp32-layers name the same layers in both frameworks.

Headroom (float16's 65,504): every LayerNorm keeps the largest |input| it saw and every attention the largest
|Q·Kᵀ| (before the 1/√d scale), each in a device buffer updated inside the training step (no host read); the
training loop reads and resets them once per epoch (`read_headroom`). The Q·Kᵀ maximum is computed apart in
float32 with autocast off, so an overflow in the model's own half-precision product still shows the true
magnitude; `paused(model)` turns the recording off (the numerics lab and FLOP counting measure the model alone).

`attention="naive"`: the numerics lesson. softmax(Q·Kᵀ) written out op by op (exp, sum, divide) in the dtype
of the scores, without subtracting the row maximum and without the 1/√d scale: exp overflows float16 once a
logit passes ln(65504) ≈ 11.1, float32 and bfloat16 only past ≈ 88.7. Autocast is switched off around the
handwritten softmax so it runs in the scores' dtype, as a custom kernel would (CUDA autocast would otherwise
move exp and sum to float32 and hide the bug).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from amp_compare.contract import models as model_specs
from amp_compare.contract.config import ATTENTIONS
from amp_compare.kit.training import recording_paused


class Tokens(nn.Module):
    """(B, D, h, w) patch features -> (B, 1 + h*w, D) tokens: class token first, position embedding added."""

    def __init__(self, dim: int, patches: int):
        super().__init__()
        self.cls = nn.Parameter(torch.empty(1, 1, dim))
        self.pos = nn.Parameter(torch.empty(1, 1 + patches, dim))
        nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2).transpose(1, 2)  # (B, h*w, D), patches in row-major (h, w) order, as Keras' Reshape
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        return x + self.pos


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm that keeps the largest |input| of the training steps in a buffer (read once per epoch)."""

    def __init__(self, dim: int, eps: float | None):
        super().__init__(dim, **({} if eps is None else {"eps": eps}))
        self.register_buffer("max_in", torch.zeros(()), persistent=False)
        self.record = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.record:
            with torch.no_grad():
                self.max_in.copy_(torch.maximum(self.max_in, x.detach().abs().amax().float()))
        return super().forward(x)


class SelfAttention(nn.Module):
    """Multi-head self-attention: query/key/value/out projections and F.scaled_dot_product_attention.

    The projections are separate Linear layers (torch layout (out, in)); kit/weights.py reshapes them to and
    from Keras MultiHeadAttention's (dim, heads, head_dim) kernels.
    """

    def __init__(self, dim: int, heads: int, attention: str = "builtin"):
        super().__init__()
        if dim % heads:
            raise ValueError(f"vit width {dim} is not divisible by its {heads} heads")
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r} (valid: {', '.join(ATTENTIONS)})")
        self.heads, self.head_dim, self.attention = heads, dim // heads, attention
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.register_buffer("max_qk", torch.zeros(()), persistent=False)
        self.record = True

    def split(self, t: torch.Tensor) -> torch.Tensor:
        """(B, N, heads * head_dim) -> (B, heads, N, head_dim): feature h * head_dim + d is head h's d-th."""
        b, n, _ = t.shape
        return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        if self.training and self.record:
            with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
                qk = torch.matmul(q.detach().float(), k.detach().float().transpose(-2, -1)).abs().amax()
                self.max_qk.copy_(torch.maximum(self.max_qk, qk))
        if self.attention == "naive":
            scores = torch.matmul(q, k.transpose(-2, -1))  # no 1/sqrt(head_dim)
            with torch.autocast(x.device.type, enabled=False):  # in the scores' dtype, as a custom kernel
                weights = torch.exp(scores)  # no max subtraction: overflows float16 past ln(65504)
                weights = weights / weights.sum(dim=-1, keepdim=True)
            out = torch.matmul(weights.to(v.dtype), v)
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        b, _, n, _ = out.shape
        return self.out(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()  # exact (erf), torch's default
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Residual(nn.Module):
    """The residual add as a module of its own, so the audits show its dtype (Keras: an Add layer)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, dim: int, heads: int, hidden: int, ln_eps: float | None, attention: str):
        super().__init__()
        self.ln1 = LayerNorm(dim, ln_eps)
        self.attn = SelfAttention(dim, heads, attention)
        self.res1 = Residual()
        self.ln2 = LayerNorm(dim, ln_eps)
        self.mlp = Mlp(dim, hidden)
        self.res2 = Residual()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.res1(x, self.attn(self.ln1(x)))
        return self.res2(x, self.mlp(self.ln2(x)))


class ClassToken(nn.Module):
    """The class token's features, (B, N, D) -> (B, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


class ViT(nn.Module):
    def __init__(self, in_channels: int, image_size: int, num_classes: int, dim: int = 32, depth: int = 2,
                 heads: int = 2, patch: int = 4, mlp_ratio: int = 2, ln_eps: float | None = None,
                 attention: str = "builtin"):
        super().__init__()
        if patch > image_size:
            raise ValueError(f"vit patch size {patch} is larger than the {image_size}-pixel images")
        self.patch = nn.Conv2d(in_channels, dim, kernel_size=patch, stride=patch)
        self.embed = Tokens(dim, (image_size // patch) ** 2)
        self.blocks = nn.Sequential(*[Block(dim, heads, dim * mlp_ratio, ln_eps, attention) for _ in range(depth)])
        self.norm = LayerNorm(dim, ln_eps)
        self.pool = ClassToken()
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.norm(self.blocks(self.embed(self.patch(x))))))


def _recorders(model: nn.Module):
    return [m for m in model.modules() if isinstance(m, (LayerNorm, SelfAttention))]


def paused(model: nn.Module):
    """No headroom recording for the duration (the numerics lab, FLOP counting): the model's work alone."""
    return recording_paused(_recorders(model))


def read_headroom(model: nn.Module) -> list[dict]:
    """The largest magnitudes since the last read, one row per LayerNorm / attention, and reset them.

    One host read of all buffers together (the once-per-epoch synchronisation). Empty for a model without
    recorders (the CNNs). Rows: {"layer", "quantity", "max_abs"}: LayerNorm "layernorm_input"; attention
    "qk_product" (|Q·Kᵀ| before any scale) and "attention_logit" (what enters the softmax: Q·Kᵀ/√d for the
    builtin attention, Q·Kᵀ itself for the naive one).
    """
    names = {m: n for n, m in model.named_modules()}
    recorders = _recorders(model)
    if not recorders:
        return []
    values = torch.stack([m.max_in if isinstance(m, LayerNorm) else m.max_qk for m in recorders]).cpu().tolist()
    rows = []
    for m, value in zip(recorders, values):
        if isinstance(m, LayerNorm):
            rows.append({"layer": names[m], "quantity": "layernorm_input", "max_abs": value})
        else:
            scale = 1.0 if m.attention == "naive" else m.head_dim ** -0.5
            rows += [{"layer": names[m], "quantity": "qk_product", "max_abs": value},
                     {"layer": names[m], "quantity": "attention_logit", "max_abs": value * scale}]
        (m.max_in if isinstance(m, LayerNorm) else m.max_qk).zero_()
    return rows


def arguments(cfg, settings: dict) -> dict | None:
    """build_model's `vit` keyword arguments for a cell (a RunConfig): its size, the mapped LayerNorm epsilon
    (None in defaults mode: torch's own), the attention. None for a model
    without the "vit" hook (contract/models.py: the CNNs)."""
    if "vit" not in model_specs.spec(cfg.model).hooks:  # contract/models.py: the models that take these
        return None
    return {**cfg.vit_shape, "ln_eps": settings.get("ln_epsilon"), "attention": cfg.attention}


def _stream_dtype(amp_dtype: torch.dtype | None) -> str:
    """What autocast makes of the token stream: a half (or float32) branch added to a float32 parameter."""
    with torch.autocast("cpu", dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
        branch = nn.Linear(1, 1)(torch.ones(1, 1))
        return str((branch + nn.Parameter(torch.zeros(1))).dtype).removeprefix("torch.")


def describe_defaults() -> dict[str, object]:
    """This torch's defaults for the vit's items of contract/mapping.DIFFERENCES, read from fresh objects."""
    mha = nn.MultiheadAttention(4, 2)
    return {
        "ln_epsilon": nn.LayerNorm(1).eps,
        "gelu_approximate": f"approximate={nn.GELU().approximate!r}",
        "mha_bias": f"bias={mha.in_proj_bias is not None}",
        "mha_dropout": mha.dropout,
        "token_dtype": f"autocast float16: half branch + float32 parameter -> {_stream_dtype(torch.float16)}",
        "attention_core": "F.scaled_dot_product_attention (one fused kernel where one applies)",
        "adamw_weight_decay": torch.optim.AdamW([nn.Parameter(torch.zeros(1))]).defaults["weight_decay"],
        "lr_schedule": "constant (no scheduler unless one is attached)",
    }


def settings_used(model: nn.Module, cfg) -> dict:
    """The vit's settings read back from the live model (empty for the CNNs), as keras_impl/vit.settings_used."""
    norm = next((m for m in model.modules() if isinstance(m, nn.LayerNorm)), None)
    if norm is None:
        return {}
    from amp_compare.torch_impl.amp import amp_setting

    gelu = next(m for m in model.modules() if isinstance(m, nn.GELU))
    attention = next(m for m in model.modules() if isinstance(m, SelfAttention))
    return {"ln_epsilon": norm.eps, "gelu_approximate": gelu.approximate != "none", "attention": attention.attention,
            "token_dtype": _stream_dtype(amp_setting(cfg.precision)),
            "mha_bias": attention.query.bias is not None}
