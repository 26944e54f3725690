"""``hookwatch export-monitoring``: what it writes, options that rename and label, bad
directories, and the repository's copies that must equal the package's. promtool on an export:
tests/integration/test_export_promtool.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

from hookwatch.tools import assets, cli
from hookwatch.tools.export import ExportOptions, export, render, set_runbook_base

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"
#: The repository's own parts of monitoring/ that the export does not write.
NOT_EXPORTED = ("prometheus/tests", "grafana/schema-check")
REGENERATE = "edit src/hookwatch/_assets and run `make monitoring`"
JOB_MATCHER = re.compile(r'\bjob\s*(=~|!~|!=|=)\s*\\?"([^"\\]*)')


def _tree(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): p.read_text()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _main(*argv: str | Path) -> int:
    return cli.main([str(a) for a in argv])


def _job_values(text: str) -> set[str]:
    return {v for _, value in JOB_MATCHER.findall(text) for v in value.split("|")}


def test_repository_monitoring_is_the_export_of_the_package(tmp_path: Path) -> None:
    makefile = (ROOT / "Makefile").read_text()
    (options,) = re.findall(r"^MONITORING_EXPORT := (.*)$", makefile, flags=re.MULTILINE)
    assert _main("export-monitoring", tmp_path, *shlex.split(options)) == 0
    expected = _tree(tmp_path)
    found = {
        name: text
        for name, text in _tree(MONITORING).items()
        if not name.startswith(NOT_EXPORTED) and "/node_modules/" not in f"/{name}"
    }
    assert sorted(found) == sorted(expected), f"monitoring/ has other files: {REGENERATE}"
    differ = [name for name in expected if found[name] != expected[name]]
    assert differ == [], f"monitoring/{differ[0] if differ else ''} differs: {REGENERATE}"


def test_root_config_properties_is_the_package_copy() -> None:
    assert (ROOT / "config.properties").read_text() == assets.TORCHSERVE_CONFIG.read_text(), (
        "config.properties differs from src/hookwatch/_assets/torchserve/config.properties:"
        " edit the package's and copy it"
    )


def test_the_demos_model_config_is_the_package_copy() -> None:
    # `hookwatch build-demo` archives with the package's (a wheel has no models/ folder: it
    # failed in an empty folder, an outside run found, 2026-12-07).
    demo = ROOT / "models" / "digits" / "model-config.yaml"
    assert demo.read_text() == assets.DEMO_MODEL_CONFIG.read_text(), (
        "models/digits/model-config.yaml differs from src/hookwatch/_assets/demo/"
        "model-config.yaml: edit the package's and copy it"
    )


def test_export_writes_rules_scrape_config_dashboards_and_provisioning(tmp_path: Path) -> None:
    out = tmp_path / "new" / "monitoring"
    assert _main("export-monitoring", out) == 0
    tree = _tree(out)
    rules = sorted(p.name for p in assets.RULES.glob("*.yml"))
    boards = sorted(p.name for p in assets.DASHBOARDS.glob("*.json"))
    assert len(rules) >= 3 and len(boards) == 4
    assert sorted(tree) == sorted(
        [f"prometheus/rules/{n}" for n in rules]
        + ["prometheus/prometheus.yml", "prometheus/scrape-configs.yml"]
        + [f"grafana/dashboards/{n}" for n in boards]
        + [
            f"grafana/provisioning/{p.relative_to(assets.PROVISIONING).as_posix()}"
            for p in assets.PROVISIONING.rglob("*.yml")
        ]
    )
    # With the default job names, rules and dashboards are the package's as they are, but for
    # runbook_url: the installed runbook's file:// URL.
    for name in rules:
        packaged = set_runbook_base((assets.RULES / name).read_text(), assets.RUNBOOK.as_uri())
        assert tree[f"prometheus/rules/{name}"] == packaged
    for name in boards:
        assert tree[f"grafana/dashboards/{name}"] == (assets.DASHBOARDS / name).read_text()
    snippet = yaml.safe_load(tree["prometheus/scrape-configs.yml"])
    assert snippet == [
        {"job_name": "torchserve", "static_configs": [{"targets": ["127.0.0.1:8082"]}]},
        {"job_name": "hookwatch", "static_configs": [{"targets": ["127.0.0.1:9101"]}]},
    ]
    config = yaml.safe_load(tree["prometheus/prometheus.yml"])
    assert config["scrape_configs"] == snippet
    assert config["rule_files"] == ["rules/*.yml"]
    assert config["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    (source,) = yaml.safe_load(tree["grafana/provisioning/datasources/prometheus.yml"])[
        "datasources"
    ]
    assert source["url"] == "http://127.0.0.1:9090"
    assert source["jsonData"]["timeInterval"] == "15s"
    for name in boards:
        json.loads(tree[f"grafana/dashboards/{name}"])


def test_renamed_jobs_reach_every_rule_and_dashboard_that_selects_a_job(tmp_path: Path) -> None:
    packaged = "".join(
        p.read_text() for p in [*assets.RULES.glob("*"), *assets.DASHBOARDS.glob("*")]
    )
    # What depends on the job names: the availability alerts and the overview's targets panel.
    assert _job_values(packaged) == {"hookwatch", "torchserve"}
    assert (
        _main(
            "export-monitoring",
            tmp_path,
            "--exporter-job",
            "serving.hookwatch",
            "--torchserve-job",
            "ts-frontend",
            "--exporter-target",
            "10.0.0.1:9101",
            "--exporter-target",
            "10.0.0.2:9101",
        )
        == 0
    )
    tree = _tree(tmp_path)
    selecting = "".join(
        text for name, text in tree.items() if name.startswith(("prometheus/rules", "grafana/dash"))
    )
    assert _job_values(selecting) == {"serving.hookwatch", "ts-frontend", "serving[.]hookwatch"}
    alerts = tree["prometheus/rules/hookwatch-alerts.yml"]
    assert 'up{job="serving.hookwatch"} == 0' in alerts
    assert 'up{job="ts-frontend"} == 0' in alerts
    overview = tree["grafana/dashboards/overview.json"]
    assert 'up{job=~\\"ts-frontend|serving[.]hookwatch\\"}' in overview
    jobs = {
        j["job_name"]: j["static_configs"][0]["targets"]
        for j in yaml.safe_load(tree["prometheus/scrape-configs.yml"])
    }
    assert jobs == {
        "ts-frontend": ["127.0.0.1:8082"],
        "serving.hookwatch": ["10.0.0.1:9101", "10.0.0.2:9101"],
    }


def test_namespace_is_a_target_label_of_every_exported_job(tmp_path: Path) -> None:
    assert _main("export-monitoring", tmp_path, "--namespace", "ml-serving") == 0
    for name in ("scrape-configs.yml", "prometheus.yml"):
        loaded = yaml.safe_load((tmp_path / "prometheus" / name).read_text())
        jobs = loaded if isinstance(loaded, list) else loaded["scrape_configs"]
        assert len(jobs) == 2
        for job in jobs:
            for group in job["static_configs"]:
                assert group["labels"] == {"namespace": "ml-serving"}, (name, job)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--namespace", "ML_Serving"], "--namespace: expected a Kubernetes namespace name"),
        (["--exporter-job", 'a"b'], "--exporter-job: expected a job name"),
        (["--exporter-job", "x", "--torchserve-job", "x"], "expected two different job names"),
        (["--torchserve-target", "localhost"], "--torchserve-target: expected HOST:PORT"),
        (["--datasource-url", "prometheus:9090"], "--datasource-url: expected an http(s)://"),
        (["--scrape-interval", "5"], "--scrape-interval: expected a Prometheus duration"),
        (["--runbook-base", "https://wiki/x#top"], "--runbook-base: expected a URL or path"),
        (["--runbook-base", "my runbook.md"], "--runbook-base: expected a URL or path"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert _main("export-monitoring", tmp_path / "out", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hookwatch export-monitoring: error: {expected}")
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_non_empty_directory_is_refused_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert _main("export-monitoring", tmp_path) == 2
    err = capsys.readouterr().err
    assert err == (
        f"hookwatch export-monitoring: error: expected an empty or missing directory, got "
        f"{tmp_path} with 1 entry (pass --force to write into it)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    # --force writes the export beside what is there and leaves the rest alone.
    assert _main("export-monitoring", tmp_path, "--force") == 0
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "prometheus" / "scrape-configs.yml").exists()
    # A file where the directory should be.
    assert _main("export-monitoring", tmp_path / "notes.txt") == 2
    assert "expected an empty or missing directory" in capsys.readouterr().err


def test_an_unwritable_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Under a file: no one, root included, can create it.
    (tmp_path / "a-file").write_text("")
    assert _main("export-monitoring", tmp_path / "a-file" / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"hookwatch export-monitoring: error: expected a writable directory, got "
        f"{tmp_path}/a-file/out (Not a directory"
    )
    assert err.count("\n") == 1
    if os.geteuid() != 0:  # root writes into read-only directories
        tmp_path.chmod(0o500)
        try:
            assert _main("export-monitoring", tmp_path / "out") == 2
        finally:
            tmp_path.chmod(0o700)
        assert "expected a writable directory" in capsys.readouterr().err


def test_render_is_the_api_export_writes(tmp_path: Path) -> None:
    options = ExportOptions(namespace="a", scrape_interval="30s")
    written = export(tmp_path, options)
    assert {p.relative_to(tmp_path).as_posix(): p.read_text() for p in written} == render(options)
