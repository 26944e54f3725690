"""A stand-in for Prometheus' HTTP API on a loopback port, answering range queries from a
scripted run: ten minutes of traffic, clean and then drifting, for `hookwatch report` tests.

Only what the report asks is served: ``status/config``, ``label/<name>/values`` and
``query_range``. A range query is answered by the first rule whose metric name it contains;
a query no rule knows gets an empty matrix, as from a Prometheus without that metric.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LAYERS = ("act1", "act2", "input", "output")
DETECTORS = (
    ("activation", "act1"),
    ("activation", "act2"),
    ("input", "input"),
    ("prediction", "confidence"),
)
#: Value of a series at a time (Unix seconds); None: no sample then.
Curve = Callable[[float], float | None]


@dataclass
class Run:
    """A scripted run: samples in [start, end], drift from ``onset`` on."""

    end: float = field(default_factory=lambda: time.time() - 30)
    length: float = 600.0
    drift_after: float = 300.0
    profile: bool = True
    #: Detectors whose sliding windows alarm first (hookwatch_drift_first_alarm), and those
    #: whose anytime-valid test alarms at the onset too.
    first: tuple[str, ...] = ("input",)
    sequential: tuple[str, ...] = ("act2",)
    #: Whether any detector alarms at all.
    drifts: bool = True
    #: Metrics Prometheus has no series of.
    missing: tuple[str, ...] = ()
    #: Whether the model has an accuracy estimate (hookwatch_estimated_accuracy and its kin).
    estimate: bool = False

    @property
    def start(self) -> float:
        return self.end - self.length

    @property
    def onset(self) -> float:
        return self.start + self.drift_after

    def _live(self, clean: float, shifted: float) -> Curve:
        return lambda t: clean if t < self.onset or not self.drifts else shifted

    def _after(self, names: Sequence[str], name: str) -> Curve:
        return lambda t: 1.0 if self.drifts and name in names and t >= self.onset else 0.0

    def rules(self) -> list[tuple[str, Callable[[], list[tuple[dict[str, str], Curve]]]]]:
        """(metric name, series) in the order queries are matched: longer names first where
        one contains another."""
        model = {"model": "digits"}
        per_layer = [{"layer": layer} for layer in LAYERS]
        per_detector = [{"level": lv, "detector": d} for lv, d in DETECTORS]
        flag = float(self.profile)
        estimate = [(model, self._live(0.95, 0.3))] if self.estimate else []
        page = {"alertname": "HookwatchAccuracyDrop", "severity": "critical"}
        return [
            # The harm page, firing 30 s after the onset where the model has an estimate.
            (
                "ALERTS",
                lambda: (
                    [(page, lambda t: 1.0 if t >= self.onset + 30 else None)]
                    if self.estimate and self.drifts
                    else []
                ),
            ),
            ("hookwatch_drift_profile_loaded", lambda: [(model, lambda t: flag)]),
            # Score over threshold: one query holding both names, matched before either.
            ("} / hookwatch_drift_threshold", lambda: self._drift_live(per_detector, 0.5, 15.0)),
            ("hookwatch_estimated_correct_total", lambda: estimate),
            ("hookwatch_estimated_accuracy", lambda: estimate),
            (
                "hookwatch_reference_accuracy",
                lambda: [(model, lambda t: 0.97)] if self.estimate else [],
            ),
            ("hookwatch_drift_first_alarm", lambda: self._drift(per_detector, self.first)),
            (
                "hookwatch_drift_sequential_alarms_total",
                lambda: self._drift(per_detector, self.sequential),
            ),
            ("hookwatch_drift_evidence_threshold", lambda: self._drift_const(per_detector, 9.0)),
            ("hookwatch_drift_evidence", lambda: self._drift_live(per_detector, 2.0, 9.5)),
            ("hookwatch_drift_threshold", lambda: self._drift_const(per_detector, 2.0)),
            ("hookwatch_drift_score", lambda: self._drift_live(per_detector, 1.0, 30.0)),
            ("hookwatch_reference_activation_statistic", lambda: _each(per_layer, 0.5)),
            (
                "hookwatch_activation_statistic_sum",
                lambda: [(labels, self._live(0.5, 2.0)) for labels in per_layer],
            ),
            ("hookwatch_requests_sampled_total", lambda: [(model, lambda t: 10.0)]),
            ("hookwatch_captures_dropped_total", lambda: [(model, lambda t: 0.0)]),
            ("hookwatch_requests_total", lambda: [(model, lambda t: 20.0)]),
            ("ts_inference_requests_total", lambda: [({"model_name": "digits"}, lambda t: 20.0)]),
        ]

    def _drift(
        self, labels: list[dict[str, str]], names: Sequence[str]
    ) -> list[tuple[dict[str, str], Curve]]:
        if not self.profile:
            return []
        return [(lab, self._after(names, lab["detector"])) for lab in labels]

    def _drift_const(
        self, labels: list[dict[str, str]], value: float
    ) -> list[tuple[dict[str, str], Curve]]:
        return _each(labels, value) if self.profile else []

    def _drift_live(
        self, labels: list[dict[str, str]], clean: float, shifted: float
    ) -> list[tuple[dict[str, str], Curve]]:
        return [(lab, self._live(clean, shifted)) for lab in labels] if self.profile else []

    def answer(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        for name, series in self.rules():
            if name in query and name not in self.missing:
                return [self._matrix(labels, curve, start, end, step) for labels, curve in series()]
        return []

    def _matrix(
        self, labels: dict[str, str], curve: Curve, start: float, end: float, step: float
    ) -> dict[str, Any]:
        values = []
        t = start
        while t <= end + 1e-9:
            value = curve(t) if self.start <= t <= self.end else None
            if value is not None:
                values.append([round(t, 3), repr(float(value))])
            t += step
        return {"metric": labels, "values": values}


def _each(labels: list[dict[str, str]], value: float) -> list[tuple[dict[str, str], Curve]]:
    return [(lab, lambda t: value) for lab in labels]


@dataclass
class FakePrometheus:
    run: Run
    models: tuple[str, ...] = ("digits",)
    scrape_interval: str = "5s"
    #: Answer every range query with this HTTP status and a bad_data error instead.
    refuse: int = 0
    queries: list[str] = field(default_factory=list)
    url: str = ""

    def respond(self, path: str, params: dict[str, str]) -> tuple[int, Any]:
        if path == "/api/v1/status/config":
            config = f"global:\n  scrape_interval: {self.scrape_interval}\n"
            return 200, {"status": "success", "data": {"yaml": config}}
        if path == "/api/v1/label/model/values":
            return 200, {"status": "success", "data": list(self.models)}
        if path == "/api/v1/query_range":
            self.queries.append(params["query"])
            if self.refuse:
                return self.refuse, {
                    "status": "error",
                    "errorType": "bad_data",
                    "error": "1:1: parse error: unexpected end of input",
                }
            start, end, step = (float(params[k]) for k in ("start", "end", "step"))
            result = self.run.answer(params["query"], start, end, step)
            return 200, {"status": "success", "data": {"resultType": "matrix", "result": result}}
        return 404, {"status": "error", "error": f"no such path {path}"}


@contextmanager
def serving(fake: FakePrometheus) -> Iterator[FakePrometheus]:
    """``fake`` on a loopback port the kernel picks (bound here, so no other process can
    take it between choosing and binding), for the duration of the block."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            parsed = urllib.parse.urlparse(self.path)
            params = dict(urllib.parse.parse_qsl(parsed.query))
            status, payload = fake.respond(parsed.path, params)
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass  # quiet: pytest shows failures, not every request

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
