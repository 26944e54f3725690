"""Three replicas on one machine: three TorchServe + exporter pairs on loopback, one Prometheus
with the shipped rules scraping all three (issue 30, item 4).

Clean digits to every replica raise no page; rotated digits sent to one replica move the fleet
score of a hidden layer, which equals the score computed offline on the union of the three
streams with the same code (tests/integration/fleet.py); one replica stopped and started again
resets its counters, and the fleet's counts and scores over the last 10 minutes (``increase``)
stay those of the union of everything sent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import Stack
from tests.conftest import require_binary
from tests.integration.fleet import Counts, fully_sampled_demo, offline_fleet
from tests.integration.helpers import eventually

pytestmark = pytest.mark.integration

MODEL = "digits"
LAYER = "act2"
CUMULATIVE = "model_detector:hookwatch_drift_fleet_score:cumulative"
WINDOW = "model_detector:hookwatch_drift_fleet_score:increase10m"
BIN_SUMS = "model_detector_feature_bin:hookwatch_drift_bin_samples:sum"
BIN_WINDOW = "model_detector_feature_bin:hookwatch_drift_bin_samples:increase10m"
PAGE = "model_detector:hookwatch_drift_fleet_page:ratio10m"


def _send(stack: Stack, images: Iterable[NDArray[np.float32]]) -> None:
    for image in images:
        status, reply = stack.infer({"data": image.tolist()})
        assert status == 200, reply


def _rotated(images: NDArray[np.float32], degrees: float) -> NDArray[np.float32]:
    from scipy import ndimage

    turned = [ndimage.rotate(img[0], degrees, reshape=False, order=1)[None] for img in images]
    return np.clip(turned, 0, 16).astype(np.float32)


def _counts(stack: Stack, rule: str, detector: str) -> Counts:
    got: Counts = {}
    for r in stack.query(f'{rule}{{model="{MODEL}", detector="{detector}"}}'):
        m = r["metric"]
        got[(m["detector"], m["feature"], m["bin"])] = float(r["value"][1])
    return got


def _only(counts: Counts, detector: str) -> Counts:
    return {k: v for k, v in counts.items() if k[0] == detector}


def _reset_corrected(stack: Stack, detector: str, minutes: int) -> Counts:
    """Per bin, the fleet's samples from Prometheus' raw samples, every counter reset counted
    as ``increase`` counts it (a drop starts the counter again from 0), without extrapolation."""
    selector = f'hookwatch_drift_bin_samples_total{{model="{MODEL}", detector="{detector}"}}'
    totals: Counts = {}
    for r in stack.query(f"{selector}[{minutes}m]"):
        m = r["metric"]
        values = [float(v) for _, v in r["values"]]
        total, previous = values[0], values[0]
        for v in values[1:]:
            total += v if v < previous else v - previous
            previous = v
        key = (m["detector"], m["feature"], m["bin"])
        totals[key] = totals.get(key, 0.0) + total
    return totals


def test_three_replicas_one_prometheus_shift_restart_and_no_false_page(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    require_binary("prometheus")
    store, config, profile = fully_sampled_demo(tmp_path)

    # Replicas B and C first: A's Prometheus scrapes them too, and A's free ports are picked
    # while theirs are bound, so none collide. One worker each: three JVMs on two cores.
    b = make_stack("b", workers=1, model_store=store, scrape_interval="1s")
    c = make_stack("c", workers=1, model_store=store, scrape_interval="1s")
    for replica in (b, c):
        replica.start_torchserve()
        replica.start_exporter()
    a = make_stack(
        "a",
        workers=1,
        model_store=store,
        scrape_interval="1s",
        extra_scrape_targets={
            "hookwatch": [f"127.0.0.1:{r.ports.exporter}" for r in (b, c)],
            "torchserve": [f"127.0.0.1:{r.ports.metrics}" for r in (b, c)],
        },
    )
    a.start_torchserve()
    a.start_exporter()
    a.start_prometheus()
    exporters = {f"127.0.0.1:{r.ports.exporter}" for r in (a, b, c)}

    def all_scraped() -> None:
        up = a.query('up{job="hookwatch"} == 1')
        assert {r["metric"]["instance"] for r in up} == exporters

    eventually(all_scraped, timeout=30)

    split = load_split()
    clean = split.x_test
    sent: list[NDArray[np.float32]] = []

    # 1. Clean digits to every replica: the fleet's counts are the union's, no page.
    for replica, images in zip((a, b, c), (clean[:50], clean[50:100], clean[100:150]), strict=True):
        _send(replica, images)
        sent.append(images)
    union_scores, union_counts = offline_fleet(profile, config, np.concatenate(sent))
    assert LAYER in union_scores

    def recorded_clean() -> None:
        assert _counts(a, BIN_SUMS, LAYER) == _only(union_counts, LAYER)
        got = {r["metric"]["detector"]: float(r["value"][1]) for r in a.query(CUMULATIVE)}
        assert math.isclose(got[LAYER], union_scores[LAYER], rel_tol=1e-9)
        # The page's ratio is judged (150 samples >= drift.window) and below 1 everywhere.
        ratios = {r["metric"]["detector"]: float(r["value"][1]) for r in a.query(PAGE)}
        assert set(ratios) == set(union_scores), ratios
        assert all(v < 1 for v in ratios.values()), ratios

    eventually(recorded_clean, timeout=30)
    # No page pending or firing on clean traffic (the alert reads the ratio checked above).
    assert a.query('ALERTS{alertname="HookwatchDrift"}') == []
    clean_score = union_scores[LAYER]

    # 2. Rotated digits to replica C only: the hidden layer's fleet score moves, and equals
    # the offline score on the union of the three streams.
    shifted = _rotated(clean[150:230], 30)
    _send(c, shifted)
    sent.append(shifted)
    union_scores, union_counts = offline_fleet(profile, config, np.concatenate(sent))
    assert union_scores[LAYER] > clean_score

    def recorded_shift() -> None:
        assert _counts(a, BIN_SUMS, LAYER) == _only(union_counts, LAYER)
        got = {r["metric"]["detector"]: float(r["value"][1]) for r in a.query(CUMULATIVE)}
        assert set(got) == set(union_scores)
        for detector, score in union_scores.items():
            assert math.isclose(got[detector], score, rel_tol=1e-9, abs_tol=1e-12), detector

    eventually(recorded_shift, timeout=30)

    # 3. Replica B stopped and started again (its counters start from 0), then more clean
    # digits to it: the last 10 minutes' fleet counts (increase: resets handled) remain the
    # union of everything sent, and so does its score.
    b.stop()
    b.start_torchserve()
    b.start_exporter()
    # Prometheus sees the restarted replica's counters at 0 before new samples arrive, so a
    # reset shows as a drop (as it does when a pod restarts between scrapes of a real fleet,
    # unless it counts past its old values first).
    a.await_scrape(time.time() + 1, timeout=30)
    more = clean[230:270]
    _send(b, more)
    sent.append(more)
    union_scores, union_counts = offline_fleet(profile, config, np.concatenate(sent))
    expected = _only(union_counts, LAYER)

    def continuous() -> None:
        # Exact: Prometheus' raw samples, each reset counted as increase() counts it.
        assert _reset_corrected(a, LAYER, 10) == expected
        # The plain sums drop by B's counts before the restart: why the rules use increase().
        assert sum(_counts(a, BIN_SUMS, LAYER).values()) < sum(expected.values())
        # increase() extrapolates to the range's edges: within a few per cent.
        window = _counts(a, BIN_WINDOW, LAYER)
        assert set(window) == set(expected)
        total = sum(expected.values())
        assert abs(sum(window.values()) - total) <= 0.03 * total, (sum(window.values()), total)
        got = {r["metric"]["detector"]: float(r["value"][1]) for r in a.query(WINDOW)}
        assert math.isclose(got[LAYER], union_scores[LAYER], rel_tol=0.1), (
            got[LAYER],
            union_scores[LAYER],
        )

    eventually(continuous, timeout=45)
