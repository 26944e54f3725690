"""Pages on harm, live: the demo served by TorchServe with a labelled reference, scraped and
evaluated by Prometheus with the package's rules. A harmless shift (brighter digits, which the
CNN still reads) moves the drift tests but pages nobody; a harmful one (inverted digits) pages
HookwatchAccuracyDrop (issue 29)."""

from __future__ import annotations

import io
import time
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


def _variant(store: Path) -> None:
    """The built demo weights, every request sampled, a profile with the reference's labels."""
    with zipfile.ZipFile(MAR) as mar:
        state = torch.load(io.BytesIO(mar.read("digits_cnn.pt")), weights_only=True)
    model = DigitsCNN()
    model.load_state_dict(state)
    model.eval()
    config = demo_config(sample_rate=1.0, drift={"window": 50, "step": 10})
    store.mkdir(parents=True, exist_ok=True)
    config_path = store / "digits-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    _, x_ref, y_ref = reference_split(load_split())
    profile = build_reference_profile(model, config_path, x_ref, store / "build", y_ref)
    archive(model, ROOT, store / "build", store, extra_files=[profile], config=config_path)


def _alerts(stack: Stack, name: str) -> list[str]:
    """States of alert ``name`` for the demo model (pending or firing), as Prometheus has them."""
    return [
        a["metric"]["alertstate"]
        for a in stack.query(f'ALERTS{{alertname="{name}", model="digits"}}')
    ]


def test_a_harmless_shift_does_not_page_and_a_harmful_one_does(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    require_binary("prometheus")
    store = tmp_path / "store"
    _variant(store)
    stack = make_stack("harm", workers=1, model_store=store, scrape_interval="1s")
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()
    split = load_split()

    # Prometheus first sees every series at its declared zero: increase() needs the step.
    def declared() -> None:
        assert stack.query('hookwatch_reference_accuracy{model="digits"}')
        assert stack.query('hookwatch_drift_sequential_alarms_total{model="digits"}')

    eventually(declared, timeout=60)
    time.sleep(2.0)

    def send(images: np.ndarray) -> int:
        right = 0
        for image, label in zip(images, split.y_test, strict=False):
            status, reply = stack.infer({"data": image.tolist()})
            assert status == 200, reply
            right += int(reply["class"] == int(label))
        return right

    # Harmless: brighter digits (+2 of 16, clipped), read about as well as clean ones.
    brighter = np.clip(split.x_test + 2.0, 0.0, 16.0).astype(np.float32)
    correct = send(brighter)
    assert correct / len(brighter) > 0.95

    def judged() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        samples = scrape(stack.ports.exporter)
        assert total(samples, "hookwatch_estimate_samples_total", model="digits") == len(brighter)
        return samples

    samples = eventually(judged, timeout=60)
    assert total(samples, "hookwatch_reference_accuracy", model="digits") > 0.95
    assert total(samples, "hookwatch_accuracy_drop_alarms_total", model="digits") == 0
    drift_alarms = total(samples, "hookwatch_drift_sequential_alarms_total", model="digits")
    assert drift_alarms > 0, "the harmless shift should move the drift tests"

    # Prometheus has the alarms: drift warns for this model, and pages nobody.
    def warned() -> None:
        assert _alerts(stack, "HookwatchDriftWarning"), "expected a drift warning"

    eventually(warned, timeout=60)
    assert _alerts(stack, "HookwatchDrift") == []
    assert _alerts(stack, "HookwatchAccuracyDrop") == []

    # Harmful: inverted digits, which the CNN gets almost all wrong.
    inverted = np.clip(16.0 - split.x_test[:200], 0.0, 16.0).astype(np.float32)
    assert send(inverted) / len(inverted) < 0.2

    def paged() -> None:
        samples = scrape(stack.ports.exporter)
        assert total(samples, "hookwatch_accuracy_drop_alarms_total", model="digits") > 0
        assert total(samples, "hookwatch_estimated_accuracy", model="digits") < 0.5
        # Pending for its `for: 1m`, then firing: the page is decided.
        assert _alerts(stack, "HookwatchAccuracyDrop"), "expected HookwatchAccuracyDrop"

    eventually(paged, timeout=60)
    assert _alerts(stack, "HookwatchDrift") == []
