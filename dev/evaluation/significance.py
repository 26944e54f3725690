"""Intervals and paired tests for the detection table. Pure numpy.

The unit is a stream (a draw's clean-then-shifted sequence): its detection rate is the share of
its judgements on fully shifted windows that alarmed. Streams of one cell are independent draws
of the protocol, and every method judged the same streams, so two methods are compared pairwise
stream by stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["ALPHA", "Comparison", "compare", "interval", "sign_flip_p"]

FloatArray = NDArray[np.float64]
#: Level of the paired test and the intervals.
ALPHA = 0.05


def interval(
    rates: FloatArray, rng: np.random.Generator, resamples: int = 2000
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean rate over streams."""
    if np.all(rates == rates[0]):
        return float(rates[0]), float(rates[0])
    pick = rng.integers(0, len(rates), size=(resamples, len(rates)))
    means = rates[pick].mean(axis=1)
    lo, hi = np.quantile(means, [ALPHA / 2, 1 - ALPHA / 2])
    return float(lo), float(hi)


def sign_flip_p(diff: FloatArray, rng: np.random.Generator, resamples: int = 20000) -> float:
    """Two-sided p-value of a zero mean paired difference: each stream's difference keeps its
    size and takes a random sign (exact enumeration for up to 16 non-zero differences)."""
    d = diff[diff != 0]
    if d.size == 0:
        return 1.0
    observed = abs(d.sum())
    if d.size <= 16:
        signs = 1 - 2 * ((np.arange(2**d.size)[:, None] >> np.arange(d.size)) & 1)
    else:
        signs = rng.choice([-1, 1], size=(resamples, d.size))
    sums = np.abs(signs @ d)
    # Counting the observed signs among the draws keeps the p-value above 0.
    return float((np.sum(sums >= observed - 1e-12) + (d.size > 16)) / (len(sums) + (d.size > 16)))


@dataclass(frozen=True)
class Comparison:
    """hookwatch against one baseline on one cell."""

    difference: float
    p: float

    @property
    def verdict(self) -> str:
        if self.p >= ALPHA:
            return "tie"
        return "win" if self.difference > 0 else "loss"


def compare(mine: FloatArray, theirs: FloatArray, rng: np.random.Generator) -> Comparison:
    diff = mine - theirs
    return Comparison(float(diff.mean()), sign_flip_p(diff, rng))
