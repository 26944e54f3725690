"""Accuracy estimated without labels, from a hidden layer's features and the model's logits.

A labelled reference (held out from training) is kept, bounded, in a hidden layer's feature
space. A served sample counts as correct in proportion to how far the model's prediction
agrees with the labels of its ``k`` nearest reference samples (deep k-NN, Papernot and
McDaniel 2018), and as an error when it lies outside the reference's support: its mean
distance to those neighbours is beyond the ``support_quantile`` of the reference's own
(leave-one-out) distances. The estimate over a window is the mean of these per-sample scores,
so sums of scores and counts add over workers and replicas.

Why both parts (``docs/accuracy-estimators.md`` measures the alternatives): where the shifted
traffic stays in the reference's support, the neighbours' labels say what the model should
have answered; where it leaves the support, the model's confidence says nothing (it stays
confident on rotated, noisy or foreign digits) and neither do neighbours that are far away.

:class:`AccuracyDropTest` pages when the estimate fell more than ``max_drop`` below the
reference's: a Shiryaev-Roberts e-detector over the per-sample scores, as in
:mod:`hookwatch._drift.sequential`, with a stated expected run length between false alarms.

Pure numpy: no Prometheus, TorchServe or torch imports.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from hookwatch._blas import OneBlasThread
from hookwatch._drift.bins import FloatArray, IntArray, expect
from hookwatch._drift.features import class_logits

__all__ = [
    "AccuracyDropTest",
    "AccuracyEstimate",
    "AccuracyEstimator",
    "AccuracyTracker",
    "DropAlarm",
]

#: Bounds of the reference kept in the state: samples and feature dimensions.
MAX_SAMPLES = 2000
MAX_DIMS = 64
#: Neighbours voting, and the share of the reference's own k-NN distances inside the support.
DEFAULT_K = 10
DEFAULT_SUPPORT_QUANTILE = 0.99
#: Betting fractions of the drop test, averaged (each capped so an e-value stays >= 1/2).
LAMBDAS = (0.5, 1.0, 2.0, 4.0)
#: Samples per vectorised block of the drop test (products stay inside float64's range).
BLOCK = 64
#: Names of the arrays of a state, for ``to_arrays``/``from_arrays``.
_FIELDS = (
    "mean",
    "components",
    "scale",
    "features",
    "labels",
    "k",
    "classes",
    "radius",
    "soft",
    "support_quantile",
    "reference_accuracy",
    "reference_score",
    "reference_score_var",
    "reference_n",
)


@dataclass(frozen=True)
class AccuracyEstimate:
    """The estimate over one window. ``correct_sum`` and ``count`` (and the per-class ones)
    add over windows, workers and replicas: the fleet's estimate is their ratio."""

    #: ``correct_sum / count`` (a window holds at least one sample).
    estimated_accuracy: float
    correct_sum: float
    count: int
    #: Samples outside the reference's support (each counted as an error).
    outside_support: int
    #: Per predicted class: summed scores and samples ``[C]``.
    class_correct_sum: FloatArray
    class_count: IntArray
    #: Per sample: the estimated probability that the prediction is right ``[B]``.
    scores: FloatArray

    def class_accuracy(self) -> FloatArray:
        """Estimated accuracy per predicted class (nan where none was predicted)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            result: FloatArray = np.where(
                self.class_count > 0, self.class_correct_sum / self.class_count, np.nan
            )
        return result


def _as_matrix(name: str, x: object, rows: int | None = None) -> FloatArray:
    a = np.asarray(x)
    expect(
        a.ndim == 2 and a.shape[0] >= 1 and a.shape[1] >= 1,
        f"{name} as a 2-D array [N, width]",
        getattr(a, "shape", type(x).__name__),
    )
    expect(np.issubdtype(a.dtype, np.number), f"{name} of a numeric dtype", a.dtype)
    if rows is not None:
        expect(a.shape[0] == rows, f"{name} with {rows} rows (one per sample)", a.shape)
    m: FloatArray = a.astype(np.float64)
    expect(bool(np.isfinite(m).all()), f"finite {name}", "nan or inf values")
    return m


def _predictions(logits: FloatArray) -> IntArray:
    predicted: IntArray = logits.argmax(axis=1).astype(np.int64)
    return predicted


def _sq_distances(x: FloatArray, ref: FloatArray, ref_sq: FloatArray) -> FloatArray:
    """Squared Euclidean distances ``[B, N]`` by one matrix product."""
    d: FloatArray = (x * x).sum(axis=1)[:, None] + ref_sq[None, :] - 2.0 * (x @ ref.T)
    return np.maximum(d, 0.0)


@dataclass(frozen=True)
class AccuracyEstimator:
    """The bounded reference state (plain arrays and scalars) and the per-window estimate.

    Build it with :meth:`fit`; store it with :meth:`to_arrays` (every value a numpy array, as
    ``np.savez`` writes them) and read it back with :meth:`from_arrays`. State: at most
    ``MAX_SAMPLES x MAX_DIMS`` float32 features, their labels, and a ``[W, <= MAX_DIMS]``
    projection.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(200, 4)); y = (x[:, 0] > 0).astype(np.int64)
    >>> logits = np.stack([-x[:, 0], x[:, 0]], axis=1)
    >>> est = AccuracyEstimator.fit(x, logits, y)
    >>> round(est.estimate(x[:50], logits[:50]).estimated_accuracy, 1)
    1.0
    """

    #: Reference mean ``[W]`` and projection ``[W, d]`` (principal directions, d <= MAX_DIMS).
    mean: NDArray[np.float32]
    components: NDArray[np.float32]
    #: Features are divided by this (the reference's root mean squared norm after centring).
    scale: float
    #: Projected, scaled reference features ``[N, d]`` and their labels ``[N]``.
    features: NDArray[np.float32]
    labels: IntArray
    k: int
    classes: int
    #: Support radius: the ``support_quantile`` of the reference's leave-one-out mean k-NN
    #: distances (inf: no support gate).
    radius: float
    #: Score = share of the neighbours labelled as predicted (soft) or 1 when their majority
    #: is (hard).
    soft: bool
    support_quantile: float
    #: The model's accuracy on the reference, and the mean and variance of the leave-one-out
    #: scores there (what clean traffic should score), over ``reference_n`` samples.
    reference_accuracy: float
    reference_score: float
    reference_score_var: float
    reference_n: int

    @classmethod
    def fit(
        cls,
        features: object,
        logits: object,
        labels: object,
        *,
        k: int = DEFAULT_K,
        support_quantile: float | None = DEFAULT_SUPPORT_QUANTILE,
        soft: bool = False,
        max_samples: int = MAX_SAMPLES,
        max_dims: int = MAX_DIMS,
        seed: int = 0,
    ) -> AccuracyEstimator:
        """From the labelled reference: ``features`` ``[N, W]`` of the hidden layer, the
        model's ``logits`` ``[N, C]`` (or a binary classifier's ``[N, 1]``, read as two
        classes by :func:`~hookwatch._drift.features.class_logits`) and the true ``labels``
        ``[N]`` (integers in [0, C))."""
        x = _as_matrix("reference features", features)
        n_all = x.shape[0]
        # A binary classifier's one logit is its two classes' (class 1 where it is positive).
        z = class_logits(_as_matrix("reference logits", logits, rows=n_all))
        classes = z.shape[1]
        y_raw = np.asarray(labels)
        expect(
            y_raw.ndim == 1 and y_raw.shape[0] == n_all,
            f"reference labels as a 1-D array of {n_all} (one per sample)",
            getattr(y_raw, "shape", type(labels).__name__),
        )
        expect(
            np.issubdtype(y_raw.dtype, np.integer) and not np.issubdtype(y_raw.dtype, np.bool_),
            "integer class labels",
            y_raw.dtype,
        )
        y = y_raw.astype(np.int64)
        expect(
            bool(((y >= 0) & (y < classes)).all()),
            f"labels in [0, {classes}) (the logits' classes)",
            f"labels from {int(y.min())} to {int(y.max())}",
        )
        expect(k >= 1, "k >= 1", k)
        expect(n_all > k, f"more reference samples than k = {k}", n_all)
        expect(
            support_quantile is None or 0.0 < support_quantile <= 1.0,
            "a support quantile in (0, 1] or None",
            support_quantile,
        )
        expect(max_samples > k and max_dims >= 1, "max_samples > k and max_dims >= 1", None)
        # The model's accuracy is measured on the whole reference, the state keeps a bounded,
        # stratified share of it.
        predicted = _predictions(z)
        reference_accuracy = float(np.mean(predicted == y))
        keep = _stratified(y, max_samples, seed)
        x, y, predicted = x[keep], y[keep], predicted[keep]
        mean = x.mean(axis=0)
        centred = x - mean
        components = _principal(centred, max_dims)
        projected = centred @ components
        scale = float(np.sqrt((projected**2).sum(axis=1).mean())) or 1.0
        ref = (projected / scale).astype(np.float32)
        state = cls(
            mean=mean.astype(np.float32),
            components=components.astype(np.float32),
            scale=scale,
            features=ref,
            labels=y,
            k=int(k),
            classes=int(classes),
            radius=math.inf,
            soft=bool(soft),
            support_quantile=1.0 if support_quantile is None else float(support_quantile),
            reference_accuracy=reference_accuracy,
            reference_score=math.nan,
            reference_score_var=math.nan,
            reference_n=len(y),
        )
        # Leave-one-out on the reference: each sample's neighbours among the others.
        votes, distance = state._neighbours(ref.astype(np.float64), leave_one_out=True)
        radius = (
            math.inf
            if support_quantile is None or support_quantile >= 1.0
            else float(np.quantile(distance, support_quantile))
        )
        scores = state._score(votes, distance, predicted, radius)
        return dataclasses.replace(
            state,
            radius=radius,
            reference_score=float(scores.mean()),
            reference_score_var=float(scores.var()),
        )

    # ------------------------------------------------------------------ the per-window estimate

    def project(self, features: object) -> FloatArray:
        x = _as_matrix("features", features)
        expect(
            x.shape[1] == self.mean.shape[0],
            f"features of width {self.mean.shape[0]} (the reference's)",
            x.shape,
        )
        projected: FloatArray = ((x - self.mean) @ self.components) / self.scale
        return projected

    def estimate(self, features: object, logits: object) -> AccuracyEstimate:
        """The estimate over a window: ``features`` ``[B, W]`` of the reference's layer and the
        model's ``logits`` ``[B, C]`` for the same samples."""
        x = self.project(features)
        z = class_logits(_as_matrix("logits", logits, rows=x.shape[0]))
        expect(z.shape[1] == self.classes, f"logits of {self.classes} classes", z.shape)
        predicted = _predictions(z)
        votes, distance = self._neighbours(x, leave_one_out=False)
        scores = self._score(votes, distance, predicted, self.radius)
        class_sum = np.bincount(predicted, weights=scores, minlength=self.classes)
        class_count = np.bincount(predicted, minlength=self.classes).astype(np.int64)
        total = float(scores.sum())
        return AccuracyEstimate(
            estimated_accuracy=total / len(scores),
            correct_sum=total,
            count=len(scores),
            outside_support=int((distance > self.radius).sum()),
            class_correct_sum=class_sum.astype(np.float64),
            class_count=class_count,
            scores=scores,
        )

    @cached_property
    def _reference(self) -> tuple[FloatArray, FloatArray]:
        """The reference features in float64 and their squared norms, computed once."""
        ref = self.features.astype(np.float64)
        return ref, (ref * ref).sum(axis=1)

    def _neighbours(self, x: FloatArray, leave_one_out: bool) -> tuple[FloatArray, FloatArray]:
        """Per sample: votes per class of its k nearest reference samples ``[B, C]`` (shares)
        and its mean distance to them ``[B]``."""
        ref, ref_sq = self._reference
        votes = np.empty((len(x), self.classes))
        distance = np.empty(len(x))
        for start in range(0, len(x), 256):  # bounded memory: [256, N] distances at a time
            chunk = x[start : start + 256]
            d = _sq_distances(chunk, ref, ref_sq)
            if leave_one_out:
                rows = np.arange(len(chunk))
                d[rows, start + rows] = np.inf
            nearest = np.argpartition(d, self.k - 1, axis=1)[:, : self.k]
            nearest_d = np.take_along_axis(d, nearest, axis=1)
            distance[start : start + len(chunk)] = np.sqrt(nearest_d).mean(axis=1)
            # Votes per class: one bincount over (row, label) pairs.
            cells = np.arange(len(chunk))[:, None] * self.classes + self.labels[nearest]
            counts = np.bincount(cells.ravel(), minlength=len(chunk) * self.classes)
            votes[start : start + len(chunk)] = counts.reshape(-1, self.classes) / self.k
        return votes, distance

    def _score(
        self, votes: FloatArray, distance: FloatArray, predicted: IntArray, radius: float
    ) -> FloatArray:
        rows = np.arange(len(predicted))
        if self.soft:
            agree = votes[rows, predicted]
        else:
            # The majority: ties go to the prediction (the model and a tie agree).
            agree = (votes[rows, predicted] >= votes.max(axis=1)).astype(np.float64)
        scores: FloatArray = np.where(distance > radius, 0.0, agree)
        return scores

    # ------------------------------------------------------------------------- the stored state

    def state_bytes(self) -> int:
        return sum(np.asarray(v).nbytes for v in self.to_arrays().values())

    def to_arrays(self) -> dict[str, NDArray[np.generic]]:
        """The state as numpy arrays (scalars 0-d), for a profile's ``.npz``."""
        return {name: np.asarray(getattr(self, name)) for name in _FIELDS}

    @classmethod
    def from_arrays(cls, arrays: dict[str, NDArray[np.generic]]) -> AccuracyEstimator:
        missing = [name for name in _FIELDS if name not in arrays]
        expect(not missing, f"accuracy state arrays {list(_FIELDS)}", f"missing {missing}")
        a = {name: np.asarray(arrays[name]) for name in _FIELDS}
        features = a["features"].astype(np.float32)
        labels = a["labels"].astype(np.int64)
        components = a["components"].astype(np.float32)
        mean = a["mean"].astype(np.float32)
        expect(
            features.ndim == 2
            and labels.shape == (features.shape[0],)
            and components.ndim == 2
            and components.shape == (mean.shape[0], features.shape[1]),
            "features [N, d], labels [N], mean [W] and components [W, d]",
            (features.shape, labels.shape, mean.shape, components.shape),
        )
        k, classes = int(a["k"]), int(a["classes"])
        expect(
            1 <= k < len(labels) and classes >= 1 and int(labels.max()) < classes,
            f"1 <= k < {len(labels)} samples and labels below classes",
            (k, classes),
        )
        return cls(
            mean=mean,
            components=components,
            scale=float(a["scale"]),
            features=features,
            labels=labels,
            k=k,
            classes=classes,
            radius=float(a["radius"]),
            soft=bool(a["soft"]),
            support_quantile=float(a["support_quantile"]),
            reference_accuracy=float(a["reference_accuracy"]),
            reference_score=float(a["reference_score"]),
            reference_score_var=float(a["reference_score_var"]),
            reference_n=int(a["reference_n"]),
        )

    def drop_test(
        self, max_drop: float = 0.05, run_length: float = 10_000.0, delta: float = 0.01
    ) -> AccuracyDropTest:
        """The sequential test that the estimate fell more than ``max_drop`` below the
        reference's (see :class:`AccuracyDropTest`)."""
        return AccuracyDropTest(
            self.reference_score,
            max_drop,
            run_length,
            tolerance=score_tolerance(self.reference_score_var, self.reference_n, delta),
        )


def _stratified(y: IntArray, limit: int, seed: int) -> IntArray:
    """At most ``limit`` indices, each class keeping its share (all when there are fewer)."""
    if len(y) <= limit:
        return np.arange(len(y))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    classes, sizes = np.unique(y, return_counts=True)
    # Largest remainders: per class its share of the limit, exactly ``limit`` in all.
    exact = limit * sizes / len(y)
    quota = np.floor(exact).astype(np.int64)
    quota[np.argsort(quota - exact)[: limit - int(quota.sum())]] += 1
    keep = [order[y[order] == c][:q] for c, q in zip(classes, quota, strict=True)]
    chosen: IntArray = np.sort(np.concatenate(keep))
    return chosen


def _principal(centred: FloatArray, max_dims: int) -> FloatArray:
    """Unit principal directions ``[W, d]`` (d <= max_dims); the identity when narrow enough."""
    w = centred.shape[1]
    if w <= max_dims:
        return np.eye(w)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    directions: FloatArray = vt[:max_dims].T
    return directions


def score_tolerance(variance: float, n: int, delta: float) -> float:
    """How far below the reference's mean score clean traffic's may be, with probability
    ``1 - delta`` over the reference draw: the empirical Bernstein bound of Maurer and Pontil
    (2009) for scores in [0, 1]."""
    expect(n >= 2, "a reference of at least 2 samples", n)
    expect(0.0 < delta < 1.0, "delta in (0, 1)", delta)
    log_term = math.log(2.0 / delta)
    return math.sqrt(2.0 * variance * log_term / n) + 7.0 * log_term / (3.0 * (n - 1))


@dataclass(frozen=True)
class DropAlarm:
    """An alarm of the drop test: ``position`` counts samples since the test started."""

    position: int
    log_evidence: float


class AccuracyDropTest:
    """Anytime-valid test that the traffic's mean score fell below ``reference_score -
    max_drop - tolerance``: a Shiryaev-Roberts e-detector over the per-sample scores.

    With ``m0`` that bound, each sample's ``e = 1 + lam (m0 - score)`` has expectation at most 1
    as long as the scores' mean (given the past) is at least ``m0``, whatever their
    distribution in [0, 1]. ``R_t = e_t (R_{t-1} + 1)`` averaged over the betting fractions
    ``LAMBDAS`` then has ``R_t - t`` a supermartingale, and stopping when it reaches
    ``run_length`` gives an expected ``run_length`` samples or more between false alarms
    (Shin, Ramdas and Rinaldo 2023); the test restarts after each alarm. ``tolerance`` covers the
    reference's sampling error (:func:`score_tolerance`), so the guarantee holds with
    probability ``1 - delta`` over the reference. It is about the estimate: that the *estimated*
    accuracy dropped, not the (unobserved) actual one.
    """

    def __init__(
        self,
        reference_score: float,
        max_drop: float = 0.05,
        run_length: float = 10_000.0,
        tolerance: float = 0.0,
    ) -> None:
        expect(0.0 <= max_drop < 1.0, "max_drop in [0, 1)", max_drop)
        expect(run_length > 1.0, "a run length above 1 sample", run_length)
        expect(tolerance >= 0.0, "a tolerance >= 0", tolerance)
        expect(0.0 < reference_score <= 1.0, "a reference score in (0, 1]", reference_score)
        self.bound = reference_score - max_drop - tolerance
        self.run_length = float(run_length)
        self.log_threshold = math.log(run_length)
        # e >= 1/2 for every score in [0, 1]: lam (1 - m0) <= 1/2.
        cap = 0.5 / max(1.0 - self.bound, 1e-9)
        self._lambdas = np.minimum(np.asarray(LAMBDAS), cap)
        self._r = np.zeros(len(LAMBDAS))
        self.seen = 0
        self.alarms = 0
        self.log_evidence = -math.inf

    def update(self, scores: object) -> list[DropAlarm]:
        """Advance over per-sample scores in arrival order; the alarms they raised."""
        s = np.asarray(scores, dtype=np.float64).reshape(-1)
        expect(bool(((s >= 0) & (s <= 1)).all()), "scores in [0, 1]", "values outside")
        alarms: list[DropAlarm] = []
        if self.bound <= 0.0:  # nothing the scores could fall below
            self.seen += len(s)
            return alarms
        done = 0
        while done < len(s):
            block = s[done : done + BLOCK]
            e = 1.0 + self._lambdas[None, :] * (self.bound - block[:, None])
            running = np.cumprod(e, axis=0)
            r = running * (self._r[None, :] + np.cumsum(e / running, axis=0))
            mean = r.mean(axis=1)
            over = np.flatnonzero(mean >= self.run_length)
            if over.size == 0:
                self._r = r[-1]
                self.log_evidence = math.log(mean[-1]) if mean[-1] > 0 else -math.inf
                done += len(block)
                continue
            at = int(over[0])
            self.alarms += 1
            alarms.append(DropAlarm(self.seen + done + at + 1, math.log(mean[at])))
            self._r = np.zeros_like(self._r)
            self.log_evidence = -math.inf
            done += at + 1
        self.seen += len(s)
        return alarms


class AccuracyTracker:
    """A worker's running estimate: the last ``window`` per-sample scores, cumulative sums that
    add over workers, and the drop test, fed from the capture thread.

    ``layer`` is the hidden layer whose features the estimator was fitted on.
    """

    def __init__(
        self,
        estimator: AccuracyEstimator,
        layer: str,
        window: int = 100,
        max_drop: float = 0.05,
        run_length: float = 10_000.0,
        delta: float = 0.01,
    ) -> None:
        expect(window >= 1, "a window of at least 1 sample", window)
        self.estimator = estimator
        self.layer = layer
        self.window = int(window)
        self.max_drop = float(max_drop)
        self.test = estimator.drop_test(max_drop, run_length, delta)
        self._scores = np.zeros(self.window)
        self._filled = 0
        self._position = 0
        #: Cumulative since the worker started: summed scores, samples, outside the support.
        self.correct_sum = 0.0
        self.count = 0
        self.outside_support = 0
        #: Cumulative per predicted class ``[C]``: summed scores and samples.
        self.class_correct_sum = np.zeros(estimator.classes)
        self.class_count = np.zeros(estimator.classes, dtype=np.int64)
        self._one_thread = OneBlasThread()

    @property
    def reference_accuracy(self) -> float:
        return self.estimator.reference_accuracy

    @property
    def estimated_accuracy(self) -> float:
        """Mean score over the last ``window`` samples (nan before the first)."""
        if not self._filled:
            return math.nan
        return float(self._scores[: self._filled].mean())

    @property
    def alarms(self) -> int:
        return self.test.alarms

    def update(self, features: object, logits: object) -> list[DropAlarm]:
        """Estimate a drain's samples (rows in arrival order) and advance the drop test."""
        with self._one_thread():
            result = self.estimator.estimate(features, logits)
        scores = result.scores
        self.correct_sum += result.correct_sum
        self.count += result.count
        self.outside_support += result.outside_support
        self.class_correct_sum = self.class_correct_sum + result.class_correct_sum
        self.class_count = self.class_count + result.class_count
        tail = scores[-self.window :]
        end = self._position + len(tail)
        if end <= self.window:
            self._scores[self._position : end] = tail
        else:
            first = self.window - self._position
            self._scores[self._position :] = tail[:first]
            self._scores[: end - self.window] = tail[first:]
        self._position = end % self.window
        self._filled = min(self.window, self._filled + len(tail))
        return self.test.update(scores)
