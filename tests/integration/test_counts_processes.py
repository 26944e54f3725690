"""Request counts that survive SIGKILL: written by the request path into the worker's own
count file as they happen, merged and compacted by the exporter like any counter file (moved
from tests/unit/test_counts.py: each test runs a worker in a process that kills itself)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hookwatch._metrics import compact_dead_workers, exporter_registry

pytestmark = pytest.mark.integration

#: A worker in miniature: a monitored model in a process that writes worker files, serving
#: requests and rejects, with publishing an hour away; then it kills itself with SIGKILL, so
#: nothing runs after the last request (no flush, no atexit).
WORKER = textwrap.dedent(
    """
    import os, signal, torch
    from torch import nn
    from hookwatch._config import MonitoringConfig
    from hookwatch._hooks import plan_watch
    from hookwatch._metrics import MetricSet
    from hookwatch._monitor import Monitor

    torch.set_num_threads(1)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    config = MonitoringConfig.from_mapping(
        {"layers": ["1"], "sample_rate": 0.5, "flush_interval_s": 60, "queue_size": 1, "seed": 1}
    )
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=MetricSet())
    for i in range(REQUESTS):
        with torch.inference_mode(), monitor.request(BATCH):
            net(torch.randn(BATCH, 4))
    monitor.reject(3, "wrong_shape")
    monitor.reject(2, "not_json")
    monitor.answered(0.004, 7)
    monitor.answered(0.3, 1)
    counts = monitor._counts()
    print(counts.requests, counts.sampled, counts.dropped, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _run_worker(directory: Path, requests: int, batch: int) -> tuple[int, int, int]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    source = WORKER.replace("REQUESTS", str(requests)).replace("BATCH", str(batch))
    done = subprocess.run(
        [sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    requests_seen, sampled, dropped = map(int, done.stdout.split())
    return requests_seen, sampled, dropped


def _totals(
    directory: Path, compact: bool = True
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = exporter_registry(str(directory), compact=compact)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def test_counts_of_a_worker_killed_before_any_publish_are_all_there(tmp_path: Path) -> None:
    requests, sampled, dropped = _run_worker(tmp_path, requests=200, batch=2)
    assert requests == 405 and 0 < sampled < 400
    totals = _totals(tmp_path)
    assert totals[("hookwatch_requests_total", (("model", "m"),))] == requests
    assert totals[("hookwatch_requests_sampled_total", (("model", "m"),))] == sampled
    assert totals[("hookwatch_captures_dropped_total", (("model", "m"),))] == dropped
    rejected = {
        dict(labels)["reason"]: value
        for (name, labels), value in totals.items()
        if name == "hookwatch_requests_rejected_total" and value
    }
    assert rejected == {"wrong_shape": 3, "not_json": 2}
    # The request-duration histogram, from the same kind of file: cumulative buckets.
    model = (("model", "m"),)
    assert totals[("hookwatch_request_duration_seconds_count", model)] == 8
    assert totals[("hookwatch_request_duration_seconds_sum", model)] == pytest.approx(0.328)
    bucket = "hookwatch_request_duration_seconds_bucket"
    assert totals[(bucket, (("le", "0.0025"), ("model", "m")))] == 0
    assert totals[(bucket, (("le", "0.005"), ("model", "m")))] == 7
    assert totals[(bucket, (("le", "0.25"), ("model", "m")))] == 7
    assert totals[(bucket, (("le", "0.5"), ("model", "m")))] == 8
    assert totals[(bucket, (("le", "+Inf"), ("model", "m")))] == 8
    assert ("hookwatch_workers", model) not in totals  # its process is gone: a live gauge


def test_a_dead_workers_counts_are_folded_into_the_archive_exactly(tmp_path: Path) -> None:
    first = _run_worker(tmp_path, requests=50, batch=1)
    second = _run_worker(tmp_path, requests=70, batch=3)
    before = _totals(tmp_path, compact=False)
    assert sum(p.name.startswith("counter_slots-") for p in tmp_path.iterdir()) == 2
    assert compact_dead_workers(str(tmp_path)) >= 2
    assert not any(p.name.startswith("counter_slots-") for p in tmp_path.iterdir())
    after = _totals(tmp_path)
    assert after == before
    assert after[("hookwatch_requests_total", (("model", "m"),))] == first[0] + second[0]


#: A monitor in a process of its own whose threads switch as often as the interpreter can.
MONITOR_IN_A_PROCESS = textwrap.dedent(
    """
    import os, signal, sys, threading, torch
    from torch import nn
    from hookwatch._config import MonitoringConfig
    from hookwatch._hooks import plan_watch
    from hookwatch._metrics import MetricSet
    from hookwatch._monitor import Monitor

    sys.setswitchinterval(1e-6)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    config = MonitoringConfig.from_mapping(
        {"layers": ["1"], "sample_rate": 0.0, "flush_interval_s": 60}
    )
    monitor = Monitor(net, plan_watch(net, config, "m"), metrics=MetricSet())
    """
)

#: Several request threads counting at once, through the lock-free request path (the count
#: file written in place).
THREADS = MONITOR_IN_A_PROCESS + textwrap.dedent(
    """
    assert monitor._tally._cells is not None  # the lock-free path is the one under test
    start = threading.Barrier(THREADS)

    def serve():
        start.wait()
        for _ in range(EACH):
            received = monitor.receive(1)
            with received.request(1):
                pass
            monitor.answered(0.001)

    threads = [threading.Thread(target=serve) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _threads_killed(
    directory: Path, script: str, threads: int, each: int
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Run a threaded ``script`` (``THREADS`` threads, ``EACH`` requests each) in a process of
    its own that ends with SIGKILL; the totals its metric files hold."""
    source = script.replace("THREADS", str(threads)).replace("EACH", str(each))
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(
        [sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    # A thread that raised stopped counting: say why, not only that counts are missing.
    assert "Traceback" not in done.stderr, done.stderr
    return _totals(directory)


def test_request_threads_counting_at_once_lose_no_count(tmp_path: Path) -> None:
    threads, each = 8, 20_000
    totals = _threads_killed(tmp_path, THREADS, threads, each)
    model = (("model", "m"),)
    assert totals[("hookwatch_requests_total", model)] == threads * each
    assert totals[("hookwatch_request_duration_seconds_count", model)] == threads * each


#: The service's request path (RequestPath) from several threads at once: arrivals counted in
#: one frame, durations appended for the capture thread and binned by a folding thread while
#: other threads add sampled forwards' durations to the same cells (the same bucket, so their
#: additions and the fold's meet in one cell).
PATH_THREADS = MONITOR_IN_A_PROCESS + textwrap.dedent(
    """
    tally = monitor._tally
    assert tally._cells is not None
    path = monitor._request_path()
    start = threading.Barrier(THREADS + 1)
    done = threading.Event()

    def serve(sampled):
        start.wait()
        for _ in range(EACH):
            if path.arrived(1):  # the first: the rate's countdown is drawn (never due at 0)
                assert not path.decide(1, None).picked
            if sampled:
                tally.answered(0.001, 1)  # a sampled forward's, lock-free into the same cells
            else:
                path.durations.append((0.001, 1))

    def fold():
        start.wait()
        while not done.is_set():
            tally.fold()

    threads = [threading.Thread(target=serve, args=(i % 2 == 0,)) for i in range(THREADS)]
    folder = threading.Thread(target=fold)
    for thread in [*threads, folder]:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    folder.join()
    tally.fold()
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_the_request_path_from_threads_at_once_loses_no_count_or_duration(
    tmp_path: Path,
) -> None:
    threads, each = 8, 10_000
    totals = _threads_killed(tmp_path, PATH_THREADS, threads, each)
    model = (("model", "m"),)
    assert totals[("hookwatch_requests_total", model)] == threads * each
    assert totals[("hookwatch_request_duration_seconds_count", model)] == threads * each
    bucket = "hookwatch_request_duration_seconds_bucket"
    assert totals[(bucket, (("le", "0.001"), ("model", "m")))] == threads * each
    assert totals[("hookwatch_request_duration_seconds_sum", model)] == pytest.approx(
        threads * each * 0.001
    )
