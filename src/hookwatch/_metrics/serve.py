"""Serving over HTTP and the text exposition: :func:`serve_metrics`, :func:`render`,
:func:`parse_samples`.

:func:`serve_metrics` serves either half: a process's own :class:`MetricSet` (an application
that runs its model in one process) or the exporter's merge of a multiprocess directory.
"""

from __future__ import annotations

import errno
import os
import threading
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry

from hookwatch._metrics.exporter import exporter_registry, process_registry
from hookwatch._metrics.worker import MetricSet, default_metrics
from hookwatch._metrics.worker import multiprocess_dir as files_dir

__all__ = ["MetricsServer", "SampleKey", "parse_samples", "render", "serve_metrics"]


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
    :func:`hookwatch.watch` writes to), for an application that runs its model in one process
    (where the process writes metric files, ``PROMETHEUS_MULTIPROC_DIR`` set, the default is
    its own files merged).
    With it, it is the exporter of a multi-process server (TorchServe's workers): it merges the
    workers' files in that directory on each scrape, drops the gauges of dead workers and folds
    their counters into one archive file (``compact``; one exporter per directory may)::

        server = hookwatch.serve_metrics(9101)
    """
    from prometheus_client import start_http_server

    own_files = files_dir()  # the parameter has the function's name
    if multiprocess_dir is not None:
        registry = exporter_registry(os.fspath(multiprocess_dir), reap_dead_pids, compact)
    elif metrics is None and own_files is not None:
        # This process writes metric files (PROMETHEUS_MULTIPROC_DIR): its request counts
        # are in them only, never in its registry (which served them as zeros).
        registry = process_registry(own_files)
    else:
        registry = (metrics if metrics is not None else default_metrics()).registry
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        # Each worker of a multi-process server calling this at import: all but one died
        # on a bare "Address already in use", and were respawned to die again.
        raise OSError(
            error.errno,
            f"serve_metrics: port {port} on {addr} is in use (another worker of this server? "
            "with several processes set PROMETHEUS_MULTIPROC_DIR and run one `hookwatch "
            "exporter` beside them)",
        ) from None
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


for _public in (MetricsServer, serve_metrics):
    _public.__module__ = "hookwatch"  # public as hookwatch.<name> (reprs, tracebacks)
del _public
