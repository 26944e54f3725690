"""The Grafana dashboards shipped in the package (``hookwatch/_assets``), read as plain JSON.

One reader for everything that takes the dashboards' queries: ``hookwatch report`` draws their
panels with matplotlib, and the tests check and run them. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hookwatch.tools import assets

#: Where the dashboards live: the package's copy (the repository's monitoring/ is its export).
DASHBOARDS = assets.DASHBOARDS


def load(directory: Path) -> dict[str, dict[str, Any]]:
    """Every dashboard in ``directory``, by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels inside collapsed rows."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def variables(board: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(board.get("templating", {}).get("list", []))


_LABEL_VALUES = re.compile(r"\s*label_values\((?P<selector>.*),\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*")


def label_values(query: str) -> tuple[str, str]:
    """(selector, label) of a `label_values(selector, label)` variable query."""
    match = _LABEL_VALUES.fullmatch(query)
    if match is None:
        raise ValueError(f"expected label_values(selector, label), got {query!r}")
    return match["selector"], match["label"]


def substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` with Grafana's ``$name``, ``${name}`` and ``[[name]]`` replaced from ``values``;
    a variable without a value is an error (a query left half-filled would silently match
    nothing)."""

    def value(match: re.Match[str]) -> str:
        name = match["braced"] or match["bracketed"] or match["plain"]
        if name not in values:
            raise KeyError(f"no value for ${name} in {text!r}")
        return values[name]

    return re.sub(
        r"\$\{(?P<braced>\w+)(?::\w+)?\}|\[\[(?P<bracketed>\w+)\]\]|\$(?P<plain>\w+)", value, text
    )


def dashed(panel: Mapping[str, Any], name: str) -> bool:
    """Whether ``panel`` draws the series called ``name`` dashed: the dashboards mark reference
    and threshold series so, with a ``byRegexp`` or ``byName`` override of ``custom.lineStyle``.
    """
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        styles = [
            p["value"]
            for p in override.get("properties", [])
            if p.get("id") == "custom.lineStyle" and isinstance(p.get("value"), dict)
        ]
        if not any(style.get("fill") == "dash" for style in styles):
            continue
        matcher = override.get("matcher", {})
        option = str(matcher.get("options", ""))
        # Grafana tests the regular expression anywhere in the name, unanchored.
        if matcher.get("id") == "byRegexp" and re.search(option, name):
            return True
        if matcher.get("id") == "byName" and option == name:
            return True
    return False
