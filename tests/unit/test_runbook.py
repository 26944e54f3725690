"""The runbook: a section for every alert with its first five minutes, and every ``runbook_url``
(in the package, in each export, in the repository's copies, in the native stack's rules)
resolving to a section that exists."""

from __future__ import annotations

import re
import shlex
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hookwatch.tools import assets, cli
from hookwatch.tools.devstack import Ports, Stack
from hookwatch.tools.export import ExportOptions, default_runbook_base, render

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
FIVE_MINUTES = ("**For users.**", "**Urgency.**", "**Look at.**", "**Silence**", "**Roll back**")


def _anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) derive from a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _sections(text: str) -> dict[str, str]:
    """Each ``## `` heading's anchor and the text up to the next one."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {_anchor(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def _alerts(text: str) -> Iterator[dict[str, Any]]:
    for group in yaml.safe_load(text)["groups"]:
        yield from (rule for rule in group["rules"] if "alert" in rule)


PACKAGED = [a for path in sorted(assets.RULES.glob("*.yml")) for a in _alerts(path.read_text())]


def _resolve(url: str, rule_file: Path) -> tuple[Path, str]:
    """The file and anchor a ``runbook_url`` names: a file:// URL, or a reference relative to
    the rule file that holds it."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path)), parsed.fragment
    assert parsed.scheme == "" and not parsed.netloc, f"expected a file or a path, got {url}"
    return (rule_file.parent / parsed.path).resolve(), parsed.fragment


def _check_resolves(rule_file: Path, text: str) -> int:
    checked = 0
    for alert in _alerts(text):
        url = alert["annotations"]["runbook_url"]
        path, anchor = _resolve(url, rule_file)
        assert path.is_file(), f"{rule_file}: {alert['alert']}'s runbook_url {url}: no {path}"
        assert anchor == alert["alert"].lower(), url
        assert anchor in _sections(path.read_text()), f"{url}: no section #{anchor} in {path}"
        checked += 1
    return checked


def test_every_alert_has_a_section_with_its_first_five_minutes() -> None:
    assert len(PACKAGED) >= 10
    sections = _sections(RUNBOOK.read_text())
    for alert in PACKAGED:
        name = alert["alert"]
        section = sections.get(name.lower())
        assert section is not None, f"docs/runbook.md has no '## {name}' section"
        missing = [part for part in FIVE_MINUTES if part not in section]
        assert not missing, f"{name}: its section lacks {missing}"
        severity = alert["labels"]["severity"]
        urgency = section.split("**Urgency.**", 1)[1].split("\n- ", 1)[0]
        assert f"`{severity}`" in urgency, f"{name}: the urgency names no `{severity}`"


def test_the_triage_table_lists_every_alert_with_its_severity() -> None:
    table = _sections(RUNBOOK.read_text())["triage-at-a-glance"]
    for alert in PACKAGED:
        (row,) = [line for line in table.splitlines() if f"[{alert['alert']}]" in line]
        assert alert["labels"]["severity"] in row, row


def test_the_package_ships_the_runbook() -> None:
    assert assets.RUNBOOK.read_text() == RUNBOOK.read_text(), (
        "src/hookwatch/_assets/docs/runbook.md differs from docs/runbook.md: run `make monitoring`"
    )
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"_assets/docs/*.md"' in pyproject, "the runbook is not package data"


def test_every_link_inside_the_runbook_resolves() -> None:
    text = RUNBOOK.read_text()
    sections = _sections(text)
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        assert anchor in sections, f"docs/runbook.md links to #{anchor}, which is no heading"
    for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", text):
        assert (RUNBOOK.parent / target).is_file(), f"docs/runbook.md links to missing {target}"


def test_packaged_rules_point_at_the_shipped_runbook() -> None:
    checked = sum(_check_resolves(p, p.read_text()) for p in sorted(assets.RULES.glob("*.yml")))
    assert checked == len(PACKAGED)


@pytest.mark.parametrize(
    "rule_files",
    ["monitoring/prometheus/rules", "deploy/kubernetes/base/generated"],
)
def test_repository_copies_point_at_docs_runbook(rule_files: str) -> None:
    checked = 0
    for path in sorted((ROOT / rule_files).glob("*.y*ml")):
        for document in path.read_text().split("\n---\n"):
            if "kind: PrometheusRule" in document:
                document = yaml.safe_dump(yaml.safe_load(document)["spec"])
            elif "kind:" in document:
                continue
            checked += _check_resolves(path, document)
    assert checked == len(PACKAGED)


def test_the_default_export_points_at_the_installed_runbook(tmp_path: Path) -> None:
    assert default_runbook_base() == assets.RUNBOOK.as_uri()
    files = render(ExportOptions())
    checked = sum(
        _check_resolves(tmp_path / name, text)
        for name, text in files.items()
        if name.startswith("prometheus/rules/")
    )
    assert checked == len(PACKAGED)


def test_runbook_base_sets_every_runbook_url(tmp_path: Path) -> None:
    base = "https://wiki.example.com/ml/hookwatch-runbook"
    assert cli.main(["export-monitoring", str(tmp_path), "--runbook-base", base]) == 0
    urls = [
        alert["annotations"]["runbook_url"]
        for path in sorted((tmp_path / "prometheus" / "rules").glob("*.yml"))
        for alert in _alerts(path.read_text())
    ]
    assert urls == [f"{base}#{a['alert'].lower()}" for a in PACKAGED]


def test_the_native_stack_points_at_the_installed_runbook(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    stack = Stack(root=tmp_path, run_dir=run, ports=Ports.free())
    stack.render_prometheus_config()
    checked = sum(_check_resolves(p, p.read_text()) for p in sorted((run / "rules").glob("*.yml")))
    assert checked == len(PACKAGED)


def test_hookwatch_commands_in_the_runbook_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every hookwatch command the runbook gives with options is one the CLI accepts (the
    files it names exist: the CLI checks input files as it parses)."""
    monkeypatch.chdir(tmp_path)
    text = RUNBOOK.read_text()
    fenced = "\n".join(re.findall(r"^```sh\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL))
    commands = re.findall(r"^(hookwatch [^\n]+)$", fenced, flags=re.MULTILINE)
    commands += re.findall(r"`(hookwatch [^`]*--[^`]+)`", text)
    assert any(c.startswith("hookwatch archive ") for c in commands), commands
    parser = cli.build_parser()
    for command in commands:
        argv = shlex.split(command)[1:]
        if "DIR" in argv:
            argv[argv.index("DIR")] = "out"
        for word in argv:
            if re.fullmatch(r"[\w./-]+\.(pt|yaml|jsonl|npy|npz|mar)", word):
                Path(word).parent.mkdir(parents=True, exist_ok=True)
                Path(word).touch()
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            raise AssertionError(f"docs/runbook.md: `{command}` does not parse") from exit_
