"""What the report draws: sections of dashboard panels, named by dashboard file and title.

The queries, units, legends and which series are dashed (references, thresholds) come from
the panels in ``monitoring/grafana/dashboards``, so the report shows what the dashboards show
and changes with them. A section here only picks panels and says how to split them into small
plots; a panel that is renamed or removed fails ``tests/unit/test_report.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hookwatch.tools import dashboards


@dataclass(frozen=True)
class PanelRef:
    """One dashboard panel the report draws."""

    dashboard: str
    title: str
    #: Labels whose values split the panel into small plots, one each (e.g. one per layer).
    facet: tuple[str, ...] = ()
    #: The targets (refIds) drawn; empty: all of the panel's targets.
    refs: tuple[str, ...] = ()
    #: Shown instead of the dashboard's title (which may name a variable).
    heading: str = ""


@dataclass(frozen=True)
class Section:
    heading: str
    #: One sentence on what to look for.
    text: str
    panels: tuple[PanelRef, ...]
    #: Drawn only for a model with a drift profile loaded.
    needs_profile: bool = False


def _statistic(title: str) -> PanelRef:
    return PanelRef("activations.json", title, facet=("layer",))


SECTIONS: tuple[Section, ...] = (
    Section(
        "Traffic",
        "Requests the model received, the share hookwatch sampled for capture, and captures "
        "dropped because the capture queue was full.",
        (
            PanelRef("overview.json", "Requests per second"),
            PanelRef("overview.json", "Captures sampled and dropped", refs=("A", "B")),
        ),
    ),
    Section(
        "Drift scores",
        "Each detector's sliding-window score against its calibrated threshold (dashed), and "
        "the anytime-valid evidence against the threshold at which it pages.",
        (
            PanelRef(
                "drift.json",
                "Drift score against threshold: $level",
                facet=("level", "detector"),
                heading="Drift score against threshold",
            ),
            PanelRef("drift.json", "Evidence against the reference", facet=("level", "detector")),
        ),
        needs_profile=True,
    ),
    Section(
        "Activation statistics",
        "The fleet-wide average of each per-sample statistic per layer against its value on "
        "the reference data (dashed).",
        tuple(
            _statistic(title)
            for title in (
                "Mean per layer",
                "Standard deviation per layer",
                "Minimum per layer",
                "Maximum per layer",
                "Zero fraction per layer",
            )
        ),
    ),
    Section(
        "Units and classes",
        "Per layer, the share of units that never fired and that sat saturated over the last "
        "hour against the same shares on the reference (dashed): the pruning candidates; and "
        "each layer's mean by the class the model predicted.",
        (
            PanelRef("units.json", "Never-active units per layer", facet=("layer",)),
            PanelRef("units.json", "Saturated units per layer", facet=("layer",)),
            PanelRef("units.json", "Mean by predicted class", facet=("layer",)),
        ),
    ),
)

#: Panels read for the header and the onset mark rather than drawn: whether a profile is
#: loaded, which detectors alarmed first in each alarm episode, and the anytime-valid alarms.
PROFILE = PanelRef("drift.json", "Drift profile", refs=("A",))
FIRST_ALARM = PanelRef("drift.json", "Which layer moved first")
SEQUENTIAL_ALARMS = PanelRef("drift.json", "Sequential alarms")


@dataclass(frozen=True)
class Target:
    """One query of a panel, its dashboard variables still in it."""

    ref: str
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A dashboard panel as the report draws it."""

    ref: PanelRef
    title: str
    description: str
    unit: str
    targets: tuple[Target, ...]
    source: Mapping[str, Any]

    def dashed(self, name: str) -> bool:
        """Whether the dashboard draws the series called ``name`` dashed."""
        return dashboards.dashed(self.source, name)

    def soft_limits(self) -> tuple[float | None, float | None]:
        """The dashboard's ``axisSoftMin`` and ``axisSoftMax`` (e.g. 0: scores from zero)."""
        custom = self.source.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
        low, high = custom.get("axisSoftMin"), custom.get("axisSoftMax")
        return (
            None if low is None else float(low),
            None if high is None else float(high),
        )


def load_panel(boards: Mapping[str, Mapping[str, Any]], ref: PanelRef) -> Panel:
    board = boards.get(ref.dashboard)
    if board is None:
        raise ValueError(f"expected dashboard {ref.dashboard}, got only {sorted(boards)}")
    found = [p for p in dashboards.panels(board) if p.get("title") == ref.title]
    if len(found) != 1:
        titles = sorted(str(p.get("title")) for p in dashboards.panels(board))
        raise ValueError(
            f"expected one panel titled {ref.title!r} in {ref.dashboard}, got {len(found)} "
            f"(titles: {titles})"
        )
    source = found[0]
    targets = tuple(
        Target(t["refId"], t["expr"], t.get("legendFormat", ""))
        for t in source.get("targets", [])
        if not ref.refs or t["refId"] in ref.refs
    )
    missing = set(ref.refs) - {t.ref for t in targets}
    if missing or not targets:
        raise ValueError(
            f"expected targets {sorted(ref.refs) or 'any'} in {ref.dashboard} / {ref.title!r}, "
            f"got {[t['refId'] for t in source.get('targets', [])]}"
        )
    return Panel(
        ref,
        ref.heading or ref.title,
        source.get("description", ""),
        source.get("fieldConfig", {}).get("defaults", {}).get("unit", "none"),
        targets,
        source,
    )


def load_sections(
    boards: Mapping[str, Mapping[str, Any]],
) -> list[tuple[Section, list[Panel]]]:
    """Every section with its panels, read from the dashboards."""
    return [(s, [load_panel(boards, ref) for ref in s.panels]) for s in SECTIONS]


def variable_values(
    boards: Mapping[str, Mapping[str, Any]], model: str, intervals: Mapping[str, str]
) -> dict[str, str]:
    """Values for the dashboards' variables that show a whole model: ``model``, every other
    variable that offers "All" at its all-value, and Grafana's interval variables."""
    values = dict(intervals)
    for board in boards.values():
        for variable in dashboards.variables(board):
            if variable.get("includeAll") and variable.get("allValue"):
                values[variable["name"]] = str(variable["allValue"])
    values["model"] = model
    return values


def model_selector(boards: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """(selector, label) of the dashboards' ``model`` variable: where model names come from."""
    for board in boards.values():
        for variable in dashboards.variables(board):
            if variable.get("name") == "model" and variable.get("type") == "query":
                return dashboards.label_values(str(variable["query"]))
    raise ValueError("expected a query variable named model in the dashboards, got none")


_TEMPLATE = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(template: str, labels: Mapping[str, str]) -> str:
    """A series' name as Grafana shows it from a ``legendFormat`` such as ``{{layer}} mean``."""
    return _TEMPLATE.sub(lambda m: labels.get(m[1], ""), template).strip()


def facet_key(ref: PanelRef, labels: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in ref.facet)


def short_legend(name: str, key: Sequence[str]) -> str:
    """``name`` without the facet's own label values, which the small plot's title shows."""
    kept = [word for word in name.split() if word.strip("()") not in key]
    return " ".join(kept) or "live"
