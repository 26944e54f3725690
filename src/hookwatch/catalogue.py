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
            return (f"{self.name}_count", f"{self.name}_sum")
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
)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}


def exposed_names() -> frozenset[str]:
    """Every sample name any catalogued metric can put on a scrape."""
    return frozenset(n for spec in CATALOGUE for n in spec.exposed_names)
