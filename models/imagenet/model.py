"""A 1000-class image classifier standing in for "your model" in the README walk-through.

Written the way third-party models often are: several classes (a residual block used by the
network) and a factory function that builds it with arguments. Random weights: the walk-through
shows serving and monitoring, not accuracy.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """Two 3x3 convolutions with a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.features = nn.Sequential(
            Block(width, width, 1),
            Block(width, 2 * width, 2),
            Block(2 * width, 4 * width, 2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(self.stem(x))).flatten(1))


def build(num_classes: int = 1000) -> SmallResNet:
    """The factory `hookwatch archive models/imagenet/model.py:build` calls."""
    torch.manual_seed(0)
    return SmallResNet(num_classes).eval()
