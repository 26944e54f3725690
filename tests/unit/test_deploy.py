"""The docker-compose deployment agrees with the Prometheus and Grafana configs.

`docker-compose config` validating and resolving the files:
tests/integration/test_deploy_compose.py.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests import grafana

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "docker-compose.yml"
GPU = ROOT / "docker-compose.gpu.yml"
#: Every combination of compose files the README tells users to run.
COMBINATIONS = {"base": [BASE], "base+gpu": [BASE, GPU]}
#: The label that marks a service Prometheus scrapes, with the port it scrapes.
SCRAPE_LABEL = "hookwatch.scrape.port"


def test_every_compose_file_is_checked() -> None:
    assert set(ROOT.glob("docker-compose*.yml")) == {p for fs in COMBINATIONS.values() for p in fs}


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
