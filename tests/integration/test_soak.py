"""The soak's 1-minute form (``make soak`` runs 10 minutes and commits docs/soak/): the stack
at 70 % of its measured capacity with 5 % bad requests and a worker killed halfway; every
check of :func:`dev.soak.report.check` holds, with the RSS and descriptor bounds of
``Settings.quick``: 10 times looser than the full soak's (a fit over well under a minute is
noisy), as docs/soak/README.md and README.md say."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.soak import report, runner
from hookwatch.tools.devstack import Ports
from tests.conftest import MAR, require, require_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_one_minute_soak(tmp_path: Path) -> None:
    require(MAR.exists(), f"{MAR} (make mar builds it)")
    require_binary("java")
    require_binary("prometheus")
    result = runner.run(ROOT, runner.Settings.quick(60.0), tmp_path / "work", Ports.free())
    problems = report.write(result, tmp_path / "report")
    assert problems == [], "\n".join(problems)
    figures = report.traffic_figures(result)
    assert result["kill"]["t"] and result["kill"]["replaced_t"]
    assert figures["bad"] > 0 and figures["torchserve"] == figures["sent"]
    assert result["offered_per_s"] == pytest.approx(0.7 * result["capacity"]["requests_per_s"])
    for plot in report.PLOTS:
        assert (tmp_path / "report" / plot).stat().st_size > 10_000
