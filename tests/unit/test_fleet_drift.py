"""Fleet-wide drift state: per-bin counters that sum to the drift statistic's input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hookwatch._config import FLEET_DETECTORS, FLEET_FEATURES, MonitoringConfig
from hookwatch._drift import BinnedReference, DriftTracker, bin_counts, calibrate, derive
from hookwatch._drift.tracker import compact_features
from hookwatch._errors import ConfigError
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch._profile import build_profile, capture_features, load_tracker
from hookwatch.tools.demo.digits_cnn import DigitsCNN
from hookwatch.tools.devstack import Ports, Stack

ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def test_tracker_tallies_bin_counts_of_tallied_detectors_only() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 3))
    ref = BinnedReference.fit("act", "activation", x, bins=6)
    cal = calibrate([ref], window=20, false_alarm_rate=0.05, windows=500)
    tracker = DriftTracker({"act": ref}, cal, step=5, tallied=frozenset({"act"}))
    quiet = DriftTracker({"act": ref}, cal, step=5)
    first, second = rng.normal(size=(7, 3)), rng.normal(loc=1.0, size=(30, 3))
    for t in (tracker, quiet):
        t.update("act", first)
        t.update("act", second)
    taken = tracker.take_counts()
    expected = bin_counts(ref.encode(np.concatenate([first, second]))[None], ref.n_bins)[0]
    assert set(taken) == {"act"}
    np.testing.assert_array_equal(taken["act"], expected)
    assert taken["act"].sum() == 37 * 3
    assert tracker.take_counts() == {}  # taken once
    assert quiet.take_counts() == {}  # not tallied: no work, nothing to publish


def test_compact_features_keep_the_leading_ones_and_the_last() -> None:
    np.testing.assert_array_equal(compact_features(3, 4), [0, 1, 2])
    np.testing.assert_array_equal(compact_features(4, 4), [0, 1, 2, 3])
    np.testing.assert_array_equal(compact_features(81, 4), [0, 1, 2, 80])
    np.testing.assert_array_equal(compact_features(81, 1), [80])
    with pytest.raises(ValueError, match="fleet feature budget"):
        compact_features(3, 0)


def test_choose_fleet_matches_patterns_and_compacts_layers_only() -> None:
    rng = np.random.default_rng(1)
    refs = {
        "act": BinnedReference.fit("act", "activation", rng.normal(size=(400, 9)), bins=5),
        "output": BinnedReference.fit("output", "output", rng.normal(size=(400, 9)), bins=5),
    }
    cal = calibrate(list(refs.values()), window=20, false_alarm_rate=0.05, windows=500)
    tracker = DriftTracker(refs, cal, step=5)
    tracker.choose_fleet(FLEET_DETECTORS, 3)
    assert tracker.tallied == {"act", "output"}
    np.testing.assert_array_equal(tracker.fleet_features("act"), [0, 1, 8])
    np.testing.assert_array_equal(tracker.fleet_features("output"), np.arange(9))
    x = rng.normal(size=(30, 9))
    tracker.update("act", x)
    taken = tracker.take_counts()
    expected = bin_counts(refs["act"].encode(x)[:, [0, 1, 8]][None], 5)[0]
    np.testing.assert_array_equal(taken["act"], expected)
    tracker.choose_fleet(["out*", "missing"], 3)
    assert tracker.tallied == {"output"}


def test_fleet_detectors_are_configurable_and_checked() -> None:
    default = MonitoringConfig.from_mapping({}).drift
    assert default.fleet_detectors == FLEET_DETECTORS == ("*",)
    assert default.fleet_features == FLEET_FEATURES
    config = MonitoringConfig.from_mapping({"drift": {"fleet_detectors": ["input", "output"]}})
    assert config.drift.fleet_detectors == ("input", "output")
    for bad in (["output", "output"], "output", [""], [3]):
        with pytest.raises(ConfigError, match=r"monitoring\.drift\.fleet_detectors: expected"):
            MonitoringConfig.from_mapping({"drift": {"fleet_detectors": bad}})


def _by_name(values: Samples, name: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for (n, labels), v in values.items():
        if n == name:
            d = dict(labels)
            assert d["model"] == "digits"
            out[(d["detector"], d["feature"], d["bin"])] = v
    return out


def test_monitor_exports_bin_counts_equal_to_an_offline_recount(
    tmp_path: Path, metrics: MetricSet
) -> None:
    torch.manual_seed(0)
    model = DigitsCNN().eval()
    gen = torch.Generator().manual_seed(0)
    reference = torch.rand(400, 1, 8, 8, generator=gen) * 16
    config = MonitoringConfig.from_mapping(
        {
            "layers": ["act1"],
            "sample_rate": 1.0,
            "drift": {"window": 30, "fleet_detectors": ["output", "class_mix", "act1"]},
        }
    )
    profile = build_profile(model, config, [reference[:200], reference[200:]], "digits")
    profile.save(tmp_path / config.drift.profile)
    tracker = load_tracker(config, tmp_path, "digits")
    assert tracker is not None
    monitor = Monitor(model, plan_watch(model, config, "digits"), metrics=metrics, drift=tracker)
    try:
        declared = _by_name(dict(metrics.sample_values()), "hookwatch_drift_bin_samples_total")
        assert declared and set(declared.values()) == {0.0}
        traffic = torch.rand(45, 1, 8, 8, generator=gen) * 10
        for row in traffic:
            with torch.inference_mode(), monitor.request(1):
                model(row[None])
        assert monitor.flush()
        values = dict(metrics.sample_values())
    finally:
        monitor.close()

    counters = _by_name(values, "hookwatch_drift_bin_samples_total")
    reference_bins = _by_name(values, "hookwatch_drift_reference_bin_samples")
    # One series per bin that exists, in both metrics; nothing for detectors not tallied.
    assert set(counters) == set(reference_bins) == set(declared)
    assert {d for d, _, _ in counters} == {"output", "class_mix", "act1"}
    # One forward pass per image, as the monitor saw them.
    passes = list(capture_features(model, config, [row[None] for row in traffic]))
    features = {layer: np.concatenate([p[layer] for p in passes]) for layer in passes[0]}
    expected: dict[tuple[str, str, str], float] = {}
    for layer in ("act1", "output"):
        for name, x in derive(layer, features[layer]).items():
            ref = profile.references[name]
            if name not in ("output", "class_mix", "act1"):
                continue
            counts = bin_counts(ref.encode(x)[None], ref.n_bins)[0]
            for f in tracker.fleet_features(name):
                for k in np.flatnonzero(ref.valid[f]):
                    key = (name, str(ref.kept[f]), str(k))
                    expected[key] = float(counts[f, k])
                    assert reference_bins[key] == ref.counts[f, k]
    assert counters == expected
    # The hidden layer counts its compact features only (its first three and its last), the
    # output's detectors every feature.
    act1 = profile.references["act1"]
    assert act1.n_features > config.drift.fleet_features == 4
    assert {f for d, f, _ in counters if d == "act1"} == {
        str(act1.kept[i]) for i in (0, 1, 2, act1.n_features - 1)
    }
    for detector in ("output", "class_mix", "act1"):
        n_features = len(tracker.fleet_features(detector))
        assert sum(v for (d, _, _), v in counters.items() if d == detector) == 45 * n_features
    assert values[("hookwatch_drift_window_samples", (("model", "digits"),))] == 30


def test_one_prometheus_can_scrape_several_stacks(tmp_path: Path) -> None:
    ports = Ports.free()
    stack = Stack(
        root=ROOT,
        run_dir=tmp_path,
        ports=ports,
        extra_scrape_targets={"hookwatch": ["127.0.0.1:19101"], "torchserve": ["127.0.0.1:18082"]},
    )
    rendered = yaml.safe_load(stack.render_prometheus_config().read_text())
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in rendered["scrape_configs"]
    }
    assert targets == {
        "torchserve": [f"127.0.0.1:{ports.metrics}", "127.0.0.1:18082"],
        "hookwatch": [f"127.0.0.1:{ports.exporter}", "127.0.0.1:19101"],
    }
    wrong = Stack(root=ROOT, run_dir=tmp_path, extra_scrape_targets={"hookwatc": ["x:1"]})
    with pytest.raises(ValueError, match="expected scrape jobs among"):
        wrong.render_prometheus_config()
