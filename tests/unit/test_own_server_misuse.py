"""A monitor in a user's own server, used as async and pre-fork servers tempt one to: what was
silent (captures lost or mixed, a forked worker capturing nothing) is said in the log (an
outside run under FastAPI, uvicorn and gunicorn --preload, 2026-12-07)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import hookwatch
from hookwatch._metrics import MetricSet


@pytest.fixture
def monitor() -> Iterator[hookwatch.Monitor]:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    with hookwatch.watch(
        model, {"layers": ["1"], "sample_rate": 1.0}, name="own", metrics=MetricSet()
    ) as watching:
        watching.model = model  # type: ignore[attr-defined]
        yield watching


def _said(caplog: pytest.LogCaptureFixture, words: str) -> bool:
    return any(words in record.getMessage() for record in caplog.records)


def test_scopes_interleaved_on_one_thread_are_said(
    monitor: hookwatch.Monitor, caplog: pytest.LogCaptureFixture
) -> None:
    # Two requests' scopes open at once on an event loop's thread (an await inside).
    model = monitor.model  # type: ignore[attr-defined]
    with (
        caplog.at_level(logging.WARNING, "hookwatch"),
        monitor.request(1),
        monitor.request(1),
        torch.inference_mode(),
    ):
        model(torch.zeros(1, 4))
    assert _said(caplog, "opened while another was open on the same thread"), caplog.text


def test_a_forward_run_in_another_thread_is_said(
    monitor: hookwatch.Monitor, caplog: pytest.LogCaptureFixture
) -> None:
    # `await asyncio.to_thread(model, x)` inside the scope: the hooks saw nothing open.
    model = monitor.model  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, "hookwatch"), monitor.request(1):
        worker = threading.Thread(target=model, args=(torch.zeros(1, 4),))
        worker.start()
        worker.join()
    assert _said(caplog, "captured nothing in its scope"), caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "hookwatch"), monitor.request(1):
        model(torch.zeros(1, 4))  # as documented: no warning
    assert not caplog.records, caplog.text


def test_a_monitor_made_before_a_fork_says_so(
    monitor: hookwatch.Monitor, caplog: pytest.LogCaptureFixture
) -> None:
    monitor._pid = -1  # type: ignore[attr-defined]  # as in a child of gunicorn --preload
    with caplog.at_level(logging.WARNING, "hookwatch"), monitor.request(1):
        pass
    assert _said(caplog, "a fork, where its capture thread does not run"), caplog.text


def test_a_metrics_port_in_use_says_what_to_run_instead() -> None:
    # Every worker of `uvicorn --workers 3` calling serve_metrics(9101): a bare "Address
    # already in use" killed all but one, respawned to die again.
    in_use = r"in use \(another worker of this server\?.*exporter"
    with (
        hookwatch.serve_metrics(0, metrics=MetricSet()) as first,
        pytest.raises(OSError, match=in_use),
    ):
        hookwatch.serve_metrics(first.port, metrics=MetricSet())
