"""What sampled forwards cost: the request thread's time, measured from the durations of the
requests, and the capture thread's CPU for their records.

A hooked forward costs more than a plain one, and by how much differs a hundredfold between
models and devices: a few hook points on a small CPU model, against the kernel launches of a
GPU model's reductions and copies (milliseconds). A cap on the samples a second
(``max_sampled_per_s``) therefore does not bound what sampling costs; this measures the cost,
so that the default sampling can also be held to ``max_overhead`` of a worker's time.

The request path pays nothing more for it on an unsampled forward: the service reports the
duration of a sampled forward's requests here (:meth:`HookCost.answered`, which also feeds the
request-duration histogram), and every other request goes to the histogram only. At each
publish the capture thread compares the sampled forwards' mean duration with the histogram's
mean over the other requests (:meth:`HookCost.update`), and adds what the capture thread spent
on a record (:meth:`HookCost.processed`, its own CPU clock around each drain): on a machine
whose cores serve requests, that CPU is taken from them too (a ResNet-18's record has its
150,528 input pixels projected for drift there).
"""

from __future__ import annotations

import threading

from hookwatch._monitor.tally import RequestTally

__all__ = ["MIN_SAMPLED", "SMOOTHING", "WARMUP", "HookCost", "cost_share"]

#: An estimate needs this many sampled forwards: fewer wait for the next publish, where they
#: count with the ones that came since (one or two forwards' durations are mostly noise).
MIN_SAMPLED = 3
#: Weight of a new interval's estimate in the running one (an exponentially weighted mean):
#: one slow or quick interval moves the estimate by a quarter of its difference, so the share
#: follows a lasting change within a few publishes, not every interval's noise.
SMOOTHING = 0.25
#: The first sampled forwards, and the capture thread's first drain, pay what later ones do
#: not: the reductions' first kernel launches and allocations, lazy imports and lookups. Taken
#: as the cost, they start the estimate high, and a high estimate samples few forwards, so it
#: comes down slowly (one update per ``MIN_SAMPLED`` of them). On an H200 the first two hooked
#: forwards of a ResNet-18 took 49.5 ms each against ~4 ms later, and the first drain 4.3 ms a
#: record against ~0.6 ms; at batch 8, with the first 3 left out, the next 5 still averaged
#: 29 ms against ~12 ms later (docs/bench/gpu.md). These many forwards, and that drain, are
#: left out: at the default share before any estimate (10 %), the first ~100 forwards.
WARMUP = 10


class HookCost:
    """The extra seconds a sampled forward adds to its requests, the capture thread's CPU
    seconds for its record, and the mean requests per forward, each smoothed over publishes.

    ``extra`` and ``batch`` are None until a first estimate, ``capture`` until the capture
    thread has processed ``MIN_SAMPLED`` records. ``extra`` may be 0 or below (hooks that cost
    less than the noise between intervals): then only ``capture`` is there to cap.
    """

    def __init__(self, tally: RequestTally) -> None:
        self._tally = tally
        self._lock = threading.Lock()
        #: Sampled forwards since the last estimate, their requests, and the sum of their
        #: requests' durations (each request of a forward took the forward's duration).
        self._forwards = 0
        self._requests = 0
        self._seconds = 0.0
        #: The histogram's (count, sum) at the last estimate.
        self._seen = tally.durations()
        #: Sampled forwards still to leave out (``WARMUP``), and whether the first drain was.
        self._warming = WARMUP
        self._drained = False
        self.extra: float | None = None
        self.batch: float | None = None
        #: The capture thread's CPU seconds and records since its last estimate (written and
        #: read on the capture thread only), and the estimate per record.
        self._capture_s = 0.0
        self._records = 0
        self.capture: float | None = None

    def answered(self, seconds: float, count: int) -> None:
        """The request path of a sampled forward: its ``count`` requests took ``seconds``.

        Into the histogram and the sampled sums under one lock, which :meth:`update` takes to
        read both: it never sees a sampled forward in one and not yet in the other (the
        unsampled requests, which take no lock, are all in the histogram)."""
        with self._lock:
            self._tally.answered(seconds, count)
            if self._warming:
                # On neither side of the first estimate: it starts after the last of them.
                self._warming -= 1
                self._seen = self._tally.durations()
                return
            self._forwards += 1
            self._requests += count
            self._seconds += seconds * count

    def processed(self, cpu_s: float, records: int) -> None:
        """The capture thread spent ``cpu_s`` seconds of its CPU on ``records`` records (one
        per sampled forward): a drain's, measured by the capture thread. The first drain is
        left out (``WARMUP``)."""
        if not self._drained:
            self._drained = True
            return
        self._capture_s += cpu_s
        self._records += records

    def update(self) -> None:
        """Take the sampled forwards since the last estimate into the smoothed one (capture
        thread, at every publish); fewer than ``MIN_SAMPLED`` wait for the next, and so do
        fewer processed records."""
        if self._records >= MIN_SAMPLED:
            capture = self._capture_s / self._records
            self._capture_s, self._records = 0.0, 0
            self.capture = _smoothed(self.capture, capture)
        with self._lock:
            forwards, requests, seconds = self._forwards, self._requests, self._seconds
            count, total = self._tally.durations()
            plain = count - self._seen[0] - requests
            if forwards < MIN_SAMPLED or plain <= 0:
                return
            plain_s = total - self._seen[1] - seconds
            self._forwards, self._requests, self._seconds = 0, 0, 0.0
            self._seen = (count, total)
        # Means per request on both sides: sampling is per forward and blind to the batch, so
        # sampled and unsampled requests come in batches of the same sizes, and the difference
        # is what hooking adds to a forward.
        # Every interval counts, whatever the sign of its difference: dropping the negative
        # ones would bias a cost near zero upwards, and cap hooks that cost nothing.
        self.extra = _smoothed(self.extra, seconds / requests - plain_s / plain)
        self.batch = _smoothed(self.batch, requests / forwards)

    def share(self, max_overhead: float, requests_per_s: float) -> float | None:
        """The share of forwards whose hooks and records cost at most ``max_overhead`` of the
        worker's time at ``requests_per_s``; None while nothing is known or there is nothing
        to cap."""
        if self.extra is None or self.batch is None:
            return None
        return cost_share(
            max_overhead, self.extra + (self.capture or 0.0), self.batch, requests_per_s
        )


def _smoothed(estimate: float | None, value: float) -> float:
    """``value`` folded into the running ``estimate`` (exponentially weighted)."""
    return value if estimate is None else estimate + SMOOTHING * (value - estimate)


def cost_share(
    max_overhead: float, extra_s: float, batch: float, requests_per_s: float
) -> float | None:
    """The share of forwards sampled at which hooked forwards, ``extra_s`` seconds more each,
    add ``max_overhead`` of the wall time: ``max_overhead / extra_s`` hooked forwards a second,
    out of ``requests_per_s / batch`` forwards a second. None where it bounds nothing (no
    extra cost, no traffic)."""
    if extra_s <= 0.0 or requests_per_s <= 0.0:
        return None
    return (max_overhead / extra_s) * batch / requests_per_s
