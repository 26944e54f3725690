"""Every metric hookwatch exports, as plain data.

``hookwatch.metrics`` builds the prometheus-client objects from this table; tests check rules,
dashboards and ``docs/metrics.md`` against it without importing prometheus-client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "summary"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    labels: tuple[str, ...]
    unit: str
    help: str
    #: How prometheus-client merges a gauge over worker processes (multiprocess mode).
    multiprocess_mode: str = ""

    @property
    def exposed_names(self) -> tuple[str, ...]:
        """Every sample name this metric puts on a scrape."""
        if self.kind == "summary":
            return (f"{self.name}_count", f"{self.name}_sum", f"{self.name}_created")
        if self.kind == "counter":
            return (self.name, self.name.removesuffix("_total") + "_created")
        return (self.name,)


CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec(
        "hookwatch_requests_total",
        "counter",
        ("model",),
        "requests",
        "Requests the monitored handler received (each item of a batch counts once).",
    ),
    MetricSpec(
        "hookwatch_requests_sampled_total",
        "counter",
        ("model",),
        "requests",
        "Requests whose forward pass had the capture gate open.",
    ),
    MetricSpec(
        "hookwatch_requests_rejected_total",
        "counter",
        ("model",),
        "requests",
        "Requests answered with a 4xx because their payload did not match the model's input.",
    ),
    MetricSpec(
        "hookwatch_captures_total",
        "counter",
        ("model", "layer"),
        "samples",
        "Per-sample captures the background thread processed, per watched layer.",
    ),
    MetricSpec(
        "hookwatch_captures_dropped_total",
        "counter",
        ("model",),
        "captures",
        "Captures dropped on the request path because the capture queue was full.",
    ),
    MetricSpec(
        "hookwatch_capture_queue_depth",
        "gauge",
        ("model",),
        "captures",
        "Captures waiting in the queue, summed over live worker processes.",
        multiprocess_mode="livesum",
    ),
    MetricSpec(
        "hookwatch_capture_queue_capacity",
        "gauge",
        ("model",),
        "captures",
        "Capacity of the capture queue, summed over live worker processes.",
        multiprocess_mode="livesum",
    ),
    MetricSpec(
        "hookwatch_activation_statistic",
        "summary",
        ("model", "layer", "statistic"),
        "",
        "Per-sample activation statistic (mean, std, min, max, zero_fraction) of finite "
        "samples. delta(_sum)/delta(_count) over a window is its fleet-wide average; _sum "
        "goes down for negative values (mean/min/max of logits), so never rate() it.",
    ),
    MetricSpec(
        "hookwatch_activation_nonfinite_total",
        "counter",
        ("model", "layer", "kind"),
        "values",
        "NaN or Inf values seen in captured activations (kind=nan|inf).",
    ),
    MetricSpec(
        "hookwatch_layer_enabled",
        "gauge",
        ("model", "layer"),
        "",
        "1 while a layer's hook is capturing, 0 once a fault switched it off; the minimum over "
        "live worker processes.",
        multiprocess_mode="livemin",
    ),
    MetricSpec(
        "hookwatch_monitor_faults_total",
        "counter",
        ("model", "layer"),
        "faults",
        "Faults inside monitoring code; each switches monitoring off for that layer "
        "(layer=all for faults outside any one layer).",
    ),
    MetricSpec(
        "hookwatch_drift_profile_loaded",
        "gauge",
        ("model",),
        "",
        "1 while drift detection runs against a loaded reference profile, 0 when the model has "
        "no profile (or drift is switched off): it serves, without drift signals.",
        multiprocess_mode="livemin",
    ),
    MetricSpec(
        "hookwatch_drift_score",
        "gauge",
        ("model", "level", "detector"),
        "",
        "Latest sliding-window drift score: chi-square per degree of freedom against the "
        "reference-quantile bins, averaged over the detector's features; about 1 on clean "
        "traffic. The maximum over live worker processes.",
        multiprocess_mode="livemax",
    ),
    MetricSpec(
        "hookwatch_drift_threshold",
        "gauge",
        ("model", "level", "detector"),
        "",
        "Score above which the detector alarms, calibrated at load so that clean windows alarm "
        "on any detector at most drift.false_alarm_rate of the time.",
        multiprocess_mode="livemax",
    ),
    MetricSpec(
        "hookwatch_drift_detected",
        "gauge",
        ("model", "level", "detector"),
        "",
        "1 while the detector's latest window is over its threshold; "
        "max by (model) (...) is the calibrated any-detector alarm of one worker.",
        multiprocess_mode="livemax",
    ),
    MetricSpec(
        "hookwatch_drift_windows_total",
        "counter",
        ("model", "level", "detector"),
        "windows",
        "Sliding-window verdicts (one every drift.step new samples once the window is full).",
    ),
    MetricSpec(
        "hookwatch_drift_alarms_total",
        "counter",
        ("model", "level", "detector"),
        "windows",
        "Verdicts over threshold; rate(alarms) / rate(windows) is the alarm share actually seen.",
    ),
    MetricSpec(
        "hookwatch_drift_window_samples",
        "gauge",
        ("model",),
        "samples",
        "Samples per sliding window (monitoring.drift.window): the window size the thresholds "
        "are calibrated for. The maximum over live worker processes.",
        multiprocess_mode="livemax",
    ),
    MetricSpec(
        "hookwatch_drift_bin_samples_total",
        "counter",
        ("model", "detector", "feature", "bin"),
        "samples",
        "Sampled requests whose feature fell into this reference-quantile bin, for the "
        "detectors of monitoring.drift.fleet_detectors. Summed over workers and replicas it is "
        "the fleet's window; the fleet-drift recording rules test it against the reference.",
    ),
    MetricSpec(
        "hookwatch_drift_reference_bin_samples",
        "gauge",
        ("model", "detector", "feature", "bin"),
        "samples",
        "Reference samples in this bin of the drift profile (the expected share of the bin is "
        "known from them); the same on every worker, so the maximum over live workers is it.",
        multiprocess_mode="livemax",
    ),
)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}


def exposed_names() -> frozenset[str]:
    """Every sample name any catalogued metric can put on a scrape."""
    return frozenset(n for spec in CATALOGUE for n in spec.exposed_names)


# -- documentation and cardinality --------------------------------------------------------------

#: Values of the ``statistic`` label; tests check it equals hookwatch.stats.SUMMARY_STATISTICS.
STATISTIC_VALUES: tuple[str, ...] = ("mean", "std", "min", "max", "zero_fraction")
#: Values of the ``kind`` label of hookwatch_activation_nonfinite_total.
NONFINITE_KINDS: tuple[str, ...] = ("nan", "inf")
#: ``layer`` value for monitor faults outside any one layer (hookwatch.monitor.ALL_LAYERS).
ALL_LAYERS = "all"

#: Metrics with one series per (fleet detector, feature, bin) of the profile.
FLEET_METRICS: tuple[str, ...] = (
    "hookwatch_drift_bin_samples_total",
    "hookwatch_drift_reference_bin_samples",
)

#: Values of the ``level`` label of the drift metrics (hookwatch.drift.LEVELS).
DRIFT_LEVELS: tuple[str, ...] = ("input", "activation", "output", "prediction")
#: Drift detectors the ``output`` layer adds (hookwatch.drift.OUTPUT_DETECTORS).
OUTPUT_DRIFT_DETECTORS: tuple[str, ...] = ("output", "confidence", "entropy", "class_mix")


def drift_detectors(watched: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Values of the ``detector`` label: each watched layer, the output's four derived ones."""
    names = [w for w in watched if w != "output"]
    if "output" in watched:
        names.extend(OUTPUT_DRIFT_DETECTORS)
    return tuple(names)


#: Where each label's values come from. None comes from request content.
LABELS: dict[str, str] = {
    "model": "TorchServe model name: one value per loaded model.",
    "layer": "`input`, each entry of `monitoring.layers`, `output` (as configured); "
    "`hookwatch_monitor_faults_total` adds `all`.",
    "statistic": ", ".join(f"`{v}`" for v in STATISTIC_VALUES) + ".",
    "kind": ", ".join(f"`{v}`" for v in NONFINITE_KINDS) + ".",
    "level": ", ".join(f"`{v}`" for v in DRIFT_LEVELS) + " (drift metrics).",
    "detector": "each watched layer but `output`, and for `output`: "
    + ", ".join(f"`{v}`" for v in OUTPUT_DRIFT_DETECTORS)
    + " (drift metrics).",
    "feature": "index of the feature in the detector's input (0 up to `max_features - 1`; for "
    "`output` the class; for a projected layer the principal component, the residual distance "
    "last), as fixed by the drift profile; only `monitoring.drift.fleet_detectors`.",
    "bin": "index of the reference-quantile bin, `0` up to `drift.bins - 1` (for `class_mix` "
    "the predicted class); only bins the profile has.",
}

#: Label values some metrics add to the configured ones.
EXTRA_LABEL_VALUES: dict[tuple[str, str], tuple[str, ...]] = {
    ("hookwatch_monitor_faults_total", "layer"): (ALL_LAYERS,),
}

#: Samples one label set puts on the exporter's scrape. prometheus-client's multiprocess
#: collector writes no ``_created`` samples and no summary quantiles.
SAMPLES_PER_LABEL_SET: dict[str, int] = {"counter": 1, "gauge": 1, "summary": 2}

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
    """What bounds the (detector, feature, bin) series of the fleet-wide drift metrics."""

    detectors: tuple[str, ...]
    classes: int
    bins: int
    max_features: int

    def bound(self, detector: str) -> int:
        """Most (feature, bin) pairs a detector's profile can have."""
        if detector == "output":
            return min(self.classes, self.max_features) * self.bins
        if detector in ("confidence", "entropy"):
            return self.bins
        if detector == "class_mix":
            return self.classes
        return self.max_features * self.bins

    @property
    def total(self) -> int:
        return sum(self.bound(d) for d in self.detectors)


def label_domains(watched: tuple[str, ...] | list[str]) -> dict[str, tuple[str, ...]]:
    """Label values per label (``model`` excluded) for a model watching ``watched``."""
    return {
        "layer": tuple(watched),
        "statistic": STATISTIC_VALUES,
        "kind": NONFINITE_KINDS,
        # One level per detector: the (level, detector) pairs number len(detectors), but the
        # product is the documented upper bound.
        "level": DRIFT_LEVELS,
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
    fleet_total = (
        sum(fleet.bound(d) for d in fleet.detectors if d in present) if fleet is not None else 0
    )
    out: dict[str, int] = {}
    for spec in CATALOGUE:
        count = SAMPLES_PER_LABEL_SET[spec.kind]
        if spec.name in FLEET_METRICS:
            out[spec.name] = count * fleet_total
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


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(
    watched: tuple[str, ...] | list[str], source: str, fleet: FleetBins | None = None
) -> str:
    """docs/metrics.md: every metric, its labels, multiprocess meaning and series count."""
    series = series_per_model(watched, fleet=fleet)
    lines = [
        "# hookwatch metrics",
        "",
        "<!-- Generated from src/hookwatch/catalogue.py by `hookwatch catalogue > "
        "docs/metrics.md` (`make docs`); tests/unit/test_catalogue.py fails when it is "
        "stale. -->",
        "",
        "Every metric hookwatch exports is defined once, in `src/hookwatch/catalogue.py`. "
        "TorchServe worker processes write them to files in `PROMETHEUS_MULTIPROC_DIR` "
        "(prometheus-client multiprocess mode); the exporter (`hookwatch exporter`) merges those "
        "files on each scrape. No series carries a `pid` label, so the number of series does not "
        "grow with worker restarts.",
        "",
        "- **Counters and summaries** are summed over every worker process that ever wrote "
        "them, dead ones included, so a fleet-wide `sum()` equals the traffic exactly. A worker "
        "publishes its request counters from its capture thread every `flush_interval_s` "
        "(1 s by default): a scrape lags by at most that, and a worker killed with SIGKILL "
        "loses at most its last interval of unpublished counts. The exporter compacts the files "
        "of dead workers into one archive file, keeping every total exact.",
        "- **Gauges** use a `live*` multiprocess mode: the exporter drops a dead worker's gauge "
        "files (`mark_process_dead`) before merging, so no stale value stays behind.",
        "- **Summaries** export `_count` and `_sum` only (no quantiles in multiprocess mode): "
        "`rate(x_sum[5m]) / rate(x_count[5m])` is the fleet-wide average over any set of "
        "workers and replicas.",
        "",
        "## Metrics",
        "",
        "| name | type | unit | labels | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in CATALOGUE:
        # _created samples exist only in single-process registries, never on the exporter.
        exposed = ", ".join(f"`{n}`" for n in spec.exposed_names if not n.endswith("_created"))
        name = f"`{spec.name}`" if spec.kind != "summary" else f"`{spec.name}` ({exposed})"
        labels = ", ".join(f"`{label}`" for label in spec.labels)
        lines.append(
            f"| {name} | {spec.kind} | {spec.unit or '1'} | {labels} | {_cell(spec.help)} |"
        )
    lines += [
        "",
        "## Gauges across worker processes",
        "",
        "| gauge | multiprocess mode | value over workers |",
        "| --- | --- | --- |",
    ]
    for spec in CATALOGUE:
        if spec.kind == "gauge":
            meaning = MULTIPROCESS_MEANING.get(spec.multiprocess_mode)
            if meaning is None:
                raise ValueError(
                    f"{spec.name}: expected a live* multiprocess mode "
                    f"({sorted(MULTIPROCESS_MEANING)}), got {spec.multiprocess_mode!r}"
                )
            lines.append(f"| `{spec.name}` | `{spec.multiprocess_mode}` | {meaning} |")
    lines += ["", "## Labels", "", "| label | values |", "| --- | --- |"]
    used = {label for spec in CATALOGUE for label in spec.labels}
    for label in sorted(used):
        if label not in LABELS:
            raise ValueError(f"expected label {label!r} documented in LABELS, got none")
        lines.append(f"| `{label}` | {_cell(LABELS[label])} |")
    layer_list = ", ".join(f"`{w}`" for w in watched)
    lines += [
        "",
        "## Series per model",
        "",
        f"Upper bound on the exporter's scrape for one model watching {len(watched)} layers "
        f"({layer_list}, the defaults of `{source}`). It is the same for any number of workers "
        "and restarts; several models multiply it, several replicas multiply what Prometheus "
        "stores by the replica count (one `instance` each). "
        "`tests/integration/test_workers.py` counts the real series on a live scrape against it.",
        "",
        "The per-bin drift series (`"
        + "`, `".join(FLEET_METRICS)
        + "`) exist for the detectors of `monitoring.drift.fleet_detectors` only"
        + (
            f" ({', '.join(f'`{d}`' for d in fleet.detectors)} here, bounded with "
            f"{fleet.classes} classes, {fleet.bins} bins and max_features {fleet.max_features})"
            if fleet is not None
            else ""
        )
        + ": each detector adds up to features x bins series to each of them. A layer "
        "detector can add `max_features x bins`, which is why layers are tested per worker "
        "by default (see docs/drift.md, Fleet-wide drift).",
        "",
        "| metric | series |",
        "| --- | ---: |",
    ]
    lines += [f"| `{name}` | {count} |" for name, count in series.items()]
    total = sum(series.values())
    lines += [
        f"| **total** | **{total}** |",
        "",
        f"Target: at most {SERIES_PER_MODEL_TARGET} series per model.",
        "",
    ]
    return "\n".join(lines)
