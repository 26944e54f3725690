"""Alerting rules: promtool accepts them, every alert is unit-tested both ways, names are real.

promtool is a real component: missing, these tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hookwatch._catalogue import exposed_names
from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "monitoring" / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/hookwatch/hookwatch/blob/main/docs/runbook.md"
ALERT_NAME = re.compile(r"Hookwatch(?:[A-Z][a-z0-9]*)+")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def rules() -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def referenced_metrics(expr: str) -> set[str]:
    """Series names a PromQL expression reads: hookwatch_* metrics and recorded series."""
    code = _STRING.sub('""', expr)  # label values are data, not names
    return {
        name
        for name in _IDENT.findall(code)
        if name.startswith("hookwatch_") or (":" in name and not name.startswith(":"))
    }


def _dashboard_exprs() -> Iterator[tuple[str, str]]:
    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    yield value
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    for path in sorted((ROOT / "monitoring").rglob("*.json")):
        for expr in walk(json.loads(path.read_text())):
            yield str(path.relative_to(ROOT)), expr


def _promtool(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool")
    return subprocess.run(
        [binary, *map(str, args)], capture_output=True, text=True, cwd=cwd, check=False
    )


def test_there_are_rule_and_test_files() -> None:
    assert RULE_FILES, "expected rule files in monitoring/prometheus/rules"
    assert TEST_FILES, "expected promtool tests in monitoring/prometheus/tests"


def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_config_loads_the_rule_files() -> None:
    result = _promtool("check", "config", PROM / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    for path in RULE_FILES:
        assert path.name in result.stdout, f"prometheus.yml does not load {path.name}"


def test_promtool_test_rules() -> None:
    result = _promtool("test", "rules", *TEST_FILES, cwd=PROM / "tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


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


def _mutated_suite(tmp_path: Path, alert: str, change: dict[str, Any]) -> Path:
    """Copies of the rules and tests where one alert's fields are replaced."""
    (tmp_path / "rules").mkdir(parents=True)
    for path in RULE_FILES:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == alert:
                    rule.update(change)
        (tmp_path / "rules" / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copytree(PROM / "tests", tmp_path / "tests")
    return tmp_path / "tests"


@pytest.mark.parametrize("alert", [a["alert"] for a in alerts()])
def test_each_alert_has_a_firing_and_a_not_yet_firing_case(alert: str, tmp_path: Path) -> None:
    # An alert that never fires must break a test: the suite has a firing case for it.
    never = _mutated_suite(tmp_path / "never", alert, {"expr": "vector(1) < 0"})
    result = _promtool("test", "rules", *sorted(never.glob("*.yml")), cwd=never)
    report = result.stdout + result.stderr
    assert result.returncode != 0 and f"alertname: {alert}," in report, report
    # The same alert without its for: window must break a test too: the suite has a case
    # where the condition holds but the alert is still pending (or below threshold).
    eager = _mutated_suite(tmp_path / "eager", alert, {"for": "0s"})
    result = _promtool("test", "rules", *sorted(eager.glob("*.yml")), cwd=eager)
    report = result.stdout + result.stderr
    assert result.returncode != 0 and f"alertname: {alert}," in report, report


def test_referenced_metrics_parser() -> None:
    expr = (
        'sum by (model) (rate(hookwatch_captures_dropped_total{layer="hookwatch_fake"}[5m]))'
        " / on(model) job:hookwatch_requests:rate5m > 0.5"
    )
    assert referenced_metrics(expr) == {
        "hookwatch_captures_dropped_total",
        "job:hookwatch_requests:rate5m",
    }


def test_every_metric_in_rules_and_dashboards_is_catalogued() -> None:
    known = exposed_names()
    recorded = {r["record"] for r in rules() if "record" in r}
    exprs = [(str(path.relative_to(ROOT)), r["expr"]) for path in RULE_FILES for r in _rules(path)]
    exprs += list(_dashboard_exprs())
    used: set[str] = set()
    for where, expr in exprs:
        for name in referenced_metrics(str(expr)):
            used.add(name)
            if ":" in name:
                assert name in recorded, f"{where}: {name} is recorded by no rule"
            else:
                assert name in known, f"{where}: {name} is not in hookwatch._catalogue"
    # The check ran on real expressions: the alerts read these catalogued metrics.
    assert {
        "hookwatch_activation_nonfinite_total",
        "hookwatch_captures_dropped_total",
        "hookwatch_activation_statistic_sum",
        "hookwatch_layer_enabled",
    } <= used


def _rules(path: Path) -> Iterator[dict[str, Any]]:
    for group in yaml.safe_load(path.read_text())["groups"]:
        yield from group["rules"]
