from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from hookwatch._capture import CaptureWorker


def test_processes_everything_offered() -> None:
    seen: list[int] = []
    worker: CaptureWorker[int] = CaptureWorker(100, seen.extend, lambda: None, interval_s=0.05)
    worker.start()
    for i in range(50):
        assert worker.offer(i)
    assert worker.wait_idle(5)
    worker.stop()
    assert seen == list(range(50))
    assert worker.dropped == 0


def test_full_queue_drops_and_counts_without_blocking() -> None:
    release = threading.Event()
    worker: CaptureWorker[int] = CaptureWorker(
        2, lambda batch: release.wait(5), lambda: None, interval_s=0.05, max_batch=1
    )
    worker.start()
    results = [worker.offer(i) for i in range(10)]  # the worker holds one item, two fit
    assert results.count(False) == worker.dropped >= 7
    release.set()
    worker.stop()
    assert worker.processed + worker.dropped == 10


def test_a_failing_batch_is_counted_and_the_worker_carries_on() -> None:
    seen: list[int] = []

    def process(batch: list[int]) -> None:
        if 3 in batch:
            raise ValueError("boom")
        seen.extend(batch)

    worker: CaptureWorker[int] = CaptureWorker(10, process, lambda: None, interval_s=0.05)
    worker.start()
    worker.offer(3)
    assert worker.wait_idle(5)
    worker.offer(4)
    assert worker.wait_idle(5)
    worker.stop()
    assert worker.faults == 1
    assert seen == [4]


def test_tick_runs_periodically() -> None:
    ticks: list[float] = []
    worker: CaptureWorker[int] = CaptureWorker(
        4, lambda b: None, lambda: ticks.append(time.monotonic()), interval_s=0.05
    )
    worker.start()
    deadline = time.monotonic() + 5
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    assert len(ticks) >= 3


def test_stop_processes_the_queue_and_publishes_once_more() -> None:
    seen: list[int] = []
    ticks: list[int] = []
    worker: CaptureWorker[int] = CaptureWorker(
        10, seen.extend, lambda: ticks.append(len(seen)), interval_s=60
    )
    worker.start()
    for i in range(5):
        worker.offer(i)
    worker.stop()
    assert seen == list(range(5))
    assert ticks == [5]  # no periodic tick within 60 s; exactly the final one, after the items
    assert not worker.running


def test_offer_never_waits_for_a_busy_worker_and_the_bound_holds() -> None:
    # The worker is stuck in process(): offers still return at once, and at most `capacity`
    # items wait; the rest are dropped and counted.
    busy = threading.Event()
    release = threading.Event()

    def process(batch: list[int]) -> None:
        busy.set()
        release.wait(5)

    worker: CaptureWorker[int] = CaptureWorker(3, process, lambda: None, poll_s=0.01)
    worker.start()
    worker.offer(0)
    assert busy.wait(5)
    results = [worker.offer(i) for i in range(1, 11)]
    assert results == [True] * 3 + [False] * 7
    assert worker.depth == 3 and worker.dropped == 7
    release.set()
    assert worker.wait_idle(5)
    worker.stop()
    assert worker.processed == 4


def test_poll_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="expected poll_s > 0, got 0"):
        CaptureWorker(3, lambda b: None, lambda: None, poll_s=0)


def test_stop_without_processing_ends_after_the_batch_in_hand() -> None:
    started = threading.Event()
    release = threading.Event()
    seen: list[int] = []

    def process(batch: list[int]) -> None:
        started.set()
        release.wait(5)
        seen.extend(batch)

    ticks: list[int] = []
    worker: CaptureWorker[int] = CaptureWorker(
        1000, process, lambda: ticks.append(1), interval_s=10, max_batch=1, poll_s=0.01
    )
    worker.start()
    for i in range(100):
        worker.offer(i)
    assert started.wait(5)
    stopper = threading.Thread(target=worker.stop, kwargs={"process_remaining": False})
    stopper.start()
    release.set()
    stopper.join(5)
    # The backlog flag did not keep the thread draining: one batch, then the final publish.
    assert not worker.running
    assert seen == [0]
    assert ticks == [1]


def test_waits_for_min_batch_between_ticks() -> None:
    batches: list[list[int]] = []
    worker: CaptureWorker[int] = CaptureWorker(
        100, batches.append, lambda: None, interval_s=60, poll_s=0.005, min_batch=8
    )
    worker.start()
    for i in range(7):
        worker.offer(i)
    time.sleep(0.1)  # twenty polls: a worker that drained every poll would have taken them
    assert batches == [] and worker.depth == 7
    worker.offer(7)
    deadline = time.monotonic() + 5
    while worker.processed < 8 and time.monotonic() < deadline:
        time.sleep(0.005)
    worker.stop()
    assert batches == [list(range(8))]


def _ticking(
    may_wait: Callable[[], bool] | None = None, max_wait_s: float = 0.0
) -> tuple[CaptureWorker[int], list[list[int]]]:
    """A worker with ticks every 20 ms and drains of 50 that records what each tick publishes
    (everything processed so far)."""
    published: list[list[int]] = []
    seen: list[int] = []
    worker: CaptureWorker[int] = CaptureWorker(
        100,
        seen.extend,
        lambda: published.append(list(seen)),
        interval_s=0.02,
        poll_s=0.005,
        min_batch=50,
        may_wait=may_wait,
        max_wait_s=max_wait_s,
    )
    return worker, published


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_due_tick_publishes_what_waits_below_min_batch() -> None:
    worker, published = _ticking()
    for i in range(3):
        worker.offer(i)
    worker.start()
    _until(lambda: bool(published))
    worker.stop(process_remaining=False)
    assert published[0] == [0, 1, 2]


def test_ticks_leave_a_few_items_waiting_while_more_come() -> None:
    traffic = [True]
    worker, published = _ticking(lambda: traffic[0], 60.0)
    for i in range(3):
        worker.offer(i)
    worker.start()
    _until(lambda: len(published) >= 5)
    # Five ticks published, none drained: requests kept coming (may_wait) and 3 < 50.
    assert published[-1] == [] and worker.depth == 3
    traffic[0] = False  # the traffic stopped: the next tick drains and publishes them
    _until(lambda: published[-1] == [0, 1, 2])
    worker.stop(process_remaining=False)
    assert published[-1] == [0, 1, 2] and worker.depth == 0


def test_items_wait_at_most_max_wait_s() -> None:
    worker, published = _ticking(lambda: True, 0.15)
    worker.offer(7)
    started = time.monotonic()
    worker.start()
    _until(lambda: bool(published) and published[-1] == [7])
    waited = time.monotonic() - started
    worker.stop(process_remaining=False)
    assert published[-1] == [7]
    # Drained at the first tick after 0.15 s of waiting, never at the first ones.
    assert 0.15 <= waited < 2.0
    assert [] in published


def test_a_failing_may_wait_drains_and_is_counted() -> None:
    def broken() -> bool:
        raise RuntimeError("no")

    worker, published = _ticking(broken, 60.0)
    worker.offer(1)
    worker.start()
    _until(lambda: bool(published) and published[-1] == [1])
    worker.stop(process_remaining=False)
    assert published[-1] == [1] and worker.faults >= 1


def test_wait_idle_drains_what_may_wait() -> None:
    worker, published = _ticking(lambda: True, 60.0)
    worker.start()
    worker.offer(4)
    assert worker.wait_idle(5)
    worker.stop()
    assert published[-1] == [4]


def test_wait_idle_drains_a_short_buffer_at_once() -> None:
    seen: list[int] = []
    worker: CaptureWorker[int] = CaptureWorker(
        100, seen.extend, lambda: None, interval_s=60, poll_s=0.005, min_batch=50
    )
    worker.start()
    worker.offer(1)
    assert worker.wait_idle(5)
    worker.stop()
    assert seen == [1]


def test_min_batch_is_bounded() -> None:
    with pytest.raises(ValueError, match=r"expected 1 <= min_batch <= max_batch \(4\), got 5"):
        CaptureWorker(100, lambda b: None, lambda: None, max_batch=4, min_batch=5)
    # Never more than half the buffer, or the buffer would fill and drop while the thread waits.
    small: CaptureWorker[int] = CaptureWorker(6, lambda b: None, lambda: None, min_batch=64)
    assert small._min_batch == 3


def test_on_start_runs_on_the_thread_and_a_failure_there_stops_nothing() -> None:
    started: list[int] = []
    seen: list[int] = []

    def on_start() -> None:
        started.append(threading.get_ident())
        raise RuntimeError("no setup")

    worker: CaptureWorker[int] = CaptureWorker(
        10, seen.extend, lambda: None, interval_s=0.05, on_start=on_start
    )
    worker.start()
    worker.offer(1)
    assert worker.wait_idle(5)
    worker.stop()
    assert started == [worker._thread.ident]
    assert worker.faults == 1
    assert seen == [1]
