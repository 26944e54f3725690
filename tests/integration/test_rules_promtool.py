"""Alerting rules through promtool: it accepts them, and every alert is unit-tested both ways
(moved from tests/unit/test_rules.py: they run promtool). promtool is a real component: missing,
these skip locally and fail under CI=true."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hookwatch.tools import assets
from tests.conftest import require_binary
from tests.unit.test_rules import alerts

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The repository's promtool tests; they load ../rules, monitoring/'s export of the package's
#: rules (tests/unit/test_export.py keeps it equal), and _mutated_suite the package's own.
PROM = ROOT / "monitoring" / "prometheus"
RULE_FILES = sorted(assets.RULES.glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))


def _promtool(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool")
    return subprocess.run(
        [binary, *map(str, args)], capture_output=True, text=True, cwd=cwd, check=False
    )


def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_config_loads_the_rule_files() -> None:
    result = _promtool("check", "config", assets.PROMETHEUS_CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in RULE_FILES:
        assert path.name in result.stdout, f"prometheus.yml does not load {path.name}"


def test_promtool_test_rules() -> None:
    result = _promtool("test", "rules", *TEST_FILES, cwd=PROM / "tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _mutated_suite(tmp_path: Path, alert: str, change: dict[str, Any]) -> Path:
    """Copies of the rules and tests where one alert's fields are replaced: monitoring/'s export
    of the package's rules (test_export keeps it equal to them), whose runbook_url the tests'
    expected annotations name."""
    (tmp_path / "rules").mkdir(parents=True)
    for path in sorted((PROM / "rules").glob("*.yml")):
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
