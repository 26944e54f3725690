"""The text demo live (`make run-text`): MiniLM served by `hookwatch serve --traffic fortunes`,
held-out `computers` fortunes, then `literature`; the live table's drift rows light up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hookwatch.tools.devstack import PORT_ENV, Ports
from tests.conftest import ROOT, require, require_binary

pytestmark = pytest.mark.integration

TEXT_MAR = ROOT / "model_store" / "minilm.mar"
LAYERS = [f"encoder.encoder.layer.{i}.output" for i in range(6)]


def test_serving_fortunes_then_literature_shows_drift_in_the_live_table(tmp_path: Path) -> None:
    require(TEXT_MAR.is_file(), f"{TEXT_MAR} (make mar builds it)")
    require(Path("/usr/share/games/fortunes/literature").is_file(), "fortunes (make deps)")
    require_binary("java")
    require_binary("prometheus")
    # An empty folder: serve reads nothing of it (nor of the checkout).
    ports = Ports.free()
    env = {**os.environ, **{PORT_ENV[f]: str(getattr(ports, f)) for f in PORT_ENV}}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    hookwatch = str(Path(sys.executable).parent / "hookwatch")
    command = [hookwatch, "serve", str(TEXT_MAR), "--traffic", "fortunes"]
    command += ["--drift-after", "40", "--seconds", "95", "--rate", "10"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "sending held-out computers fortunes at 10/s, literature after 40 s" in out
    # The live view's frames while literature is sent (each starts with its clock time).
    frames = re.split(r"\n(?=\d\d:\d\d:\d\d  )", out)
    shifted = [f for f in frames if "client   sending literature;" in f]
    assert shifted, out[-3000:]
    # Once the windows hold literature, every block and the embedding are over threshold.
    last = shifted[-1]
    assert "DRIFT since" in last.lstrip("\n").splitlines()[0], last
    for detector in (*LAYERS, "output"):
        assert re.search(rf"\n    {re.escape(detector)} +[\d.]+ > +[\d.]+ .*PAST", last), last
    assert "stopped TorchServe, exporter and Prometheus" in out
    assert "run summary: " in out and "first alarm " in out
