"""The Grafana dashboards shipped in the package (hookwatch/_assets), read as the tests need them.

Shared by the unit tests (metric names, conventions, the schema check) and the integration test
that runs every panel's query against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookwatch.tools import dashboards
from hookwatch.tools.dashboards import label_values, panels, variables

ROOT = Path(__file__).resolve().parents[1]
#: The repository's monitoring/grafana: the export docker-compose mounts, and the schema check.
GRAFANA = ROOT / "monitoring" / "grafana"
#: The package's dashboards (monitoring/grafana/dashboards is their export).
DASHBOARDS = dashboards.DASHBOARDS
SCHEMA_CHECK = GRAFANA / "schema-check"

#: TorchServe's own metrics (its metrics endpoint, `metrics_mode=prometheus`) that dashboards
#: may query. They are not hookwatch's, so the catalogue does not list them; kept short and
#: explicit, and tests/integration/test_dashboards.py checks that TorchServe exposes each one.
TORCHSERVE_METRICS = frozenset(
    {
        "ts_inference_requests_total",
        "ts_inference_latency_microseconds",
        "ts_queue_latency_microseconds",
        "Requests4XX",
        "Requests5XX",
    }
)
#: TorchServe's counters among them (its Java client exports them without a _total suffix).
TORCHSERVE_COUNTERS = TORCHSERVE_METRICS
#: Series Prometheus writes itself: scrape health and alert states.
PROMETHEUS_SERIES = frozenset({"up", "ALERTS"})

#: What Grafana puts in for its interval variables when the integration test runs the queries
#: (a 1 s scrape interval there: a rate interval of a minute spans many scrapes).
BUILTIN_VALUES: Mapping[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}


@dataclass(frozen=True)
class Query:
    """One panel target."""

    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel!r} / {self.ref}"


def load() -> dict[str, dict[str, Any]]:
    """Every dashboard, by file name."""
    return dashboards.load(DASHBOARDS)


def queries(name: str, board: Mapping[str, Any]) -> list[Query]:
    return [
        Query(name, panel.get("title", ""), t["refId"], t["expr"], bool(t.get("instant")))
        for panel in panels(board)
        for t in panel.get("targets", [])
    ]


def variable_exprs(board: Mapping[str, Any]) -> list[str]:
    """The PromQL each query variable runs."""
    return [label_values(v["query"])[0] for v in variables(board) if v["type"] == "query"]


def substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` with Grafana's variables replaced from ``values``, the interval variables from
    BUILTIN_VALUES unless given; an unknown variable is an error."""
    return dashboards.substitute(text, {**BUILTIN_VALUES, **values})


# -- metric names in PromQL ----------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r"__name__\s*(=~|!=|!~|=)\s*(\"(?:[^\"\\]|\\.)*\")")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\[\[\w+\]\]|\$\w+")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NUMBER = re.compile(
    r"(?<![\w:.])(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[a-zA-Z]*"
)
_IDENT = re.compile(r"(?<![\w:])[A-Za-z_:][\w:]*(?![\w:])(?!\s*\()")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless"}
    | {"bool", "offset", "atan2", "inf", "nan"}
    # aggregation operators: `sum by (x) (...)` leaves `sum` before a keyword, not a `(`
    | {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"}
    | {"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
)


def series_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: neither functions, keywords, label names nor
    label values (selection by ``__name__`` is only understood with ``=``)."""
    names = set()
    for op, value in _NAME_MATCHER.findall(expr):
        if op != "=":
            raise ValueError(f"expected __name__ selected with =, got {op} in {expr!r}")
        names.add(json.loads(value))
    code = re.sub(r"#[^\n]*", "", _STRING.sub('""', expr))
    code = _VARIABLE.sub("", code)
    code = re.sub(r"\{[^{}]*\}", "", code)  # label matchers
    code = re.sub(r"\[[^\[\]]*\]", "", code)  # ranges and subqueries
    code = _GROUPING.sub(r"\1", code)
    code = _NUMBER.sub("", code)
    names.update(n for n in _IDENT.findall(code) if n.lower() not in _KEYWORDS)
    return names
