"""Drift detection over reference-quantile bins: pure numpy, run on the capture thread.

``bins`` (the representation and its test statistic), ``features`` (what a layer's captures
become), ``projection`` (wide layers), ``calibration`` (thresholds) and ``tracker`` (streaming
windows and verdicts); ``accuracy`` (a label-free accuracy estimate and its drop test). No
Prometheus, TorchServe or torch imports.
"""

from __future__ import annotations

from hookwatch._drift.accuracy import (
    AccuracyDropTest,
    AccuracyEstimate,
    AccuracyEstimator,
    AccuracyTracker,
    DropAlarm,
)
from hookwatch._drift.bins import (
    MAX_BINS,
    BinnedReference,
    ChiSquare,
    CodeArray,
    DegenerateReference,
    FloatArray,
    IntArray,
    bin_counts,
    encode,
    expected_shares,
)
from hookwatch._drift.calibration import Calibration, calibrate
from hookwatch._drift.features import class_logits, derive, softmax
from hookwatch._drift.projection import Projection
from hookwatch._drift.sequential import (
    SequentialAlarm,
    SequentialGroup,
    SequentialTest,
    reference_tolerance,
)
from hookwatch._drift.tracker import DriftResult, DriftTracker, SlidingWindow

__all__ = [
    "MAX_BINS",
    "AccuracyDropTest",
    "AccuracyEstimate",
    "AccuracyEstimator",
    "AccuracyTracker",
    "BinnedReference",
    "Calibration",
    "ChiSquare",
    "CodeArray",
    "DegenerateReference",
    "DriftResult",
    "DriftTracker",
    "DropAlarm",
    "FloatArray",
    "IntArray",
    "Projection",
    "SequentialAlarm",
    "SequentialGroup",
    "SequentialTest",
    "SlidingWindow",
    "bin_counts",
    "calibrate",
    "class_logits",
    "derive",
    "encode",
    "expected_shares",
    "reference_tolerance",
    "softmax",
]
