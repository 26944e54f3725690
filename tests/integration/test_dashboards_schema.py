"""The dashboards type-checked with tsc against Grafana's Dashboard type (node; moved from
tests/unit/test_dashboards.py: they start processes)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import grafana
from tests.conftest import require, require_binary

pytestmark = pytest.mark.integration

#: File name -> uid. Links, bookmarks and alert annotations point at uids: changing one breaks
#: them, so a change must be deliberate and show up here.
UIDS = {
    "overview.json": "hookwatch-overview",
    "activations.json": "hookwatch-activations",
    "drift.json": "hookwatch-drift",
    "units.json": "hookwatch-units",
}


def _schema_check(*paths: Path) -> subprocess.CompletedProcess[str]:
    node = require_binary("node")
    require(
        (grafana.SCHEMA_CHECK / "node_modules" / "@grafana" / "schema").is_dir(),
        f"npm packages in {grafana.SCHEMA_CHECK} (make dashboards-check installs them)",
    )
    return subprocess.run(
        [node, "check.mjs", *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=grafana.SCHEMA_CHECK,
        check=False,
    )


def test_schema_check_accepts_the_dashboards() -> None:
    result = _schema_check(grafana.DASHBOARDS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(UIDS)} dashboard(s) satisfy Dashboard of @grafana/schema" in result.stdout


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("break_it", "needle", "message"),
    [
        # a grid position that is not one
        (lambda b: b["panels"][1].update(gridPos="x"), '"gridPos": "x"', "TS2322"),
        # a threshold mode Grafana does not have
        (
            lambda b: b["panels"][1]["fieldConfig"]["defaults"]["thresholds"].update(
                mode="absolut"
            ),
            '"mode": "absolut"',
            "TS2820",
        ),
        # a misspelt property Grafana would silently ignore
        (lambda b: b.update(refersh="30s"), '"refersh"', "TS2353"),
        # a variable without a type (reported at the variable's opening brace)
        (lambda b: b["templating"]["list"][1].pop("type"), '"name": "model"', "TS2741"),
    ],
    ids=["gridPos", "threshold-mode", "unknown-property", "variable-type"],
)
def test_schema_check_rejects_a_broken_dashboard(
    tmp_path: Path, break_it: Any, needle: str, message: str
) -> None:
    board = json.loads((grafana.DASHBOARDS / "overview.json").read_text())
    break_it(board)
    broken = tmp_path / "broken.json"
    text = json.dumps(board, indent=2, ensure_ascii=False)
    broken.write_text(text)
    shutil.copy(grafana.DASHBOARDS / "drift.json", tmp_path / "drift.json")
    result = _schema_check(tmp_path)
    report = result.stdout + result.stderr
    assert result.returncode != 0, report
    # Reported against the JSON file, on the line of the fault (a missing property: on the
    # line that opens its object); the sound file beside it raises nothing.
    line = _line_of(text, needle) - (message == "TS2741")
    assert re.search(rf"broken\.json\({line},\d+\): error {message}\b", report), report
    assert "drift.json" not in report, report
