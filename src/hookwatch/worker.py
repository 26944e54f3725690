"""The capture path: a bounded queue drained by one background thread.

The request thread only calls :meth:`CaptureWorker.offer`, which never blocks: when the queue is
full the capture is dropped and counted. Everything else (host copies, numpy, Prometheus writes)
happens on the worker thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("hookwatch")


class RateLimitedLog:
    """Logs each key at most once per ``interval_s`` and says how many were held back."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self._logger = logger
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, message: str, *args: object, exc_info: bool = False) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            held = self._held.pop(key, 0)
            self._last[key] = now
        suffix = f" ({held} similar messages held back)" if held else ""
        self._logger.warning(message + suffix, *args, exc_info=exc_info)
        return True


class CaptureWorker(Generic[T]):
    """Drains a bounded queue on a daemon thread and calls ``process`` with batches of items.

    ``tick`` runs at least every ``interval_s`` on the same thread; it is where counters kept as
    plain integers on the request path get published. ``min_gap_s`` rests the thread after each
    drain, so under load it wakes a few times a second rather than once per item.
    """

    def __init__(
        self,
        capacity: int,
        process: Callable[[list[T]], None],
        tick: Callable[[], None],
        interval_s: float = 1.0,
        name: str = "hookwatch-capture",
        max_batch: int = 512,
        min_gap_s: float = 0.0,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"expected capacity >= 1, got {capacity}")
        self.capacity = capacity
        self._queue: queue.Queue[T] = queue.Queue(maxsize=capacity)
        self._process = process
        self._tick = tick
        self._interval = interval_s
        self._max_batch = max_batch
        self._min_gap = min_gap_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._log = RateLimitedLog(log)
        #: Written only by the request thread; read by the worker thread at each tick.
        self.dropped = 0
        self.accepted = 0
        #: Written only by the worker thread.
        self.faults = 0
        self.processed = 0

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def offer(self, item: T) -> bool:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            return False
        self.accepted += 1
        return True

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def _drain(self, first: T) -> list[T]:
        batch = [first]
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _safe(self, fn: Callable[[], None], what: str) -> None:
        try:
            fn()
        except Exception:
            self.faults += 1
            self._log.warning(
                what, "hookwatch: %s failed; monitoring carries on", what, exc_info=True
            )

    def _run(self) -> None:
        next_tick = time.monotonic() + self._interval
        while not self._stop.is_set():
            timeout = max(0.0, next_tick - time.monotonic())
            try:
                first = self._queue.get(timeout=timeout)
            except queue.Empty:
                pass
            else:
                batch = self._drain(first)
                self._safe(partial(self._process, batch), "processing captures")
                self.processed += len(batch)
                backlog = len(batch) >= self._max_batch
                del batch, first  # hold nothing between iterations
                if self._min_gap > 0 and not backlog:
                    # Waking per item would hand the GIL back and forth with the request thread
                    # on every request; resting between drains batches the work instead.
                    self._stop.wait(self._min_gap)
            if time.monotonic() >= next_tick:
                self._safe(self._tick, "publishing metrics")
                next_tick = time.monotonic() + self._interval
        self._flush_remaining()

    def _flush_remaining(self) -> None:
        while True:
            try:
                first = self._queue.get_nowait()
            except queue.Empty:
                break
            batch = self._drain(first)
            self._safe(partial(self._process, batch), "processing captures")
            self.processed += len(batch)
        self._safe(self._tick, "publishing metrics")

    def stop(self, timeout: float = 5.0) -> None:
        """Process what is queued, publish once more and join the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until everything accepted so far is processed (tests and shutdown only)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processed >= self.accepted:
                return True
            time.sleep(0.005)
        return False
