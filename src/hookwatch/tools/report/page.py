"""``index.html``: the header (model, what happened in a paragraph, time range, Prometheus)
and the sections' images by relative path. Self-contained: no script, no remote resource.
The first screen (1280x800) holds the header and the paragraph: the answer before the plots."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo

from hookwatch.tools.report.onset import Onset

STYLE = """
body { font-family: sans-serif; margin: 1em auto; max-width: 1010px; color: #222; }
header { border-bottom: 1px solid #ccc; margin-bottom: 1em; }
h1 { font-size: 1.5em; margin: 0.3em 0; }
#summary { font-size: 1.05em; line-height: 1.45; margin: 0.5em 0 0.8em 0; }
dl { font-size: 0.9em; margin: 0.4em 0; }
dt { font-weight: bold; float: left; width: 8em; }
dd { margin-left: 8em; margin-bottom: 0.2em; }
.drift { color: #d62728; font-weight: bold; }
.note { color: #555; font-size: 0.85em; }
figure { margin: 0 0 1.5em 0; }
figure img { width: 100%; max-width: 990px; }
figcaption, .empty { color: #555; font-size: 0.9em; }
"""


@dataclass(frozen=True)
class PanelImage:
    title: str
    description: str
    #: The PNG's file name beside index.html; empty when the panel had no data.
    image: str


@dataclass(frozen=True)
class PageSection:
    heading: str
    text: str
    images: Sequence[PanelImage]
    #: Shown instead of the figures (e.g. why a section has none).
    note: str = ""


@dataclass(frozen=True)
class Header:
    model: str
    start: float
    end: float
    prometheus: str
    step: float
    profile: bool
    onset: Onset | None
    generated: float
    #: What happened, sentence by sentence (plain text): the page's first paragraph.
    summary: tuple[str, ...] = ()


def when(t: float, tz: tzinfo, with_date: bool = False) -> str:
    moment = datetime.fromtimestamp(t, tz)
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z" if with_date else "%H:%M:%S")


def drift_sentence(header: Header, tz: tzinfo) -> str:
    if not header.profile:
        return "no drift profile loaded: the model serves without drift detection"
    if header.onset is None:
        return "no detector alarmed in this time range"
    after = header.onset.time - header.start
    return (
        f"drift from {when(header.onset.time, tz)} ({after:.0f} s after the start of the "
        f"range); first to alarm: {', '.join(header.onset.detectors)}"
    )


def _header(header: Header, tz: tzinfo) -> str:
    e = html.escape
    rows = [
        ("Model", e(header.model)),
        (
            "Time range",
            f"{e(when(header.start, tz, True))} to {e(when(header.end, tz))} "
            f"({(header.end - header.start) / 60:.1f} min, one point per {header.step:g} s)",
        ),
        ("Prometheus", f'<a href="{e(header.prometheus)}">{e(header.prometheus)}</a>'),
        ("Drift", f'<span class="drift">{e(drift_sentence(header, tz))}</span>'),
    ]
    items = "\n".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    summary = " ".join(e(sentence) for sentence in header.summary)
    return (
        f"<header><h1>hookwatch report: {e(header.model)}</h1>\n"
        f'<p id="summary">{summary}</p>\n<dl>\n{items}\n</dl>\n'
        '<p class="note">On every plot: the red line is the first alarm of any detector, the '
        "shading the alarm episodes, red triangles along the top the alarms of the "
        "per-worker anytime-valid test (a warning); dashed lines are the reference and the "
        "thresholds. "
        f"Generated {e(when(header.generated, tz, True))} by <code>hookwatch report</code> "
        "from the queries of the Grafana dashboards.</p></header>"
    )


def _image(figure: PanelImage) -> str:
    e = html.escape
    if not figure.image:
        return f'<h3>{e(figure.title)}</h3><p class="empty">no data in this time range</p>'
    return (
        f'<figure><img src="{e(figure.image)}" alt="{e(figure.title)}">'
        f"<figcaption>{e(figure.description)}</figcaption></figure>"
    )


def _section(section: PageSection) -> str:
    e = html.escape
    body = (
        f'<p class="empty">{e(section.note)}</p>'
        if section.note
        else "\n".join(_image(f) for f in section.images)
    )
    return f"<section><h2>{e(section.heading)}</h2><p>{e(section.text)}</p>\n{body}</section>"


def render(header: Header, sections: Sequence[PageSection], tz: tzinfo) -> str:
    title = html.escape(f"hookwatch report: {header.model}")
    body = "\n".join([_header(header, tz), *(_section(s) for s in sections)])
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
