"""The accuracy estimator of a profile, fitted on a labelled reference (issue 29).

:func:`with_accuracy` runs the labelled reference through the serving hooks (as the profile
build does), keeps a bounded uniform sample of ``harm.layer``'s features, the logits and the
labels, and fits :class:`~hookwatch._drift.AccuracyEstimator` on it; the model's reference
accuracy is counted over every sample. The profile carries the estimator; serving attaches it
(:func:`hookwatch._profile.loading.tracker_for`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from hookwatch._config import MonitoringConfig
from hookwatch._drift import AccuracyEstimator, class_logits
from hookwatch._drift.accuracy import MAX_SAMPLES
from hookwatch._errors import ConfigError
from hookwatch._names import OUTPUT_LAYER
from hookwatch._profile.builder import Batch, _Collector, _Reservoir, capture_features
from hookwatch._profile.format import DriftProfile

__all__ = ["as_labels", "harm_layer", "with_accuracy"]

log = logging.getLogger("hookwatch")

#: Reference samples the fit reads at most (a uniform sample; the estimator keeps fewer).
MAX_FIT_SAMPLES = 20_000


def harm_layer(config: MonitoringConfig) -> str:
    """The hidden layer the estimate reads: ``harm.layer``, else the last watched hidden one."""
    hidden = list(config.layers)
    chosen = config.harm.layer
    if chosen is not None:
        if chosen not in hidden:
            raise ConfigError(
                f"monitoring.harm.layer: expected one of the watched hidden layers {hidden}, "
                f"got {chosen!r}"
            )
        return chosen
    if not hidden:
        raise ConfigError(
            "reference labels: expected a watched hidden layer (monitoring.layers) for the "
            "accuracy estimate to read, got none"
        )
    return hidden[-1]


def as_labels(labels: object, where: str = "reference labels") -> NDArray[np.int64]:
    """``labels`` as a 1-D array of class indices; one line saying what came otherwise."""
    a = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if a.ndim != 1:
        raise ConfigError(f"{where}: expected a 1-D array of class labels, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.bool_):
        raise ConfigError(
            f"{where}: expected integer class labels (the index of the right logit), got dtype "
            f"{a.dtype}"
        )
    y: NDArray[np.int64] = a.astype(np.int64)
    return y


#: How far the default layer's own estimate on the reference may sit from the reference's
#: accuracy before another watched layer whose estimate sits nearer is read instead: a
#: layer that sees little of what the answer depends on (a recommender's user features,
#: not its history) agrees with its neighbours' labels at another rate than the model is
#: right.
MAX_ESTIMATE_GAP = 0.10


def _fit(
    rows: dict[str, NDArray[np.float32]], key: str, config: MonitoringConfig, seed: int
) -> AccuracyEstimator:
    """The estimator of the features under ``key`` in ``rows``, with their logits and
    labels."""
    harm = config.harm
    try:
        return AccuracyEstimator.fit(
            rows[key],
            rows["z"],
            rows["y"][:, 0].astype(np.int64),
            k=harm.neighbours,
            support_quantile=None if harm.support_quantile >= 1.0 else harm.support_quantile,
            seed=seed,
        )
    except ValueError as error:
        raise ConfigError(f"reference labels: {error}") from None


def _closest(
    fitted: dict[str, AccuracyEstimator], default: str, accuracy: float
) -> tuple[str, AccuracyEstimator]:
    """The layer whose estimate on the reference sits nearest its accuracy, the default on a
    tie (the others are fitted only where the default's sits more than
    :data:`MAX_ESTIMATE_GAP` from it); another one chosen is logged, with every candidate's
    estimate."""
    gap = {layer: abs(e.reference_score - accuracy) for layer, e in fitted.items()}
    best = min(gap, key=lambda layer: (gap[layer], layer != default))
    if best == default:
        return default, fitted[default]
    log.warning(
        "hookwatch: the accuracy estimate reads layer %r, not the last watched %r: its own "
        "estimate on the reference is %.3f against the model's accuracy %.3f there, %r's %.3f "
        "(%s); set monitoring.harm.layer to choose",
        best,
        default,
        fitted[best].reference_score,
        accuracy,
        default,
        fitted[default].reference_score,
        ", ".join(f"{layer} {e.reference_score:.3f}" for layer, e in fitted.items()),
    )
    return best, fitted[best]


def with_accuracy(
    profile: DriftProfile,
    model: nn.Module,
    config: MonitoringConfig,
    batches: Iterable[Batch],
    labels: object,
    seed: int = 0,
) -> DriftProfile:
    """``profile`` with the accuracy estimator fitted on ``batches`` and their ``labels`` (one
    per sample, in the batches' order). ``config`` is the profile's, its layers resolved."""
    y = as_labels(labels)
    if config.output.head != "logits":
        raise ConfigError(
            f"reference labels: expected a model whose monitoring.output.head is 'logits' "
            f"(labels are classes of its logits), got head {config.output.head!r}"
        )
    if not config.capture_output:
        raise ConfigError(
            "reference labels: expected the output watched (monitoring.capture_output true), "
            "got it off: the estimate compares the prediction with the reference's"
        )
    layer = harm_layer(config)
    # Unchosen, every watched hidden layer is a candidate (the last is the default): one
    # pass of the reference captures them all.
    candidates = [layer] if config.harm.layer is not None else list(config.layers)
    collector = _Collector()
    reservoir = _Reservoir(MAX_FIT_SAMPLES, seed)
    # The other candidates in a reservoir of what an estimator keeps at most: every watched
    # layer's features of 20,000 samples would hold hundreds of MB for a deep model.
    others = _Reservoir(MAX_SAMPLES, seed)
    seen = correct = 0
    for features in capture_features(model, config, batches, collector):
        logits = features.get(OUTPUT_LAYER)
        hidden = features.get(layer)
        if hidden is None or logits is None:
            raise ConfigError(
                f"reference labels: expected layer {layer!r} and the output on every reference "
                f"batch, got {sorted(features)} (choose another monitoring.harm.layer)"
            )
        n = len(logits)
        if len(hidden) != n:
            raise ConfigError(
                f"monitoring.harm.layer: expected one row of {layer!r} per sample, got "
                f"{len(hidden)} rows for {n} samples (choose a layer with the batch first)"
            )
        # Another candidate without a row per sample on every batch is dropped.
        candidates = [
            c for c in candidates if (got := features.get(c)) is not None and len(got) == n
        ]
        batch_labels = y[seen : seen + n]
        if len(batch_labels) == n:
            correct += int((class_logits(logits).argmax(axis=1) == batch_labels).sum())
            scored = {"z": logits, "y": batch_labels[:, None].astype(np.float32)}
            reservoir.add({"f": hidden} | scored)
            if len(candidates) > 1:
                others.add({f"f:{c}": features[c] for c in candidates if c != layer} | scored)
        seen += n
    if seen != len(y):
        raise ConfigError(
            f"reference labels: expected {seen} labels (one per reference sample), got {len(y)}"
        )
    if collector.positions:
        raise ConfigError(
            "reference labels: expected logits [batch, classes], got per-position logits "
            "([batch, positions, classes], or a class map): the accuracy estimate is per "
            "sample; archive it without labels"
        )
    accuracy = correct / seen if seen else math.nan
    fitted = {layer: _fit(reservoir.take(), "f", config, seed)}
    if len(candidates) > 1 and abs(fitted[layer].reference_score - accuracy) > MAX_ESTIMATE_GAP:
        # Only where the default reads far: a default that reads near is kept as it was.
        rows = others.take()
        fitted |= {c: _fit(rows, f"f:{c}", config, seed) for c in candidates if c != layer}
    layer, estimator = _closest(fitted, layer, accuracy)
    estimator = dataclasses.replace(estimator, reference_accuracy=accuracy)
    log.info(
        "hookwatch: accuracy estimator of model %r fitted on %d labelled reference samples in "
        "layer %r: reference accuracy %.3f, its own estimate %.3f (k = %d, %d kept, %.0f KiB)",
        profile.model,
        seen,
        layer,
        accuracy,
        estimator.reference_score,
        estimator.k,
        estimator.reference_n,
        estimator.state_bytes() / 1024,
    )
    return dataclasses.replace(profile, accuracy=estimator, accuracy_layer=layer)
