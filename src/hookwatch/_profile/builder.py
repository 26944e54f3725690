"""Building a drift profile: reference data through the serving hooks, binned and bounded.

The builder keeps a uniform reservoir of at most ``max_reference`` samples per layer and
forgets everything else, so any amount of reference data fits in bounded memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from hookwatch._config import MonitoringConfig, as_monitoring_config
from hookwatch._drift import BinnedReference, Projection, derive
from hookwatch._errors import ProfileError
from hookwatch._hooks import Capture, Gate, HookSet
from hookwatch._names import OUTPUT_LAYER, level_of
from hookwatch._profile.format import DriftProfile

__all__ = ["build_profile", "capture_features"]

log = logging.getLogger("hookwatch")


class _Collector:
    """A capture sink that keeps features in process (profile building only, never serving)."""

    def __init__(self) -> None:
        self.features: dict[str, list[NDArray[np.float32]]] = {}
        self.faults: list[tuple[str, BaseException]] = []

    def offer(self, capture: Capture) -> bool:
        if capture.features is not None:
            self.features.setdefault(capture.layer, []).append(capture.features.cpu().numpy())
        return True

    def on_fault(self, layer: str, error: BaseException) -> None:
        self.faults.append((layer, error))


class _Reservoir:
    """A uniform sample of at most ``size`` rows, aligned across layers (Vitter's algorithm R)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.rows: dict[str, NDArray[np.float32]] = {}
        self.seen = 0
        self._rng = np.random.default_rng(seed)

    def add(self, batch: Mapping[str, NDArray[np.float32]]) -> None:
        n = len(next(iter(batch.values())))
        for layer, x in batch.items():
            if len(x) != n:
                raise ValueError(f"expected {n} rows for layer {layer!r}, got {len(x)}")
            if layer not in self.rows:
                self.rows[layer] = np.empty((self.size, x.shape[1]), dtype=np.float32)
        for i in range(n):
            t = self.seen + i
            slot = t if t < self.size else int(self._rng.integers(0, t + 1))
            if slot < self.size:
                for layer, x in batch.items():
                    self.rows[layer][slot] = x[i]
        self.seen += n

    def take(self) -> dict[str, NDArray[np.float32]]:
        kept = min(self.seen, self.size)
        return {layer: rows[:kept] for layer, rows in self.rows.items()}


def capture_features(
    model: nn.Module,
    config: MonitoringConfig,
    batches: Iterable[torch.Tensor],
) -> Iterable[dict[str, NDArray[np.float32]]]:
    """Yield, per batch, the features the serving hooks capture for every watched layer.

    With ``drift.projection: pca`` every layer but the output is captured up to
    ``drift.projection_width`` features, so a wide one can be projected.
    """
    collector = _Collector()
    gate = Gate()
    hooks = HookSet(gate, collector, config.max_features)
    widths = (
        {layer: config.drift.projection_width for layer in config.watched if layer != OUTPUT_LAYER}
        if config.drift.projection == "pca"
        else None
    )
    model.eval()
    with hooks.attach(
        model, config.layers, config.capture_input, config.capture_output, widths=widths
    ):
        for batch in batches:
            gate.set(True)
            try:
                with torch.inference_mode():
                    model(batch)
            finally:
                gate.set(False)
            if collector.faults:
                layer, error = collector.faults[0]
                raise RuntimeError(f"capturing layer {layer!r} failed: {error!r}")
            yield {k: np.concatenate(v) for k, v in collector.features.items()}
            collector.features.clear()


def build_profile(
    model: nn.Module,
    config: MonitoringConfig | Mapping[str, Any] | None,
    batches: Iterable[torch.Tensor],
    model_name: str = "model",
    bins: int | None = None,
    max_reference: int = 20_000,
    max_codes: int = 4096,
    aggregation: str = "mean",
    progress: bool = False,
    total: int | None = None,
    seed: int = 0,
) -> DriftProfile:
    """Run reference ``batches`` through ``model`` with the serving hooks and bin what they
    capture: the profile :func:`hookwatch.watch` tests drift against.

    The reference should be data the model was not fitted on (held-out data, or a sample of
    known-good traffic): training data describes an over-confident model. At most
    ``max_reference`` samples are kept (a uniform reservoir), whatever the amount of data;
    ``bins`` defaults to ``config.drift.bins``. ``progress`` shows a bar where tqdm is installed.
    """
    config = as_monitoring_config(config)
    bins = config.drift.bins if bins is None else bins
    reservoir = _Reservoir(max_reference, seed)
    iterator: Iterable[torch.Tensor] = batches
    if progress:
        try:
            from tqdm import tqdm
        except ImportError:  # a progress bar is a nicety of the tools extra
            pass
        else:
            iterator = tqdm(batches, total=total, unit="batch", desc="profile")
    for features in capture_features(model, config, iterator):
        reservoir.add(features)
    sample = reservoir.take()
    references: dict[str, BinnedReference] = {}
    codes_rng = np.random.default_rng(seed + 1)
    n = min(reservoir.seen, max_reference)
    if n < 2:
        raise ProfileError(f"expected at least 2 reference samples, got {n}")
    pick = np.sort(codes_rng.choice(n, size=min(n, max_codes), replace=False))
    projections: dict[str, Projection] = {}
    for layer in config.watched:
        values: NDArray[Any] = sample[layer]
        # The output stays per class: its softmax and the predictions need every logit.
        if layer != OUTPUT_LAYER and values.shape[1] > config.max_features:
            projection = projections[layer] = Projection.fit(layer, values, config.max_features)
            values = projection.apply(values)
            log.info(
                "hookwatch: layer %r has %d features; drift tests %d principal components "
                "(%.1f %% of the reference variance)%s",
                layer,
                projection.input_width,
                projection.components.shape[1],
                100 * projection.explained,
                " and the residual distance" if projection.residual else "",
            )
        for name, x in derive(layer, values, OUTPUT_LAYER).items():
            if name != layer and name in config.watched:
                raise ValueError(f"expected no watched layer named like detector {name!r}")
            if name == "class_mix":
                classes = sample[layer].shape[1]
                ref = BinnedReference.categorical(name, level_of(name), x[:, 0], classes, n)
            else:
                ref = BinnedReference.fit(
                    name, level_of(name), x, bins, max_codes=n, aggregation=aggregation
                )
            # Aligned calibration sample: the same reference rows for every detector.
            references[name] = BinnedReference(
                ref.name,
                ref.level,
                ref.edges,
                ref.counts,
                ref.codes[pick],
                ref.aggregation,
                ref.dropped,
                ref.kept,
            )
    return DriftProfile(
        model=model_name,
        references=references,
        layers=tuple(config.watched),
        n_seen=reservoir.seen,
        bins=bins,
        max_features=config.max_features,
        created=time.time(),
        projections=projections,
    )
