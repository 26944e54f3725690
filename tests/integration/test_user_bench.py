"""``hookwatch bench MAR`` end to end: a model archived with ``hookwatch archive`` (the README
walk-through's regression MLP), served by a real TorchServe as the plain handler and as
hookwatch, the ratio table printed. Short rounds: only the table's shape is checked, never a
timing."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_binary
from tests.integration.helpers import hookwatch

pytestmark = pytest.mark.integration


def test_bench_prints_plain_against_hookwatch_for_an_archived_model(tmp_path: Path) -> None:
    require_binary("java")
    # The user's folder: their model file, config and reference data; no checkout in sight.
    shutil.copy(ROOT / "models/regression/model.py", tmp_path / "model.py")
    shutil.copy(ROOT / "models/regression/model-config.yaml", tmp_path / "model-config.yaml")
    subprocess.run(
        [sys.executable, str(ROOT / "models/regression/make_data.py"), str(tmp_path / "data")],
        check=True,
        capture_output=True,
    )
    archived = hookwatch(
        *("archive", "model.py:RegressionMLP", "--model-args", '{"inputs": 8}'),
        *("--name", "regression", "--config", "model-config.yaml"),
        *("--reference", "data/reference.jsonl", "--out", "store"),
        cwd=tmp_path,
        timeout=300,
    )
    assert archived.returncode == 0, archived.stdout + archived.stderr
    mar = tmp_path / "store" / "regression.mar"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    done = hookwatch(
        *("bench", str(mar), "--seconds", "2", "--rounds", "2", "--clients", "2", "--starts", "2"),
        *("--out", "bench.json"),
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout[done.stdout.index("| metric |") :]
    header = table.splitlines()[0]
    assert "| plain | hookwatch |" in header, table
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    assert [row.split("|")[1].strip() for row in rows] == [
        "throughput (req/s)",
        "p50 latency (ms)",
        "p99 latency (ms)",
    ]
    for row in rows:
        plain, monitored, ratio = (cell.strip() for cell in row.split("|")[2:5])
        assert float(plain) > 0 and float(monitored) > 0, row
        median = float(re.match(r"\*\*([0-9.]+)\*\*", ratio).group(1))  # type: ignore[union-attr]
        assert math.isfinite(median) and median > 0, row
    assert "on 2 start(s) of the workers" in done.stdout
    # Each start ran one round on worker processes of its own.
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["round_starts"] == [0, 1]
    first, second = saved["start_pids"]
    for variant in ("plain", "hookwatch"):
        assert first[variant] and second[variant], saved["start_pids"]
        assert not set(first[variant]) & set(second[variant]), saved["start_pids"]
    assert "plain: " in table and "hookwatch: " in table
    assert re.search(r"plain: \d+ requests, 0 errors, hookwatch: \d+ requests, 0 errors", table)
    # Only what --out named was written: the user's folder is otherwise as it was.
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert after == sorted([*before, Path("bench.json")])
    print(done.stdout)
