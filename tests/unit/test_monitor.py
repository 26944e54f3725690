from __future__ import annotations

import gc
import logging
import math
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch import nn

from hookwatch._capture import CaptureWorker
from hookwatch._config import MonitoringConfig
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.fc(x))
        return out


REFERENCE_NET = Net()


def value(metrics: MetricSet, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return metrics.sample_values().get(key, float("nan"))


def run(monitor: Monitor, net: nn.Module, batches: int, batch_size: int = 1) -> None:
    for _ in range(batches):
        with torch.inference_mode(), monitor.request(batch_size):
            net(torch.randn(batch_size, 4))


def test_full_sampling_counts_every_sample_on_every_layer(metrics: MetricSet) -> None:
    net = Net()
    config = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 1.0})
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    run(monitor, net, batches=7, batch_size=3)
    monitor.flush()
    monitor.close()
    assert value(metrics, "hookwatch_requests_total", model="m") == 21
    assert value(metrics, "hookwatch_requests_sampled_total", model="m") == 21
    for layer in ("input", "act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == 21
        assert (
            value(
                metrics,
                "hookwatch_activation_statistic_count",
                model="m",
                layer=layer,
                statistic="mean",
            )
            == 21
        )
    assert value(metrics, "hookwatch_captures_dropped_total", model="m") == 0


def test_zero_sampling_counts_requests_and_captures_nothing(metrics: MetricSet) -> None:
    net = Net()
    monitor = Monitor(
        net,
        plan_watch(
            net, MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 0.0}), "m"
        ),
        metrics=metrics,
    )
    run(monitor, net, batches=10)
    monitor.flush()
    monitor.close()
    assert value(metrics, "hookwatch_requests_total", model="m") == 10
    assert value(metrics, "hookwatch_captures_total", model="m", layer="act") == 0


def test_partial_sampling_rate_is_honoured(metrics: MetricSet) -> None:
    net = Net()
    config = MonitoringConfig.from_mapping(
        {"layers": [], "sample_rate": 0.25, "seed": 7, "queue_size": 100_000}
    )
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    run(monitor, net, batches=2000)
    monitor.flush()
    monitor.close()
    sampled = value(metrics, "hookwatch_requests_sampled_total", model="m")
    assert 400 < sampled < 600  # Binomial(2000, 0.25): mean 500, sd ~19
    assert value(metrics, "hookwatch_captures_total", model="m", layer="output") == sampled
    assert value(metrics, "hookwatch_captures_dropped_total", model="m") == 0


def test_nonfinite_activations_are_counted_and_kept_out_of_the_summaries(
    metrics: MetricSet,
) -> None:
    net = Net()
    config = MonitoringConfig.from_mapping({"layers": [], "sample_rate": 1.0})
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    with torch.inference_mode(), monitor.request(2):
        net(torch.tensor([[float("nan"), 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]]))
    monitor.flush()
    monitor.close()
    assert (
        value(metrics, "hookwatch_activation_nonfinite_total", model="m", layer="input", kind="nan")
        == 1
    )
    assert (
        value(
            metrics,
            "hookwatch_activation_statistic_count",
            model="m",
            layer="input",
            statistic="mean",
        )
        == 1
    )
    assert (
        value(
            metrics,
            "hookwatch_activation_statistic_sum",
            model="m",
            layer="input",
            statistic="mean",
        )
        == 1.0
    )


def test_a_full_queue_drops_and_counts(metrics: MetricSet) -> None:
    net = Net()
    config = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 1.0, "queue_size": 1})
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    monitor._worker.stop()  # nothing drains: every forward's record past the first is dropped
    run(monitor, net, batches=5)
    monitor._publish()
    dropped = value(metrics, "hookwatch_captures_dropped_total", model="m")
    assert dropped == (5 - 1) * 3  # counted in captures: three hook points per forward
    monitor.close()


def test_a_processing_fault_switches_one_layer_off_visibly(
    metrics: MetricSet, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = Net()
    config = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 1.0})
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    original = monitor._processor._process_layer

    def flaky(layer: str, *args: Any) -> None:
        if layer == "act":
            raise ValueError("broken statistic")
        original(layer, *args)

    monkeypatch.setattr(monitor._processor, "_process_layer", flaky)
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        run(monitor, net, batches=20)
        monitor.flush()
    monitor.close()
    assert value(metrics, "hookwatch_layer_enabled", model="m", layer="act") == 0
    assert value(metrics, "hookwatch_layer_enabled", model="m", layer="output") == 1
    assert value(metrics, "hookwatch_monitor_faults_total", model="m", layer="act") == 1
    assert value(metrics, "hookwatch_captures_total", model="m", layer="output") == 20
    assert sum("'act'" in r.getMessage() for r in caplog.records) == 1


def test_every_series_exists_at_zero_before_the_first_request(metrics: MetricSet) -> None:
    # Prometheus windows (delta, increase) need the zero before the first event.
    config = MonitoringConfig.from_mapping({"layers": ["fc", "act"], "sample_rate": 1.0})
    net = Net()
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    monitor.close()
    for layer in config.watched:
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == 0
        for statistic in ("mean", "std", "min", "max", "zero_fraction"):
            labels = {"model": "m", "layer": layer, "statistic": statistic}
            assert value(metrics, "hookwatch_activation_statistic_count", **labels) == 0


def test_copied_and_in_hook_reductions_export_the_same_numbers() -> None:
    torch.manual_seed(3)
    inputs = [torch.randn(2, 4) for _ in range(9)]
    exported = []
    for copy_limit in (0, 4096):  # 0: every layer reduced in the hook; 4096: all copied
        metrics = MetricSet(CollectorRegistry())
        net = Net()
        net.load_state_dict(REFERENCE_NET.state_dict())
        config = MonitoringConfig.from_mapping(
            {"layers": ["fc", "act"], "sample_rate": 1.0, "copy_limit": copy_limit}
        )
        monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
        for x in inputs:
            with torch.inference_mode(), monitor.request(2):
                net(x)
        monitor.flush()
        monitor.close()
        exported.append(
            {k: v for k, v in metrics.sample_values().items() if "_created" not in k[0]}
        )
    assert exported[0].keys() == exported[1].keys()
    for key, v in exported[0].items():
        assert v == pytest.approx(exported[1][key], rel=1e-5, abs=1e-6), key


def test_a_copied_capture_owns_its_storage() -> None:
    from hookwatch._hooks import Capture, Gate, HookSet

    seen: list[Capture] = []

    class Sink:
        def offer(self, capture: Capture) -> bool:
            seen.append(capture)
            return True

        def on_fault(self, layer: str, error: BaseException) -> None:
            raise AssertionError(error)

    net, gate = Net(), Gate()
    outputs: list[torch.Tensor] = []
    net.act.register_forward_hook(lambda m, a, out: outputs.append(out))
    HookSet(gate, Sink(), copy_limit=16).attach(net, ["act"], False, False)
    gate.set(True)
    net(torch.randn(3, 4))
    (capture,) = seen
    assert capture.raw is not None and capture.stats is None
    # On the host a numpy array with memory of its own, holding no reference to the tensor.
    assert isinstance(capture.raw, np.ndarray) and capture.raw.base is None
    assert not np.shares_memory(capture.raw, outputs[0].detach().numpy())
    assert np.array_equal(capture.raw, outputs[0].detach().numpy())


@pytest.mark.parametrize("copy_limit", [0, 4096], ids=["reduced-in-hook", "copied"])
def test_a_waiting_record_holds_nothing_the_garbage_collector_tracks(
    metrics: MetricSet, copy_limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records wait for a drain; tensors in them were promoted to the oldest generation and
    set off full collections (80-90 ms in a worker) every few thousand sampled requests."""
    net = Net()
    config = MonitoringConfig.from_mapping(
        {"layers": ["act"], "sample_rate": 1.0, "copy_limit": copy_limit}
    )
    kept: list[Any] = []
    # Each record as the capture buffer is offered it: the object that waits for a drain.
    monkeypatch.setattr(CaptureWorker, "offer", lambda worker, record: kept.append(record) or True)
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    run(monitor, net, batches=4, batch_size=2)
    monitor.close()
    # A collection untracks the captures, and the record around them at the next one (it was
    # visited first): in a worker, a young collection, then the middle one, never the oldest.
    gc.collect()
    gc.collect()
    assert len(kept) == 4 and all(len(record) == 3 for record in kept)
    tracked = [c[0] for record in kept for c in record if gc.is_tracked(c)]
    assert not tracked and not any(gc.is_tracked(record) for record in kept)


def test_what_numpy_cannot_take_is_held_as_a_tensor_copy() -> None:
    from hookwatch._hooks import hold

    x = torch.randn(2, 3)
    for tensor in (x.to(torch.bfloat16), torch._neg_view(x)):
        held = hold(tensor)
        assert isinstance(held, torch.Tensor)
        assert held.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
        assert torch.equal(held, tensor)
    assert isinstance(hold(x.t()), np.ndarray) and np.array_equal(hold(x.t()), x.t().numpy())


def test_a_forward_that_raises_hands_off_nothing(metrics: MetricSet) -> None:
    class Breaks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.act(x)
            raise RuntimeError("after the first layer")

    net = Breaks()
    config = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 1.0})
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    with pytest.raises(RuntimeError), torch.inference_mode(), monitor.request(1):
        net(torch.randn(1, 4))
    monitor.flush()
    monitor.close()
    # Sampled, but half a record (input and act, no output) is not handed off.
    assert value(metrics, "hookwatch_requests_sampled_total", model="m") == 1
    for layer in ("input", "act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == 0
    assert monitor._worker.accepted == 0


def test_results_reach_the_metrics_on_publish_not_per_drain(metrics: MetricSet) -> None:
    net = Net()
    config = MonitoringConfig.from_mapping(
        {"layers": ["act"], "sample_rate": 1.0, "flush_interval_s": 60}
    )
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    run(monitor, net, batches=4)
    assert monitor._worker.wait_idle(5)
    # Processed, but not yet published: metric writes follow the publish interval.
    assert value(metrics, "hookwatch_captures_total", model="m", layer="act") == 0
    monitor.flush()
    assert value(metrics, "hookwatch_captures_total", model="m", layer="act") == 4
    monitor.close()


def test_request_counts_are_exported_on_publish_and_exact_across_threads(
    metrics: MetricSet,
) -> None:
    net = Net()
    config = MonitoringConfig.from_mapping(
        {"layers": ["act"], "sample_rate": 0.5, "flush_interval_s": 60, "seed": 3}
    )
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    threads = [threading.Thread(target=run, args=(monitor, net, 200, 2)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monitor.reject(3)
    # The request path keeps tallies; nothing is written to the exported counters per request.
    assert value(metrics, "hookwatch_requests_total", model="m") == 0
    monitor.flush()
    # Received: the 1600 served and the 3 rejected.
    assert value(metrics, "hookwatch_requests_total", model="m") == 1603
    assert (
        value(metrics, "hookwatch_requests_sampled_total", model="m") == monitor._counts().sampled
    )
    assert 0 < monitor._counts().sampled < 1600
    assert value(metrics, "hookwatch_requests_rejected_total", model="m", reason="other") == 3
    # A second publish adds only what came since.
    run(monitor, net, batches=5)
    monitor.close()
    assert value(metrics, "hookwatch_requests_total", model="m") == 1608


def test_the_first_detector_to_alarm_is_exported(metrics: MetricSet) -> None:
    from collections import OrderedDict

    from hookwatch._profile import build_profile, tracker_for

    torch.manual_seed(0)
    net = nn.Sequential(OrderedDict(fc=nn.Linear(4, 8), act=nn.ReLU(), out=nn.Linear(8, 3)))
    config = MonitoringConfig.from_mapping(
        {"layers": ["act"], "sample_rate": 1.0, "drift": {"window": 20, "step": 20}}
    )
    profile = build_profile(net.eval(), config, [torch.randn(100, 4) for _ in range(4)], "m")
    monitor = Monitor(
        net, plan_watch(net, config, "m"), metrics=metrics, drift=tracker_for(profile, config, "m")
    )
    with torch.inference_mode(), monitor.request(20):
        net(torch.randn(20, 4))
    monitor.flush()
    first = "hookwatch_drift_first_alarm"
    assert value(metrics, first, model="m", level="input", detector="input") == 0
    # Only the input's scale moves at first: a shift the input detector sees before the rest.
    with torch.inference_mode(), monitor.request(20):
        net(torch.randn(20, 4) * 6)
    monitor.flush()
    monitor.close()
    assert value(metrics, first, model="m", level="input", detector="input") == 1


def test_sequential_alarms_and_evidence_are_exported(
    metrics: MetricSet, caplog: pytest.LogCaptureFixture
) -> None:
    from collections import OrderedDict

    from hookwatch._profile import build_profile, tracker_for

    torch.manual_seed(0)
    net = nn.Sequential(OrderedDict(fc=nn.Linear(4, 8), act=nn.ReLU(), out=nn.Linear(8, 3)))
    config = MonitoringConfig.from_mapping(
        {"layers": ["act"], "sample_rate": 1.0, "drift": {"window": 50, "run_length": 1000}}
    )
    profile = build_profile(net.eval(), config, [torch.randn(500, 4) for _ in range(4)], "m")
    tracker = tracker_for(profile, config, "m")
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics, drift=tracker)
    labels = {"model": "m", "level": "input", "detector": "input"}
    threshold = value(metrics, "hookwatch_drift_evidence_threshold", **labels)
    assert threshold == pytest.approx(math.log(1000 * len(profile.references)))
    assert value(metrics, "hookwatch_drift_sequential_alarms_total", **labels) == 0
    for _ in range(20):
        with torch.inference_mode(), monitor.request(20):
            net(torch.randn(20, 4) * 4)
    monitor.flush()
    monitor.close()
    alarms = value(metrics, "hookwatch_drift_sequential_alarms_total", **labels)
    assert alarms >= 1 and alarms == tracker.sequential["input"].alarms
    evidence = value(metrics, "hookwatch_drift_evidence", **labels)
    assert 0 <= evidence < threshold
    # Each alarm is logged for the on-call, once per detector a minute however often it
    # alarms, and the tracker holds none once they were taken.
    logged = [r.getMessage() for r in caplog.records if "drift alarm on 'input'" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "anytime-valid" in logged[0] and "model 'm'" in logged[0]
    assert tracker.take_alarms() == []


def test_a_request_count_that_is_not_a_whole_number_is_refused_before_counting(
    metrics: MetricSet,
) -> None:
    """A float, a string or a negative count would have counted requests that never came
    (requests_total 1.5 after request(-1) and request(2.5)); an integer of numpy or torch is
    a count like any other."""
    net = Net()
    config = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 1.0})
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    for bad, error in ((-1, ValueError), (2.5, TypeError), ("3", TypeError), (None, TypeError)):
        with pytest.raises(error, match="batch_size: expected a whole number of requests"):
            monitor.request(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count: expected a whole number"):
        monitor.reject(-2)
    with torch.inference_mode(), monitor.request(np.int64(2)):  # type: ignore[arg-type]
        net(torch.randn(2, 4))
    monitor.reject(torch.tensor(1))  # type: ignore[arg-type]
    monitor.flush()
    monitor.close()
    assert value(metrics, "hookwatch_requests_total", model="m") == 3
    assert value(metrics, "hookwatch_captures_total", model="m", layer="act") == 2


def test_requests_counted_on_arrival_are_counted_once_whatever_becomes_of_them(
    metrics: MetricSet,
) -> None:
    """A server that counts on arrival (TorchServe's handler) serves and turns away through
    what receive returned: each request is in requests_total once, sampled or rejected too."""
    net = Net()
    config = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 1.0})
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=metrics)
    received = monitor.receive(5)
    received.reject(1, "not_json")
    with torch.inference_mode(), received.request(4):
        net(torch.randn(4, 4))
    received.reject(1, "model_refused")  # one of the four, refused when run alone
    with pytest.raises(ValueError, match="expected a reason in"):
        received.reject(1, "no such reason")
    monitor.flush()
    monitor.close()
    counts = monitor._counts()
    assert (counts.requests, counts.sampled, counts.rejected) == (5, 4, 2)
    assert counts.rejected_by == {"not_json": 1, "model_refused": 1}
    assert value(metrics, "hookwatch_requests_total", model="m") == 5
    assert value(metrics, "hookwatch_requests_sampled_total", model="m") == 4
    for reason in ("not_json", "model_refused"):
        assert value(metrics, "hookwatch_requests_rejected_total", model="m", reason=reason) == 1


def test_the_countdown_samples_whole_forwards_independently_at_the_rate() -> None:
    # The gate draws the gap to the next sampled forward instead of a draw per forward: the
    # sampled forwards must still be Bernoulli(rate), each on its own, whatever their size,
    # and a sampled forward captures all its requests (hooks cost per hooked forward).
    from hookwatch._monitor.gate import RequestGate
    from hookwatch._monitor.tally import RequestTally

    rate, forwards = 0.2, 30_000
    gate = RequestGate("m", rate, lambda record: True, RequestTally("m", MetricSet()), seed=11)
    cycle = [1, 8, 3, 0, 1, 1, 5]
    sizes = np.array([cycle[i % len(cycle)] for i in range(forwards)])
    scopes = [gate.request(int(size)) for size in sizes]
    assert all(s.requests == size for s, size in zip(scopes, sizes, strict=True))
    # All or nothing: no rows picked out of a batch when no cap applies.
    assert all(s.picked in (0, s.requests) and s._rows is None for s in scopes)
    # A forward of no requests is never sampled and takes no turn of the countdown.
    assert not any(s.picked for s, size in zip(scopes, sizes, strict=True) if size == 0)
    x = np.array([bool(s.picked) for s in scopes], dtype=float)[sizes > 0]
    n = len(x)
    assert abs(x.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / n)
    # Each size is sampled at the rate: a batch of 8 is no likelier than a single request.
    for size in (1, 3, 5, 8):
        of_size = np.array([bool(s.picked) for s in scopes if s.requests == size], dtype=float)
        assert abs(of_size.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / len(of_size))
    # Each request is captured at the rate: the captured share of the requests, weighted by
    # the forwards' sizes (sd from the variance of a forward's captured count).
    served = sizes[sizes > 0]
    captured = x * served
    sd = np.sqrt(rate * (1 - rate) * np.sum(served.astype(float) ** 2)) / served.sum()
    assert abs(captured.sum() / served.sum() - rate) < 4 * sd
    # Independent: a sampled forward is followed by a sampled one at the rate, not more or less.
    after = x[1:][x[:-1] == 1]
    assert abs(after.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / len(after))
    # Several-row requests: a sampled forward captures every row of every request.
    picked = [gate.request(3, sizes=[2, 1, 3]) for _ in range(2000)]
    assert all(s.picked in (0, 3) and s._rows is None for s in picked)
    sampled = sum(bool(s.picked) for s in picked)
    assert abs(sampled / 2000 - rate) < 4 * np.sqrt(rate * (1 - rate) / 2000)
    assert all(s._batch == 6 for s in picked if s.picked)


def test_a_new_sample_rate_holds_from_the_next_request() -> None:
    from hookwatch._monitor.gate import RequestGate
    from hookwatch._monitor.tally import RequestTally

    gate = RequestGate("m", 0.5, lambda record: True, RequestTally("m", MetricSet()), seed=2)
    gate.request(4)
    gate.sample_rate = 1.0
    assert all(gate.request(3).picked == 3 for _ in range(20))
    gate.sample_rate = 0.0  # as capture going off sets it
    assert not any(gate.request(5).picked for _ in range(200))
    assert gate.request(0).picked == 0 and gate.request(0).requests == 0


def test_a_gate_that_is_off_samples_nothing_whatever_another_thread_left_half_done() -> None:
    """Two request threads at once: one has cleared the redraw flag and not yet drawn the
    countdown (still 0) when the other decides. At rate 0 that one must not sample (a CI run
    of the threaded count test saw it picked: its thread's assertion killed it)."""
    from hookwatch._monitor.gate import RequestGate
    from hookwatch._monitor.tally import RequestTally

    gate = RequestGate("m", 0.0, lambda record: True, RequestTally("m", MetricSet()))
    gate._redraw, gate._skip = False, 0  # the other thread's state between its two writes
    assert gate.decide(1).picked == 0 and gate.request(3).picked == 0
    gate.sample_rate = 0.25  # a rate set again is taken at once
    assert sum(bool(gate.request(1).picked) for _ in range(400)) > 40


class _Clock:
    """time.monotonic for the monitor module, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fake_clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """A hand-moved ``time.monotonic`` for the monitor and its gate (the rate the caps count,
    the gate's bucket), not for the capture thread. Patched on the ``time`` module itself it
    also moved the capture thread's publish schedule: once the fake time passed
    ``flush_interval_s`` that thread published in the middle of a test's second of traffic,
    and the test's own look at the rate saw a fraction of it (a CI run read the count cap's
    share as 20 of 490 requests, not of 2,000)."""
    from hookwatch._monitor import gate as gate_module
    from hookwatch._monitor import monitor as monitor_module

    clock = _Clock()
    real = monitor_module.time

    class _Time:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        monotonic = staticmethod(clock)

    for module in (monitor_module, gate_module):
        monkeypatch.setattr(module, "time", _Time())
    return clock


@pytest.mark.parametrize(
    ("raw", "per_s", "expected"),
    [
        ({}, 1000, 0.02),  # the default's cap: 20 a second of 1,000
        ({}, 100, 0.1),  # under the cap: the default share
        ({"max_sampled_per_s": 50}, 1000, 0.05),
        ({"sample_rate": 0.1}, 1000, 0.1),  # a rate that is set is taken exactly
    ],
)
def test_the_default_sampling_holds_to_its_cap_per_second(
    monkeypatch: pytest.MonkeyPatch, raw: dict[str, Any], per_s: int, expected: float
) -> None:
    clock = _fake_clock(monkeypatch)
    net = Net()
    config = MonitoringConfig.from_mapping({"layers": [], "flush_interval_s": 60, **raw})
    with Monitor(net, plan_watch(net, config, "m"), metrics=MetricSet()) as monitor:
        monitor._cap_sampling()  # the first look: no rate yet
        assert monitor._gate.sample_rate == config.share
        for _ in range(2):  # a second look at the same rate changes nothing more
            for _ in range(per_s):
                monitor.receive(1)
            clock.now += 1.0
            monitor._cap_sampling()
            assert monitor._gate.sample_rate == pytest.approx(expected)
        # The gate samples at the capped share from the next request on (the requests come
        # at the same rate: the gate's bucket, a second's worth, seldom has to step in).
        sampled = 0
        for _ in range(20_000):
            clock.now += 1.0 / per_s
            sampled += monitor._received.request(1).picked
        sd = math.sqrt(20_000 * expected * (1 - expected))
        assert abs(sampled - 20_000 * expected) < 4 * sd
        if not raw:
            for _ in range(10):  # traffic drops: back to the full share
                monitor.receive(1)
            clock.now += 1.0
            monitor._cap_sampling()
            assert monitor._gate.sample_rate == config.share
            # Capture off for good (as the capture thread does it): the cap never turns it
            # back on.
            monitor._worker.off = True
            monitor._capture_off()
            for _ in range(10):
                monitor.receive(1)
            clock.now += 1.0
            monitor._cap_sampling()
            assert monitor._gate.sample_rate == 0.0


def test_a_burst_after_a_quiet_spell_is_held_to_the_cap_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The share is re-decided at publishes; between them the gate's bucket holds the cap.
    from hookwatch._monitor import gate as gate_module
    from hookwatch._monitor.gate import RequestGate
    from hookwatch._monitor.tally import RequestTally

    clock = _Clock()
    monkeypatch.setattr(gate_module.time, "monotonic", clock)
    tally = RequestTally("m", MetricSet())
    gate = RequestGate("m", 0.5, lambda record: True, tally, seed=4, max_per_s=20.0)
    first = sum(gate.request(1).picked for _ in range(1000))  # all within one instant
    assert first == 20
    clock.now += 0.5  # half a second refills half the bucket
    assert sum(gate.request(1).picked for _ in range(1000)) == 10
    clock.now += 10.0  # a long quiet spell fills it, and no more than full
    batch = [gate.request(8) for _ in range(100)]
    assert sum(s.picked for s in batch) == 20
    partial = next(s for s in batch if 0 < s.picked < 8)
    assert partial._rows is not None and len(partial._rows) == partial.picked
    slow = RequestGate("m", 1.0, lambda record: True, tally, max_per_s=0.5)
    assert sum(slow.request(1).picked for _ in range(100)) == 1  # under 1 a second: one


def test_a_sampled_batch_the_bucket_cannot_hold_captures_its_first_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The cap counts requests: a sampled forward of 8 takes 8 samples, and with 3 left in the
    # bucket captures the rows of its first 3 requests (none left: not sampled at all).
    from hookwatch._monitor import gate as gate_module
    from hookwatch._monitor.gate import RequestGate
    from hookwatch._monitor.tally import RequestTally

    clock = _Clock()
    monkeypatch.setattr(gate_module, "time", SimpleNamespace(monotonic=clock))
    tally = RequestTally("m", MetricSet())
    gate = RequestGate("m", 1.0, lambda record: True, tally, max_per_s=3.0)
    scope = gate.request(8)
    assert (scope.requests, scope.picked, scope._batch) == (8, 3, 8)
    assert scope._rows is not None and scope._rows.tolist() == [0, 1, 2]
    empty = gate.request(8)
    assert empty.picked == 0 and empty._rows is None
    clock.now += 1.0 / 3.0 + 1e-9  # one sample's worth
    one = gate.request(8)
    assert one.picked == 1 and one._rows is not None and one._rows.tolist() == [0]
    # Requests of several rows: the first 2 requests' rows, 3 of them, out of a batch of 7.
    clock.now += 2.0 / 3.0 + 1e-9
    rows = gate.request(3, sizes=[1, 2, 4])
    assert rows.picked == 2 and rows._batch == 7
    assert rows._rows is not None and rows._rows.tolist() == [0, 1, 2]
    # A batch the bucket holds is captured whole.
    clock.now += 10.0
    whole = gate.request(3)
    assert whole.picked == 3 and whole._rows is None


# -- the cost cap (max_overhead) --------------------------------------------------------------


def _serve_one_second(
    monitor: Monitor,
    clock: _Clock,
    forwards: int,
    batch: int = 1,
    sampled: int = 10,
    plain_s: float = 0.001,
    sampled_s: float = 0.011,
) -> None:
    """One second of traffic as the service reports it: ``forwards`` forwards of ``batch``
    requests, the first ``sampled`` of them sampled (``sampled_s`` each, the others
    ``plain_s``), then a publish's sampling decision."""
    for i in range(forwards):
        monitor.receive(batch)
        if i < sampled:
            monitor._answered_sampled(sampled_s, batch)
        else:
            monitor.answered(plain_s, batch)
    clock.now += 1.0
    monitor._cap_sampling()


def _capped_monitor(
    monkeypatch: pytest.MonkeyPatch, **raw: Any
) -> tuple[Monitor, _Clock, MonitoringConfig]:
    clock = _fake_clock(monkeypatch)
    net = Net()
    # The cost cap at 1 % (not the default's 0.5 %): the figures below are counted at it.
    config = MonitoringConfig.from_mapping(
        {"layers": [], "flush_interval_s": 60, "max_overhead": 0.01, **raw}
    )
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=MetricSet())
    monitor._cap_sampling()  # the first look: no rate yet
    _warm_up(monitor._cost)
    return monitor, clock, config


@pytest.mark.parametrize(
    ("raw", "batch", "expected"),
    [
        # 200 forwards a second at batch 1, a sampled one 10 ms more: 1 % of the time is one
        # hooked forward a second, a share of 1 / 200.
        ({}, 1, 0.005),
        # Batches of 4: 800 requests a second are still 200 forwards, the same share.
        ({}, 4, 0.005),
        ({"max_overhead": 0.02}, 1, 0.01),
        # Batches of 8: the count cap's share, 20 of 1,600 requests a second, is higher.
        ({}, 8, 0.005),
    ],
)
def test_the_default_sampling_holds_to_its_cost_per_second(
    monkeypatch: pytest.MonkeyPatch, raw: dict[str, Any], batch: int, expected: float
) -> None:
    monitor, clock, config = _capped_monitor(monkeypatch, **raw)
    with monitor:
        for _ in range(3):  # steady traffic: the share holds
            _serve_one_second(monitor, clock, forwards=200, batch=batch)
            assert monitor._gate.sample_rate == pytest.approx(expected)
            assert monitor._cost.batch == pytest.approx(batch)
            assert monitor._cost.extra == pytest.approx(0.010)
        # The gate samples at the capped share from the next forward on (200 forwards a
        # second: the count cap's bucket seldom steps in).
        sampled = 0
        for _ in range(20_000):
            clock.now += 1.0 / 200
            sampled += bool(monitor._received.request(batch).picked)
        sd = math.sqrt(20_000 * expected * (1 - expected))
        assert abs(sampled - 20_000 * expected) < 4 * sd
    assert config.share == 0.1 and expected < config.share


def test_the_cost_cap_follows_the_cost_down_to_the_configured_share_and_the_count_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monitor, clock, config = _capped_monitor(monkeypatch)
    with monitor:
        _serve_one_second(monitor, clock, forwards=200)
        assert monitor._gate.sample_rate == pytest.approx(0.005)
        # The hooks get cheap (10 µs more): the smoothed cost follows within a few publishes,
        # and the share rises back to the configured one, never above it.
        for _ in range(30):
            _serve_one_second(monitor, clock, forwards=200, sampled_s=0.00101)
            assert monitor._gate.sample_rate <= config.share
        assert monitor._gate.sample_rate == config.share
        # A cost that drops to nothing (or below: noise) caps nothing.
        for _ in range(30):
            _serve_one_second(monitor, clock, forwards=200, sampled_s=0.0009)
        assert monitor._cost.extra is not None and monitor._cost.extra < 0
        assert monitor._gate.sample_rate == config.share
        # Busy traffic with cheap hooks: the count cap decides (20 of 2,000 a second).
        for _ in range(3):
            _serve_one_second(monitor, clock, forwards=2000, sampled_s=0.00101)
        assert monitor._gate.sample_rate == pytest.approx(0.01)
        # Costly hooks again: the lower of the two caps applies (1 hooked forward of 2,000).
        for _ in range(30):
            _serve_one_second(monitor, clock, forwards=2000)
        assert monitor._gate.sample_rate == pytest.approx(0.0005, rel=0.06)


def test_the_cost_cap_counts_the_capture_threads_cpu_for_each_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A record that costs the capture thread half what its forward's hooks cost the request
    # thread (a large input projected for drift) lowers the share the cap allows by a third.
    monitor, clock, _ = _capped_monitor(monkeypatch)

    def burn(records: list[Any]) -> None:
        until = time.thread_time() + 0.005 * len(records)
        while time.thread_time() < until:
            pass

    monkeypatch.setattr(monitor._processor, "process", burn)
    with monitor:
        monitor._process([()] * 4)  # the capture thread's call: 5 ms of its CPU a record
        _serve_one_second(monitor, clock, forwards=200)  # hooks: 10 ms more a forward
        assert monitor._cost.capture == pytest.approx(0.005, rel=0.2)
        assert monitor._cost.extra == pytest.approx(0.010)
        # 1 % of a second is 10 ms: two thirds of a hooked forward's 15 ms, of 200 a second.
        assert monitor._gate.sample_rate == pytest.approx(0.01 / 0.015 / 200, rel=0.2)
        # Too few records wait for the next estimate, as sampled forwards do.
        monitor._process([()])
        _serve_one_second(monitor, clock, forwards=200)
        assert monitor._cost._records == 1


def _warm_up(cost: Any) -> None:
    """The first sampled forwards and drain, 50 ms each: what the estimates leave out."""
    from hookwatch._monitor.cost import WARMUP

    for _ in range(WARMUP):
        cost.answered(0.050, 1)
    cost.processed(0.050, 1)


def test_the_first_sampled_forwards_and_drain_are_left_out_of_the_cost() -> None:
    # The first hooked forwards and the first drain pay one-time costs (first kernel launches,
    # allocations, lazy imports): as the first estimate they would cap sampling for minutes.
    from hookwatch._monitor.cost import MIN_SAMPLED, WARMUP, HookCost
    from hookwatch._monitor.tally import RequestTally

    tally = RequestTally("m", MetricSet())
    cost = HookCost(tally)
    tally.answered(0.002, 10)
    for _ in range(WARMUP):
        cost.answered(0.050, 1)
    cost.processed(0.200, 2)
    cost.update()
    assert cost.extra is None and cost.capture is None
    assert cost._records == 0 and tally.durations()[0] == 10 + WARMUP  # still in the histogram
    tally.answered(0.002, 20)
    for _ in range(MIN_SAMPLED):
        cost.answered(0.005, 1)
    cost.processed(0.003, MIN_SAMPLED)
    cost.update()
    # 3 ms more than the plain requests after the warm-up; 1 ms of the capture thread a record.
    assert cost.extra == pytest.approx(0.003) and cost.capture == pytest.approx(0.001)


def test_a_publish_without_requests_keeps_the_share(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hooked forwards that cost 10 ms more, 200 forwards a second: a share of 1 / 200. A quiet
    # second decides nothing: the next burst is sampled at the capped share from its start.
    monitor, clock, config = _capped_monitor(monkeypatch)
    with monitor:
        _serve_one_second(monitor, clock, forwards=200)
        assert monitor._gate.sample_rate == pytest.approx(0.005)
        for _ in range(3):
            clock.now += 1.0
            monitor._cap_sampling()
            assert monitor._gate.sample_rate == pytest.approx(0.005)
        # Traffic that comes back slower is decided on as it comes: 5 forwards a second, where
        # 1 % of the time allows 1 hooked forward a second, take the configured share.
        _serve_one_second(monitor, clock, forwards=5, sampled=0)
        assert monitor._gate.sample_rate == config.share


def test_a_cost_cap_with_hooks_below_the_noise_still_counts_the_records() -> None:
    from hookwatch._monitor.cost import HookCost
    from hookwatch._monitor.tally import RequestTally

    tally = RequestTally("m", MetricSet())
    cost = HookCost(tally)
    _warm_up(cost)
    for _ in range(5):
        tally.answered(0.002, 1)
        cost.answered(0.002, 1)  # sampled forwards as quick as the others
    cost.processed(0.004, 5)  # 0.8 ms of the capture thread a record
    cost.update()
    assert cost.extra == pytest.approx(0.0) and cost.capture == pytest.approx(0.0008)
    # 1 % of the time at 100 forwards a second: 12.5 records a second, an eighth of them.
    assert cost.share(0.01, 100.0) == pytest.approx(0.125)


def test_a_sample_rate_that_is_set_is_taken_whatever_the_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monitor, clock, _ = _capped_monitor(monkeypatch, sample_rate=0.1)
    default, default_clock, _ = _capped_monitor(monkeypatch)
    with monitor, default:
        for _ in range(3):
            _serve_one_second(monitor, clock, forwards=200)
            _serve_one_second(default, default_clock, forwards=200)
        assert monitor._gate.sample_rate == 0.1
        assert default._gate.sample_rate == pytest.approx(0.005)  # the same traffic, capped


def test_too_few_sampled_forwards_wait_for_the_next_publish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hookwatch._monitor.cost import MIN_SAMPLED

    monitor, clock, config = _capped_monitor(monkeypatch)
    with monitor:
        _serve_one_second(monitor, clock, forwards=200, sampled=MIN_SAMPLED - 1)
        assert monitor._cost.extra is None
        assert monitor._gate.sample_rate == config.share
        # One more: the two waiting count with it, against the unsampled requests of both
        # seconds.
        _serve_one_second(monitor, clock, forwards=200, sampled=1)
        assert monitor._cost.extra == pytest.approx(0.010)
        assert monitor._gate.sample_rate == pytest.approx(0.005)


def test_the_cost_is_measured_against_the_histogram_in_worker_files(tmp_path: Any) -> None:
    # Where TorchServe's workers write their counts to files, the request durations go there
    # (lock-free); the reference reads them back, with what came before the file existed.
    from hookwatch import _catalogue as metric
    from hookwatch._metrics import CountSlots
    from hookwatch._monitor.cost import HookCost
    from hookwatch._monitor.tally import RequestTally

    tally = RequestTally("m", MetricSet())
    cost = HookCost(tally)
    _warm_up(cost)  # before the file too, and on neither side of the estimate
    tally.answered(0.002, 3)
    from hookwatch._names import REJECT_REASONS

    counters = (metric.REQUESTS, metric.REQUESTS_SAMPLED, metric.CAPTURES_DROPPED)
    slots = CountSlots(
        str(tmp_path),
        [(spec, {"model": "m"}) for spec in counters]
        + [(metric.REQUESTS_REJECTED, {"model": "m", "reason": r}) for r in REJECT_REASONS],
        [(metric.REQUEST_DURATION, {"model": "m"})],
    )
    tally._attach(slots)
    tally._cells = slots.values  # the request path's lock-free writes, as under a GIL
    for _ in range(4):
        tally.answered(0.001, 2)
    assert tally.durations() == (21, pytest.approx(0.514))
    for _ in range(3):
        cost.answered(0.004, 2)
    cost.update()
    assert tally.durations() == (27, pytest.approx(0.538))
    # 11 unsampled requests, 14 ms; 6 sampled ones, 4 ms each.
    assert cost.extra == pytest.approx(0.004 - 0.014 / 11)
    assert cost.batch == 2


def test_max_overhead_is_a_share_of_the_time_above_zero() -> None:
    from hookwatch._errors import ConfigError

    assert MonitoringConfig.from_mapping({}).max_overhead == 0.005
    assert MonitoringConfig.from_mapping({"max_overhead": 1}).max_overhead == 1.0
    with pytest.raises(ConfigError, match=r"max_overhead: expected a number in \(0, 1\]"):
        MonitoringConfig.from_mapping({"max_overhead": 0})
    for bad in (-0.1, 1.5, "0.01", True):
        with pytest.raises(ConfigError, match="max_overhead: expected a number in"):
            MonitoringConfig.from_mapping({"max_overhead": bad})


class _SlowWhenHooked(nn.Module):
    """A module whose forward takes ``delay_s`` more while the gate is open (a sampled
    forward): hooks that cost what a GPU model's kernel launches do."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.flag: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag is not None and self.flag.open:
            time.sleep(self.delay_s)
        return x


class _SlowNet(Net):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.slow = _SlowWhenHooked(delay_s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.slow(x))


def test_served_forwards_that_cost_more_when_sampled_are_sampled_less(metrics: MetricSet) -> None:
    from hookwatch._config import HandlerConfig
    from hookwatch._service import ModelService

    delay = 0.005
    net = _SlowNet(delay).eval()
    config = MonitoringConfig.from_mapping(
        # No count cap in the way (it would cap this fast model too): the cost cap alone.
        {"layers": ["act"], "flush_interval_s": 60, "max_sampled_per_s": 1_000_000, "seed": 5}
    )
    monitor = Monitor(net, plan_watch(net, config, "slow"), metrics=metrics)
    net.slow.flag = monitor._gate.hook_flag
    spec = HandlerConfig.from_mapping({"input": {"shape": [4]}}).input
    service = ModelService(net, spec, monitor, output=config.output)
    body = {"data": [0.1, 0.2, 0.3, 0.4]}
    rates = []
    with monitor:
        monitor.flush()  # the first look
        for _ in range(6):
            until = time.perf_counter() + 0.3
            while time.perf_counter() < until:
                service.handle([body])
            monitor.flush()
            rates.append(monitor._gate.sample_rate)
        # Measured: a sampled forward took the delay more than an unsampled one.
        assert monitor._cost.extra is not None
        assert delay * 0.8 < monitor._cost.extra < delay * 10
        assert monitor._cost.batch == 1
    # At the default 10 %, a sampled forward 5 ms more costs 0.5 ms a forward: a third of the
    # time or more on this model. Capped to 0.5 %, the share falls to a fraction of that.
    assert rates[0] < config.share / 5, rates
    assert max(rates[1:]) < config.share / 5, rates


# -- the service's request path (RequestPath) --------------------------------------------------


def _count_slots(tmp_path: Any) -> Any:
    from hookwatch import _catalogue as metric
    from hookwatch._metrics import CountSlots
    from hookwatch._names import REJECT_REASONS

    counters = (metric.REQUESTS, metric.REQUESTS_SAMPLED, metric.CAPTURES_DROPPED)
    tmp_path.mkdir(parents=True, exist_ok=True)
    return CountSlots(
        str(tmp_path),
        [(spec, {"model": "m"}) for spec in counters]
        + [(metric.REQUESTS_REJECTED, {"model": "m", "reason": r}) for r in REJECT_REASONS],
        [(metric.REQUEST_DURATION, {"model": "m"})],
    )


@pytest.mark.parametrize("attached", [False, True])
@pytest.mark.parametrize("rate", [0.0, 0.3, 1.0])
def test_the_request_path_counts_and_samples_as_the_tally_and_the_gate_do(
    tmp_path: Any, attached: bool, rate: float
) -> None:
    # RequestPath.arrived inlines RequestTally.received and RequestGate.request's fast path:
    # the same arrivals through it and through the two (same seed) give the same counts and
    # the same sampled forwards, with a rate set midway and batches of every size.
    from hookwatch._monitor.gate import RequestGate
    from hookwatch._monitor.path import RequestPath
    from hookwatch._monitor.tally import RequestTally

    def built(where: str) -> tuple[RequestTally, RequestGate]:
        tally = RequestTally("m", MetricSet())
        gate = RequestGate("m", rate, lambda record: True, tally, seed=5)
        if attached:
            slots = _count_slots(tmp_path / where)
            tally._attach(slots)
            tally._cells = slots.values
        return tally, gate

    (tally_a, gate_a), (tally_b, gate_b) = built("a"), built("b")
    path = RequestPath(tally_a, gate_a, None, tally_a.answered)  # type: ignore[arg-type]
    sizes = [1, 8, 3, 1, 1, 5, 2] * 300
    via_path, via_two = [], []
    for i, size in enumerate(sizes):
        if i == len(sizes) // 2:
            gate_a.sample_rate = gate_b.sample_rate = 0.5
        due = path.arrived(size)
        picked = path.decide(size, None).picked if due else 0
        if picked:
            path.sampled(picked)  # the service's, once the forward ran
        via_path.append(picked)
        tally_b.received(size)
        via_two.append(gate_b.request(size, None, True).picked)
    assert via_path == via_two
    assert tally_a.counts() == tally_b.counts()
    assert tally_a.counts().requests == sum(sizes)
    assert 0 < sum(via_path) < sum(sizes)  # the second half samples at 0.5 whatever came first


def test_durations_wait_for_the_capture_thread_and_fold_into_the_histogram(
    tmp_path: Any,
) -> None:
    # The request path appends its batches' durations; folding them (at each publish) gives
    # the count file what RequestTally.answered gives it, bucket by bucket and in the sum,
    # a duration on a bucket's bound in that bucket (Prometheus's `le`).
    from hookwatch._monitor.tally import RequestTally

    def attached(where: str) -> RequestTally:
        tally = RequestTally("m", MetricSet())
        slots = _count_slots(tmp_path / where)
        tally._attach(slots)
        tally._cells = slots.values
        return tally

    folded, direct = attached("a"), attached("b")
    assert folded._duration is not None
    bounds = folded._duration.bounds
    rng = np.random.default_rng(0)
    batches = [
        (float(s), int(c))
        for s, c in zip(rng.exponential(0.02, 500), rng.integers(1, 9, 500), strict=True)
    ]
    batches += [(bounds[3], 2), (bounds[0], 1), (1e6, 4)]  # on two bounds, above the last
    for seconds, count in batches:
        folded.pending.append((seconds, count))
        direct.answered(seconds, count)
    # Nothing binned before the fold: the count file holds none of them yet.
    assert folded._duration is not None
    assert sum(folded._duration.values[i] for i in folded._duration.buckets) == 0
    folded.publish()
    assert not folded.pending
    hist_a, hist_b = folded._duration, direct._duration
    assert hist_b is not None
    assert [hist_a.values[i] for i in hist_a.buckets] == [hist_b.values[i] for i in hist_b.buckets]
    assert hist_a.values[hist_a.sum_index] == pytest.approx(hist_b.values[hist_b.sum_index])
    assert folded.durations() == (sum(c for _, c in batches), pytest.approx(direct.durations()[1]))
    # In one registry (no count file) the same fold goes through the histogram's observe.
    plain = RequestTally("m", MetricSet())
    plain.pending.extend(batches[:5])
    assert plain.durations() == (
        sum(c for _, c in batches[:5]),
        pytest.approx(sum(s * c for s, c in batches[:5])),
    )
    assert not plain.pending
