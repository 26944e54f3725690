"""The capture thread paces its drains while requests are served (Monitor.pace)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from hookwatch._config import MonitoringConfig
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import monitor as monitor_module
from hookwatch._monitor.monitor import ACTIVE_S, STEP_GAP_S, Monitor
from hookwatch._monitor.processor import YIELD_S


def _monitor(metrics: MetricSet, queue_size: int = 64, sample_rate: float = 1.0) -> Monitor:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    config = MonitoringConfig.from_mapping(
        {"layers": ["1"], "sample_rate": sample_rate, "queue_size": queue_size}
    )
    return Monitor(model, plan_watch(model, config, "m"), metrics=metrics)


def _serve_one(monitor: Monitor) -> None:
    """A request whose forward calls no watched layer: it marks the server active, and hands
    nothing to the capture buffer."""
    with torch.inference_mode(), monitor.request(1):
        pass


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """What the monitor's pauses sleep, recorded instead of slept."""
    taken: list[float] = []
    monkeypatch.setattr(monitor_module.time, "sleep", taken.append)
    monkeypatch.setattr(monitor_module, "yield_gil", lambda: taken.append(YIELD_S))
    return taken


@pytest.mark.parametrize("sample_rate", [1.0, 0.0], ids=["sampled", "unsampled"])
def test_every_forward_marks_the_server_active(sleeps: list[float], sample_rate: float) -> None:
    # Unsampled forwards too: the pacing is about the requests, not the captures.
    with _monitor(MetricSet(), sample_rate=sample_rate) as monitor:
        monitor._pace()  # no forward yet: an idle server
        _serve_one(monitor)
        monitor._pace()
    assert sleeps[:2] == [YIELD_S, STEP_GAP_S]


def test_an_idle_server_is_not_paced(sleeps: list[float]) -> None:
    with _monitor(MetricSet()) as monitor:
        _serve_one(monitor)
        # time.sleep records instead of sleeping here: an Event's wait sleeps for real.
        threading.Event().wait(2 * ACTIVE_S)
        monitor._pace()
    assert sleeps[0] == YIELD_S


def test_a_buffer_more_than_half_full_is_not_paced(sleeps: list[float]) -> None:
    with _monitor(MetricSet(), queue_size=4) as monitor:
        monitor._worker.stop()  # nothing drains the buffer meanwhile
        for _ in range(3):
            monitor._worker.offer({})
        _serve_one(monitor)
        monitor._pace()
    assert sleeps[0] == YIELD_S


def test_a_paced_drain_still_processes_everything(metrics: MetricSet) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    config = MonitoringConfig.from_mapping({"layers": ["1"], "sample_rate": 1.0})
    with Monitor(model, plan_watch(model, config, "m"), metrics=metrics) as monitor:
        for _ in range(50):
            with torch.inference_mode(), monitor.request(1):
                model(torch.randn(1, 4))
        assert monitor.flush(10.0)
        assert monitor._worker.processed == monitor._worker.accepted == 50
