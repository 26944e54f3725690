"""HTTP load generators: closed loop (N clients back to back) and open loop (a fixed rate).

Clients are threads with one keep-alive ``http.client`` connection each. The open loop measures
latency from each request's *scheduled* send time, so a server that stalls is charged for the
requests that could not be sent meanwhile (no coordinated omission).
"""

from __future__ import annotations

import http.client
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Open-loop sends that start this much after their schedule mean the clients fell behind.
LATE_S = 0.005


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    payloads: Sequence[bytes]
    content_type: str


@dataclass(frozen=True)
class Segment:
    """One measured run of one variant: what the table's ratios are made of."""

    requests: int
    errors: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    #: Requests per second offered (open loop) or None (closed loop).
    offered_rps: float | None = None
    #: Open-loop sends that started more than LATE_S after schedule.
    late: int = 0
    #: CPU time the serving worker process spent per request in the measured window (all its
    #: threads, the capture thread included), in ms; None when not measured.
    cpu_ms: float | None = None
    #: CPU time every process on the machine spent per request over the same window (client,
    #: frontend and workers alike), in ms, from /proc/stat; None where it is not readable.
    machine_cpu_ms: float | None = None
    #: Share of all cores' time busy over the window (1.0: the machine was saturated, and a
    #: variant's extra CPU then comes straight out of everyone's throughput).
    machine_busy: float | None = None
    #: Closed loop: the clients' summed request rates (see :func:`cycle_rate`); None where the
    #: count over the window is used instead.
    rate_rps: float | None = None

    @property
    def throughput_rps(self) -> float:
        if self.rate_rps is not None:
            return self.rate_rps
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @classmethod
    def of(
        cls,
        latencies_s: Sequence[float],
        errors: int,
        duration_s: float,
        offered_rps: float | None = None,
        late: int = 0,
        cpu_s: float | None = None,
        rate_rps: float | None = None,
        machine: MachineTimes | None = None,
    ) -> Segment:
        if not latencies_s:
            raise RuntimeError(
                f"expected completed requests in a {duration_s:.1f} s segment, got none "
                f"({errors} errors)"
            )
        ms = np.asarray(latencies_s, dtype=np.float64) * 1e3
        served = rate_rps * duration_s if rate_rps is not None else 0.0
        per_request = served or len(ms)
        return cls(
            requests=len(ms),
            errors=errors,
            duration_s=duration_s,
            p50_ms=float(np.percentile(ms, 50)),
            p99_ms=float(np.percentile(ms, 99)),
            mean_ms=float(ms.mean()),
            offered_rps=offered_rps,
            late=late,
            # Per request served at the measured rate: the count of requests in the window
            # would carry the same quantisation the rate avoids.
            cpu_ms=None if cpu_s is None else cpu_s * 1e3 / per_request,
            machine_cpu_ms=None if machine is None else machine.busy_s * 1e3 / per_request,
            machine_busy=None if machine is None or machine.all_s <= 0 else machine.busy,
            rate_rps=rate_rps,
        )


def cycle_rate(starts: Sequence[Sequence[float]]) -> float | None:
    """Requests per second of closed-loop clients, from each client's request start times.

    A client that started ``k`` requests at ``t_1 .. t_k`` completed ``k - 1`` cycles in
    ``t_k - t_1``; the clients' rates add up. Counting the requests that started in a fixed
    window instead is quantised by whatever the server completes together: a batching server
    that answers 8 requests every 0.5 s gives a 3 s window 48 or 56 requests, a 17 % step,
    whereas the cycle rate moves with the batch period itself. None when a client completed
    no whole cycle (the caller then counts).
    """
    total = 0.0
    for times in starts:
        if len(times) < 2 or times[-1] <= times[0]:
            return None
        total += (len(times) - 1) / (times[-1] - times[0])
    return total if starts else None


#: Reads the CPU seconds (user + system) the measured server process has used so far.
CpuClock = Callable[[], float]


@dataclass(frozen=True)
class MachineTimes:
    """Seconds of all cores' time, busy and in all, from the first line of /proc/stat."""

    busy_s: float
    all_s: float

    @property
    def busy(self) -> float:
        # Busy ticks are a subset of all ticks; in seconds, differences of sums can round a
        # whole-busy window to just above 1.
        return min(1.0, self.busy_s / self.all_s)

    def __sub__(self, other: MachineTimes) -> MachineTimes:
        return MachineTimes(self.busy_s - other.busy_s, self.all_s - other.all_s)

    @classmethod
    def parse(cls, stat: str, ticks_per_s: float) -> MachineTimes:
        """From /proc/stat's text: idle and iowait are the idle columns, the rest busy."""
        fields = stat.splitlines()[0].split()
        if fields[0] != "cpu":
            raise ValueError(f"expected the aggregate 'cpu' line of /proc/stat, got {fields[0]!r}")
        # user nice system idle iowait irq softirq steal (guest time is inside user already).
        ticks = [int(v) for v in fields[1:9]]
        idle = ticks[3] + ticks[4]
        return cls((sum(ticks) - idle) / ticks_per_s, sum(ticks) / ticks_per_s)


def machine_times() -> MachineTimes | None:
    """This machine's CPU times so far; None where /proc/stat cannot be read (not Linux)."""
    try:
        return MachineTimes.parse(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _cpu_over(
    window: tuple[float, float], clock: CpuClock | None
) -> tuple[float | None, MachineTimes | None]:
    """CPU seconds ``clock`` advances between the window's two ``perf_counter`` instants, and
    the machine's CPU times over the same window (both None without ``clock``)."""
    if clock is None:
        return None, None
    start, end = window
    time.sleep(max(0.0, start - time.perf_counter()))
    before, machine_before = clock(), machine_times()
    time.sleep(max(0.0, end - time.perf_counter()))
    after, machine_after = clock(), machine_times()
    if machine_before is None or machine_after is None:
        return after - before, None
    return after - before, machine_after - machine_before


class Client:
    """One keep-alive connection; reconnects after a failure."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        self._target = target
        self._timeout = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> bool:
        return self.status(body) == 200

    def status(self, body: bytes) -> int:
        """The response's status code; 0 when no response came (connection lost, timeout)."""
        t = self._target
        try:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(t.host, t.port, timeout=self._timeout)
            self._conn.request("POST", t.path, body, {"Content-Type": t.content_type})
            response = self._conn.getresponse()
            response.read()
            return int(response.status)
        except (OSError, http.client.HTTPException):
            self.close()
            return 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def closed_loop(
    target: Target,
    clients: int,
    duration_s: float,
    warmup_s: float = 0.0,
    timeout_s: float = 60.0,
    cpu_clock: CpuClock | None = None,
) -> Segment:
    """``clients`` threads each send the next request as soon as the last one is answered.

    Requests that start in the warm-up are not recorded. Throughput is the clients' summed
    cycle rates over the measured window (:func:`cycle_rate`), falling back to the count of
    requests started in it. With ``cpu_clock``, the server's CPU time over the window is
    divided by the requests served at that rate.
    """
    if clients < 1 or duration_s <= 0:
        raise ValueError(f"expected clients >= 1 and duration > 0, got {clients}, {duration_s}")
    start_barrier = threading.Barrier(clients + 1)
    lock = threading.Lock()
    latencies: list[float] = []
    starts: list[list[float]] = []
    errors = [0]
    window: list[float] = []

    def run(index: int) -> None:
        client = Client(target, timeout_s)
        mine: list[float] = []
        started: list[float] = []
        failed = 0
        payloads = target.payloads
        start_barrier.wait()
        measure_from, end = window
        n = index
        try:
            while True:
                t0 = time.perf_counter()
                if t0 >= end:
                    break
                ok = client.post(payloads[n % len(payloads)])
                n += clients
                if t0 >= measure_from:
                    started.append(t0)
                    if ok:
                        mine.append(time.perf_counter() - t0)
                    else:
                        failed += 1
        finally:
            client.close()
            with lock:
                latencies.extend(mine)
                starts.append(started)
                errors[0] += failed

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    now = time.perf_counter()
    window.extend((now + warmup_s, now + warmup_s + duration_s))
    start_barrier.wait()
    cpu_s, machine = _cpu_over((window[0], window[1]), cpu_clock)
    for thread in threads:
        thread.join()
    # A failed request's cycle is not a served one: the rate is scaled to the answered share.
    rate = cycle_rate(starts)
    answered = len(latencies) / (len(latencies) + errors[0]) if latencies else 0.0
    return Segment.of(
        latencies,
        errors[0],
        duration_s,
        cpu_s=cpu_s,
        rate_rps=None if rate is None else rate * answered,
        machine=machine,
    )


class Schedule:
    """An open loop's send times, shared by its sender threads: request ``i`` is due at
    ``origin + i / rate``, until ``seconds`` have passed."""

    def __init__(self, rate_rps: float, seconds: float) -> None:
        self.rate = rate_rps
        self.seconds = seconds
        #: perf_counter() of request 0, set by :meth:`start`.
        self.origin = 0.0
        self._next = itertools.count()
        self._lock = threading.Lock()

    def start(self, lead_s: float = 0.05) -> float:
        """Fix the origin ``lead_s`` from now (the senders' time to get going); returns it."""
        self.origin = time.perf_counter() + lead_s
        return self.origin

    def wait_next(self) -> tuple[int, float, float] | None:
        """Take the next request, sleep until it is due; returns its index, its offset from
        the origin and how late it goes out (seconds), or None once the schedule is over."""
        with self._lock:
            i = next(self._next)
        offset = i / self.rate
        if offset >= self.seconds:
            return None
        delay = self.origin + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return i, offset, max(0.0, -delay)


def open_loop(
    target: Target,
    rate_rps: float,
    duration_s: float,
    warmup_s: float = 0.0,
    senders: int = 32,
    timeout_s: float = 60.0,
    cpu_clock: CpuClock | None = None,
) -> Segment:
    """Send at ``rate_rps`` on a fixed schedule; latency counts from the scheduled send time."""
    if rate_rps <= 0 or duration_s <= 0 or senders < 1:
        raise ValueError(
            f"expected rate > 0, duration > 0, senders >= 1, got {rate_rps}, {duration_s}, "
            f"{senders}"
        )
    lock = threading.Lock()
    latencies: list[float] = []
    counts = [0, 0]  # errors, late
    start_barrier = threading.Barrier(senders + 1)
    schedule = Schedule(rate_rps, warmup_s + duration_s)

    def run() -> None:
        client = Client(target, timeout_s)
        mine: list[float] = []
        failed = late = 0
        payloads = target.payloads
        start_barrier.wait()
        try:
            while (slot := schedule.wait_next()) is not None:
                i, offset, lateness = slot
                if lateness > LATE_S and offset >= warmup_s:
                    late += 1
                ok = client.post(payloads[i % len(payloads)])
                if offset >= warmup_s:
                    if ok:
                        mine.append(time.perf_counter() - schedule.origin - offset)
                    else:
                        failed += 1
        finally:
            client.close()
            with lock:
                latencies.extend(mine)
                counts[0] += failed
                counts[1] += late

    threads = [threading.Thread(target=run, daemon=True) for _ in range(senders)]
    for thread in threads:
        thread.start()
    origin = schedule.start()
    start_barrier.wait()
    cpu_s, machine = _cpu_over((origin + warmup_s, origin + schedule.seconds), cpu_clock)
    for thread in threads:
        thread.join()
    return Segment.of(
        latencies,
        counts[0],
        duration_s,
        offered_rps=rate_rps,
        late=counts[1],
        cpu_s=cpu_s,
        machine=machine,
    )
