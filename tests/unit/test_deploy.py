"""The docker-compose deployment stays valid and agrees with the Prometheus and Grafana configs.

No Docker engine is needed: `docker-compose config` validates and resolves the files.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import grafana
from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "docker-compose.yml"
GPU = ROOT / "docker-compose.gpu.yml"
#: Every combination of compose files the README tells users to run.
COMBINATIONS = {"base": [BASE], "base+gpu": [BASE, GPU]}
#: The label that marks a service Prometheus scrapes, with the port it scrapes.
SCRAPE_LABEL = "hookwatch.scrape.port"


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


def test_every_compose_file_is_checked() -> None:
    assert set(ROOT.glob("docker-compose*.yml")) == {p for fs in COMBINATIONS.values() for p in fs}


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


def test_torchserve_properties_agree_with_compose() -> None:
    properties = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy/torchserve.properties").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    compose = yaml.safe_load(BASE.read_text())["services"]["torchserve"]
    assert properties["inference_address"] == "http://0.0.0.0:8080"
    assert properties["metrics_address"] == f"http://0.0.0.0:{compose['labels'][SCRAPE_LABEL]}"
    assert properties["metrics_mode"] == "prometheus"
    # The healthcheck reaches the management API inside the container.
    management_port = properties["management_address"].rsplit(":", 1)[1]
    assert f"127.0.0.1:{management_port}/" in " ".join(compose["healthcheck"]["test"])


def test_prometheus_scrapes_exactly_the_compose_services_that_expose_metrics() -> None:
    services = yaml.safe_load(BASE.read_text())["services"]
    prometheus = yaml.safe_load((ROOT / "monitoring/prometheus/prometheus.yml").read_text())
    expected = {
        f"{name}:{service['labels'][SCRAPE_LABEL]}"
        for name, service in services.items()
        if SCRAPE_LABEL in service.get("labels", {})
    }
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for group in job["static_configs"]
        for t in group["targets"]
    ]
    assert expected == {"torchserve:8082", "hookwatch-exporter:9101"}
    assert sorted(targets) == sorted(expected)
    # Each scraped port is one the service's container listens on for the compose network.
    for target in expected:
        name, port = target.rsplit(":", 1)
        assert port in [str(p) for p in services[name].get("expose", [])], target


def test_grafana_is_provisioned_from_the_repository() -> None:
    service = yaml.safe_load(BASE.read_text())["services"]["grafana"]
    image, _, tag = service["image"].partition(":")
    assert image == "grafana/grafana-oss" and tag.count(".") == 2, "expected a pinned OSS image"
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in service["volumes"] if ":ro" in v)
    assert mounts["./monitoring/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards_at = mounts["./monitoring/grafana/dashboards"]
    provider = yaml.safe_load(
        (grafana.GRAFANA / "provisioning/dashboards/hookwatch.yml").read_text()
    )
    assert [p["options"]["path"] for p in provider["providers"]] == [dashboards_at]
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dashboards_at + "/")
    assert (grafana.DASHBOARDS / home.rsplit("/", 1)[1]).exists(), home


def test_grafana_datasource_is_the_compose_prometheus_and_the_dashboards_default() -> None:
    provisioned = yaml.safe_load(
        (grafana.GRAFANA / "provisioning/datasources/prometheus.yml").read_text()
    )["datasources"]
    assert len(provisioned) == 1
    source = provisioned[0]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    prometheus = yaml.safe_load((ROOT / "monitoring/prometheus/prometheus.yml").read_text())
    assert source["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]
    for name, board in grafana.load().items():
        (variable,) = [v for v in grafana.variables(board) if v["name"] == "datasource"]
        assert variable["current"]["value"] == source["uid"], name


def test_dockerfile_copies_only_paths_that_exist() -> None:
    for line in (ROOT / "deploy/Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source


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
