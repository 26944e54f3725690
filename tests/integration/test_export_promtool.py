"""promtool on an export with renamed jobs (moved from tests/unit/test_export.py: it runs
promtool). promtool is a real component: missing, this skips locally and fails under CI=true."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hookwatch.tools.export import ExportOptions, export
from tests.conftest import require_binary

pytestmark = pytest.mark.integration


def test_promtool_checks_an_export_with_renamed_jobs(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    export(
        tmp_path,
        ExportOptions(exporter_job="hw", torchserve_job="ts", namespace="ml", scrape_interval="1m"),
    )
    rules = sorted((tmp_path / "prometheus" / "rules").glob("*.yml"))
    result = subprocess.run(
        [promtool, "check", "rules", *map(str, rules)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for path in rules:
        assert path.name in result.stdout, f"the exported prometheus.yml does not load {path.name}"
