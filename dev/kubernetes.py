"""``python -m dev.kubernetes`` (``make kubernetes``): the repository's ``deploy/kubernetes``.

Writes it from the package (:mod:`hookwatch.tools.kubernetes`, what ``hookwatch
export-kubernetes`` writes for a user's model): the manifests under
``hookwatch/_assets/kubernetes`` as they are (the demo's model, the image ``hookwatch:dev``),
and under ``base/generated/`` the alerting rules as PrometheusRule objects and the dashboards as
ConfigMaps for Grafana's sidecar, their ``runbook_url`` the repository's runbook.

``--check`` writes nothing and exits 1 with each stale file and its difference;
tests/unit/test_kubernetes.py runs the same comparison.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from hookwatch.tools import assets
from hookwatch.tools.kubernetes import DASHBOARDS, RULES, _indent, generated_manifests

ROOT = Path(__file__).resolve().parents[1]
#: Relative to the repository root.
KUBERNETES = Path("deploy/kubernetes")
GENERATED = KUBERNETES / "base" / "generated"
__all__ = ["DASHBOARDS", "GENERATED", "RULES", "_indent", "differences", "manifests", "write"]
#: The alerts' runbook_url, relative to the generated file: the repository's docs/runbook.md
#: (``hookwatch export-monitoring --runbook-base URL`` and your own PrometheusRule point them at
#: a copy your on-call can open; the installed package's file:// path is not known here).
RUNBOOK_BASE = "../../../../docs/runbook.md"


def manifests() -> dict[Path, str]:
    """Every file of ``deploy/kubernetes``: its path relative to the repository root, and its
    text. The package's manifests (``hookwatch export-kubernetes`` writes them for a user's
    model) as they are, and the generated ones."""
    files = {
        KUBERNETES / path.relative_to(assets.KUBERNETES): path.read_text()
        for path in sorted(assets.KUBERNETES.rglob("*.yaml"))
    }
    by = "`make kubernetes` (python -m dev.kubernetes)"
    for relative, text in generated_manifests(RUNBOOK_BASE, by).items():
        files[KUBERNETES / "base" / relative] = text
    return files


def differences(root: Path = ROOT) -> list[str]:
    """One message per generated file under ``root`` that is missing or differs: the file and
    a unified diff from the committed text to the generator's."""
    problems = []
    for relative, expected in manifests().items():
        path = root / relative
        if not path.is_file():
            problems.append(f"{relative}: missing (run `make kubernetes`)")
            continue
        actual = path.read_text()
        if actual != expected:
            diff = "".join(
                difflib.unified_diff(
                    actual.splitlines(True),
                    expected.splitlines(True),
                    f"{relative} (committed)",
                    f"{relative} (generated)",
                )
            )
            problems.append(f"{relative} differs from what `make kubernetes` generates:\n{diff}")
    return problems


def write(root: Path = ROOT) -> list[Path]:
    written = []
    for relative, text in manifests().items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.kubernetes", description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = differences(args.root)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    written = write(args.root)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"{KUBERNETES} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
