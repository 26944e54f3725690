"""The capture path: a bounded buffer drained by one background thread.

The request thread only calls :meth:`CaptureWorker.offer`, which never blocks: when the buffer is
full the item is dropped and counted. Everything else (host copies, numpy, Prometheus writes)
happens on the worker thread.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar

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


#: Workers whose thread is running, stopped at interpreter exit (weakly held: a worker that is
#: garbage collected needs no stopping).
_RUNNING: weakref.WeakSet[CaptureWorker[Any]] = weakref.WeakSet()
#: How long interpreter exit waits for each capture thread to finish its current batch.
EXIT_TIMEOUT_S = 2.0
#: A capture loop that fails more than this many times within ``RESTART_WINDOW_S`` is not
#: restarted into processing again: capture goes off (``on_off``) and the thread only publishes.
#: A failure a day is a bug to fix, not a reason to stop watching; a failure per batch is.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0
#: Items processed per drain at most. Processing costs a fixed part per drain (a numpy call
#: per statistic, layer and detector) plus a part per item, so larger drains cost less per
#: item; what bounds them is the GIL: the processor lets it go between its steps (a layer's
#: statistics, its drift windows, each detector), and a step's length grows with the drain.
#: At 256 the demo CNN's longest step stays about 4 ms under a saturating load (docs/
#: architecture.md, `make bench-drain`), where 512 with no pauses held it for tens of ms.
MAX_DRAIN = 256
#: Between two drains of a backlog the thread waits this long with the GIL released, so a
#: request thread waiting for it runs before the next drain instead of after it.
BACKLOG_PAUSE_S = 0.0005


@atexit.register
def _stop_at_exit() -> None:
    # A daemon thread still inside a torch operation when the interpreter finalises aborts the
    # whole process ("terminate called without an active exception", exit status 134). A
    # script that never calls close() must still exit cleanly, so the threads stop first.
    for worker in list(_RUNNING):
        worker.stop(EXIT_TIMEOUT_S, process_remaining=False)


class CaptureWorker(Generic[T]):
    """A bounded buffer drained in batches by one daemon thread that calls ``process``.

    ``offer`` is the request path: a length check and an append, no lock and no wake-up (a
    ``queue.Queue`` put takes a mutex and signals a condition, which costs the request thread
    more than everything else it does for a capture). The thread polls every ``poll_s`` instead
    and drains once ``min_batch`` items wait, or when ``tick`` is due, so that what a tick
    publishes includes everything offered before it; it drains at once again while a drain
    fills ``max_batch``, after a short pause (``backlog_pause_s``) that leaves the GIL to the
    request threads. ``tick`` runs at least every ``interval_s`` on the same thread; it is
    where accumulated results get published. Waiting for ``min_batch`` matters when items
    arrive slowly: processing has a fixed cost per batch (a numpy call per statistic and
    layer) that a batch of one pays in full.

    One thread offering (TorchServe runs one batch at a time per worker) keeps the bound exact;
    several offering threads can overshoot ``capacity`` by at most one item each.

    The thread supervises its own loop: anything that escapes it (``process`` and ``tick``
    failures are already caught one by one; this is a bug in the loop itself, or a
    ``BaseException`` such as ``SystemExit`` from processing code) is counted in
    :attr:`faults`, logged (rate-limited) and the loop restarts. The batch in hand is lost
    (:attr:`lost`). After more than ``MAX_RESTARTS`` failures in ``RESTART_WINDOW_S``, capture
    goes off for good: ``on_off`` is called (the monitor closes its gate and switches its
    hooks off), queued and later items are discarded, and the thread keeps publishing.

    ``may_wait`` lets a tick leave fewer than ``min_batch`` items for a later one, for at most
    ``max_wait_s`` (see :meth:`_wait_longer`); without it every tick drains what waits.

    ``on_start`` runs first on the new thread (per-thread settings of the libraries that
    ``process`` calls); a failure there is counted in :attr:`faults` and the loop starts anyway.
    """

    def __init__(
        self,
        capacity: int,
        process: Callable[[list[T]], None],
        tick: Callable[[], None],
        interval_s: float = 1.0,
        name: str = "hookwatch-capture",
        max_batch: int = MAX_DRAIN,
        poll_s: float = 0.05,
        min_batch: int = 1,
        on_off: Callable[[], None] | None = None,
        backlog_pause_s: float = BACKLOG_PAUSE_S,
        on_start: Callable[[], None] | None = None,
        may_wait: Callable[[], bool] | None = None,
        max_wait_s: float = 0.0,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"expected capacity >= 1, got {capacity}")
        if not poll_s > 0:
            raise ValueError(f"expected poll_s > 0, got {poll_s}")
        if not 1 <= min_batch <= max_batch:
            raise ValueError(f"expected 1 <= min_batch <= max_batch ({max_batch}), got {min_batch}")
        self.capacity = capacity
        # deque append and popleft are atomic: one producer, one consumer, no lock needed.
        self._items: collections.deque[T] = collections.deque()
        self._process = process
        self._tick = tick
        self._interval = interval_s
        self._max_batch = max_batch
        # Wait for at most half the buffer: one that fills while the thread waits drops.
        self._min_batch = max(1, min(min_batch, capacity // 2))
        #: Set by wait_idle so a short buffer is drained without waiting for the tick.
        self._drain_requested = False
        self._poll = min(poll_s, interval_s)
        self._backlog_pause = max(0.0, backlog_pause_s)
        self._stop = threading.Event()
        self._process_remaining = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._log = RateLimitedLog(log)
        self._on_off = on_off
        self._on_start = on_start
        #: Asked at a tick with fewer than ``min_batch`` items waiting: True lets them wait
        #: for the next tick (see ``_loop``), for at most ``max_wait_s`` since the oldest came.
        self._may_wait = may_wait
        self._max_wait = max(0.0, max_wait_s)
        #: When items were first seen waiting since the last drain (None: none were).
        self._waiting_since: float | None = None
        #: The batch being processed: what a failure of the loop loses.
        self._in_hand: list[T] = []
        #: Written only by the request thread; read by the worker thread at each tick.
        self.dropped = 0
        self.accepted = 0
        #: Written only by the worker thread.
        self.faults = 0
        self.processed = 0
        #: Items accepted but never processed: in hand when the loop failed, or discarded
        #: once capture was off (counted in ``processed`` too, so ``wait_idle`` returns).
        self.lost = 0
        #: Times the loop failed and was restarted.
        self.restarts = 0
        #: True once capture went off after repeated failures (the thread only publishes).
        self.off = False

    def start(self) -> None:
        self._thread.start()
        _RUNNING.add(self)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def offer(self, item: T) -> bool:
        if len(self._items) >= self.capacity:
            self.dropped += 1
            return False
        self._items.append(item)
        self.accepted += 1
        return True

    @property
    def depth(self) -> int:
        return len(self._items)

    def _drain(self) -> list[T]:
        batch: list[T] = []
        items = self._items
        while items and len(batch) < self._max_batch:
            batch.append(items.popleft())
        return batch

    def _safe(self, fn: Callable[[], None], what: str) -> None:
        try:
            fn()
        except Exception:
            self.faults += 1
            self._log.warning(
                what, "hookwatch: %s failed; monitoring carries on", what, exc_info=True
            )

    def _process_batch(self, batch: list[T]) -> None:
        if self.off:
            self._discard(len(batch))
            return
        self._in_hand = batch
        self._safe(partial(self._process, batch), "processing captures")
        self._in_hand = []
        self.processed += len(batch)

    def _discard(self, count: int) -> None:
        self.lost += count
        self.processed += count

    def _run(self) -> None:
        if self._on_start is not None:
            self._safe(self._on_start, "setting up the capture thread")
        failures: collections.deque[float] = collections.deque()
        while True:
            try:
                self._loop()
                break
            except BaseException as error:  # whatever it is, the thread must outlive its loop
                self._failed(error, failures)
        self._flush_remaining()

    def _failed(self, error: BaseException, failures: collections.deque[float]) -> None:
        """Count and log a failure of the loop; switch capture off when they come too fast."""
        self._discard(len(self._in_hand))
        self._in_hand = []
        self.faults += 1
        self.restarts += 1
        now = time.monotonic()
        failures.append(now)
        while failures and now - failures[0] > RESTART_WINDOW_S:
            failures.popleft()
        what = f"{type(error).__name__}: {error}"
        if self.off or len(failures) <= MAX_RESTARTS:
            self._log.warning(
                "loop",
                "hookwatch: the capture thread failed (%s); restarted (%d restarts so far), "
                "serving continues",
                what,
                self.restarts,
                exc_info=True,
            )
        else:
            self.off = True
            self._discard(len(self._drain_all()))
            self._safe(self._on_off or (lambda: None), "switching capture off")
            self._log.warning(
                "off",
                "hookwatch: the capture thread failed %d times within %.0f s (last: %s); "
                "capture is off until the process restarts (hookwatch_layer_enabled 0), "
                "request counts go on, serving continues",
                len(failures),
                RESTART_WINDOW_S,
                what,
                exc_info=True,
            )
        if self.off:
            # Whatever keeps failing once capture is off is publishing: at most one try a tick.
            self._stop.wait(self._interval)

    def _drain_all(self) -> list[T]:
        items: list[T] = []
        while batch := self._drain():
            items.extend(batch)
        return items

    def _loop(self) -> None:
        next_tick = time.monotonic() + self._interval
        backlog = False
        while True:
            if backlog:
                # A wait, not a check: the GIL is released for the pause (see BACKLOG_PAUSE_S).
                if self._stop.wait(self._backlog_pause):
                    break
            elif self._stop.wait(max(0.0, min(self._poll, next_tick - time.monotonic()))):
                break
            now = time.monotonic()
            tick_due = now >= next_tick
            if self._waiting_since is None and self._items:
                self._waiting_since = now
            drain = backlog or self._drain_requested or self.depth >= self._min_batch
            if tick_due and not drain:
                drain = not self._wait_longer(now)
            if drain:
                self._drain_requested = False
                batch = self._drain()
                self._waiting_since = None
                backlog = len(batch) >= self._max_batch
                if batch:
                    self._process_batch(batch)
                del batch  # hold nothing between iterations
            if tick_due:
                self._safe(self._tick, "publishing metrics")
                next_tick = time.monotonic() + self._interval

    def _wait_longer(self, now: float) -> bool:
        """At a tick with fewer than ``min_batch`` items waiting: whether they may wait for
        a later tick. A drain costs a fixed part well above its part per item, so a few items
        a second drained at every tick cost several times what they cost in one drain. They
        wait while ``may_wait`` says so (the monitor's: requests keep coming, so more items
        will) and the oldest has waited less than ``max_wait_s``; an idle worker drains at its
        next tick, so what that tick publishes includes everything offered before it."""
        since = self._waiting_since
        if since is None or self._may_wait is None or now - since >= self._max_wait:
            return False
        try:
            return self._may_wait()
        except Exception:  # a failing question never holds items back
            self.faults += 1
            self._log.warning(
                "may_wait", "hookwatch: deciding when to drain failed; drained", exc_info=True
            )
            return False

    def _flush_remaining(self) -> None:
        if self._process_remaining:
            while batch := self._drain():
                self._process_batch(batch)
        self._safe(self._tick, "publishing metrics")

    def stop(self, timeout: float = 5.0, process_remaining: bool = True) -> None:
        """Publish once more and join the thread, processing what is queued first by default.

        ``process_remaining=False`` (interpreter exit) ends after the batch in hand, so the
        join does not wait on a backlog.
        """
        self._process_remaining = process_remaining
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        _RUNNING.discard(self)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until everything accepted so far is processed (tests and shutdown only)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processed >= self.accepted:
                return True
            self._drain_requested = True
            time.sleep(0.005)
        return False
