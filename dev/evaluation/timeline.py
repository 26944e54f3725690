"""Drift detection over time: simulated days of clean traffic, and detection delays.

Both go through :class:`DriftTracker` with the profile read back from its file, the worker's
calibration and the anytime-valid tests a worker builds (``DriftProfile.sequential_tests``), fed
the captured features of every watched layer in drains. Clean traffic is drawn, in time order and
independently, from the draw's held-out test digits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from dev.evaluation.draws import Draw, Features, batches, saved
from dev.evaluation.protocol import sequence
from hookwatch._config import DriftConfig
from hookwatch._drift import Calibration, DriftTracker
from hookwatch._profile import DriftProfile, build_profile

__all__ = [
    "CleanRun",
    "Delays",
    "clean_run",
    "delays",
    "null_reference",
    "online_streams",
    "tracker",
]

IntArray = NDArray[np.int64]


def tracker(
    profile: DriftProfile,
    calibration: Calibration,
    step: int,
    run_length: int | None,
    memory: int,
) -> DriftTracker:
    """A worker's tracker for ``profile``: sliding windows with ``calibration`` and, with a
    run length, the anytime-valid tests at the shipped reference confidence."""
    sequential = (
        {}
        if run_length is None
        else profile.sequential_tests(run_length, DriftConfig.reference_confidence, memory)
    )
    return DriftTracker(
        profile.references,
        calibration,
        step,
        projections=profile.projections,
        head=profile.head,
        sequential=sequential,
    )


def null_reference(draw: Draw, seed: int) -> tuple[DriftProfile, Features]:
    """A reference drawn from the clean traffic's own distribution, and that traffic.

    The clean distribution is every held-out image of the draw (reference and test images,
    none seen in training); the reference is as many draws from it, with replacement, as the
    draw's reference has. This is the null the guarantees are stated for: reference and traffic
    from one distribution. Traffic cycled from the test images alone would differ from the
    reference by the sampling error of two finite samples, which real traffic does not have.
    """
    images = np.concatenate([draw.x_ref, draw.scenarios[0].images])
    raw = {
        layer: np.concatenate([draw.ref_raw[layer], draw.raw[layer][draw.pool("clean")]])
        for layer in draw.raw
    }
    pick = np.random.default_rng(seed).integers(0, len(images), size=len(draw.x_ref))
    profile = saved(
        build_profile(
            draw.model, draw.config, batches(images[pick]), "digits", bins=draw.config.drift.bins
        )
    )
    return profile, raw


@dataclass
class CleanRun:
    """One tracker's alarms on a clean stream."""

    samples: int = 0
    #: Verdict rounds (every detector judged the same window) and those where any alarmed.
    rounds: int = 0
    alarmed_rounds: int = 0
    first_window_alarm: int | None = None
    sequential_alarms: int = 0
    first_sequential_alarm: int | None = None
    #: Sample positions of the sequential alarms (for the time to the first one).
    positions: list[int] = field(default_factory=list)


def _feed(tracker: DriftTracker, raw: Features, index: IntArray) -> dict[str, list[bool]]:
    tracker.new_round()
    verdicts: dict[str, list[bool]] = {}
    for layer, features in raw.items():
        for result in tracker.update(layer, features[index]):
            verdicts.setdefault(result.detector, []).append(result.is_drift)
    return verdicts


def clean_run(
    raw: Features,
    pool: IntArray,
    trackers: Mapping[str, DriftTracker],
    samples: Mapping[str, int],
    seed: int,
    chunk: int = 8192,
) -> dict[str, CleanRun]:
    """Feed the same independent draws from ``pool`` (indices into ``raw``) to each tracker
    (``samples[name]`` of them) in drains of ``chunk``; count what alarms."""
    rng = np.random.default_rng(seed)
    runs = {name: CleanRun() for name in trackers}
    for _ in range(0, max(samples.values()), chunk):
        index = rng.choice(pool, size=chunk)
        for name, t in trackers.items():
            run = runs[name]
            if run.samples >= samples[name]:
                continue
            part = index[: samples[name] - run.samples]
            verdicts = _feed(t, raw, part)
            if verdicts:
                rounds = np.any(np.stack([np.asarray(v) for v in verdicts.values()]), axis=0)
                if run.first_window_alarm is None and rounds.any():
                    # Verdict i of the stream judges the window ending at window + i * step.
                    first = run.rounds + int(rounds.argmax())
                    run.first_window_alarm = t.window + first * t.step
                run.rounds += len(rounds)
                run.alarmed_rounds += int(rounds.sum())
            for alarm in t.take_alarms():
                run.sequential_alarms += 1
                run.positions.append(alarm.position)
                if run.first_sequential_alarm is None:
                    run.first_sequential_alarm = alarm.position
            run.samples += len(part)
    return runs


@dataclass(frozen=True)
class Delays:
    """Per scenario and stream, shifted samples seen until the first alarm (inf: none within
    the stream), and alarms raised on the clean prefix."""

    first: dict[str, NDArray[np.float64]]
    early: dict[str, IntArray]


def online_streams(
    draw: Draw, prefix: int, length: int, streams: int, seed: int
) -> dict[str, IntArray]:
    """Per shifted scenario ``[streams, prefix + length]`` pool indices: clean, then shifted."""
    rng = np.random.default_rng(seed)
    out: dict[str, IntArray] = {}
    for scenario in draw.scenarios:
        if not scenario.drifted:
            continue
        rows = [
            np.concatenate(
                [
                    rng.choice(draw.pool("clean"), prefix),
                    draw.offsets[scenario.name] + sequence(scenario, length, draw.labels, rng),
                ]
            )
            for _ in range(streams)
        ]
        out[scenario.name] = np.stack(rows)
    return out


def delays(
    draw: Draw,
    streams: Mapping[str, IntArray],
    prefix: int,
    calibration: Calibration,
    step: int,
    run_length: int | None,
    memory: int,
) -> tuple[Delays, Delays]:
    """First alarms after the shift of the sliding window (``calibration``, ``step``) and of
    the anytime-valid tests (``run_length``): one fresh tracker per stream."""
    window: dict[str, list[float]] = {}
    window_early: dict[str, list[int]] = {}
    seq: dict[str, list[float]] = {}
    seq_early: dict[str, list[int]] = {}
    for name, rows in streams.items():
        for stream in rows:
            t = tracker(draw.profile, calibration, step, run_length, memory)
            verdicts = _feed(t, draw.raw, stream)
            rounds = np.any(np.stack([np.asarray(v) for v in verdicts.values()]), axis=0)
            # Verdict i judges the window ending after sample calibration.window + i * step.
            ends = calibration.window + step * np.arange(len(rounds))
            after = rounds & (ends > prefix)
            window.setdefault(name, []).append(
                float(ends[after][0] - prefix) if after.any() else math.inf
            )
            window_early.setdefault(name, []).append(int((rounds & (ends <= prefix)).sum()))
            positions = sorted(a.position for a in t.take_alarms())
            later = [p for p in positions if p > prefix]
            seq.setdefault(name, []).append(float(later[0] - prefix) if later else math.inf)
            seq_early.setdefault(name, []).append(sum(p <= prefix for p in positions))
    return (
        Delays(
            {k: np.asarray(v) for k, v in window.items()},
            {k: np.asarray(v) for k, v in window_early.items()},
        ),
        Delays(
            {k: np.asarray(v) for k, v in seq.items()},
            {k: np.asarray(v) for k, v in seq_early.items()},
        ),
    )
