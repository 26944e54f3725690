"""The one module that imports prometheus-client: the metric set and the exporter.

:class:`MetricSet` builds the catalogued metrics on a registry (a fresh one per test; the values
go to ``PROMETHEUS_MULTIPROC_DIR`` files when that variable is set in the worker process) and
takes the catalogue's typed specs as handles. The exporter half (:func:`exporter_registry`,
:func:`serve_metrics`) merges the worker files on each scrape, reaping dead workers' gauges and
compacting their counters.
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import itertools
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, multiprocess
from prometheus_client import mmap_dict as _mmap_dict
from prometheus_client import values as _values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.mmap_dict import mmap_key
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from hookwatch._capture import RateLimitedLog
from hookwatch._catalogue import (
    CAPTURES_DROPPED,
    CATALOGUE,
    METRICS_DIR_WRITABLE,
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
from hookwatch._names import REJECT_REASONS

__all__ = [
    "CountSlots",
    "MetricSet",
    "MetricsServer",
    "ReservedMmapedDict",
    "compact_dead_workers",
    "default_metrics",
    "dir_writable",
    "exporter_registry",
    "merged_files",
    "parse_samples",
    "render",
    "serve_metrics",
]

log = logging.getLogger("hookwatch")


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


#: Size prometheus-client gives a new metric file (it doubles it when full).
_INITIAL_FILE_SIZE: int = getattr(_mmap_dict, "_INITIAL_MMAP_SIZE", 1 << 16)


def _create_reserved(filename: str, size: int) -> None:
    """Create ``filename`` (or keep it) with its first ``size`` bytes allocated on disk.

    Raises OSError (ENOSPC on a full filesystem, EACCES/EROFS where it is unwritable) and
    then leaves no empty file behind for the exporter to trip over.
    """
    fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        existing = os.fstat(fd).st_size
        try:
            os.posix_fallocate(fd, 0, max(existing, size))
        except OSError:
            if existing == 0:
                with contextlib.suppress(OSError):
                    os.unlink(filename)
            raise
    finally:
        os.close(fd)


def _entry_size(key: str) -> int:
    """Bytes prometheus-client's file takes for one more key (length, padded key, 2 doubles)."""
    encoded = len(key.encode("utf-8"))
    return 4 + encoded + (8 - (encoded + 4) % 8) + 16


class ReservedMmapedDict(_mmap_dict.MmapedDict):
    """prometheus-client's metric file with its disk blocks allocated before they are mapped.

    prometheus-client sizes a file with ftruncate, which allocates nothing: the first write to
    each page of the map allocates it, and on a full filesystem the kernel answers that write
    with SIGBUS, which kills the process (a TorchServe worker, over a metric). Allocating the
    blocks up front (posix_fallocate) turns a full disk into an OSError where the file is
    created or grown, which hookwatch catches, and every later write to the map lands on
    blocks the file owns already. Installed for every metric file a process writes (see below).
    """

    def __init__(self, filename: str, read_mode: bool = False) -> None:
        if not read_mode:
            _create_reserved(filename, _INITIAL_FILE_SIZE)
        super().__init__(filename, read_mode)  # type: ignore[no-untyped-call]

    def _init_value(self, key: str) -> None:
        # Grown as prometheus-client would (doubling), but allocated before it maps the growth.
        needed = self._used + _entry_size(key)
        capacity = self._capacity
        while needed > capacity:
            capacity *= 2
        if capacity > self._capacity:
            os.posix_fallocate(self._f.fileno(), 0, capacity)
        super()._init_value(key)  # type: ignore[no-untyped-call]


# prometheus-client looks this name up in its values module each time it opens a process's
# metric file: every value file of this process is reserved from now on.
setattr(_values, "MmapedDict", ReservedMmapedDict)  # noqa: B010 - not exported upstream


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
        # Every key exists now: the map is never grown again, so this view stays valid.
        self.values: Any = np.frombuffer(self._file._m, dtype=np.float64)

    def discard(self) -> None:
        """Close and remove the file (a count file whose sibling could not be made)."""
        self.values = None  # the map cannot close while a view of it exists
        self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def index(self, key: str) -> int:
        return int(self._file._positions[key] // 8)


class HistogramSlot:
    """One labelled histogram in a slot file: its buckets (non-cumulative, as prometheus-client
    stores them; the exporter accumulates) and its sum."""

    def __init__(self, file: _SlotFile, bounds: Sequence[float], buckets: list[int], sum_: int):
        self._values = file.values
        self._bounds = list(bounds)
        self._buckets = buckets
        self._sum = sum_

    def observe(self, value: float, count: int = 1) -> None:
        self._values[self._buckets[bisect.bisect_left(self._bounds, value)]] += count
        self._values[self._sum] += value * count


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
        self._values = self._counters.values
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
        # Histogram children by (name, labels): observed on the request path in a single
        # process, where ``labels()`` (validation, a lock) costs three times the observation.
        self._histogram_children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}

    def _get(self, spec: MetricSpec) -> Any:
        return self._metrics[spec.name]

    def inc(self, spec: CounterSpec, amount: float, **labels: str) -> None:
        if amount:
            self._get(spec).labels(**labels).inc(amount)

    def set(self, spec: GaugeSpec, value: float, **labels: str) -> None:
        self._get(spec).labels(**labels).set(value)

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
            child = self._get(spec).labels(**labels)
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
        key = (spec.name, tuple(labels.items()))
        child = self._histogram_children.get(key)
        if child is None:
            child = self._histogram_children[key] = self._get(spec).labels(**labels)
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


_DB_PID = re.compile(r"_(\d+)\.db$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Commit record of the dead-worker archive (not a ``.db`` file, so no collector reads it).
ARCHIVE_MANIFEST = "archive.json"
#: prometheus-client's mmap file format (untyped upstream), with reserved blocks.
MmapedDict: Any = ReservedMmapedDict
_ARCHIVE = re.compile(r"^(counter|summary|histogram)_archive-(\d+)\.db$")
_PENDING = re.compile(r"^(counter|summary|histogram)_.+\.g(\d+)\.compacting$")
#: A worker's files that only ever grow: prometheus-client's per type, and the request
#: path's count slots (``counter_slots-<pid>-<n>.db``). Group 2 is the pid.
_ACCUMULATED = re.compile(r"^(counter|summary|histogram)_(?:slots-)?(\d+)(?:-\d+)?\.db$")


def _read_manifest(path: str) -> dict[str, Any]:
    try:
        with open(os.path.join(path, ARCHIVE_MANIFEST)) as f:
            manifest: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return {"generation": 0, "absorbed": []}
    return manifest


def _raw_values(files: Iterable[str]) -> dict[tuple[str, str], float]:
    """Per (type, mmap key) sums of the raw values in ``files`` (histogram buckets stay raw)."""
    totals: dict[tuple[str, str], float] = {}
    for f in files:
        typ = os.path.basename(f).split("_", 1)[0]
        for key, value, _, _ in MmapedDict.read_all_values_from_file(f):
            totals[(typ, key)] = totals.get((typ, key), 0.0) + value
    return totals


#: Suffix of a dead worker's file that could not be read, set aside by compaction.
DAMAGED = ".damaged"


def _readable(path: str) -> bool:
    try:
        for key, _, _, _ in MmapedDict.read_all_values_from_file(path):
            json.loads(key)
    except Exception:
        return False
    return True


def _fsync(filename: str) -> None:
    fd = os.open(filename, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compact_dead_workers(path: str, alive: Callable[[int], bool] = _pid_alive) -> int:
    """Fold the counter/summary/histogram files of dead pids into one archive per type.

    Totals stay exact and every scrape sees each count once, even if the exporter dies midway:
    dead files are first renamed out of the ``*.db`` set (``.compacting``), a new archive
    generation is written beside the current one, and replacing ``archive.json`` (atomic
    rename) switches the archive and absorbs the renamed files in one step. Leftovers of an
    interrupted run are finished by the next call, which runs before any scrape merges files.
    Returns how many worker files were absorbed.
    """
    manifest = _read_manifest(path)
    generation = int(manifest["generation"])
    names = os.listdir(path)
    # Files absorbed by the committed generation that an interrupted run did not delete.
    for name in manifest["absorbed"]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(path, name))
    for name in names:
        m = _ARCHIVE.match(name)
        if m and int(m.group(2)) != generation:
            os.remove(os.path.join(path, name))  # an uncommitted or superseded generation
    nxt = generation + 1
    pending = [n for n in names if _PENDING.match(n) and n not in manifest["absorbed"]]
    for name in names:
        m = _ACCUMULATED.match(name)
        if m and not alive(int(m.group(2))):
            if not _readable(os.path.join(path, name)):
                # Nothing in it can be counted, and an archive holding it could never be read:
                # set it aside (out of every scrape and archive), kept for a post-mortem.
                os.rename(os.path.join(path, name), os.path.join(path, name + DAMAGED))
                log.warning("hookwatch exporter: %s cannot be read; renamed to *%s", name, DAMAGED)
                continue
            target = f"{name.removesuffix('.db')}.g{nxt}.compacting"
            os.rename(os.path.join(path, name), os.path.join(path, target))
            pending.append(target)
    if not pending:
        return 0
    current = [
        os.path.join(path, n)
        for n in os.listdir(path)
        if (m := _ARCHIVE.match(n)) and int(m.group(2)) == generation
    ]
    totals = _raw_values([*current, *(os.path.join(path, n) for n in pending)])
    written: dict[str, Any] = {}
    try:
        for (typ, key), value in totals.items():
            if typ not in written:
                written[typ] = MmapedDict(os.path.join(path, f"{typ}_archive-{nxt}.db"))
            written[typ].write_value(key, value, 0.0)
    finally:
        for archive in written.values():
            archive.close()
    for typ in written:
        _fsync(os.path.join(path, f"{typ}_archive-{nxt}.db"))
    tmp = os.path.join(path, ARCHIVE_MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"generation": nxt, "absorbed": sorted(pending)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, ARCHIVE_MANIFEST))  # the commit point
    for name in [*pending, *(os.path.basename(c) for c in current)]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(path, name))
    return len(pending)


def merged_files(path: str) -> list[str]:
    """The files one scrape merges: worker ``*.db`` files plus the committed archive, and dead
    workers' files renamed for a compaction that has not committed (it failed: a full or
    read-only directory), which are in no archive yet."""
    manifest = _read_manifest(path)
    generation = int(manifest["generation"])
    absorbed = set(manifest["absorbed"])
    files = []
    for f in glob.glob(os.path.join(path, "*.db")):
        m = _ARCHIVE.match(os.path.basename(f))
        if m is None or int(m.group(2)) == generation:
            files.append(f)
    for name in os.listdir(path):
        if _PENDING.match(name) and name not in absorbed:
            files.append(os.path.join(path, name))
    return files


def dir_writable(path: str) -> bool:
    """Whether a worker could create a metric file in ``path`` now: a probe file (not a
    ``.db``, so never merged) created with a new file's blocks allocated, then removed."""
    probe = os.path.join(path, f".hookwatch-probe-{os.getpid()}")
    try:
        _create_reserved(probe, _INITIAL_FILE_SIZE)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


class _ReapingCollector(Collector):
    """Drops live-gauge files of worker processes that are gone, then merges the rest.

    Counts of dead workers stay part of the fleet's total: with ``compact`` their files are
    folded into one archive, so a scrape reads one file per live worker plus the archive
    however many workers have come and gone.
    """

    def __init__(self, path: str, reap: bool, compact: bool = True) -> None:
        self._path = path
        self._reap = reap
        self._compact = reap and compact
        self._lock = threading.Lock()
        self._log = RateLimitedLog(log)

    def collect(self) -> Iterable[Any]:
        # Housekeeping that fails (a read-only or full directory) is logged and retried on the
        # next scrape; the scrape itself still answers with what the files hold.
        with self._lock:
            if self._reap:
                self._reap_dead_gauges()
            if self._compact:
                try:
                    compact_dead_workers(self._path)
                except Exception as error:
                    self._warn("compact", "compacting dead workers' files", error)
            files = merged_files(self._path)
            writable = dir_writable(self._path)
        samples = list(self._merge(files))
        samples.append(
            GaugeMetricFamily(
                METRICS_DIR_WRITABLE.name, METRICS_DIR_WRITABLE.help, 1.0 if writable else 0.0
            )
        )
        return samples

    def _reap_dead_gauges(self) -> None:
        pids = {
            int(m.group(1))
            for f in glob.glob(os.path.join(self._path, "gauge_live*_*.db"))
            if (m := _DB_PID.search(f))
        }
        for pid in pids:
            if not _pid_alive(pid):
                try:
                    multiprocess.mark_process_dead(pid, self._path)  # type: ignore[no-untyped-call]
                except OSError as error:
                    self._warn("reap", "removing dead workers' gauge files", error)

    def _merge(self, files: list[str]) -> Iterable[Any]:
        try:
            merged: Iterable[Any] = _merge(files)
            return merged
        except Exception:
            # One damaged file (cut short, garbage) must not blank every hookwatch series:
            # find it, leave it out, say so.
            good = [f for f in files if _mergeable(f)]
            bad = sorted(os.path.basename(f) for f in set(files) - set(good))
            self._log.warning(
                "unreadable",
                "hookwatch exporter: left out %d metric files that cannot be read: %s",
                len(bad),
                ", ".join(bad[:10]),
            )
            return _merge(good)

    def _warn(self, key: str, what: str, error: Exception) -> None:
        self._log.warning(
            key,
            "hookwatch exporter: %s in %s failed (%s); retried on the next scrape",
            what,
            self._path,
            error,
        )


def _merge(files: list[str]) -> Iterable[Any]:
    merged: Iterable[Any] = multiprocess.MultiProcessCollector.merge(files)  # type: ignore[no-untyped-call]
    return merged


def _mergeable(path: str) -> bool:
    try:
        _merge([path])
    except Exception:
        return False
    return True


def exporter_registry(
    path: str, reap_dead_pids: bool = True, compact: bool = True
) -> CollectorRegistry:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"expected a multiprocess metrics directory, got {path!r}")
    registry = CollectorRegistry()
    registry.register(_ReapingCollector(path, reap_dead_pids, compact))
    return registry


class MetricsServer:
    """The HTTP endpoint :func:`serve_metrics` started; ``close()`` stops it (idempotent).

    Also a context manager that closes::

        server: hookwatch.MetricsServer = hookwatch.serve_metrics(0)
        print(server.port, server.url)
        server.close()
    """

    def __init__(self, server: Any, thread: threading.Thread, addr: str) -> None:
        self._server = server
        self._thread = thread
        self.addr = addr
        #: The port bound (the one asked for, or the one the OS picked for port 0).
        self.port: int = int(server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port; idempotent.

        Usage::

            server.close()
        """
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5.0)
            self._server = None

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve_metrics(
    port: int = 9101,
    addr: str = "127.0.0.1",
    *,
    multiprocess_dir: str | os.PathLike[str] | None = None,
    metrics: MetricSet | None = None,
    reap_dead_pids: bool = True,
    compact: bool = True,
) -> MetricsServer:
    """Serve hookwatch's metrics over HTTP from a daemon thread; ``port=0`` picks a free one.

    Without ``multiprocess_dir`` it serves ``metrics`` (default: the process-wide set that
    :func:`hookwatch.watch` writes to), for an application that runs its model in one process.
    With it, it is the exporter of a multi-process server (TorchServe's workers): it merges the
    workers' files in that directory on each scrape, drops the gauges of dead workers and folds
    their counters into one archive file (``compact``; one exporter per directory may)::

        server = hookwatch.serve_metrics(9101)
    """
    from prometheus_client import start_http_server

    if multiprocess_dir is not None:
        registry = exporter_registry(os.fspath(multiprocess_dir), reap_dead_pids, compact)
    else:
        registry = (metrics if metrics is not None else default_metrics()).registry
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread, addr)


SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def parse_samples(text: str) -> dict[SampleKey, float]:
    """Samples of a Prometheus text exposition by (name, sorted labels): what a scrape saw."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def render(registry: CollectorRegistry) -> bytes:
    from prometheus_client import generate_latest

    return generate_latest(registry)


for _public in (MetricSet, MetricsServer, serve_metrics):
    _public.__module__ = "hookwatch"  # public as hookwatch.<name> (reprs, tracebacks)
del _public
