"""Views only activations give: units that never fire or sit saturated, and statistics by the
class the model predicted. Pure numpy: the capture thread counts, the publisher exports.

A *unit* is a channel of a conv map (its per-sample spatial mean, as the drift features take
it) or a unit of a flat layer. On one sample it is *active* when non-zero, and *saturated* when
non-zero and at or above the largest value it took on the reference data: a sigmoid at 1, a
ReLU6 at 6, or anything beyond what the reference ever showed. A unit never active over a range
of traffic is a pruning candidate; one saturated throughout carries no information either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hookwatch._names import OTHER_CLASS

__all__ = ["ClassSlots", "UnitReference", "active_counts"]

IntArray = NDArray[np.int64]


def active_counts(features: NDArray[np.floating], units: int) -> IntArray:
    """Per unit (the first ``units`` columns of ``[N, F]``), the samples on which it was
    non-zero."""
    counts: IntArray = np.count_nonzero(features[:, :units], axis=0).astype(np.int64)
    return counts


@dataclass(frozen=True)
class UnitReference:
    """A hidden layer's units on the reference: how often each was active, and its range."""

    layer: str
    #: Share of reference samples on which each unit was non-zero, ``[U]``.
    active: NDArray[np.float64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]

    def __post_init__(self) -> None:
        shapes = {self.active.shape, self.low.shape, self.high.shape}
        if len(shapes) != 1 or self.active.ndim != 1:
            raise ValueError(f"expected three [units] arrays, got shapes {sorted(shapes)}")

    @classmethod
    def fit(cls, layer: str, features: NDArray[np.floating], units: int) -> UnitReference:
        """From the reference's features ``[N, F]`` of the layer: its first ``units`` units."""
        x = np.asarray(features[:, :units], dtype=np.float64)
        if x.shape[0] == 0:
            raise ValueError(f"expected reference samples for layer {layer!r}, got none")
        return cls(layer, (x != 0).mean(axis=0), x.min(axis=0), x.max(axis=0))

    @property
    def width(self) -> int:
        return int(self.active.shape[0])

    @property
    def dead_share(self) -> float:
        """Share of the units that were zero on every reference sample."""
        return float((self.active == 0).mean()) if self.width else 0.0

    @property
    def saturated_share(self) -> float:
        """Share of the units that held one non-zero value on every reference sample."""
        if not self.width:
            return 0.0
        return float(((self.low == self.high) & (self.high != 0)).mean())

    def saturated_counts(self, features: NDArray[np.floating]) -> IntArray:
        """Per unit, the samples of ``[N, F]`` on which it was saturated."""
        units = min(self.width, features.shape[1])
        x = features[:, :units]
        hit = (x >= self.high[:units]) & (x != 0)
        counts: IntArray = hit.sum(axis=0).astype(np.int64)
        return counts


@dataclass(frozen=True)
class ClassSlots:
    """Which predicted classes keep statistics of their own; the rest share ``other``.

    ``labels[i]`` is slot ``i``'s ``class`` label value; the last slot is ``other``.
    """

    labels: tuple[str, ...]
    _lookup: IntArray

    @classmethod
    def tracked(cls, classes: Sequence[int]) -> ClassSlots:
        ids = [int(c) for c in classes]
        if len(set(ids)) != len(ids) or any(c < 0 for c in ids):
            raise ValueError(f"expected distinct class indices >= 0, got {ids}")
        lookup = np.full(max(ids, default=-1) + 1, len(ids), dtype=np.int64)
        lookup[ids] = np.arange(len(ids))
        return cls((*(str(c) for c in ids), OTHER_CLASS), lookup)

    @classmethod
    def by_frequency(cls, counts: Sequence[int] | None, max_classes: int) -> ClassSlots:
        """The ``max_classes`` classes predicted most often on the reference (``counts[c]``:
        how often class ``c`` was), in class order; without counts, the first ones."""
        if counts is None:
            return cls.tracked(range(max_classes))
        order = np.lexsort((np.arange(len(counts)), -np.asarray(counts)))
        return cls.tracked(sorted(int(c) for c in order[:max_classes]))

    def slots(self, predicted: NDArray[np.integer]) -> IntArray:
        """Slot of each predicted class index."""
        other = len(self.labels) - 1
        p = np.asarray(predicted, dtype=np.int64)
        inside = (p >= 0) & (p < len(self._lookup))
        result: IntArray = (
            np.where(inside, self._lookup[np.clip(p, 0, max(len(self._lookup) - 1, 0))], other)
            if len(self._lookup)
            else np.full(p.shape, other, dtype=np.int64)
        )
        return result
