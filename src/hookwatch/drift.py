"""Drift detectors over reference-quantile bins. Pure numpy: runs on the capture thread.

Every feature of every detector is cut into bins at quantiles of the reference data, so the
expected share of each bin is known. A window of traffic is then nothing but bin counts: the
test statistics below (Pearson chi-square, KS from bins, PSI) read counts only, which is what
lets counts from many workers be summed before testing.

Thresholds are calibrated, not assumed: windows are resampled from the reference's own bin
codes, every detector is scored on the same resampled windows, and one common per-detector
level is chosen so that the share of windows where *any* detector fires equals the target
false alarm rate (a max-statistic correction over features and detectors, less conservative
than Bonferroni because it sees their correlation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
CodeArray = NDArray[np.uint8]

#: Levels a detector belongs to (the ``level`` label).
LEVELS = ("input", "activation", "output", "prediction")
#: Detectors derived from the model's output logits.
OUTPUT_DETECTORS = ("output", "confidence", "entropy", "class_mix")
#: Aggregations of per-feature statistics into one detector score.
AGGREGATIONS = ("mean", "max")
MAX_BINS = 64
#: Principal directions with less variance than this share of the largest are not kept.
_RELATIVE_RANK_TOL = 1e-10


def _expect(cond: bool, expected: str, got: object) -> None:
    if not cond:
        raise ValueError(f"expected {expected}, got {got!r}")


# -- statistics on bin counts ------------------------------------------------------------------
#
# ``counts``: [..., F, K] window counts; ``ref``: [F, K] reference counts; ``valid``: [F, K] the
# bins that exist for each feature (features have K or fewer bins after merging ties).


def expected_shares(ref: IntArray, valid: NDArray[np.bool_]) -> FloatArray:
    """Reference share of each bin, with half a count added so no valid bin has share 0."""
    smoothed = np.where(valid, ref + 0.5, 0.0)
    shares: FloatArray = smoothed / smoothed.sum(axis=-1, keepdims=True)
    return shares


def chi_square(
    counts: NDArray[Any], ref: IntArray, valid: NDArray[np.bool_], n_ref: int
) -> FloatArray:
    """Pearson chi-square of window vs reference, per feature, divided by its degrees of freedom.

    Scaled by ``1/W + 1/n_ref`` instead of ``1/W`` so the reference's own sampling error is part
    of the null: the value is about 1 on clean traffic whatever the window and reference sizes.
    """
    return ChiSquare(ref, valid, n_ref)(counts)


class ChiSquare:
    """:func:`chi_square` with everything that depends on the reference alone computed once.

    Streaming verdicts score the same reference hundreds of times a minute; only the window's
    counts change between them.
    """

    def __init__(self, ref: IntArray, valid: NDArray[np.bool_], n_ref: int) -> None:
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


def ks_from_bins(counts: NDArray[Any], ref: IntArray) -> FloatArray:
    """Two-sample KS distance per feature, from bin counts: the largest CDF gap at a bin edge.

    Equals ``scipy.stats.ks_2samp`` on the raw values up to the mass of one bin.
    """
    w = np.maximum(counts.sum(axis=-1, keepdims=True), 1)
    n = np.maximum(ref.sum(axis=-1, keepdims=True), 1)
    gap = np.abs(np.cumsum(counts, axis=-1) / w - np.cumsum(ref, axis=-1) / n)
    result: FloatArray = gap.max(axis=-1)
    return result


def psi(
    counts: NDArray[Any], ref: IntArray, valid: NDArray[np.bool_], eps: float = 1e-4
) -> FloatArray:
    """Population stability index per feature: sum over bins of (a - e) * ln(a / e)."""
    w = np.maximum(counts.sum(axis=-1, keepdims=True), 1)
    n = np.maximum(ref.sum(axis=-1, keepdims=True), 1)
    actual = np.maximum(counts / w, eps)
    expected = np.maximum(ref / n, eps)
    terms = np.where(valid, (actual - expected) * np.log(actual / expected), 0.0)
    result: FloatArray = terms.sum(axis=-1)
    return result


# -- one detector's reference ------------------------------------------------------------------


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

    def __post_init__(self) -> None:
        _expect(self.level in LEVELS, f"a level in {LEVELS}", self.level)
        _expect(self.aggregation in AGGREGATIONS, f"one of {AGGREGATIONS}", self.aggregation)
        f, k = self.counts.shape
        _expect(self.edges.shape == (f, k - 1), f"edges of shape {(f, k - 1)}", self.edges.shape)
        _expect(
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
        # Nothing to select when every input feature was kept, in order (the usual case).
        return None if np.array_equal(kept, np.arange(len(kept))) else kept

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
        _expect(2 <= bins <= MAX_BINS, f"bins in [2, {MAX_BINS}]", bins)
        x = np.asarray(x, dtype=np.float64)
        _expect(x.ndim == 2 and x.shape[0] >= 2, "reference features [N >= 2, F]", x.shape)
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
        """One feature whose bins are the classes ``0..classes-1`` (the predicted-class mix)."""
        _expect(2 <= classes <= MAX_BINS, f"classes in [2, {MAX_BINS}]", classes)
        edges = np.arange(classes - 1, dtype=np.float64)[None, :] + 0.5
        codes = encode(np.asarray(labels, dtype=np.float64).reshape(-1, 1), edges)
        counts = bin_counts(codes, classes)
        return cls(name, level, edges, counts, codes[:max_codes], "mean", (), (0,))

    def encode(self, x: NDArray[Any]) -> CodeArray:
        """Bin codes ``[B, F]`` of raw features ``[B, F_in]`` (dropped features are skipped)."""
        x = np.asarray(x, dtype=np.float64)
        index = self._kept_index
        return encode(x if index is None else x[:, index], self.edges)

    def per_feature(self, counts: NDArray[Any]) -> FloatArray:
        """Chi-square per degree of freedom of each feature, for window counts ``[..., F, K]``."""
        return self._chi_square(counts)

    def aggregate(self, per_feature: FloatArray) -> FloatArray:
        """The detector score from its per-feature statistics."""
        if self.aggregation == "max":
            result: FloatArray = per_feature.max(axis=-1)
        else:
            result = per_feature.mean(axis=-1)
        return result

    def score(self, counts: NDArray[Any]) -> FloatArray:
        """Detector score of window counts ``[..., F, K]``: chi-square per dof, aggregated."""
        return self.aggregate(self.per_feature(counts))


def encode(x: NDArray[np.float64], edges: FloatArray) -> CodeArray:
    """Bin index of each value: the number of the feature's edges strictly below it."""
    # NaN compares False everywhere and lands in bin 0; NaNs are counted separately upstream.
    codes: CodeArray = (x[:, :, None] > edges[None, :, :]).sum(axis=2).astype(np.uint8)
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


# -- derived features --------------------------------------------------------------------------


def softmax(logits: NDArray[Any]) -> FloatArray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    result: FloatArray = e / e.sum(axis=1, keepdims=True)
    return result


def derive(
    layer: str, features: NDArray[Any], output_layer: str = "output"
) -> dict[str, FloatArray]:
    """Detector inputs from one layer's captured features ``[B, F]``.

    The output's logits give four detectors: per-class softmax (black-box shift detection),
    confidence (top probability), entropy, and the predicted class.
    """
    x = np.asarray(features, dtype=np.float64)
    if layer != output_layer:
        return {layer: x}
    p = softmax(x)
    entropy = -(p * np.log(np.maximum(p, 1e-12))).sum(axis=1, keepdims=True)
    return {
        "output": p,
        "confidence": p.max(axis=1, keepdims=True),
        "entropy": entropy,
        "class_mix": p.argmax(axis=1).astype(np.float64)[:, None],
    }


@dataclass(frozen=True)
class Projection:
    """A layer's principal components on the reference: ``[B, W]`` features to ``[B, <= k]``.

    A layer wider than the detector's feature budget keeps the directions in which the
    reference varies most instead of its first units, so a shift confined to units past the
    budget still reaches the test. What the components leave out is kept as one more feature,
    the distance from their subspace: a shift in directions the reference never varied in
    (noise in pixels that were always dark) shows there. Each is then binned like any feature.
    """

    layer: str
    #: Reference mean of the layer's features, ``[W]``.
    mean: NDArray[np.float32]
    #: Unit-length principal directions as columns, ``[W, c]``, largest variance first.
    components: NDArray[np.float32]
    #: Share of the reference's total variance the components keep.
    explained: float
    #: Whether the distance from the components' subspace is the last feature (it is left out
    #: when the components keep all the reference variance: it would be binned on rounding).
    residual: bool = True

    def __post_init__(self) -> None:
        w = self.mean.shape[0] if self.mean.ndim == 1 else -1
        _expect(
            self.components.ndim == 2 and self.components.shape[0] == w,
            f"components [{w}, c] for a mean of shape {self.mean.shape}",
            self.components.shape,
        )
        _expect(0.0 <= self.explained <= 1.0, "an explained share in [0, 1]", self.explained)

    @property
    def input_width(self) -> int:
        return int(self.mean.shape[0])

    @property
    def width(self) -> int:
        """Features out: the components, and the residual distance when kept."""
        return int(self.components.shape[1]) + int(self.residual)

    @classmethod
    def fit(cls, layer: str, x: NDArray[Any], k: int) -> Projection:
        """At most ``k`` features from reference features ``x`` ``[N, W]``: the top ``k - 1``
        principal directions and the residual distance, or fewer directions when the reference
        varies in fewer (directions without variance would be binned on rounding noise)."""
        x = np.asarray(x, dtype=np.float64)
        _expect(x.ndim == 2 and x.shape[0] >= 2, "reference features [N >= 2, W]", x.shape)
        _expect(k >= 1, "k >= 1", k)
        mean = x.mean(axis=0)
        centred = x - mean
        n, w = centred.shape
        # The smaller of the two Gram matrices: W x W for many samples, N x N for wide layers.
        if w <= n:
            values, vectors = np.linalg.eigh(centred.T @ centred)
        else:
            values, small = np.linalg.eigh(centred @ centred.T)
            vectors = centred.T @ small
        order = np.argsort(values)[::-1]
        values, vectors = values[order], vectors[:, order]
        total = float(np.einsum("ij,ij->", centred, centred))
        keep = values > max(float(values[0]), 0.0) * _RELATIVE_RANK_TOL
        residual = int(keep.sum()) > k - 1
        keep[k - 1 if residual else k :] = False
        values, vectors = values[keep], vectors[:, keep]
        vectors = vectors / np.linalg.norm(vectors, axis=0, keepdims=True)
        # A fixed sign per direction (largest entry positive): refits give the same features.
        flip = np.sign(vectors[np.abs(vectors).argmax(axis=0), np.arange(vectors.shape[1])])
        vectors = vectors * np.where(flip == 0, 1.0, flip)
        explained = min(float(values.sum() / total), 1.0) if total > 0 else 0.0
        return cls(layer, mean.astype(np.float32), vectors.astype(np.float32), explained, residual)

    def apply(self, x: NDArray[Any]) -> FloatArray:
        """Component scores, then the residual distance, ``[B, width]`` of features ``[B, W]``."""
        x = np.asarray(x, dtype=np.float32)
        _expect(
            x.ndim == 2 and x.shape[1] == self.input_width,
            f"features [B, {self.input_width}] for the projection of {self.layer!r}",
            x.shape,
        )
        centred = x - self.mean
        scores = centred @ self.components
        if not self.residual:
            return scores.astype(np.float64)
        rest = centred - scores @ self.components.T
        distance = np.sqrt(np.einsum("ij,ij->i", rest, rest))
        result: FloatArray = np.concatenate([scores, distance[:, None]], axis=1, dtype=np.float64)
        return result


# -- calibration -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    window: int
    false_alarm_rate: float
    thresholds: dict[str, float]
    #: Per-detector level of the common threshold (what each detector alone fires at).
    per_detector_rate: float
    windows: int


def calibrate(
    references: Sequence[BinnedReference],
    window: int,
    false_alarm_rate: float = 0.01,
    windows: int = 4000,
    seed: int = 0,
    chunk: int = 100,
) -> Calibration:
    """Thresholds such that a share ``false_alarm_rate`` of clean windows alarm on any detector.

    Windows of ``window`` reference samples are drawn with replacement from the detectors'
    aligned code samples. A resampled window carries no reference sampling error, so its
    chi-square is smaller than a fresh window's by the factor ``S / (S + W)`` (S: code sample
    size); the thresholds are scaled back by its inverse.
    """
    _expect(window >= 1, "a window of at least 1", window)
    _expect(0.0 < false_alarm_rate < 1.0, "a false alarm rate in (0, 1)", false_alarm_rate)
    _expect(len(references) > 0, "at least one detector", len(references))
    sizes = {r.codes.shape[0] for r in references}
    _expect(len(sizes) == 1, "code samples of one size, aligned across detectors", sizes)
    s = sizes.pop()
    rng = np.random.default_rng(seed)
    scores = np.empty((len(references), windows))
    # The resampling target is each code sample's own counts, so the scale factor is exact.
    sample_refs = [
        BinnedReference(
            r.name, r.level, r.edges, bin_counts(r.codes, r.n_bins), r.codes, r.aggregation
        )
        for r in references
    ]
    for start in range(0, windows, chunk):
        stop = min(windows, start + chunk)
        index = rng.integers(0, s, size=(stop - start, window))
        for d, ref in enumerate(sample_refs):
            counts = bin_counts(ref.codes[index], ref.n_bins)
            scores[d, start:stop] = ref.score(counts)
    # Empirical p-value of each window under each detector: share of windows scoring as high.
    pvals = np.empty_like(scores)
    for d in range(len(references)):
        ascending = np.sort(scores[d])
        pvals[d] = (windows - np.searchsorted(ascending, scores[d], side="left")) / windows
    min_p = np.sort(pvals.min(axis=0))
    # The largest common per-detector level whose any-detector alarm share stays in budget.
    levels = np.unique(pvals)
    share = np.searchsorted(min_p, levels, side="right") / windows
    within = levels[share <= false_alarm_rate]
    level = float(within.max()) if within.size else 0.0
    scale = (s + window) / s
    thresholds: dict[str, float] = {}
    for d, ref in enumerate(references):
        alarmed = scores[d][pvals[d] <= level]
        quiet = scores[d][pvals[d] > level]
        top = float(quiet.max()) if quiet.size else 0.0
        # Between the highest quiet and the lowest alarmed resampled score.
        cut = (top + float(alarmed.min())) / 2 if alarmed.size else top * 1.5 + 1e-9
        thresholds[ref.name] = cut * scale
    return Calibration(window, false_alarm_rate, thresholds, level, windows)


# -- streaming ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriftResult:
    """One detector's verdict on one window; ``as_dict`` mirrors alibi-detect's ``predict``."""

    detector: str
    level: str
    is_drift: bool
    score: float
    threshold: float
    window: int
    per_feature: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "meta": {"name": self.detector, "detector_type": "drift", "level": self.level},
            "data": {
                "is_drift": int(self.is_drift),
                "distance": self.score,
                "threshold": self.threshold,
                "window": self.window,
            },
        }


class SlidingWindow:
    """The last ``size`` samples' bin codes: O(size * F) bytes, no raw values.

    Pushing only writes codes into a ring; :attr:`counts` bins the ring when a verdict asks for
    it, which happens once per ``step`` samples, not once per push.
    """

    def __init__(self, size: int, features: int, bins: int) -> None:
        _expect(size >= 1, "a window of at least 1", size)
        self.size = size
        self.bins = bins
        self._codes = np.zeros((size, features), dtype=np.uint8)
        # Index arithmetic built once: the capture thread pushes many small chunks.
        self._offsets = np.arange(features, dtype=np.int64) * bins
        self._positions = np.arange(size, dtype=np.int64)
        self._next = 0
        self.filled = 0
        self.seen = 0

    def push(self, codes: CodeArray) -> None:
        seen = len(codes)
        codes = codes[-self.size :]
        n = len(codes)
        end = self._next + n
        if end <= self.size:
            self._codes[self._next : end] = codes
        else:
            self._codes[(self._next + self._positions[:n]) % self.size] = codes
        self._next = end % self.size
        self.filled = min(self.size, self.filled + n)
        self.seen += seen

    @property
    def counts(self) -> IntArray:
        """``[F, K]`` bin counts of the samples in the window."""
        codes = self._codes if self.full else self._codes[: self.filled]
        flat = (codes.astype(np.int64) + self._offsets).ravel()
        size = len(self._offsets) * self.bins
        counts: IntArray = np.bincount(flat, minlength=size).reshape(-1, self.bins)
        return counts

    @property
    def full(self) -> bool:
        return self.filled == self.size


@dataclass
class DriftTracker:
    """Sliding-window drift tests for every detector of a profile, fed from the capture thread.

    ``update(layer, features)`` bins the layer's features, pushes them into each of its
    detectors' windows and returns a verdict for every detector whose window is full and has
    taken ``step`` new samples since its last verdict.
    """

    references: Mapping[str, BinnedReference]
    calibration: Calibration
    step: int
    output_layer: str = "output"
    #: Detectors whose bin counts are also tallied for :meth:`take_counts` (the fleet-wide
    #: counters); the others pay nothing for it.
    tallied: frozenset[str] = frozenset()
    #: Per layer, the projection its features go through before binning (wide layers only).
    projections: Mapping[str, Projection] = field(default_factory=dict)
    _windows: dict[str, SlidingWindow] = field(default_factory=dict)
    _tally: dict[str, IntArray] = field(default_factory=dict)
    _since: dict[str, int] = field(default_factory=dict)
    latest: dict[str, DriftResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _expect(self.step >= 1, "a step of at least 1", self.step)
        for name, ref in self.references.items():
            self._windows[name] = SlidingWindow(self.calibration.window, ref.n_features, ref.n_bins)
            self._since[name] = 0

    @property
    def window(self) -> int:
        return self.calibration.window

    def update(self, layer: str, features: NDArray[Any]) -> list[DriftResult]:
        results: list[DriftResult] = []
        projection = self.projections.get(layer)
        if projection is not None:
            features = projection.apply(features)
        for name, x in derive(layer, features, self.output_layer).items():
            ref = self.references.get(name)
            if ref is None:
                continue
            window = self._windows[name]
            codes = ref.encode(x)
            if name in self.tallied:
                counts = bin_counts(codes[None], ref.n_bins)[0]
                pending = self._tally.get(name)
                self._tally[name] = counts if pending is None else pending + counts
            start = 0
            # Chunks end at step boundaries, so verdicts fall every `step` samples however
            # the capture thread happens to batch them.
            while start < len(codes):
                since = self._since[name]
                take = self.step - since if since < self.step else window.size - window.filled
                chunk = codes[start : start + max(1, take)]
                window.push(chunk)
                start += len(chunk)
                self._since[name] += len(chunk)
                if window.full and self._since[name] >= self.step:
                    self._since[name] = 0
                    results.append(self.evaluate(name))
        return results

    def feature_widths(self) -> dict[str, int]:
        """Features each projected layer must capture: its projection's input width."""
        return {layer: p.input_width for layer, p in self.projections.items()}

    def take_counts(self) -> dict[str, IntArray]:
        """Bin counts ``[F, K]`` per tallied detector since the last call, then forget them."""
        taken, self._tally = self._tally, {}
        return taken

    def evaluate(self, name: str) -> DriftResult:
        ref = self.references[name]
        per_feature = ref.per_feature(self._windows[name].counts)
        score = float(ref.aggregate(per_feature))
        threshold = self.calibration.thresholds[name]
        result = DriftResult(
            name,
            ref.level,
            score > threshold,
            score,
            threshold,
            self.window,
            tuple(per_feature.tolist()),
        )
        self.latest[name] = result
        return result

    def filled(self, name: str) -> int:
        return self._windows[name].filled
