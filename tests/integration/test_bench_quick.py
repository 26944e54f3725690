"""``python -m dev bench --quick`` (``make bench-quick``) end to end: real TorchServe, every
variant, a well-formed table.

Only the shape of the result is checked, never a timing: the numbers belong to the table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hookwatch.tools.bench.stats import VARIANTS
from tests.conftest import MAR, ROOT, require, require_binary

pytestmark = pytest.mark.integration


def test_quick_bench_writes_a_table_with_every_variant(tmp_path: Path) -> None:
    require(MAR.exists(), f"{MAR} (make mar builds it)")
    require_binary("java")
    out = tmp_path / "results.md"
    cmd = [sys.executable, "-m", "dev", "bench", "--quick", "--root", str(ROOT)]
    cmd += ["--out", str(out), "--work", str(tmp_path / "work")]
    done = subprocess.run(
        cmd,
        cwd=ROOT,  # dev/ is a folder of the repository, not installed
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    for group in ("### digits, batch 1", "### digits, batch 8"):
        section = text.split(group, 1)[1].split("###", 1)[0]
        for variant in VARIANTS[1:]:
            row = next(line for line in section.splitlines() if line.startswith(f"| {variant} |"))
            # seven metrics (throughput, p50, p99 closed; p50, p99 open; worker and machine
            # CPU), each min / **median** / max, then the latencies behind the p99s
            assert row.count("**") == 14, row
            assert row.rstrip(" |").split(" | ")[-1].count(" / ") == 2, row
        assert "Failed requests in this group: 0." in section
    for heading in ("## Targets (CPU)", "### Exporter scrape", "### Memory", "## GPU"):
        assert heading in text
    assert "Drift detection was on in every monitored variant" in text
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["settings"]["mode"] == "quick"
    for group in data["groups"]:
        # The bench stops when a monitored worker has no drift profile: both are recorded on.
        assert group["drift_loaded"] == {"default": True, "full": True}
        assert group["closed_s"] > 0 and group["open_s"] > 0
        rounds = data["settings"]["rounds"][group["model"]]
        assert len(group["closed"]) == len(group["opened"]) == rounds
        for segments in (*group["closed"], *group["opened"]):
            assert set(segments) == set(VARIANTS)
            assert all(s["requests"] > 0 and s["errors"] == 0 for s in segments.values())
        for segments in group["closed"]:
            # Every process's CPU over the window (Linux /proc/stat): the load generator and
            # the frontend alone make it positive.
            assert all(s["machine_cpu_ms"] > 0 for s in segments.values())
            assert all(0 < s["machine_busy"] <= 1 for s in segments.values())
            # Every p99 rests on the latencies the settings ask for (digits is fast enough).
            assert all(
                s["requests"] >= data["settings"]["min_latencies"] for s in segments.values()
            )
            # The worker's CPU time over the window, per request: read, positive, plausible.
            assert all(0 < s["cpu_ms"] < 1000 for s in segments.values())
    assert {(row["monitored"], row["drift"]) for row in data["rss"]} == {
        (True, True),
        (False, False),
    }
    assert [h["model"] for h in data["hook_costs"]] == ["digits"]
    assert data["scrape"]["scrapes"] > 0
