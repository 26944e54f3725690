"""The committed runs of an in-process harness (``request.json``, ``gpu.json``) and the block
of its page they render into."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Runs = list[dict[str, Any]]


def block(text: str, begin: str, end: str) -> str:
    """The generated block of a page, its markers included."""
    return text[text.index(begin) : text.index(end) + len(end)]


def save(
    result: dict[str, Any],
    keep: Callable[[dict[str, Any]], bool],
    json_path: Path,
    markdown: Path,
    render: Callable[[Runs], str],
    markers: tuple[str, str],
) -> Runs:
    """Add ``result`` to the committed runs, keeping those ``keep`` says, one run per label;
    write them and the page's block rendered from them."""
    runs: Runs = json.loads(json_path.read_text())["runs"] if json_path.exists() else []
    label = result.get("label", "")
    runs = [r for r in runs if keep(r) and r.get("label", "") != label] + [result]
    json_path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    text = markdown.read_text()
    old = block(text, *markers)
    markdown.write_text(text.replace(old, render(runs), 1))
    return runs
