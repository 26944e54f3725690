"""The accuracy estimate without labels, through the serving path: a Monitor on a small real
model with a labelled reference, sampled requests, the metrics it exports (issue 29)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch import nn

from hookwatch._config import MonitoringConfig
from hookwatch._drift import AccuracyEstimator, AccuracyTracker, DriftTracker
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch._profile import DriftProfile, build_profile, tracker_for
from hookwatch._profile.accuracy import with_accuracy

MODEL = {"model": "m"}
GAUGES = ("hookwatch_estimated_accuracy", "hookwatch_reference_accuracy")
COUNTERS = (
    "hookwatch_estimated_correct_total",
    "hookwatch_estimate_samples_total",
    "hookwatch_estimate_outside_support_total",
    "hookwatch_accuracy_drop_alarms_total",
)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(fc=nn.Linear(4, 16), act=nn.ReLU(), out=nn.Linear(16, 3))
    ).eval()


_RAW = {"layers": ["act"], "sample_rate": 1.0, "drift": {"window": 50}}


def _config() -> MonitoringConfig:
    return MonitoringConfig.from_mapping(_RAW)


def _reference(net: nn.Module) -> tuple[list[torch.Tensor], np.ndarray]:
    """Reference batches and their labels: the model is right on 95 % of them."""
    x = torch.randn(1000, 4, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        y = net(x).argmax(1).numpy()
    y[:50] = (y[:50] + 1) % 3
    return [x[i : i + 100] for i in range(0, 1000, 100)], y


def _profile(net: nn.Module, config: MonitoringConfig) -> DriftProfile:
    batches, y = _reference(net)
    # A generator: build_profile reads the batches twice when labels are given.
    return build_profile(net, config, (b for b in batches), "m", labels=y)


def _tracker(net: nn.Module, config: MonitoringConfig) -> DriftTracker:
    return tracker_for(_profile(net, config), config, "m")


def test_the_estimator_travels_in_the_profile_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    net, config = _net(), _config()
    profile = _profile(net, config)
    loaded = DriftProfile.load(profile.save(tmp_path / "p.npz"))
    assert loaded.accuracy_layer == "act" and loaded.accuracy is not None
    assert profile.accuracy is not None
    for name, array in profile.accuracy.to_arrays().items():
        np.testing.assert_array_equal(loaded.accuracy.to_arrays()[name], array, err_msg=name)
    with caplog.at_level(logging.INFO, logger="hookwatch"):
        tracker = tracker_for(loaded, config, "m")
    assert tracker.accuracy is not None and tracker.accuracy.layer == "act"
    assert tracker.accuracy.test.run_length == config.harm.run_length
    assert any(
        "estimated without labels from layer 'act'" in r.getMessage() for r in caplog.records
    )
    # Off by configuration, and absent without labels: said once, at load.
    off = MonitoringConfig.from_mapping({**_RAW, "harm": {"enabled": False}})
    assert tracker_for(loaded, off, "m").accuracy is None
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hookwatch"):
        plain = tracker_for(dataclasses.replace(loaded, accuracy=None), config, "m")
    assert plain.accuracy is None
    said = [r.getMessage() for r in caplog.records if "no accuracy estimate" in r.getMessage()]
    assert len(said) == 1 and "without reference labels" in said[0]


def value(metrics: MetricSet, name: str) -> float:
    return metrics.sample_values().get((name, tuple(MODEL.items())), math.nan)


def serve(monitor: Monitor, net: nn.Module, batches: int, scale: float = 1.0) -> None:
    g = torch.Generator().manual_seed(batches)
    for _ in range(batches):
        with torch.inference_mode(), monitor.request(20):
            net(torch.randn(20, 4, generator=g) * scale + (scale - 1.0))
    monitor.flush()


def test_the_estimate_and_its_counters_are_exported() -> None:
    net, config = _net(), _config()
    tracker = _tracker(net, config)
    metrics = MetricSet(CollectorRegistry())
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics, drift=tracker)
    # Declared at load: the reference's accuracy and every counter at 0, the estimate not yet.
    assert value(metrics, "hookwatch_reference_accuracy") == pytest.approx(0.95)
    assert all(value(metrics, name) == 0 for name in COUNTERS)
    assert math.isnan(value(metrics, "hookwatch_estimated_accuracy"))
    serve(monitor, net, 10)
    monitor.close()
    assert value(metrics, "hookwatch_estimate_samples_total") == 200
    correct = value(metrics, "hookwatch_estimated_correct_total")
    # Clean traffic: the estimate is near the reference's own.
    assert abs(correct / 200 - tracker.accuracy.estimator.reference_score) < 0.1  # type: ignore[union-attr]
    assert 0.8 <= value(metrics, "hookwatch_estimated_accuracy") <= 1.0
    assert value(metrics, "hookwatch_accuracy_drop_alarms_total") == 0
    # Per predicted class: the same sums, split by class (3 classes, all tracked, and other).
    by_class: dict[str, dict[str, float]] = {}
    for (name, labels), v in metrics.sample_values().items():
        if name in (
            "hookwatch_class_estimated_correct_total",
            "hookwatch_class_estimate_samples_total",
        ):
            by_class.setdefault(name, {})[dict(labels)["class"]] = v
    samples = by_class["hookwatch_class_estimate_samples_total"]
    assert set(samples) == {"0", "1", "2", "other"} and samples["other"] == 0
    assert sum(samples.values()) == 200
    right = by_class["hookwatch_class_estimated_correct_total"]
    assert sum(right.values()) == pytest.approx(correct)


def test_a_harmful_shift_raises_the_drop_alarm(caplog: pytest.LogCaptureFixture) -> None:
    net, config = _net(), _config()
    metrics = MetricSet(CollectorRegistry())
    monitor = Monitor(
        net, plan_watch(net, config, "m"), metrics=metrics, drift=_tracker(net, config)
    )
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        serve(monitor, net, 30, scale=5.0)
    monitor.close()
    assert value(metrics, "hookwatch_accuracy_drop_alarms_total") >= 1
    assert value(metrics, "hookwatch_estimate_outside_support_total") > 0
    assert value(metrics, "hookwatch_estimated_accuracy") < 0.5
    assert any("accuracy-drop alarm on model 'm'" in r.getMessage() for r in caplog.records)


def test_without_an_estimate_nothing_of_it_is_exported() -> None:
    net, config = _net(), _config()
    batches, _ = _reference(net)
    tracker = tracker_for(build_profile(net, config, batches, "m"), config, "m")
    metrics = MetricSet(CollectorRegistry())
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics, drift=tracker)
    serve(monitor, net, 5)
    monitor.close()
    exported = {name for name, _ in metrics.sample_values()}
    assert not exported & {*GAUGES, *COUNTERS}
    assert not any(name.startswith("hookwatch_class_estimate") for name in exported)


def test_a_fault_turns_the_estimate_off_visibly_and_serving_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    net, config = _net(), _config()
    tracker = _tracker(net, config)
    assert tracker.accuracy is not None
    # An estimator for another layer width: every estimate fails.
    broken = AccuracyEstimator.fit(
        np.random.default_rng(0).normal(size=(100, 5)),
        np.random.default_rng(1).normal(size=(100, 3)),
        np.arange(100) % 3,
    )
    tracker.accuracy = AccuracyTracker(broken, "act")
    metrics = MetricSet(CollectorRegistry())
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics, drift=tracker)
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        serve(monitor, net, 5)
        serve(monitor, net, 5)
    monitor.close()
    faults = metrics.sample_values()[
        ("hookwatch_monitor_faults_total", (("layer", "act"), ("model", "m")))
    ]
    assert faults == 1
    assert value(metrics, "hookwatch_estimate_samples_total") == 0
    # The layer's statistics and drift go on.
    captures = metrics.sample_values()[
        ("hookwatch_captures_total", (("layer", "act"), ("model", "m")))
    ]
    assert captures == 200
    logged = [r.getMessage() for r in caplog.records if "accuracy estimate" in r.getMessage()]
    assert logged and "is off in this worker" in logged[0]
    # The rules read a reference accuracy of 0 as no estimate: this worker pages on drift.
    assert value(metrics, "hookwatch_reference_accuracy") == 0


def test_the_window_keeps_the_last_samples() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4))
    logits = np.stack([-x[:, 0], x[:, 0]], axis=1)
    estimator = AccuracyEstimator.fit(x, logits, (x[:, 0] > 0).astype(np.int64))
    tracker = AccuracyTracker(estimator, "act", window=30)
    assert math.isnan(tracker.estimated_accuracy)
    right = tracker.estimator.estimate(x[:25], logits[:25]).scores
    wrong = tracker.estimator.estimate(x[:25], -logits[:25]).scores
    tracker.update(x[:25], logits[:25])
    tracker.update(x[:25], -logits[:25])
    # The last 30: 5 of the first drain's, all 25 of the second's.
    assert tracker.estimated_accuracy == pytest.approx(np.concatenate([right[-5:], wrong]).mean())
    assert tracker.count == 50 and tracker.correct_sum == pytest.approx(right.sum() + wrong.sum())


def test_rows_of_records_that_lack_the_output_are_left_out() -> None:
    from hookwatch._monitor.processor import _aligned, _Rows

    # Records 0..3; the output of record 1 was not captured, record 2 has 2 rows in both.
    layer = _Rows(np.array([0, 1, 2, 3]), np.array([1, 1, 2, 1]), np.arange(5)[:, None] * 1.0)
    output = _Rows(np.array([0, 2, 3]), np.array([1, 2, 1]), np.arange(4)[:, None] * 10.0)
    rows, out_rows = _aligned(4, layer, output)
    assert rows.tolist() == [0, 2, 3, 4]
    assert out_rows.tolist() == [0, 1, 2, 3]


def test_the_fit_reads_the_last_hidden_layer_and_counts_the_reference_accuracy() -> None:
    net, config = _net(), _config()
    profile = _profile(net, config)
    assert profile.accuracy_layer == "act" and profile.accuracy is not None
    # Every reference sample counts, the model is right on 950 of 1000.
    assert profile.accuracy.reference_accuracy == pytest.approx(0.95)
    assert profile.accuracy.k == config.harm.neighbours


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (np.zeros(999, dtype=np.int64), "expected 1000 labels (one per reference sample), got 999"),
        (np.zeros(1000), "expected integer class labels (the index of the right logit), got dtype"),
        (np.zeros((1000, 1), dtype=np.int64), "expected a 1-D array of class labels"),
        (
            np.full(1000, 7),
            "expected labels in [0, 3) (the logits' classes), got 'labels from 7 to 7'",
        ),
    ],
)
def test_bad_labels_are_one_line_saying_what_was_expected(labels: object, expected: str) -> None:
    from hookwatch._errors import ConfigError

    net, config = _net(), _config()
    batches, _ = _reference(net)
    profile = build_profile(net, config, batches, "m")
    with pytest.raises(ConfigError) as raised:
        with_accuracy(profile, net, config, batches, labels)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_labels_for_a_head_that_is_not_logits_are_refused() -> None:
    from hookwatch._errors import ConfigError

    net = _net()
    config = MonitoringConfig.from_mapping({**_RAW, "output": {"head": "values"}})
    batches, y = _reference(net)
    profile = build_profile(net, config, batches, "m")
    with pytest.raises(ConfigError, match=r"expected a model whose monitoring\.output\.head is "):
        with_accuracy(profile, net, config, batches, y)


def test_an_unwatched_harm_layer_is_refused() -> None:
    from hookwatch._errors import ConfigError

    net = _net()
    config = MonitoringConfig.from_mapping({**_RAW, "harm": {"layer": "fc"}})
    batches, y = _reference(net)
    profile = build_profile(net, config, batches, "m")
    with pytest.raises(ConfigError, match=r"expected one of the watched hidden layers \['act'\]"):
        with_accuracy(profile, net, config, batches, y)


class _Blind(nn.Module):
    """A classifier of 4 features whose last watched layer sees none of them: ``blind`` reads
    a fixed noise of its own, which says nothing about the answer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.seeing = nn.Sequential(nn.Linear(4, 16), nn.ReLU())
        self.blind = nn.Sequential(nn.Linear(4, 16), nn.ReLU())
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.seeing(x)
        noise = torch.randn(x.shape[0], 4, generator=torch.Generator().manual_seed(7))
        self.blind(noise)
        out: torch.Tensor = self.out(h)
        return out


def test_a_default_layer_far_from_the_accuracy_gives_way_to_a_nearer_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The last watched layer is the default; where its own estimate on the reference sits
    far from the model's accuracy and another watched layer's nearer, that one is read, and
    the log says why. Chosen by the config, the layer stays as it is."""
    net = _Blind().eval()
    batches, y = _reference(net)
    raw = {"layers": ["seeing.1", "blind.1"], "sample_rate": 1.0, "drift": {"window": 50}}
    config = MonitoringConfig.from_mapping(raw)
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        profile = build_profile(net, config, (b for b in batches), "m", labels=y)
    assert profile.accuracy is not None and profile.accuracy_layer == "seeing.1"
    assert abs(profile.accuracy.reference_score - profile.accuracy.reference_accuracy) < 0.1
    assert "reads layer 'seeing.1', not the last watched 'blind.1'" in caplog.text
    chosen = MonitoringConfig.from_mapping(raw | {"harm": {"layer": "blind.1"}})
    kept = build_profile(net, chosen, (b for b in batches), "m", labels=y)
    assert kept.accuracy is not None and kept.accuracy_layer == "blind.1"
    assert abs(kept.accuracy.reference_score - kept.accuracy.reference_accuracy) > 0.1
