"""A batch of inputs of a variable length, padded to its longest.

A model whose input has a dimension each request chooses (``null`` in ``input.shape``: a
series of any length, a waveform, raw token ids) is served in batches padded to the longest
sample. The padded batch carries each sample's length, so the forward can be given them
(``input.lengths``, ``input.mask``), the hooks can leave padding out of a step activation's
statistics, and each answer can be cut at its own length. Plain torch: the service pads, the
profile builder runs the reference through the same object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Padded"]


@dataclass(frozen=True)
class Padded:
    """``values`` padded along dimension ``dim`` (1 or more: 0 is the batch's), each sample's
    own length in ``lengths`` (int64 ``[batch]``, on the values' device); ``lengths_argument``
    and ``mask_argument`` name the forward's keyword arguments that take them."""

    values: torch.Tensor
    lengths: torch.Tensor
    dim: int
    lengths_argument: str | None = None
    mask_argument: str | None = None

    def _steps(self) -> torch.Tensor:
        """``[batch, longest]``: True at each sample's own steps."""
        steps = torch.arange(self.values.shape[self.dim], device=self.lengths.device)
        return steps[None, :] < self.lengths[:, None]

    def valid(self) -> torch.Tensor:
        """Where each sample's own values are, broadcastable against ``values``."""
        before, after = [1] * (self.dim - 1), [1] * (self.values.dim() - self.dim - 1)
        return self._steps().reshape(len(self.lengths), *before, -1, *after)

    def step_mask(self) -> torch.Tensor | None:
        """The mask ``[batch, longest]`` the hooks reduce steps over (a sequence's ``[batch,
        steps, ...]`` activations, padding left out) where the length is a sample's first
        dimension; None where it is another (a ``[channels, time]`` series: its activations
        have no dimension of steps the mask could name)."""
        return self._steps() if self.dim == 1 else None

    def keywords(self) -> dict[str, torch.Tensor]:
        """The forward's keyword arguments beside the values."""
        given: dict[str, torch.Tensor] = {}
        if self.lengths_argument is not None:
            given[self.lengths_argument] = self.lengths
        if self.mask_argument is not None:
            given[self.mask_argument] = self._steps()
        return given

    def call(self, model: nn.Module) -> Any:
        """The forward pass: the values positionally, lengths and mask as their keywords."""
        return model(self.values, **self.keywords())

    def to(self, device: torch.device) -> Padded:
        return Padded(
            self.values.to(device),
            self.lengths.to(device),
            self.dim,
            self.lengths_argument,
            self.mask_argument,
        )

    def rows(self, count: int) -> Padded:
        """The first ``count`` samples."""
        return Padded(
            self.values[:count],
            self.lengths[:count],
            self.dim,
            self.lengths_argument,
            self.mask_argument,
        )
