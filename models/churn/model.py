"""A churn classifier standing in for "your model" in the walk-through of a forward of
several tensors: six numeric features and a plan id (an embedding) in, one logit out, as a
binary classifier trained with ``BCEWithLogitsLoss`` gives it."""

from __future__ import annotations

import torch
from torch import nn


class ChurnNet(nn.Module):
    def __init__(self, plans: int = 5, hidden: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.plan = nn.Embedding(plans, 4)
        self.body = nn.Sequential(nn.Linear(6 + 4, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.act = nn.ReLU()
        self.out = nn.Linear(hidden, 1)

    def forward(self, numeric: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
        # plan is [batch, 1]: one id a customer.
        x = torch.cat([numeric, self.plan(plan[:, 0])], dim=1)
        return self.out(self.act(self.body(x)))
