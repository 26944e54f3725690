"""The catalogue is the single source of metric names, and docs/metrics.md follows it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dev.catalogue_docs import markdown
from dev.cli import main
from hookwatch import _catalogue as catalogue
from hookwatch._catalogue import (
    CATALOGUE,
    MULTIPROCESS_MEANING,
    SERIES_PER_MODEL_TARGET,
    GaugeSpec,
)
from hookwatch._metrics import MetricSet
from hookwatch.tools.cli import (
    DEMO_CLASSES,
    DEMO_MODEL_CONFIG,
    demo_fleet_bins,
    demo_watched_layers,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"


def demo_watched() -> tuple[str, ...]:
    return demo_watched_layers(ROOT / DEMO_MODEL_CONFIG)


def demo_fleet() -> catalogue.FleetBins:
    return demo_fleet_bins(ROOT / DEMO_MODEL_CONFIG)


def test_committed_doc_equals_generated_text() -> None:
    expected = markdown(demo_watched(), DEMO_MODEL_CONFIG, demo_fleet())
    assert DOC.read_text() == expected, "docs/metrics.md is stale: run `make docs`"


def test_cli_prints_the_doc(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalogue", "--root", str(ROOT)]) == 0
    assert capsys.readouterr().out == DOC.read_text()


def test_doc_lists_every_metric_with_type_and_labels() -> None:
    text = DOC.read_text()
    for spec in CATALOGUE:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{spec.name}`"))
        assert f"| {spec.kind} |" in row, row
        for label in spec.labels:
            assert f"`{label}`" in row, (spec.name, label)


def test_names_follow_prometheus_conventions() -> None:
    names = [spec.name for spec in CATALOGUE]
    assert len(names) == len(set(names))
    for spec in CATALOGUE:
        assert re.fullmatch(r"hookwatch_[a-z][a-z0-9_]*", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert spec.help.strip(), spec.name
        # Base units only (seconds, bytes, ratios as 1).
        assert spec.unit not in ("milliseconds", "ms", "percent", "kilobytes"), spec.name
        for label in spec.labels:
            assert label in catalogue.LABELS, f"{spec.name}: label {label!r} is undocumented"


def test_every_gauge_has_a_live_multiprocess_mode() -> None:
    gauges = [spec for spec in CATALOGUE if isinstance(spec, GaugeSpec)]
    assert gauges
    for spec in gauges:
        # A non-live mode keeps a dead worker's value forever; "all" adds a pid label per
        # worker ever started, so the series count would grow with every restart.
        assert spec.multiprocess_mode in MULTIPROCESS_MEANING, spec.name


def test_metric_set_registers_exactly_the_catalogue(metrics: MetricSet) -> None:
    for spec in CATALOGUE:
        labels = {label: "x" for label in spec.labels}
        if isinstance(spec, GaugeSpec):
            metrics.set(spec, 1.0, **labels)
        else:
            metrics.touch(spec, **labels)
    families = {f.name: f.type for f in metrics.registry.collect()}
    expected = {spec.name.removesuffix("_total"): spec.kind for spec in CATALOGUE}
    assert families == expected
    exposed = {name for name, _ in metrics.sample_values()}
    assert exposed <= catalogue.exposed_names()


def test_series_per_model_is_bounded_for_the_demo() -> None:
    watched = demo_watched()
    assert watched[0] == "input" and watched[-1] == "output"
    fleet = demo_fleet()
    series = catalogue.series_per_model(watched, fleet=fleet)
    assert set(series) == {spec.name for spec in CATALOGUE}
    assert sum(series.values()) <= SERIES_PER_MODEL_TARGET
    # The bound follows the layer count: one more watched layer adds series.
    more = catalogue.series_per_model((*watched, "extra"), fleet=fleet)
    assert sum(more.values()) > sum(series.values())
    # The per-bin drift series are bounded by the fleet detectors' features x bins: every
    # detector by default, the input and hidden layers on fleet_features features each.
    detectors = catalogue.drift_detectors(watched)
    assert all(fleet.matches(d) for d in detectors)
    for name in catalogue.FLEET_METRICS:
        assert series[name] == fleet.total(detectors) > 0
    layers = [d for d in detectors if d in ("input", "act1", "act2", "act3")]
    assert len(layers) == 4
    assert fleet.total(layers) == 4 * fleet.features * fleet.bins
    # Every feature of a layer (max_features 256) would cost 2,560 series per metric and
    # layer: the reason layers count on a compact feature set.
    wide = catalogue.FleetBins(fleet.detectors, fleet.classes, fleet.bins, 256, features=256)
    wide_series = catalogue.series_per_model(watched, fleet=wide)
    assert wide_series[catalogue.FLEET_METRICS[0]] - series[catalogue.FLEET_METRICS[0]] == 4 * (
        2560 - fleet.features * fleet.bins
    )
    assert sum(wide_series.values()) > SERIES_PER_MODEL_TARGET
    # Only the output's detectors, as before: no layer's bins.
    outputs = catalogue.FleetBins(catalogue.OUTPUT_DETECTORS, fleet.classes, fleet.bins, 256)
    assert outputs.total(detectors) == fleet.total(detectors) - fleet.total(layers)


def test_demo_class_count_is_the_models() -> None:
    import torch

    from hookwatch.tools.demo.digits_cnn import DigitsCNN

    with torch.inference_mode():
        logits = DigitsCNN()(torch.zeros(1, 1, 8, 8))
    assert logits.shape == (1, DEMO_CLASSES)


def test_series_per_model_refuses_an_unbounded_label() -> None:
    with pytest.raises(ValueError, match="expected a bounded value set for label 'statistic'"):
        catalogue.series_per_model(
            ("input",), domains={"layer": ("input",), "kind": ("nan",), "reason": ("other",)}
        )
