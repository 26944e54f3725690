"""The request path: sampling decision and the hand-off of a forward's record.

Everything here runs in the thread serving the request, so it only decides and appends: a
countdown to the next sampled forward pass (one random draw per *sampled* forward, none for
the others), a thread-local record the hooks append to, and at the end of a sampled forward one
non-blocking offer of that record. The requests themselves are counted by the
caller, in the model's :class:`~hookwatch._monitor.tally.RequestTally`; the gate reports the
captures it drops there. No Prometheus here.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from types import TracebackType

import torch

from hookwatch._capture import RateLimitedLog
from hookwatch._hooks import Capture, Gate, PlainCapture
from hookwatch._monitor.tally import RequestTally, whole_requests

__all__ = ["Record", "RequestGate", "RequestScope"]

log = logging.getLogger("hookwatch")

#: What the hooks of one sampled forward pass captured, handed off as one item: one capture per
#: layer. A module called several times in one forward (an activation module reused inside a
#: residual block) keeps its last call, the block's output; one sample stays one capture.
#: Plain tuples, not the dict the hooks fill during the forward (``Gate.record``) nor named
#: tuples: the collector stops tracking an exact tuple of strings and numpy arrays at its first
#: young collection (never a tuple subclass), so a waiting record is never promoted to the
#: oldest generation (see ``hookwatch._hooks.hold``). The hooks put :class:`Capture`'s fields
#: into the dict as plain tuples already; a capture offered to the gate is converted.
Record = tuple[PlainCapture, ...]


#: Unsampled scopes kept, one per request count (batch sizes: a handful in practice).
_UNSAMPLED_SCOPES = 256


def _plain(capture: Capture) -> PlainCapture:
    return (capture.layer, capture.stats, capture.features, capture.raw)


class RequestScope:
    """What :meth:`RequestGate.request` returns: the forward pass runs inside it. ``requests``
    is how many requests the forward serves, ``picked`` how many of them are captured."""

    __slots__ = ("_batch", "_gate", "_rows", "picked", "requests")

    def __init__(
        self,
        gate: RequestGate,
        requests: int,
        picked: int,
        rows: torch.Tensor | None = None,
        batch: int = 0,
    ) -> None:
        self._gate = gate
        self.requests = requests
        self.picked = picked
        self._rows = rows
        self._batch = batch

    def __enter__(self) -> RequestScope:
        if self.picked:
            self._gate._begin_record(self._rows, self._batch)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.picked:
            # A forward that raised hands off nothing: half a record would skew the per-layer
            # counts against each other.
            self._gate._end_record(keep=exc_type is None)


class RequestGate:
    """Decides which forwards are captured, and is the hooks' capture sink.

    ``offer`` hands a finished record to the capture buffer and returns False when it is full;
    the captures of a record it refused are counted as dropped in ``tally``.
    """

    def __init__(
        self,
        model_name: str,
        sample_rate: float,
        offer: Callable[[Record], bool],
        tally: RequestTally,
        enabled: bool = True,
        seed: int | None = None,
        max_per_s: float | None = None,
    ) -> None:
        self.model_name = model_name
        self._rate = sample_rate if enabled else 0.0
        #: At most this many sampled requests a second (None: no limit): a bucket of one
        #: second's worth, refilled with time and checked only when a forward is due, so an
        #: unsampled forward never reads the clock. It counts requests, not forwards (what
        #: the capture thread and the drift windows pay for is samples): a sampled forward
        #: takes a token per request, and one that finds fewer captures its first requests.
        #: The monitor also lowers ``sample_rate`` towards the limit at every publish; the
        #: bucket holds it meanwhile (the first second of a burst after a quiet spell, sampled
        #: at the share the quiet spell set).
        self._max_per_s = max_per_s
        #: The bucket holds a second's worth, and at least one sample (a limit under 1 a
        #: second still samples, once every 1 / limit seconds).
        self._bucket = max(1.0, max_per_s or 0.0)
        self._tokens = self._bucket
        self._filled_at = time.monotonic()
        #: Forward passes still to pass unsampled before the next sampled one (``math.inf``:
        #: none will be). Forwards, not requests: the hooks cost per hooked forward whatever
        #: its batch, so a draw per request hooked 1 - (1 - rate)^8 of batches of 8 (57 % at
        #: 10 %) to capture 10 % of the requests. Drawn once per sampled forward from the
        #: geometric distribution of the gaps between successes of a Bernoulli(rate) draw per
        #: forward: the same forwards are sampled, in law, as with a draw per forward, and an
        #: unsampled forward pays a comparison and a subtraction instead of a draw
        #: (docs/bench/request.md). Each request is still captured with probability ``rate``,
        #: whatever its content; those of one forward together. 0 with ``_redraw`` set: the
        #: next forward takes the slow path, which draws afresh.
        self._skip: float = 0
        self._redraw = True
        #: The flag every hook reads (thread-local, open only inside a sampled forward).
        self.hook_flag = Gate()
        self._offer = offer
        self._rng = random.Random(seed)
        self._log = RateLimitedLog(log)
        self._tally = tally
        self._lock = threading.Lock()
        self._hook_faults: dict[str, int] = defaultdict(int)
        # Hooks registered around sampled forwards only (HookSet.arm/disarm); see arm_with.
        self._arm: Callable[[], bool] | None = None
        self._hold: Callable[[], bool] | None = None
        self._disarm: Callable[[], None] | None = None
        self._pinned = False
        self._pin_lock = threading.Lock()
        #: The scope of an unsampled forward of so many requests: it holds nothing of the
        #: forward's own, so one per request count serves every unsampled forward (one object
        #: fewer per request).
        self._unsampled: dict[int, RequestScope] = {}
        #: Likewise the scope of a sampled forward of so many one-row requests, every one
        #: captured (the common sampled one).
        self._whole: dict[int, RequestScope] = {}

    @property
    def sample_rate(self) -> float:
        """The share of forwards, and so of requests, captured; setting it (capture going off
        sets 0) takes effect from the next forward."""
        return self._rate

    @sample_rate.setter
    def sample_rate(self, rate: float) -> None:
        self._rate = rate
        # The countdown was drawn for the old rate: the next forward redraws it (and pins or
        # unpins the hooks), on the request thread.
        self._redraw = True
        self._skip = 0

    def _draw_skip(self) -> float:
        """How many forwards pass unsampled before the next sampled one: the failures before
        the first success of Bernoulli(rate) draws, by inversion of one uniform draw."""
        rate = self._rate
        if rate <= 0.0:
            return math.inf
        if rate >= 1.0:
            return 0
        u = self._rng.random()
        if u >= 1.0:  # only a fixed draw (the bench's) gets here: never sampled
            return math.inf
        return int(math.log1p(-u) / math.log1p(-rate))

    def arm_with(
        self,
        arm: Callable[[], bool],
        disarm: Callable[[], None],
        hold: Callable[[], bool] | None = None,
    ) -> None:
        """Call ``arm`` before and ``disarm`` after every sampled forward (hooks registered
        on demand). At a sample rate of 1 every forward is sampled: the gate then holds one
        arm of its own for as long as the rate stays there, sparing a registration per
        request; ``hold`` (``arm`` when None) is how it arms then."""
        self._arm, self._disarm = arm, disarm
        self._hold = hold or arm

    def _pin(self, pin: bool) -> None:
        with self._pin_lock:
            if pin is self._pinned or self._hold is None or self._disarm is None:
                return
            (self._hold if pin else self._disarm)()
            self._pinned = pin

    def request(
        self, batch_size: int = 1, sizes: Sequence[int] | None = None, received: bool = False
    ) -> RequestScope:
        """Decide whether the requests of one forward pass are captured (counting them is the
        caller's: the scope says how many there are and how many were picked; ``received``:
        they were counted on arrival, and this counts the captured ones).

        ``sizes`` gives the rows of each request in the batch (a request of several texts has
        several); without it each of ``batch_size`` rows is a request of its own. The forward
        is sampled with probability ``sample_rate``, independently of every other, and a
        sampled forward captures all its requests: each request is captured at the rate,
        whatever its content, and those of one batch of TorchServe's dynamic batching
        together. Only the per-second cap (``max_per_s``) captures part of a batch: its first
        requests, as many as the bucket has samples left.
        """
        skip = self._skip
        if sizes is None and type(batch_size) is int and batch_size > 0 and skip >= 1:
            # The common case, a forward that is not due: a comparison, a subtraction and a
            # lookup (each call more here cost every request, measured in
            # docs/bench/request.md).
            self._skip = skip - 1
            scope = self._unsampled.get(batch_size)
            return scope if scope is not None else self._unsampled_scope(batch_size)
        count = len(sizes) if sizes is not None else whole_requests(batch_size, "batch_size")
        if received:
            return self.due(count, sizes)
        return self._decide(count, sizes)

    def due(self, count: int, sizes: Sequence[int] | None = None) -> RequestScope:
        """:meth:`request` with ``received``: :meth:`decide`, its picked requests counted as
        sampled at once."""
        scope = self.decide(count, sizes)
        if scope.picked:
            self._tally.sampled(scope.picked)
        return scope

    def decide(self, count: int, sizes: Sequence[int] | None = None) -> RequestScope:
        """The full decision, without the common case's test, for a server whose countdown
        said, on arrival, that this forward is due
        (:class:`~hookwatch._monitor.path.RequestPath`), for ``count`` requests (a whole
        number, the server's own count) or ``sizes``. Counting the picked ones as sampled is
        the caller's, once their forward has run (one that raised captured nothing)."""
        return self._decide(len(sizes) if sizes is not None else count, sizes)

    def _decide(self, count: int, sizes: Sequence[int] | None) -> RequestScope:
        """The decision for a forward of ``count`` requests (``sizes``: their rows) that is
        due, or after a rate just set, or of several-row requests or of none."""
        if not count:
            # Nothing to capture: the countdown is left to a forward that has requests, so
            # empty forwards do not thin out the sampled ones.
            return self._unsampled_scope(0)
        rate = self._rate
        if (rate >= 1.0) is not self._pinned:
            self._pin(rate >= 1.0)
        if self._redraw:
            self._redraw = False
            self._skip = self._draw_skip()
        if rate <= 0.0:
            # Off (capture gone off, or never on): never sampled. The countdown alone does not
            # say so to a second request thread that reads it between another's two writes
            # above (``_redraw`` cleared, ``_skip`` not yet drawn): it read 0, due.
            return self._unsampled_scope(count)
        skip = self._skip
        if skip >= 1:
            self._skip = skip - 1
            return self._unsampled_scope(count)
        # This forward is sampled; the countdown to the next starts after it.
        self._skip = self._draw_skip()
        picked = count
        if self._max_per_s is not None:
            picked = self._take(count)
            if not picked:
                return self._unsampled_scope(count)
        if picked == count and sizes is None:
            # The common sampled forward: its scope holds nothing of its own either.
            scope = self._whole.get(count)
            if scope is None:
                scope = RequestScope(self, count, count, None, count)
                if len(self._whole) < _UNSAMPLED_SCOPES:
                    self._whole[count] = scope
            return scope
        rows: torch.Tensor | None = None
        if picked < count:
            # The rows of the first ``picked`` requests (``sizes[i]`` rows each, default 1).
            rows = torch.arange(sum(sizes[:picked]) if sizes is not None else picked)
        total = sum(sizes) if sizes is not None else count
        return RequestScope(self, count, picked, rows, total)

    def _take(self, wanted: int) -> int:
        """Up to ``wanted`` samples from the bucket (``max_per_s``): how many it had."""
        limit = self._max_per_s
        assert limit is not None
        now = time.monotonic()
        tokens = min(self._bucket, self._tokens + (now - self._filled_at) * limit)
        self._filled_at = now
        took = min(wanted, int(tokens))
        self._tokens = tokens - took
        return took

    def _unsampled_scope(self, count: int) -> RequestScope:
        scope = self._unsampled.get(count)
        if scope is None:
            scope = RequestScope(self, count, 0)
            if len(self._unsampled) < _UNSAMPLED_SCOPES:
                self._unsampled[count] = scope
        return scope

    def hook_faults(self) -> dict[str, int]:
        """Faults of the hooks so far, per layer."""
        with self._lock:
            return dict(self._hook_faults)

    def _begin_record(self, rows: torch.Tensor | None = None, batch: int = 0) -> None:
        if self.hook_flag.open:
            # Another sampled scope is open on this thread: scopes interleaved (an `await`
            # inside `with monitor.request()` on an event loop). The later takes the record
            # over; the earlier's capture is lost, or gets another request's activations.
            self._log.warning(
                "overlap",
                "hookwatch: model %r: a sampled request's scope opened while another was open "
                "on the same thread (an await inside `with monitor.request()`?); captures of "
                "one are lost or mixed: run the forward and its scope with no await between "
                "(docs/api.md, 'Async servers')",
                self.model_name,
            )
        if self._arm is not None and not self._arm():
            # Never raises; a failed registration only loses this capture: the flag stays
            # closed, so hooks the caller runs itself (HookSet.take_root) take nothing either.
            return
        # The record lives on the hooks' thread-local flag: they put their plain captures
        # straight into it (see hookwatch._hooks.Gate.record).
        self.hook_flag.set(True, rows, batch, {})

    def _end_record(self, keep: bool) -> None:
        try:
            flag = self.hook_flag
            captured = flag.record
            flag.set(False)
            if captured and keep:
                self._hand_off(tuple(captured.values()))
            elif captured is not None and keep:
                # The scope opened (hooks armed) and no hook took anything: the forward ran
                # elsewhere (another thread: asyncio.to_thread, an executor) or outside it.
                self._log.warning(
                    "empty",
                    "hookwatch: model %r: a sampled request's forward captured nothing in its "
                    "scope (was the forward run in another thread, or outside `with "
                    "monitor.request()`?); the hooks see the thread that opened the scope "
                    "(docs/api.md, 'Async servers')",
                    self.model_name,
                )
        finally:
            # The hooks come off whatever happened in the forward or the hand-off.
            if self._disarm is not None:
                self._disarm()

    def _hand_off(self, record: Record) -> bool:
        if self._offer(record):
            return True
        self._tally.dropped(len(record))
        return False

    # -- the hooks' sink --------------------------------------------------------------------

    def offer(self, capture: Capture) -> bool:
        """Add to the running forward's record (a dict write, never blocks). The hooks write
        into the record themselves while a scope is open; this is the way in for a capture
        made without one."""
        record = self.hook_flag.record
        if record is None:
            # The gate was opened without a request scope: hand the capture off on its own.
            return self._hand_off((_plain(capture),))
        record[capture.layer] = _plain(capture)
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
