"""Thresholds calibrated on the reference itself, jointly over every detector.

Windows are resampled from the reference's own bin codes, every detector is scored on the same
resampled windows, and one common per-detector level is chosen so that the share of windows
where *any* detector fires equals the target false alarm rate: a max-statistic correction over
features and detectors, less conservative than Bonferroni because it sees their correlation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hookwatch._drift.bins import BinnedReference, bin_counts, expect

__all__ = ["Calibration", "calibrate"]


@dataclass(frozen=True)
class Calibration:
    window: int
    false_alarm_rate: float
    thresholds: dict[str, float]
    #: Per-detector level of the common threshold (what each detector alone fires at).
    per_detector_rate: float
    windows: int


def calibrate(
    references: Sequence[BinnedReference],
    window: int,
    false_alarm_rate: float = 0.01,
    windows: int = 4000,
    seed: int = 0,
    chunk: int = 100,
) -> Calibration:
    """Thresholds such that a share ``false_alarm_rate`` of clean windows alarm on any detector.

    Windows of ``window`` reference samples are drawn with replacement from the detectors'
    aligned code samples. A resampled window carries no reference sampling error, so its
    chi-square is smaller than a fresh window's by the factor ``S / (S + W)`` (S: code sample
    size); the thresholds are scaled back by its inverse.
    """
    expect(window >= 1, "a window of at least 1", window)
    expect(0.0 < false_alarm_rate < 1.0, "a false alarm rate in (0, 1)", false_alarm_rate)
    expect(len(references) > 0, "at least one detector", len(references))
    sizes = {r.codes.shape[0] for r in references}
    expect(len(sizes) == 1, "code samples of one size, aligned across detectors", sizes)
    s = sizes.pop()
    rng = np.random.default_rng(seed)
    scores = np.empty((len(references), windows))
    # The resampling target is each code sample's own counts, so the scale factor is exact.
    sample_refs = [
        BinnedReference(
            r.name, r.level, r.edges, bin_counts(r.codes, r.n_bins), r.codes, r.aggregation
        )
        for r in references
    ]
    for start in range(0, windows, chunk):
        stop = min(windows, start + chunk)
        index = rng.integers(0, s, size=(stop - start, window))
        for d, ref in enumerate(sample_refs):
            counts = bin_counts(ref.codes[index], ref.n_bins)
            scores[d, start:stop] = ref.score(counts)
    # Empirical p-value of each window under each detector: share of windows scoring as high.
    pvals = np.empty_like(scores)
    for d in range(len(references)):
        ascending = np.sort(scores[d])
        pvals[d] = (windows - np.searchsorted(ascending, scores[d], side="left")) / windows
    min_p = np.sort(pvals.min(axis=0))
    # The largest common per-detector level whose any-detector alarm share stays in budget.
    levels = np.unique(pvals)
    share = np.searchsorted(min_p, levels, side="right") / windows
    within = levels[share <= false_alarm_rate]
    level = float(within.max()) if within.size else 0.0
    scale = (s + window) / s
    thresholds: dict[str, float] = {}
    for d, ref in enumerate(references):
        alarmed = scores[d][pvals[d] <= level]
        quiet = scores[d][pvals[d] > level]
        top = float(quiet.max()) if quiet.size else 0.0
        # Between the highest quiet and the lowest alarmed resampled score.
        cut = (top + float(alarmed.min())) / 2 if alarmed.size else top * 1.5 + 1e-9
        thresholds[ref.name] = cut * scale
    return Calibration(window, false_alarm_rate, thresholds, level, windows)
