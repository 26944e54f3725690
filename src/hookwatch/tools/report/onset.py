"""When drift started, and which detectors moved first, from range queries on one time grid.

Two signals count as an alarm: ``hookwatch_drift_first_alarm`` (1 for the detectors that
alarmed first in an alarm episode of the sliding-window tests, from the moment it starts) and
an increase of ``hookwatch_drift_sequential_alarms_total`` (the anytime-valid test). The onset
is the first grid time either shows; every detector alarming at that time moved first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hookwatch.tools.report.prometheus import Series


@dataclass(frozen=True)
class Onset:
    time: float
    #: The detectors that alarmed first (several when they did within one grid step).
    detectors: tuple[str, ...]


@dataclass(frozen=True)
class Alarms:
    """What the report marks on every time plot."""

    onset: Onset | None
    #: (start, end) of each stretch with a sliding-window alarm episode under way.
    spans: tuple[tuple[float, float], ...]
    #: Per detector, the times its anytime-valid test alarmed (a warning): marked on the plots.
    pages: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


def first_times(series: Sequence[Series]) -> dict[str, float]:
    """Per detector, the first time its value is above 0 (NaN counts as no alarm)."""
    firsts: dict[str, float] = {}
    for s in series:
        hits = s.times[np.nan_to_num(s.values, nan=0.0) > 0]
        if hits.size:
            name = s.labels.get("detector", "?")
            firsts[name] = min(firsts.get(name, float("inf")), float(hits[0]))
    return firsts


def find_onset(first_alarm: Sequence[Series], sequential: Sequence[Series]) -> Onset | None:
    firsts = first_times(first_alarm)
    for name, time in first_times(sequential).items():
        firsts[name] = min(firsts.get(name, float("inf")), time)
    if not firsts:
        return None
    time = min(firsts.values())
    return Onset(time, tuple(sorted(name for name, t in firsts.items() if t == time)))


def alarm_spans(first_alarm: Sequence[Series], step: float) -> tuple[tuple[float, float], ...]:
    """Stretches of grid times at which any detector's episode is under way; samples more than
    one step and a half apart belong to different stretches."""
    alarmed = [s.times[np.nan_to_num(s.values, nan=0.0) > 0] for s in first_alarm]
    times = np.unique(np.concatenate(alarmed)) if alarmed else np.array([])
    if times.size == 0:
        return ()
    breaks = np.flatnonzero(np.diff(times) > 1.5 * step)
    starts = np.concatenate(([times[0]], times[breaks + 1]))
    ends = np.concatenate((times[breaks], [times[-1]]))
    return tuple((float(a), float(b)) for a, b in zip(starts, ends, strict=True))


def alarms(
    first_alarm: Sequence[Series],
    sequential: Sequence[Series],
    step: float,
    pages: Mapping[str, tuple[float, ...]] | None = None,
) -> Alarms:
    return Alarms(find_onset(first_alarm, sequential), alarm_spans(first_alarm, step), pages or {})
