"""The Kubernetes base's generated manifests are the package's rules and dashboards, and `make`
gives CI what the manifest tests need.

No kubectl here: tests/integration/test_kubernetes.py renders and validates the overlays.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from dev import kubernetes
from hookwatch.tools import assets
from hookwatch.tools.export import set_runbook_base

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / kubernetes.GENERATED


def _documents(name: str) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all((GENERATED / name).read_text()) if d]


def test_committed_manifests_are_what_the_generator_writes() -> None:
    problems = kubernetes.differences(ROOT)
    assert not problems, "\n".join(problems) + "\n(run `make kubernetes`)"


def test_a_stale_manifest_fails_with_the_file_and_the_difference(tmp_path: Path) -> None:
    kubernetes.write(tmp_path)
    path = tmp_path / kubernetes.GENERATED / kubernetes.RULES
    path.write_text(path.read_text().replace("for: 2m", "for: 7m", 1))
    (tmp_path / kubernetes.GENERATED / kubernetes.DASHBOARDS).unlink()
    problems = kubernetes.differences(tmp_path)
    assert len(problems) == 2, problems
    stale = next(p for p in problems if kubernetes.RULES in p)
    assert stale.startswith(f"{kubernetes.GENERATED / kubernetes.RULES} differs"), stale
    assert re.search(r"^-\s+for: 7m$", stale, re.MULTILINE), stale
    assert re.search(r"^\+\s+for: 2m$", stale, re.MULTILINE), stale
    missing = next(p for p in problems if kubernetes.DASHBOARDS in p)
    assert "missing" in missing and "make kubernetes" in missing, missing
    assert kubernetes.main(["--root", str(tmp_path), "--check"]) == 1
    assert kubernetes.main(["--root", str(tmp_path)]) == 0
    assert kubernetes.differences(tmp_path) == []


def test_each_prometheus_rule_is_one_rule_file() -> None:
    rules = _documents(kubernetes.RULES)
    files = sorted(assets.RULES.glob("*.yml"))
    assert [r["kind"] for r in rules] == ["PrometheusRule"] * len(files)
    assert [r["apiVersion"] for r in rules] == ["monitoring.coreos.com/v1"] * len(files)
    for rule, path in zip(rules, files, strict=True):
        assert rule["metadata"]["name"] == path.stem  # type: ignore[index]
        # The package's rules, runbook_url pointing at docs/runbook.md from the generated file.
        packaged = set_runbook_base(path.read_text(), kubernetes.RUNBOOK_BASE)
        assert rule["spec"] == yaml.safe_load(packaged), path


def test_each_dashboard_is_a_configmap_the_grafana_sidecar_loads() -> None:
    maps = _documents(kubernetes.DASHBOARDS)
    files = sorted(assets.DASHBOARDS.glob("*.json"))
    assert len(maps) == len(files)
    for config_map, path in zip(maps, files, strict=True):
        assert config_map["kind"] == "ConfigMap"
        metadata = config_map["metadata"]
        assert metadata["labels"]["grafana_dashboard"] == "1"  # type: ignore[index]
        (key, text), *rest = config_map["data"].items()  # type: ignore[attr-defined]
        assert not rest
        assert key == f"hookwatch-{path.name}"
        assert text == path.read_text(), path
        json.loads(text)
        # kubectl apply's last-applied annotation holds at most 256 KiB per object.
        assert len(text.encode()) < 200_000, path


def test_the_base_lists_the_generated_files() -> None:
    kustomization = yaml.safe_load((GENERATED.parent / "kustomization.yaml").read_text())
    for name in (kubernetes.RULES, kubernetes.DASHBOARDS):
        assert f"generated/{name}" in kustomization["resources"]


def test_ci_gets_what_the_manifest_tests_need() -> None:
    """kubernetes-validate comes with `make venv` (the dev extra); kubectl is a system part
    that Debian does not package at a current version, so `make deps` names it when missing
    (and the integration test fails under CI=true without it)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dev = project["optional-dependencies"]["dev"]
    assert any(re.match(r"kubernetes-validate\b", requirement) for requirement in dev), dev
    makefile = (ROOT / "Makefile").read_text()
    deps = makefile.split("\ndeps:", 1)[1].split("\n\n", 1)[0]
    assert "command -v kubectl" in deps, deps
    assert re.search(r"^kubernetes: .*##", makefile, re.MULTILINE)


@pytest.mark.parametrize("text", ["a\n\n  b\n", '{\n  "x": 1\n}\n'])
def test_indent_keeps_empty_lines_empty(text: str) -> None:
    indented = kubernetes._indent(text, 4)
    assert all(line == "" or line.startswith("    ") for line in indented.split("\n"))
    assert " \n" not in indented
