"""What sampled forwards cost the request thread, measured from the durations of the requests.

A hooked forward costs more than a plain one, and by how much differs a hundredfold between
models and devices: a few hook points on a small CPU model, against the kernel launches of a
GPU model's reductions and copies (milliseconds). A cap on the samples a second
(``max_sampled_per_s``) therefore does not bound what sampling costs; this measures the cost,
so that the default sampling can also be held to ``max_overhead`` of a worker's time.

The request path pays nothing more for it on an unsampled forward: the service reports the
duration of a sampled forward's requests here (:meth:`HookCost.answered`, which also feeds the
request-duration histogram), and every other request goes to the histogram only. At each
publish the capture thread compares the sampled forwards' mean duration with the histogram's
mean over the other requests (:meth:`HookCost.update`).
"""

from __future__ import annotations

import threading

from hookwatch._monitor.tally import RequestTally

__all__ = ["MIN_SAMPLED", "SMOOTHING", "HookCost", "cost_share"]

#: An estimate needs this many sampled forwards: fewer wait for the next publish, where they
#: count with the ones that came since (one or two forwards' durations are mostly noise).
MIN_SAMPLED = 3
#: Weight of a new interval's estimate in the running one (an exponentially weighted mean):
#: one slow or quick interval moves the estimate by a quarter of its difference, so the share
#: follows a lasting change within a few publishes, not every interval's noise.
SMOOTHING = 0.25


class HookCost:
    """The extra seconds a sampled forward adds to its requests, and the mean requests per
    forward, both smoothed over publishes.

    ``extra`` and ``batch`` are None until a first estimate. ``extra`` may be 0 or below
    (hooks that cost less than the noise between intervals): then there is nothing to cap.
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
        self.extra: float | None = None
        self.batch: float | None = None

    def answered(self, seconds: float, count: int) -> None:
        """The request path of a sampled forward: its ``count`` requests took ``seconds``.

        Into the histogram and the sampled sums under one lock, which :meth:`update` takes to
        read both: it never sees a sampled forward in one and not yet in the other (the
        unsampled requests, which take no lock, are all in the histogram)."""
        with self._lock:
            self._tally.answered(seconds, count)
            self._forwards += 1
            self._requests += count
            self._seconds += seconds * count

    def update(self) -> None:
        """Take the sampled forwards since the last estimate into the smoothed one (capture
        thread, at every publish); fewer than ``MIN_SAMPLED`` wait for the next."""
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
        extra = seconds / requests - plain_s / plain
        batch = requests / forwards
        if self.extra is None or self.batch is None:
            self.extra, self.batch = extra, batch
        else:
            # Every interval counts, whatever the sign of its difference: dropping the
            # negative ones would bias a cost near zero upwards, and cap hooks that cost
            # nothing.
            self.extra += SMOOTHING * (extra - self.extra)
            self.batch += SMOOTHING * (batch - self.batch)

    def share(self, max_overhead: float, requests_per_s: float) -> float | None:
        """The share of forwards whose hooks cost at most ``max_overhead`` of the worker's
        time at ``requests_per_s``; None while nothing is known or there is nothing to cap."""
        if self.extra is None or self.batch is None:
            return None
        return cost_share(max_overhead, self.extra, self.batch, requests_per_s)


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
