"""Where the monitoring assets shipped inside the package live: one source of truth.

The alert and recording rules, the Prometheus configuration, the Grafana dashboards and
provisioning, and TorchServe's loopback configuration are package data under
``hookwatch/_assets``. Everything reads them from here: ``hookwatch serve`` and ``run``,
``hookwatch report``, ``hookwatch export-monitoring``; the repository's ``monitoring/`` and
``config.properties`` are copies a test keeps equal to them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ASSETS",
    "DASHBOARDS",
    "DEMO_MODEL_CONFIG",
    "KUBERNETES",
    "PROMETHEUS",
    "PROMETHEUS_CONFIG",
    "PROVISIONING",
    "RULES",
    "RUNBOOK",
    "TORCHSERVE_CONFIG",
]

#: The package's asset directory (a wheel installs as files, so a plain path reads it).
ASSETS = Path(__file__).resolve().parents[1] / "_assets"
PROMETHEUS = ASSETS / "prometheus"
#: Prometheus' configuration with the scrape jobs ``torchserve`` and ``hookwatch``; its
#: ``rule_files`` are relative to its directory.
PROMETHEUS_CONFIG = PROMETHEUS / "prometheus.yml"
RULES = PROMETHEUS / "rules"
DASHBOARDS = ASSETS / "grafana" / "dashboards"
PROVISIONING = ASSETS / "grafana" / "provisioning"
#: The runbook, one section per alert (a copy of the repository's docs/runbook.md): where the
#: rules' ``runbook_url`` points unless ``hookwatch export-monitoring --runbook-base`` says else.
RUNBOOK = ASSETS / "docs" / "runbook.md"
#: The Kubernetes manifests, the image's Dockerfile and TorchServe's configuration in the pod,
#: as ``hookwatch export-kubernetes`` writes them for a user's model (the repository's
#: ``deploy/kubernetes`` is a copy).
KUBERNETES = ASSETS / "kubernetes"
#: The demo's model-config (the repository's models/digits/model-config.yaml is a copy): what
#: ``hookwatch build-demo`` archives the digits CNN with, wherever it runs.
DEMO_MODEL_CONFIG = ASSETS / "demo" / "model-config.yaml"
#: TorchServe's frontend configuration for the loopback stack ``hookwatch serve`` starts.
TORCHSERVE_CONFIG = ASSETS / "torchserve" / "config.properties"
