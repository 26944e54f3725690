"""`hookwatch units` against a running exporter: the candidates a served model's metrics show,
listed from the exporter's HTTP endpoint (moved from tests/unit/test_views.py: it starts the
metrics server)."""

from __future__ import annotations

import pytest

import hookwatch
from hookwatch._metrics import MetricSet
from hookwatch.tools import units
from hookwatch.tools.cli import main
from tests.unit.test_views import _inputs, _serve

pytestmark = pytest.mark.integration


def test_hookwatch_units_lists_the_candidates_from_a_running_exporter(
    metrics: MetricSet, capsys: pytest.CaptureFixture[str]
) -> None:
    _serve(metrics, _inputs())
    with hookwatch.serve_metrics(0, metrics=metrics) as server:
        url = f"http://127.0.0.1:{server.port}"
        (act,) = units.from_exporter(url)
        assert (act.model, act.layer, act.dead, act.stuck) == ("m", "act", [0], [1])
        assert act.samples == sum(len(x) for x in _inputs())
        assert main(["units", "--exporter", url]) == 0
    out = capsys.readouterr().out
    assert "m/act: 6 units tracked" in out
    assert "never active: 17 % (reference 17 %): 0" in out
    assert "saturated:    17 % (reference 17 %): 1" in out
    # Nothing listening any more: one line, exit 2.
    assert main(["units", "--exporter", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hookwatch units: error:")
