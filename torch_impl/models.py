"""PyTorch models, written the idiomatic PyTorch way (NCHW, nn.Module).

Each model has a twin of the same name in tf_impl/models.py with the same layers, shapes and
parameter counts; tests/test_models.py checks the counts layer by layer.
"""

from __future__ import annotations

import torch
from torch import nn


class SimpleCNN(nn.Module):
    """The tutorial network: conv3x3(32)-ReLU-maxpool2 -> conv3x3(64)-ReLU-maxpool2 -> flatten -> linear."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(64 * (image_size // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))  # flattens (C, H, W): NCHW order


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """input_shape is (H, W, C), as common/data.py serves images."""
    height, _, channels = input_shape
    if name == "simple_cnn":
        return SimpleCNN(channels, height, num_classes)
    raise ValueError(f"unknown model {name!r}")
