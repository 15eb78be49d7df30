"""PyTorch models, written the idiomatic PyTorch way (NCHW, nn.Module); the ViT lives in torch_impl/vit.py.

Each model has a twin of the same name in keras_impl/models.py with the same layers, shapes and
parameter counts; tests/test_models.py checks the counts layer by layer. Module names map to
the twin's layer names ("." -> "_"), and `get_weights` / `set_weights` move weights in the
framework-free format of kit/weights.py.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from torch import nn

from amp_compare.contract import models as model_specs
from amp_compare.kit import weights as cw


class SimpleCNN(nn.Module):
    """The tutorial network: conv3x3(32)-ReLU-maxpool2 -> conv3x3(64)-ReLU-maxpool2 -> flatten -> linear.

    One module per step (relu1, pool1, ..., flatten), each named as its Keras twin's layer, so the
    two dtype audits (torch_impl/numerics.py, keras_impl/numerics.py) list the same layers row by row.
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()  # flattens (C, H, W): NCHW order
        self.fc = nn.Linear(64 * (image_size // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.fc(self.flatten(x))


class BasicBlock(nn.Module):
    """Two 3x3 convs with BatchNorm and an identity (or 1x1 conv + BN) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.relu1 = nn.ReLU(inplace=True)  # one module per ReLU, named as the Keras twin's layers
        self.relu2 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_planes != planes:  # torchvision's name for the projection shortcut
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), norm(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + identity)  # the add is the block's own op (Keras: layer<i>_<j>_add)


class ResNet18(nn.Module):
    """ResNet-18 for small images (the CIFAR variant): 3x3 stride-1 stem, no max-pool."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 64,
                 bn_momentum: float | None = None, bn_epsilon: float | None = None):
        super().__init__()
        # None: leave the argument out and keep torch's default (momentum=None would mean a cumulative average).
        bn_args = {k: v for k, v in (("momentum", bn_momentum), ("eps", bn_epsilon)) if v is not None}
        norm = partial(nn.BatchNorm2d, **bn_args)
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn1 = norm(width)
        self.relu = nn.ReLU(inplace=True)
        planes = width
        for i, (mult, stride) in enumerate([(1, 1), (2, 2), (4, 2), (8, 2)], start=1):
            blocks = [BasicBlock(planes, width * mult, stride, norm), BasicBlock(width * mult, width * mult, 1, norm)]
            self.add_module(f"layer{i}", nn.Sequential(*blocks))
            planes = width * mult
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def simple_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    height, _, channels = input_shape
    return SimpleCNN(channels, height, num_classes)


def resnet18(input_shape: tuple[int, int, int], num_classes: int, width: int = 64,
             bn_momentum: float | None = None, bn_epsilon: float | None = None) -> nn.Module:
    return ResNet18(input_shape[2], num_classes, width, bn_momentum, bn_epsilon)


def vit(input_shape: tuple[int, int, int], num_classes: int, vit: dict | None = None) -> nn.Module:
    from amp_compare.torch_impl.vit import ViT

    height, _, channels = input_shape
    return ViT(channels, height, num_classes, **(vit or {}))


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, width: int = 64,
                bn_momentum: float | None = None, bn_epsilon: float | None = None,
                vit: dict | None = None) -> nn.Module:
    """input_shape is (H, W, C), as kit/data.py serves images. The model's spec (contract/models.py) names its
    builder here (or in any module), which takes the arguments below that apply to it.

    bn_momentum / bn_epsilon are in torch's convention; None keeps torch's default. simple_cnn
    has no BatchNorm and a fixed width, so it ignores width and both. vit: torch_impl/vit.py's ViT keyword
    arguments (size from RunConfig.vit_shape, ln_eps, attention); the CNNs ignore it.
    """
    return model_specs.build(name, "torch", input_shape, num_classes, width=width, bn_momentum=bn_momentum,
                             bn_epsilon=bn_epsilon, vit=vit)


def get_weights(model: nn.Module) -> dict[str, np.ndarray]:
    """The model's weights in the canonical format of kit/weights.py (torch's own layout)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()
            if k.rsplit(".", 1)[-1] not in cw.SKIPPED}


def set_weights(model: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Load canonical weights; every weight of the model must be given, and nothing else."""
    state = model.state_dict()
    expected = {k for k in state if k.rsplit(".", 1)[-1] not in cw.SKIPPED}
    if set(weights) != expected:
        raise KeyError(f"weights do not match the model: missing {sorted(expected - set(weights))}, "
                       f"unexpected {sorted(set(weights) - expected)}")
    for key, value in weights.items():
        if tuple(value.shape) != tuple(state[key].shape):
            raise ValueError(f"{key}: shape {tuple(value.shape)}, model has {tuple(state[key].shape)}")
    with torch.no_grad():
        for key, value in weights.items():
            state[key].copy_(torch.from_numpy(np.asarray(value)))  # state_dict tensors share the model's storage
