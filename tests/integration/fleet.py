"""The fleet's per-bin counts and scores computed offline, with the serving hooks and the
tracker's own code (``DriftTracker.choose_fleet``, ``take_counts``, ``fleet_score``): what the
fleet recording rules must equal on the union of the replicas' traffic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray

from hookwatch._config import MonitoringConfig
from hookwatch._drift import DriftTracker, IntArray
from hookwatch._profile import DriftProfile, capture_features
from tests.integration.helpers import build_variant, demo_config, demo_model, demo_profile

#: Per (detector, feature label, bin label): samples.
Counts = dict[tuple[str, str, str], float]


def fully_sampled_demo(tmp_path: Path) -> tuple[Path, MonitoringConfig, DriftProfile]:
    """A model store with the demo at 100 % sampling, its monitoring config, and the same
    profile loaded for the offline side (checked against that config)."""
    store = tmp_path / "store"
    raw_config = demo_config(sample_rate=1.0)
    build_variant(store, raw_config, profile=True)
    config = MonitoringConfig.from_mapping(raw_config["handler"]["monitoring"])
    profile = DriftProfile.load(demo_profile(tmp_path / "offline"))
    profile.check(config)
    return store, config, profile


def offline_tracker(profile: DriftProfile, config: MonitoringConfig) -> DriftTracker:
    """A tracker over ``profile`` tallying the fleet detectors as a serving worker does."""
    drift = config.drift
    tracker = profile.tracker(drift.window, drift.effective_step, drift.false_alarm_rate, 500)
    tracker.choose_fleet(drift.fleet_detectors, drift.fleet_features)
    return tracker


def offline_fleet(
    profile: DriftProfile, config: MonitoringConfig, images: NDArray[np.float32]
) -> tuple[dict[str, float], Counts]:
    """Scores and per-bin counts of every fleet detector on ``images``.

    One image per forward pass, one torch thread, the .mar's weights: as each worker runs it.
    """
    torch.set_num_threads(1)
    tracker = offline_tracker(profile, config)
    batches = [torch.from_numpy(image[None]) for image in images]
    totals: dict[str, IntArray] = {}
    for features in capture_features(demo_model(), config, batches):
        for layer, x in features.items():
            tracker.update(layer, x)
        for name, counts in tracker.take_counts().items():
            totals[name] = counts if name not in totals else totals[name] + counts
    scores: dict[str, float] = {}
    out: Counts = {}
    for name, counts in totals.items():
        ref = profile.references[name]
        scores[name] = tracker.fleet_score(name, counts)
        for t, f in enumerate(tracker.fleet_features(name)):
            for k in np.flatnonzero(ref.valid[f]):
                out[(name, str(ref.kept[f]), str(k))] = float(counts[t, k])
    return scores, out
