"""Units that never fire or sit saturated, and statistics by predicted class: counted on the
capture thread, exported per unit and per class, compared with the profile's reference."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from hookwatch._config import MonitoringConfig
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch._profile import build_profile, tracker_for
from hookwatch._views import ClassSlots, UnitReference

UNITS = 6


def _net() -> nn.Sequential:
    """Unit 0 of ``act`` never fires (weights 0, bias -1) and unit 1 always sits at ReLU6's
    ceiling (bias 10); the other four vary with the input."""
    torch.manual_seed(0)
    net = nn.Sequential(
        OrderedDict(fc=nn.Linear(4, UNITS), act=nn.ReLU6(), out=nn.Linear(UNITS, 3))
    )
    with torch.no_grad():
        net.fc.weight[:2] = 0.0
        net.fc.bias[0], net.fc.bias[1] = -1.0, 10.0
        net.fc.weight[2:] *= 3.0
    return net.eval()


def _value(metrics: MetricSet, name: str, **labels: str) -> float:
    return metrics.sample_values().get((name, tuple(sorted(labels.items()))), float("nan"))


def _serve(metrics: MetricSet, inputs: list[torch.Tensor], **config: object) -> Monitor:
    net = _net()
    monitoring = MonitoringConfig.from_mapping(
        {"layers": ["act"], "sample_rate": 1.0, "max_classes": 2, **config}
    )
    reference = [torch.randn(200, 4, generator=torch.Generator().manual_seed(1))]
    tracker = tracker_for(build_profile(net, monitoring, reference, "m"), monitoring, "m")
    monitor = Monitor(net, plan_watch(net, monitoring, "m"), metrics=metrics, drift=tracker)
    for x in inputs:
        with torch.inference_mode(), monitor.request(len(x)):
            net(x)
    monitor.flush()
    monitor.close()
    return monitor


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    # Batches of 1 to 9: with a small copy_limit some are copied raw, others reduced in the hook.
    return [torch.randn(1 + i % 9, 4, generator=g) for i in range(30)]


def test_dead_and_saturated_units_are_counted_per_unit_against_the_reference(
    metrics: MetricSet,
) -> None:
    _serve(metrics, _inputs())
    captured = _value(metrics, "hookwatch_captures_total", model="m", layer="act")
    assert captured == sum(len(x) for x in _inputs())
    active = [
        _value(metrics, "hookwatch_unit_active_samples_total", model="m", layer="act", unit=str(u))
        for u in range(UNITS)
    ]
    saturated = [
        _value(
            metrics, "hookwatch_unit_saturated_samples_total", model="m", layer="act", unit=str(u)
        )
        for u in range(UNITS)
    ]
    assert active[0] == 0 and active[1] == captured
    assert all(0 < a < captured for a in active[2:]), active
    # Unit 1 held 6 on every sample; the others only where they passed their reference maximum.
    assert saturated[1] == captured and saturated[0] == 0
    assert all(s < captured for s in saturated[2:]), saturated
    assert _value(metrics, "hookwatch_reference_dead_units", model="m", layer="act") == (
        pytest.approx(1 / UNITS)
    )
    assert _value(metrics, "hookwatch_reference_saturated_units", model="m", layer="act") == (
        pytest.approx(1 / UNITS)
    )
    # Units are a hidden layer's: the input and the logits have none.
    names = {(n, dict(labels).get("layer")) for n, labels in metrics.sample_values()}
    assert ("hookwatch_unit_active_samples_total", "input") not in names
    assert ("hookwatch_unit_active_samples_total", "output") not in names


def test_statistics_by_predicted_class_add_up_to_the_layer_and_follow_the_predictions(
    metrics: MetricSet,
) -> None:
    inputs = _inputs()
    monitor = _serve(metrics, inputs)
    net = _net()
    with torch.inference_mode():
        predicted = torch.cat([net(x).argmax(1) for x in inputs]).numpy()
        acts = torch.cat([net.act(net.fc(x)) for x in inputs]).numpy()
    classes = monitor._processor.classes
    assert classes is not None and len(classes.labels) == 3 and classes.labels[-1] == "other"
    slots = classes.slots(predicted)
    total = 0.0
    for slot, label in enumerate(classes.labels):
        labels = {"model": "m", "layer": "act", "statistic": "mean", "class": label}
        count = _value(metrics, "hookwatch_class_activation_statistic_count", **labels)
        assert count == int((slots == slot).sum()), label
        mean = _value(metrics, "hookwatch_class_activation_statistic_sum", **labels)
        assert mean == pytest.approx(acts[slots == slot].mean(axis=1).sum(), rel=1e-4)
        total += count
    assert total == len(predicted)


def test_rows_line_up_with_their_predictions_whichever_way_they_were_captured() -> None:
    """Captures reduced in the hook (copy_limit 0) and raw copies reduced on the capture thread
    give the same per-class and per-unit results."""
    from prometheus_client import CollectorRegistry

    results = []
    for copy_limit in (0, 4096):
        metrics = MetricSet(CollectorRegistry())
        _serve(metrics, _inputs(), copy_limit=copy_limit)
        results.append(
            {
                key: v
                for key, v in metrics.sample_values().items()
                if key[0].startswith(("hookwatch_class_", "hookwatch_unit_"))
            }
        )
    assert results[0] and results[0].keys() == results[1].keys()
    for key, v in results[0].items():
        assert results[1][key] == pytest.approx(v, rel=1e-5), key


def test_raw_captures_of_several_shapes_in_one_drain_keep_their_records_classes() -> None:
    """A layer whose per-sample shape changes between requests (a variable-length input) is
    reduced one shape at a time; its rows must still meet their own record's prediction."""
    from hookwatch._hooks import Capture
    from hookwatch._monitor.processor import CaptureProcessor

    rng = np.random.default_rng(3)
    processor = CaptureProcessor(
        "m", 256, widths={"output": 4096}, units={"act": 64}, classes=ClassSlots.tracked([0, 1])
    )
    records, expected_sums, expected_counts, expected_active = [], np.zeros(3), np.zeros(3), 0
    for i in range(12):
        batch = 1 + i % 4
        act = np.maximum(rng.normal(size=(batch, 3, 2 + 3 * (i % 2))), 0).astype(np.float32)
        logits = rng.normal(size=(batch, 3)).astype(np.float32)
        records.append(
            (
                Capture("act", None, None, torch.from_numpy(act)),
                Capture("output", None, None, torch.from_numpy(logits)),
            )
        )
        slots = np.minimum(logits.argmax(axis=1), 2)  # class 2 is "other"
        for row, slot in zip(act, slots, strict=True):
            expected_sums[slot] += row.mean()
            expected_counts[slot] += 1
        expected_active = expected_active + (act.mean(axis=2) != 0).sum(axis=0)
    processor.process(records)
    tally = processor.take().layers["act"]
    assert tally.class_counts is not None and tally.class_sums is not None
    assert tally.class_counts.tolist() == expected_counts.tolist()
    np.testing.assert_allclose(tally.class_sums[:, 0], expected_sums, rtol=1e-5)
    assert tally.active is not None and tally.active.tolist() == list(expected_active)


def test_class_slots_keep_the_most_frequent_classes_and_fold_the_rest() -> None:
    slots = ClassSlots.by_frequency([5, 50, 1, 30], max_classes=2)
    assert slots.labels == ("1", "3", "other")
    assert slots.slots(np.array([1, 3, 0, 2, 99, -4])).tolist() == [0, 1, 2, 2, 2, 2]
    assert ClassSlots.by_frequency(None, 3).labels == ("0", "1", "2", "other")
    with pytest.raises(ValueError, match="distinct class indices"):
        ClassSlots.tracked([1, 1])


def test_a_unit_reference_knows_dead_and_stuck_units() -> None:
    x = np.array([[0.0, 6.0, 1.0], [0.0, 6.0, 3.0], [0.0, 6.0, 2.0]])
    ref = UnitReference.fit("act", x, units=2)
    assert ref.width == 2 and ref.dead_share == 0.5 and ref.saturated_share == 0.5
    assert ref.saturated_counts(np.array([[0.0, 6.0, 9.0], [1.0, 5.9, 9.0]])).tolist() == [1, 1]
