"""Every metric hookwatch exports, as plain data: one typed constant per metric.

``hookwatch._metrics`` builds the prometheus-client objects from this table and takes these
constants as handles, so writing a gauge as if it were a counter is a type error, not a string
typo found at run time. Tests check rules, dashboards and ``docs/metrics.md`` against it
without importing prometheus-client.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import ClassVar, Literal

from hookwatch._names import (
    ALL_LAYERS,
    CLASS_STATISTICS,
    LEVELS,
    NONFINITE_KINDS,
    OTHER_CLASS,
    OUTPUT_DETECTORS,
    REJECT_REASONS,
    SUMMARY_STATISTICS,
    class_labels,
    drift_detectors,
    unit_layers,
)

__all__ = [
    "ACCURACY_DROP_ALARMS",
    "ACTIVATION_NONFINITE",
    "ACTIVATION_STATISTIC",
    "BY_NAME",
    "CAPTURES",
    "CAPTURES_DROPPED",
    "CAPTURE_QUEUE_CAPACITY",
    "CAPTURE_QUEUE_DEPTH",
    "CATALOGUE",
    "CLASS_ACTIVATION_STATISTIC",
    "CLASS_ESTIMATED_CORRECT",
    "CLASS_ESTIMATE_SAMPLES",
    "DRIFT_ALARMS",
    "DRIFT_BIN_SAMPLES",
    "DRIFT_DETECTED",
    "DRIFT_DETECTOR_USABLE",
    "DRIFT_EVIDENCE",
    "DRIFT_EVIDENCE_THRESHOLD",
    "DRIFT_FIRST_ALARM",
    "DRIFT_PAGE_BUDGET",
    "DRIFT_PROFILE_LOADED",
    "DRIFT_REFERENCE_BIN_SAMPLES",
    "DRIFT_SCORE",
    "DRIFT_SEQUENTIAL_ALARMS",
    "DRIFT_THRESHOLD",
    "DRIFT_WINDOWS",
    "DRIFT_WINDOW_SAMPLES",
    "ESTIMATED_ACCURACY",
    "ESTIMATED_CORRECT",
    "ESTIMATE_OUTSIDE_SUPPORT",
    "ESTIMATE_SAMPLES",
    "EXPORTER_CATALOGUE",
    "EXTRA_LABEL_VALUES",
    "FLEET_METRICS",
    "LABELS",
    "LAYER_ENABLED",
    "METRICS_DIR_WRITABLE",
    "MONITOR_FAULTS",
    "MULTIPROCESS_MEANING",
    "REFERENCE_ACCURACY",
    "REFERENCE_ACTIVATION_STATISTIC",
    "REFERENCE_DEAD_UNITS",
    "REFERENCE_ESTIMATED_ACCURACY",
    "REFERENCE_NONFINITE",
    "REFERENCE_SATURATED_UNITS",
    "REQUESTS",
    "REQUESTS_REJECTED",
    "REQUESTS_SAMPLED",
    "REQUEST_DURATION",
    "SAMPLES_PER_LABEL_SET",
    "SERIES_PER_MODEL_TARGET",
    "UNIT_ACTIVE_SAMPLES",
    "UNIT_METRICS",
    "UNIT_SATURATED_SAMPLES",
    "WORKERS",
    "CounterSpec",
    "FleetBins",
    "GaugeSpec",
    "HistogramSpec",
    "MetricSpec",
    "SummarySpec",
    "exposed_names",
    "label_domains",
    "series_per_model",
]

Kind = Literal["counter", "gauge", "summary", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    labels: tuple[str, ...]
    unit: str
    help: str
    kind: ClassVar[Kind]

    @property
    def exposed_names(self) -> tuple[str, ...]:
        """Every sample name this metric puts on a scrape."""
        return (self.name,)


@dataclass(frozen=True)
class CounterSpec(MetricSpec):
    kind: ClassVar[Kind] = "counter"

    def __post_init__(self) -> None:
        if not self.name.endswith("_total"):
            raise ValueError(f"expected a counter name ending in _total, got {self.name!r}")

    @property
    def exposed_names(self) -> tuple[str, ...]:
        return (self.name, self.name.removesuffix("_total") + "_created")


@dataclass(frozen=True)
class GaugeSpec(MetricSpec):
    kind: ClassVar[Kind] = "gauge"
    #: How prometheus-client merges the gauge over worker processes (multiprocess mode).
    multiprocess_mode: str


@dataclass(frozen=True)
class SummarySpec(MetricSpec):
    kind: ClassVar[Kind] = "summary"

    @property
    def exposed_names(self) -> tuple[str, ...]:
        return (f"{self.name}_count", f"{self.name}_sum", f"{self.name}_created")


@dataclass(frozen=True)
class HistogramSpec(MetricSpec):
    kind: ClassVar[Kind] = "histogram"
    #: Upper bounds of the buckets (+Inf is added).
    buckets: tuple[float, ...]

    @property
    def exposed_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "count", "sum", "created"))

    @property
    def series(self) -> int:
        """Samples one label set puts on a scrape: every bucket, +Inf, the count and the sum."""
        return len(self.buckets) + 3


REQUESTS = CounterSpec(
    "hookwatch_requests_total",
    ("model",),
    "requests",
    "Requests the monitored handler received, served or rejected (each item of a batch counts "
    "once).",
)
REQUESTS_SAMPLED = CounterSpec(
    "hookwatch_requests_sampled_total",
    ("model",),
    "requests",
    "Requests sampled for capture: a forward pass is sampled on its own draw, with all its "
    "requests (`max_sampled_per_s` may cut it to its first ones); counted once the forward has "
    "run (a forward that raised captured nothing).",
)
REQUESTS_REJECTED = CounterSpec(
    "hookwatch_requests_rejected_total",
    ("model", "reason"),
    "requests",
    "Requests answered with a 4xx because their payload did not match the model's input, by "
    "reason (a fixed vocabulary, never text from the request).",
)
REQUEST_DURATION = HistogramSpec(
    "hookwatch_request_duration_seconds",
    ("model",),
    "seconds",
    "Time the handler took for a request, from receiving its batch to its answer (decode, "
    "forward, encode; TorchServe's queueing not included), each item of a batch counted once: "
    "histogram_quantile() over the fleet's buckets gives its percentiles.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
WORKERS = GaugeSpec(
    "hookwatch_workers",
    ("model",),
    "processes",
    "Worker processes serving the model with hookwatch loaded, summed over live processes: "
    "TorchServe's workers that are up, whatever was restarted.",
    multiprocess_mode="livesum",
)
CAPTURES = CounterSpec(
    "hookwatch_captures_total",
    ("model", "layer"),
    "samples",
    "Per-sample captures the background thread processed, per watched layer.",
)
CAPTURES_DROPPED = CounterSpec(
    "hookwatch_captures_dropped_total",
    ("model",),
    "captures",
    "Captures dropped on the request path because the capture queue was full.",
)
CAPTURE_QUEUE_DEPTH = GaugeSpec(
    "hookwatch_capture_queue_depth",
    ("model",),
    "captures",
    "Captures waiting in the queue, summed over live worker processes.",
    multiprocess_mode="livesum",
)
CAPTURE_QUEUE_CAPACITY = GaugeSpec(
    "hookwatch_capture_queue_capacity",
    ("model",),
    "captures",
    "Capacity of the capture queue, summed over live worker processes.",
    multiprocess_mode="livesum",
)
ACTIVATION_STATISTIC = SummarySpec(
    "hookwatch_activation_statistic",
    ("model", "layer", "statistic"),
    "",
    "Per-sample activation statistic (mean, std, min, max, zero_fraction) of finite "
    "samples. delta(_sum)/delta(_count) over a window is its fleet-wide average; _sum "
    "goes down for negative values (mean/min/max of logits), so never rate() it.",
)
ACTIVATION_NONFINITE = CounterSpec(
    "hookwatch_activation_nonfinite_total",
    ("model", "layer", "kind"),
    "values",
    "NaN or Inf values seen in captured activations (kind=nan|inf).",
)
LAYER_ENABLED = GaugeSpec(
    "hookwatch_layer_enabled",
    ("model", "layer"),
    "",
    "1 while a layer's hook is capturing, 0 once a fault switched it off; the minimum over "
    "live worker processes.",
    multiprocess_mode="livemin",
)
MONITOR_FAULTS = CounterSpec(
    "hookwatch_monitor_faults_total",
    ("model", "layer"),
    "faults",
    "Faults inside monitoring code; each switches monitoring off for that layer "
    "(layer=all for faults outside any one layer).",
)
REFERENCE_ACTIVATION_STATISTIC = GaugeSpec(
    "hookwatch_reference_activation_statistic",
    ("model", "layer", "statistic"),
    "",
    "Reference mean of the per-sample activation statistic, from the drift profile: what "
    "production's delta(_sum)/delta(_count) of hookwatch_activation_statistic is compared "
    "with (alert thresholds follow the model, not a constant). Absent without a profile.",
    multiprocess_mode="livemax",
)
REFERENCE_NONFINITE = GaugeSpec(
    "hookwatch_reference_nonfinite_values",
    ("model", "layer", "kind"),
    "values",
    "NaN or Inf values per sample in the layer's activations on the reference data (usually "
    "0), from the drift profile. Absent without a profile.",
    multiprocess_mode="livemax",
)
CLASS_ACTIVATION_STATISTIC = SummarySpec(
    "hookwatch_class_activation_statistic",
    ("model", "layer", "class", "statistic"),
    "",
    "Per-sample activation statistic (mean, zero_fraction) of finite samples, by the class "
    "the model predicted for the sample (logits head; monitoring.max_classes classes, the "
    "rest as class=other). delta(_sum)/delta(_count) is the class's fleet-wide average.",
)
UNIT_ACTIVE_SAMPLES = CounterSpec(
    "hookwatch_unit_active_samples_total",
    ("model", "layer", "unit"),
    "samples",
    "Captured samples on which the unit (a channel of a conv map, a unit of a flat layer; "
    "the first monitoring.max_units of each hidden layer) was non-zero. A unit whose "
    "increase over a range is 0 while hookwatch_captures_total rose never fired there: a "
    "pruning candidate.",
)
UNIT_SATURATED_SAMPLES = CounterSpec(
    "hookwatch_unit_saturated_samples_total",
    ("model", "layer", "unit"),
    "samples",
    "Captured samples on which the unit sat at or above the largest value it took on the "
    "reference data, and was non-zero. A unit whose increase equals the layer's captures "
    "over a range was saturated throughout (a sigmoid at 1, a ReLU6 at 6). Needs a profile.",
)
REFERENCE_DEAD_UNITS = GaugeSpec(
    "hookwatch_reference_dead_units",
    ("model", "layer"),
    "",
    "Share of the layer's tracked units that were zero on every reference sample, from the "
    "drift profile: what production's never-active share is compared with.",
    multiprocess_mode="livemax",
)
REFERENCE_SATURATED_UNITS = GaugeSpec(
    "hookwatch_reference_saturated_units",
    ("model", "layer"),
    "",
    "Share of the layer's tracked units that held one non-zero value on every reference "
    "sample, from the drift profile.",
    multiprocess_mode="livemax",
)
DRIFT_PROFILE_LOADED = GaugeSpec(
    "hookwatch_drift_profile_loaded",
    ("model",),
    "",
    "1 while drift detection runs against a loaded reference profile, 0 when the model has "
    "no profile, its profile cannot be used (corrupt, cut short, another format version, for "
    'other layers: logged at load and counted in hookwatch_monitor_faults_total{layer="all"}) '
    "or drift is switched off: it serves, without drift signals.",
    multiprocess_mode="livemin",
)
DRIFT_DETECTOR_USABLE = GaugeSpec(
    "hookwatch_drift_detector_usable",
    ("model", "level", "detector"),
    "",
    "1 for each detector of the loaded drift profile; 0 for one the profile left out because "
    "it has nothing to test (every feature constant on the reference: a dead layer, a softmax "
    "at exactly 1.0), which therefore never alarms. The minimum over live workers.",
    multiprocess_mode="livemin",
)
DRIFT_SCORE = GaugeSpec(
    "hookwatch_drift_score",
    ("model", "level", "detector"),
    "",
    "Latest sliding-window drift score: chi-square per degree of freedom against the "
    "reference-quantile bins, averaged over the detector's features; about 1 on clean "
    "traffic. The maximum over live worker processes.",
    multiprocess_mode="livemax",
)
DRIFT_THRESHOLD = GaugeSpec(
    "hookwatch_drift_threshold",
    ("model", "level", "detector"),
    "",
    "Score above which the detector alarms, calibrated at load so that clean windows alarm "
    "on any detector at most drift.false_alarm_rate of the time.",
    multiprocess_mode="livemax",
)
DRIFT_DETECTED = GaugeSpec(
    "hookwatch_drift_detected",
    ("model", "level", "detector"),
    "",
    "1 while the detector's latest window is over its threshold; "
    "max by (model) (...) is the calibrated any-detector alarm of one worker.",
    multiprocess_mode="livemax",
)
DRIFT_FIRST_ALARM = GaugeSpec(
    "hookwatch_drift_first_alarm",
    ("model", "level", "detector"),
    "",
    "1 for the detector(s) that alarmed first in the current alarm episode of a worker (it "
    "starts when a detector alarms while none does, and ends when none does; detectors alarming "
    "on the same samples share it), 0 otherwise: which layer moved first. The maximum over "
    "live workers.",
    multiprocess_mode="livemax",
)
DRIFT_WINDOWS = CounterSpec(
    "hookwatch_drift_windows_total",
    ("model", "level", "detector"),
    "windows",
    "Sliding-window verdicts (one every drift.step new samples once the window is full).",
)
DRIFT_ALARMS = CounterSpec(
    "hookwatch_drift_alarms_total",
    ("model", "level", "detector"),
    "windows",
    "Verdicts over threshold; rate(alarms) / rate(windows) is the alarm share actually seen.",
)
DRIFT_SEQUENTIAL_ALARMS = CounterSpec(
    "hookwatch_drift_sequential_alarms_total",
    ("model", "level", "detector"),
    "alarms",
    "Alarms of the detector's anytime-valid test (drift.sequential): on clean traffic, all "
    "detectors of all workers together raise at most one per drift.run_length sampled "
    "requests in expectation. The drift alert pages on it.",
)
DRIFT_EVIDENCE = GaugeSpec(
    "hookwatch_drift_evidence",
    ("model", "level", "detector"),
    "",
    "Natural log of the anytime-valid test's evidence against the reference (its "
    "Shiryaev-Roberts statistic, 0 when below 1); it alarms and restarts from 0 on reaching "
    "hookwatch_drift_evidence_threshold. The maximum over live workers.",
    multiprocess_mode="livemax",
)
DRIFT_EVIDENCE_THRESHOLD = GaugeSpec(
    "hookwatch_drift_evidence_threshold",
    ("model", "level", "detector"),
    "",
    "Natural log of the evidence at which the detector's anytime-valid test alarms: "
    "log(drift.run_length x detectors).",
    multiprocess_mode="livemax",
)
DRIFT_WINDOW_SAMPLES = GaugeSpec(
    "hookwatch_drift_window_samples",
    ("model",),
    "samples",
    "Samples per sliding window (monitoring.drift.window): the window size the thresholds "
    "are calibrated for. The maximum over live worker processes.",
    multiprocess_mode="livemax",
)
DRIFT_PAGE_BUDGET = GaugeSpec(
    "hookwatch_drift_page_budget_seconds",
    ("model",),
    "seconds",
    "monitoring.drift.false_page_days in seconds: the fleet's drift page (HookwatchDrift) "
    "raises at most one false page per this long per model in expectation, whatever the "
    "fleet's size and traffic. The maximum over live worker processes.",
    multiprocess_mode="livemax",
)
DRIFT_BIN_SAMPLES = CounterSpec(
    "hookwatch_drift_bin_samples_total",
    ("model", "detector", "feature", "bin"),
    "samples",
    "Sampled requests whose feature fell into this reference-quantile bin, for the "
    "detectors of monitoring.drift.fleet_detectors. Summed over workers and replicas it is "
    "the fleet's window; the fleet-drift recording rules test it against the reference.",
)
DRIFT_REFERENCE_BIN_SAMPLES = GaugeSpec(
    "hookwatch_drift_reference_bin_samples",
    ("model", "detector", "feature", "bin"),
    "samples",
    "Reference samples in this bin of the drift profile (the expected share of the bin is "
    "known from them); the same on every worker, so the maximum over live workers is it.",
    multiprocess_mode="livemax",
)

ESTIMATED_ACCURACY = GaugeSpec(
    "hookwatch_estimated_accuracy",
    ("model",),
    "",
    "Accuracy estimated without labels over the last monitoring.drift.window sampled requests "
    "of a worker (a share, 0 to 1): agreement of the prediction with a k-NN vote of the "
    "labelled reference in harm.layer's features, samples outside the reference's support "
    "counted as errors (docs/drift.md). The minimum over live workers; the fleet's estimate is "
    "rate(hookwatch_estimated_correct_total) / rate(hookwatch_estimate_samples_total). Absent "
    "without reference labels or a logits head.",
    multiprocess_mode="livemin",
)
REFERENCE_ACCURACY = GaugeSpec(
    "hookwatch_reference_accuracy",
    ("model",),
    "",
    "The model's accuracy on its labelled reference (a share, 0 to 1), from the profile: what "
    "hookwatch_estimated_accuracy is compared with. Present only for a model with an estimate, "
    "and 0 in a worker where a fault turned the estimate off: the alert rules tell the models "
    "that page on harm by it being above 0 (the maximum over live workers).",
    multiprocess_mode="livemax",
)
REFERENCE_ESTIMATED_ACCURACY = GaugeSpec(
    "hookwatch_reference_estimated_accuracy",
    ("model",),
    "",
    "The estimate on the labelled reference itself (leave-one-out, a share): what the estimate "
    "reads on traffic like the reference; the accuracy-drop test compares the traffic's "
    "estimate with it less harm.max_drop.",
    multiprocess_mode="livemax",
)
ESTIMATED_CORRECT = CounterSpec(
    "hookwatch_estimated_correct_total",
    ("model",),
    "samples",
    "Sum of the per-sample estimates that the prediction was right (each in [0, 1]) over the "
    "sampled requests judged: divided by hookwatch_estimate_samples_total it is the estimated "
    "accuracy, and both add over workers and replicas.",
)
ESTIMATE_SAMPLES = CounterSpec(
    "hookwatch_estimate_samples_total",
    ("model",),
    "samples",
    "Sampled requests whose accuracy was estimated (finite features of harm.layer and logits).",
)
ESTIMATE_OUTSIDE_SUPPORT = CounterSpec(
    "hookwatch_estimate_outside_support_total",
    ("model",),
    "samples",
    "Sampled requests whose harm.layer features lay outside the labelled reference's support "
    "(each counted as an error by the estimate): inputs unlike anything the reference had.",
)
CLASS_ESTIMATED_CORRECT = CounterSpec(
    "hookwatch_class_estimated_correct_total",
    ("model", "class"),
    "samples",
    "hookwatch_estimated_correct_total by the class the model predicted (the classes of "
    "hookwatch_class_activation_statistic, the rest as class=other): divided by "
    "hookwatch_class_estimate_samples_total, which predicted classes the estimate says are "
    "failing.",
)
CLASS_ESTIMATE_SAMPLES = CounterSpec(
    "hookwatch_class_estimate_samples_total",
    ("model", "class"),
    "samples",
    "hookwatch_estimate_samples_total by the class the model predicted.",
)
ACCURACY_DROP_ALARMS = CounterSpec(
    "hookwatch_accuracy_drop_alarms_total",
    ("model",),
    "alarms",
    "Alarms of the anytime-valid test that the estimated accuracy fell more than harm.max_drop "
    "below the reference's: on traffic whose estimate holds, at most one per harm.run_length "
    "sampled requests per worker in expectation. HookwatchAccuracyDrop pages on it.",
)

CATALOGUE: tuple[MetricSpec, ...] = (
    REQUESTS,
    REQUESTS_SAMPLED,
    REQUESTS_REJECTED,
    REQUEST_DURATION,
    WORKERS,
    CAPTURES,
    CAPTURES_DROPPED,
    CAPTURE_QUEUE_DEPTH,
    CAPTURE_QUEUE_CAPACITY,
    ACTIVATION_STATISTIC,
    ACTIVATION_NONFINITE,
    LAYER_ENABLED,
    MONITOR_FAULTS,
    REFERENCE_ACTIVATION_STATISTIC,
    REFERENCE_NONFINITE,
    CLASS_ACTIVATION_STATISTIC,
    UNIT_ACTIVE_SAMPLES,
    UNIT_SATURATED_SAMPLES,
    REFERENCE_DEAD_UNITS,
    REFERENCE_SATURATED_UNITS,
    DRIFT_PROFILE_LOADED,
    DRIFT_DETECTOR_USABLE,
    DRIFT_SCORE,
    DRIFT_THRESHOLD,
    DRIFT_DETECTED,
    DRIFT_FIRST_ALARM,
    DRIFT_WINDOWS,
    DRIFT_ALARMS,
    DRIFT_SEQUENTIAL_ALARMS,
    DRIFT_EVIDENCE,
    DRIFT_EVIDENCE_THRESHOLD,
    DRIFT_WINDOW_SAMPLES,
    DRIFT_PAGE_BUDGET,
    DRIFT_BIN_SAMPLES,
    DRIFT_REFERENCE_BIN_SAMPLES,
    ESTIMATED_ACCURACY,
    REFERENCE_ACCURACY,
    REFERENCE_ESTIMATED_ACCURACY,
    ESTIMATED_CORRECT,
    ESTIMATE_SAMPLES,
    ESTIMATE_OUTSIDE_SUPPORT,
    ACCURACY_DROP_ALARMS,
    CLASS_ESTIMATED_CORRECT,
    CLASS_ESTIMATE_SAMPLES,
)

METRICS_DIR_WRITABLE = GaugeSpec(
    "hookwatch_metrics_dir_writable",
    (),
    "",
    "1 when a worker could create a metric file in PROMETHEUS_MULTIPROC_DIR at the last "
    "scrape (the exporter creates a probe file there with a new file's blocks allocated, and "
    "removes it), 0 when the directory is unwritable or full. Workers then keep serving and "
    "counting in memory, and write their metrics once the directory takes them again.",
    # Written by the exporter itself, never by a worker: the mode is never used.
    multiprocess_mode="livemin",
)

#: Metrics the exporter computes at each scrape, one series per exporter (no ``model``
#: label): the state of the metrics directory itself, which a worker that cannot write there
#: cannot report. Not built by :class:`~hookwatch._metrics.MetricSet`.
EXPORTER_CATALOGUE: tuple[MetricSpec, ...] = (METRICS_DIR_WRITABLE,)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in (*CATALOGUE, *EXPORTER_CATALOGUE)}


def exposed_names() -> frozenset[str]:
    """Every sample name any catalogued metric can put on a scrape."""
    return frozenset(n for spec in (*CATALOGUE, *EXPORTER_CATALOGUE) for n in spec.exposed_names)


# -- documentation and cardinality --------------------------------------------------------------

#: Metrics with one series per (fleet detector, feature, bin) of the profile.
FLEET_METRICS: tuple[str, ...] = (DRIFT_BIN_SAMPLES.name, DRIFT_REFERENCE_BIN_SAMPLES.name)
#: Metrics with one series per tracked unit of each hidden layer (``max_units`` at most).
UNIT_METRICS: tuple[str, ...] = (UNIT_ACTIVE_SAMPLES.name, UNIT_SATURATED_SAMPLES.name)


#: Where each label's values come from. None comes from request content.
LABELS: dict[str, str] = {
    "model": "TorchServe model name: one value per loaded model.",
    "layer": "`input`, each entry of `monitoring.layers`, `output` (as configured); "
    "`hookwatch_monitor_faults_total` adds `all`.",
    "statistic": ", ".join(f"`{v}`" for v in SUMMARY_STATISTICS) + ".",
    "kind": ", ".join(f"`{v}`" for v in NONFINITE_KINDS) + ".",
    "level": ", ".join(f"`{v}`" for v in LEVELS) + " (drift metrics).",
    "detector": "each watched layer but `output`, and for `output` by `monitoring.output.head`: "
    "`logits` adds "
    + ", ".join(f"`{v}`" for v in OUTPUT_DETECTORS)
    + "; `values` and `embedding` add `output`; `none` adds nothing (drift metrics).",
    "feature": "index of the feature in the detector's input (0 up to `max_features - 1`; for "
    "`output` the class; for a projected layer the principal component, the residual distance "
    "last), as fixed by the drift profile; only `monitoring.drift.fleet_detectors`, and of an "
    "input or hidden-layer detector only its first `fleet_features - 1` and its last.",
    "bin": "index of the reference-quantile bin, `0` up to `drift.bins - 1` (for `class_mix` "
    "the predicted class); only bins the profile has.",
    "reason": ", ".join(f"`{v}`" for v in REJECT_REASONS)
    + " (docs/security.md says what each means).",
    "unit": "index of the unit (channel of a conv map, unit of a flat layer), `0` up to "
    "`max_units - 1`; hidden layers only (not `input`, not `output`).",
    "class": "the predicted class (its index in the logits) for the `max_classes` classes most "
    f"often predicted on the reference (the first ones without a profile), `{OTHER_CLASS}` for "
    "the rest; logits head only.",
}

#: Label values some metrics add to the configured ones.
EXTRA_LABEL_VALUES: dict[tuple[str, str], tuple[str, ...]] = {
    (MONITOR_FAULTS.name, "layer"): (ALL_LAYERS,),
}

#: Samples one label set puts on the exporter's scrape. prometheus-client's multiprocess
#: collector writes no ``_created`` samples and no summary quantiles.
SAMPLES_PER_LABEL_SET: dict[str, int] = {"counter": 1, "gauge": 1, "summary": 2, "histogram": 1}

#: What a gauge's value means once the exporter merges the worker processes' files.
MULTIPROCESS_MEANING: dict[str, str] = {
    "livesum": "sum over live worker processes; a dead worker's share leaves the sum when the "
    "exporter reaps its pid",
    "livemin": "minimum over live worker processes; a dead worker's value stops counting when "
    "the exporter reaps its pid",
    "livemax": "maximum over live worker processes; a dead worker's value stops counting when "
    "the exporter reaps its pid",
}

#: Documented bound on hookwatch series per model for the demo's default layers.
SERIES_PER_MODEL_TARGET = 2000


@dataclass(frozen=True)
class FleetBins:
    """What bounds the (detector, feature, bin) series of the fleet-wide drift metrics.

    ``detectors`` are names or ``fnmatch`` patterns (``monitoring.drift.fleet_detectors``);
    ``features`` is ``monitoring.drift.fleet_features``, the input's and hidden layers' share.
    """

    detectors: tuple[str, ...]
    classes: int
    bins: int
    max_features: int
    features: int = 4

    def matches(self, detector: str) -> bool:
        return any(fnmatch.fnmatchcase(detector, pattern) for pattern in self.detectors)

    def bound(self, detector: str) -> int:
        """Most (feature, bin) pairs a detector's profile can have."""
        if detector == "output":
            return min(self.classes, self.max_features) * self.bins
        if detector in ("confidence", "entropy"):
            return self.bins
        if detector == "class_mix":
            return self.classes
        return min(self.features, self.max_features) * self.bins

    def total(self, detectors: tuple[str, ...] | list[str]) -> int:
        """The bound over those of ``detectors`` (a model's) that are fleet detectors."""
        return sum(self.bound(d) for d in detectors if self.matches(d))


def label_domains(
    watched: tuple[str, ...] | list[str], max_units: int = 64, max_classes: int = 20
) -> dict[str, tuple[str, ...]]:
    """Label values per label (``model`` excluded) for a model watching ``watched``.

    The per-unit metrics carry hidden layers only; their bound is taken over those.
    """
    return {
        "layer": tuple(watched),
        "unit": tuple(str(i) for i in range(max_units)),
        "reason": REJECT_REASONS,
        "class": class_labels(max_classes),
        "statistic": SUMMARY_STATISTICS,
        "kind": NONFINITE_KINDS,
        # One level per detector: the (level, detector) pairs number len(detectors), but the
        # product is the documented upper bound.
        "level": LEVELS,
        "detector": drift_detectors(watched),
    }


def series_per_model(
    watched: tuple[str, ...] | list[str],
    domains: dict[str, tuple[str, ...]] | None = None,
    fleet: FleetBins | None = None,
) -> dict[str, int]:
    """Upper bound of each metric's series for one model on the exporter's scrape.

    ``fleet`` bounds the per-bin drift series (None: no fleet detectors). Only detectors the
    model has count: a fleet detector of the output needs the output watched.
    """
    values = label_domains(watched) if domains is None else domains
    present = set(drift_detectors(watched))
    fleet_total = fleet.total(sorted(present)) if fleet is not None else 0
    out: dict[str, int] = {}
    for spec in CATALOGUE:
        count = spec.series if isinstance(spec, HistogramSpec) else SAMPLES_PER_LABEL_SET[spec.kind]
        if spec.name in FLEET_METRICS:
            out[spec.name] = count * fleet_total
            continue
        if spec.name in UNIT_METRICS:
            out[spec.name] = count * len(unit_layers(watched)) * len(values["unit"])
            continue
        if spec is CLASS_ACTIVATION_STATISTIC:
            # Two of the statistics only, for every watched layer and class slot.
            out[spec.name] = (
                count * len(values["layer"]) * len(values["class"]) * len(CLASS_STATISTICS)
            )
            continue
        for label in spec.labels:
            if label == "model":
                continue
            if label not in values:
                raise ValueError(
                    f"{spec.name}: expected a bounded value set for label {label!r}, got none "
                    f"(known: {sorted(values)})"
                )
            count *= len(values[label]) + len(EXTRA_LABEL_VALUES.get((spec.name, label), ()))
        out[spec.name] = count
    return out
