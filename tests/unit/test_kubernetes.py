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


def _user_mar(path: Path, name: str, distribution: str | None = None) -> Path:
    """A user's archive as `hookwatch archive` writes one (manifest, handler, model spec)."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            "handler.py",
            "from hookwatch.torchserve import HookwatchHandler\n\n\n"
            "class H(HookwatchHandler): ...\n",
        )
        model = {"modelName": name, "handler": "handler.py", "configFile": "mine.yaml"}
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": model}))
        archive.writestr(
            "mine.yaml",
            yaml.safe_dump({"handler": {"input": {"shape": [3, 64, 64], "encoding": "image"}}}),
        )
        spec = {"format": "hookwatch-model", "kind": "factory", "file": "", "name": "build"}
        if distribution:
            spec["distribution"] = distribution
        archive.writestr("hookwatch-model.json", json.dumps(spec))
    return path


def test_export_kubernetes_writes_the_image_and_manifests_for_a_users_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An outside run with only the wheel could not follow docs/kubernetes.md: the Dockerfile
    # built from a checkout and the manifests were the repository's (2026-12-07).
    from hookwatch.tools.cli import main

    mar = _user_mar(tmp_path / "vision.mar", "vision", "acme-models==0.3.1")
    wheel = tmp_path / "hookwatch-0.2.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    out = tmp_path / "deploy"
    args = ["export-kubernetes", str(out), "--mar", str(mar), "--wheel", str(wheel)]
    assert main([*args, "--image", "registry.example.com:5000/ml/vision:2"]) == 0
    assert "kubectl apply -k" in capsys.readouterr().out
    assert (out / "model_store" / "vision.mar").read_bytes() == mar.read_bytes()
    assert (out / "wheels" / wheel.name).is_file()
    dockerfile = (out / "Dockerfile").read_text()
    assert "COPY model_store/" in dockerfile and "[torchserve]" in dockerfile
    assert re.search(r"'torch==\d+\.\d+\.\d+'", dockerfile), dockerfile
    assert "@" not in dockerfile  # every token replaced
    # The build line names the image the manifests run (it named another, tag 1).
    assert "docker build -t registry.example.com:5000/ml/vision:2 ." in dockerfile
    assert "-t registry.example.com:5000/ml/vision:2-gpu ." in dockerfile
    for overlay in ("base", "overlays/gpu"):
        text = (out / "kubernetes" / overlay / "kustomization.yaml").read_text()
        assert "hookwatch:dev" not in text and "-t registry.example.com:5000/ml/vision:2" in text
    properties = (out / "config.properties").read_text()
    assert (
        "load_models=vision.mar" in properties and "disable_token_authorization=true" in properties
    )
    # An image model's body limit: TorchServe's own raised to it (a photo is not refused).
    assert "max_request_size=16777216" in properties
    assert (out / "requirements.txt").read_text().splitlines()[-1] == "acme-models==0.3.1"
    deployment = (out / "kubernetes" / "base" / "deployment.yaml").read_text()
    assert 'value: "vision"' in deployment and "value: digits" not in deployment
    base = yaml.safe_load((out / "kubernetes" / "base" / "kustomization.yaml").read_text())
    assert base["images"] == [
        {"name": "hookwatch", "newName": "registry.example.com:5000/ml/vision", "newTag": "2"}
    ]
    gpu = yaml.safe_load(
        (out / "kubernetes" / "overlays" / "gpu" / "kustomization.yaml").read_text()
    )
    assert gpu["images"] == [{"name": "registry.example.com:5000/ml/vision", "newTag": "2-gpu"}]
    rules = (out / "kubernetes" / "base" / "generated" / "prometheusrule.yaml").read_text()
    assert "hookwatch export-kubernetes" in rules and "runbook_url:" in rules
    # Written again only with --force; one line for a bad --mar or --wheel, no traceback.
    assert main(args) == 2
    assert "pass --force" in capsys.readouterr().err
    not_ours = tmp_path / "other.mar"
    import zipfile

    with zipfile.ZipFile(not_ours, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"handler": "x.py"}}))
    assert main(["export-kubernetes", str(tmp_path / "o2"), "--mar", str(not_ours)]) == 2
    assert "built by `hookwatch archive`" in capsys.readouterr().err
    digest = [
        "export-kubernetes",
        str(tmp_path / "o4"),
        "--mar",
        str(mar),
        "--image",
        "r/m@sha256:ab",
    ]
    assert main(digest) == 2
    assert "(no digest), got 'r/m@sha256:ab'" in capsys.readouterr().err
    bad_wheel = ["export-kubernetes", str(tmp_path / "o3"), "--mar", str(mar), "--wheel", str(mar)]
    assert main(bad_wheel) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected a hookwatch wheel file" in err[0], err
