"""Alerting rules: their conventions, every alert has a promtool test, names are real.

promtool itself (it accepts the rules, every alert unit-tested both ways):
tests/integration/test_rules_promtool.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from hookwatch._catalogue import exposed_names
from hookwatch.tools import assets
from tests import grafana
from tests.grafana import PROMETHEUS_SERIES, TORCHSERVE_METRICS, series_names

ROOT = Path(__file__).resolve().parents[2]
#: The repository's promtool tests (run by tests/integration/test_rules_promtool.py); they load
#: ../rules, monitoring/'s export of the package's rules (tests/unit/test_export.py keeps it equal).
PROM = ROOT / "monitoring" / "prometheus"
RULE_FILES = sorted(assets.RULES.glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))
RUNBOOK = ROOT / "docs" / "runbook.md"
#: The package's runbook_url: relative to the rule file, the runbook shipped beside the rules
#: (tests/unit/test_runbook.py resolves every one, in the package and in each export).
RUNBOOK_URL = "../../docs/runbook.md"
ALERT_NAME = re.compile(r"Hookwatch(?:[A-Z][a-z0-9]*)+")


def rules() -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def _dashboard_exprs() -> Iterator[tuple[str, str]]:
    """Every query of every dashboard: panel targets and the variables' selectors."""
    boards = grafana.load()
    # A wrong path or an empty directory must not make the name check pass vacuously.
    assert len(boards) >= 3, f"expected the dashboards in {grafana.DASHBOARDS}, found {boards}"
    for name, board in boards.items():
        for query in grafana.queries(name, board):
            yield str(query), query.expr
        for expr in grafana.variable_exprs(board):
            yield f"{name} / variables", expr


def unknown_series(exprs: list[tuple[str, str]], recorded: set[str]) -> list[str]:
    """One line per series name an expression reads that nothing exports or records."""
    known = exposed_names() | TORCHSERVE_METRICS | PROMETHEUS_SERIES
    problems = []
    for where, expr in exprs:
        for name in sorted(series_names(str(expr))):
            if ":" in name and name not in recorded:
                problems.append(f"{where}: {name} is recorded by no rule")
            elif ":" not in name and name not in known:
                problems.append(
                    f"{where}: {name} is not in hookwatch._catalogue (nor TorchServe's allow-list"
                    " in tests/grafana.py, nor a series Prometheus writes)"
                )
    return problems


def test_there_are_rule_and_test_files() -> None:
    assert RULE_FILES, f"expected rule files in {assets.RULES}"
    assert TEST_FILES, "expected promtool tests in monitoring/prometheus/tests"


def test_alert_conventions() -> None:
    found = alerts()
    assert found
    headings = set(re.findall(r"^## (\S+)$", RUNBOOK.read_text(), flags=re.MULTILINE))
    for alert in found:
        name = alert["alert"]
        assert ALERT_NAME.fullmatch(name), f"expected CamelCase Hookwatch*, got {name!r}"
        assert alert.get("for", "0s") not in ("0s", "0m"), f"{name}: expected a for: window"
        assert alert.get("labels", {}).get("severity") in ("warning", "critical"), name
        notes = alert.get("annotations", {})
        assert {"summary", "description", "runbook_url"} <= set(notes), name
        assert notes["runbook_url"] == f"{RUNBOOK_URL}#{name.lower()}", name
        assert name in headings, f"docs/runbook.md has no '## {name}' section"
    names = [a["alert"] for a in found]
    assert len(names) == len(set(names)), names


def test_every_alert_is_unit_tested() -> None:
    tested = {
        case["alertname"]
        for path in TEST_FILES
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    }
    assert tested == {a["alert"] for a in alerts()}


def test_series_names_reads_metric_names_only() -> None:
    expr = (
        'sum by (model) (rate(hookwatch_captures_dropped_total{layer="hookwatch_fake"}[5m]))'
        " / on(model) group_left (layer) job:hookwatch_requests:rate5m > bool 0.5e-3"
        " and topk(3, max without (instance) (Requests4XX offset 5m)) # not_a_metric here\n"
        ' or label_replace(up{job=~"$job"}, "a", "$1", "b", "(.*)") unless ALERTS'
        '[${__range}:1m] + {__name__="ts_queue_latency_microseconds"} * inf'
    )
    assert series_names(expr) == {
        "hookwatch_captures_dropped_total",
        "job:hookwatch_requests:rate5m",
        "Requests4XX",
        "up",
        "ALERTS",
        "ts_queue_latency_microseconds",
    }


def test_every_metric_in_rules_and_dashboards_is_catalogued() -> None:
    recorded = {r["record"] for r in rules() if "record" in r}
    exprs = [(f"rules/{path.name}", r["expr"]) for path in RULE_FILES for r in _rules(path)]
    exprs += list(_dashboard_exprs())
    assert unknown_series(exprs, recorded) == []
    used = {name for _, expr in exprs for name in series_names(str(expr))}
    # The check ran on real expressions: the alerts read these catalogued metrics, the
    # dashboards the drift ones, a recorded fleet score and TorchServe's own.
    assert {
        "hookwatch_activation_nonfinite_total",
        "hookwatch_captures_dropped_total",
        "hookwatch_activation_statistic_sum",
        "hookwatch_layer_enabled",
        "hookwatch_drift_evidence_threshold",
        "model_detector:hookwatch_drift_fleet_score:increase10m",
        "ts_inference_requests_total",
    } <= used
    # Every allow-listed TorchServe metric is used: the list names nothing it need not.
    assert used >= TORCHSERVE_METRICS


def test_a_dashboard_naming_an_unknown_metric_fails_the_check() -> None:
    recorded = {r["record"] for r in rules() if "record" in r}
    bad = [
        ("a dashboard", 'sum(rate(hookwatch_not_catalogued_total{model="$model"}[5m]))'),
        ("a dashboard", "sum(rate(ts_inference_requests[5m]))"),
        ("a dashboard", "max(model_detector:hookwatch_drift_fleet_score:increase1h)"),
    ]
    problems = unknown_series(bad, recorded)
    assert len(problems) == 3, problems
    assert "hookwatch_not_catalogued_total is not in hookwatch._catalogue" in problems[0]
    assert "ts_inference_requests is not" in problems[1]
    assert "increase1h is recorded by no rule" in problems[2]


def _rules(path: Path) -> Iterator[dict[str, Any]]:
    for group in yaml.safe_load(path.read_text())["groups"]:
        yield from group["rules"]
