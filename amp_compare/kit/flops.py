"""FLOPs per image of a training step, counted once from the layer shapes both frameworks share.

torch_impl/models.py and keras_impl/models.py build the same layers with the same shapes
(tests/test_models.py), so one count serves both frameworks: a figure of achieved FLOP/s never
differs between them because of how it was counted. Only convolutions and matrix products are
counted, as torch.utils.flop_counter.FlopCounterMode does (tests/test_perf.py checks the two
agree on a real torch training step; the ViT's attention through the math SDPA backend, whose matrix products
the counter sees): a multiply-add is 2 FLOPs; BatchNorm, ReLU, pooling and
the optimizer are left out (a few percent of ResNet-18's work).

Training = forward + backward. The backward of a layer computes the gradient of its weights
(as many FLOPs as its forward) and of its input (as many again), except the first layer, whose
input (the images) needs no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    name: str
    macs: int  # multiply-adds of one image's forward pass


def _conv(name: str, size: int, c_in: int, c_out: int, kernel: int, stride: int = 1) -> tuple[Layer, int]:
    padding = kernel // 2  # both models pad 3x3 convs by 1 and 1x1 convs by 0
    out = (size + 2 * padding - kernel) // stride + 1
    return Layer(name, out * out * c_out * c_in * kernel * kernel), out


def _vit(size: int, channels: int, num_classes: int, dim: int, depth: int, heads: int, patch: int,
         mlp_ratio: int) -> list[Layer]:
    """The ViT's matrix products per image: the patch conv, per block the four projections, the attention's two
    batched products (Q·Kᵀ and weights·V: heads x tokens x tokens x head_dim each, heads * head_dim = dim) and
    the MLP, then the head on the class token. LayerNorm, softmax, GELU and the adds are not counted."""
    patches = (size // patch) ** 2
    tokens = 1 + patches
    out = [Layer("patch", patches * dim * channels * patch * patch)]
    for b in range(depth):
        out += [Layer(f"blocks.{b}.attn.{proj}", tokens * dim * dim) for proj in ("query", "key", "value")]
        out += [Layer(f"blocks.{b}.attn.scores", tokens * tokens * dim),  # Q·Kᵀ over all heads
                Layer(f"blocks.{b}.attn.mix", tokens * tokens * dim),  # softmax weights · V
                Layer(f"blocks.{b}.attn.out", tokens * dim * dim),
                Layer(f"blocks.{b}.mlp.fc1", tokens * dim * dim * mlp_ratio),
                Layer(f"blocks.{b}.mlp.fc2", tokens * dim * mlp_ratio * dim)]
    return out + [Layer("fc", dim * num_classes)]


def layers(model: str, input_shape: tuple[int, int, int], num_classes: int, width: int = 64,
           vit: dict | None = None) -> list[Layer]:
    """The counted layers of one model, in forward order. input_shape is (H, W, C) as kit/data.py serves it;
    vit: the ViT's size (RunConfig.vit_shape)."""
    size, _, channels = input_shape
    if model == "vit":
        return _vit(size, channels, num_classes, **(vit or {}))
    if model == "simple_cnn":
        conv1, s = _conv("conv1", size, channels, 32, 3)
        conv2, s = _conv("conv2", s // 2, 32, 64, 3)
        return [conv1, conv2, Layer("fc", 64 * (s // 2) ** 2 * num_classes)]
    if model == "resnet18":
        stem, s = _conv("conv1", size, channels, width, 3)
        out, planes = [stem], width
        for i, (mult, stride) in enumerate([(1, 1), (2, 2), (4, 2), (8, 2)], start=1):
            for b in range(2):
                first, block_stride = planes, (stride if b == 0 else 1)
                c1, s_out = _conv(f"layer{i}.{b}.conv1", s, first, width * mult, 3, block_stride)
                c2, _ = _conv(f"layer{i}.{b}.conv2", s_out, width * mult, width * mult, 3)
                out += [c1, c2]
                if block_stride != 1 or first != width * mult:
                    out.append(_conv(f"layer{i}.{b}.downsample", s, first, width * mult, 1, block_stride)[0])
                s, planes = s_out, width * mult
        return out + [Layer("fc", planes * num_classes)]
    raise ValueError(f"unknown model {model!r} (valid: simple_cnn, resnet18, vit)")


def train_flops(model: str, input_shape: tuple[int, int, int], num_classes: int, width: int = 64,
                vit: dict | None = None) -> int:
    """FLOPs of one image's training step: forward, plus weight and input gradients (none for the images).
    The attention's two products have two activation operands: their backward, the gradients of both, is
    also twice their forward (FlashAttention-style kernels recompute Q·Kᵀ in the backward on top: that
    recomputation is the kernel's choice, not the model's work, and is not counted)."""
    counted = layers(model, input_shape, num_classes, width, vit)
    return 2 * sum(3 * layer.macs for layer in counted) - 2 * counted[0].macs
