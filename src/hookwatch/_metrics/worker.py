"""The worker half: the metric set a process writes to, and the request path's count files.

:class:`MetricSet` builds the catalogued metrics on a registry (a fresh one per test; the values
go to ``PROMETHEUS_MULTIPROC_DIR`` files when that variable is set in the worker process) and
takes the catalogue's typed specs as handles. :class:`CountSlots` are the files a TorchServe
worker's request path adds to in place, so a worker killed with SIGKILL loses no count.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client import values as _values
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.mmap_dict import mmap_key
from prometheus_client.utils import floatToGoString

from hookwatch._catalogue import (
    CAPTURES_DROPPED,
    CATALOGUE,
    REQUEST_DURATION,
    REQUESTS,
    REQUESTS_REJECTED,
    REQUESTS_SAMPLED,
    CounterSpec,
    GaugeSpec,
    HistogramSpec,
    MetricSpec,
    SummarySpec,
)
from hookwatch._metrics._mmap import MmapedDict
from hookwatch._names import REJECT_REASONS

__all__ = [
    "CountSlots",
    "CounterChild",
    "HistogramSlot",
    "MetricSet",
    "default_metrics",
    "multiprocess_dir",
]


class CounterChild(Protocol):
    """A labelled counter, bound once so a hot path skips the label lookup."""

    def inc(self, amount: float = 1) -> None: ...


def _build(spec: MetricSpec, registry: CollectorRegistry) -> MetricWrapperBase:
    if isinstance(spec, CounterSpec):
        return Counter(spec.name.removesuffix("_total"), spec.help, spec.labels, registry=registry)
    if isinstance(spec, GaugeSpec):
        mode: Any = spec.multiprocess_mode
        return Gauge(spec.name, spec.help, spec.labels, registry=registry, multiprocess_mode=mode)
    if isinstance(spec, HistogramSpec):
        return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets)
    return Summary(spec.name, spec.help, spec.labels, registry=registry)


def multiprocess_dir() -> str | None:
    """The directory this process writes its metric files to, or None (one registry in
    process memory). prometheus-client decides once, when it is first imported."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory and _values.ValueClass is not _values.MutexValue:
        return directory
    return None


_SLOT_FILES = itertools.count()


def _go_float(value: float) -> str:
    """A bucket bound as prometheus-client writes it in the ``le`` label."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


class _SlotFile:
    """One file of prometheus-client's format whose values are added to in place."""

    def __init__(self, directory: str, kind: str, keys: Iterable[str]) -> None:
        self.path = os.path.join(directory, f"{kind}_slots-{os.getpid()}-{next(_SLOT_FILES)}.db")
        self._file = MmapedDict(self.path)
        try:
            for key in keys:
                self._file.write_value(key, 0.0, 0.0)
        except OSError:
            # Half a layout is no count file: the next try starts a new one.
            self._file.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise
        # Every key exists now: the map is never grown again, so this view stays valid. A
        # memoryview of float64 cells, not a numpy array: adding to one of its items is half
        # the cost of a numpy scalar's read-modify-write, and this runs on every request.
        self.values: Any = memoryview(self._file._m).cast("d")

    def discard(self) -> None:
        """Close and remove the file (a count file whose sibling could not be made)."""
        self.values.release()  # the map cannot close while a view of it exists
        self.values = None
        self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def index(self, key: str) -> int:
        return int(self._file._positions[key] // 8)


class HistogramSlot:
    """One labelled histogram in a slot file: its buckets (non-cumulative, as prometheus-client
    stores them; the exporter accumulates) and its sum."""

    def __init__(self, file: _SlotFile, bounds: Sequence[float], buckets: list[int], sum_: int):
        #: The file's float64 cells; bucket ``i`` (of ``bisect_left(bounds, value)``) is cell
        #: ``buckets[i]``, the sum cell ``sum_index``: what :meth:`observe` adds to, public
        #: for a caller that inlines it (the request path's duration, once per batch).
        self.values: Any = file.values
        self.bounds = list(bounds)
        self.buckets = buckets
        self.sum_index = sum_

    def observe(self, value: float, count: int = 1) -> None:
        values = self.values
        values[self.buckets[bisect.bisect_left(self.bounds, value)]] += count
        values[self.sum_index] += value * count


class CountSlots:
    """Counters (and the request-duration histogram) the request path writes straight into
    files of the worker's own, so that a worker killed with SIGKILL loses none of them.

    Files in prometheus-client's format (``counter_slots-<pid>-<n>.db``,
    ``histogram_slots-<pid>-<n>.db``), holding every (metric, labels) pair they count, all
    created at once so the layout never moves afterwards. :meth:`add` adds to a value in place:
    a float64 in a shared memory map, no system call, no lock of its own (the caller's
    serialises). The exporter merges the files like any other and folds them into its archive
    once the pid is dead.
    """

    def __init__(
        self,
        directory: str,
        entries: Iterable[tuple[CounterSpec, Mapping[str, str]]],
        histograms: Iterable[tuple[HistogramSpec, Mapping[str, str]]] = (),
    ):
        keys: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        for spec, labels in entries:
            values = [str(labels[name]) for name in spec.labels]
            keys[(spec.name, tuple(sorted(labels.items())))] = mmap_key(
                spec.name.removesuffix("_total"), spec.name, list(spec.labels), values, spec.help
            )
        self._counters = _SlotFile(directory, "counter", keys.values())
        self.path = self._counters.path
        #: The counters' float64 cells in the map, by :meth:`index`: ``values[i] += n`` is
        #: :meth:`add` without the call (the request path's own counts).
        self.values: Any = self._counters.values
        self._values = self.values
        self._index = {handle: self._counters.index(key) for handle, key in keys.items()}
        self._histograms: dict[tuple[str, tuple[tuple[str, str], ...]], HistogramSlot] = {}
        wanted = list(histograms)
        if not wanted:
            return
        layout = []
        for histogram, labels in wanted:
            name, help_text = histogram.name, histogram.help
            values = [str(labels[label]) for label in histogram.labels]
            bounds = [*histogram.buckets, float("inf")]
            bucket_keys = [
                mmap_key(
                    name,
                    name + "_bucket",
                    [*histogram.labels, "le"],
                    [*values, _go_float(b)],
                    help_text,
                )
                for b in bounds
            ]
            sum_key = mmap_key(name, name + "_sum", list(histogram.labels), values, help_text)
            layout.append((histogram, labels, bounds, bucket_keys, sum_key))
        try:
            file = _SlotFile(directory, "histogram", [k for *_, b, s in layout for k in (*b, s)])
        except OSError:
            self._counters.discard()
            raise
        for histogram, labels, bounds, bucket_keys, sum_key in layout:
            self._histograms[(histogram.name, tuple(sorted(labels.items())))] = HistogramSlot(
                file, bounds[:-1], [file.index(k) for k in bucket_keys], file.index(sum_key)
            )

    def index(self, spec: CounterSpec, **labels: str) -> int:
        """Where a (counter, labels) pair's value lives; pass it to :meth:`add`."""
        return int(self._index[(spec.name, tuple(sorted(labels.items())))])

    def add(self, index: int, amount: float) -> None:
        self._values[index] += amount

    def histogram(self, spec: HistogramSpec, **labels: str) -> HistogramSlot:
        return self._histograms[(spec.name, tuple(sorted(labels.items())))]


class MetricSet:
    """prometheus-client objects for every catalogued metric, addressed by their specs.

    Public only as a value to pass: a set of hookwatch's series with its own registry, for
    monitors kept apart from the process-wide set (tests, several applications in one
    process); its methods are private::

        metrics = hookwatch.MetricSet()
        monitor = hookwatch.watch(model, config, "tabular", metrics=metrics)
        server = hookwatch.serve_metrics(0, metrics=metrics)
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics: dict[str, MetricWrapperBase] = {
            spec.name: _build(spec, self.registry) for spec in CATALOGUE
        }
        #: Every labelled child written so far, by (name, labels in the caller's order): a
        #: publish writes hundreds of them, and a single process observes its histogram on the
        #: request path; ``labels()`` (validation, a lock) costs more than the write.
        self._children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}

    def _get(self, spec: MetricSpec) -> Any:
        return self._metrics[spec.name]

    def _child(self, spec: MetricSpec, labels: dict[str, str]) -> Any:
        key = (spec.name, tuple(labels.items()))
        child = self._children.get(key)
        if child is None:
            # Two threads may both miss: labels() hands both the same child.
            child = self._children[key] = self._metrics[spec.name].labels(**labels)
        return child

    def inc(self, spec: CounterSpec, amount: float, **labels: str) -> None:
        if amount:
            self._child(spec, labels).inc(amount)

    def set(self, spec: GaugeSpec, value: float, **labels: str) -> None:
        self._child(spec, labels).set(value)

    def observe(self, spec: SummarySpec, values: Iterable[float], **labels: str) -> None:
        child = self._get(spec).labels(**labels)
        for value in values:
            child.observe(value)

    def observe_many(self, spec: SummarySpec, count: int, total: float, **labels: str) -> None:
        """Add ``count`` observations summing to ``total`` to a summary in one update.

        prometheus-client's Summary has no bulk observe, and one observe() per sample costs two
        locked file writes each; the child's count and sum values are updated directly instead.
        """
        if count:
            child = self._child(spec, labels)
            child._count.inc(count)
            child._sum.inc(total)

    def counter(self, spec: CounterSpec, **labels: str) -> CounterChild:
        """The labelled child of a counter, bound once so the hot path skips the label lookup."""
        child: CounterChild = self._get(spec).labels(**labels)
        return child

    def observe_histogram(
        self, spec: HistogramSpec, value: float, count: int = 1, **labels: str
    ) -> None:
        """Add ``count`` observations of ``value`` (single-process registries)."""
        child = self._child(spec, labels)
        for _ in range(count):
            child.observe(value)

    def count_slots(self, model: str) -> CountSlots | None:
        """The request path's counters of ``model`` in a file of their own, where this process
        writes metric files (TorchServe workers); None in a single-process registry, where the
        publisher adds them to the counters instead."""
        directory = multiprocess_dir()
        if directory is None:
            return None
        entries: list[tuple[CounterSpec, Mapping[str, str]]] = [
            (spec, {"model": model}) for spec in (REQUESTS, REQUESTS_SAMPLED, CAPTURES_DROPPED)
        ]
        entries += [(REQUESTS_REJECTED, {"model": model, "reason": r}) for r in REJECT_REASONS]
        return CountSlots(directory, entries, [(REQUEST_DURATION, {"model": model})])

    def touch(self, spec: MetricSpec, **labels: str) -> None:
        """Create a labelled series at zero so it exists before its first event."""
        self._get(spec).labels(**labels)

    def sample_values(self) -> Mapping[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Current samples of this registry (single-process use: tests and the bench)."""
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out


_DEFAULT: MetricSet | None = None
_DEFAULT_LOCK = threading.Lock()


def default_metrics() -> MetricSet:
    """The process-wide metric set :func:`hookwatch.watch` writes to unless given another.

    One per process, because a registry takes each metric name once: every model watched in
    the process shares it (the ``model`` label tells them apart), and :func:`serve_metrics`
    serves it.
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MetricSet()
        return _DEFAULT


MetricSet.__module__ = "hookwatch"  # public as hookwatch.MetricSet (reprs, tracebacks)
