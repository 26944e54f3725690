"""Detector inputs derived from one layer's captured features. Pure numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from hookwatch._drift.bins import FloatArray
from hookwatch._names import OUTPUT_LAYER

__all__ = ["class_logits", "derive", "softmax"]


def softmax(logits: NDArray[Any]) -> FloatArray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    result: FloatArray = e / e.sum(axis=1, keepdims=True)
    return result


def class_logits(logits: NDArray[Any]) -> FloatArray:
    """Logits ``[N, C]`` as one logit per class: a binary classifier's one logit ``z`` a
    sample (``[N, 1]``, the form ``BCEWithLogitsLoss`` trains) as ``[0, z]``, whose softmax is
    ``[1 - sigmoid(z), sigmoid(z)]``: class 1 when ``z > 0``. Wider logits as they are."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 2 and z.shape[1] == 1:
        return np.concatenate([np.zeros_like(z), z], axis=1)
    return z


def derive(
    layer: str,
    features: NDArray[Any],
    output_layer: str = OUTPUT_LAYER,
    head: str = "logits",
    positions: bool = False,
) -> dict[str, FloatArray]:
    """Detector inputs from one layer's captured features ``[B, F]``.

    A hidden layer (or the input) is one detector of its own features. The output depends on
    its head: logits give four detectors, per-class softmax (black-box shift detection),
    confidence (top probability), entropy and the predicted class; regression values and
    embeddings are one detector of their features, like a layer; ``none`` gives none.

    With ``positions``, the output's logits were ``[B, T, C]`` and its features are
    :func:`hookwatch._stats.position_summary`'s ``[B, C + 2]``: the four detectors are then
    the sample's class mix over its positions (each class's share of the positions, per
    class), the mean over positions of the confidence and of the entropy, and the sample's
    most frequent class.
    """
    x = np.asarray(features, dtype=np.float64)
    if layer != output_layer:
        return {layer: x}
    if head == "none":
        return {}
    if head != "logits":
        return {"output": x}
    if positions:
        shares = x[:, :-2]
        return {
            "output": shares,
            "confidence": -x[:, -2:-1],
            "entropy": -x[:, -1:],
            "class_mix": shares.argmax(axis=1).astype(np.float64)[:, None],
        }
    p = softmax(class_logits(x))
    entropy = -(p * np.log(np.maximum(p, 1e-12))).sum(axis=1, keepdims=True)
    return {
        "output": p,
        "confidence": p.max(axis=1, keepdims=True),
        "entropy": entropy,
        "class_mix": p.argmax(axis=1).astype(np.float64)[:, None],
    }
