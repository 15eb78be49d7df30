"""FLOPs per image of a training step, counted once from the layer shapes both frameworks share.

Each model's layers and their multiply-adds are its spec's `flop_layers` (contract/models.py); this module
turns them into a training step's FLOPs.

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

from amp_compare.contract import models
from amp_compare.contract.models import Layer

__all__ = ["Layer", "layers", "train_flops"]


def layers(model: str, input_shape: tuple[int, int, int], num_classes: int, width: int = 64,
           vit: dict | None = None) -> list[Layer]:
    """The counted layers of one model, in forward order, from its spec's formula (contract/models.py).
    input_shape is (H, W, C) as kit/data.py serves it; vit: the ViT's size (RunConfig.vit_shape)."""
    return models.spec(model).flop_layers(input_shape, num_classes, {"width": width, "vit": vit})


def train_flops(model: str, input_shape: tuple[int, int, int], num_classes: int, width: int = 64,
                vit: dict | None = None) -> int:
    """FLOPs of one image's training step: forward, plus weight and input gradients (none for the images).
    The attention's two products have two activation operands: their backward, the gradients of both, is
    also twice their forward (FlashAttention-style kernels recompute Q·Kᵀ in the backward on top: that
    recomputation is the kernel's choice, not the model's work, and is not counted)."""
    counted = layers(model, input_shape, num_classes, width, vit)
    return 2 * sum(3 * layer.macs for layer in counted) - 2 * counted[0].macs
