"""docs/configuration.md's option tables, generated from the config fields (``make docs``).

Every option's default, bounds and meaning are written once, on its dataclass field in
``src/hookwatch/_config.py`` (an :class:`~hookwatch._config.Option` in the field's metadata).
The tables sit between ``<!-- generated: NAME ... -->`` and ``<!-- end generated: NAME -->``
markers; the prose around them is written by hand. ``python -m dev config-docs`` rewrites the
blocks in place; tests/unit/test_config_docs.py fails when one is stale.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hookwatch._config import (
    DriftConfig,
    HarmConfig,
    MonitoringConfig,
    Option,
    OutputSpec,
    TextSpec,
    interval,
    options,
)

__all__ = ["BLOCKS", "render", "table"]

#: Generated block name -> (the section's dataclass, the key prefix its rows get, and the
#: nested sections whose rows are spliced in where their field stands).
BLOCKS: dict[str, tuple[type, str, dict[str, type]]] = {
    "monitoring": (MonitoringConfig, "", {"output": OutputSpec, "harm": HarmConfig}),
    "drift": (DriftConfig, "", {}),
    "text": (TextSpec, "input.text.", {}),
}

_MARKER = re.compile(
    r"(<!-- generated: (?P<name>\w+) [^\n]*-->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)",
    re.DOTALL,
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, tuple | list):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    return str(value)


def _type(option: Option) -> str:
    if option.kind in ("number", "integer"):
        assert option.bounds is not None
        lo, hi = option.bounds
        what = "int" if option.kind == "integer" else "number"
        text = f"{what} in {interval(lo, hi, option.open_end)}"
    elif option.kind == "bool":
        text = "bool"
    elif option.kind == "choice":
        names = [f"`{c}`" for c in option.choices or ()]
        text = " or ".join(names) if len(names) == 2 else ", ".join(names)
    else:
        text = option.type_doc
    if option.type_note:
        text += f", {option.type_note}"
    return text


def _default(field: dataclasses.Field[Any], option: Option) -> str:
    if field.default is not dataclasses.MISSING:
        return _value(field.default)
    if option.absent is not None:
        return _value(option.absent)
    return "required"


def _rows(cls: type, prefix: str, nested: dict[str, type]) -> list[str]:
    with_option = {f.name: (f, option) for f, option in options(cls)}
    rows: list[str] = []
    for field in dataclasses.fields(cls):
        if field.name in nested:
            rows += _rows(nested[field.name], f"{prefix}{field.name}.", {})
        elif field.name in with_option:
            f, option = with_option[field.name]
            rows.append(
                f"| `{prefix}{f.name}` | {_cell(_type(option))} | {_default(f, option)} "
                f"| {_cell(option.doc)} |"
            )
    return rows


def table(name: str) -> str:
    """The markdown table of generated block ``name``."""
    cls, prefix, nested = BLOCKS[name]
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    return "\n".join(lines + _rows(cls, prefix, nested)) + "\n"


def render(text: str) -> str:
    """``text`` (docs/configuration.md) with every generated block rewritten from the fields.

    Raises ValueError when a block of :data:`BLOCKS` has no markers in ``text``.
    """
    found: set[str] = set()

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise ValueError(
                f"expected a generated block named one of {sorted(BLOCKS)}, got {name!r}"
            )
        found.add(name)
        return f"{match[1]}\n{table(name)}\n{match[4]}"

    result = _MARKER.sub(block, text)
    missing = sorted(set(BLOCKS) - found)
    if missing:
        raise ValueError(
            f"expected the markers '<!-- generated: NAME ... -->' and '<!-- end generated: NAME "
            f"-->' for {missing}, got none"
        )
    return result
