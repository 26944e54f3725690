"""The request path: sampling decision, request tallies and the hand-off of a forward's record.

Everything here runs in the thread serving the request, so it only decides, counts and appends:
one random draw per request and an integer tally per batch, a thread-local record the hooks
append to, and
at the end of a sampled forward one non-blocking offer of that record. Counts are plain integers
under one uncontended lock; the publisher reads a copy of them. No Prometheus here.
"""

from __future__ import annotations

import logging
import operator
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch

from hookwatch import _catalogue as metric
from hookwatch._capture import RateLimitedLog
from hookwatch._hooks import Capture, Gate, Held
from hookwatch._metrics import CountSlots
from hookwatch._names import REJECT_REASONS

__all__ = ["Record", "RequestCounts", "RequestGate", "RequestScope"]

log = logging.getLogger("hookwatch")

#: What the hooks of one sampled forward pass captured, handed off as one item: one capture per
#: layer. A module called several times in one forward (an activation module reused inside a
#: residual block) keeps its last call, the block's output; one sample stays one capture.
#: Plain tuples, not the dict the hooks fill during the forward nor their named tuples: the
#: collector stops tracking an exact tuple of strings and numpy arrays at its first young
#: collection (never a tuple subclass), so a waiting record is never promoted to the oldest
#: generation (see ``hookwatch._hooks.hold``). A :class:`Capture` is one too, field for field.
PlainCapture = tuple[str, Held | None, Held | None, Held | None]
Record = tuple[PlainCapture, ...]


def _plain(capture: Capture) -> PlainCapture:
    return (capture.layer, capture.stats, capture.features, capture.raw)


@dataclass(frozen=True)
class RequestCounts:
    """Cumulative request-path tallies, copied under the gate's lock."""

    #: Every request received: served or rejected.
    requests: int = 0
    sampled: int = 0
    rejected: int = 0
    #: Captures (not records) dropped because the capture buffer was full.
    dropped: int = 0
    hook_faults: dict[str, int] = field(default_factory=dict)
    #: The rejected ones by reason (``REJECT_REASONS``).
    rejected_by: dict[str, int] = field(default_factory=dict)


def _sampled_rows(draws: Sequence[bool], sizes: Sequence[int] | None) -> list[int]:
    """The batch rows of the sampled requests, each request ``sizes[i]`` rows (default 1)."""
    if sizes is None:
        return [i for i, drawn in enumerate(draws) if drawn]
    rows: list[int] = []
    start = 0
    for drawn, size in zip(draws, sizes, strict=True):
        if drawn:
            rows.extend(range(start, start + size))
        start += size
    return rows


class RequestScope:
    """What :meth:`RequestGate.request` returns: the forward pass runs inside it."""

    __slots__ = ("_batch", "_gate", "_rows", "sampled")

    def __init__(
        self, gate: RequestGate, sampled: bool, rows: torch.Tensor | None = None, batch: int = 0
    ) -> None:
        self._gate = gate
        self.sampled = sampled
        self._rows = rows
        self._batch = batch

    def __enter__(self) -> RequestScope:
        if self.sampled:
            self._gate._begin_record(self._rows, self._batch)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.sampled:
            # A forward that raised hands off nothing: half a record would skew the per-layer
            # counts against each other.
            self._gate._end_record(keep=exc_type is None)


def _count(value: Any, name: str) -> int:
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


class RequestGate:
    """Decides which forwards are captured, counts requests, and is the hooks' capture sink.

    ``offer`` hands a finished record to the capture buffer and returns False when it is full.
    """

    def __init__(
        self,
        model_name: str,
        sample_rate: float,
        offer: Callable[[Record], bool],
        enabled: bool = True,
        seed: int | None = None,
        slots: CountSlots | None = None,
    ) -> None:
        self.model_name = model_name
        #: Where the counts also go as they happen, to survive the process (worker files).
        self.slots: CountSlots | None = None
        self.sample_rate = sample_rate if enabled else 0.0
        #: The flag every hook reads (thread-local, open only inside a sampled forward).
        self.hook_flag = Gate()
        self._offer = offer
        self._rng = random.Random(seed)
        # The record of the sampled forward running on this thread, if any.
        self._local = threading.local()
        self._log = RateLimitedLog(log)
        self._lock = threading.Lock()
        self._requests = 0
        self._sampled = 0
        self._rejected: dict[str, int] = defaultdict(int)
        self._dropped = 0
        self._hook_faults: dict[str, int] = defaultdict(int)
        # Hooks registered around sampled forwards only (HookSet.arm/disarm); see arm_with.
        self._arm: Callable[[], None] | None = None
        self._disarm: Callable[[], None] | None = None
        self._pinned = False
        self._pin_lock = threading.Lock()
        #: ``time.monotonic()`` of the last forward's scope: the capture thread paces its
        #: drains while requests come (:meth:`Monitor._pace`). One float written per forward,
        #: no lock.
        self.active_at = float("-inf")
        if slots is not None:
            self.attach_slots(slots)

    def arm_with(self, arm: Callable[[], None], disarm: Callable[[], None]) -> None:
        """Call ``arm`` before and ``disarm`` after every sampled forward (hooks registered
        on demand). At a sample rate of 1 every forward is sampled: the gate then holds one
        arm of its own for as long as the rate stays there, sparing a registration per
        request."""
        self._arm, self._disarm = arm, disarm

    def _pin(self, pin: bool) -> None:
        with self._pin_lock:
            if pin is self._pinned or self._arm is None or self._disarm is None:
                return
            (self._arm if pin else self._disarm)()
            self._pinned = pin

    def attach_slots(self, slots: CountSlots) -> None:
        """From now on also write the counts into ``slots``, starting from what was counted so
        far (a count file created late, once the metrics directory took it, misses nothing)."""
        name = {"model": self.model_name}
        at_requests = slots.index(metric.REQUESTS, **name)
        at_sampled = slots.index(metric.REQUESTS_SAMPLED, **name)
        at_dropped = slots.index(metric.CAPTURES_DROPPED, **name)
        at_rejected = {
            r: slots.index(metric.REQUESTS_REJECTED, reason=r, **name) for r in REJECT_REASONS
        }
        with self._lock:
            if self.slots is not None:
                raise RuntimeError("expected a gate without a count file, got one with")
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
            self.slots = slots

    def receive(self, count: int) -> None:
        """Count ``count`` requests as received, before anything can go wrong with them."""
        with self._lock:
            self._requests += count
            if self.slots is not None:
                # A float in a shared memory map: a worker killed right after still counted.
                self.slots.add(self._at_requests, count)

    def request(
        self, batch_size: int = 1, sizes: Sequence[int] | None = None, received: bool = False
    ) -> RequestScope:
        """Count the requests of one forward pass (unless ``received`` says :meth:`receive`
        already did) and decide which of them are captured.

        ``sizes`` gives the rows of each request in the batch (a request of several texts has
        several); without it each of ``batch_size`` rows is a request of its own. Each request
        is sampled on its own draw, so a batch of TorchServe's dynamic batching is sampled as
        its requests would be one at a time; when only some are, the hooks capture their rows.
        """
        if sizes is not None:
            count = len(sizes)
        elif type(batch_size) is int and batch_size >= 0:
            count = batch_size  # the common case, without a call on every request
        else:
            count = _count(batch_size, "batch_size")
        self.active_at = time.monotonic()
        rate = self.sample_rate
        if (rate >= 1.0) is not self._pinned:
            self._pin(rate >= 1.0)
        rows: torch.Tensor | None = None
        if rate <= 0.0 or count == 0:
            picked = 0
        elif rate >= 1.0:
            picked = count
        elif count == 1:
            picked = 1 if self._rng.random() < rate else 0
        else:
            draws = [self._rng.random() < rate for _ in range(count)]
            picked = sum(draws)
            if 0 < picked < count:
                rows = torch.tensor(_sampled_rows(draws, sizes), dtype=torch.long)
        # Plain integers under an uncontended lock: the capture thread publishes them. An
        # exported counter's increment here (a lock, a struct pack into a memory-mapped file,
        # three Python frames) cost far more per request between the layers of a real forward
        # than in a tight loop (docs/bench/README.md, "Figures behind the code's constants").
        with self._lock:
            if not received:
                self._requests += count
            self._sampled += picked
            if self.slots is not None:
                if not received:
                    self.slots.add(self._at_requests, count)
                if picked:
                    self.slots.add(self._at_sampled, picked)
        total = sum(sizes) if sizes is not None else batch_size
        return RequestScope(self, picked > 0, rows, total)

    def reject(self, count: int = 1, reason: str = "other", received: bool = False) -> None:
        """Count ``count`` requests answered with a 4xx before any forward, for ``reason``
        (and as requests, unless ``received`` says :meth:`receive` already did)."""
        if reason not in REJECT_REASONS:
            raise ValueError(f"expected a reason in {REJECT_REASONS}, got {reason!r}")
        count = _count(count, "count")
        with self._lock:
            if not received:
                self._requests += count
            self._rejected[reason] += count
            if self.slots is not None:
                if not received:
                    self.slots.add(self._at_requests, count)
                self.slots.add(self._at_rejected[reason], count)

    def answered(self, seconds: float, count: int) -> bool:
        """Record how long ``count`` requests took in the worker's histogram file; False where
        there is none (the caller observes the in-process histogram instead)."""
        if self.slots is None:
            return False
        with self._lock:
            self._duration.observe(seconds, count)
        return True

    def counts(self) -> RequestCounts:
        with self._lock:
            return RequestCounts(
                self._requests,
                self._sampled,
                sum(self._rejected.values()),
                self._dropped,
                dict(self._hook_faults),
                dict(self._rejected),
            )

    def _begin_record(self, rows: torch.Tensor | None = None, batch: int = 0) -> None:
        if self._arm is not None:
            self._arm()  # never raises; a failed registration only loses this capture
        self._local.record = {}
        self.hook_flag.set(True, rows, batch)

    def _end_record(self, keep: bool) -> None:
        try:
            self.hook_flag.set(False)
            captured: dict[str, Capture] | None = getattr(self._local, "record", None)
            self._local.record = None
            if captured and keep:
                self._hand_off(tuple([_plain(c) for c in captured.values()]))
        finally:
            # The hooks come off whatever happened in the forward or the hand-off.
            if self._disarm is not None:
                self._disarm()

    def _hand_off(self, record: Record) -> bool:
        if self._offer(record):
            return True
        with self._lock:
            self._dropped += len(record)
            if self.slots is not None:
                self.slots.add(self._at_dropped, len(record))
        return False

    # -- the hooks' sink --------------------------------------------------------------------

    def offer(self, capture: Capture) -> bool:
        """Add to the running forward's record (a list append, never blocks)."""
        record: dict[str, Capture] | None = getattr(self._local, "record", None)
        if record is None:
            # The gate was opened without a request scope: hand the capture off on its own.
            return self._hand_off((_plain(capture),))
        record[capture.layer] = capture
        return True

    def on_fault(self, layer: str, error: BaseException) -> None:
        with self._lock:
            self._hook_faults[layer] += 1
        self._log.warning(
            f"hook:{layer}",
            "hookwatch: hook on layer %r of model %r failed (%s: %s); capture for that layer is "
            "off, serving continues",
            layer,
            self.model_name,
            type(error).__name__,
            error,
        )
