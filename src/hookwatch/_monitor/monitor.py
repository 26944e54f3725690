"""One model's monitor: the request gate, the hooks, the capture thread, processor, publisher.

Request path (:meth:`Monitor.request` and the hooks): see :mod:`hookwatch._monitor.gate`.
Capture path (the :class:`~hookwatch._capture.CaptureWorker` thread): drains records into the
:class:`~hookwatch._monitor.processor.CaptureProcessor`, and on every tick hands a snapshot to
the :class:`~hookwatch._monitor.publisher.Publisher`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from types import TracebackType

import torch
from torch import nn

from hookwatch._capture import CaptureWorker, RateLimitedLog
from hookwatch._config import MonitoringConfig
from hookwatch._drift import DriftTracker
from hookwatch._hooks import (
    HookSet,
    HookState,
    WatchPlan,
    describe_model,
    has_compiled_parts,
)
from hookwatch._metrics import MetricSet, default_metrics
from hookwatch._monitor.cost import HookCost
from hookwatch._monitor.gate import Record, RequestGate, RequestScope
from hookwatch._monitor.path import RequestPath
from hookwatch._monitor.processor import CaptureProcessor, yield_gil
from hookwatch._monitor.publisher import Publisher, Snapshot
from hookwatch._monitor.tally import RequestCounts, RequestTally, whole_requests
from hookwatch._names import ALL_LAYERS, OUTPUT_LAYER, unit_layers
from hookwatch._views import ClassSlots

__all__ = ["DRAIN_BATCH", "DRAIN_GAP_S", "Monitor", "ReceivedRequests"]

log = logging.getLogger("hookwatch")

#: The capture thread checks the buffer this often: its work (numpy, drift windows) then comes
#: in batches, not per request, and each drain lets the GIL go between its layers and
#: detectors. The default buffer holds 1024 sampled forwards, far more than arrive in one gap.
DRAIN_GAP_S = 0.05
#: ... and drains once this many sampled forwards wait (or a publish is due). A drain has a
#: fixed cost well above its cost per record (`make bench-drain`; the figures are in
#: docs/bench/README.md, "Figures behind the code's constants"): at the default sampling a
#: drain every gap would hold a handful of records and spend most of its time on the fixed part,
#: and at 100 % a drain of 64 still spent a fifth of its time on it. Larger drains hold the GIL
#: longer per step (a step's work grows with the records), which MAX_DRAIN bounds.
DRAIN_BATCH = 128
#: ... or, while requests keep coming, once the oldest has waited this long; an idle worker
#: drains at its next publish. A publish used to drain whatever waited: at the default
#: sampling's few records a second, each drain paid its fixed part (a numpy call per
#: statistic, layer and detector; ~13 ms of the capture thread's CPU for the demo CNN) for
#: a handful of records, and the capture thread spent ~2-3 % of a core on a served worker
#: whatever its traffic (docs/bench/README.md, "What was profiled and changed", 17). Drift
#: windows take tens of records to fill at these rates, and scrapes come every 15 s or more:
#: a few seconds' wait changes no verdict and no panel.
DRAIN_MAX_WAIT_S = 5.0


#: While requests are being served, the capture thread waits this long between the steps of
#: a drain (:meth:`Monitor._pace`); "being served": a forward within the last ``ACTIVE_S``.
#: Long enough that a request meets few steps of a drain, short enough that a paced drain
#: still keeps up with busy traffic before the half-full rule ends the pacing; chosen by
#: same-run A/Bs of the served p99 (docs/bench/README.md, "Figures behind the code's
#: constants").
STEP_GAP_S = 0.010
ACTIVE_S = 0.1


class Monitor:
    """Watches one model. Build with :func:`hookwatch.watch`; :meth:`close` when done::

        monitor: hookwatch.Monitor = hookwatch.watch(model, {"layers": ["act"]}, "tabular")
        with monitor.request(len(batch)):
            logits = model(batch)

    Serve each forward pass inside ``with monitor.request(batch_size):``; count requests
    turned away before the forward with :meth:`reject`. Also a context manager that closes.
    A server that counts requests as they arrive calls :meth:`receive` first, and serves
    them with what it returns; :meth:`answered` feeds the request-duration histogram.

    Public: :meth:`request`, :meth:`reject`, :meth:`receive`, :meth:`answered`, :meth:`flush`,
    :meth:`close`, and the read-only ``config`` (the resolved :class:`MonitoringConfig`) and
    ``model_name``. Everything with a leading underscore (the request gate, the hooks, the
    capture thread, its processor and publisher) is private.
    """

    def __init__(
        self,
        model: nn.Module,
        plan: WatchPlan,
        model_name: str | None = None,
        metrics: MetricSet | None = None,
        drift: DriftTracker | None = None,
        load_faults: int = 0,
    ) -> None:
        if not isinstance(plan, WatchPlan):
            got = type(plan).__name__
            raise TypeError(f"expected a WatchPlan (plan_watch(model, config, name)), got {got}")
        if model_name not in (None, plan.model_name):
            raise ValueError(
                f"expected model_name {plan.model_name!r} (the plan's), got {model_name!r}"
            )
        plan.check(model)
        config, model_name = plan.config, plan.model_name
        note = describe_model(model)
        if note is not None and config.enabled:
            log.info("hookwatch: model %r is %s", model_name, note)
        self.config = config
        self.model_name = model_name
        #: The process the monitor (and its capture thread) was made in: a fork has neither.
        self._pid = os.getpid()
        self._metrics = metrics if metrics is not None else default_metrics()
        drift = drift if config.enabled else None
        if drift is not None:
            drift.choose_fleet(config.drift.fleet_detectors, config.drift.fleet_features)
            drift.page_budget_s = config.drift.false_page_days * 86400.0
        self._drift = drift
        #: Faults found while loading (a profile that could not be used), counted with the
        #: capture thread's under ``layer="all"``.
        self._load_faults = load_faults
        # Read on the thread that builds the monitor, which is the one that serves it in
        # TorchServe (after the handler applied torch_threads): see _match_torch_threads.
        self._torch_threads = torch.get_num_threads()
        self._worker: CaptureWorker[Record] = CaptureWorker(
            config.queue_size,
            self._process,
            self._publish,
            config.flush_interval_s,
            poll_s=DRAIN_GAP_S,
            min_batch=DRAIN_BATCH,
            on_off=self._capture_off,
            on_start=self._match_torch_threads,
            may_wait=self._traffic_since_asked,
            max_wait_s=DRAIN_MAX_WAIT_S,
        )
        #: Every request count, from every phase; the one writer of them.
        self._tally = RequestTally(model_name, self._metrics)
        self._gate = RequestGate(
            model_name,
            config.share,
            self._worker.offer,
            self._tally,
            config.enabled,
            config.seed,
            config.sample_cap,
        )
        self._received = ReceivedRequests(self._gate, self._tally)
        #: What sampled forwards add to their requests' durations (the cost cap).
        self._cost = HookCost(self._tally)
        self._hooks = HookSet(
            self._gate.hook_flag, self._gate, config.max_features, config.copy_limit
        )
        widths = drift.feature_widths() if drift is not None else {}
        if config.output.head == "logits":
            # Softmax, confidence and entropy need every class's logit, not max_features.
            widths[OUTPUT_LAYER] = config.drift.projection_width
        classes = _class_slots(config, drift)
        self._processor = CaptureProcessor(
            model_name,
            config.max_features,
            drift,
            widths,
            on_layer_off=self._hooks.disable,
            units=dict.fromkeys(unit_layers(config.watched), config.max_units)
            if config.max_units
            else {},
            classes=classes,
            pause=self._pace,
        )
        self._publisher = Publisher(self._metrics, model_name)
        self._classes = classes
        #: True once the count file exists and every series is declared (see _setup_metrics).
        self._metrics_ready = False
        self._setup_lock = threading.Lock()
        #: What :meth:`_serving` last saw of the request count, when, and when it last saw it
        #: move (the capture thread's own state: the request path writes no clock).
        self._seen = 0
        self._looked_at = float("-inf")
        self._moved_at = float("-inf")
        #: The request count when the capture thread last asked whether records may wait.
        self._asked_seen = 0
        #: The request count and the time when the sampling cap was last re-decided.
        self._rate_from: tuple[int, float] | None = None
        self._cap_lock = threading.Lock()  # a flush publishes from the caller's thread too
        self._log = RateLimitedLog(log)
        if config.enabled:
            # A compiled model guards its graphs on the hooks of its modules: registering
            # them per sampled forward would recompile (and past torch's recompile limit run
            # that part eagerly from then on), so there they stay registered. So for a model
            # with a compiled part too, not only a compiled whole.
            on_demand = config.hooks == "sampled" and not has_compiled_parts(model)
            self._hooks.attach(
                model,
                config.layers,
                config.capture_input,
                config.capture_output,
                widths=widths,
                output_select=config.output.select,
                mask=config.mask,
                on_demand=on_demand,
                output_head=config.output.head,
                output_probabilities=config.output.probabilities,
                output_items=config.output.items,
                output_steps=config.output.steps,
            )
            if on_demand:
                self._gate.arm_with(self._hooks.arm, self._hooks.disarm, self._hooks.hold)
        try:
            self._setup_metrics()
        except OSError as error:
            # An unwritable or full metrics directory must not fail the model's load: serve,
            # count in memory, and retry on every publish until the files can be written.
            self._log.warning(
                "metrics",
                "hookwatch: cannot write the metric files of model %r (%s: %s); serving on, "
                "counting in memory and retrying every %g s (hookwatch_metrics_dir_writable 0 "
                "on the exporter)",
                model_name,
                type(error).__name__,
                error,
                config.flush_interval_s,
            )
        self._worker.start()

    def _setup_metrics(self) -> None:
        """Create the request path's count file and declare every series, once.

        Where worker files are written, the request counts go to a file of their own as they
        happen (they survive SIGKILL); what the tally counted before the file existed goes in
        with it. Elsewhere (one process, one registry) the tally adds them every publish.
        Raises OSError while the metrics directory cannot take the files.
        """
        if self._metrics_ready:
            return
        # flush() publishes from the caller's thread too: one count file, never two.
        with self._setup_lock:
            if self._metrics_ready:
                return
            self._tally.declare()
            self._publisher.declare(
                self.config.watched if self.config.enabled else (),
                self._worker.capacity,
                self._drift,
                self._classes,
            )
            self._metrics_ready = True

    # -- request path -----------------------------------------------------------------------

    def receive(self, count: int) -> ReceivedRequests:
        """Count ``count`` requests as they arrive, before decoding them: a server that does
        this at its entry loses no count to a crash later on. Serve them with what it returns,
        whose ``request`` and ``reject`` count them no second time::

            received = monitor.receive(len(bodies))
            with received.request(len(batch)):
                logits = model(batch)
        """
        self._tally.received(count)
        return self._received

    def request(self, batch_size: int = 1, sizes: Sequence[int] | None = None) -> RequestScope:
        """Count the requests of this forward pass and decide which are captured: each of
        ``batch_size`` rows is a request, or ``sizes`` gives each request's rows::

            with monitor.request(len(batch)):
                logits = model(batch)
        """
        if os.getpid() != self._pid:
            self._forked()
        scope = self._gate.request(batch_size, sizes)
        self._tally.served(scope.requests, scope.picked)
        return scope

    def _forked(self) -> None:
        """A monitor made before a fork (``gunicorn --preload``): the child has no capture
        thread, so its sampled captures fill the buffer and drop. Said, not silent."""
        self._log.warning(
            "forked",
            "hookwatch: model %r: this monitor was made in process %d and serves in %d, a "
            "fork, where its capture thread does not run: captures are dropped. Make the "
            "monitor in each worker (after the fork: no --preload, or in the app's startup)",
            self.model_name,
            self._pid,
            os.getpid(),
        )

    def reject(self, count: int = 1, reason: str = "other") -> None:
        """Count requests answered with a 4xx before any forward pass, and why (one of
        ``REJECT_REASONS``: the reject counter's ``reason`` label)::

            monitor.reject(1, "wrong_shape")
        """
        count = whole_requests(count, "count")
        self._tally.rejected(count, reason)  # an unknown reason raises before any count
        self._tally.received(count)

    def answered(self, seconds: float, count: int = 1) -> None:
        """Record that ``count`` requests were answered ``seconds`` after they were received:
        the request-duration histogram (``hookwatch_request_duration_seconds``)::

            monitor.answered(time.perf_counter() - arrived)
        """
        self._tally.answered(seconds, count)

    def _answered_sampled(self, seconds: float, count: int) -> None:
        """:meth:`answered` for the requests of a sampled forward (the service's, which knows
        which forwards were sampled): their durations also measure what sampling costs, which
        the default sampling is capped by (``max_overhead``). A ``sample_rate`` that is set
        has no cap: its sampled forwards (every one at 1) skip the measure and its lock."""
        if self.config.sample_cap is None:
            self._tally.answered(seconds, count)
        else:
            self._cost.answered(seconds, count)

    def _request_path(self) -> RequestPath:
        """The calls of a server that counts its requests on arrival, bound once (the service
        binds them when it is built): an unsampled batch makes one Python call and one C call
        for monitoring (:class:`~hookwatch._monitor.path.RequestPath`). In situ each Python
        call costs several times its cost in a loop (docs/bench/request.md).

        The server also holds each forward's input and output: it hands them to the model's
        own hooks itself (:meth:`HookSet.take_root`), so a sampled forward registers hooks on
        the watched layers only. Call it once, before serving."""
        take_input, take_output = self._hooks.take_root()
        return RequestPath(
            self._tally,
            self._gate,
            self._received,
            # Only the cost cap needs a sampled forward's duration apart from the others.
            self._answered_sampled if self.config.sample_cap is not None else None,
            take_input,
            take_output,
        )

    def _counts(self) -> RequestCounts:
        """Request counts so far (also before they are published)."""
        return self._tally.counts()

    # -- capture path -----------------------------------------------------------------------

    def _match_torch_threads(self) -> None:
        """Give the capture thread the serving thread's intra-op thread count.

        torch's thread count is partly per thread: a new thread's matrix products (MKL) size
        their OpenMP team to every core, whatever ``torch.set_num_threads`` said on the serving
        thread. A drain's projection then ran on a second, spinning OpenMP thread that took a
        core from serving (measured on a served text model: docs/bench/README.md, "Figures
        behind the code's constants"). The count is the one the serving thread
        already had: the process-wide default that ``set_num_threads`` also stores was that
        count already, or is now the count a new thread would have got anyway.
        """
        torch.set_num_threads(self._torch_threads)

    def _pace(self) -> None:
        """The capture thread's pause between the steps of a drain (a layer's statistics, its
        drift windows, each detector): ``STEP_GAP_S`` while requests are being served, else
        just long enough to let go of the GIL.

        The capture thread and the request thread share one GIL, and the request thread gives
        it up at every torch operation of its forward: a step that runs then keeps it, and
        the request waits for the step, once per operation. Spread out, the steps of a drain
        meet fewer requests, and each of them one step at most; the drain takes longer in
        wall time, not in CPU. An idle server (no request for ``ACTIVE_S``) is not paced,
        nor is a buffer more than half full: a server with no gaps would otherwise fill it
        and drop.
        """
        if self._serving() and self._worker.depth * 2 <= self._worker.capacity:
            time.sleep(STEP_GAP_S)
        else:
            yield_gil()

    def _serving(self) -> bool:
        """Whether a request came within ``ACTIVE_S``, as far as the capture thread can tell.

        The request path keeps no clock for this (a clock read per request was part of what
        an unsampled request cost): the capture thread compares the request count with what
        it saw at its last look. A count that moved since a look less than ``ACTIVE_S`` ago
        means a request since then; one that moved since an older look says nothing of when,
        and is not taken as serving (at most the first step of a drain goes unpaced).
        """
        now = time.monotonic()
        seen = self._tally.requests_seen
        if seen != self._seen:
            if now - self._looked_at < ACTIVE_S:
                self._moved_at = now
            self._seen = seen
        self._looked_at = now
        return now - self._moved_at < ACTIVE_S

    def _traffic_since_asked(self) -> bool:
        """Whether requests came since the capture thread last asked (its ``may_wait``, at a
        publish with few records waiting): then more records will, and these may wait."""
        seen = self._tally.requests_seen
        moved, self._asked_seen = seen != self._asked_seen, seen
        return moved

    def _process(self, records: list[Record]) -> None:
        if self.config.sample_cap is None:
            self._processor.process(records)
            return
        # The cost cap counts the capture thread's CPU too (its own clock: the drain's pauses
        # are not in it).
        started = time.thread_time()
        self._processor.process(records)
        self._cost.processed(time.thread_time() - started, len(records))

    def _capture_off(self) -> None:
        """The capture thread gave up processing: stop sampling and switch every hook off,
        so requests pay nothing for captures that would only be discarded."""
        self._gate.sample_rate = 0.0
        for layer in self._hooks.layer_states():
            self._hooks.disable(layer)

    def _cap_sampling(self) -> None:
        """Hold the default sampling to ``max_sampled_per_s`` requests a second
        (``MonitoringConfig.sample_cap``) and to ``max_overhead`` of the worker's time: from
        the requests counted since the last publish, the share that samples at most that many
        a second and whose hooked forwards add at most that share of time, never above the
        configured share. Runs on the capture thread at every publish; the gate takes a new
        share from its next forward.

        The count cap counts requests, not forwards: the gate samples forwards at the share
        and captures all of a sampled forward's requests, so the share is also each request's
        chance of capture and requests a second times the share is what is sampled a second
        on average, whatever the batches (the samples come a batch at a time, and the gate's
        bucket holds the cap against a run of them). The cost cap counts hooked forwards,
        which is what costs: see :class:`~hookwatch._monitor.cost.HookCost`."""
        cap = self.config.sample_cap
        if cap is None or self._worker.off:  # capture off for good stays off
            return
        with self._cap_lock:
            now, seen = time.monotonic(), self._tally.requests_seen
            last, self._rate_from = self._rate_from, (seen, now)
            self._cost.update()
        if last is None or now <= last[1] or seen == last[0]:
            # No request since the last look: nothing to decide from, and the share stays. Set
            # back to the configured share, a burst after each quiet spell would be sampled at
            # it until the next publish, past the cost cap (the gate's bucket holds the count
            # cap only).
            return
        per_s = (seen - last[0]) / (now - last[1])
        share = self.config.share
        rate = share if per_s * share <= cap else cap / per_s
        cost = self._cost.share(self.config.max_overhead, per_s)
        if cost is not None:
            rate = min(rate, cost)
        current = self._gate.sample_rate
        # Re-set only on a real change: each set restarts the countdown (harmless, not free).
        if abs(rate - current) > 0.05 * max(rate, current):
            self._gate.sample_rate = rate

    def _publish(self) -> None:
        self._cap_sampling()
        # Until the metric files exist, nothing is published (the counts wait in the tally).
        self._setup_metrics()
        self._tally.publish()
        faults = self._gate.hook_faults()
        for layer, count in self._processor.faults.items():
            faults[layer] = faults.get(layer, 0) + count
        # The capture thread's own faults, the mask pre-hook's (no single layer's) and the
        # profile load's.
        faults[ALL_LAYERS] = faults.get(ALL_LAYERS, 0) + self._worker.faults + self._load_faults
        self._publisher.publish(
            Snapshot(
                processed=self._processor.take(),
                queue_depth=self._worker.depth,
                faults=faults,
                layers_enabled={
                    layer: state is HookState.ATTACHED
                    for layer, state in self._hooks.layer_states().items()
                },
            )
        )

    # -- lifecycle --------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every accepted capture is processed, then publish (tests, shutdown).

        False when it timed out, or when the metric files cannot be written yet (the capture
        thread's next publish retries, and counts the fault)::

            assert monitor.flush(timeout=10)
        """
        idle = self._worker.wait_idle(timeout)
        try:
            self._publish()
        except OSError:
            return False
        return idle

    def close(self) -> None:
        """Detach the hooks, process what is queued, publish once more, stop the thread.

        Idempotent; ``with hookwatch.watch(...) as monitor:`` calls it::

            monitor.close()
        """
        self._hooks.detach()
        self._worker.stop()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ReceivedRequests:
    """What :meth:`Monitor.receive` returns: requests counted on arrival, served or turned away
    here without being counted again. One per monitor, whatever the batch."""

    __slots__ = ("_gate", "_tally")

    def __init__(self, gate: RequestGate, tally: RequestTally) -> None:
        self._gate = gate
        self._tally = tally

    def request(self, batch_size: int = 1, sizes: Sequence[int] | None = None) -> RequestScope:
        """:meth:`Monitor.request` for received requests: decides which are captured."""
        return self._gate.request(batch_size, sizes, True)

    def reject(self, count: int = 1, reason: str = "other") -> None:
        """:meth:`Monitor.reject` for received requests: counts why they were turned away."""
        self._tally.rejected(whole_requests(count, "count"), reason)


def _class_slots(config: MonitoringConfig, drift: DriftTracker | None) -> ClassSlots | None:
    """The classes with statistics of their own: the ``max_classes`` predicted most often on
    the reference (the profile's class mix), else the first ones; None without logits."""
    if not (config.max_classes and config.capture_output and config.output.head == "logits"):
        return None
    mix = drift.references.get("class_mix") if drift is not None else None
    if mix is None:
        return ClassSlots.by_frequency(None, config.max_classes)
    if mix.categories:
        # Many classes: the profile already keeps the most frequent ones, most frequent first.
        return ClassSlots.tracked(sorted(mix.categories[: config.max_classes]))
    return ClassSlots.by_frequency([int(c) for c in mix.counts[0]], config.max_classes)


Monitor.__module__ = "hookwatch"  # public as hookwatch.Monitor (reprs, tracebacks)
