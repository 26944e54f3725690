"""Every panel of every dashboard, its variables filled in as Grafana would, returns data from
the real Prometheus of a real TorchServe (2 workers) + exporter stack.

The test makes the states the panels show: a 5xx and a 4xx from TorchServe, a payload hookwatch
rejects, clean digits and then inverted ones, so drift detectors alarm, the HookwatchDriftWarning
alert is pending and the fleet-drift recording rules have a 10-minute window to score.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import Stack, http_get
from tests import grafana
from tests.conftest import require_binary
from tests.integration.helpers import build_variant, demo_config, eventually

pytestmark = pytest.mark.integration

MODEL = "digits"
#: Small windows, every request sampled: drift verdicts after tens of requests, not hundreds.
MONITORING = {"sample_rate": 1.0, "drift": {"window": 50, "step": 10}}
#: How far back the range queries look, and their resolution (the stack scrapes every second).
RANGE_S = 600
STEP = "2s"


def _prometheus(stack: Stack, path: str, params: Mapping[str, str]) -> Any:
    url = f"http://127.0.0.1:{stack.ports.prometheus}/api/v1/{path}?"
    status, body = http_get(url + urllib.parse.urlencode(params))
    payload = json.loads(body)
    assert status == 200 and payload["status"] == "success", (params, body[:500])
    return payload["data"]


def _scale_workers(stack: Stack, workers: int) -> None:
    query = urllib.parse.urlencode(
        {"min_worker": workers, "max_worker": workers, "synchronous": "true"}
    )
    url = f"http://127.0.0.1:{stack.ports.management}/models/{MODEL}?{query}"
    with urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=120) as reply:
        assert reply.status == 200


def _torchserve_metric_names(stack: Stack) -> set[str]:
    status, body = http_get(f"http://127.0.0.1:{stack.ports.metrics}/metrics")
    assert status == 200
    # Names of samples, not of # TYPE lines: TorchServe declares Requests5XX before any 5xx.
    return {
        m.group(0)
        for line in body.decode().splitlines()
        if not line.startswith("#") and (m := re.match(r"[A-Za-z_:][\w:]*", line))
    }


def _has_data(data: Mapping[str, Any]) -> bool:
    """Whether a query result holds at least one finite sample."""
    samples: Iterator[list[Any]]
    if data["resultType"] == "matrix":
        samples = (v for series in data["result"] for v in series["values"])
    elif data["resultType"] == "vector":
        samples = (series["value"] for series in data["result"])
    else:
        samples = iter([data["result"]])
    return any(math.isfinite(float(value)) for _, value in samples)


def _variable_values(stack: Stack, board: Mapping[str, Any], pick_all: bool) -> dict[str, str]:
    """Each variable's value as Grafana would set it, from the variable's own query.

    ``pick_all``: the "All" option where a variable has one, else its first value.
    """
    values: dict[str, str] = {}
    for variable in grafana.variables(board):
        if variable["type"] == "datasource":
            values[variable["name"]] = "hookwatch-prometheus"
            continue
        selector, label = grafana.label_values(variable["query"])
        series = _prometheus(stack, "series", {"match[]": grafana.substitute(selector, values)})
        options = sorted({s[label] for s in series if label in s})
        assert options, f"variable {variable['name']}: {selector} finds no {label}"
        all_value = variable.get("allValue") if variable.get("includeAll") else None
        values[variable["name"]] = all_value if pick_all and all_value else options[0]
    return values


def _empty_queries(stack: Stack, pick_all: bool) -> list[str]:
    empty = []
    end = time.time()
    boards = grafana.load()
    assert len(boards) >= 3, f"expected the dashboards in {grafana.DASHBOARDS}"
    for name, board in boards.items():
        values = _variable_values(stack, board, pick_all)
        for query in grafana.queries(name, board):
            expr = grafana.substitute(query.expr, values)
            if query.instant:
                data = _prometheus(stack, "query", {"query": expr})
            else:
                window = {"start": str(end - RANGE_S), "end": str(end), "step": STEP}
                data = _prometheus(stack, "query_range", {"query": expr, **window})
            if not _has_data(data):
                empty.append(f"{query} with {values}: {expr}")
    return empty


def test_every_dashboard_query_returns_data_from_the_real_stack(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    require_binary("prometheus")
    store = tmp_path / "store"
    build_variant(store, demo_config(**MONITORING), profile=True)
    stack = make_stack("dashboards", workers=2, model_store=store, scrape_interval="1s")
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()

    def scraping() -> None:
        ups = stack.query("up")
        assert len(ups) == 2 and all(r["value"][1] == "1" for r in ups), ups

    eventually(scraping, timeout=30)

    # A 5xx: TorchServe answers 503 while the model has no worker; then the workers come back.
    _scale_workers(stack, 0)
    status, reply = stack.infer({"data": [[[0] * 8] * 8]})
    assert status == 503, reply
    _scale_workers(stack, 2)
    eventually(lambda: _assert_equal(stack.ready_workers(), 2), timeout=120)
    # A payload that does not fit the model's input: hookwatch rejects it with a 400.
    status, reply = stack.infer({"data": [1, 2, 3]})
    assert status == 400, reply

    split = load_split()

    def send(images: Any) -> None:
        for image in images:
            status, reply = stack.infer({"data": image.tolist()})
            assert status == 200, reply

    send(split.x_test[:150])

    # Prometheus holds the clean counts before the shift, so increase() over the fleet's
    # 10-minute window sees the shifted samples arrive.
    def clean_scraped() -> None:
        (bins,) = stack.query(f'sum(hookwatch_drift_bin_samples_total{{model="{MODEL}"}})')
        assert float(bins["value"][1]) > 0
        assert stack.query(f'sum(hookwatch_drift_windows_total{{model="{MODEL}"}}) > 0')

    eventually(clean_scraped, timeout=30)
    # Inverted digits (16 - pixel): far from anything the reference holds.
    send(16 - split.x_test[150:300])

    def drift_visible() -> None:
        assert stack.query(f'max(hookwatch_drift_detected{{model="{MODEL}"}}) == 1')
        # The demo's profile has a labelled reference, so its drift warns (HookwatchDrift pages
        # only models without an accuracy estimate: test_harm_paging covers both sides).
        assert stack.query(f'ALERTS{{alertname="HookwatchDriftWarning",model="{MODEL}"}}')
        assert stack.query(
            f'model_detector:hookwatch_drift_fleet_score:increase10m{{model="{MODEL}"}}'
        )

    eventually(drift_visible, timeout=60)

    # TorchServe's metrics the dashboards query are real, and have samples.
    missing = grafana.TORCHSERVE_METRICS - _torchserve_metric_names(stack)
    assert not missing, f"TorchServe does not expose {sorted(missing)}"

    for pick_all in (False, True):
        empty = _empty_queries(stack, pick_all)
        assert not empty, "queries without data:\n" + "\n".join(empty)


def _assert_equal(got: object, expected: object) -> None:
    assert got == expected, (got, expected)
