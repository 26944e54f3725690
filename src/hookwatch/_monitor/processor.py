"""The capture path's work, with no thread and no Prometheus: records in, tallies out.

:meth:`CaptureProcessor.process` turns a batch of records into per-layer statistic tallies,
drift verdicts and fleet bin counts; :meth:`CaptureProcessor.take` hands what accumulated to
whoever publishes it and starts afresh. The capture thread calls both; a test can call them
directly.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hookwatch._capture import RateLimitedLog
from hookwatch._drift import DriftResult, DriftTracker, IntArray
from hookwatch._hooks import Capture
from hookwatch._monitor.gate import Record
from hookwatch._names import INPUT_LAYER, SUMMARY_STATISTICS
from hookwatch._stats import INF_COLUMN, NAN_COLUMN, feature_rows, reduce_rows

__all__ = ["CaptureProcessor", "DriftTally", "LayerTally", "Processed"]

log = logging.getLogger("hookwatch")


@dataclass
class LayerTally:
    """A layer's statistics since the last take."""

    captures: int = 0
    nan: float = 0.0
    inf: float = 0.0
    finite: int = 0
    sums: np.ndarray[Any, np.dtype[np.float64]] = field(
        default_factory=lambda: np.zeros(len(SUMMARY_STATISTICS))
    )


@dataclass
class DriftTally:
    """A detector's verdicts since the last take: how many, how many alarmed, the latest."""

    latest: DriftResult
    windows: int = 0
    alarms: int = 0


@dataclass
class Processed:
    """What accumulated between two takes."""

    layers: dict[str, LayerTally] = field(default_factory=lambda: defaultdict(LayerTally))
    drift: dict[str, DriftTally] = field(default_factory=dict)
    #: Fleet bin counts ``[F, K]`` per tallied detector.
    bins: dict[str, IntArray] = field(default_factory=dict)
    #: The detectors that alarmed first in the current alarm episode, as of the last drain
    #: with verdicts (None: no verdict since the last take).
    first_alarms: frozenset[str] | None = None
    #: Per detector with a sequential test: its alarms so far (cumulative) and its current
    #: log evidence, as of the last drain.
    sequential: dict[str, tuple[int, float]] = field(default_factory=dict)


class CaptureProcessor:
    """Reduces records, feeds drift windows and tallies results until :meth:`take`.

    A failure processing a layer switches that layer off (``on_layer_off`` is told, so the
    monitor can stop its hook) and a failure feeding its drift windows ends drift for it; both
    are counted in :attr:`faults` and logged, rate-limited.
    """

    def __init__(
        self,
        model_name: str,
        max_features: int,
        drift: DriftTracker | None = None,
        widths: Mapping[str, int] | None = None,
        on_layer_off: Callable[[str], None] | None = None,
    ) -> None:
        self.model_name = model_name
        self.drift = drift
        self._max_features = max_features
        #: Features kept per layer where more than max_features are needed: a projected
        #: layer's input width, every logit of the output.
        self.widths: dict[str, int] = dict(widths or {})
        self._on_layer_off = on_layer_off
        self._log = RateLimitedLog(log)
        self._disabled: set[str] = set()
        self._drift_off: set[str] = set()
        # One lock for what take() swaps out and the fault counts; held only to add or copy.
        self._lock = threading.Lock()
        self._pending = Processed()
        self._faults: dict[str, int] = defaultdict(int)

    def process(self, records: Sequence[Record]) -> None:
        if self.drift is not None:
            self.drift.new_round()
        by_layer: dict[str, list[Capture]] = defaultdict(list)
        for record in records:
            for layer, capture in record.items():
                by_layer[layer].append(capture)
        for layer, items in by_layer.items():
            if layer in self._disabled:
                continue
            try:
                self._process_layer(layer, items)
            except Exception as error:
                self._disabled.add(layer)
                if self._on_layer_off is not None:
                    self._on_layer_off(layer)
                self._fault("processing", layer, error, "capture for that layer is off")
        if self.drift is not None:
            counts = self.drift.take_counts()
            sequential = self.drift.sequential_state()
            for alarm in self.drift.take_alarms():
                # An alarm is the paging event; on a lasting shift the restarted test alarms
                # again every few dozen samples, hence one line per detector a minute.
                self._log.warning(
                    f"alarm:{alarm.detector}",
                    "hookwatch: drift alarm on %r (level %s) of model %r: its anytime-valid "
                    "test's evidence reached e^%.1f after %d sampled requests",
                    alarm.detector,
                    alarm.level,
                    self.model_name,
                    alarm.log_evidence,
                    alarm.position,
                )
            with self._lock:
                self._pending.sequential = sequential
            if counts:
                with self._lock:
                    bins = self._pending.bins
                    for detector, tally in counts.items():
                        pending = bins.get(detector)
                        bins[detector] = tally if pending is None else pending + tally

    def take(self) -> Processed:
        """Everything processed since the last call; the next call starts from nothing."""
        with self._lock:
            taken, self._pending = self._pending, Processed()
        return taken

    @property
    def faults(self) -> dict[str, int]:
        """Faults so far per layer (cumulative)."""
        with self._lock:
            return dict(self._faults)

    def _reduce(
        self, layer: str, items: Sequence[Capture]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
        """Statistics ``[N, 7]`` and drift features ``[N, F]`` of a layer's captures.

        Raw copies of small activations are stacked and reduced together in numpy, a batch per
        sample shape; captures the hook already reduced only move to the host.
        """
        stats: list[np.ndarray[Any, Any]] = []
        features: list[np.ndarray[Any, Any]] = []
        groups: dict[tuple[object, ...], list[torch.Tensor]] = defaultdict(list)
        for c in items:
            if c.raw is not None:
                groups[(tuple(c.raw.shape[1:]), c.raw.dtype)].append(c.raw)
            else:
                if c.stats is not None:
                    stats.append(c.stats.cpu().numpy())
                if c.features is not None:
                    features.append(c.features.cpu().numpy())
        for tensors in groups.values():
            batch = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
            if batch.is_floating_point() and batch.dtype not in (torch.float32, torch.float64):
                batch = batch.float()  # half precision has no numpy twin on every build
            x = batch.cpu().numpy()
            stats.append(reduce_rows(x))
            width = self.widths.get(layer, self._max_features)
            features.append(feature_rows(x, width, flatten=layer == INPUT_LAYER))
        feats = (
            None if not features else np.concatenate(features) if len(features) > 1 else features[0]
        )
        return np.concatenate(stats) if len(stats) > 1 else stats[0], feats

    def _process_layer(self, layer: str, items: Sequence[Capture]) -> None:
        stats, features = self._reduce(layer, items)
        nonfinite = (stats[:, NAN_COLUMN] != 0) | (stats[:, INF_COLUMN] != 0)
        finite = stats[~nonfinite] if nonfinite.any() else stats
        sums = finite[:, : len(SUMMARY_STATISTICS)].sum(axis=0, dtype=np.float64)
        with self._lock:
            tally = self._pending.layers[layer]
            tally.captures += len(stats)
            tally.nan += float(stats[:, NAN_COLUMN].sum())
            tally.inf += float(stats[:, INF_COLUMN].sum())
            tally.finite += len(finite)
            tally.sums += sums
        if self.drift is not None and layer not in self._drift_off and features is not None:
            self._update_drift(layer, features)

    def _update_drift(self, layer: str, features: np.ndarray[Any, Any]) -> None:
        """Feed the layer's features to its drift windows; a failure ends drift for that layer."""
        assert self.drift is not None
        try:
            # Non-finite samples are counted above; binning them would call them drift.
            if not np.isfinite(features).all():
                features = features[np.isfinite(features).all(axis=1)]
            if not len(features):
                return
            results = self.drift.update(layer, features)
            if results:
                with self._lock:
                    self._pending.first_alarms = self.drift.first_alarms
                    drift = self._pending.drift
                    for result in results:
                        pending = drift.get(result.detector)
                        if pending is None:
                            pending = drift[result.detector] = DriftTally(result)
                        pending.latest = result
                        pending.windows += 1
                        pending.alarms += 1 if result.is_drift else 0
        except Exception as error:
            self._drift_off.add(layer)
            self._fault(
                "drift tests", layer, error, "drift for that layer is off, statistics continue"
            )

    def _fault(self, what: str, layer: str, error: Exception, consequence: str) -> None:
        """Count a fault on ``layer`` and log it, rate-limited per kind."""
        with self._lock:
            self._faults[layer] += 1
        self._log.warning(
            f"{what}:{layer}",
            "hookwatch: %s on layer %r of model %r failed (%s: %s); %s, serving continues",
            what,
            layer,
            self.model_name,
            type(error).__name__,
            error,
            consequence,
        )
