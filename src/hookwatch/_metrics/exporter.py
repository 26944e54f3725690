"""The exporter half: one scrape merges every worker's files in the multiprocess directory.

Each scrape drops the live gauges of dead workers (reap), folds dead workers' counters,
summaries and histograms into one archive (compact, crash-safe through ``archive.json``) and
reports whether a worker could create a metric file there now (:func:`dir_writable`).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hookwatch._capture import RateLimitedLog
from hookwatch._catalogue import METRICS_DIR_WRITABLE
from hookwatch._metrics._mmap import INITIAL_FILE_SIZE, MmapedDict, create_reserved

__all__ = [
    "ARCHIVE_MANIFEST",
    "DAMAGED",
    "compact_dead_workers",
    "dir_writable",
    "exporter_registry",
    "merged_files",
]

log = logging.getLogger("hookwatch")


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
        create_reserved(probe, INITIAL_FILE_SIZE)
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


def _owner(name: str) -> int | None:
    """The pid whose metric file ``name`` is (a worker's counters, slots or gauges), or None
    (the archive, a probe)."""
    accumulated = _ACCUMULATED.match(name)
    if accumulated is not None:
        return int(accumulated.group(2))
    gauge = _DB_PID.search(name) if name.startswith("gauge_") else None
    return int(gauge.group(1)) if gauge is not None else None


class _ProcessCollector(Collector):
    """One process's own metric files merged: what its monitors wrote, the request path's
    count slots included (they are in no registry of the process)."""

    def __init__(self, path: str, pid: int) -> None:
        self._path = path
        self._pid = pid

    def collect(self) -> Iterable[Any]:
        files = [
            f
            for f in glob.glob(os.path.join(self._path, "*.db"))
            if _owner(os.path.basename(f)) == self._pid
        ]
        return _merge(files)


def process_registry(path: str, pid: int | None = None) -> CollectorRegistry:
    """A registry of the metric files process ``pid`` (this one) writes in ``path``: its
    own series, as a one-process registry would hold them, where the process writes files
    (``PROMETHEUS_MULTIPROC_DIR`` set) and its registry lacks the request counts."""
    registry = CollectorRegistry()
    registry.register(_ProcessCollector(path, os.getpid() if pid is None else pid))
    return registry


def exporter_registry(
    path: str, reap_dead_pids: bool = True, compact: bool = True
) -> CollectorRegistry:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"expected a multiprocess metrics directory, got {path!r}")
    registry = CollectorRegistry()
    registry.register(_ReapingCollector(path, reap_dead_pids, compact))
    return registry
