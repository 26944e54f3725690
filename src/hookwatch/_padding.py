"""A batch of inputs of a variable length, padded to its longest.

A model whose input has a dimension each request chooses (``null`` in ``input.shape``: a
series of any length, a waveform, raw token ids) is served in batches padded to the longest
sample. The padded batch carries each sample's length, so the forward can be given them
(``input.lengths``, ``input.mask``), the hooks can leave padding out of a step activation's
statistics, and each answer can be cut at its own length. Plain torch: the service pads, the
profile builder runs the reference through the same object.

Beside ``input.arguments``, one argument may be of a variable length: its padded values
are passed as its keyword, the other arguments (fixed shapes, stacked) as theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    #: What the padding holds (``input.pad_value``).
    pad_value: float = 0.0
    #: Beside ``input.arguments``: the keyword the values are passed as (None: positionally),
    #: the other arguments, stacked, and where among them the values' argument is declared.
    field: str | None = None
    others: tuple[tuple[str, torch.Tensor], ...] = ()
    at: int = 0

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

    def arguments(self) -> dict[str, torch.Tensor]:
        """Beside ``input.arguments``: every argument by its keyword, in declared order."""
        named = list(self.others)
        if self.field is not None:
            named.insert(self.at, (self.field, self.values))
        return dict(named)

    def call_arguments(self) -> dict[str, torch.Tensor]:
        """Beside ``input.arguments``: the forward's keyword arguments, each argument's and
        the lengths' or mask's."""
        return self.arguments() | self.keywords()

    def call(self, model: nn.Module) -> Any:
        """The forward pass: the values positionally (beside ``input.arguments``, as their
        keyword, with the other arguments), lengths and mask as their keywords."""
        if self.field is not None:
            return model(**self.call_arguments())
        return model(self.values, **self.keywords())

    def to(self, device: torch.device) -> Padded:
        return replace(
            self,
            values=self.values.to(device),
            lengths=self.lengths.to(device),
            others=tuple((name, value.to(device)) for name, value in self.others),
        )

    def rows(self, count: int) -> Padded:
        """The first ``count`` samples."""
        return replace(
            self,
            values=self.values[:count],
            lengths=self.lengths[:count],
            others=tuple((name, value[:count]) for name, value in self.others),
        )

    def _others_of(self, rows: list[int]) -> tuple[tuple[str, torch.Tensor], ...]:
        return tuple((name, value[rows]) for name, value in self.others)

    def probe(self) -> tuple[Padded, Padded] | None:
        """One sample alone, and a batch whose first row is that sample padded beside a longer
        one: what tells a model, or a layer, that reads its padding (its answer or its
        features of the sample differ). The batch's shortest sample beside its longest;
        where every sample is as long, the first cut to half its length beside itself whole.
        None where there is nothing to pad (one sample of length 1)."""
        lengths = [int(n) for n in self.lengths.tolist()]
        short = min(range(len(lengths)), key=lengths.__getitem__)
        long_ = max(range(len(lengths)), key=lengths.__getitem__)
        at, longest = self.dim - 1, lengths[long_]
        if lengths[short] < longest:
            rows = [short, long_]
            pair = self.values[rows].narrow(self.dim, 0, longest)
            counts = [lengths[short], longest]
        else:
            counts = [longest // 2, longest]
            if counts[0] < 1:
                return None
            rows = [0, 0]
            pair = self.values[rows].narrow(self.dim, 0, longest).clone()
            pair[0].narrow(at, counts[0], longest - counts[0]).fill_(self.pad_value)
        together = replace(
            self,
            values=pair,
            lengths=torch.tensor(counts, device=pair.device),
            others=self._others_of(rows),
        )
        alone = replace(
            self,
            values=pair[:1].narrow(self.dim, 0, counts[0]),
            lengths=together.lengths[:1],
            others=self._others_of(rows[:1]),
        )
        return alone, together
