"""Drifted traffic sent to the real server moves the drift metrics; clean traffic does not."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hookwatch.tools.demo.build import archive, build_reference_profile, reference_split
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.demo.digits_cnn import DigitsCNN
from hookwatch.tools.devstack import Stack
from tests.conftest import require_binary
from tests.integration.helpers import MAR, ROOT, demo_config, eventually, scrape, total

pytestmark = pytest.mark.integration

WINDOW = 50
STEP = 10


def _variant(store: Path) -> None:
    """The built demo weights with sample_rate 1.0, a small window and a matching profile."""
    with zipfile.ZipFile(MAR) as mar:
        state = torch.load(io.BytesIO(mar.read("digits_cnn.pt")), weights_only=True)
    model = DigitsCNN()
    model.load_state_dict(state)
    model.eval()
    config = demo_config(sample_rate=1.0, drift={"window": WINDOW, "step": STEP})
    store.mkdir(parents=True, exist_ok=True)
    config_path = store / "digits-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    _, x_ref, _ = reference_split(load_split())
    profile = build_reference_profile(model, config_path, x_ref, store / "build")
    archive(model, ROOT, store / "build", store, extra_files=[profile], config=config_path)


def test_drifted_traffic_raises_the_drift_metrics(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    require_binary("prometheus")
    store = tmp_path / "store"
    _variant(store)
    stack = make_stack("drift", workers=1, model_store=store, scrape_interval="1s")
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()
    split = load_split()

    def send(images: np.ndarray) -> None:
        for image in images:
            status, reply = stack.infer({"data": image.tolist()})
            assert status == 200, reply

    clean = split.x_test[:100]
    send(clean)
    verdicts = (len(clean) - WINDOW) // STEP + 1

    def clean_seen() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        samples = scrape(stack.ports.exporter)
        assert total(samples, "hookwatch_drift_profile_loaded", model="digits") == 1
        assert total(samples, "hookwatch_drift_windows_total", detector="input") == verdicts
        return samples

    samples = eventually(clean_seen)
    # Held-out digits the profile never saw: no detector alarms (the traffic is fixed, so this
    # is one deterministic draw, not a statement about the false alarm rate).
    assert total(samples, "hookwatch_drift_alarms_total") == 0
    assert total(samples, "hookwatch_drift_detected") == 0
    clean_score = total(samples, "hookwatch_drift_score", detector="input")
    threshold = total(samples, "hookwatch_drift_threshold", detector="input")
    assert 0 < clean_score < threshold

    # The same digits rotated by 45 degrees, as a camera mounted askew would send them.
    from scipy import ndimage

    rotated = np.clip(
        [ndimage.rotate(img[0], 45, reshape=False, order=1)[None] for img in clean[:WINDOW]],
        0,
        16,
    ).astype(np.float32)
    send(rotated)

    def drift_seen() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        samples = scrape(stack.ports.exporter)
        assert total(samples, "hookwatch_drift_detected", detector="input") == 1
        assert total(samples, "hookwatch_drift_alarms_total") > 0
        return samples

    samples = eventually(drift_seen)
    assert total(samples, "hookwatch_drift_score", detector="input") > 3 * clean_score
    fired = {
        dict(labels)["level"]
        for (name, labels), value in samples.items()
        if name == "hookwatch_drift_detected" and value == 1
    }
    assert {"input", "activation"} <= fired

    def in_prometheus() -> None:
        result = stack.query('max by (model) (hookwatch_drift_detected{model="digits"})')
        assert result and float(result[0]["value"][1]) == 1
        levels = stack.query('count by (level) (hookwatch_drift_score{model="digits"})')
        assert {r["metric"]["level"] for r in levels} == {
            "input",
            "activation",
            "output",
            "prediction",
        }

    eventually(in_prometheus, timeout=30)


#: Requests of clean traffic for the live false-alarm test: at the demo's sample_rate 0.5 and
#: 2 workers, about 150 verdict rounds (window 100, step 25) per worker.
CLEAN_REQUESTS = 16_000


def test_clean_held_out_traffic_through_the_live_stack_stays_near_the_calibrated_rate(
    make_stack: Callable[..., Stack],
) -> None:
    """The shipped demo .mar, as `make run` serves it (2 workers, its profile and config),
    sent the held-out test digits in shuffled passes by four clients at once."""
    from concurrent.futures import ThreadPoolExecutor

    stack = make_stack("clean", workers=2)
    stack.start_torchserve()
    stack.start_exporter()
    images = load_split().x_test
    rng = np.random.default_rng(0)
    order = np.concatenate(
        [rng.permutation(len(images)) for _ in range(CLEAN_REQUESTS // len(images) + 1)]
    )[:CLEAN_REQUESTS]
    bodies = [{"data": images[i].tolist()} for i in order]
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda body: stack.infer(body)[0], bodies))
    assert statuses.count(200) == CLEAN_REQUESTS

    def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        # Every sampled request is in: the request counter is published with the verdicts.
        samples = scrape(stack.ports.exporter)
        assert total(samples, "hookwatch_requests_total", model="digits") == CLEAN_REQUESTS
        return samples

    eventually(settled, timeout=60)
    samples = eventually(settled, timeout=60)
    detectors = {
        dict(labels)["detector"]
        for (name, labels) in samples
        if name == "hookwatch_drift_windows_total"
    }
    windows = {d: total(samples, "hookwatch_drift_windows_total", detector=d) for d in detectors}
    # Every detector judges every window, so the rounds are any one detector's verdicts.
    assert len(detectors) == 8 and len(set(windows.values())) == 1, windows
    rounds = windows["input"]
    assert rounds >= 200, rounds
    alarms = {d: total(samples, "hookwatch_drift_alarms_total", detector=d) for d in detectors}
    # Summed over detectors, the alarms bound the rounds on which any detector alarmed. The
    # thresholds are calibrated for 1 % of clean windows on average over references
    # (docs/drift.md; the shipped window of 100 measured 1.4 % in docs/eval-drift.md), and
    # overlapping windows alarm in runs of up to four verdicts, so one run's ~290 rounds cannot
    # tell 1 % from 1.5 % (a bound of 1 % failed one fresh-clone CI run in several, 5 alarms
    # in 289 rounds). 3 % still fails a live path whose features have left the profile's
    # scale, which alarms on most rounds; the rate itself is measured by `make eval-drift`.
    assert sum(alarms.values()) <= 0.03 * rounds, (alarms, rounds)
    assert total(samples, "hookwatch_drift_sequential_alarms_total") == 0
