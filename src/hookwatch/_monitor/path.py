"""The request path of a server that counts its requests on arrival (the service's): what every
served batch pays for monitoring, in as few Python frames as it can be.

An unsampled batch makes one Python call here, :meth:`RequestPath.arrived`, which counts its
requests and moves the sampling countdown, and one C call with its answer (its duration
appended to :attr:`RequestPath.durations`, binned later by the capture thread). A batch that is
due to be sampled also calls :attr:`RequestPath.decide` after decoding (the gate's full
decision: the per-second cap, the rows of a partial capture), :attr:`RequestPath.sampled`
once its forward has run, and, answered, :attr:`RequestPath.answered_sampled` (the cost cap's
measure).

In situ each Python frame on this path costs several times what it costs in a loop: the code
is cold between a JSON decode and a forward, and every bytecode of it is a dispatch the branch
predictor has not seen lately (docs/bench/request.md counts them). So :meth:`arrived` does in
one frame what :meth:`RequestTally.received` and the fast path of :meth:`RequestGate.request`
do in two, reading their state directly; each of those stays the one definition of its part
for every other caller, and tests hold the copies to them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hookwatch._monitor.gate import RequestGate, RequestScope
from hookwatch._monitor.tally import RequestTally

if TYPE_CHECKING:
    from hookwatch._monitor.monitor import ReceivedRequests

__all__ = ["RequestPath"]


class RequestPath:
    """One monitor's request path, bound once by the service that serves with it.

    Per batch: ``due = path.arrived(len(bodies))`` on arrival (before decoding: a worker
    killed later has counted them); if ``due``, ``scope = path.decide(rows, sizes)``
    before the forward, and the forward runs in ``scope`` when ``scope.picked``, then
    ``path.sampled(scope.picked)`` if it did not raise (a batch whose forward raised is
    captured by nobody, so it is not counted as sampled); with the answers,
    ``path.durations.append((seconds, count))``, or, after a sampled forward when it is not
    None (the cost cap measures those apart), ``path.answered_sampled(seconds, count)``.
    Rejects go through ``path.received``.

    Inside a sampled forward's scope, ``path.take_input(inputs)`` before the forward and
    ``path.take_output(output)`` after it, each when not None: the model's own input and
    output hooks, handed to the server (the model carries no hook of ours then).
    """

    __slots__ = (
        "_gate",
        "_tally",
        "answered_sampled",
        "decide",
        "durations",
        "hook_flag",
        "received",
        "sampled",
        "take_input",
        "take_output",
    )

    def __init__(
        self,
        tally: RequestTally,
        gate: RequestGate,
        received: ReceivedRequests,
        answered_sampled: Callable[[float, int], None] | None,
        take_input: Callable[[Any], None] | None = None,
        take_output: Callable[[Any], None] | None = None,
    ) -> None:
        self._tally = tally
        self._gate = gate
        self.received = received
        self.decide: Callable[[int, Sequence[int] | None], RequestScope] = gate.decide
        self.sampled: Callable[[int], None] = tally.sampled
        self.durations: deque[tuple[float, int]] = tally.pending
        self.answered_sampled = answered_sampled
        self.take_input = take_input
        self.take_output = take_output
        #: The hooks' thread-local gate: a server that pads a batch gives it the steps'
        #: mask inside a sampled scope (:func:`hookwatch._hooks.read_mask`).
        self.hook_flag = gate.hook_flag

    def arrived(self, count: int) -> bool:
        """Count ``count`` requests as received, and say whether their forward is due to be
        sampled (then :attr:`decide` decides, after decoding); one that is not has taken its
        step of the countdown here, and needs nothing more before its forward.

        The countdown counts batches as they arrive: one whose every request fails decoding
        takes a step too (its forward would have been sampled at the rate like any other).
        """
        tally = self._tally
        cells = tally._cells
        if cells is not None:
            # RequestTally.received, inlined (its docstring: lock-free, SIGKILL-proof).
            cells[tally._at_requests] += count
        else:
            tally.received(count)
        # RequestGate.request's fast path, inlined: a rate just set, a pinned rate of 1 and
        # the last step of the countdown all leave ``_skip`` below 1 (the full decision).
        gate = self._gate
        skip = gate._skip
        if skip >= 1:
            gate._skip = skip - 1
            return False
        return True
