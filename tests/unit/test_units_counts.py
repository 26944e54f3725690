"""`hookwatch units --prometheus`: counts read from the samples Prometheus holds, exact, and a
model that has none named as such (both found by an outside run, 2026-12-07: 40 captures read
as 42 through increase()'s extrapolation; `--model nosuch` said "no unit counts yet", exit 0)."""

from __future__ import annotations

from typing import Any

import pytest

from hookwatch._errors import ConfigError
from hookwatch.tools import units


def _series(labels: dict[str, str], counts: list[float]) -> tuple[dict[str, str], Any]:
    return labels, [[1000.0 + 15 * i, str(c)] for i, c in enumerate(counts)]


def test_counts_are_the_samples_increases_resets_included(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = {"model": "m", "layer": "act"}
    answers = {
        # Two workers: one counted 0 -> 40; one restarted (30 -> 10): 25 before, 10 after.
        units.CAPTURES: [
            _series({**layer, "pod": "a"}, [0, 12, 40]),
            _series({**layer, "pod": "b"}, [5, 30, 10]),
        ],
        units.ACTIVE: [
            _series({**layer, "unit": "0", "pod": "a"}, [0, 0, 0]),
            _series({**layer, "unit": "1", "pod": "a"}, [0, 7, 9]),
        ],
        units.SATURATED: [
            _series({**layer, "unit": "0", "pod": "a"}, [0, 0, 0]),
            _series({**layer, "unit": "1", "pod": "a"}, [0, 12, 40]),
            _series({**layer, "unit": "1", "pod": "b"}, [5, 30, 10]),
        ],
    }
    asked: list[str] = []

    def answer(url: str, promql: str) -> list[tuple[dict[str, str], Any]]:
        asked.append(promql)
        for name, result in answers.items():
            if promql.startswith(name + "{") or promql.startswith(name + "["):
                assert promql.endswith("[1h]"), promql  # the raw samples, not increase()
                return result
        return [(layer, [0.0, "0.1"])]  # the reference shares

    monkeypatch.setattr(units, "_answer", answer)
    (found,) = units.from_prometheus("http://prometheus", "1h")
    assert found.samples == 75  # 40 + 25 + 10: not an extrapolation
    assert found.active == {0: 0.0, 1: 9.0} and found.dead == [0]
    assert found.stuck == [1]
    assert not any("increase(" in q for q in asked), asked
    assert "m/act: 2 units tracked, 75 samples" in units.table([found])


def test_a_model_without_unit_counts_is_named_beside_those_with() -> None:
    found = units.LayerUnits("m", "act", active={0: 1.0}, samples=1.0)
    with pytest.raises(
        ConfigError, match=r"expected one of the models with unit counts \['m'\], got 'nosuch'"
    ):
        units.table([found], "nosuch")
    assert units.table([], "nosuch").startswith("no unit counts yet")


def test_a_model_without_unit_counts_in_prometheus_names_those_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --prometheus asks for the model in its queries: none came back, and it said "no unit
    # counts yet" (exit 0) where another model had them (an outside run, 2026-12-07).
    def answer(url: str, promql: str) -> list[tuple[dict[str, str], Any]]:
        return [({"model": "mlp"}, [0.0, "32"])] if promql.startswith("count by (model)") else []

    monkeypatch.setattr(units, "_answer", answer)
    with pytest.raises(ConfigError, match=r"unit counts \['mlp'\], got 'nosuch'"):
        units.from_prometheus("http://prometheus", "1h", "nosuch")
