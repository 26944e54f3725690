"""One model's request counts: the one object every phase of a request reports to, and the one
that writes them out.

A request is counted as received (on arrival, or with its forward pass), sampled, rejected with
a reason, its captures dropped at a full buffer, and answered after so many seconds; each phase
calls :class:`RequestTally` once, and nothing else counts requests. Where the process writes
worker files (TorchServe), every count also goes, as it happens, into the worker's own count
file (:class:`~hookwatch._metrics.CountSlots`), so a worker killed with SIGKILL has lost none;
elsewhere (one process, one registry) :meth:`RequestTally.publish` adds what came since the
last publish to the counters.

The counting runs in the thread serving the request: plain integers and floats added in place
in a memory map, never a Prometheus call. The count every request makes on arrival
(:meth:`received`, or its inlined copy in :class:`~hookwatch._monitor.path.RequestPath`), and
the count of a sampled forward's requests (:meth:`sampled`), take no lock once the count file is
attached: each addition is one read and one write of a
``memoryview`` item or an attribute, which the GIL serialises (CPython switches threads only at
calls and backward jumps, and there is none between the read and the write). A served batch's
duration is not binned on the request path: it goes into :attr:`RequestTally.pending` (a C-level
``deque.append``, no Python frame), and the capture thread bins what waits there at each publish
(:meth:`fold`). A worker killed with SIGKILL therefore loses the durations of its last publish
interval at most, never a request count. An uncontended lock taken twice per request cost ~2 µs
per request in the served path (docs/bench/request.md). On a free-threaded interpreter (no GIL)
the count file is written under the lock, as every rarer count is. An exported counter's
increment (a lock, a struct pack into a memory-mapped file, three Python frames) cost far more
per request between the layers of a real forward than in a tight loop (docs/bench/README.md,
"Figures behind the code's constants").
"""

from __future__ import annotations

import contextlib
import operator
import sys
import threading
from bisect import bisect_left
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookwatch import _catalogue as metric
from hookwatch._metrics import CountSlots, HistogramSlot, MetricSet
from hookwatch._names import REJECT_REASONS

__all__ = ["PENDING_DURATIONS", "RequestCounts", "RequestTally", "whole_requests"]

#: Served batches whose durations can wait for the capture thread to bin them
#: (:attr:`RequestTally.pending`): ~40 s of a busy worker's batches at one publish a second.
#: Only a capture thread stalled that long loses any (the oldest), and then only durations.
PENDING_DURATIONS = 1 << 17


def _gil_enabled() -> bool:
    """False on a free-threaded interpreter running without its GIL (3.13t and later)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


@dataclass(frozen=True)
class RequestCounts:
    """Cumulative request counts, copied under the tally's lock."""

    #: Every request received: served or rejected.
    requests: int = 0
    sampled: int = 0
    rejected: int = 0
    #: Captures (not records) dropped because the capture buffer was full.
    dropped: int = 0
    #: The rejected ones by reason (``REJECT_REASONS``), the reasons seen so far.
    rejected_by: dict[str, int] = field(default_factory=dict)


def whole_requests(value: Any, name: str) -> int:
    """A request count as an int (a numpy or torch integer converts): a float, a string or a
    negative number would count requests that never came."""
    try:
        count = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name}: expected a whole number of requests, got {type(value).__name__} {value!r}"
        ) from None
    if count < 0:
        raise ValueError(f"{name}: expected a whole number of requests >= 0, got {count}")
    return count


class RequestTally:
    """Counts one model's requests as each phase reports them, and writes the counts out.

    Each method counts one thing: :meth:`received`, :meth:`sampled`, :meth:`rejected`,
    :meth:`dropped`, :meth:`answered`, and :meth:`served` for a forward whose requests were
    not counted on arrival (received and sampled under one lock). :meth:`declare` decides where
    the counts go, once the metric set can take them.
    """

    def __init__(self, model_name: str, metrics: MetricSet) -> None:
        self.model_name = model_name
        self._metrics = metrics
        self._lock = threading.Lock()
        self._requests = 0
        self._sampled = 0
        self._dropped = 0
        self._rejected: dict[str, int] = defaultdict(int)
        #: The worker's count file, once :meth:`declare` made it (never where the metric set
        #: keeps one registry in this process).
        self._slots: CountSlots | None = None
        #: Its float64 cells (:attr:`CountSlots.values`), written in place and without the lock
        #: by the request path; set last when the file is attached, and only under a GIL.
        self._cells: Any = None
        self._at_requests = self._at_sampled = self._at_dropped = 0
        self._at_rejected: dict[str, int] = {}
        self._duration: HistogramSlot | None = None
        #: The request durations answered while ``_duration`` was None (the registry's
        #: histogram, which cannot be read back cheaply): how many and their sum, for
        #: :meth:`durations`.
        self._answered = 0
        self._answered_s = 0.0
        #: What :meth:`publish` already added to the registry's counters.
        self._published = RequestCounts()
        #: ``(seconds, count)`` of served batches whose durations wait to be binned: the
        #: request path appends (one C call), :meth:`fold` takes them out (capture thread).
        self.pending: deque[tuple[float, int]] = deque(maxlen=PENDING_DURATIONS)
        #: One folder at a time: each takes out what waited when it began.
        self._fold_lock = threading.Lock()

    # -- the request path -------------------------------------------------------------------

    def received(self, count: int) -> None:
        """Count ``count`` requests as received, before anything can go wrong with them."""
        cells = self._cells
        if cells is not None:
            # A float in a shared memory map: a worker killed right after still counted.
            # Lock-free (module docstring); written here, not through CountSlots.add: one call
            # fewer on every request. The file's cell is the count from here on (``_requests``
            # stops where it was: see _requests_total).
            cells[self._at_requests] += count
            return
        with self._lock:
            if self._slots is not None:  # attached meanwhile, or no GIL
                self._slots.add(self._at_requests, count)
            self._requests += count

    def _requests_total(self) -> int:
        """Every request counted: the count file's cell once attached (which took what
        ``_requests`` held then, and every count since), ``_requests`` before."""
        return self._total(self._at_requests, self._requests)

    def _total(self, at: int, counted: int) -> int:
        """A count the request path writes without the lock: cell ``at`` of the count file
        once attached, ``counted`` (the count kept in memory) before."""
        cells = self._cells
        if cells is not None:
            return int(cells[at])
        return counted

    @property
    def requests_seen(self) -> int:
        """Requests counted so far, read without the lock (the capture thread's sign that
        requests are coming: :meth:`Monitor._pace`)."""
        return self._requests_total()

    def served(self, count: int, sampled: int) -> None:
        """Count the ``count`` requests of a forward pass as received, ``sampled`` of them
        captured (a host that counts its requests with their forward, not on arrival)."""
        with self._lock:
            self._requests += count
            self._sampled += sampled
            if self._slots is not None:
                self._slots.add(self._at_requests, count)
                if sampled:
                    self._slots.add(self._at_sampled, sampled)

    def sampled(self, count: int) -> None:
        """Count ``count`` requests, received already, as captured."""
        cells = self._cells
        if cells is not None:
            # Lock-free, as received() (the file's cell is the count from here on).
            cells[self._at_sampled] += count
            return
        with self._lock:
            self._sampled += count
            if self._slots is not None:
                self._slots.add(self._at_sampled, count)

    def rejected(self, count: int, reason: str) -> None:
        """Count ``count`` requests, received already, as answered with a 4xx for ``reason``."""
        if reason not in REJECT_REASONS:
            raise ValueError(f"expected a reason in {REJECT_REASONS}, got {reason!r}")
        with self._lock:
            self._rejected[reason] += count
            if self._slots is not None:
                self._slots.add(self._at_rejected[reason], count)

    def dropped(self, captures: int) -> None:
        """Count ``captures`` captures dropped at a full capture buffer."""
        with self._lock:
            self._dropped += captures
            if self._slots is not None:
                self._slots.add(self._at_dropped, captures)

    def answered(self, seconds: float, count: int) -> None:
        """Record that ``count`` requests took ``seconds``: the request-duration histogram."""
        duration = self._duration
        if duration is None:
            # One registry in this process, or worker files that cannot be written yet
            # (hookwatch_metrics_dir_writable 0): then the duration is lost, the answer is not.
            self._answered += count
            self._answered_s += seconds * count
            with contextlib.suppress(OSError):
                self._metrics.observe_histogram(
                    metric.REQUEST_DURATION, seconds, count, model=self.model_name
                )
            return
        # HistogramSlot.observe inlined: one frame fewer on every batch's answer. Lock-free
        # where the request counts are (module docstring).
        cells = duration.values
        if self._cells is not None:
            cells[duration.buckets[bisect_left(duration.bounds, seconds)]] += count
            cells[duration.sum_index] += seconds * count
            return
        with self._lock:
            cells[duration.buckets[bisect_left(duration.bounds, seconds)]] += count
            cells[duration.sum_index] += seconds * count

    def fold(self) -> None:
        """Bin the durations waiting in :attr:`pending` into the request-duration histogram
        (the capture thread, at every publish and before :meth:`durations`).

        Into the count file in one pass: the waiting batches' bucket counts and sum, added to
        the cells once per bucket (a publish at a busy worker's rate folds thousands), the
        same lock-free additions :meth:`answered` makes."""
        pending = self.pending
        with self._fold_lock:
            waiting = len(pending)
            if not waiting:
                return
            # Only this folder takes out, under the lock: the ``waiting`` entries are there.
            taken = [pending.popleft() for _ in range(waiting)]
            duration = self._duration
            if duration is None or self._cells is None:
                for seconds, count in taken:
                    self.answered(seconds, count)
                return
            batches = np.array(taken, dtype=np.float64)
            seconds_of, counts = batches[:, 0], batches[:, 1]
            per_bucket = np.bincount(
                np.searchsorted(duration.bounds, seconds_of, side="left"),
                weights=counts,
                minlength=len(duration.buckets),
            )
            total = float(seconds_of @ counts)
            cells, buckets = duration.values, duration.buckets
            # Each addition's operand computed before it: a call between an item's read and
            # its write would let the request thread's own addition in between, and lose it.
            for bucket, added in enumerate(per_bucket.tolist()):
                if added:
                    cells[buckets[bucket]] += added
            cells[duration.sum_index] += total

    def durations(self) -> tuple[int, float]:
        """How many requests were answered so far and the sum of their durations: the
        request-duration histogram's count and sum (the capture thread's reference for what a
        sampled forward adds: :class:`~hookwatch._monitor.cost.HookCost`), what waited in
        :attr:`pending` folded in first. Read without the lock: a count written meanwhile
        shows at the next read."""
        self.fold()
        count, total = self._answered, self._answered_s
        duration = self._duration
        if duration is not None:
            cells = duration.values
            count += int(sum(cells[i] for i in duration.buckets))
            total += float(cells[duration.sum_index])
        return count, total

    def counts(self) -> RequestCounts:
        with self._lock:
            return self._counts_locked()

    def _counts_locked(self) -> RequestCounts:
        return RequestCounts(
            self._requests_total(),
            self._total(self._at_sampled, self._sampled),
            sum(self._rejected.values()),
            self._dropped,
            dict(self._rejected),
        )

    # -- writing them out -------------------------------------------------------------------

    def declare(self) -> None:
        """Create every request series at zero, and where the metric set writes worker files
        the count file, holding what was counted so far (a file created late, once the metrics
        directory took it, misses nothing). Raises OSError while the directory cannot take the
        files; calling again retries."""
        m, name = self._metrics, self.model_name
        if self._slots is None:
            slots = m.count_slots(name)
            if slots is not None:
                self._attach(slots)
        # Prometheus windows (``delta``, ``increase``) need the zero before the first event.
        for spec in (metric.REQUESTS, metric.REQUESTS_SAMPLED, metric.CAPTURES_DROPPED):
            m.touch(spec, model=name)
        for reason in REJECT_REASONS:
            m.touch(metric.REQUESTS_REJECTED, model=name, reason=reason)
        m.touch(metric.REQUEST_DURATION, model=name)

    def _attach(self, slots: CountSlots) -> None:
        name = {"model": self.model_name}
        at_requests = slots.index(metric.REQUESTS, **name)
        at_sampled = slots.index(metric.REQUESTS_SAMPLED, **name)
        at_dropped = slots.index(metric.CAPTURES_DROPPED, **name)
        at_rejected = {
            r: slots.index(metric.REQUESTS_REJECTED, reason=r, **name) for r in REJECT_REASONS
        }
        with self._lock:
            slots.add(at_requests, self._requests)
            slots.add(at_sampled, self._sampled)
            slots.add(at_dropped, self._dropped)
            for reason, count in self._rejected.items():
                slots.add(at_rejected[reason], count)
            self._at_requests, self._at_sampled, self._at_dropped = (
                at_requests,
                at_sampled,
                at_dropped,
            )
            self._at_rejected = at_rejected
            self._duration = slots.histogram(metric.REQUEST_DURATION, **name)
            self._slots = slots
            # Last: from here on the request path writes the file without the lock, and what
            # it counted before went in above, under it.
            if _gil_enabled():
                self._cells = slots.values

    def publish(self) -> None:
        """Bin the durations waiting in :attr:`pending`, and add what was counted since the
        last publish to the registry's counters (nothing more where the counts went to the
        worker's count file as they came)."""
        self.fold()
        if self._slots is not None:
            return
        # Copied and marked published in one step: two publishes at once (the capture thread's
        # tick, a flush) each add their own difference, never the same one twice.
        with self._lock:
            now = self._counts_locked()
            last, self._published = self._published, now
        m, name = self._metrics, self.model_name
        m.inc(metric.REQUESTS, now.requests - last.requests, model=name)
        m.inc(metric.REQUESTS_SAMPLED, now.sampled - last.sampled, model=name)
        m.inc(metric.CAPTURES_DROPPED, now.dropped - last.dropped, model=name)
        for reason, count in now.rejected_by.items():
            m.inc(
                metric.REQUESTS_REJECTED,
                count - last.rejected_by.get(reason, 0),
                model=name,
                reason=reason,
            )
