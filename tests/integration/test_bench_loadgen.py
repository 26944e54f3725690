"""The load generator against a real HTTP server on loopback, and the bench stopping on an
exporter's answer (moved from tests/unit/test_bench.py: they start servers)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from hookwatch.tools.bench.loadgen import (
    MachineTimes,
    Segment,
    Target,
    closed_loop,
    open_loop,
)
from hookwatch.tools.bench.stats import VARIANTS
from tests.fakes import text_server

pytestmark = pytest.mark.integration


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay_s = 0.0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.delay_s:
            time.sleep(self.delay_s)
        status = 200 if self.path == "/ok" else 503
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _target(httpd: http.server.ThreadingHTTPServer, path: str = "/ok") -> Target:
    return Target("127.0.0.1", httpd.server_address[1], path, [b"a", b"b"], "text/plain")


def test_closed_loop_counts_answers_and_errors(server: http.server.ThreadingHTTPServer) -> None:
    ok = closed_loop(_target(server), clients=2, duration_s=0.3)
    assert ok.requests > 0
    assert ok.errors == 0
    assert ok.p50_ms <= ok.p99_ms
    with pytest.raises(RuntimeError, match="expected completed requests"):
        closed_loop(_target(server, "/fail"), clients=1, duration_s=0.2)


def test_closed_loop_rate_and_cpu_come_from_the_cycles(
    server: http.server.ThreadingHTTPServer,
) -> None:
    got = closed_loop(_target(server), clients=2, duration_s=0.3)
    assert got.rate_rps is not None
    assert got.throughput_rps == got.rate_rps
    # On a steady server the two estimators agree; the cycle rate only drops the quantisation.
    assert 0.5 < got.rate_rps / (got.requests / got.duration_s) < 2.0
    # CPU is per request served at the measured rate: 0.5 s over 4/s x 2 s = 62.5 ms.
    seg = Segment.of([0.01] * 10, 0, duration_s=2.0, cpu_s=0.5, rate_rps=4.0)
    assert seg.cpu_ms == pytest.approx(62.5)
    assert Segment.of([0.01] * 10, 0, duration_s=2.0, cpu_s=0.5).cpu_ms == pytest.approx(50.0)


def test_machine_cpu_is_every_process_per_request_and_busy_the_share_of_all_cores(
    server: http.server.ThreadingHTTPServer,
) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks of 1/100 s.
    before = MachineTimes.parse("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n", 100.0)
    after = MachineTimes.parse("cpu  250 0 100 900 50 0 0 0 7 0\n", 100.0)
    window = after - before
    assert (window.busy_s, window.all_s) == pytest.approx((2.0, 3.0))
    seg = Segment.of([0.01] * 10, 0, duration_s=2.0, rate_rps=4.0, machine=window)
    assert seg.machine_cpu_ms == pytest.approx(250.0)  # 2 s busy over 8 requests
    assert seg.machine_busy == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="aggregate 'cpu' line"):
        MachineTimes.parse("cpu0 1 2 3 4 5 6 7 8\n", 100.0)
    # Measured with the worker's clock, over the same window (Linux: /proc/stat), while a
    # thread here keeps a core busy: the machine's figure sees every process's CPU.
    stop = time.monotonic() + 1.0

    def spin() -> None:
        while time.monotonic() < stop:
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    got = closed_loop(_target(server), clients=2, duration_s=0.3, cpu_clock=lambda: 0.0)
    spinner.join()
    assert got.machine_cpu_ms is not None and got.machine_cpu_ms > 0
    assert got.machine_busy is not None and 0.0 < got.machine_busy <= 1.0


def test_open_loop_charges_stalls_to_the_requests_that_waited(
    server: http.server.ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One sender and a server that takes 20 ms: at 200/s almost every send starts late, and
    # measured from the schedule those waits are part of the latency (no coordinated omission).
    monkeypatch.setattr(_Handler, "delay_s", 0.02)
    got = open_loop(_target(server), rate_rps=200, duration_s=0.5, senders=1)
    assert got.offered_rps == 200
    assert got.late > 0
    assert got.p99_ms > 5 * 20


def test_the_bench_stops_when_a_monitored_worker_has_no_drift_profile() -> None:
    from types import SimpleNamespace

    from dev.bench.runner import check_drift_loaded
    from dev.bench.variants import Group

    names = {v: f"m-{v}" for v in VARIANTS}
    exposition = {"text": ""}
    line = 'hookwatch_drift_profile_loaded{{model="{}"}} {}\n'
    with text_server(exposition) as port:
        bench = SimpleNamespace(ports=SimpleNamespace(exporter=port), logs="logs")
        group = Group("digits", 1, names)
        exposition["text"] = line.format("m-default", 1) + line.format("m-full", 1)
        assert check_drift_loaded(bench, group) == {"default": True, "full": True}  # type: ignore[arg-type]
        exposition["text"] = line.format("m-default", 1) + line.format("m-full", 0)
        with pytest.raises(
            RuntimeError, match="m-full: expected hookwatch_drift_profile_loaded 1, got 0"
        ):
            check_drift_loaded(bench, group)  # type: ignore[arg-type]
        exposition["text"] = line.format("m-default", 1)
        with pytest.raises(RuntimeError, match="for m-full on the exporter, got no such series"):
            check_drift_loaded(bench, group, timeout=0.5)  # type: ignore[arg-type]
