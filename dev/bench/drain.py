"""In-process cost of 100 % sampling with drift on: request thread, capture thread, drains.

Serves the demo digits CNN from its ``.mar`` (model, ``model-config.yaml`` and drift profile,
loaded through :meth:`ModelService.from_handler_config` as a TorchServe worker loads them) at
``sample_rate: 1.0``, alternating rounds of requests with an unmonitored twin, and reports

* the request thread's cost per forward (wall and CPU, monitored minus plain, and the
  per-request latency percentiles of each);
* the capture thread's CPU per sample (its processing and its publishing);
* the wall time of each drain and of each stretch between the processor's pauses, which is
  how long the capture thread holds the GIL in one go (numpy's small-array calls do not
  release it), p50/p99/max;
* the processor alone on recorded captures, per sample against the size of a drain.

``python -m dev.bench.drain --mar model_store/digits.mar``; the script only uses
public entry points, so it also measures an older checkout (``PYTHONPATH=old/src python
path/to/drain.py``) for a before/after on the same machine at the same time.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dev.bench.variants import torch_load_state
from hookwatch._config import HandlerConfig, read_model_config
from hookwatch._metrics import MetricSet
from hookwatch._monitor.processor import CaptureProcessor
from hookwatch._service import ModelService


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class DrainTimer:
    """Wraps the capture worker's ``process`` and ``tick``: wall and thread CPU per call."""

    def __init__(self, process: Callable[[list[Any]], None], tick: Callable[[], None]) -> None:
        self._process = process
        self._tick = tick
        #: (samples, wall s, thread CPU s) per drain.
        self.drains: list[tuple[int, float, float]] = []
        self.ticks: list[tuple[float, float]] = []
        #: Wall seconds the capture thread ran between two pauses of a drain.
        self.holds: list[float] = []
        self._pauses: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def process(self, batch: list[Any]) -> None:
        self._pauses = []
        wall, cpu = time.perf_counter(), time.thread_time()
        self._process(batch)
        end = time.perf_counter()
        done = (len(batch), end - wall, time.thread_time() - cpu)
        # Between pauses the thread holds the GIL; a drain without pauses is one hold.
        edges = [wall, *(t for pause in self._pauses for t in pause), end]
        holds = [b - a for a, b in zip(edges[::2], edges[1::2], strict=True)]
        with self._lock:
            self.drains.append(done)
            self.holds.extend(holds)

    def pause(self, pause: Callable[[], None]) -> Callable[[], None]:
        """``pause`` (the processor's GIL yield), timed: the holds are the time between."""

        def timed() -> None:
            started = time.perf_counter()
            pause()
            self._pauses.append((started, time.perf_counter()))

        return timed

    def tick(self) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        self._tick()
        with self._lock:
            self.ticks.append((time.perf_counter() - wall, time.thread_time() - cpu))

    def take(
        self,
    ) -> tuple[list[tuple[int, float, float]], list[tuple[float, float]], list[float]]:
        with self._lock:
            drains, self.drains = self.drains, []
            ticks, self.ticks = self.ticks, []
            holds, self.holds = self.holds, []
        return drains, ticks, holds


def demo_service(mar: Path, workdir: Path, monitored: bool, name: str) -> ModelService:
    """The demo CNN as a TorchServe worker serves it from ``mar``, sampling every request."""
    from hookwatch.tools.demo.digits_cnn import DigitsCNN

    with zipfile.ZipFile(mar) as archive:
        archive.extractall(workdir)
    model = DigitsCNN()
    model.load_state_dict(torch_load_state(workdir / "digits_cnn.pt"))
    model.eval()
    handler = copy.deepcopy(dict(read_model_config(workdir / "model-config.yaml").raw["handler"]))
    handler["monitoring"]["sample_rate"] = 1.0
    return ModelService.from_handler_config(
        model,
        HandlerConfig.from_mapping(handler),
        name,
        MetricSet(),
        monitored=monitored,
        model_dir=str(workdir),
    )


def _part(monitor: Any, name: str) -> Any:
    """A part of the monitor: private (``_worker``) since issue 28, public in older checkouts."""
    return getattr(monitor, f"_{name}", None) or getattr(monitor, name)


def _bodies(count: int) -> list[dict[str, Any]]:
    from hookwatch.tools.demo.data import load_split

    images = load_split().x_test
    return [{"data": images[i % len(images)].tolist()} for i in range(count)]


def _serve(service: ModelService, bodies: Sequence[Any]) -> tuple[list[float], float]:
    """Per-request wall seconds and the request thread's CPU seconds over the round."""
    times: list[float] = []
    cpu = time.thread_time()
    for body in bodies:
        started = time.perf_counter()
        service.handle([body])
        times.append(time.perf_counter() - started)
    return times, time.thread_time() - cpu


class GcTimer:
    """Garbage-collection pauses by the thread they fell on (the capture thread's hold the
    GIL like its processing does)."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {}
        self._started: dict[int, float] = {}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        ident = threading.get_ident()
        if phase == "start":
            self._started[ident] = time.perf_counter()
        elif ident in self._started:
            pause = time.perf_counter() - self._started.pop(ident)
            self.pauses.setdefault(ident, []).append(pause)

    def total_ms(self, ident: int | None) -> float:
        return sum(self.pauses.get(ident, [])) * 1e3 if ident is not None else 0.0


def served(
    mar: Path, requests: int, rounds: int, max_batch: int | None = None, pauses: bool = True
) -> dict[str, Any]:
    """Alternating rounds of ``requests`` requests, monitored and plain; medians over rounds.

    ``max_batch`` overrides the capture worker's cap on samples per drain and ``pauses=False``
    takes the processor's GIL pauses out (exploration only).
    """
    torch.set_num_threads(1)
    bodies = _bodies(requests)
    with tempfile.TemporaryDirectory() as tmp_plain, tempfile.TemporaryDirectory() as tmp:
        plain = demo_service(mar, Path(tmp_plain), False, "digits-plain")
        watched = demo_service(mar, Path(tmp), True, "digits-drain")
        monitor = watched.monitor
        assert monitor is not None and _part(monitor, "drift") is not None, (
            "the demo has a drift profile"
        )
        worker = _part(monitor, "worker")
        timer = DrainTimer(worker._process, worker._tick)
        # The worker calls whatever it holds; swapping them in is the only intrusion.
        worker._process = timer.process
        worker._tick = timer.tick
        if max_batch is not None:
            worker._max_batch = max_batch
        pause = getattr(_part(monitor, "processor"), "_pause", None)  # older checkouts: no pauses
        if not pauses and pause is not None:
            _part(monitor, "processor")._pause = pause = None
        if pause is not None:
            _part(monitor, "processor")._pause = timer.pause(pause)
        for service in (plain, watched):
            _serve(service, bodies[: min(200, requests)])  # warm-up
        monitor.flush()
        timer.take()
        keys = ("plain", "monitored")
        per_round: dict[str, list[dict[str, float]]] = {key: [] for key in keys}
        drains: list[tuple[int, float, float]] = []
        ticks: list[tuple[float, float]] = []
        holds: list[float] = []
        gc_timer = GcTimer()
        gc.callbacks.append(gc_timer)
        for r in range(rounds):
            order = (plain, watched) if r % 2 == 0 else (watched, plain)
            for service in order:
                key = "monitored" if service is watched else "plain"
                started = time.perf_counter()
                times, cpu = _serve(service, bodies)
                if service is watched:
                    monitor.flush()  # the round's captures count against its round
                wall = time.perf_counter() - started
                per_round[key].append(
                    {
                        "p50_us": _percentile(times, 50) * 1e6,
                        "p99_us": _percentile(times, 99) * 1e6,
                        "mean_us": statistics.fmean(times) * 1e6,
                        "cpu_us": cpu / len(times) * 1e6,
                        "throughput": len(times) / wall,
                    }
                )
            d, t, h = timer.take()
            drains += d
            ticks += t
            holds += h
        gc.callbacks.remove(gc_timer)
        samples = sum(n for n, _, _ in drains)
        sizes = [n for n, _, _ in drains]
        walls = [w * 1e3 for _, w, _ in drains]
        result: dict[str, Any] = {
            "requests_per_round": requests,
            "rounds": rounds,
            **{
                f"{key}_{field}": statistics.median(r[field] for r in per_round[key])
                for key in keys
                for field in ("p50_us", "p99_us", "mean_us", "cpu_us", "throughput")
            },
            "samples": samples,
            "drains": len(drains),
            "drain_samples_p50": _percentile(sizes, 50),
            "drain_samples_max": max(sizes, default=0),
            "drain_wall_ms_p50": _percentile(walls, 50),
            "drain_wall_ms_p99": _percentile(walls, 99),
            "drain_wall_ms_max": max(walls, default=0.0),
            "gil_hold_ms_p50": _percentile([h * 1e3 for h in holds], 50),
            "gil_hold_ms_p99": _percentile([h * 1e3 for h in holds], 99),
            "gil_hold_ms_max": max((h * 1e3 for h in holds), default=0.0),
            "process_cpu_us_per_sample": sum(c for _, _, c in drains) / max(samples, 1) * 1e6,
            "publish_cpu_us_per_sample": sum(c for _, c in ticks) / max(samples, 1) * 1e6,
            "publish_wall_ms_p50": _percentile([w * 1e3 for w, _ in ticks], 50),
            "publish_wall_ms_p99": _percentile([w * 1e3 for w, _ in ticks], 99),
            "gc_ms_capture_thread": gc_timer.total_ms(worker._thread.ident),
            "gc_ms_request_thread": gc_timer.total_ms(threading.get_ident()),
        }
        result["throughput_ratio"] = result["monitored_throughput"] / result["plain_throughput"]
        result["p99_ratio"] = result["monitored_p99_us"] / result["plain_p99_us"]
        result["request_cpu_extra_us"] = result["monitored_cpu_us"] - result["plain_cpu_us"]
        watched.close()
        plain.close()
    return result


def record(monitor: Any, serve: Callable[[], object]) -> list[Any]:
    """The records the capture thread would process while ``serve()`` runs, kept instead."""
    recorded: list[Any] = []
    worker = _part(monitor, "worker")
    original = worker._process
    worker._process = recorded.extend
    try:
        serve()
        monitor.flush()
    finally:
        worker._process = original
    return recorded


def replay(
    monitor: Any, source: Path, recorded: Sequence[Any], size: int, repeats: int
) -> tuple[float, float]:
    """Median wall and thread-CPU seconds of the monitor's processor, built afresh (its drift
    tracker loaded again from ``source``, so every repeat starts from the same windows and
    tests), on ``recorded`` in drains of ``size``, with no pauses (the work alone)."""
    from hookwatch._profile import load_tracker

    config, name = monitor.config, monitor.model_name
    original = _part(monitor, "processor")
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(repeats):
        tracker = load_tracker(config, source, name) if original.drift is not None else None
        processor = CaptureProcessor(
            name,
            config.max_features,
            tracker,
            original.widths,
            units=original.units,
            classes=original.classes,
        )
        if hasattr(processor, "_pause"):
            processor._pause = None  # CPU and wall of the work alone
        wall, cpu = time.perf_counter(), time.thread_time()
        for start in range(0, len(recorded), size):
            processor.process(list(recorded[start : start + size]))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def processor_scaling(
    mar: Path, samples: int, sizes: Sequence[int], repeats: int
) -> dict[str, dict[str, float]]:
    """The processor alone (no thread) on recorded captures, per sample against drain size.

    Captures are recorded from real forwards; each size processes the same ``samples`` records
    in drains of that size on a fresh tracker, median over ``repeats``.
    """
    torch.set_num_threads(1)
    bodies = _bodies(samples)
    with tempfile.TemporaryDirectory() as tmp:
        service = demo_service(mar, Path(tmp), True, "digits-scaling")
        monitor = service.monitor
        assert monitor is not None and _part(monitor, "drift") is not None

        def serve() -> None:
            for body in bodies:
                service.handle([body])

        recorded = record(monitor, serve)
        out: dict[str, dict[str, float]] = {}
        n = len(recorded)
        for size in sizes:
            wall, cpu = replay(monitor, Path(tmp), recorded, size, repeats)
            out[str(size)] = {
                "wall_us_per_sample": wall / n * 1e6,
                "cpu_us_per_sample": cpu / n * 1e6,
                "drain_ms": wall / n * size * 1e3,
            }
        service.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mar", type=Path, default=Path("model_store/digits.mar"))
    parser.add_argument("--requests", type=int, default=2000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--samples", type=int, default=2048, help="records for the scaling run")
    parser.add_argument("--sizes", default="1,16,64,256,512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-batch", type=int, default=None, help="override samples/drain")
    parser.add_argument("--no-pause", action="store_true", help="no GIL pauses within drains")
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {}
    if not args.skip_served:
        report["served"] = served(
            args.mar, args.requests, args.rounds, args.max_batch, not args.no_pause
        )
    if not args.skip_scaling:
        sizes = [int(s) for s in args.sizes.split(",")]
        report["scaling"] = processor_scaling(args.mar, args.samples, sizes, args.repeats)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
