"""Two real TorchServe instances, one Prometheus: the fleet-drift recording rules compute, in
PromQL, the same score drift.py computes offline on the union of both instances' traffic."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from hookwatch._catalogue import CATALOGUE, FLEET_METRICS, series_per_model
from hookwatch._config import MonitoringConfig
from hookwatch._profile import DriftProfile
from hookwatch.tools.cli import DEMO_MODEL_CONFIG, demo_fleet_bins, demo_watched_layers
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import Stack, http_get
from tests.conftest import require_binary
from tests.integration.fleet import Counts, fully_sampled_demo, offline_fleet, offline_tracker
from tests.integration.helpers import (
    ROOT,
    eventually,
    scrape,
)

pytestmark = pytest.mark.integration

MODEL = "digits"
SCORE = "model_detector:hookwatch_drift_fleet_score:cumulative"
BIN_SUMS = "model_detector_feature_bin:hookwatch_drift_bin_samples:sum"


def _send(stack: Stack, images: Iterable[NDArray[np.float32]]) -> int:
    sent = 0
    for image in images:
        status, reply = stack.infer({"data": image.tolist()})
        assert status == 200, reply
        sent += 1
    return sent


def _offline(
    profile: DriftProfile, config: MonitoringConfig, images: NDArray[np.float32]
) -> tuple[dict[str, float], Counts]:
    """Scores and per-bin counts of every fleet detector (tests/integration/fleet.py)."""
    return offline_fleet(profile, config, images)


def _rotated(images: NDArray[np.float32], degrees: float) -> NDArray[np.float32]:
    from scipy import ndimage

    turned = [ndimage.rotate(img[0], degrees, reshape=False, order=1)[None] for img in images]
    return np.clip(turned, 0, 16).astype(np.float32)


def test_fleet_score_in_promql_equals_the_offline_score_on_both_instances_traffic(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    require_binary("prometheus")
    store, config, profile = fully_sampled_demo(tmp_path)

    # Replica B first: replica A's Prometheus must know B's ports to scrape it as well, and
    # A's free ports are picked while B's are bound, so the two can never collide.
    b = make_stack("b", workers=1, model_store=store, scrape_interval="1s")
    b.start_torchserve()
    b.start_exporter()
    a = make_stack(
        "a",
        workers=2,
        model_store=store,
        scrape_interval="1s",
        extra_scrape_targets={
            "hookwatch": [f"127.0.0.1:{b.ports.exporter}"],
            "torchserve": [f"127.0.0.1:{b.ports.metrics}"],
        },
    )
    a.start_torchserve()
    a.start_exporter()
    a.start_prometheus()

    def both_scraped() -> None:
        up = a.query('up{job="hookwatch"} == 1')
        assert {r["metric"]["instance"] for r in up} == {
            f"127.0.0.1:{a.ports.exporter}",
            f"127.0.0.1:{b.ports.exporter}",
        }

    eventually(both_scraped, timeout=30)

    # Different traffic per replica: clean held-out digits to A, rotated ones to B.
    split = load_split()
    to_a = split.x_test[:120]
    to_b = _rotated(split.x_test[120:200], 30)
    sent = {a.ports.exporter: _send(a, to_a), b.ports.exporter: _send(b, to_b)}

    union_scores, union_counts = _offline(profile, config, np.concatenate([to_a, to_b]))
    a_scores, _ = _offline(profile, config, to_a)
    b_scores, _ = _offline(profile, config, to_b)
    # Every detector is a fleet detector by default: the output's and every layer's.
    assert set(union_scores) == set(profile.references)

    tracker = offline_tracker(profile, config)

    # Each exporter holds its own replica's counts, summed over its workers.
    def exported() -> None:
        for port, n in sent.items():
            samples = scrape(port)
            per_detector: Counter[str] = Counter()
            for (name, labels), value in samples.items():
                if name == "hookwatch_drift_bin_samples_total":
                    per_detector[dict(labels)["detector"]] += value
            for detector in union_scores:
                assert per_detector[detector] == n * len(tracker.fleet_features(detector))

    eventually(exported, timeout=30)

    # Prometheus: the recorded per-bin fleet sums are the union's counts, exactly.
    def recorded_counts() -> Counts:
        got: Counts = {}
        for r in a.query(f'{BIN_SUMS}{{model="{MODEL}"}}'):
            m = r["metric"]
            got[(m["detector"], m["feature"], m["bin"])] = float(r["value"][1])
        assert got == union_counts
        return got

    eventually(recorded_counts, timeout=30)

    # The recorded score is evaluated after the counts it reads: wait for it to follow them.
    def recorded_scores() -> dict[str, float]:
        got = {r["metric"]["detector"]: float(r["value"][1]) for r in a.query(SCORE)}
        assert set(got) == set(union_scores)
        for detector, score in union_scores.items():
            assert math.isclose(got[detector], score, rel_tol=1e-9, abs_tol=1e-12), (
                detector,
                got[detector],
                score,
            )
        return got

    fleet = eventually(recorded_scores, timeout=30)
    # The match is the union's: neither replica alone gives these scores.
    for detector, score in fleet.items():
        for alone in (a_scores[detector], b_scores[detector]):
            assert not math.isclose(score, alone, rel_tol=1e-3), (detector, score, alone)
    # The rotated digits moved the output: the fleet's softmax score is above clean levels.
    assert fleet["output"] > a_scores["output"]

    # The 10-minute variant runs too (increase() extrapolates, so only its presence is exact).
    # It has a value once its rule has met two scrapes of the counts: waited for, not assumed
    # (a CI run queried it the moment the cumulative score matched, and found none yet).
    def windowed() -> None:
        window = {
            r["metric"]["detector"]: float(r["value"][1])
            for r in a.query("model_detector:hookwatch_drift_fleet_score:increase10m")
        }
        assert set(window) == set(union_scores), sorted(window)
        assert all(math.isfinite(v) for v in window.values()), window

    eventually(windowed, timeout=30)

    # Every rule, the alerts on the recorded series included, evaluates without error.
    def healthy() -> None:
        status, body = http_get(f"http://127.0.0.1:{a.ports.prometheus}/api/v1/rules")
        assert status == 200
        rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
        names = {r["name"] for r in rules}
        assert {SCORE, "HookwatchDrift", "HookwatchFleetDrift"} <= names
        assert all(r["health"] == "ok" for r in rules), [
            (r["name"], r["health"], r.get("lastError")) for r in rules
        ]

    eventually(healthy, timeout=15)

    # Cardinality on a live scrape: the per-bin series are the profile's bins of the fleet
    # detectors, and the model's whole scrape stays within the documented bound.
    bound = series_per_model(
        demo_watched_layers(ROOT / DEMO_MODEL_CONFIG),
        fleet=demo_fleet_bins(ROOT / DEMO_MODEL_CONFIG),
    )
    base = {n: spec.name for spec in CATALOGUE for n in spec.exposed_names}
    live = Counter(
        base[name] for name, labels in scrape(a.ports.exporter) if dict(labels).get("model")
    )
    for name in FLEET_METRICS:
        assert live[name] == len(union_counts) <= bound[name], name
    assert all(live[name] <= bound[name] for name in live), (live, bound)
    assert sum(live.values()) <= sum(bound.values())
