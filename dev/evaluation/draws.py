"""One draw of the evaluation: a split, a model trained on it, its saved profile, its pools.

A seed fixes everything: which digits are held out for testing, which training digits become
the drift reference, the model's initialisation and batches, and the noise and letters of the
scenarios. Each draw is a deployment of the product that could have happened.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray

from dev.evaluation.scenarios import Scenario, build_scenarios
from hookwatch._config import MonitoringConfig
from hookwatch._drift import Projection, derive
from hookwatch._names import OUTPUT_LAYER
from hookwatch._profile import DriftProfile, build_profile, capture_features
from hookwatch.tools.demo.build import reference_split, train
from hookwatch.tools.demo.data import load_split

__all__ = ["Draw", "batches", "captured", "make_draw", "representations", "saved"]

Features = dict[str, NDArray[np.float32]]


def batches(x: NDArray[np.float32], size: int = 256) -> list[torch.Tensor]:
    return [torch.from_numpy(x[i : i + size]) for i in range(0, len(x), size)]


def saved(profile: DriftProfile) -> DriftProfile:
    """The profile as a worker gets it: written to its file and read back. Every figure comes
    from what the file holds, not from the builder's in-memory arrays."""
    with tempfile.TemporaryDirectory() as tmp:
        return DriftProfile.load(profile.save(Path(tmp) / "drift-profile.npz"))


def captured(model: torch.nn.Module, config: MonitoringConfig, x: NDArray[np.float32]) -> Features:
    """What the serving hooks hand the capture thread for every watched layer."""
    parts: dict[str, list[NDArray[np.float32]]] = {}
    for batch in capture_features(model, config, batches(x)):
        for layer, values in batch.items():
            parts.setdefault(layer, []).append(values)
    return {layer: np.concatenate(v) for layer, v in parts.items()}


def representations(
    config: MonitoringConfig,
    raw: Features,
    projections: Mapping[str, Projection] | None = None,
) -> Features:
    """Per watched layer the features its detector reads (the output: the softmax), as the
    baselines get them: the same information hookwatch has."""
    reps: Features = {}
    for layer in config.watched:
        projection = None if projections is None else projections.get(layer)
        features = raw[layer] if projection is None else projection.apply(raw[layer])
        derived = derive(layer, features)
        reps[layer] = derived["output" if layer == OUTPUT_LAYER else layer].astype(np.float32)
    return reps


@dataclass
class Draw:
    seed: int
    config: MonitoringConfig
    model: torch.nn.Module
    profile: DriftProfile
    scenarios: list[Scenario]
    #: Where each scenario's pool starts in the concatenated arrays, and its size.
    offsets: dict[str, int]
    sizes: dict[str, int]
    #: Captured features per watched layer for every pool sample, concatenated.
    raw: Features
    #: The reference images and what the hooks capture of them.
    x_ref: NDArray[np.float32]
    ref_raw: Features
    #: The baselines' inputs: per watched layer, for the reference and for the pools.
    ref_reps: Features
    reps: Features
    #: Share of correct predictions per scenario (sampling weights included; 0 for a pool
    #: with no right answer).
    accuracy: dict[str, float]
    #: Test labels of the clean pool (the class-prior shift draws by class).
    labels: NDArray[np.int64]

    def pool(self, name: str) -> NDArray[np.int64]:
        """Indices of a scenario's pool in the concatenated arrays."""
        return self.offsets[name] + np.arange(self.sizes[name])


def _accuracy(scenario: Scenario, logits: NDArray[np.float32]) -> float:
    if scenario.labels is None:
        return 0.0
    correct = (logits.argmax(axis=1) == scenario.labels).astype(np.float64)
    weights = scenario.weights
    return float(correct.mean() if weights is None else (correct * weights).sum() / weights.sum())


def make_draw(seed: int, config: MonitoringConfig) -> Draw:
    torch.set_num_threads(1)
    split = load_split(seed=seed)
    fit, x_ref, _ = reference_split(split, seed=seed)
    model, _ = train(fit, seed=seed)
    profile = saved(build_profile(model, config, batches(x_ref), "digits", bins=config.drift.bins))
    scenarios = build_scenarios(split.x_test, split.y_test, seed)
    offsets: dict[str, int] = {}
    sizes: dict[str, int] = {}
    parts: dict[str, list[NDArray[np.float32]]] = {}
    accuracy: dict[str, float] = {}
    start = 0
    for scenario in scenarios:
        features = captured(model, config, scenario.images)
        for layer, values in features.items():
            parts.setdefault(layer, []).append(values)
        accuracy[scenario.name] = _accuracy(scenario, features[OUTPUT_LAYER])
        offsets[scenario.name] = start
        sizes[scenario.name] = len(scenario.images)
        start += len(scenario.images)
    raw = {layer: np.concatenate(v) for layer, v in parts.items()}
    ref_raw = captured(model, config, x_ref)
    return Draw(
        seed=seed,
        config=config,
        model=model,
        profile=profile,
        scenarios=scenarios,
        offsets=offsets,
        sizes=sizes,
        raw=raw,
        x_ref=x_ref,
        ref_raw=ref_raw,
        ref_reps=representations(config, ref_raw),
        reps=representations(config, raw),
        accuracy=accuracy,
        labels=split.y_test,
    )


def with_budget(config: MonitoringConfig, max_features: int, projection: str) -> MonitoringConfig:
    """The configuration at another feature budget and projection (the wide-layer section)."""
    drift = dataclasses.replace(config.drift, projection=projection)
    return dataclasses.replace(config, max_features=max_features, drift=drift)
