"""The compose files as docker-compose resolves them (moved from tests/unit/test_deploy.py: each
runs docker-compose config)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "docker-compose.yml"
GPU = ROOT / "docker-compose.gpu.yml"
#: Every combination of compose files the README tells users to run.
COMBINATIONS = {"base": [BASE], "base+gpu": [BASE, GPU]}


def _compose_config(
    files: list[Path], env: dict[str, str], tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    binary = require_binary("docker-compose")
    # An empty env file: a developer's .env (where the password may live) must not stand in
    # for the environment under test.
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    clean = {k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    command = [binary, "--env-file", str(env_file)]
    for path in files:
        command += ["-f", str(path)]
    return subprocess.run(
        [*command, "config", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, **env},
        check=False,
    )


def _resolved(files: list[Path], tmp_path: Path) -> dict[str, Any]:
    result = _compose_config(files, {"GRAFANA_ADMIN_PASSWORD": "x"}, tmp_path)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_compose_files_are_valid(combination: str, tmp_path: Path) -> None:
    files = COMBINATIONS[combination]
    result = _compose_config(files, {"GRAFANA_ADMIN_PASSWORD": "test-only"}, tmp_path, "-q")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_compose_refuses_to_start_without_the_grafana_password(
    combination: str, tmp_path: Path
) -> None:
    for env in ({}, {"GRAFANA_ADMIN_PASSWORD": ""}):
        result = _compose_config(COMBINATIONS[combination], env, tmp_path, "-q")
        assert result.returncode != 0, env
        assert "set GRAFANA_ADMIN_PASSWORD" in result.stderr, result.stderr
        assert "there is no default" in result.stderr, result.stderr


def test_grafana_password_comes_from_the_environment(tmp_path: Path) -> None:
    result = _compose_config([BASE], {"GRAFANA_ADMIN_PASSWORD": "s3cret-from-env"}, tmp_path)
    assert result.returncode == 0, result.stderr
    grafana_env = yaml.safe_load(result.stdout)["services"]["grafana"]["environment"]
    assert grafana_env["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret-from-env"
    assert grafana_env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def _published(service: dict[str, Any]) -> list[tuple[str, int]]:
    """(host address, container port) of each port a resolved service publishes."""
    found = []
    for port in service.get("ports", []):
        if isinstance(port, dict):  # long syntax
            found.append((str(port.get("host_ip", "")), int(port["target"])))
        else:
            host, _, rest = str(port).rpartition(":")
            address = host.rsplit(":", 1)[0] if host.count(":") else ""
            found.append((address, int(rest.split("/")[0])))
    return found


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_only_inference_and_grafana_are_published_and_on_loopback(
    combination: str, tmp_path: Path
) -> None:
    services = _resolved(COMBINATIONS[combination], tmp_path)["services"]
    published = {name: _published(service) for name, service in services.items()}
    for name, ports in published.items():
        for address, _ in ports:
            assert address == "127.0.0.1", f"{name} publishes on {address or 'every address'}"
    # docs/security.md: TorchServe's inference API and Grafana; Prometheus, the exporter and
    # TorchServe's management and metrics APIs stay inside the compose network.
    assert {name: [p for _, p in ports] for name, ports in published.items() if ports} == {
        "torchserve": [8080],
        "grafana": [3000],
    }


def test_gpu_override_reserves_nvidia_gpus_and_builds_with_cuda(tmp_path: Path) -> None:
    services = _resolved([BASE, GPU], tmp_path)["services"]
    torchserve = services["torchserve"]
    (device,) = torchserve["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    # The CPU wheel index is the Dockerfile's default; the override clears it.
    assert torchserve["build"]["args"]["TORCH_INDEX_URL"] == ""
    assert "ARG TORCH_INDEX_URL=" in (ROOT / "deploy/Dockerfile").read_text()
    # The exporter runs the same image as the TorchServe it reads.
    assert services["hookwatch-exporter"]["image"] == torchserve["image"]
