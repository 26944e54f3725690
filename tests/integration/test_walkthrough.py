"""README's "Monitor your own model": its commands, run as written, on the repository's two
stand-in models, against the real TorchServe, exporter and Prometheus.

The commands run one at a time in bash, in a copy of the files they name, with `.venv/bin` on
PATH (what `. .venv/bin/activate` gives) and free loopback ports in the port variables. A
command that ends in ``&`` runs in the background; the test waits for the model to be ready
before the next command, as a person at a second terminal would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hookwatch.tools.devstack import PORT_ENV, Ports, http_get
from tests.conftest import require, require_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def walkthrough(name: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- walkthrough: {name} -->\n```sh\n(.*?)```", text, re.S)
    assert match, f"README.md has no walkthrough block {name!r}"
    return [line for line in match.group(1).splitlines() if line.strip()]


class Block:
    """The commands of one walkthrough block, run one after the other."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.outputs: list[str] = []
        self.background: list[subprocess.Popen[str]] = []

    def run(self, lines: list[str]) -> None:
        for line in lines:
            if line.rstrip().endswith("&"):
                self.background.append(
                    subprocess.Popen(
                        ["bash", "-c", line.rstrip()[:-1]],
                        cwd=self.cwd,
                        env=self.env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
                wait_ready(self.env, line, self.background[-1])
                continue
            done = subprocess.run(
                ["bash", "-c", line],
                cwd=self.cwd,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            self.outputs.append(done.stdout)

    def finish(self) -> None:
        """The backgrounded commands have ended, cleanly (after `hookwatch stop`)."""
        for proc in self.background:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out[-3000:]
            assert "stopped TorchServe, exporter and Prometheus" in out
            if "  hookwatch exporter  http://" not in out:
                continue  # stopped while still starting (its readiness wait had not seen it)
            # Started, `hookwatch stop` let `hookwatch serve` try its report before the stack
            # went: a stop seconds after the start may come before Prometheus' first scrape,
            # and then the report says so in one line.
            outcome = [line for line in out.splitlines() if line.startswith("report")]
            assert len(outcome) == 1, out[-3000:]
            assert outcome[0].startswith(("report: ", "report not written: expected samples"))

    def kill(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)


def wait_ready(env: dict[str, str], line: str, proc: subprocess.Popen[str]) -> None:
    model = Path(line.split()[2]).stem
    url = f"http://127.0.0.1:{env['TS_MANAGEMENT_PORT']}/models/{model}"
    exporter = f"http://127.0.0.1:{env['HOOKWATCH_EXPORTER_PORT']}/metrics"
    prometheus = f"http://127.0.0.1:{env['PROMETHEUS_PORT']}/-/ready"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        try:
            status, body = http_get(url, timeout=2)
            ready = status == 200 and any(
                w.get("status") == "READY" for w in json.loads(body)[0].get("workers", [])
            )
            if (
                ready
                and http_get(exporter, timeout=2)[0] == 200
                and http_get(prometheus, timeout=2)[0] == 200
            ):
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{line}: not ready in 240 s")


@pytest.fixture
def workdir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    require_binary("java")
    require_binary("prometheus")
    require_binary("curl")
    for name in ("models", "monitoring"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "config.properties", tmp_path / "config.properties")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    ports = Ports.free()
    env = {
        **os.environ,
        **{PORT_ENV[field]: str(getattr(ports, field)) for field in PORT_ENV},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return tmp_path, env


def test_the_image_classifier_walkthrough(workdir: tuple[Path, dict[str, str]]) -> None:
    cwd, env = workdir
    block = Block(cwd, env)
    try:
        block.run(walkthrough("imagenet"))
        block.finish()
    finally:
        block.kill()
    out = block.outputs
    layers, answer = out[1], json.loads(out[-2])
    # --depth 2: the blocks, not their insides; the wide head is marked as projected.
    assert "features.1 " in layers and " Block " in layers and "features.0.relu" not in layers
    assert "head" in layers and "projected to 255 components" in layers
    assert (cwd / "build/imagenet-config.yaml").read_text().count("layers: [") == 1
    assert 0 <= answer["class"] < 1000 and len(answer["top"]) == 5
    assert (cwd / "model_store/imagenet.mar").is_file()


def test_the_regression_walkthrough(workdir: tuple[Path, dict[str, str]]) -> None:
    cwd, env = workdir
    lines = walkthrough("regression")
    block = Block(cwd, env)
    # Check the served metrics while the stack runs: everything but the final stop first.
    block.run(lines[:-1])
    answer = json.loads(block.outputs[-1])
    assert set(answer) == {"values"} and len(answer["values"]) == 1
    metrics = ""
    deadline = time.monotonic() + 20
    exporter = f"http://127.0.0.1:{env['HOOKWATCH_EXPORTER_PORT']}/metrics"
    while time.monotonic() < deadline:
        metrics = http_get(exporter)[1].decode()
        if 'hookwatch_captures_total{layer="input",model="regression"} 1.0' in metrics:
            break
        time.sleep(0.5)
    try:
        assert 'hookwatch_drift_profile_loaded{model="regression"} 1.0' in metrics
        # The keyword-argument input and both GELU layers were captured, nothing faulted.
        for layer in ("input", "body.1", "body.3", "output"):
            assert f'hookwatch_captures_total{{layer="{layer}",model="regression"}} 1.0' in metrics
            assert (
                f'hookwatch_monitor_faults_total{{layer="{layer}",model="regression"}} 0.0'
                in metrics
            )
        # A values head: one output detector, no softmax-derived ones.
        assert 'detector="output",level="output"' in metrics
        assert 'detector="confidence"' not in metrics
        assert "hookwatch_reference_activation_statistic" in metrics
        block.run(lines[-1:])
        block.finish()
    finally:
        block.kill()


def test_the_text_walkthrough(workdir: tuple[Path, dict[str, str]]) -> None:
    require(Path("/usr/share/games/fortunes/computers").is_file(), "Debian fortunes (make deps)")
    cwd, env = workdir
    lines = walkthrough("text")
    block = Block(cwd, env)
    block.run(lines[:-1])
    one, two = json.loads(block.outputs[-2]), json.loads(block.outputs[-1])
    try:
        assert set(one) == {"embedding"} and len(one["embedding"]) == 384
        assert isinstance(two, list) and [len(a["embedding"]) for a in two] == [384, 384]
        assert abs(sum(v * v for v in one["embedding"]) - 1.0) < 1e-4  # normalised
        # The pretrained directory travelled with the model; its weights are stored once.
        assert (cwd / "model_store/minilm.mar").stat().st_size < 120 * 2**20
        metrics = ""
        exporter = f"http://127.0.0.1:{env['HOOKWATCH_EXPORTER_PORT']}/metrics"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            metrics = http_get(exporter)[1].decode()
            if 'hookwatch_requests_total{model="minilm"} 2.0' in metrics:
                break
            time.sleep(0.5)
        assert 'hookwatch_requests_total{model="minilm"} 2.0' in metrics
        assert 'hookwatch_drift_profile_loaded{model="minilm"} 1.0' in metrics
        for layer in ("input", "encoder.encoder.layer.3.output", "output"):
            assert (
                f'hookwatch_monitor_faults_total{{layer="{layer}",model="minilm"}} 0.0' in metrics
            )
        block.run(lines[-1:])
        block.finish()
    finally:
        block.kill()
