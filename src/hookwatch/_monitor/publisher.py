"""Publishing: what the processor produced and the monitor's faults, written to the metric set.

Runs once per ``flush_interval_s`` on the capture thread (and from ``flush()``), so the cost of
metric writes follows the number of series, not the traffic. Cumulative counts become counter
increments here, as differences since the previous publish. The request counts are not here:
their tally writes them (:mod:`hookwatch._monitor.tally`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hookwatch import _catalogue as metric
from hookwatch._drift import DriftTracker, FloatArray, IntArray
from hookwatch._metrics import CounterChild, MetricSet
from hookwatch._monitor.processor import AccuracyTally, DriftTally, LayerTally, Processed
from hookwatch._names import (
    ALL_LAYERS,
    CLASS_STATISTICS,
    NONFINITE_KINDS,
    STATISTICS,
    SUMMARY_STATISTICS,
    level_of,
)
from hookwatch._views import ClassSlots

__all__ = ["Publisher", "Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """Everything one publish writes."""

    processed: Processed
    queue_depth: int
    #: Cumulative faults per layer (hooks, processing; ``all`` for the capture thread itself).
    faults: Mapping[str, int] = field(default_factory=dict)
    #: Per watched layer, whether its hook still captures.
    layers_enabled: Mapping[str, bool] = field(default_factory=dict)


class Publisher:
    """Writes snapshots of one model's monitoring to a :class:`MetricSet`."""

    def __init__(self, metrics: MetricSet, model_name: str) -> None:
        self.metrics = metrics
        self.model_name = model_name
        #: Fleet-wide drift counters per (detector, kept feature, bin), bound at declare().
        self._bin_counters: dict[str, dict[tuple[int, int], CounterChild]] = {}
        self._published: dict[str, int] = {}
        #: Level of each detector of the loaded profile (for the first-alarm gauges).
        self._levels: dict[str, str] = {}
        #: Per-unit counters per hidden layer, bound on first sight of the layer's units.
        self._unit_counters: dict[tuple[str, str], list[CounterChild]] = {}
        self._classes: ClassSlots | None = None
        #: The estimate's summed scores as of the last publish (a float: not in _published).
        self._correct_published = 0.0
        #: Per class slot, the estimate's summed scores and samples as of the last publish.
        self._class_published: tuple[FloatArray | None, FloatArray | None] = (None, None)
        # Publishing runs on the capture thread's tick and from flush(): one lock keeps the
        # differences exact.
        self._lock = threading.Lock()

    def declare(
        self,
        watched: Sequence[str],
        queue_capacity: int,
        drift: DriftTracker | None,
        classes: ClassSlots | None = None,
    ) -> None:
        """Create every series at its starting value, before the first event.

        Prometheus windows (``delta``, ``increase``) need the zero before the first event.
        """
        m, name = self.metrics, self.model_name
        # Faults outside any one layer (the capture thread, publishing, loading) exist from
        # the start too: a publish that fails for want of space still has a series to count in.
        m.touch(metric.MONITOR_FAULTS, model=name, layer=ALL_LAYERS)
        m.set(metric.CAPTURE_QUEUE_CAPACITY, queue_capacity, model=name)
        m.set(metric.WORKERS, 1, model=name)
        m.set(metric.CAPTURE_QUEUE_DEPTH, 0, model=name)
        for layer in watched:
            m.touch(metric.CAPTURES, model=name, layer=layer)
            m.touch(metric.MONITOR_FAULTS, model=name, layer=layer)
            m.set(metric.LAYER_ENABLED, 1, model=name, layer=layer)
            for kind in NONFINITE_KINDS:
                m.touch(metric.ACTIVATION_NONFINITE, model=name, layer=layer, kind=kind)
            for statistic in SUMMARY_STATISTICS:
                m.touch(metric.ACTIVATION_STATISTIC, model=name, layer=layer, statistic=statistic)
            for label in classes.labels if classes is not None else ():
                for statistic in CLASS_STATISTICS:
                    m.touch(
                        metric.CLASS_ACTIVATION_STATISTIC,
                        model=name,
                        layer=layer,
                        statistic=statistic,
                        **{"class": label},
                    )
        self._classes = classes
        m.set(metric.DRIFT_PROFILE_LOADED, 1 if drift is not None else 0, model=name)
        if drift is None:
            return
        for layer, units in drift.units.items():
            if layer not in watched:
                continue
            m.set(metric.REFERENCE_DEAD_UNITS, units.dead_share, model=name, layer=layer)
            m.set(metric.REFERENCE_SATURATED_UNITS, units.saturated_share, model=name, layer=layer)
            # The units are known from the profile: their series start at zero.
            self._units(metric.UNIT_ACTIVE_SAMPLES, layer, units.width)
            self._units(metric.UNIT_SATURATED_SAMPLES, layer, units.width)
        for detector in drift.left_out:
            m.set(
                metric.DRIFT_DETECTOR_USABLE,
                0,
                model=name,
                level=level_of(detector),
                detector=detector,
            )
        for detector, ref in drift.references.items():
            labels = {"model": name, "level": ref.level, "detector": detector}
            m.set(metric.DRIFT_DETECTOR_USABLE, 1, **labels)
            m.set(metric.DRIFT_FIRST_ALARM, 0, **labels)
            self._levels[detector] = ref.level
            m.set(metric.DRIFT_THRESHOLD, drift.calibration.thresholds[detector], **labels)
            m.set(metric.DRIFT_DETECTED, 0, **labels)
            m.touch(metric.DRIFT_WINDOWS, **labels)
            m.touch(metric.DRIFT_ALARMS, **labels)
            test = drift.sequential.get(detector)
            if test is not None:
                m.touch(metric.DRIFT_SEQUENTIAL_ALARMS, **labels)
                m.set(metric.DRIFT_EVIDENCE, 0, **labels)
                m.set(metric.DRIFT_EVIDENCE_THRESHOLD, test.log_threshold, **labels)
        m.set(metric.DRIFT_WINDOW_SAMPLES, drift.window, model=name)
        m.set(metric.DRIFT_PAGE_BUDGET, drift.page_budget_s, model=name)
        if drift.accuracy is not None:
            # Their presence tells the alert rules this model pages on harm, not on drift.
            estimator = drift.accuracy.estimator
            m.set(metric.REFERENCE_ACCURACY, estimator.reference_accuracy, model=name)
            m.set(metric.REFERENCE_ESTIMATED_ACCURACY, estimator.reference_score, model=name)
            for spec in (
                metric.ESTIMATED_CORRECT,
                metric.ESTIMATE_SAMPLES,
                metric.ESTIMATE_OUTSIDE_SUPPORT,
                metric.ACCURACY_DROP_ALARMS,
            ):
                m.touch(spec, model=name)
            for label in self._classes.labels if self._classes is not None else ():
                for spec in (metric.CLASS_ESTIMATED_CORRECT, metric.CLASS_ESTIMATE_SAMPLES):
                    m.touch(spec, model=name, **{"class": label})
        for layer, values in drift.statistics.items():
            if layer not in watched:
                continue
            for statistic in SUMMARY_STATISTICS:
                m.set(
                    metric.REFERENCE_ACTIVATION_STATISTIC,
                    values[STATISTICS.index(statistic)],
                    model=name,
                    layer=layer,
                    statistic=statistic,
                )
            for kind in NONFINITE_KINDS:
                m.set(
                    metric.REFERENCE_NONFINITE,
                    values[STATISTICS.index(f"{kind}_count")],
                    model=name,
                    layer=layer,
                    kind=kind,
                )
        self._declare_fleet_bins(drift)

    def _declare_fleet_bins(self, drift: DriftTracker) -> None:
        """Per-bin counters and reference counts of the fleet detectors (bins that exist only).

        The ``feature`` label is the feature's index in the detector's input, fixed by the
        profile; ``bin`` is the bin's index. Neither ever comes from request content.
        """
        m = self.metrics
        for detector in sorted(drift.tallied):
            ref = drift.references[detector]
            valid = ref.valid
            bound: dict[tuple[int, int], CounterChild] = {}
            # Tallied counts are [len(index), K]: row t is the reference's feature index[t].
            for t, f in enumerate(drift.fleet_features(detector)):
                for k in range(ref.n_bins):
                    if not valid[f, k]:
                        continue
                    labels = {
                        "model": self.model_name,
                        "detector": detector,
                        "feature": str(ref.kept[f]),
                        "bin": str(k),
                    }
                    m.set(metric.DRIFT_REFERENCE_BIN_SAMPLES, int(ref.counts[f, k]), **labels)
                    bound[(t, k)] = m.counter(metric.DRIFT_BIN_SAMPLES, **labels)
            self._bin_counters[detector] = bound

    def publish(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._publish_locked(snapshot)

    def _delta(self, key: str, current: int) -> int:
        delta = current - self._published.get(key, 0)
        self._published[key] = current
        return delta

    def _publish_locked(self, snapshot: Snapshot) -> None:
        m, name = self.metrics, self.model_name
        processed = snapshot.processed
        for layer, tally in processed.layers.items():
            self._publish_layer(layer, tally)
        for detector in sorted(processed.drift):
            self._publish_drift(processed.drift[detector])
        if processed.first_alarms is not None:
            for detector, level in self._levels.items():
                first = 1 if detector in processed.first_alarms else 0
                m.set(metric.DRIFT_FIRST_ALARM, first, model=name, level=level, detector=detector)
        for detector, (alarms, evidence) in processed.sequential.items():
            labels = {"model": name, "level": self._levels[detector], "detector": detector}
            m.inc(metric.DRIFT_SEQUENTIAL_ALARMS, self._delta(f"seq:{detector}", alarms), **labels)
            # Below 1 (log < 0, or -inf just after an alarm) the test holds no evidence.
            m.set(metric.DRIFT_EVIDENCE, max(evidence, 0.0), **labels)
        self._publish_bins(processed.bins)
        if processed.accuracy is not None:
            self._publish_accuracy(processed.accuracy)
        if processed.accuracy_off:
            # No estimate in this worker any more: 0, so once every worker's is off the rules
            # page this model on drift again (hookwatch_reference_accuracy > 0 tells them).
            m.set(metric.REFERENCE_ACCURACY, 0.0, model=name)
        m.set(metric.CAPTURE_QUEUE_DEPTH, snapshot.queue_depth, model=name)
        for layer, count in snapshot.faults.items():
            m.inc(
                metric.MONITOR_FAULTS,
                self._delta(f"faults:{layer}", count),
                model=name,
                layer=layer,
            )
        for layer, enabled in snapshot.layers_enabled.items():
            m.set(metric.LAYER_ENABLED, 1 if enabled else 0, model=name, layer=layer)

    def _publish_accuracy(self, tally: AccuracyTally) -> None:
        m, name = self.metrics, self.model_name
        if tally.count:
            m.set(metric.ESTIMATED_ACCURACY, tally.estimated_accuracy, model=name)
        correct = tally.correct_sum - self._correct_published
        self._correct_published = tally.correct_sum
        m.inc(metric.ESTIMATED_CORRECT, correct, model=name)
        m.inc(metric.ESTIMATE_SAMPLES, self._delta("accuracy:count", tally.count), model=name)
        m.inc(
            metric.ESTIMATE_OUTSIDE_SUPPORT,
            self._delta("accuracy:outside", tally.outside_support),
            model=name,
        )
        m.inc(metric.ACCURACY_DROP_ALARMS, self._delta("accuracy:alarms", tally.alarms), model=name)
        if self._classes is None or tally.class_correct_sum is None or tally.class_count is None:
            return
        # Per class slot (the tracked classes, the rest as `other`), as increments.
        slots = self._classes.slots(np.arange(len(tally.class_count)))
        n = len(self._classes.labels)
        right_now: FloatArray = np.bincount(
            slots, weights=tally.class_correct_sum, minlength=n
        ).astype(np.float64)
        count_now: FloatArray = np.bincount(slots, weights=tally.class_count, minlength=n).astype(
            np.float64
        )
        last_right, last_count = self._class_published
        self._class_published = (right_now, count_now)
        for slot, label in enumerate(self._classes.labels):
            before = last_count[slot] if last_count is not None else 0.0
            samples = round(float(count_now[slot] - before))
            if not samples:
                continue
            right = float(right_now[slot] - (last_right[slot] if last_right is not None else 0.0))
            labels = {"model": name, "class": label}
            m.inc(metric.CLASS_ESTIMATED_CORRECT, max(right, 0.0), **labels)
            m.inc(metric.CLASS_ESTIMATE_SAMPLES, samples, **labels)

    def _publish_layer(self, layer: str, tally: LayerTally) -> None:
        labels = {"model": self.model_name, "layer": layer}
        m = self.metrics
        m.inc(metric.CAPTURES, tally.captures, **labels)
        m.inc(metric.ACTIVATION_NONFINITE, tally.nan, kind="nan", **labels)
        m.inc(metric.ACTIVATION_NONFINITE, tally.inf, kind="inf", **labels)
        for column, statistic in enumerate(SUMMARY_STATISTICS):
            m.observe_many(
                metric.ACTIVATION_STATISTIC,
                tally.finite,
                float(tally.sums[column]),
                statistic=statistic,
                **labels,
            )
        self._publish_views(layer, tally)

    def _units(self, spec: metric.CounterSpec, layer: str, width: int) -> list[CounterChild]:
        """The layer's per-unit counters of ``spec``, bound (at zero) the first time."""
        bound = self._unit_counters.get((spec.name, layer))
        if bound is None or len(bound) < width:
            labels = {"model": self.model_name, "layer": layer}
            bound = [self.metrics.counter(spec, unit=str(u), **labels) for u in range(width)]
            self._unit_counters[(spec.name, layer)] = bound
        return bound

    def _publish_views(self, layer: str, tally: LayerTally) -> None:
        for spec, counts in (
            (metric.UNIT_ACTIVE_SAMPLES, tally.active),
            (metric.UNIT_SATURATED_SAMPLES, tally.saturated),
        ):
            if counts is None:
                continue
            for child, count in zip(self._units(spec, layer, len(counts)), counts, strict=False):
                if count:
                    child.inc(int(count))
        if tally.class_sums is None or tally.class_counts is None or self._classes is None:
            return
        labels = {"model": self.model_name, "layer": layer}
        for slot, label in enumerate(self._classes.labels):
            count = int(tally.class_counts[slot])
            if not count:
                continue
            for column, statistic in enumerate(CLASS_STATISTICS):
                self.metrics.observe_many(
                    metric.CLASS_ACTIVATION_STATISTIC,
                    count,
                    float(tally.class_sums[slot, column]),
                    statistic=statistic,
                    **labels,
                    **{"class": label},
                )

    def _publish_drift(self, tally: DriftTally) -> None:
        result = tally.latest
        labels = {"model": self.model_name, "level": result.level, "detector": result.detector}
        m = self.metrics
        m.set(metric.DRIFT_SCORE, result.score, **labels)
        m.set(metric.DRIFT_THRESHOLD, result.threshold, **labels)
        m.set(metric.DRIFT_DETECTED, 1 if result.is_drift else 0, **labels)
        m.inc(metric.DRIFT_WINDOWS, tally.windows, **labels)
        m.inc(metric.DRIFT_ALARMS, tally.alarms, **labels)

    def _publish_bins(self, counts: Mapping[str, IntArray]) -> None:
        # One locked increment per non-empty bin and publish: a few hundred writes a second.
        for detector, tally in counts.items():
            bound = self._bin_counters.get(detector, {})
            for f, k in zip(*np.nonzero(tally), strict=True):
                child = bound.get((int(f), int(k)))
                if child is not None:
                    child.inc(int(tally[f, k]))
