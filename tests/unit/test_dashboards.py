"""Grafana dashboards as code: they follow the conventions a fleet of multiprocess workers needs.
Metric names are checked in test_rules.py, Grafana's published types (tsc) in
tests/integration/test_dashboards_schema.py, every query against a real Prometheus in
tests/integration/test_dashboards.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests import grafana
from tests.grafana import TORCHSERVE_COUNTERS, label_values, series_names

#: File name -> uid. Links, bookmarks and alert annotations point at uids: changing one breaks
#: them, so a change must be deliberate and show up here.
UIDS = {
    "overview.json": "hookwatch-overview",
    "activations.json": "hookwatch-activations",
    "drift.json": "hookwatch-drift",
    "units.json": "hookwatch-units",
}
BOARDS = grafana.load()
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _visual_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in grafana.panels(board) if p["type"] != "row"]


def test_the_dashboards_and_their_stable_uids() -> None:
    assert {name: board["uid"] for name, board in BOARDS.items()} == UIDS
    for board in BOARDS.values():
        assert "hookwatch" in board["tags"]
        assert board["title"].startswith("hookwatch / ")


def test_variables_datasource_model_and_layer() -> None:
    for name, board in BOARDS.items():
        variables = {v["name"]: v for v in grafana.variables(board)}
        assert {"datasource", "model", "layer"} <= set(variables), name
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for variable in variables.values():
            if variable["type"] != "query":
                continue
            assert variable["datasource"] == DATASOURCE, (name, variable["name"])
            selector, _ = label_values(variable["query"])
            assert series_names(selector), (name, variable["name"])
        assert label_values(variables["model"]["query"])[1] == "model"
        # Layers by their own label, or by the drift detector watching each of them.
        assert label_values(variables["layer"]["query"])[1] in ("layer", "detector"), name
        # Every variable a query names is defined before it (Grafana resolves them in order).
        defined: set[str] = set()
        for variable in grafana.variables(board):
            used = set(re.findall(r"\$\{?(\w+)", json.dumps(variable.get("query", ""))))
            assert used <= defined, (name, variable["name"], used - defined)
            defined.add(variable["name"])


def test_every_panel_queries_the_datasource_variable_and_sets_a_unit() -> None:
    for name, board in BOARDS.items():
        ids = [p["id"] for p in grafana.panels(board)]
        assert len(ids) == len(set(ids)), name
        for panel in _visual_panels(board):
            where = (name, panel["title"])
            assert panel["datasource"] == DATASOURCE, where
            assert panel["targets"], where
            assert all(t["datasource"] == DATASOURCE for t in panel["targets"]), where
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), where
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            assert panel.get("description"), where


def test_panels_fit_the_grid_without_overlapping() -> None:
    for name, board in BOARDS.items():
        cells: dict[tuple[int, int], str] = {}
        for panel in grafana.panels(board):
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, (name, panel["title"], cells.get((x, y)))
                    cells[(x, y)] = panel["title"]


def test_queries_aggregate_over_workers_and_replicas() -> None:
    """hookwatch series carry no pid, but one per replica (instance): every panel aggregates,
    so a fleet of replicas reads as one line per model, layer or detector."""
    aggregation = re.compile(
        r"\(*\s*((sum|max|min|avg|count|topk|bottomk)\b|histogram_quantile\(\s*[\d.]+,\s*sum\b)"
    )
    for name, board in BOARDS.items():
        for query in grafana.queries(name, board):
            assert aggregation.match(query.expr), query


def test_rate_and_increase_only_on_counters() -> None:
    counter = re.compile(r"\b(rate|irate|increase)\(\s*([A-Za-z_:][\w:]*)")
    for name, board in BOARDS.items():
        for query in grafana.queries(name, board):
            for _, metric in counter.findall(query.expr):
                # A summary's _count and a histogram's buckets only grow: counters too.
                counter_like = metric.endswith(("_total", "_count", "_bucket"))
                assert counter_like or metric in TORCHSERVE_COUNTERS, query
            # A statistic's _sum falls for negative values: only delta() reads it right.
            assert "rate(hookwatch_activation_statistic" not in query.expr, query
            assert "increase(hookwatch_activation_statistic" not in query.expr, query


def test_thresholds_and_references_are_series_drawn_dashed() -> None:
    """A threshold or reference value is a series of its own beside the values, and drawn so
    that it reads as one."""
    shown = 0
    for name, board in BOARDS.items():
        for panel in _visual_panels(board):
            legends = [t.get("legendFormat", "") for t in panel["targets"]]
            marked = [legend for legend in legends if re.search(r"threshold|reference", legend)]
            if not marked or panel["type"] != "timeseries":
                continue
            shown += 1
            assert len(marked) < len(legends), (name, panel["title"], "values missing")
            dashed = [
                o["matcher"]["options"]
                for o in panel["fieldConfig"]["overrides"]
                if o["matcher"]["id"] == "byRegexp"
                and {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}
                in o["properties"]
            ]
            assert dashed, (name, panel["title"])
            for legend in marked:
                assert any(re.fullmatch(p, legend) for p in dashed), (name, legend)
    # drift score, evidence, fleet score, five statistics and NaN/Inf against their references
    assert shown >= 9


def test_units_are_set_where_the_quantity_has_one() -> None:
    units = {
        (name, p["title"]): p["fieldConfig"]["defaults"]["unit"]
        for name, board in BOARDS.items()
        for p in _visual_panels(board)
    }
    assert units[("overview.json", "Mean latency (TorchServe)")] == "µs"
    assert units[("overview.json", "Handler latency percentiles")] == "s"
    assert units[("overview.json", "Requests per second")] == "reqps"
    assert units[("overview.json", "Dropped captures per sampled request")] == "percentunit"
    assert units[("activations.json", "Zero fraction per layer")] == "percentunit"
    assert units[("drift.json", "Window alarm share")] == "percentunit"


def test_the_units_dashboard_shows_dead_and_saturated_units_and_classes() -> None:
    board = BOARDS["units.json"]
    titles = {p["title"] for p in _visual_panels(board)}
    assert {
        "Never-active units per layer",
        "Saturated units per layer",
        "Least active units in the last hour",
        "Mean by predicted class",
    } <= titles
    exprs = " ".join(q.expr for q in grafana.queries("units.json", board))
    for metric in (
        "model_layer:hookwatch_units_never_active:ratio1h",
        "hookwatch_reference_dead_units",
        "hookwatch_class_activation_statistic_sum",
    ):
        assert metric in exprs, metric
