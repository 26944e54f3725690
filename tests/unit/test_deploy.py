"""The docker-compose deployment stays valid and agrees with the Prometheus scrape config."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid() -> None:
    binary = require_binary("docker-compose")
    result = subprocess.run(
        [binary, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_prometheus_targets_are_compose_services_and_ports() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    prometheus = yaml.safe_load((ROOT / "monitoring/prometheus/prometheus.yml").read_text())
    exposed = {
        name: {int(p.rsplit(":", 1)[-1]) for p in service.get("ports", [])}
        for name, service in compose["services"].items()
    }
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for group in job["static_configs"]
        for t in group["targets"]
    ]
    assert targets
    for target in targets:
        host, port = target.rsplit(":", 1)
        assert host in exposed, f"{target}: no compose service {host!r}"
        assert int(port) in exposed[host], f"{target}: {host} does not expose {port}"


def test_dockerfile_copies_only_paths_that_exist() -> None:
    for line in (ROOT / "deploy/Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
