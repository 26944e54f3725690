"""The one package that imports prometheus-client: the worker half and the exporter half.

- :mod:`~hookwatch._metrics.worker`: what a worker process writes, :class:`MetricSet` (the
  catalogued metrics on a registry, the process-wide one from :func:`default_metrics`) and
  :class:`CountSlots` (the request path's counters, added to in place in a file of their own).
- :mod:`~hookwatch._metrics.exporter`: what the exporter process does on each scrape of a
  multiprocess directory, merge every worker's files, reap dead workers' gauges, compact their
  counters into an archive (:func:`exporter_registry`, :func:`compact_dead_workers`).
- :mod:`~hookwatch._metrics.serve`: the HTTP endpoint for either (:func:`serve_metrics`) and
  the text exposition (:func:`render`, :func:`parse_samples`).
- :mod:`~hookwatch._metrics._mmap`: prometheus-client's metric file with its blocks allocated
  (:class:`ReservedMmapedDict`), shared by both halves; importing it installs that class for
  every metric file this process writes.

The worker never imports the exporter, nor the exporter the worker (tests/unit/test_layout.py).
"""

from __future__ import annotations

from hookwatch._metrics._mmap import MmapedDict, ReservedMmapedDict
from hookwatch._metrics.exporter import (
    ARCHIVE_MANIFEST,
    DAMAGED,
    compact_dead_workers,
    dir_writable,
    exporter_registry,
    merged_files,
)
from hookwatch._metrics.serve import (
    MetricsServer,
    SampleKey,
    parse_samples,
    render,
    serve_metrics,
)
from hookwatch._metrics.worker import (
    CounterChild,
    CountSlots,
    HistogramSlot,
    MetricSet,
    default_metrics,
    multiprocess_dir,
)

__all__ = [
    "ARCHIVE_MANIFEST",
    "DAMAGED",
    "CountSlots",
    "CounterChild",
    "HistogramSlot",
    "MetricSet",
    "MetricsServer",
    "MmapedDict",
    "ReservedMmapedDict",
    "SampleKey",
    "compact_dead_workers",
    "default_metrics",
    "dir_writable",
    "exporter_registry",
    "merged_files",
    "multiprocess_dir",
    "parse_samples",
    "render",
    "serve_metrics",
]
