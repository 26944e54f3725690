"""Principal components of a wide layer on the reference, plus the distance from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from hookwatch._drift.bins import FloatArray, expect

__all__ = ["SAMPLES_PER_COMPONENT", "Projection", "component_count"]

#: Principal directions with less variance than this share of the largest are not kept.
_RELATIVE_RANK_TOL = 1e-10
#: A row whose distance from the components' subspace holds less than this share of its
#: squared norm gets the distance from an explicit reconstruction (see Projection.apply).
_EXACT_SHARE = 1e-2
#: Reference samples per principal component: components fitted on fewer describe the
#: reference, not the data, and held-out data differs from them on every window (measured on
#: the text demo: 255 components from 470 texts alarmed on every clean window, 15 on none).
SAMPLES_PER_COMPONENT = 25


def component_count(samples: int, budget: int, requested: int | None = None) -> int:
    """Principal components a projection of a layer keeps, out of ``budget`` features per
    layer (the distance from the components is one more): ``requested`` when the config asks
    for a number, else one per :data:`SAMPLES_PER_COMPONENT` of the ``samples`` reference
    samples (at least one), never more than ``budget - 1``::

        component_count(2000, 256)  # 80: a 784-pixel input from 2,000 reference images
    """
    wanted = requested if requested is not None else max(1, samples // SAMPLES_PER_COMPONENT)
    return max(0, min(budget - 1, wanted))


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
        expect(
            self.components.ndim == 2 and self.components.shape[0] == w,
            f"components [{w}, c] for a mean of shape {self.mean.shape}",
            self.components.shape,
        )
        expect(0.0 <= self.explained <= 1.0, "an explained share in [0, 1]", self.explained)

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
        expect(x.ndim == 2 and x.shape[0] >= 2, "reference features [N >= 2, W]", x.shape)
        expect(k >= 1, "k >= 1", k)
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
        expect(
            x.ndim == 2 and x.shape[1] == self.input_width,
            f"features [B, {self.input_width}] for the projection of {self.layer!r}",
            x.shape,
        )
        centred = x - self.mean
        # The products in torch, not numpy: numpy's OpenBLAS starts a thread per core that
        # spins between calls, CPU taken from serving, while torch's pool is the one the
        # model's config sizes (torch_threads; the monitor gives the capture thread the same
        # count, Monitor._match_torch_threads).
        xs = torch.from_numpy(centred)
        components = torch.from_numpy(self.components)
        scores_t = xs @ components
        scores = scores_t.numpy()
        if not self.residual:
            return scores.astype(np.float64)
        # The distance from the components' subspace without reconstructing the rows: with
        # orthonormal components, |x - P P'x|^2 = |x|^2 - |P'x|^2. A reconstruction reads the
        # components a second time (18 MB for ResNet-18's input), whatever the drain's size.
        # Where the residual is a small share of the row the difference of two large sums
        # loses digits: those rows (rare for a layer wide enough to be projected) are
        # reconstructed.
        total = np.einsum("ij,ij->i", centred, centred, dtype=np.float64)
        rest2 = total - np.einsum("ij,ij->i", scores, scores, dtype=np.float64)
        close = np.flatnonzero(rest2 < _EXACT_SHARE * total)
        if close.size:
            rows = torch.from_numpy(close)
            rest = (xs[rows] - scores_t[rows] @ components.T).numpy()
            rest2[close] = np.einsum("ij,ij->i", rest, rest, dtype=np.float64)
        distance = np.sqrt(np.maximum(rest2, 0.0))
        result: FloatArray = np.concatenate([scores, distance[:, None]], axis=1, dtype=np.float64)
        return result
