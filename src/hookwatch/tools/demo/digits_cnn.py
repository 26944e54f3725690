"""Model file archived into the demo ``.mar``: exactly one ``nn.Module`` class, torch only."""

import torch
from torch import nn


class DigitsCNN(nn.Module):
    """8x8 grey digits (pixel values 0..16) in, 10 logits out."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.act2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.act3 = nn.ReLU()
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x / 16.0
        x = self.act1(self.conv1(x))
        x = self.pool(self.act2(self.conv2(x)))
        x = self.act3(self.fc1(x.flatten(1)))
        logits: torch.Tensor = self.fc2(x)
        return logits
