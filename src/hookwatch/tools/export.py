"""``hookwatch export-monitoring``: the package's monitoring assets for a user's own Prometheus
and Grafana.

Writes, from the package data of :mod:`hookwatch.tools.assets` (the one source of truth):

- ``prometheus/rules/*.yml``: the alerting and recording rules;
- ``prometheus/scrape-configs.yml``: the two scrape jobs (TorchServe's metrics endpoint and the
  hookwatch exporter), a list to paste under ``scrape_configs:``;
- ``prometheus/prometheus.yml``: a complete configuration with those jobs, loading
  ``rules/*.yml`` relative to itself;
- ``grafana/dashboards/*.json`` and ``grafana/provisioning/{dashboards,datasources}/*.yml``.

Rules and dashboards that select a scrape job (``up{job="hookwatch"}``) follow renamed jobs.
Every alert's ``runbook_url`` is ``--runbook-base`` followed by the alert's anchor in the runbook
(``#hookwatchdrift``); by default the base is the runbook installed with the package
(:data:`hookwatch.tools.assets.RUNBOOK`, a ``file://`` URL), which exists wherever the export
ran.
The repository's ``monitoring/`` is this export with docker-compose's targets (``make
monitoring``). Standard library and PyYAML only.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hookwatch._errors import ConfigError
from hookwatch.tools import assets

__all__ = [
    "DEFAULT_EXPORTER_JOB",
    "DEFAULT_TORCHSERVE_JOB",
    "ExportOptions",
    "check_directory",
    "default_runbook_base",
    "export",
    "render",
    "set_runbook_base",
    "write_files",
]

DEFAULT_EXPORTER_JOB = "hookwatch"
DEFAULT_TORCHSERVE_JOB = "torchserve"

#: Prometheus' job names the export accepts: no quote or backslash, so they go into PromQL
#: strings and regular expressions as they are (a dot becomes ``[.]`` in a regular expression).
_JOB = re.compile(r"[A-Za-z0-9_.:/-]+")
#: A Kubernetes namespace name (RFC 1123 label), what kube-prometheus' ``namespace`` carries.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_TARGET = re.compile(r"[^\s/:\"']+:[0-9]{1,5}")
_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")
_URL = re.compile(r"https?://[^\s\"']+")
#: A job matcher in a rule (``job="x"``) or in a dashboard's JSON text (``job=~\"x|y\"``).
_JOB_MATCHER = re.compile(r'\bjob\s*(?P<op>=~|!~|!=|=)\s*(?P<q>\\?")(?P<value>[^"\\]*)(?P=q)')
#: A runbook base: a URL or a path (relative to the rule files) with no fragment, quote or space.
_RUNBOOK_BASE = re.compile(r"[^\s\"'#\\{}]+")
#: An alert's runbook annotation: what precedes the anchor is the base the export replaces.
_RUNBOOK_URL = re.compile(r'(?P<key>runbook_url:\s*)"[^"#]*#(?P<anchor>[a-z0-9-]+)"')
#: The lines of the datasource provisioning the export sets.
_DATASOURCE_URL = re.compile(r"^(?P<indent>\s+)url: .*$", re.MULTILINE)
_TIME_INTERVAL = re.compile(r"^(?P<indent>\s+)timeInterval: .*$", re.MULTILINE)


@dataclass(frozen=True)
class ExportOptions:
    """Where the user's Prometheus finds the targets, and how their labels are named."""

    exporter_targets: Sequence[str] = ("127.0.0.1:9101",)
    torchserve_targets: Sequence[str] = ("127.0.0.1:8082",)
    exporter_job: str = DEFAULT_EXPORTER_JOB
    torchserve_job: str = DEFAULT_TORCHSERVE_JOB
    #: A ``namespace`` label put on every target of both jobs (None: no label).
    namespace: str | None = None
    datasource_url: str = "http://127.0.0.1:9090"
    scrape_interval: str = "15s"
    #: Extra target labels (beside ``namespace``), for tests and callers of the API.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Where each alert's ``runbook_url`` points, before ``#anchor`` (None: the runbook
    #: installed with the package, :func:`default_runbook_base`).
    runbook_base: str | None = None

    def validate(self) -> None:
        for option, job in (
            ("--exporter-job", self.exporter_job),
            ("--torchserve-job", self.torchserve_job),
        ):
            if not _JOB.fullmatch(job):
                raise ConfigError(
                    f"{option}: expected a job name of letters, digits and _.:/-, got {job!r}"
                )
        if self.exporter_job == self.torchserve_job:
            raise ConfigError(
                f"expected two different job names, got {self.exporter_job!r} for both "
                "--exporter-job and --torchserve-job"
            )
        for option, targets in (
            ("--exporter-target", self.exporter_targets),
            ("--torchserve-target", self.torchserve_targets),
        ):
            if not targets:
                raise ConfigError(f"{option}: expected at least one HOST:PORT, got none")
            for target in targets:
                if not _TARGET.fullmatch(target):
                    raise ConfigError(f"{option}: expected HOST:PORT, got {target!r}")
        if self.namespace is not None and not _NAMESPACE.fullmatch(self.namespace):
            raise ConfigError(
                "--namespace: expected a Kubernetes namespace name (lower-case letters, digits "
                f"and -, at most 63), got {self.namespace!r}"
            )
        if not _URL.fullmatch(self.datasource_url):
            raise ConfigError(
                f"--datasource-url: expected an http(s):// URL, got {self.datasource_url!r}"
            )
        if self.runbook_base is not None and not _RUNBOOK_BASE.fullmatch(self.runbook_base):
            raise ConfigError(
                "--runbook-base: expected a URL or path without #, quotes or spaces (each alert "
                f"adds #its-name), got {self.runbook_base!r}"
            )
        if not _DURATION.fullmatch(self.scrape_interval):
            raise ConfigError(
                "--scrape-interval: expected a Prometheus duration such as 15s or 1m, got "
                f"{self.scrape_interval!r}"
            )

    @property
    def jobs(self) -> dict[str, str]:
        """The packaged job names to the exported ones."""
        return {
            DEFAULT_EXPORTER_JOB: self.exporter_job,
            DEFAULT_TORCHSERVE_JOB: self.torchserve_job,
        }


def default_runbook_base() -> str:
    """The runbook installed with the package, as a ``file://`` URL."""
    return assets.RUNBOOK.as_uri()


def set_runbook_base(text: str, base: str) -> str:
    """``text`` (a rule file) with every ``runbook_url`` pointing at ``base`` + its anchor."""
    return _RUNBOOK_URL.sub(lambda m: f'{m["key"]}"{base}#{m["anchor"]}"', text)


def _rename_jobs(text: str, jobs: Mapping[str, str], where: str) -> str:
    """``text`` with every job matcher naming a packaged job naming the exported one."""

    def replace(match: re.Match[str]) -> str:
        op, quote, value = match["op"], match["q"], match["value"]
        names = [value] if op in ("=", "!=") else value.split("|")
        unknown = [n for n in names if n not in jobs]
        if unknown:
            # An asset selecting a job the export does not write: it would silently select
            # nothing in the user's Prometheus.
            raise ValueError(f"{where}: expected job matchers of {sorted(jobs)}, got {unknown}")
        if op in ("=", "!="):
            renamed = jobs[value]
        else:
            renamed = "|".join(jobs[n].replace(".", "[.]") for n in names)
        return f"job{op}{quote}{renamed}{quote}"

    return _JOB_MATCHER.sub(replace, text)


def _scrape_configs(options: ExportOptions) -> list[dict[str, Any]]:
    """The packaged configuration's scrape jobs with the user's names, targets and labels."""
    source = yaml.safe_load(assets.PROMETHEUS_CONFIG.read_text())
    targets = {
        DEFAULT_TORCHSERVE_JOB: list(options.torchserve_targets),
        DEFAULT_EXPORTER_JOB: list(options.exporter_targets),
    }
    labels = dict(options.labels)
    if options.namespace is not None:
        labels["namespace"] = options.namespace
    jobs: list[dict[str, Any]] = []
    for job in source["scrape_configs"]:
        name = job["job_name"]
        if name not in targets:
            raise ValueError(
                f"{assets.PROMETHEUS_CONFIG}: expected jobs {sorted(targets)}, got {name!r}"
            )
        group: dict[str, Any] = {"targets": targets[name]}
        if labels:
            group["labels"] = dict(labels)
        jobs.append({**job, "job_name": options.jobs[name], "static_configs": [group]})
    return jobs


def _jobs_yaml(jobs: Sequence[Mapping[str, Any]], indent: str) -> str:
    """The scrape jobs as YAML a person reads (strings JSON-quoted: JSON strings are YAML)."""
    lines = []
    for job in jobs:
        lines.append(f"{indent}- job_name: {json.dumps(job['job_name'])}")
        for key, value in job.items():
            if key in ("job_name", "static_configs"):
                continue
            dumped = yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False)
            lines += [f"{indent}  {line}" for line in dumped.splitlines()]
        lines.append(f"{indent}  static_configs:")
        for group in job["static_configs"]:
            targets = ", ".join(json.dumps(t) for t in group["targets"])
            lines.append(f"{indent}    - targets: [{targets}]")
            if group.get("labels"):
                lines.append(f"{indent}      labels:")
                for name, value in group["labels"].items():
                    lines.append(f"{indent}        {name}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def render(options: ExportOptions) -> dict[str, str]:
    """Every file of the export: its path relative to the export directory, and its text."""
    options.validate()
    jobs = options.jobs
    files: dict[str, str] = {}
    runbook = options.runbook_base or default_runbook_base()
    for path in sorted(assets.RULES.glob("*.yml")):
        text = _rename_jobs(path.read_text(), jobs, path.name)
        files[f"prometheus/rules/{path.name}"] = set_runbook_base(text, runbook)
    scrape = _scrape_configs(options)
    job_names = f'job="{options.torchserve_job}" and job="{options.exporter_job}"'
    files["prometheus/scrape-configs.yml"] = (
        "# hookwatch's scrape jobs, written by `hookwatch export-monitoring`: paste them under\n"
        "# `scrape_configs:` in your prometheus.yml, and load rules/*.yml with `rule_files:`.\n"
        f"# The rules and dashboards select these jobs by name ({job_names}).\n"
        + _jobs_yaml(scrape, "")
    )
    files["prometheus/prometheus.yml"] = (
        "# A complete Prometheus configuration for hookwatch, written by `hookwatch\n"
        "# export-monitoring`: TorchServe's metrics endpoint and the hookwatch exporter, and the\n"
        "# rules of rules/ (relative to this file). scrape-configs.yml holds the same jobs alone.\n"
        "global:\n"
        f"  scrape_interval: {options.scrape_interval}\n"
        f"  evaluation_interval: {options.scrape_interval}\n"
        "\n"
        "rule_files:\n"
        "  - rules/*.yml\n"
        "\n"
        "scrape_configs:\n" + _jobs_yaml(scrape, "  ")
    )
    for path in sorted(assets.DASHBOARDS.glob("*.json")):
        files[f"grafana/dashboards/{path.name}"] = _rename_jobs(path.read_text(), jobs, path.name)
    for path in sorted(p for p in assets.PROVISIONING.rglob("*") if p.is_file()):
        relative = path.relative_to(assets.PROVISIONING).as_posix()
        text = path.read_text()
        if relative.startswith("datasources/"):
            text = _DATASOURCE_URL.sub(
                lambda m: f"{m['indent']}url: {options.datasource_url}", text
            )
            text = _TIME_INTERVAL.sub(
                lambda m: f"{m['indent']}timeInterval: {options.scrape_interval}", text
            )
        files[f"grafana/provisioning/{relative}"] = text
    return files


def check_directory(directory: Path, force: bool) -> None:
    """A directory to write an export into: missing or empty, or any with ``force``."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"expected an empty or missing directory, got {directory}, a file")
    if directory.is_dir() and not force:
        entries = sum(1 for _ in directory.iterdir())
        if entries:
            raise ConfigError(
                f"expected an empty or missing directory, got {directory} with {entries} "
                f"entr{'y' if entries == 1 else 'ies'} (pass --force to write into it)"
            )


def export(directory: Path, options: ExportOptions, force: bool = False) -> list[Path]:
    """Write :func:`render`'s files into ``directory``: missing or empty, or any with ``force``
    (files of the export are replaced, every other file is left as it is)."""
    return write_files(directory, render(options), force)


def write_files(
    directory: Path,
    files: Mapping[str, str],
    force: bool,
    copies: Sequence[tuple[Path, str]] = (),
) -> list[Path]:
    """An export's text ``files`` and its ``copies`` (a file, its path in the export) written
    into ``directory`` (:func:`check_directory`), or a one-line :class:`ConfigError`."""
    check_directory(directory, force)
    written = []
    try:
        for relative, text in files.items():
            path = directory / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
        for source, relative in copies:
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            written.append(target)
    except OSError as error:
        raise ConfigError(
            f"expected a writable directory, got {directory} ({error.strerror}: {error.filename})"
        ) from None
    return written
