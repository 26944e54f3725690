"""A regression MLP standing in for "your model" in the README walk-through.

Its forward takes the input as a keyword-only argument (``model(features=x)``), and its
constructor takes arguments: hookwatch archive passes them with --model-args.
"""

from __future__ import annotations

import torch
from torch import nn


class RegressionMLP(nn.Module):
    def __init__(self, inputs: int, hidden: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Linear(inputs, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU()
        )
        self.out = nn.Linear(hidden, 1)

    def forward(self, *, features: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(features))
