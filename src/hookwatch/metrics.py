"""The one module that imports prometheus-client.

:class:`MetricSet` builds the catalogued metrics on a registry (a fresh one per test; the values
go to ``PROMETHEUS_MULTIPROC_DIR`` files when that variable is set in the worker process).
:func:`serve_multiprocess` is the exporter: it merges those files on each scrape.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary, multiprocess
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from hookwatch.catalogue import BY_NAME as SPECS
from hookwatch.catalogue import CATALOGUE, MetricSpec

log = logging.getLogger("hookwatch")


def _build(spec: MetricSpec, registry: CollectorRegistry) -> MetricWrapperBase:
    if spec.kind == "counter":
        return Counter(spec.name.removesuffix("_total"), spec.help, spec.labels, registry=registry)
    if spec.kind == "gauge":
        mode: Any = spec.multiprocess_mode or "all"
        return Gauge(spec.name, spec.help, spec.labels, registry=registry, multiprocess_mode=mode)
    return Summary(spec.name, spec.help, spec.labels, registry=registry)


class MetricSet:
    """prometheus-client objects for every catalogued metric, keyed by exposed name."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics: dict[str, MetricWrapperBase] = {
            spec.name: _build(spec, self.registry) for spec in CATALOGUE
        }

    def inc(self, name: str, amount: float, **labels: str) -> None:
        if amount:
            self._counter(name).labels(**labels).inc(amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        metric = self._metrics[name]
        if not isinstance(metric, Gauge):
            raise TypeError(f"expected a gauge for {name}, got {SPECS[name].kind}")
        metric.labels(**labels).set(value)

    def observe(self, name: str, values: Iterable[float], **labels: str) -> None:
        metric = self._metrics[name]
        if not isinstance(metric, Summary):
            raise TypeError(f"expected a summary for {name}, got {SPECS[name].kind}")
        child = metric.labels(**labels)
        for value in values:
            child.observe(value)

    def touch(self, name: str, **labels: str) -> None:
        """Create a labelled series at zero so it exists before its first event."""
        self._metrics[name].labels(**labels)

    def _counter(self, name: str) -> Counter:
        metric = self._metrics[name]
        if not isinstance(metric, Counter):
            raise TypeError(f"expected a counter for {name}, got {SPECS[name].kind}")
        return metric

    def sample_values(self) -> Mapping[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Current samples of this registry (single-process use: tests and the bench)."""
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out


_DB_PID = re.compile(r"_(\d+)\.db$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _ReapingCollector(Collector):
    """Drops live-gauge files of worker processes that are gone, then merges the rest.

    Counter files of dead workers stay: their counts are part of the fleet's total.
    """

    def __init__(self, path: str, reap: bool) -> None:
        self._path = path
        self._reap = reap
        self._inner = multiprocess.MultiProcessCollector(None, path=path)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Any]:
        if self._reap:
            with self._lock:
                pids = {
                    int(m.group(1))
                    for f in glob.glob(os.path.join(self._path, "gauge_live*_*.db"))
                    if (m := _DB_PID.search(f))
                }
                for pid in pids:
                    if not _pid_alive(pid):
                        multiprocess.mark_process_dead(pid, self._path)  # type: ignore[no-untyped-call]
        samples: Iterable[Any] = self._inner.collect()  # type: ignore[no-untyped-call]
        return samples


def exporter_registry(path: str, reap_dead_pids: bool = True) -> CollectorRegistry:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"expected a multiprocess metrics directory, got {path!r}")
    registry = CollectorRegistry()
    registry.register(_ReapingCollector(path, reap_dead_pids))
    return registry


def serve_multiprocess(
    path: str, port: int, addr: str = "127.0.0.1", reap_dead_pids: bool = True
) -> tuple[Any, threading.Thread]:
    """Start the exporter's HTTP server in a daemon thread; returns (server, thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=addr, registry=exporter_registry(path, reap_dead_pids))


def render(registry: CollectorRegistry) -> bytes:
    from prometheus_client import generate_latest

    return generate_latest(registry)
