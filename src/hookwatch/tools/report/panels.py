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
    #: The figure's caption, for the report's reader; the dashboard's description (written for
    #: dashboard authors, with its PromQL notes) stays in the dashboard.
    caption: str = ""
    #: Left out of the page when it has no data (e.g. a model without an accuracy estimate).
    optional: bool = False
    #: A horizontal line drawn at this value (e.g. 1 where a ratio crosses its threshold).
    line_at: float | None = None


@dataclass(frozen=True)
class Section:
    heading: str
    #: One sentence on what to look for.
    text: str
    panels: tuple[PanelRef, ...]
    #: Drawn only for a model with a drift profile loaded.
    needs_profile: bool = False


def _statistic(title: str, what: str) -> PanelRef:
    return PanelRef(
        "activations.json",
        title,
        facet=("layer",),
        caption=f"Per layer, the average {what} of the layer's output over the requests "
        "sampled in each interval, all workers together; dashed: the same on the reference "
        "data. A step at the red line is the layer seeing different inputs.",
    )


SECTIONS: tuple[Section, ...] = (
    Section(
        "Drift",
        "Which detectors moved, when, and how far. A detector is a test of one layer (or of "
        "the input or output) against the reference data the model was archived with.",
        (
            PanelRef(
                "drift.json",
                "Score over threshold",
                heading="How far past its threshold each detector went",
                caption="Each detector's latest window score divided by its calibrated "
                "threshold, on a log scale where the values span orders of magnitude: above "
                "the dashed line at 1 the window alarms (a warning). Triangles along the top: "
                "alarms of the per-worker anytime-valid test (a warning).",
                line_at=1.0,
            ),
            PanelRef(
                "drift.json",
                "Drift score against threshold: $level",
                facet=("level", "detector"),
                heading="Drift score against threshold, per detector",
                caption="Per detector, the score of the last window of sampled requests "
                "(about 1 on traffic like the reference; the worst worker's) against the "
                "threshold calibrated for it (dashed). The shading marks alarm episodes.",
            ),
            PanelRef(
                "drift.json",
                "Evidence against the reference",
                facet=("level", "detector"),
                caption="Per detector, the anytime-valid test's evidence that traffic left the "
                "reference (log) against the level at which it alarms (a warning) and restarts "
                "from 0 (dashed). Drawn at one point per step, a climb and its restart can "
                "fall between two points: the triangles mark every alarm the counters "
                "recorded.",
            ),
            PanelRef(
                "drift.json",
                "Estimated accuracy against the reference",
                caption="Accuracy estimated without labels (models archived with a labelled "
                "reference): the fleet's estimate and the lowest worker's last window, "
                "against the model's accuracy on the reference (dashed).",
                optional=True,
            ),
        ),
        needs_profile=True,
    ),
    Section(
        "Traffic",
        "What the model served: requests, those hookwatch sampled for capture, and captures "
        "dropped because the capture queue was full (the model's answers are never held up).",
        (
            PanelRef(
                "overview.json",
                "Requests per second",
                caption="Requests per second the model received (hookwatch's count and "
                "TorchServe's), all workers together, and those sampled for capture.",
            ),
            PanelRef(
                "overview.json",
                "Captures sampled and dropped",
                refs=("A", "B"),
                caption="Sampled requests per second, and captures dropped because the "
                "capture queue was full (0 is the norm: a dropped capture is a sample the "
                "statistics and drift tests did not see).",
            ),
        ),
    ),
    Section(
        "Activation statistics",
        "What the watched layers put out, averaged over the sampled requests of every worker, "
        "against the same statistic on the reference data (dashed).",
        (
            _statistic("Mean per layer", "value"),
            _statistic("Standard deviation per layer", "standard deviation"),
            _statistic("Minimum per layer", "minimum"),
            _statistic("Maximum per layer", "maximum"),
            _statistic("Zero fraction per layer", "share of exact zeros"),
        ),
    ),
    Section(
        "Units and classes",
        "Per layer, the share of units that never fired and that sat saturated over the last "
        "hour against the same shares on the reference (dashed): the pruning candidates; and "
        "each layer's mean by the class the model predicted.",
        (
            PanelRef(
                "units.json",
                "Never-active units per layer",
                facet=("layer",),
                caption="Share of the layer's units that were zero on every sample captured "
                "in the last hour, against the reference's share (dashed).",
            ),
            PanelRef(
                "units.json",
                "Saturated units per layer",
                facet=("layer",),
                caption="Share of the layer's units that sat at or above the largest value "
                "they took on the reference on every sample of the last hour.",
            ),
            PanelRef(
                "units.json",
                "Mean by predicted class",
                facet=("layer",),
                caption="Each layer's average output by the class the model predicted: which "
                "classes drive a layer, and whose activations moved.",
            ),
        ),
    ),
)

#: Panels read for the header and the onset mark rather than drawn: whether a profile is
#: loaded, which detectors alarmed first in each alarm episode, and the anytime-valid alarms;
#: for the summary, how far each detector went and the accuracy estimate.
PROFILE = PanelRef("drift.json", "Drift profile", refs=("A",))
FIRST_ALARM = PanelRef("drift.json", "Which layer moved first")
SEQUENTIAL_ALARMS = PanelRef("drift.json", "Sequential alarms")
SCORE_RATIO = PanelRef("drift.json", "Score over threshold")
ESTIMATE = PanelRef("drift.json", "Estimated accuracy against the reference", refs=("A",))
REFERENCE_ACCURACY = PanelRef("drift.json", "Estimated accuracy against the reference", refs=("C",))


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
        ref.caption or source.get("description", ""),
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
