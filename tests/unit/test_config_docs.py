"""docs/configuration.md's option tables follow the config fields (dev/config_docs.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dev.config_docs import BLOCKS, render, table
from hookwatch._config import (
    DriftConfig,
    HarmConfig,
    MonitoringConfig,
    OutputSpec,
    TextSpec,
    options,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def test_configuration_md_is_current() -> None:
    text = DOC.read_text()
    for name in BLOCKS:
        assert f"<!-- generated: {name} " in text and f"<!-- end generated: {name} -->" in text
    assert render(text) == text, "docs/configuration.md's option tables are stale: run `make docs`"


def test_a_stale_or_missing_block_is_caught() -> None:
    text = DOC.read_text()
    stale = text.replace(
        "| `sample_rate` | number in [0, 1] or null | null |", "| `sample_rate` | x | 0.2 |"
    )
    assert stale != text and render(stale) == text
    without = text.replace("<!-- end generated: drift -->", "")
    with pytest.raises(ValueError, match=r"for \['drift'\]"):
        render(without)


@pytest.mark.parametrize("cls", [MonitoringConfig, DriftConfig, OutputSpec, HarmConfig, TextSpec])
def test_every_option_has_a_row(cls: type) -> None:
    generated = "".join(table(name) for name in BLOCKS)
    nested = {"drift", "output", "harm"}
    for f in dataclasses.fields(cls):
        if f.name not in nested:
            assert any(f.name == g.name for g, _ in options(cls)), f"{cls.__name__}.{f.name}"
            assert f"{f.name}` |" in generated, f"{cls.__name__}.{f.name}"
