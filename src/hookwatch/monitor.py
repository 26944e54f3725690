"""The monitor one model gets: sampling gate, hooks, capture worker and metric publishing.

Request path (``request()`` and the hooks): one in-place counter increment per batch, one
random draw, the gate, an owned copy (small activations) or the cheap reduction (large ones),
and a non-blocking queue put. Capture path (the worker thread): batched reductions, host
copies, numpy, drift windows and every other prometheus-client write.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import defaultdict
from collections.abc import Sequence
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
    feature_summary,
    reduce_activation,
)
from hookwatch.worker import CaptureWorker, RateLimitedLog

log = logging.getLogger("hookwatch")

#: ``layer`` label for faults that belong to no single layer.
ALL_LAYERS = "all"
#: The capture thread drains at most this often: its work (numpy, metric writes) then comes in
#: batches, and it takes the GIL from the request thread ~20 times a second, not per request.
#: The default queue holds 1024 captures, ~200 sampled requests of 5 hook points per gap.
DRAIN_GAP_S = 0.05


class _RequestScope:
    __slots__ = ("_gate", "sampled")

    def __init__(self, gate: Gate, sampled: bool) -> None:
        self._gate = gate
        self.sampled = sampled

    def __enter__(self) -> _RequestScope:
        if self.sampled:
            self._gate.set(True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.sampled:
            self._gate.set(False)


class Monitor:
    """Watches one model. Create with :meth:`attach`; call :meth:`close` on unload."""

    def __init__(self, config: MonitoringConfig, model_name: str, metrics: MetricSet) -> None:
        self.config = config
        self.model_name = model_name
        self.metrics = metrics
        self.gate = Gate()
        self.hooks = HookSet(self.gate, self, config.max_features, config.copy_limit)
        self.worker: CaptureWorker[Capture] = CaptureWorker(
            config.queue_size,
            self._process,
            self._publish,
            config.flush_interval_s,
            min_gap_s=min(DRAIN_GAP_S, config.flush_interval_s),
        )
        self._rng = random.Random(config.seed)
        self._log = RateLimitedLog(log)
        # Request-thread tallies (single writer), kept for tests and the bench; the exported
        # counters below are incremented directly and bound once to skip label lookups.
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
        self._drift_off: set[str] = set()
        #: Fleet-wide drift counters per (detector, kept feature, bin), bound once at load.
        self._bin_counters: dict[str, dict[tuple[int, int], Any]] = {}
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
        if config.enabled:
            monitor.hooks.attach(model, config.layers, config.capture_input, config.capture_output)
        monitor._declare_series()
        monitor.worker.start()
        return monitor

    # -- request path -------------------------------------------------------------------------

    def request(self, batch_size: int = 1) -> _RequestScope:
        """Count ``batch_size`` requests and decide whether this forward pass is captured."""
        self.requests += batch_size
        # Request counters go straight to the (memory-mapped) value: a worker killed with
        # SIGKILL then loses none of the requests it served. One locked write per batch.
        self._requests_total.inc(batch_size)
        rate = self.config.sample_rate
        sampled = self.config.enabled and rate > 0.0 and (rate >= 1.0 or self._rng.random() < rate)
        if sampled:
            self.sampled += batch_size
            self._sampled_total.inc(batch_size)
        return _RequestScope(self.gate, sampled)

    def reject(self, count: int = 1) -> None:
        self.rejected += count
        self._rejected_total.inc(count)

    def offer(self, capture: Capture) -> bool:
        if self.worker.offer(capture):
            return True
        self._dropped_total.inc()
        return False

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

    def _process(self, captures: Sequence[Capture]) -> None:
        by_layer: dict[str, list[Capture]] = defaultdict(list)
        for capture in captures:
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

    def _reduce_copies(self, layer: str, items: Sequence[Capture]) -> list[Capture]:
        """Reduce the raw copies of small activations together, a batch per sample shape."""
        reduced = [c for c in items if c.raw is None]
        groups: dict[tuple[object, ...], list[torch.Tensor]] = defaultdict(list)
        for c in items:
            if c.raw is not None:
                groups[(tuple(c.raw.shape[1:]), c.raw.dtype, c.raw.device)].append(c.raw)
        for tensors in groups.values():
            x = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
            features = feature_summary(x, self.config.max_features, flatten=layer == INPUT_LAYER)
            reduced.append(Capture(layer, reduce_activation(x), features))
        return reduced

    def _process_layer(self, layer: str, items: Sequence[Capture]) -> None:
        items = self._reduce_copies(layer, items)
        stats = np.concatenate([c.stats.cpu().numpy() for c in items if c.stats is not None])
        labels = {"model": self.model_name, "layer": layer}
        m = self.metrics
        m.inc("hookwatch_captures_total", len(stats), **labels)
        m.inc(
            "hookwatch_activation_nonfinite_total",
            float(stats[:, NAN_COLUMN].sum()),
            kind="nan",
            **labels,
        )
        m.inc(
            "hookwatch_activation_nonfinite_total",
            float(stats[:, INF_COLUMN].sum()),
            kind="inf",
            **labels,
        )
        finite = stats[(stats[:, NAN_COLUMN] == 0) & (stats[:, INF_COLUMN] == 0)]
        totals = finite[:, : len(SUMMARY_STATISTICS)].astype(np.float64).sum(axis=0)
        for column, statistic in enumerate(SUMMARY_STATISTICS):
            m.observe_many(
                "hookwatch_activation_statistic",
                len(finite),
                float(totals[column]),
                statistic=statistic,
                **labels,
            )
        if self.drift is not None and layer not in self._drift_off:
            self._update_drift(layer, items)

    def _update_drift(self, layer: str, items: Sequence[Capture]) -> None:
        """Feed the layer's features to its drift windows; a failure ends drift for that layer."""
        assert self.drift is not None
        try:
            parts = [c.features.cpu().numpy() for c in items if c.features is not None]
            if not parts:
                return
            features = np.concatenate(parts, axis=0)
            # Non-finite samples are counted above; binning them would call them drift.
            features = features[np.isfinite(features).all(axis=1)]
            if len(features):
                for result in self.drift.update(layer, features):
                    self._publish_drift(result)
                self._publish_bins(self.drift.take_counts())
        except Exception as error:
            self._drift_off.add(layer)
            self._fault(
                "drift tests", layer, error, "drift for that layer is off, statistics continue"
            )

    def _publish_bins(self, counts: dict[str, IntArray]) -> None:
        # One locked increment per non-empty bin and drain: a few dozen writes at most.
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

    def _publish_drift(self, result: DriftResult) -> None:
        labels = {"model": self.model_name, "level": result.level, "detector": result.detector}
        m = self.metrics
        m.set("hookwatch_drift_score", result.score, **labels)
        m.set("hookwatch_drift_threshold", result.threshold, **labels)
        m.set("hookwatch_drift_detected", 1 if result.is_drift else 0, **labels)
        m.inc("hookwatch_drift_windows_total", 1, **labels)
        m.inc("hookwatch_drift_alarms_total", 1 if result.is_drift else 0, **labels)

    def _delta(self, key: str, current: int) -> int:
        delta = current - self._published[key]
        self._published[key] = current
        return delta

    def _publish(self) -> None:
        with self._publish_lock:
            self._publish_locked()

    def _publish_locked(self) -> None:
        m, name = self.metrics, self.model_name
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
