"""What every detector is shown, and hookwatch's verdicts on it through the worker's tracker.

Per draw, window size W and shifted scenario: ``streams`` streams of W clean requests then 2W
shifted ones, judged every W/4 requests on the last W (8 judgements; the last 5 see shifted
requests only). Clean windows: W distinct clean requests each. Every detector sees exactly the
same windows, as pool indices.

hookwatch is never scored in batch here: every stream goes through :class:`DriftTracker`, the
capture thread's own code (projection, detector features, bin codes, sliding windows, verdicts
every ``step``), with thresholds calibrated from the saved profile as a worker calibrates them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dev.evaluation.draws import Draw, Features
from dev.evaluation.scenarios import Scenario
from hookwatch._drift import BinnedReference, Calibration, DriftTracker, Projection, calibrate
from hookwatch._profile import DriftProfile

__all__ = [
    "FULL",
    "JUDGEMENTS",
    "Variant",
    "Windows",
    "make_windows",
    "sequence",
    "stream_verdicts",
    "variants",
]

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
#: Judgements per stream: every W/4 requests over 2W shifted requests.
JUDGEMENTS = 8
#: The judgements whose window holds shifted requests only (the 4th to the 8th).
FULL = np.arange(1, JUDGEMENTS + 1) >= 4


def sequence(
    scenario: Scenario, length: int, labels: IntArray, rng: np.random.Generator
) -> IntArray:
    """Pool positions of ``length`` requests: permutations of the pool, cycled only if needed.

    With sampling weights (the class-prior shift) each request's class is drawn from the
    shifted prior and that class's images are taken in a random order.
    """
    size = len(scenario.images)
    if scenario.weights is None:
        reps = math.ceil(length / size)
        return np.concatenate([rng.permutation(size) for _ in range(reps)])[:length]
    classes = np.unique(labels)
    prior = np.array([scenario.weights[labels == c].sum() for c in classes])
    drawn = rng.choice(classes, size=length, p=prior / prior.sum())
    out = np.empty(length, dtype=np.int64)
    for c in classes:
        slots = np.flatnonzero(drawn == c)
        members = np.flatnonzero(labels == c)
        reps = math.ceil(len(slots) / len(members)) if len(slots) else 0
        order = (
            np.concatenate([rng.permutation(members) for _ in range(reps)]) if reps else members[:0]
        )
        out[slots] = order[: len(slots)]
    return out


@dataclass(frozen=True)
class Windows:
    """One draw's streams and clean windows at one window size, as pool indices."""

    w: int
    #: Per shifted scenario, ``[streams, 3W]``: W clean requests, then 2W shifted ones.
    streams: dict[str, IntArray]
    #: ``[count, W]`` windows of distinct clean requests.
    clean: IntArray

    @property
    def step(self) -> int:
        return max(1, self.w // 4)

    def judged(self) -> IntArray:
        """Every judged window ``[N, W]``: each scenario's streams' judgements in order, then
        the clean windows (the baselines' input; :meth:`layout` says which rows are which)."""
        rows = [
            stream[end - self.w : end]
            for stream in (s for streams in self.streams.values() for s in streams)
            for end in self.w + self.step * np.arange(1, JUDGEMENTS + 1)
        ]
        return np.concatenate([np.stack(rows), self.clean])

    def layout(self) -> dict[str, slice]:
        out: dict[str, slice] = {}
        start = 0
        for name, streams in self.streams.items():
            out[name] = slice(start, start + len(streams) * JUDGEMENTS)
            start += len(streams) * JUDGEMENTS
        out["clean"] = slice(start, start + len(self.clean))
        return out


def clean_windows(draw: Draw, w: int, count: int, rng: np.random.Generator) -> IntArray:
    pool = draw.pool("clean")
    return np.stack([rng.choice(pool, w, replace=False) for _ in range(count)])


def make_windows(draw: Draw, w: int, streams: int, clean: int, rng: np.random.Generator) -> Windows:
    by_scenario: dict[str, IntArray] = {}
    clean_pool = draw.pool("clean")
    for scenario in draw.scenarios:
        if not scenario.drifted:
            continue
        rows = []
        for _ in range(streams):
            prefix = rng.choice(clean_pool, w, replace=False)
            shifted = draw.offsets[scenario.name] + sequence(scenario, 2 * w, draw.labels, rng)
            rows.append(np.concatenate([prefix, shifted]))
        by_scenario[scenario.name] = np.stack(rows)
    return Windows(w, by_scenario, clean_windows(draw, w, clean, rng))


@dataclass(frozen=True)
class Variant:
    """hookwatch, or an ablation of it: a set of its detectors calibrated together."""

    name: str
    detectors: tuple[str, ...]
    description: str


def variants(profile: DriftProfile, penultimate: str) -> list[Variant]:
    refs = profile.references
    from_output = tuple(n for n, r in refs.items() if r.level in ("output", "prediction"))
    return [
        Variant("hookwatch", tuple(refs), "every detector (input, layers, output)"),
        Variant("input only", ("input",), "the input's detector alone"),
        Variant(penultimate + " only", (penultimate,), "the penultimate layer's detector alone"),
        Variant(
            "output only",
            from_output,
            "the detectors of the logits (" + ", ".join(from_output) + ")",
        ),
    ]


def calibrated(
    profile: DriftProfile, variant: Variant, w: int, false_alarm_rate: float, windows: int
) -> Calibration:
    """The variant's thresholds as a worker serving only its detectors would calibrate them."""
    refs: Sequence[BinnedReference] = [profile.references[d] for d in variant.detectors]
    return calibrate(refs, w, false_alarm_rate, windows, seed=0)


def stream_verdicts(
    profile: DriftProfile,
    detectors: Sequence[str],
    calibration: Calibration,
    raw: Features,
    stream: IntArray,
    step: int,
    chunk: int = 4096,
) -> dict[str, BoolArray]:
    """Per detector, its verdicts on ``stream`` through a fresh :class:`DriftTracker` fed the
    captured features of each watched layer in drains of ``chunk`` samples."""
    references = {d: profile.references[d] for d in detectors}
    projections: Mapping[str, Projection] = profile.projections
    tracker = DriftTracker(
        references, calibration, step, projections=projections, head=profile.head
    )
    verdicts: dict[str, list[bool]] = {d: [] for d in detectors}
    for start in range(0, len(stream), chunk):
        part = stream[start : start + chunk]
        tracker.new_round()
        for layer, features in raw.items():
            for result in tracker.update(layer, features[part]):
                verdicts[result.detector].append(result.is_drift)
    return {d: np.asarray(v, dtype=bool) for d, v in verdicts.items()}


def any_verdict(verdicts: Mapping[str, BoolArray]) -> BoolArray:
    result: BoolArray = np.any(np.stack(list(verdicts.values())), axis=0)
    return result
