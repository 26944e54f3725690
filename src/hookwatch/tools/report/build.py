"""``hookwatch report``: read a time range back from Prometheus and write index.html + PNGs."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from hookwatch.tools import dashboards
from hookwatch.tools.report import onset, page, panels, plot, story
from hookwatch.tools.report.prometheus import Prometheus, Series

#: About this many points per series: enough to see a shift, few enough to draw fast.
POINTS = 300
#: How far back the report looks for the first sample when no start is given.
DEFAULT_MINUTES = 60.0


class ReportError(RuntimeError):
    """The report cannot be written: no such model, no samples, no dashboards."""


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    step: float
    scrape: float

    def intervals(self) -> dict[str, str]:
        """Grafana's interval variables for this window; ``$__rate_interval`` as Grafana sets
        it: at least four scrapes, and at least one step plus one scrape."""
        rate = max(4 * self.scrape, self.step + self.scrape)
        return {
            "__rate_interval": f"{math.ceil(rate)}s",
            "__interval": f"{math.ceil(self.step)}s",
            "__range": f"{math.ceil(self.end - self.start)}s",
        }


@dataclass(frozen=True)
class Written:
    """What ``write_report`` wrote."""

    index: Path
    images: tuple[Path, ...]
    model: str
    onset: onset.Onset | None
    #: The summary paragraph at the top of the page, sentence by sentence.
    summary: tuple[str, ...] = ()


def local_zone() -> tzinfo:
    zone = datetime.now().astimezone().tzinfo
    assert zone is not None  # astimezone() always sets one
    return zone


def write_report(
    url: str,
    out: Path,
    dashboard_dir: Path,
    model: str | None = None,
    since: float | None = None,
    until: float | None = None,
    minutes: float = DEFAULT_MINUTES,
    client: story.Client | None = None,
) -> Written:
    """Write ``out/index.html`` and its PNGs for ``model`` (the only model, when None).

    Without ``since`` the range starts at the model's first sample in the ``minutes`` before
    ``until`` (default: now), and ends at its last one. ``client``: what the traffic's sender
    knows (when it switched, accuracy on labels), for the summary at the top.
    """
    boards = dashboards.load(dashboard_dir)
    if not boards:
        raise ReportError(f"expected Grafana dashboards (*.json) in {dashboard_dir}, got none")
    prometheus = Prometheus(url)
    end = time.time() if until is None else until
    start = end - minutes * 60 if since is None else since
    if start >= end:
        raise ReportError(f"expected a start before the end, got {start:.0f} >= {end:.0f}")
    name = pick_model(prometheus, boards, model, start, end)
    window = sample_window(prometheus, name, start, end, prometheus.scrape_interval(), since, until)
    values = panels.variable_values(boards, name, window.intervals())
    reader = Reader(prometheus, boards, values, window)
    profile = reader.profile_loaded()
    told = (
        reader.tell(client)
        if profile
        else story.Story(None, client=client, alerts=story.alerts_fired(reader.alerts()))
    )
    marks = onset.Alarms(told.onset, reader.alarm_spans(), told.pages) if profile else None
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.png"):
        stale.unlink()  # an image of an earlier report must not pass for this one's
    tz = local_zone()
    sections = [
        _section(reader, section, found, marks, out, tz)
        for section, found in panels.load_sections(boards)
    ]
    started = marks.onset if marks else None
    summary = story.sentences(told, window.start, window.end, profile, tz)
    header = page.Header(
        name, window.start, window.end, prometheus.url, window.step, marks is not None, started,
        time.time(), tuple(summary),
    )  # fmt: skip
    index = out / "index.html"
    index.write_text(page.render(header, sections, tz))
    images = tuple(out / f.image for s in sections for f in s.images if f.image)
    return Written(index, images, name, started, tuple(summary))


def pick_model(
    client: Prometheus,
    boards: Mapping[str, Mapping[str, Any]],
    model: str | None,
    start: float,
    end: float,
) -> str:
    selector, label = panels.model_selector(boards)
    found = client.label_values(label, selector, start, end)
    where = f"{selector} in Prometheus at {client.url} over the last {(end - start) / 60:.0f} min"
    if model is not None and model not in found:
        raise ReportError(f"expected samples of model {model!r} in {where}, got {found or 'none'}")
    if model is not None:
        return model
    if len(found) != 1:
        raise ReportError(
            f"expected one model in {where}, got {found or 'none'}"
            + (" (pick one with --model)" if found else "")
        )
    return found[0]


def sample_window(
    client: Prometheus,
    model: str,
    start: float,
    end: float,
    scrape: float,
    since: float | None,
    until: float | None,
) -> Window:
    """The range to draw: what was asked, cut to the model's samples where not given."""
    step = max(scrape, math.ceil((end - start) / 1000))
    expr = f"count(hookwatch_requests_total{{model={json.dumps(model)}}})"
    # A grid with ``end`` on it: a range query answers at its grid's points only, and a run
    # stopped seconds after its first scrape has that scrape after the last point of a grid
    # counted from ``start``.
    probe = end - math.ceil((end - start) / step) * step
    times = [t for s in client.query_range(expr, probe, end, step) for t in s.times]
    if not times:
        raise ReportError(
            f"expected samples of {expr} between {time.ctime(start)} and {time.ctime(end)} "
            f"in Prometheus at {client.url}, got none"
        )
    first = start if since is not None else max(start, min(times) - step)
    last = end if until is not None else min(end, max(times) + step)
    step = max(scrape, math.ceil((last - first) / POINTS))
    # One grid for every query: the onset found on it is where the lines change.
    first = math.floor(first / step) * step
    if until is None:
        # Its last point at or after the last sample, which it must see; evaluated up to a
        # step past it, Prometheus answers that sample (its lookback reaches back to it).
        last = math.ceil(last / step) * step
    return Window(first, max(last, first + step), step, scrape)


@dataclass(frozen=True)
class Reader:
    """The dashboards' panels for one model over one window, from one Prometheus."""

    client: Prometheus
    boards: Mapping[str, Mapping[str, Any]]
    values: Mapping[str, str]
    window: Window

    def query(self, panel: panels.Panel) -> list[tuple[str, list[Series]]]:
        """(legend template, series) per target of ``panel``."""
        w = self.window
        return [
            (
                target.legend,
                self.client.query_range(
                    dashboards.substitute(target.expr, self.values), w.start, w.end, w.step
                ),
            )
            for target in panel.targets
        ]

    def series(self, ref: panels.PanelRef) -> list[Series]:
        found = self.query(panels.load_panel(self.boards, ref))
        return [s for _, series in found for s in series]

    def profile_loaded(self) -> bool:
        found = self.series(panels.PROFILE)
        return any(float(v) > 0 for s in found for v in s.values if math.isfinite(v))

    def alarms(self) -> onset.Alarms:
        first = self.series(panels.FIRST_ALARM)
        sequential = self.series(panels.SEQUENTIAL_ALARMS)
        return onset.alarms(first, sequential, self.window.step)

    def alarm_spans(self) -> tuple[tuple[float, float], ...]:
        return onset.alarm_spans(self.series(panels.FIRST_ALARM), self.window.step)

    def page_counters(self) -> list[Series]:
        """The anytime-valid alarm counters per detector, raw (summed over workers): each
        increase is an alarm, where the dashboard's increase() smears one over several points."""
        model = json.dumps(self.values["model"])
        w = self.window
        return self.client.query_range(
            f"sum by (detector) (hookwatch_drift_sequential_alarms_total{{model={model}}})",
            w.start,
            w.end,
            w.step,
        )

    def alerts(self) -> list[Series]:
        """Prometheus' firing alerts of this model, or of no model (the exporter's, TorchServe's),
        one series per (alert, severity)."""
        model = json.dumps(self.values["model"])
        w = self.window
        firing = 'ALERTS{{alertstate="firing", model={}}}'
        return self.client.query_range(
            f"max by (alertname, severity) ({firing.format(model)}) or "
            f"max by (alertname, severity) ({firing.format(chr(34) * 2)})",
            w.start,
            w.end,
            w.step,
        )

    def tell(self, client: story.Client | None) -> story.Story:
        first = self.series(panels.FIRST_ALARM)
        sequential = self.series(panels.SEQUENTIAL_ALARMS)
        ratios = self.series(panels.SCORE_RATIO)
        found = onset.find_onset(first, sequential)
        pages, counts = story.page_times(self.page_counters())
        estimate = self.series(panels.ESTIMATE)
        reference = [
            float(v)
            for s in self.series(panels.REFERENCE_ACCURACY)
            for v in s.values
            if math.isfinite(v)
        ]
        return story.Story(
            found,
            story.order(
                found,
                onset.first_times(first),
                onset.first_times(sequential),
                story.first_over(ratios, 1.0),
            ),
            story.peaks(ratios),
            pages,
            counts,
            estimate[0] if estimate else None,
            reference[-1] if reference else None,
            client,
            story.alerts_fired(self.alerts()),
        )


def _section(
    reader: Reader,
    section: panels.Section,
    found: Sequence[panels.Panel],
    marks: onset.Alarms | None,
    out: Path,
    tz: tzinfo,
) -> page.PageSection:
    """Draw ``section``'s panels into ``out``; ``marks`` None: the model has no drift profile."""
    if section.needs_profile and marks is None:
        note = "No drift profile loaded for this model: it serves without drift detection."
        return page.PageSection(section.heading, section.text, (), note)
    images = []
    span = (reader.window.start, reader.window.end)
    for panel in found:
        drawn = plot.lines(panel, reader.query(panel))
        if not drawn and panel.ref.optional:
            continue
        image = f"{_slug(section.heading)}-{_slug(panel.title)}.png" if drawn else ""
        if drawn:
            plot.render(panel, drawn, marks or onset.Alarms(None, ()), span, tz, out / image)
        images.append(page.PanelImage(panel.title, panel.description, image))
    return page.PageSection(section.heading, section.text, images)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
