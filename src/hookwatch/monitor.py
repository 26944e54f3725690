"""The monitor one model gets: sampling gate, hooks, capture worker and metric publishing.

Request path (``request()`` and the hooks): one random draw and an integer tally per batch; on
a sampled forward, per hook an owned copy (small activations) or the cheap reduction (large ones)
appended to the forward's record, and at the end one non-blocking hand-off of that record.
Capture path (the worker thread): batched reductions in numpy, drift windows, and tallies that
are published to prometheus-client once per ``flush_interval_s`` (request counts included), so
the cost of metric writes follows the number of series, not the traffic.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import torch
from torch import nn

from hookwatch.config import INPUT_LAYER, MonitoringConfig
from hookwatch.drift import DriftResult, DriftTracker, IntArray
from hookwatch.hooks import Capture, Gate, HookSet, HookState
from hookwatch.metrics import MetricSet
from hookwatch.stats import (
    INF_COLUMN,
    NAN_COLUMN,
    SUMMARY_STATISTICS,
    feature_rows,
    reduce_rows,
)
from hookwatch.worker import CaptureWorker, RateLimitedLog

log = logging.getLogger("hookwatch")

#: ``layer`` label for faults that belong to no single layer.
ALL_LAYERS = "all"
#: The capture thread checks the queue this often: its work (numpy, drift windows) then comes
#: in batches, and it takes the GIL from the request thread at most ~20 times a second, not per
#: request. The default queue holds 1024 sampled forwards, far more than arrive in one gap.
DRAIN_GAP_S = 0.05
#: ... and drains once this many sampled forwards wait (or a publish is due). Processing costs
#: ~0.7 ms per drain whatever its size plus ~40 µs per record (demo CNN, five layers): at the
#: default sampling a drain every gap would hold ~5 records and spend most of its time on the
#: fixed part. 64 records keep one drain to a few milliseconds, so a request waits on the
#: capture thread no longer than before.
DRAIN_BATCH = 64

#: What the hooks of one sampled forward pass captured, handed off as one item.
Record = list[Capture]


class _RequestScope:
    __slots__ = ("_monitor", "sampled")

    def __init__(self, monitor: Monitor, sampled: bool) -> None:
        self._monitor = monitor
        self.sampled = sampled

    def __enter__(self) -> _RequestScope:
        if self.sampled:
            self._monitor._begin_record()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.sampled:
            # A forward that raised hands off nothing: half a record would skew the per-layer
            # counts against each other.
            self._monitor._end_record(keep=exc_type is None)


@dataclass
class _LayerTally:
    """A layer's statistics since the last publish (capture thread, under the pending lock)."""

    captures: int = 0
    nan: float = 0.0
    inf: float = 0.0
    finite: int = 0
    sums: np.ndarray[Any, np.dtype[np.float64]] = field(
        default_factory=lambda: np.zeros(len(SUMMARY_STATISTICS))
    )


@dataclass
class _DriftTally:
    """A detector's verdicts since the last publish: how many, how many alarmed, the latest."""

    latest: DriftResult
    windows: int = 0
    alarms: int = 0


class Monitor:
    """Watches one model. Create with :meth:`attach`; call :meth:`close` on unload."""

    def __init__(self, config: MonitoringConfig, model_name: str, metrics: MetricSet) -> None:
        self.config = config
        self.model_name = model_name
        self.metrics = metrics
        self.gate = Gate()
        self.hooks = HookSet(self.gate, self, config.max_features, config.copy_limit)
        self.worker: CaptureWorker[Record] = CaptureWorker(
            config.queue_size,
            self._process,
            self._publish,
            config.flush_interval_s,
            poll_s=DRAIN_GAP_S,
            min_batch=DRAIN_BATCH,
        )
        # The record of the sampled forward running on this thread, if any.
        self._local = threading.local()
        self._rng = random.Random(config.seed)
        self._log = RateLimitedLog(log)
        # Request tallies: the request path adds, every publish exports the difference to the
        # counters below (bound once to skip label lookups).
        self._count_lock = threading.Lock()
        self.requests = 0
        self.sampled = 0
        self.rejected = 0
        self._requests_total = metrics.counter("hookwatch_requests_total", model=model_name)
        self._sampled_total = metrics.counter("hookwatch_requests_sampled_total", model=model_name)
        self._rejected_total = metrics.counter(
            "hookwatch_requests_rejected_total", model=model_name
        )
        self._dropped_total = metrics.counter("hookwatch_captures_dropped_total", model=model_name)
        self._hook_faults: dict[str, int] = defaultdict(int)
        # Worker-thread state.
        self._published: dict[str, int] = defaultdict(int)
        self._disabled: set[str] = set()
        self._process_faults: dict[str, int] = defaultdict(int)
        #: Sliding-window drift tests (capture thread only); None without a profile.
        self.drift: DriftTracker | None = None
        #: Features kept per layer where the profile projects it (its input width).
        self._widths: dict[str, int] = {}
        self._drift_off: set[str] = set()
        #: Fleet-wide drift counters per (detector, kept feature, bin), bound once at load.
        self._bin_counters: dict[str, dict[tuple[int, int], Any]] = {}
        # Results waiting for the next publish; the capture thread adds, publishing swaps them
        # out. One lock for the three, held only to add or to swap.
        self._pending_lock = threading.Lock()
        self._pending_layers: dict[str, _LayerTally] = defaultdict(_LayerTally)
        self._pending_drift: dict[str, _DriftTally] = {}
        self._pending_bins: dict[str, IntArray] = {}
        # Publishing runs on the worker's tick and from flush(): one lock keeps deltas exact.
        self._publish_lock = threading.Lock()

    @classmethod
    def attach(
        cls,
        model: nn.Module,
        config: MonitoringConfig,
        model_name: str,
        metrics: MetricSet | None = None,
        drift: DriftTracker | None = None,
    ) -> Monitor:
        monitor = cls(config, model_name, metrics if metrics is not None else MetricSet())
        monitor.drift = drift if config.enabled else None
        if monitor.drift is not None:
            monitor.drift.tallied = frozenset(config.drift.fleet_detectors) & set(
                monitor.drift.references
            )
        if monitor.drift is not None:
            monitor._widths = monitor.drift.feature_widths()
        if config.enabled:
            monitor.hooks.attach(
                model,
                config.layers,
                config.capture_input,
                config.capture_output,
                widths=monitor._widths,
            )
        monitor._declare_series()
        monitor.worker.start()
        return monitor

    # -- request path -------------------------------------------------------------------------

    def request(self, batch_size: int = 1) -> _RequestScope:
        """Count ``batch_size`` requests and decide whether this forward pass is captured."""
        rate = self.config.sample_rate
        sampled = self.config.enabled and rate > 0.0 and (rate >= 1.0 or self._rng.random() < rate)
        # Plain integers under an uncontended lock: the capture thread publishes them. An
        # exported counter's increment here (a lock, a struct pack into a memory-mapped file,
        # three Python frames) measured ~13 µs per request between the layers of a real forward.
        with self._count_lock:
            self.requests += batch_size
            if sampled:
                self.sampled += batch_size
        return _RequestScope(self, sampled)

    def reject(self, count: int = 1) -> None:
        with self._count_lock:
            self.rejected += count

    def _begin_record(self) -> None:
        self._local.record = []
        self.gate.set(True)

    def _end_record(self, keep: bool) -> None:
        self.gate.set(False)
        record: Record | None = getattr(self._local, "record", None)
        self._local.record = None
        if record and keep:
            self._hand_off(record)

    def _hand_off(self, record: Record) -> bool:
        if self.worker.offer(record):
            return True
        self._dropped_total.inc(len(record))
        return False

    def offer(self, capture: Capture) -> bool:
        """The hooks' sink: add to the running forward's record (a list append, never blocks)."""
        record: Record | None = getattr(self._local, "record", None)
        if record is None:
            # The gate was opened without a request scope: hand the capture off on its own.
            return self._hand_off([capture])
        record.append(capture)
        return True

    def on_fault(self, layer: str, error: BaseException) -> None:
        self._hook_faults[layer] += 1
        self._log.warning(
            f"hook:{layer}",
            "hookwatch: hook on layer %r of model %r failed (%s: %s); capture for that layer is "
            "off, serving continues",
            layer,
            self.model_name,
            type(error).__name__,
            error,
        )

    # -- capture path -------------------------------------------------------------------------

    def _declare_series(self) -> None:
        m, name = self.metrics, self.model_name
        for counter in (
            "hookwatch_requests_total",
            "hookwatch_requests_sampled_total",
            "hookwatch_requests_rejected_total",
            "hookwatch_captures_dropped_total",
        ):
            m.touch(counter, model=name)
        m.set("hookwatch_capture_queue_capacity", self.worker.capacity, model=name)
        m.set("hookwatch_capture_queue_depth", 0, model=name)
        for layer in self.config.watched if self.config.enabled else ():
            m.touch("hookwatch_captures_total", model=name, layer=layer)
            m.touch("hookwatch_monitor_faults_total", model=name, layer=layer)
            m.set("hookwatch_layer_enabled", 1, model=name, layer=layer)
            for kind in ("nan", "inf"):
                m.touch("hookwatch_activation_nonfinite_total", model=name, layer=layer, kind=kind)
            for statistic in SUMMARY_STATISTICS:
                m.touch(
                    "hookwatch_activation_statistic", model=name, layer=layer, statistic=statistic
                )
        m.set("hookwatch_drift_profile_loaded", 1 if self.drift is not None else 0, model=name)
        if self.drift is not None:
            for detector, ref in self.drift.references.items():
                labels = {"model": name, "level": ref.level, "detector": detector}
                m.set(
                    "hookwatch_drift_threshold",
                    self.drift.calibration.thresholds[detector],
                    **labels,
                )
                m.set("hookwatch_drift_detected", 0, **labels)
                m.touch("hookwatch_drift_windows_total", **labels)
                m.touch("hookwatch_drift_alarms_total", **labels)
            m.set("hookwatch_drift_window_samples", self.drift.window, model=name)
            self._declare_fleet_bins()

    def _declare_fleet_bins(self) -> None:
        """Per-bin counters and reference counts of the fleet detectors (bins that exist only).

        The ``feature`` label is the feature's index in the detector's input, fixed by the
        profile; ``bin`` is the bin's index. Neither ever comes from request content.
        """
        assert self.drift is not None
        m = self.metrics
        for detector in sorted(self.drift.tallied):
            ref = self.drift.references[detector]
            valid = ref.valid
            bound: dict[tuple[int, int], Any] = {}
            for f, feature in enumerate(ref.kept):
                for k in range(ref.n_bins):
                    if not valid[f, k]:
                        continue
                    labels = {
                        "model": self.model_name,
                        "detector": detector,
                        "feature": str(feature),
                        "bin": str(k),
                    }
                    m.set("hookwatch_drift_reference_bin_samples", int(ref.counts[f, k]), **labels)
                    bound[(f, k)] = m.counter("hookwatch_drift_bin_samples_total", **labels)
            self._bin_counters[detector] = bound

    def _process(self, records: Sequence[Record]) -> None:
        by_layer: dict[str, list[Capture]] = defaultdict(list)
        for record in records:
            for capture in record:
                by_layer[capture.layer].append(capture)
        for layer, items in by_layer.items():
            if layer in self._disabled:
                continue
            try:
                self._process_layer(layer, items)
            except Exception as error:
                self._disabled.add(layer)
                self.hooks.disable(layer)
                self._fault("processing", layer, error, "capture for that layer is off")
        if self.drift is not None:
            counts = self.drift.take_counts()
            if counts:
                with self._pending_lock:
                    for detector, tally in counts.items():
                        pending = self._pending_bins.get(detector)
                        self._pending_bins[detector] = tally if pending is None else pending + tally

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
            width = self._widths.get(layer, self.config.max_features)
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
        with self._pending_lock:
            tally = self._pending_layers[layer]
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
                with self._pending_lock:
                    for result in results:
                        pending = self._pending_drift.get(result.detector)
                        if pending is None:
                            pending = self._pending_drift[result.detector] = _DriftTally(result)
                        pending.latest = result
                        pending.windows += 1
                        pending.alarms += 1 if result.is_drift else 0
        except Exception as error:
            self._drift_off.add(layer)
            self._fault(
                "drift tests", layer, error, "drift for that layer is off, statistics continue"
            )

    def _publish_bins(self, counts: dict[str, IntArray]) -> None:
        # One locked increment per non-empty bin and publish: a few hundred writes a second.
        for detector, tally in counts.items():
            bound = self._bin_counters.get(detector, {})
            for f, k in zip(*np.nonzero(tally), strict=True):
                child = bound.get((int(f), int(k)))
                if child is not None:
                    child.inc(int(tally[f, k]))

    def _fault(self, what: str, layer: str, error: Exception, consequence: str) -> None:
        """Count a capture-thread fault on ``layer`` and log it, rate-limited per kind."""
        self._process_faults[layer] += 1
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

    def _publish_layer(self, layer: str, tally: _LayerTally) -> None:
        labels = {"model": self.model_name, "layer": layer}
        m = self.metrics
        m.inc("hookwatch_captures_total", tally.captures, **labels)
        m.inc("hookwatch_activation_nonfinite_total", tally.nan, kind="nan", **labels)
        m.inc("hookwatch_activation_nonfinite_total", tally.inf, kind="inf", **labels)
        for column, statistic in enumerate(SUMMARY_STATISTICS):
            m.observe_many(
                "hookwatch_activation_statistic",
                tally.finite,
                float(tally.sums[column]),
                statistic=statistic,
                **labels,
            )

    def _publish_drift(self, tally: _DriftTally) -> None:
        result = tally.latest
        labels = {"model": self.model_name, "level": result.level, "detector": result.detector}
        m = self.metrics
        m.set("hookwatch_drift_score", result.score, **labels)
        m.set("hookwatch_drift_threshold", result.threshold, **labels)
        m.set("hookwatch_drift_detected", 1 if result.is_drift else 0, **labels)
        m.inc("hookwatch_drift_windows_total", tally.windows, **labels)
        m.inc("hookwatch_drift_alarms_total", tally.alarms, **labels)

    def _delta(self, key: str, current: int) -> int:
        delta = current - self._published[key]
        self._published[key] = current
        return delta

    def _publish(self) -> None:
        with self._publish_lock:
            self._publish_locked()

    def _publish_locked(self) -> None:
        m, name = self.metrics, self.model_name
        with self._pending_lock:
            layers, self._pending_layers = self._pending_layers, defaultdict(_LayerTally)
            drift, self._pending_drift = self._pending_drift, {}
            bins, self._pending_bins = self._pending_bins, {}
        with self._count_lock:
            counts = (
                (self._requests_total, "requests", self.requests),
                (self._sampled_total, "sampled", self.sampled),
                (self._rejected_total, "rejected", self.rejected),
            )
        for counter, key, current in counts:
            delta = self._delta(key, current)
            if delta:
                counter.inc(delta)
        for layer, tally in layers.items():
            self._publish_layer(layer, tally)
        for detector in sorted(drift):
            self._publish_drift(drift[detector])
        self._publish_bins(bins)
        m.set("hookwatch_capture_queue_depth", self.worker.depth, model=name)
        faults = dict(self._hook_faults)
        for layer, count in self._process_faults.items():
            faults[layer] = faults.get(layer, 0) + count
        faults[ALL_LAYERS] = self.worker.faults
        for layer, count in faults.items():
            m.inc(
                "hookwatch_monitor_faults_total",
                self._delta(f"faults:{layer}", count),
                model=name,
                layer=layer,
            )
        for layer, state in self.hooks.layer_states().items():
            m.set(
                "hookwatch_layer_enabled",
                1 if state is HookState.ATTACHED else 0,
                model=name,
                layer=layer,
            )

    # -- lifecycle ----------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every accepted capture is processed, then publish (tests, shutdown)."""
        idle = self.worker.wait_idle(timeout)
        self._publish()
        return idle

    def close(self) -> None:
        self.hooks.detach()
        self.worker.stop()
