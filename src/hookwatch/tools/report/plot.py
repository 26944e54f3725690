"""One PNG per panel with matplotlib's Agg canvas (no display, no pyplot state): a small plot
per facet, dashed where the dashboard dashes (references, thresholds), the onset of drift as a
red line, the alarm episodes shaded and the anytime-valid alarms as triangles on every one; a
log scale where a plot's values span orders of magnitude (a threshold of 1.65 against scores
of 400)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path

import numpy as np
from matplotlib import patheffects
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, PercentFormatter

from hookwatch.tools.report.onset import Alarms
from hookwatch.tools.report.panels import Panel, facet_key, legend, short_legend
from hookwatch.tools.report.prometheus import Series

#: Grafana units the dashboards use, as an axis label.
UNIT_LABELS = {
    "none": "",
    "short": "",
    "percentunit": "",
    "reqps": "requests/s",
    "cps": "per second",
    "µs": "µs",
    "s": "seconds",
}
ONSET_COLOUR = "#d62728"
REFERENCE_COLOUR = "#404040"
#: Inches: the page shows every image at the width it was drawn.
WIDTH, ROW_HEIGHT, DPI = 11.0, 2.1, 90
MAX_COLUMNS = 4
#: Seconds between time ticks, the first that gives few enough ticks for the plot's width.
TICK_SPACINGS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
#: Time labels that fit across the whole figure's width without touching.
TICKS_PER_WIDTH = 12
#: A plot whose positive values span more than this factor is drawn on a log scale.
LOG_SPAN = 100.0


@dataclass(frozen=True)
class Line:
    name: str
    dashed: bool
    series: Series


def lines(panel: Panel, results: Sequence[tuple[str, Sequence[Series]]]) -> list[Line]:
    """The series worth drawing, by legend template: those with at least one finite value."""
    drawn = []
    for template, series in results:
        for s in series:
            if not np.isfinite(s.values).any():
                continue
            name = legend(template, s.labels) or ", ".join(f"{k}={v}" for k, v in s.labels.items())
            drawn.append(Line(name, panel.dashed(name), s))
    return drawn


def facets(panel: Panel, drawn: Sequence[Line]) -> dict[tuple[str, ...], list[Line]]:
    grouped: dict[tuple[str, ...], list[Line]] = {}
    for line in drawn:
        grouped.setdefault(facet_key(panel.ref, line.series.labels), []).append(line)
    return dict(sorted(grouped.items()))


def render(
    panel: Panel,
    drawn: Sequence[Line],
    marks: Alarms,
    span: tuple[float, float],
    tz: tzinfo,
    out: Path,
) -> None:
    """Write ``panel``'s lines to ``out`` (PNG)."""
    groups = facets(panel, drawn)
    columns = min(MAX_COLUMNS, len(groups))
    rows = math.ceil(len(groups) / columns)
    figure = Figure(figsize=(WIDTH, 0.7 + ROW_HEIGHT * rows), layout="constrained")
    # Agg, attached to this figure only: no display needed, and pyplot's global backend and
    # state are left alone (a notebook importing this keeps its own).
    FigureCanvasAgg(figure)
    grid: list[Axes] = list(figure.subplots(rows, columns, squeeze=False).flat)
    ticks = max(2, TICKS_PER_WIDTH // columns)
    for index, (ax, (key, group)) in enumerate(zip(grid, groups.items(), strict=False)):
        _draw_facet(ax, panel, key, group)
        _mark(ax, marks, span, label=index == 0)
        per = panel.ref.facet.index("detector") if "detector" in panel.ref.facet else None
        _mark_pages(ax, marks, None if per is None else key[per], label=index == 0)
        _time_axis(ax, span, tz, ticks)
        # Times under the lowest plot of each column only: the plots share their range.
        if index + columns < len(groups):
            ax.tick_params(labelbottom=False)
    for ax in grid[len(groups) :]:
        ax.set_visible(False)
    figure.suptitle(panel.title, x=0.01, ha="left", fontsize=12, fontweight="bold")
    _legend(figure, grid[: len(groups)])
    with warnings.catch_warnings():
        # A legend of many series can leave the layout no room: the plot is drawn without
        # it, and a user of `report` or `stop` has no use for matplotlib's warning.
        warnings.filterwarnings("ignore", "constrained_layout not applied", UserWarning)
        figure.savefig(out, dpi=DPI, facecolor="white")


def _draw_facet(ax: Axes, panel: Panel, key: tuple[str, ...], group: list[Line]) -> None:
    colour = 0
    for line in group:
        name = short_legend(line.name, key) if key else line.name
        times, values = line.series.times, line.series.values
        if line.dashed:
            ax.plot(times, values, "--", color=REFERENCE_COLOUR, lw=1.4, label=name)
        else:
            ax.plot(times, values, color=f"C{colour}", lw=1.5, label=name)
            colour += 1
    if panel.ref.line_at is not None:
        ax.axhline(panel.ref.line_at, ls="--", color=REFERENCE_COLOUR, lw=1.2)
    values = np.concatenate([line.series.values for line in group])
    scale = log_scale(values)
    if scale is not None:
        ax.set_yscale(*scale)
    else:
        low, high = panel.soft_limits()
        bottom, top = ax.get_ylim()
        # The dashboard's soft limits: the axis reaches them unless the data goes beyond.
        ax.set_ylim(
            bottom if low is None else min(bottom, low), top if high is None else max(top, high)
        )
    if key:
        ax.set_title(" · ".join(v for v in key if v), fontsize=10)
    ax.set_ylabel(UNIT_LABELS.get(panel.unit, panel.unit), fontsize=8)
    if panel.unit == "percentunit":
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)


def _mark(ax: Axes, marks: Alarms, span: tuple[float, float], label: bool) -> None:
    for start, end in marks.spans:
        ax.axvspan(
            start,
            end,
            color=ONSET_COLOUR,
            alpha=0.08,
            lw=0,
            label="alarm episode" if label else None,
        )
    if marks.onset is None:
        return
    when = marks.onset.time
    ax.axvline(when, color=ONSET_COLOUR, lw=1.6, label="drift onset" if label else None)
    # Late in the range the label goes left of the line, where it is not cut off.
    left = (when - span[0]) > 0.5 * (span[1] - span[0])
    ax.annotate(
        "drift: " + _names(marks.onset.detectors),
        xy=(when, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(-3 if left else 3, -3),
        textcoords="offset points",
        ha="right" if left else "left",
        va="top",
        fontsize=7,
        color=ONSET_COLOUR,
        # A white outline keeps the label legible over a line without hiding the line.
        path_effects=[patheffects.withStroke(linewidth=2.5, foreground="white")],
    )


def log_scale(values: np.ndarray) -> tuple[str, ...] | None:
    """("log",) when the positive values span more than LOG_SPAN and none is negative; with
    zeros among them ("symlog",), linear up to the smallest positive value; else None."""
    finite = values[np.isfinite(values)]
    positive = finite[finite > 0]
    if positive.size == 0 or (finite < 0).any():
        return None
    if positive.max() / positive.min() <= LOG_SPAN:
        return None
    return ("log",) if positive.size == finite.size else ("symlog",)


def _mark_pages(ax: Axes, marks: Alarms, detector: str | None, label: bool) -> None:
    """The anytime-valid test's alarms as triangles along the top: the detector's own on a
    plot of one detector, every detector's on any other plot."""
    if detector is not None:
        times = sorted(set(marks.pages.get(detector, ())))
    else:
        times = sorted({t for ts in marks.pages.values() for t in ts})
    if not times:
        return
    ax.plot(
        times,
        [1.0] * len(times),
        "v",
        transform=ax.get_xaxis_transform(),  # x in data, y in axes fraction: the top edge
        color=ONSET_COLOUR,
        markersize=5,
        clip_on=False,
        label="anytime-valid alarm" if label else None,
    )


def _names(detectors: Sequence[str], most: int = 4) -> str:
    """The first few names, and how many more: the page's header lists them all."""
    more = len(detectors) - most
    return ", ".join(detectors[:most]) + (f" +{more}" if more > 0 else "")


def time_ticks(start: float, end: float, tz: tzinfo, most: int) -> list[float]:
    """Unix times of round clock times (every 10 s, 5 min, ...) between ``start`` and ``end``,
    at most about ``most``: the x axis holds Unix seconds, labelled as local clock times."""
    offset = datetime.fromtimestamp(start, tz).utcoffset()
    shift = offset.total_seconds() if offset is not None else 0.0
    spacing = next((s for s in TICK_SPACINGS if (end - start) / s <= most), TICK_SPACINGS[-1])
    first = math.ceil((start + shift) / spacing) * spacing - shift
    return [float(t) for t in np.arange(first, end + 1e-9, spacing)]


def _time_axis(ax: Axes, span: tuple[float, float], tz: tzinfo, most: int) -> None:
    ax.set_xlim(span[0], span[1])
    ax.xaxis.set_major_locator(FixedLocator(time_ticks(span[0], span[1], tz, most)))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda t, _: datetime.fromtimestamp(t, tz).strftime("%H:%M:%S"))
    )


def _legend(figure: Figure, axes: Sequence[Axes]) -> None:
    """One legend for the figure: the facets share their line names."""
    seen: dict[str, Artist] = {}
    for ax in axes:
        handles, names = ax.get_legend_handles_labels()
        for handle, name in zip(handles, names, strict=True):
            seen.setdefault(name, handle)
    if len(seen) > 12:  # one line per layer or detector: the small plots' titles name them
        return
    figure.legend(
        list(seen.values()),
        list(seen),
        # Below the plots: above them a long legend would run into the figure's title.
        loc="outside lower center",
        ncols=min(len(seen), 6),
        fontsize=8,
        frameon=False,
    )
