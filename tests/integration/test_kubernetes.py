"""deploy/kubernetes/, and what `hookwatch export-kubernetes` writes for a user's model from
the installed package: every overlay renders with `kubectl kustomize`, its core kinds pass
`kubernetes-validate --strict`, its PrometheusRules' groups pass `promtool check rules`, and the
pod keeps what the docker-compose deployment relies on (one pid namespace, a shared metrics
directory emptied at TorchServe's start, non-root with a read-only root filesystem).

Rendered and validated only: nothing here applies the manifests to a cluster. kubectl, promtool
and kubernetes-validate are real components: missing, these tests skip locally and fail under
CI=true.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require, require_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
#: Every kustomization users apply; test_every_overlay_is_checked keeps it complete.
TARGETS = {
    "base": BASE,
    "gpu": KUBERNETES / "overlays" / "gpu",
    "fleet": KUBERNETES / "overlays" / "fleet",
}
#: Custom resources of prometheus-operator: kubernetes-validate has schemas for Kubernetes' own
#: kinds only, so these are left out of it, by name (PrometheusRule's groups go to promtool).
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
#: The oldest Kubernetes release the manifests claim (autoscaling/v2, policy/v1, the restricted
#: Pod Security Standard are older) and the newest kubernetes-validate>=1.37 (pyproject.toml) knows.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
METRICS_DIR = "/var/run/hookwatch/metrics"


def _kubectl_kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    kubectl = require_binary("kubectl")
    return subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False
    )


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize directory` renders; fails with the directory and
    kubectl's message when it does not render."""
    result = _kubectl_kustomize(directory)
    if result.returncode != 0:
        pytest.fail(f"{directory} does not render with `kubectl kustomize`:\n{result.stderr}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def _kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = _kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _containers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def _kubernetes_validate() -> str:
    binary = shutil.which("kubernetes-validate") or str(
        Path(sys.executable).parent / "kubernetes-validate"
    )
    require(Path(binary).is_file(), "kubernetes-validate (pip; `make venv` installs the dev extra)")
    return binary


#: The same kustomizations as `hookwatch export-kubernetes` writes them for a user's model.
EXPORTED = {f"export:{name}": path.relative_to(KUBERNETES) for name, path in TARGETS.items()}
#: The user's model and image in the export.
EXPORT_MODEL, EXPORT_IMAGE = "tagger", ("registry.example.com:5000/team/tagger", "1.2")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`hookwatch export-kubernetes` of a user's .mar (named as its model, not the demo's)."""
    import json
    import zipfile

    from hookwatch.tools.cli import main

    root = tmp_path_factory.mktemp("export")
    mar = root / f"{EXPORT_MODEL}.mar"
    with zipfile.ZipFile(mar, "w") as archive:
        handler = (
            "from hookwatch.torchserve import HookwatchHandler\n\n\n"
            "class H(HookwatchHandler): ...\n"
        )
        archive.writestr("handler.py", handler)
        manifest = {"model": {"modelName": EXPORT_MODEL, "handler": "handler.py"}}
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    image = ":".join(EXPORT_IMAGE)
    code = main(["export-kubernetes", str(root / "out"), "--mar", str(mar), "--image", image])
    assert code == 0
    return root / "out"


@pytest.fixture(scope="module", params=sorted(TARGETS) + sorted(EXPORTED))
def rendered(request: pytest.FixtureRequest, exported: Path) -> tuple[str, list[dict[str, Any]]]:
    name: str = request.param
    if name in EXPORTED:
        return name, render(exported / "kubernetes" / EXPORTED[name])
    return name, render(TARGETS[name])


def _flavour(name: str) -> str:
    """base, gpu or fleet, of the repository's kustomization or an export's."""
    return name.removeprefix("export:")


def test_every_overlay_is_checked() -> None:
    found = {p.parent for p in KUBERNETES.rglob("kustomization.yaml")}
    assert found == set(TARGETS.values())


def test_an_overlay_that_does_not_render_fails_with_its_directory(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    broken = copy / "overlays" / "fleet" / "hpa-fleet.yaml"
    broken.write_text(broken.read_text().replace("name: hookwatch", "name: no-such-object"))
    with pytest.raises(pytest.fail.Exception) as failure:
        render(copy / "overlays" / "fleet")
    message = str(failure.value)
    assert str(copy / "overlays" / "fleet") in message
    assert "no-such-object" in message, message


def test_core_kinds_pass_kubernetes_validate_strict(
    rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    name, objects = rendered
    binary = _kubernetes_validate()
    core = [o for o in objects if (o["apiVersion"], o["kind"]) not in CUSTOM_KINDS]
    skipped = {(o["apiVersion"], o["kind"]) for o in objects} - {
        (o["apiVersion"], o["kind"]) for o in core
    }
    assert skipped == CUSTOM_KINDS, skipped
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(core, sort_keys=False))
    for version in KUBERNETES_VERSIONS:
        result = subprocess.run(
            [binary, "--strict", "-k", version, str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{name} against Kubernetes {version}:\n{output}"
        # A kind it has no schema for is only a warning: every core kind must have been checked.
        assert "Couldn't find schema" not in output, output
        assert output.count("passed for resource") == len(core), output


def test_strict_validation_catches_an_unknown_field(tmp_path: Path) -> None:
    binary = _kubernetes_validate()
    objects = render(BASE)
    deployment = _one(objects, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(deployment))
    result = subprocess.run(
        [binary, "--strict", "-k", KUBERNETES_VERSIONS[0], str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "readOnlyRootFileSystem" in result.stdout + result.stderr


def test_prometheus_rules_pass_promtool(
    rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    name, objects = rendered
    promtool = require_binary("promtool")
    rules = _kind(objects, "PrometheusRule")
    assert rules
    files = []
    for rule in rules:
        path = tmp_path / f"{rule['metadata']['name']}.yml"
        path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
        files.append(str(path))
    result = subprocess.run(
        [promtool, "check", "rules", *files], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{name}:\n{result.stdout}{result.stderr}"
    groups = [g["name"] for r in rules for g in r["spec"]["groups"]]
    assert len(groups) == len(set(groups)), groups


def test_the_pod_shares_its_pid_namespace_and_metrics_directory(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    containers = _containers(objects)
    assert set(containers) == {"torchserve", "exporter"}
    for container in containers.values():
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PROMETHEUS_MULTIPROC_DIR"] == METRICS_DIR, container["name"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        parents = [p for p in mounts if METRICS_DIR.startswith(p.rstrip("/") + "/")]
        assert parents, f"{container['name']} does not mount {METRICS_DIR}"
        assert mounts[parents[0]] == "metrics"
    assert "emptyDir" in volumes["metrics"]
    # Emptied on every start of TorchServe's container, before TorchServe starts.
    script = " ".join(containers["torchserve"]["command"])
    assert re.search(
        r'rm -rf "\$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "\$PROMETHEUS_MULTIPROC_DIR"\s+'
        r"&& exec torchserve --start --foreground",
        script,
    ), script
    exporter = " ".join(containers["exporter"]["command"])
    assert "exec hookwatch exporter" in exporter
    assert "--no-reap" not in exporter
    assert "--addr 0.0.0.0 --port 9101" in exporter


def test_the_pod_is_non_root_with_a_read_only_root(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert "add" not in context["capabilities"], container["name"]
        # Whatever is writable is an emptyDir of the pod's own.
        for mount in container["volumeMounts"]:
            assert "emptyDir" in volumes[mount["name"]], (container["name"], mount)
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
    # TorchServe writes logs/ under its working directory, /opt/hookwatch (deploy/Dockerfile).
    torchserve = _containers(objects)["torchserve"]
    assert "/opt/hookwatch/logs" in {m["mountPath"] for m in torchserve["volumeMounts"]}
    namespace = _one(objects, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_probes_resources_and_image(
    rendered: tuple[str, list[dict[str, Any]]], exported: Path
) -> None:
    name, objects = rendered
    containers = _containers(objects)
    torchserve = containers["torchserve"]
    # Readiness is the model loaded (the describe-model API on management), not /ping.
    readiness = " ".join(torchserve["readinessProbe"]["exec"]["command"])
    assert "http://127.0.0.1:8081/models/" in readiness and "READY" in readiness
    assert "/ping" not in readiness
    env = {e["name"]: e.get("value") for e in torchserve["env"]}
    properties = (
        (exported / "config.properties")
        if name in EXPORTED
        else ROOT / "deploy" / "torchserve.properties"
    ).read_text()
    assert f"load_models={env['HOOKWATCH_READY_MODEL']}.mar" in properties
    assert name not in EXPORTED or env["HOOKWATCH_READY_MODEL"] == EXPORT_MODEL
    # The probe calls the management API without a token: the image's config must say so.
    assert "disable_token_authorization=true" in properties
    assert torchserve["livenessProbe"]["httpGet"]["path"] == "/ping"
    assert containers["exporter"]["readinessProbe"]["tcpSocket"]["port"] == "exporter"
    assert containers["exporter"]["livenessProbe"]
    for container in containers.values():
        assert container["resources"]["requests"]["cpu"], container["name"]
        assert container["resources"]["limits"]["memory"], container["name"]
    images = {c["image"] for c in containers.values()}
    image, tag = EXPORT_IMAGE if name in EXPORTED else ("hookwatch", "dev")
    assert images == {f"{image}:{tag}-gpu" if _flavour(name) == "gpu" else f"{image}:{tag}"}


def test_the_objects_select_the_pod(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    deployment = _one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    selectors = {
        "Service": _one(objects, "Service")["spec"]["selector"],
        "PodDisruptionBudget": _one(objects, "PodDisruptionBudget")["spec"]["selector"][
            "matchLabels"
        ],
        "NetworkPolicy": _one(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
        "PodMonitor": _one(objects, "PodMonitor")["spec"]["selector"]["matchLabels"],
    }
    for kind, selector in selectors.items():
        assert selector.items() <= labels.items(), kind
    hpa = _one(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    namespaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}
    assert namespaces == {_one(objects, "Namespace")["metadata"]["name"]}


def _ports(objects: list[dict[str, Any]]) -> dict[str, int]:
    return {
        p["name"]: p["containerPort"] for c in _containers(objects).values() for p in c["ports"]
    }


def test_the_pod_monitor_scrapes_both_jobs_the_rules_select(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    ports = _ports(objects)
    endpoints = _one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    jobs = {}
    for endpoint in endpoints:
        (relabel,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
        jobs[relabel["replacement"]] = ports[endpoint["port"]]
    assert jobs == {"hookwatch": 9101, "torchserve": 8082}
    selected = {
        match
        for rule in _kind(objects, "PrometheusRule")
        for group in rule["spec"]["groups"]
        for item in group["rules"]
        for match in re.findall(r'job\s*=~?\s*"([^"]*)"', item["expr"])
    }
    assert selected and selected <= set(jobs), selected


def test_the_network_policy_opens_inference_only(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    policy = _one(objects, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    opened: dict[int, list[Any]] = {}
    for rule in policy["ingress"]:
        for port in rule["ports"]:
            opened.setdefault(port["port"], []).append(rule.get("from"))
    assert set(opened) == {8080, 8081, 8082, 9101}
    assert opened[8080] == [None]  # from anywhere
    # Management: this namespace's pods only; metrics: pods of the cluster, nothing outside.
    assert opened[8081] == [[{"podSelector": {}}]]
    for port in (8082, 9101):
        assert opened[port] == [[{"namespaceSelector": {}}]], port
    service = _one(objects, "Service")
    assert 8081 not in {p["port"] for p in service["spec"]["ports"]}
    assert {p["port"] for p in service["spec"]["ports"]} == {8080, 8082, 9101}


def test_dashboards_are_configmaps_for_the_grafana_sidecar(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    maps = [
        o
        for o in _kind(objects, "ConfigMap")
        if o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    assert len(maps) == len(
        list((ROOT / "src/hookwatch/_assets/grafana/dashboards").glob("*.json"))
    )


def test_overlays_change_what_they_say(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, objects = rendered
    base = render(BASE)
    deployment = _one(objects, "Deployment")
    hpa = _one(objects, "HorizontalPodAutoscaler")["spec"]
    pod = deployment["spec"]["template"]["spec"]
    limits = _containers(objects)["torchserve"]["resources"]["limits"]
    if _flavour(name) == "gpu":
        assert limits["nvidia.com/gpu"] == 1
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {t["key"] for t in pod["tolerations"]} == {"nvidia.com/gpu"}
    else:
        assert "nvidia.com/gpu" not in limits
    if _flavour(name) == "fleet":
        base_hpa = _one(base, "HorizontalPodAutoscaler")["spec"]
        assert hpa["minReplicas"] > base_hpa["minReplicas"]
        assert hpa["maxReplicas"] > base_hpa["maxReplicas"]
    # The HPA owns the count: a `replicas` here would be set again by every `kubectl apply`,
    # shrinking a fleet the HPA had scaled out (an outside run's review, 2026-12-07).
    assert "replicas" not in deployment["spec"]
    assert hpa["minReplicas"] >= 2  # the PodDisruptionBudget leaves one serving


def _objects_by_key(objects: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for o in objects:
        yield o["kind"], o["metadata"]["name"]


def test_overlays_render_the_same_objects_as_the_base(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    assert sorted(_objects_by_key(objects)) == sorted(_objects_by_key(render(BASE)))
