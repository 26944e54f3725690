"""The drift profile: built with the serving hooks, bounded, versioned; loading and serving."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hookwatch
from hookwatch._config import MonitoringConfig
from hookwatch._drift import derive
from hookwatch._drift.projection import SAMPLES_PER_COMPONENT, component_count
from hookwatch._errors import ConfigError, ProfileError
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch._names import STATISTICS
from hookwatch._profile import (
    VERSION,
    DriftProfile,
    build_profile,
    capture_features,
    load_tracker,
)
from hookwatch.tools.demo.digits_cnn import DigitsCNN

LAYERS = ["act1", "act2", "act3"]


def _config(**drift: object) -> MonitoringConfig:
    return MonitoringConfig.from_mapping(
        {"layers": LAYERS, "sample_rate": 1.0, "seed": 0, "drift": {"window": 40, **drift}}
    )


def _model() -> DigitsCNN:
    torch.manual_seed(0)
    return DigitsCNN().eval()


def _images(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=gen) * 16


def _profile(n: int = 600, **kwargs: object) -> DriftProfile:
    x = _images(n, 0)
    batches = [x[i : i + 100] for i in range(0, n, 100)]
    return build_profile(_model(), _config(), batches, "digits", **kwargs)  # type: ignore[arg-type]


def test_profile_has_every_level_and_uses_the_serving_features() -> None:
    profile = _profile()
    levels = {name: ref.level for name, ref in profile.references.items()}
    assert levels == {
        "input": "input",
        "act1": "activation",
        "act2": "activation",
        "act3": "activation",
        "output": "output",
        "confidence": "prediction",
        "entropy": "prediction",
        "class_mix": "prediction",
    }
    # The input is kept pixel by pixel, conv maps per channel, the rest per unit.
    features = {name: ref.n_features + len(ref.dropped) for name, ref in profile.references.items()}
    assert features["input"] == 64 and features["act1"] == 16 and features["act2"] == 32
    assert features["act3"] == 64 and features["output"] == 10
    # Bins are reference quantiles: counts come from the hooks' own features.
    x = _images(600, 0)
    captured = next(iter(capture_features(_model(), _config(), [x])))
    act2 = derive("act2", captured["act2"])["act2"]
    ref = profile.references["act2"]
    np.testing.assert_array_equal(
        ref.counts, np.stack([np.bincount(c, minlength=ref.n_bins) for c in ref.encode(act2).T])
    )


def test_save_load_round_trip_and_version_check(tmp_path: Path) -> None:
    profile = _profile()
    path = profile.save(tmp_path / "p.npz")
    loaded = DriftProfile.load(path)
    assert loaded.layers == ("input", *LAYERS, "output") and loaded.n_seen == 600
    for name, ref in profile.references.items():
        other = loaded.references[name]
        np.testing.assert_allclose(other.edges, ref.edges.astype(np.float32))
        np.testing.assert_array_equal(other.counts, ref.counts)
        np.testing.assert_array_equal(other.codes, ref.codes)
        assert other.kept == ref.kept and other.level == ref.level
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(arrays["header"].tobytes())
    header["version"] = VERSION + 1
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(tmp_path / "future.npz", **arrays)
    with pytest.raises(ProfileError, match="expected profile version 1 or 2 or 3 or 4, got 5"):
        DriftProfile.load(tmp_path / "future.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a profile")
    with pytest.raises(ProfileError, match="expected a hookwatch-drift-profile"):
        DriftProfile.load(tmp_path / "junk.npz")


def test_profile_size_is_bounded_whatever_the_amount_of_reference_data(tmp_path: Path) -> None:
    small = _profile(400, max_reference=300, max_codes=200)
    large = _profile(3000, max_reference=300, max_codes=200)
    assert large.n_seen == 3000
    assert all(r.n_ref == 300 and r.codes.shape[0] == 200 for r in large.references.values())
    size_small = small.save(tmp_path / "s.npz").stat().st_size
    size_large = large.save(tmp_path / "l.npz").stat().st_size
    assert size_large <= 1.2 * size_small


def test_a_profile_for_other_layers_is_refused() -> None:
    profile = _profile()
    other = MonitoringConfig.from_mapping({"layers": ["act1"]})
    with pytest.raises(ProfileError, match="expected a profile for layers"):
        profile.check(other)


def test_no_profile_serves_without_drift_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, metrics: MetricSet
) -> None:
    config = _config()
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        tracker = load_tracker(config, tmp_path, "digits")
    assert tracker is None
    assert [r.message for r in caplog.records if "no drift profile" in r.message]
    model = _model()
    monitor = Monitor(model, plan_watch(model, config, "digits"), metrics=metrics, drift=tracker)
    try:
        values = metrics.sample_values()
        assert values[("hookwatch_drift_profile_loaded", (("model", "digits"),))] == 0
    finally:
        monitor.close()


def test_monitor_publishes_drift_from_the_capture_thread(
    tmp_path: Path, metrics: MetricSet
) -> None:
    config = _config(step=10)
    _profile().save(tmp_path / config.drift.profile)
    tracker = load_tracker(config, tmp_path, "digits")
    assert tracker is not None
    model = _model()
    monitor = Monitor(model, plan_watch(model, config, "digits"), metrics=metrics, drift=tracker)

    def send(x: torch.Tensor) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        for row in x:
            with torch.inference_mode(), monitor.request(1):
                model(row[None])
        assert monitor.flush()
        return dict(metrics.sample_values())

    def get(values: dict, name: str, detector: str) -> float:  # type: ignore[type-arg]
        level = tracker.references[detector].level
        key = (name, (("detector", detector), ("level", level), ("model", "digits")))
        return float(values[key])

    try:
        clean = send(_images(80, 1))
        assert clean[("hookwatch_drift_profile_loaded", (("model", "digits"),))] == 1
        assert get(clean, "hookwatch_drift_windows_total", "input") == 5  # at 40, 50, ..., 80
        assert get(clean, "hookwatch_drift_detected", "input") == 0
        shifted = send(_images(40, 2) * 0.3)  # darker images: every level moves
        assert get(shifted, "hookwatch_drift_detected", "input") == 1
        assert get(shifted, "hookwatch_drift_score", "input") > get(
            shifted, "hookwatch_drift_threshold", "input"
        )
        assert get(shifted, "hookwatch_drift_alarms_total", "act1") >= 1
    finally:
        monitor.close()


def test_profile_command_builds_from_a_mar_and_an_array(tmp_path: Path) -> None:
    from hookwatch.tools.cli import main
    from hookwatch.tools.demo.build import archive

    root = Path(__file__).resolve().parents[2]
    mar = archive(_model(), root, tmp_path / "build", tmp_path / "store")
    data = tmp_path / "reference.npy"
    np.save(data, _images(300, 3).numpy())
    out = tmp_path / "profile.npz"
    assert main(["profile", "--mar", str(mar), "--data", str(data), "--out", str(out)]) == 0
    profile = DriftProfile.load(out)
    assert profile.n_seen == 300 and profile.model == "digits"
    assert set(profile.references) >= {"input", "act1", "output", "class_mix"}


def test_drift_knobs_are_typed_and_checked() -> None:
    from hookwatch._errors import ConfigError

    config = MonitoringConfig.from_mapping(
        {"layers": [], "drift": {"window": 64, "false_alarm_rate": 0.05}}
    )
    assert config.drift.window == 64 and config.drift.effective_step == 16
    for bad, message in (
        ({"window": 1}, "monitoring.drift.window: expected an integer"),
        ({"false_alarm_rate": 0}, "monitoring.drift.false_alarm_rate: expected a number"),
        ({"profile": "../x.npz"}, "monitoring.drift.profile: expected a file name"),
        ({"windwo": 5}, "monitoring.drift: expected only the keys"),
        ({"step": 500}, "monitoring.drift.step: expected an integer in \\[0, 200\\]"),
        ({"projection": "pcaa"}, "monitoring.drift.projection: expected one of"),
        ({"projection_width": 100}, "projection_width: expected at least max_features \\(256\\)"),
    ):
        with pytest.raises(ConfigError, match=message):
            MonitoringConfig.from_mapping({"layers": [], "drift": bad})


class _TwoHalves(nn.Module):
    """A 128-unit layer whose first 64 units see inputs 0-7 only and the rest inputs 8-15 only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.left = nn.Linear(8, 64)
        self.right = nn.Linear(8, 64)
        self.act = nn.Tanh()
        self.head = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.act(torch.cat([self.left(x[:, :8]), self.right(x[:, 8:])], dim=1))
        out: torch.Tensor = self.head(hidden)
        return out


def _wide_config(projection: str) -> MonitoringConfig:
    return MonitoringConfig.from_mapping(
        {
            "layers": ["act"],
            "capture_input": False,
            "capture_output": False,
            "max_features": 16,
            "sample_rate": 1.0,
            "seed": 0,
            "drift": {"window": 100, "step": 25, "projection": projection},
        }
    )


def _gaussian(n: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    x[:, 8:] += shift  # only the inputs behind units 64-127 move
    return x


def _alarm_share(projection: str, shift: float) -> float:
    model, config = _TwoHalves().eval(), _wide_config(projection)
    profile = build_profile(model, config, [_gaussian(2000, 0)], "wide")
    tracker = profile.tracker(100, 25, 0.01, windows=1000)
    verdicts = [
        result.is_drift
        for batch in capture_features(model, config, [_gaussian(1000, 1, shift)])
        for result in tracker.update("act", batch["act"])
    ]
    assert len(verdicts) == 37  # a verdict at 100, 125, ..., 1000
    return float(np.mean(verdicts))


def test_a_wide_layer_is_tested_on_its_principal_components() -> None:
    model = _TwoHalves().eval()
    profile = build_profile(model, _wide_config("pca"), [_gaussian(2000, 0)], "wide")
    projection = profile.projections["act"]
    assert projection.input_width == 128 and projection.width == 16 and projection.residual
    # The features binned: 15 components of everything the layer does and the distance from
    # them, not units 0-15.
    assert profile.references["act"].n_features == 16
    assert 0.5 < projection.explained < 1.0
    truncated = build_profile(model, _wide_config("none"), [_gaussian(2000, 0)], "wide")
    assert truncated.projections == {} and truncated.references["act"].n_features == 16


class _Pixels(nn.Module):
    """A classifier of 784-pixel inputs: the input is wider than the default budget (256)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(x)
        return out


def _pixels(n: int) -> torch.Tensor:
    # Pixels that vary in many directions (a low-rank reference would cap the components).
    return torch.rand(n, 784, generator=torch.Generator().manual_seed(0))


def _pixel_profile(
    n: int, caplog: pytest.LogCaptureFixture, **drift: object
) -> tuple[DriftProfile, list[logging.LogRecord]]:
    config = MonitoringConfig.from_mapping({"layers": [], "drift": drift})
    with caplog.at_level(logging.INFO, logger="hookwatch"):
        profile = build_profile(_Pixels().eval(), config, _pixels(n).split(500), "pixels")
    return profile, caplog.records


def test_component_count_is_sized_from_the_reference_unless_asked() -> None:
    assert component_count(2000, 256) == 80  # one per SAMPLES_PER_COMPONENT samples
    assert component_count(20_000, 256) == 255  # at most max_features - 1
    assert component_count(10, 256) == 1  # a reference too small for any: one
    assert component_count(2000, 1) == 0  # a budget of one feature: the residual alone
    assert component_count(2000, 256, requested=200) == 200
    assert SAMPLES_PER_COMPONENT == 25


def test_the_default_projection_is_sized_from_the_reference_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The case: a 784-pixel input and 2,000 reference samples at the default budget,
    # half of them to fit the projection on and the other half to bin it.
    profile, records = _pixel_profile(2000, caplog)
    projection = profile.projections["input"]
    assert projection.components.shape[1] == 80 and projection.residual
    assert profile.references["input"].n_features == 81
    assert not [r for r in records if r.levelno >= logging.WARNING]
    said = [r.getMessage() for r in records if "principal components" in r.getMessage()]
    assert len(said) == 1 and "drift tests 80 principal components" in said[0]
    assert "sized from the reference: one per 25 of its 2000 samples" in said[0]
    assert "fitted on 1000 reference samples and binned on the other 1000" in said[0]


def test_an_explicit_component_count_above_what_the_reference_supports_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    profile, records = _pixel_profile(2000, caplog, components=200)
    assert profile.projections["input"].components.shape[1] == 200
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "projected to 200 components (drift.components) from 2000" in warned[0]
    # An explicit count the reference supports is kept as asked, silently.
    caplog.clear()
    profile, records = _pixel_profile(2000, caplog, components=40)
    assert profile.projections["input"].components.shape[1] == 40
    assert not [r for r in records if r.levelno >= logging.WARNING]


class _Echo(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :4]


def test_clean_traffic_through_a_projection_alarms_as_rarely_as_promised() -> None:
    # An outside user's case: 800 features of noise, 400 reference samples. A projection
    # fitted on the rows it was binned on alarmed on every clean window (the traffic spread
    # less along its components and lay farther from their subspace); binned on rows it was
    # not fitted on, the clean windows alarm about as often as calibrated (1 %).
    config = MonitoringConfig.from_mapping(
        {"layers": [], "capture_output": False, "sample_rate": 1.0, "seed": 0}
    )
    noise = torch.Generator().manual_seed(3)
    profile = build_profile(_Echo(), config, [torch.randn(400, 800, generator=noise)], "echo")
    # 16 components (one per 25 of the 400 samples), fitted on 200 of them.
    assert profile.projections["input"].components.shape[1] == 16
    tracker = profile.tracker(100, 25, 0.01, windows=2000)
    verdicts = [
        result.is_drift
        for batch in capture_features(_Echo(), config, [torch.randn(4000, 800, generator=noise)])
        for result in tracker.update("input", batch["input"])
    ]
    assert len(verdicts) == 157 and np.mean(verdicts) <= 0.05
    # ... and a shift still shows within a window.
    shifted = [
        result.is_drift
        for batch in capture_features(
            _Echo(), config, [torch.randn(200, 800, generator=noise) * 1.3]
        )
        for result in tracker.update("input", batch["input"])
    ]
    assert any(shifted)


def test_a_layer_within_the_budget_is_not_projected_whatever_the_reference_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 64 pixels at the default budget (256), from 30 reference samples: binned value by
    # value as before, with no projection and no warning.
    with caplog.at_level(logging.INFO, logger="hookwatch"):
        profile = _profile(30)
    assert profile.projections == {}
    assert profile.references["input"].n_features == 64
    assert not [r for r in caplog.records if "components" in r.getMessage()]


def test_a_shift_behind_units_past_the_budget_is_seen_only_with_the_projection() -> None:
    # Truncation keeps units 0-15, which never see inputs 8-15: that shift is invisible to it.
    assert _alarm_share("none", 1.0) <= 0.1
    assert _alarm_share("pca", 1.0) >= 0.9
    assert _alarm_share("pca", 0.0) <= 0.1


def test_a_projected_profile_round_trips_and_the_monitor_captures_its_width(
    tmp_path: Path, metrics: MetricSet
) -> None:
    model, config = _TwoHalves().eval(), _wide_config("pca")
    profile = build_profile(model, config, [_gaussian(2000, 0)], "wide")
    loaded = DriftProfile.load(profile.save(tmp_path / config.drift.profile))
    original, restored = profile.projections["act"], loaded.projections["act"]
    np.testing.assert_array_equal(restored.components, original.components)
    np.testing.assert_array_equal(restored.mean, original.mean)
    assert restored.explained == original.explained and restored.residual == original.residual
    # Both hand-off paths: copies reduced on the capture thread, and reductions in the hook.
    for copy_limit in (4096, 0):
        config = MonitoringConfig.from_mapping(
            {
                "layers": ["act"],
                "capture_input": False,
                "capture_output": False,
                "max_features": 16,
                "sample_rate": 1.0,
                "copy_limit": copy_limit,
                "drift": {"window": 100, "step": 25},
            }
        )
        tracker = load_tracker(config, tmp_path, "wide")
        assert tracker is not None and tracker.feature_widths() == {"act": 128}
        monitor = Monitor(model, plan_watch(model, config, "wide"), metrics=metrics, drift=tracker)
        try:
            for x in _gaussian(200, 5 + copy_limit, shift=2.0).split(8):
                with torch.inference_mode(), monitor.request(len(x)):
                    model(x)
            assert monitor.flush()
            key = (
                "hookwatch_drift_detected",
                (("detector", "act"), ("level", "activation"), ("model", "wide")),
            )
            assert metrics.sample_values()[key] == 1
            faults = ("hookwatch_monitor_faults_total", (("layer", "act"), ("model", "wide")))
            assert metrics.sample_values()[faults] == 0
        finally:
            monitor.close()


def test_a_profile_that_would_bin_its_reference_differently_once_stored_is_refused() -> None:
    import dataclasses

    from hookwatch._profile.builder import verify_stored

    torch.manual_seed(0)
    model = _model()
    config = _config()
    batches = [torch.rand(64, 1, 8, 8) * 16 for _ in range(4)]
    features: dict[str, list[np.ndarray]] = {}
    for batch in capture_features(model, config, batches):
        for layer, x in batch.items():
            features.setdefault(layer, []).append(x)
    rows = {layer: np.concatenate(x) for layer, x in features.items()}
    profile = build_profile(model, config, batches, "digits")  # verified inside: passes
    pick = np.arange(len(rows["act1"]))
    verify_stored(profile, rows, pick)
    # Stored edges that moved (as float32 rounding moved them) no longer bin the reference
    # into the codes its counts and calibration came from.
    ref = profile.references["act1"]
    moved = dataclasses.replace(ref, edges=ref.edges * 1.05)
    tampered = dataclasses.replace(profile, references={**profile.references, "act1": moved})
    with pytest.raises(ProfileError, match=r"detector 'act1': expected the stored profile"):
        verify_stored(tampered, rows, pick)


def _served(
    model: nn.Module,
    config: dict[str, Any],
    name: str,
    profile: DriftProfile,
    metrics: MetricSet,
    batches: list[torch.Tensor],
) -> Callable[..., float]:
    """``batches`` through ``model`` watched with ``profile``, three times over; a reader of
    the model's series: ``series(metric, **labels)``."""
    monitor = hookwatch.watch(model, config, name, profile=profile, metrics=metrics)
    with monitor, torch.inference_mode():
        for x in batches * 3:
            with monitor.request(len(x)):
                model(x)
    values = metrics.sample_values()

    def series(metric: str, **labels: str) -> float:
        return values[(metric, tuple(sorted({"model": name, **labels}.items())))]

    return series


class Branching(nn.Module):
    """A module on a conditional path: ``wide`` runs only on batches whose mean is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.narrow = nn.Linear(4, 3)
        self.wide = nn.Linear(4, 3)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.wide(x) if x.mean() > 0 else self.narrow(x))
        return out


def test_reference_data_that_skips_a_layer_or_has_empty_batches(
    metrics: MetricSet, caplog: pytest.LogCaptureFixture
) -> None:
    """An empty batch adds nothing; a layer that did not run on every batch has rows that are
    not every sample's (and slots never written): its drift is left out, visibly, while its
    statistics and every other detector are built; serving watches it all."""
    torch.manual_seed(0)
    model = Branching().eval()
    batches = [torch.randn(16, 4) + (0.5 if i % 3 else -0.5) for i in range(12)]
    batches.insert(3, torch.randn(0, 4))
    config = {"layers": ["narrow", "wide", "act"], "sample_rate": 1.0, "drift": {"window": 20}}
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        profile = build_profile(model, config, batches, "branch")
    assert {"narrow", "wide"} <= set(profile.left_out)
    assert "conditional path" in profile.left_out["wide"]
    assert "act" in profile.references and "output" in profile.references
    assert {"narrow", "wide"} <= set(profile.statistics)
    assert sum("conditional path" in r.message for r in caplog.records) == 2
    series = _served(model, config, "branch", profile, metrics, batches)
    assert series("hookwatch_captures_total", layer="wide") > 0
    assert series("hookwatch_monitor_faults_total", layer="wide") == 0
    assert series("hookwatch_drift_detector_usable", level="activation", detector="wide") == 0
    assert series("hookwatch_drift_windows_total", level="activation", detector="act") > 0
    with pytest.raises(ProfileError, match="at least 2 reference samples, got 0"):
        build_profile(model, config, [torch.randn(0, 4)], "branch")


class Routed(nn.Module):
    """A mixture of experts: each sample goes to the expert its router scores highest, so an
    expert sees only the rows routed to it (another row count than the batch's)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(4, 3)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4)) for _ in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            if bool((choice == i).any()):
                out[choice == i] = expert(x[choice == i])
        return out


def test_an_expert_given_only_its_routed_rows_is_watched_without_drift(
    metrics: MetricSet,
) -> None:
    """An expert's rows are not the batch's samples: the profile leaves its drift out and says
    why (the archive failed on it, "expected 64 rows"); its statistics are built and served,
    and so is every other detector."""
    torch.manual_seed(0)
    model = Routed().eval()
    batches = [torch.randn(32, 4) for _ in range(8)]
    config = {"layers": ["router", "experts.*.1"], "sample_rate": 1.0, "drift": {"window": 20}}
    profile = build_profile(model, config, batches, "moe")
    for expert in ("experts.0.1", "experts.1.1", "experts.2.1"):
        assert "rows for a reference batch of 32 samples" in profile.left_out[expert]
        assert expert in profile.statistics
    assert {"input", "router", "output"} <= set(profile.references)
    series = _served(model, config, "moe", profile, metrics, batches)
    assert series("hookwatch_captures_total", layer="experts.1.1") > 0
    assert series("hookwatch_monitor_faults_total", layer="experts.1.1") == 0
    assert series("hookwatch_drift_windows_total", level="activation", detector="router") > 0


def test_watch_resolves_patterns_before_matching_the_profile(metrics: MetricSet) -> None:
    model = _model()
    config = {"layers": ["act*"], "sample_rate": 1.0, "drift": {"window": 20}}
    profile = build_profile(model, config, [torch.rand(32, 1, 8, 8) for _ in range(3)], "p")
    assert profile.layers == ("input", "act1", "act2", "act3", "output")
    with hookwatch.watch(model, config, "p", profile=profile, metrics=metrics) as monitor:
        assert monitor.config.layers == ("act1", "act2", "act3")


def test_a_logits_head_on_class_ids_is_a_config_error() -> None:
    class ClassIds(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).argmax(dim=1)

    with pytest.raises(ConfigError, match=r"expected logits \(floating point\).*got int64 values"):
        build_profile(ClassIds(), {"layers": ["fc"]}, [torch.randn(16, 4)] * 2, "ids")
    profile = build_profile(
        ClassIds(), {"layers": ["fc"], "output": {"head": "values"}}, [torch.randn(16, 4)] * 4, "i"
    )
    assert "fc" in profile.references


def test_profiling_gives_every_module_its_own_mode_back() -> None:
    model = _model().train()
    model.act2.eval()  # a part the user froze
    build_profile(model, _config(), [torch.rand(16, 1, 8, 8) for _ in range(2)], "modes")
    assert model.training and model.act1.training and not model.act2.training


class _Counting(nn.Module):
    """A small regression model that counts the samples it was run on."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.head = nn.Linear(8, 2)
        self.samples = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.samples += len(x)
        out: torch.Tensor = self.head(self.act(self.fc(x)))
        return out


_REGRESSION = {"layers": ["act"], "output": {"head": "values"}, "drift": {"window": 20}}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_reference_with_nan_or_infinity_is_refused_in_one_line(value: float) -> None:
    """Binned, NaN features read as constant: the profile archived with its detectors left out
    for a false reason. The builder refuses the reference, counting every bad sample, and runs
    no batch after the first bad one."""
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))
    x[100::2, 0] = value  # samples 100, 102, ..., 298: 100 of them
    model = _Counting().eval()
    batches = [x[i : i + 50] for i in range(0, 300, 50)]
    message = (
        r"^reference: expected finite values, got NaN or Infinity in 100 of 300 samples "
        r"\(the first: sample 100\)$"
    )
    with pytest.raises(ProfileError, match=message):
        build_profile(model, _REGRESSION, batches, "reg")
    assert model.samples == 100  # the two clean batches before the first bad one
    # As keyword arguments (a model called model(x=...)), and a reference of NaN only.
    with pytest.raises(ProfileError, match="NaN or Infinity in 300 of 300 samples"):
        build_profile(model, _REGRESSION, [{"x": torch.full((300, 4), value)}], "reg")


def test_nan_or_infinity_from_the_model_on_a_finite_reference_leaves_its_detectors_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A layer that gives NaN on some finite inputs: its detectors are left out with the true
    reason, not "constant", and the layers before it keep theirs."""

    class Logarithm(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x)  # NaN where x < 0

    model = nn.Sequential(nn.Linear(4, 3), Logarithm(), nn.Linear(3, 3)).eval()
    torch.manual_seed(0)
    x = torch.randn(300, 4)
    config = {"layers": ["0", "1"], "output": {"head": "logits"}, "drift": {"window": 20}}
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        profile = build_profile(model, config, [x], "log")
    bad = int((~torch.isfinite(torch.log(model[0](x)))).any(dim=1).sum())
    assert 0 < bad < 300
    left_out = {"1", "output", "confidence", "entropy", "class_mix"}
    assert set(profile.left_out) == left_out
    for reason in profile.left_out.values():
        assert reason.startswith(f"the model gave NaN or Infinity in its features on {bad} of")
        assert "constant" not in reason
    assert {"input", "0"} == set(profile.references)
    assert sum("NaN or Infinity" in r.message for r in caplog.records) == len(left_out)
    # The statistics count the NaN for the alert thresholds, as serving exports them.
    assert profile.statistics["1"][STATISTICS.index("nan_count")] > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_model_of_another_float_dtype_is_profiled(dtype: torch.dtype) -> None:
    """A ``.double()`` model failed in the hooks' vector_norm(dtype=float32); every float
    dtype profiles, its statistics the same as its float32 twin's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)).eval()
    x = torch.randn(200, 3, generator=torch.Generator().manual_seed(1))
    config = {"layers": ["1"], "output": {"head": "values"}, "drift": {"window": 20}}
    twin = build_profile(model, config, [x.to(dtype).float()], "f32")
    profile = build_profile(copy.deepcopy(model).to(dtype), config, [x.to(dtype)], "other")
    assert set(profile.references) == {"input", "1", "output"} and not profile.left_out
    tolerance = 1e-5 if dtype == torch.float64 else 5e-2
    for layer, stats in twin.statistics.items():
        assert profile.statistics[layer] == pytest.approx(stats, rel=tolerance, abs=tolerance)


def test_the_build_says_when_a_layer_is_cut_to_projection_width(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An outside user's 8192-unit layer was logged as having 4096 features.
    config = MonitoringConfig.from_mapping(
        {
            "layers": [],
            "capture_output": False,
            "max_features": 16,
            "drift": {"projection_width": 300},
        }
    )
    noise = torch.Generator().manual_seed(1)
    with caplog.at_level(logging.INFO, logger="hookwatch"):
        profile = build_profile(_Echo(), config, [torch.randn(200, 800, generator=noise)], "e")
    assert profile.projections["input"].input_width == 300
    said = [r.getMessage() for r in caplog.records if "principal components" in r.getMessage()]
    assert "has 300 features (drift.projection_width: a wider layer's first ones)" in said[0]
