"""What happened, in one paragraph for the top of the report: when drift started (and how long
after the traffic changed, where the caller knows when it did), the detectors in the order they
alarmed, how far past their thresholds they went, how often the paging test alarmed, and the
accuracy (labelled, where the caller has labels; estimated, where the model has an estimate)
before and after. Every figure comes from the range queries the plots draw, on one time grid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

import numpy as np

from hookwatch.tools.report.onset import Onset
from hookwatch.tools.report.prometheus import Series


@dataclass(frozen=True)
class Client:
    """What the traffic's sender knows and Prometheus does not (``hookwatch run`` passes it):
    when the traffic switched, what to, and the accuracy on labelled answers before and after."""

    switched_at: float | None = None
    shifted_name: str = "shifted traffic"
    accuracy_before: float | None = None
    accuracy_after: float | None = None


@dataclass(frozen=True)
class Story:
    onset: Onset | None
    #: (detector, first time past its threshold or alarming), earliest first.
    order: tuple[tuple[str, float], ...] = ()
    #: Per detector, the highest score / threshold seen in the range.
    peaks: Mapping[str, float] = field(default_factory=dict)
    #: Per detector, the grid times at which its anytime-valid test alarmed (the page).
    pages: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    #: Per detector, the number of anytime-valid alarms.
    page_counts: Mapping[str, int] = field(default_factory=dict)
    #: The fleet's estimated accuracy over time, and the reference's accuracy (a share).
    estimate: Series | None = None
    reference_accuracy: float | None = None
    client: Client | None = None
    #: (alert, severity, first time firing) of Prometheus' alerting rules in the range.
    alerts: tuple[tuple[str, str, float], ...] = ()


def alerts_fired(series: Sequence[Series]) -> tuple[tuple[str, str, float], ...]:
    """From ``ALERTS{alertstate="firing"}`` over the range: each alert, its severity and the
    first time it was firing, earliest first."""
    first: dict[tuple[str, str], float] = {}
    for s in series:
        hits = s.times[np.isfinite(s.values)]
        if hits.size:
            key = (s.labels.get("alertname", "?"), s.labels.get("severity", ""))
            first[key] = min(first.get(key, math.inf), float(hits[0]))
    return tuple(sorted(((n, sev, t) for (n, sev), t in first.items()), key=lambda a: (a[2], a[0])))


def first_over(series: Sequence[Series], limit: float) -> dict[str, float]:
    """Per detector, the first time its value exceeds ``limit``."""
    firsts: dict[str, float] = {}
    for s in series:
        hits = s.times[np.nan_to_num(s.values, nan=-math.inf) > limit]
        if hits.size:
            name = s.labels.get("detector", "?")
            firsts[name] = min(firsts.get(name, math.inf), float(hits[0]))
    return firsts


def order(onset: Onset | None, *firsts: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """Detectors by the first time any signal shows them alarming (not before the onset: a
    ratio over 1 at a point the onset's signals did not count is that point's, not earlier)."""
    merged: dict[str, float] = {}
    for found in firsts:
        for name, t in found.items():
            merged[name] = min(merged.get(name, math.inf), t)
    if onset is not None:
        for name in onset.detectors:
            merged[name] = min(merged.get(name, math.inf), onset.time)
        merged = {k: max(t, onset.time) for k, t in merged.items()}
    return tuple(sorted(merged.items(), key=lambda item: (item[1], item[0])))


def peaks(ratios: Sequence[Series]) -> dict[str, float]:
    found: dict[str, float] = {}
    for s in ratios:
        values = s.values[np.isfinite(s.values)]
        if values.size:
            name = s.labels.get("detector", "?")
            found[name] = max(found.get(name, -math.inf), float(values.max()))
    return found


def page_times(counters: Sequence[Series]) -> tuple[dict[str, tuple[float, ...]], dict[str, int]]:
    """From the anytime-valid alarm counters (raw, summed per detector): the grid times at
    which each increased, and by how much in all (a counter reset counts from 0)."""
    times: dict[str, tuple[float, ...]] = {}
    counts: dict[str, int] = {}
    for s in counters:
        values = np.nan_to_num(s.values, nan=0.0)
        steps = np.diff(np.concatenate(([values[0]] if values.size else [], values)))
        # A drop is a reset: what the counter reads after it was counted since it.
        grown = np.where(steps < 0, values, steps)
        hits = s.times[grown > 0]
        if hits.size:
            name = s.labels.get("detector", "?")
            times[name] = tuple(float(t) for t in hits)
            counts[name] = counts.get(name, 0) + round(float(grown[grown > 0].sum()))
    return times, counts


def _when(t: float, tz: tzinfo) -> str:
    return datetime.fromtimestamp(t, tz).strftime("%H:%M:%S")


def _pct(share: float) -> str:
    return f"{100 * share:.0f} %"


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _list(items: Sequence[str], most: int = 6) -> str:
    shown = list(items[:most])
    more = len(items) - len(shown)
    if more:
        shown.append(f"{more} more")
    return ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else "".join(shown)


def _estimate(story: Story, boundary: float | None, tz: tzinfo) -> str:
    s = story.estimate
    if s is None:
        return ""
    finite = np.isfinite(s.values)
    if not finite.any():
        return ""
    reference = (
        f" (the reference's accuracy: {_pct(story.reference_accuracy)})"
        if story.reference_accuracy is not None
        else ""
    )
    last = float(s.values[finite][-1])
    before = s.values[finite & (s.times < boundary)] if boundary is not None else np.array([])
    if before.size:
        after = s.values[finite & (s.times >= boundary)] if boundary is not None else before
        # Its lowest after the switch too: traffic that turned back (a few clean requests at
        # the end) would leave only the end's value, as if nothing had happened.
        lowest = (
            f", {_pct(float(after.min()))} at its lowest after the switch,"
            if after.size and float(after.min()) < last
            else ""
        )
        return (
            "Estimated without labels (the fleet's estimate, over 5 minutes: it lags), accuracy "
            f"went from {_pct(float(np.median(before)))} before{lowest} to {_pct(last)} at the "
            f"end{reference}."
        )
    return (
        "Estimated without labels (the fleet's estimate, over 5 minutes), accuracy at the end "
        f"was {_pct(last)}{reference}."
    )


def sentences(story: Story, start: float, end: float, profile: bool, tz: tzinfo) -> list[str]:
    """The summary paragraph, sentence by sentence (plain text)."""
    client = story.client
    switched = client.switched_at if client is not None else None
    said: list[str] = []
    if switched is not None and client is not None:
        said.append(
            f"The traffic switched to {client.shifted_name} at {_when(switched, tz)}, "
            f"{switched - start:.0f} s into the range."
        )
    if not profile:
        said.append("No drift profile was loaded: the model served without drift detection.")
    elif story.onset is None:
        said.append(
            f"No detector alarmed between {_when(start, tz)} and {_when(end, tz)}"
            + (" (the shift went unnoticed)." if switched is not None else ".")
        )
    else:
        onset = story.onset
        after = (
            f", {onset.time - switched:.0f} s after the switch"
            if switched is not None and onset.time >= switched
            else (
                f", {switched - onset.time:.0f} s before the switch (a false alarm)"
                if switched is not None
                else f", {onset.time - start:.0f} s into the range"
            )
        )
        said.append(
            f"Drift started at {_when(onset.time, tz)}{after}: first to alarm "
            f"{_list(onset.detectors)}."
        )
        same = [n for n, t in story.order if t <= onset.time and n not in onset.detectors]
        later = [f"{n} (+{t - onset.time:.0f} s)" for n, t in story.order if t > onset.time]
        if same:
            their = "their thresholds" if len(same) > 1 else "its threshold"
            said.append(f"In the same step {_list(same)} went past {their}.")
        if later:
            said.append(f"Then {_list(later)}.")
        over = sorted(
            ((r, n) for n, r in story.peaks.items() if r > 1), key=lambda item: (-item[0], item[1])
        )
        if over:
            said.append(
                "At their peak, scores over thresholds: "
                + _list([f"{n} {_times(r)}" for r, n in over], most=5)
                + "."
            )
        if story.page_counts:
            counts = sorted(story.page_counts.items(), key=lambda item: (-item[1], item[0]))
            total = sum(story.page_counts.values())
            said.append(
                f"The per-worker anytime-valid test, which warns, alarmed {total} time"
                f"{'s' if total != 1 else ''}: "
                + _list([f"{n} for {name}" for name, n in counts], most=5)
                + "."
            )
        else:
            said.append("The per-worker anytime-valid test, which warns, did not alarm.")
    if client is not None and client.accuracy_before is not None:
        after_acc = (
            f" and {_pct(client.accuracy_after)} after it"
            if client.accuracy_after is not None
            else ""
        )
        said.append(
            f"On labelled answers the model was right {_pct(client.accuracy_before)} of the "
            f"time before the switch{after_acc}."
        )
    boundary = switched if switched is not None else (story.onset.time if story.onset else None)
    estimate = _estimate(story, boundary, tz)
    if estimate:
        said.append(estimate)
    if story.alerts:
        # What reached a person: the rules' alerts, pages (critical) and warnings.
        said.append(
            "Prometheus fired "
            + _list(
                [
                    f"{name} ({severity}{': a page' if severity == 'critical' else ''}) at "
                    f"{_when(t, tz)}"
                    for name, severity, t in story.alerts
                ],
                most=5,
            )
            + "."
        )
    return said
