"""Reference-quantile bins: the one representation every drift statistic reads.

Every feature of every detector is cut into bins at quantiles of the reference data, so the
expected share of each bin is known. A window of traffic is then nothing but bin counts, which
is what lets counts from many workers be summed before they are tested. The test statistic is
Pearson's chi-square per degree of freedom, rescaled for the reference's own sampling error.
Pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hookwatch._names import LEVELS

__all__ = [
    "AGGREGATIONS",
    "MAX_BINS",
    "BinnedReference",
    "ChiSquare",
    "CodeArray",
    "DegenerateReference",
    "FloatArray",
    "IntArray",
    "bin_counts",
    "encode",
    "expect",
    "expected_shares",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
CodeArray = NDArray[np.uint8]

#: Aggregations of per-feature statistics into one detector score.
AGGREGATIONS = ("mean", "max")
MAX_BINS = 64


class DegenerateReference(ValueError):
    """A detector with nothing to test: every feature is constant on the reference."""


def expect(cond: bool, expected: str, got: object) -> None:
    if not cond:
        raise ValueError(f"expected {expected}, got {got!r}")


# ``counts``: [..., F, K] window counts; ``ref``: [F, K] reference counts; ``valid``: [F, K] the
# bins that exist for each feature (features have K or fewer bins after merging ties).


def expected_shares(ref: IntArray, valid: NDArray[np.bool_]) -> FloatArray:
    """Reference share of each bin, with half a count added so no valid bin has share 0."""
    smoothed = np.where(valid, ref + 0.5, 0.0)
    shares: FloatArray = smoothed / smoothed.sum(axis=-1, keepdims=True)
    return shares


class ChiSquare:
    """Pearson chi-square of window vs reference, per feature, divided by its degrees of freedom.

    Scaled by ``1/W + 1/n_ref`` instead of ``1/W`` so the reference's own sampling error is part
    of the null: the value is about 1 on clean traffic whatever the window and reference sizes.
    Everything that depends on the reference alone is computed once: streaming verdicts score
    the same reference hundreds of times a minute, and only the window's counts change.
    """

    def __init__(
        self, ref: IntArray, valid: NDArray[np.bool_], n_ref: int | NDArray[np.int64]
    ) -> None:
        q = expected_shares(ref, valid)
        self._valid = valid
        self._q = q
        self._inv_q = np.where(valid, 1.0 / np.where(valid, q, 1.0), 0.0)
        self._inv_n_ref = 1.0 / n_ref
        self._inv_dof = 1.0 / np.maximum(valid.sum(axis=-1) - 1, 1)

    def __call__(self, counts: NDArray[Any]) -> FloatArray:
        w = counts.sum(axis=-1, keepdims=True).astype(np.float64)
        share = counts / np.maximum(w, 1.0)
        # Invalid bins hold no counts and have 1/q set to 0, so they add nothing.
        terms = (share - self._q) ** 2 * self._inv_q
        scale = 1.0 / np.maximum(w[..., 0], 1.0) + self._inv_n_ref
        result: FloatArray = terms.sum(axis=-1) / scale * self._inv_dof
        return result


@dataclass(frozen=True)
class BinnedReference:
    """What one detector needs from the reference: bin edges, counts and a bounded code sample.

    ``edges`` is ``[F, K-1]``, padded with +inf where a feature has fewer than ``K`` bins;
    ``codes`` holds the bin index of up to a fixed number of reference samples, aligned across
    detectors, for calibration. No raw values are kept.
    """

    name: str
    level: str
    edges: FloatArray
    counts: IntArray
    codes: CodeArray
    aggregation: str = "mean"
    #: Features dropped because they were constant on the reference (kept for the docs/tests).
    dropped: tuple[int, ...] = ()
    #: Indices of the features that were kept, in input order.
    kept: tuple[int, ...] = ()
    #: A categorical detector with more classes than bins: the classes with a bin of their own,
    #: in bin order; every other class falls into the last bin. Empty: bin k is class k.
    categories: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        expect(self.level in LEVELS, f"a level in {LEVELS}", self.level)
        expect(self.aggregation in AGGREGATIONS, f"one of {AGGREGATIONS}", self.aggregation)
        f, k = self.counts.shape
        expect(self.edges.shape == (f, k - 1), f"edges of shape {(f, k - 1)}", self.edges.shape)
        expect(
            self.codes.ndim == 2 and self.codes.shape[1] == f, f"codes [S, {f}]", self.codes.shape
        )

    @property
    def n_features(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_bins(self) -> int:
        return int(self.counts.shape[1])

    @property
    def n_ref(self) -> int:
        return int(self.counts[0].sum()) if self.n_features else 0

    @cached_property
    def valid(self) -> NDArray[np.bool_]:
        # A bin exists when its lower edge is finite (the first bin always exists).
        lower = np.concatenate([np.full((self.n_features, 1), -np.inf), self.edges], axis=1)
        result: NDArray[np.bool_] = ~np.isposinf(lower)
        return result

    @cached_property
    def _chi_square(self) -> ChiSquare:
        return ChiSquare(self.counts, self.valid, self.n_ref)

    @cached_property
    def _kept_index(self) -> NDArray[np.intp] | None:
        kept = np.asarray(self.kept, dtype=np.intp)
        # Nothing to select when every input feature was kept, in order (the usual case). Kept
        # features that are a prefix still need selecting when features after them were
        # dropped (constant trailing columns: the input's last one-hot slot, a dead last unit).
        every = not self.dropped and np.array_equal(kept, np.arange(len(kept)))
        return None if every else kept

    @classmethod
    def fit(
        cls,
        name: str,
        level: str,
        x: NDArray[Any],
        bins: int = 10,
        min_share: float = 0.01,
        max_codes: int = 4096,
        aggregation: str = "mean",
        seed: int = 0,
    ) -> BinnedReference:
        """Cut each column of ``x`` ``[N, F]`` at reference quantiles.

        Tied quantiles merge (a ReLU unit's zeros become one bin); a bin ends only once it holds
        at least ``min_share`` of the reference, so no bin's expected count is tiny. A feature
        left with one bin is constant on the reference and is dropped.
        """
        expect(2 <= bins <= MAX_BINS, f"bins in [2, {MAX_BINS}]", bins)
        x = np.asarray(x, dtype=np.float64)
        expect(x.ndim == 2 and x.shape[0] >= 2, "reference features [N >= 2, F]", x.shape)
        n = x.shape[0]
        min_count = max(1, math.ceil(min_share * n))
        all_edges: list[FloatArray] = []
        kept: list[int] = []
        dropped: list[int] = []
        for j in range(x.shape[1]):
            column = np.sort(x[:, j])
            candidates = np.unique(np.quantile(column, np.arange(1, bins) / bins))
            edges: list[float] = []
            start = 0
            for edge in candidates:
                # Values <= edge fall in the bin that ends at this edge.
                end = int(np.searchsorted(column, edge, side="right"))
                if end - start >= min_count and n - end >= min_count:
                    edges.append(float(edge))
                    start = end
            if edges:
                kept.append(j)
                all_edges.append(np.asarray(edges, dtype=np.float64))
            else:
                dropped.append(j)
        if not kept:
            raise DegenerateReference(
                f"every one of its {x.shape[1]} features is constant on the {n} reference samples"
            )
        padded = np.full((len(kept), bins - 1), np.inf)
        for i, e in enumerate(all_edges):
            padded[i, : len(e)] = e
        codes = encode(x[:, kept], padded)
        counts = bin_counts(codes, bins)
        if n > max_codes:
            pick = np.random.default_rng(seed).choice(n, size=max_codes, replace=False)
            codes = codes[np.sort(pick)]
        return cls(name, level, padded, counts, codes, aggregation, tuple(dropped), tuple(kept))

    @classmethod
    def categorical(
        cls, name: str, level: str, labels: NDArray[Any], classes: int, max_codes: int = 4096
    ) -> BinnedReference:
        """One feature whose bins are the classes ``0..classes-1`` (the predicted-class mix).

        With more than ``MAX_BINS`` classes, the ``MAX_BINS - 1`` classes predicted most often
        on the reference keep a bin each and the rest share the last one, so the detector stays
        bounded whatever the number of classes (a 1000-class model has 64 bins).
        """
        expect(classes >= 2, "at least 2 classes", classes)
        values = np.asarray(labels, dtype=np.int64).reshape(-1)
        categories: tuple[int, ...] = ()
        bins = classes
        if classes > MAX_BINS:
            frequency = np.bincount(values, minlength=classes)
            # Most frequent first; ties by class index, so rebuilding gives the same bins.
            order = np.lexsort((np.arange(classes), -frequency))
            categories = tuple(int(c) for c in order[: MAX_BINS - 1])
            bins = MAX_BINS
        edges = np.arange(bins - 1, dtype=np.float64)[None, :] + 0.5
        ref = cls(
            name,
            level,
            edges,
            np.zeros((1, bins), np.int64),
            np.zeros((1, 1), np.uint8),
            "mean",
            (),
            (0,),
            categories,
        )
        codes = ref.encode(values.astype(np.float64)[:, None])
        counts = bin_counts(codes, bins)
        return cls(name, level, edges, counts, codes[:max_codes], "mean", (), (0,), categories)

    def encode(self, x: NDArray[Any]) -> CodeArray:
        """Bin codes ``[B, F]`` of raw features ``[B, F_in]`` (dropped features are skipped)."""
        x = np.asarray(x, dtype=np.float64)
        index = self._kept_index
        x = x if index is None else x[:, index]
        if self.categories:
            return self._category_codes(x)
        return _encode_transposed(x, self._edges_by_bin)

    @cached_property
    def _edges_by_bin(self) -> FloatArray:
        # [K-1, F]: the layout encode compares in (see _encode_transposed).
        return np.ascontiguousarray(self.edges.T)

    @cached_property
    def _category_lookup(self) -> NDArray[np.uint8]:
        lookup = np.full(max(self.categories) + 1, len(self.categories), dtype=np.uint8)
        lookup[list(self.categories)] = np.arange(len(self.categories), dtype=np.uint8)
        return lookup

    def _category_codes(self, x: NDArray[np.float64]) -> CodeArray:
        lookup = self._category_lookup
        classes = x[:, :1].astype(np.int64)
        inside = (classes >= 0) & (classes < len(lookup))
        codes: CodeArray = np.where(
            inside, lookup[np.clip(classes, 0, len(lookup) - 1)], len(self.categories)
        ).astype(np.uint8)
        return codes

    def score(self, counts: NDArray[Any]) -> FloatArray:
        """Detector score of window counts ``[..., F, K]``: chi-square per dof, aggregated."""
        return aggregate(self._chi_square(counts), self.aggregation)


def aggregate(per_feature: FloatArray, aggregation: str) -> FloatArray:
    """A detector's score from its features' chi-squares ``[..., F]``: their mean or max."""
    result: FloatArray = (
        per_feature.max(axis=-1) if aggregation == "max" else per_feature.mean(axis=-1)
    )
    return result


def encode(x: NDArray[np.float64], edges: FloatArray) -> CodeArray:
    """Bin index of each value: the number of the feature's edges strictly below it."""
    return _encode_transposed(x, np.ascontiguousarray(edges.T))


def _encode_transposed(x: NDArray[np.float64], edges_by_bin: FloatArray) -> CodeArray:
    """:func:`encode` with the edges as ``[K-1, F]``.

    The comparisons are ``[K-1, B, F]`` and summed over the first axis: numpy adds whole
    ``[B, F]`` planes then, where a sum over a short last axis goes element by element (3 to
    7 times slower at the capture thread's sizes). uint8 sums: at most MAX_BINS - 1 edges.
    """
    # NaN compares False everywhere and lands in bin 0; NaNs are counted separately upstream.
    codes: CodeArray = (x[None] > edges_by_bin[:, None, :]).sum(axis=0, dtype=np.uint8)
    return codes


def bin_counts(codes: NDArray[Any], bins: int) -> IntArray:
    """``[..., W, F]`` codes to ``[..., F, K]`` counts."""
    codes = np.asarray(codes, dtype=np.int64)
    *lead, w, f = codes.shape
    flat = codes.reshape(-1, w, f)
    batch = flat.shape[0]
    offsets = (np.arange(batch)[:, None, None] * f + np.arange(f)[None, None, :]) * bins
    counts = np.bincount((flat + offsets).ravel(), minlength=batch * f * bins)
    result: IntArray = counts.reshape(*lead, f, bins).astype(np.int64)
    return result
