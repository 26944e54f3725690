"""Run a soak: measure capacity, hold the stack at a share of it, kill a worker, sample.

1. The native stack (TorchServe with the demo model, the exporter, Prometheus) starts.
2. Capacity: closed loop, valid requests only, for ``capacity_s``.
3. Soak: open loop at ``load`` x capacity for ``seconds``, one request in
   ``1 / bad_share`` a bad one (kinds that each answer 4xx), one worker SIGKILLed at
   ``kill_at`` of the way. Every ``sample_s`` the sampler records each TorchServe worker's and
   the exporter's RSS and open file descriptors, the metric files in the multiprocess
   directory and the series on the exporter's scrape.
4. Counts: hookwatch's and TorchServe's request counters over the soak against what was sent.

Everything lands in one JSON document; :mod:`dev.soak.report` judges and renders it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dev.bench.runner import describe_machine, scraped
from hookwatch.tools.bench.loadgen import Client, Schedule, Target, closed_loop
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import Ports, Stack

MODEL = "digits"
#: A send that goes out this much after its schedule counts as late (the senders fell behind).
LATE_S = 0.05

#: Bad requests, one of each kind in turn: what clients get wrong, each answered with a 4xx.
BAD_BODIES: tuple[tuple[str, bytes], ...] = (
    ("wrong_shape", b'{"data": [1, 2, 3]}'),
    ("not_json", b'{"data": [0, 1, '),
    ("missing_field", b'{"pixels": [0]}'),
    ("not_finite", b'{"data": [NaN' + b", 0" * 63 + b"]}"),
    ("out_of_range", b'{"data": [' + b", ".join([b"99"] * 64) + b"]}"),
    ("too_deep", b'{"data": ' + b"[" * 6 + b"1" + b"]" * 6 + b"}"),
)


@dataclass(frozen=True)
class Settings:
    seconds: float
    workers: int = 2
    #: Closed-loop capacity measurement (after a warm-up of ``capacity_warmup_s``).
    capacity_s: float = 20.0
    capacity_warmup_s: float = 5.0
    capacity_clients: int = 4
    #: Offered rate as a share of the measured capacity.
    load: float = 0.7
    #: Share of requests that are bad.
    bad_share: float = 0.05
    #: When the worker is killed, as a share of the soak.
    kill_at: float = 0.5
    sample_s: float = 5.0
    scrape_interval: str = "5s"
    senders: int = 24
    #: Left out of the flatness fits: the soak's first seconds (caches, allocator, lazily
    #: created series) and a replacement worker's first seconds.
    warmup_s: float = 60.0
    settle_s: float = 60.0
    #: Flat means, over the fitted window: RSS growing by at most this many MiB per 10 minutes
    #: per process, open descriptors by at most this many per 10 minutes.
    rss_bound_mib_per_10min: float = 5.0
    fd_bound_per_10min: float = 1.0

    @classmethod
    def full(cls, seconds: float = 600.0) -> Settings:
        return cls(seconds=seconds)

    @classmethod
    def quick(cls, seconds: float = 60.0) -> Settings:
        # One minute: fits over ~30 s are noisy, so the bounds are per minute what the full
        # soak's are per 10 minutes; the full run is the one that tells a slow leak.
        return cls(
            seconds=seconds,
            capacity_s=8.0,
            capacity_warmup_s=3.0,
            sample_s=2.0,
            scrape_interval="2s",
            warmup_s=15.0,
            settle_s=15.0,
            rss_bound_mib_per_10min=50.0,
            fd_bound_per_10min=10.0,
        )


def _proc_status(pid: int) -> tuple[float, int] | None:
    """(RSS in MiB, open file descriptors) of ``pid``, or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024, fds
    return None


class Sampler:
    """Every ``interval`` s until stopped: what each process holds and what the exporter has."""

    def __init__(self, stack: Stack, origin: float, interval: float) -> None:
        self.stack, self.origin, self.interval = stack, origin, interval
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.samples.append(self.sample())
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def sample(self) -> dict[str, Any]:
        stack = self.stack
        t = time.monotonic() - self.origin
        workers: dict[str, list[float]] = {}
        for pid in stack.worker_pids():
            held = _proc_status(pid)
            if held is not None:
                workers[str(pid)] = [round(held[0], 3), held[1]]
        exporter = _proc_status(stack.recorded_pids().get("exporter", -1))
        scrape = scraped(stack.ports.exporter, timeout=10)[1]
        files = len(list(stack.multiproc_dir.glob("*.db")))
        return {
            "t": round(t, 2),
            # A scrape under load can take seconds: a sample begun just before the kill may
            # read the files and series after it, so its phase is judged by when it ended.
            "until": round(time.monotonic() - self.origin, 2),
            "workers": workers,
            "ready": stack.ready_workers(),
            "exporter": [round(exporter[0], 3), exporter[1]] if exporter else None,
            "files": files,
            "series": sum(1 for _, labels in scrape if ("model", MODEL) in labels),
        }


@dataclass
class Traffic:
    """What the open loop sent and got, by kind."""

    statuses: dict[str, dict[int, int]]
    #: Requests that got neither their expected answer nor a 4xx: (seconds, kind, status).
    unexpected: list[tuple[float, str, int]]
    #: Per sample interval: answers, and the valid ones' latency quantiles (ms).
    per_interval: list[dict[str, float]]
    late: int
    latency_ms: dict[str, float]


def _open_loop(
    target: Target,
    bad: Sequence[bytes],
    rate: float,
    seconds: float,
    bad_every: int,
    senders: int,
    origin: float,
    interval: float,
    at: Callable[[float], None],
) -> Traffic:
    """Send at ``rate`` on a fixed schedule (request ``i`` is bad when ``i % bad_every`` is
    the last of its cycle); ``at(seconds)`` is called by one sender as time passes, for the
    kill. Latency counts from the scheduled send time."""
    schedule = Schedule(rate, seconds)
    lock = threading.Lock()
    statuses: dict[str, Counter[int]] = {"valid": Counter(), "bad": Counter()}
    unexpected: list[tuple[float, str, int]] = []
    answered: Counter[int] = Counter()
    latencies: dict[int, list[float]] = defaultdict(list)
    late = [0]
    barrier = threading.Barrier(senders + 1)
    failures: list[BaseException] = []

    def run(index: int) -> None:
        client = Client(target, 60.0)
        barrier.wait()
        try:
            while (slot := schedule.wait_next()) is not None:
                i, offset, lateness = slot
                if index == 0:
                    at(schedule.origin + offset - origin)
                is_bad = i % bad_every == bad_every - 1
                payloads = target.payloads
                body = bad[(i // bad_every) % len(bad)] if is_bad else payloads[i % len(payloads)]
                status = client.status(body)
                done = time.perf_counter()
                kind = "bad" if is_bad else "valid"
                ok = 400 <= status < 500 if is_bad else status == 200
                slot_index = int((done - origin) // interval)
                with lock:
                    late[0] += int(lateness > LATE_S)
                    statuses[kind][status] += 1
                    answered[slot_index] += 1
                    if not ok:
                        unexpected.append((round(done - origin, 2), kind, status))
                    elif not is_bad:
                        latencies[slot_index].append((done - schedule.origin - offset) * 1e3)
        except BaseException as error:  # re-raised below: a sender lost is a broken soak
            failures.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(senders)]
    for thread in threads:
        thread.start()
    schedule.start()
    barrier.wait()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    every = [x for xs in latencies.values() for x in xs]
    per_interval = []
    # Whole intervals only: the last one's tail is past the soak's end.
    end = schedule.origin - origin + seconds
    for slot in sorted(k for k in answered if (k + 1) * interval <= end):
        xs = latencies.get(slot, [])
        per_interval.append(
            {
                "t": slot * interval,
                "answered_per_s": answered[slot] / interval,
                "p50_ms": float(np.percentile(xs, 50)) if xs else float("nan"),
                "p99_ms": float(np.percentile(xs, 99)) if xs else float("nan"),
            }
        )
    return Traffic(
        statuses={k: dict(v) for k, v in statuses.items()},
        unexpected=sorted(unexpected),
        per_interval=per_interval,
        late=late[0],
        latency_ms={
            "p50": float(np.percentile(every, 50)),
            "p99": float(np.percentile(every, 99)),
            "max": float(max(every)),
        },
    )


def _counts(stack: Stack) -> dict[str, float]:
    """hookwatch's request counters (exporter) and TorchServe's, once two reads agree."""

    def read() -> dict[str, float]:
        ours = scraped(stack.ports.exporter, timeout=5)[1]
        theirs = scraped(stack.ports.metrics, timeout=5)[1]

        def total(samples: dict[Any, float], name: str, label: str) -> float:
            return sum(v for (n, lab), v in samples.items() if n == name and (label, MODEL) in lab)

        return {
            "hookwatch_requests": total(ours, "hookwatch_requests_total", "model"),
            "hookwatch_rejected": total(ours, "hookwatch_requests_rejected_total", "model"),
            "torchserve_requests": total(theirs, "ts_inference_requests_total", "model_name"),
        }

    # Published every flush_interval_s (1 s): two equal reads 2.5 s apart are final.
    last = read()
    for _ in range(20):
        time.sleep(2.5)
        now = read()
        if now == last:
            return now
        last = now
    return last


def run(
    root: Path, settings: Settings, work: Path, ports: Ports, say: Any = print
) -> dict[str, Any]:
    """Run the soak; returns its JSON document."""
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    stack = Stack(
        root=root,
        run_dir=work / "run",
        ports=ports,
        workers=settings.workers,
        scrape_interval=settings.scrape_interval,
    )
    split = load_split()
    valid = [json.dumps({"data": x.tolist()}).encode() for x in split.x_test]
    bad_every = round(1 / settings.bad_share)
    try:
        say(f"starting the stack ({settings.workers} workers) ...")
        stack.start_torchserve()
        stack.start_exporter()
        stack.start_prometheus()
        target = Target(
            "127.0.0.1", ports.inference, f"/predictions/{MODEL}", valid, "application/json"
        )
        say(
            f"capacity: closed loop, {settings.capacity_clients} clients, {settings.capacity_s:g} s"
        )
        capacity = closed_loop(
            target,
            settings.capacity_clients,
            settings.capacity_s,
            warmup_s=settings.capacity_warmup_s,
        )
        before = _counts(stack)
        rate = settings.load * capacity.throughput_rps
        total = int(rate * settings.seconds)
        say(
            f"capacity {capacity.throughput_rps:.0f} requests/s; soaking at {rate:.0f}/s for "
            f"{settings.seconds:g} s ({total} requests, 1 in {bad_every} bad)"
        )
        origin = time.perf_counter()
        mono_origin = time.monotonic()
        sampler = Sampler(stack, mono_origin, settings.sample_s)
        sampler.start()
        kill: dict[str, Any] = {}

        def at(seconds: float) -> None:
            if not kill and seconds >= settings.kill_at * settings.seconds:
                victim = stack.worker_pids()[0]
                # Read before the signal: a sample that ended before this saw no kill.
                t = time.monotonic() - mono_origin
                os.kill(victim, signal.SIGKILL)
                kill.update({"t": round(t, 2), "pid": victim})
                say(f"killed worker {victim} at {kill['t']:.0f} s")

        traffic = _open_loop(
            target,
            [body for _, body in BAD_BODIES],
            rate,
            settings.seconds,
            bad_every,
            settings.senders,
            origin,
            settings.sample_s,
            at,
        )
        sampler.stop()
        after = _counts(stack)
    finally:
        stack.stop()
    replaced = next(
        (
            s["t"]
            for s in sampler.samples
            if kill and s["t"] > kill["t"] and kill_done(s, kill, settings)
        ),
        None,
    )
    return {
        "settings": asdict(settings),
        "machine": describe_machine(),
        "started": started,
        "capacity": {
            "clients": settings.capacity_clients,
            "seconds": settings.capacity_s,
            "requests_per_s": capacity.throughput_rps,
            "p50_ms": capacity.p50_ms,
            "p99_ms": capacity.p99_ms,
            "errors": capacity.errors,
        },
        "offered_per_s": rate,
        "bad_every": bad_every,
        "bad_kinds": [name for name, _ in BAD_BODIES],
        "kill": {**kill, "replaced_t": replaced},
        "traffic": asdict(traffic),
        "counts_before": before,
        "counts_after": after,
        "samples": sampler.samples,
    }


def kill_done(sample: dict[str, Any], kill: dict[str, Any], settings: Settings) -> bool:
    """A sample after the kill in which the victim is gone and every worker is ready again."""
    return str(kill["pid"]) not in sample["workers"] and sample["ready"] == settings.workers
