"""Helpers for tests that run the real stack."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hookwatch.tools.demo.build import archive
from hookwatch.tools.demo.digits_cnn import DigitsCNN
from hookwatch.tools.devstack import http_get

ROOT = Path(__file__).resolve().parents[2]
MAR = ROOT / "model_store" / "digits.mar"
#: Name of the drift profile inside the demo .mar (monitoring.drift.profile's default).
PROFILE = "drift-profile.npz"


def hookwatch(
    *args: str, cwd: Path = ROOT, timeout: float = 120.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``hookwatch ARGS`` as a user runs it, in a process of its own; without the debug switch
    (tracebacks) or a run directory inherited from the test's environment."""
    base = {
        k: v for k, v in os.environ.items() if k not in ("HOOKWATCH_DEBUG", "HOOKWATCH_RUN_DIR")
    }
    return subprocess.run(
        [sys.executable, "-m", "hookwatch.tools.cli", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def demo_config(**monitoring: Any) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((ROOT / "models/digits/model-config.yaml").read_text())
    config = copy.deepcopy(config)
    config["handler"]["monitoring"].update(monitoring)
    return config


def demo_model() -> DigitsCNN:
    """The built demo CNN, with the weights inside the .mar."""
    with zipfile.ZipFile(MAR) as mar:
        state = torch.load(io.BytesIO(mar.read("digits_cnn.pt")), weights_only=True)
    model = DigitsCNN()
    model.load_state_dict(state)
    return model.eval()


def demo_profile(directory: Path) -> Path:
    """The drift profile inside the built .mar, extracted into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(MAR) as mar:
        return Path(mar.extract(PROFILE, directory))


def build_variant(
    store: Path, config: dict[str, Any], model_name: str = "digits", profile: bool = False
) -> Path:
    """Re-archive the built demo weights with another model-config into ``store``.

    With ``profile`` the .mar's drift profile goes along (it fits any config with the demo's
    layers and ``max_features``); without it the variant serves without drift detection.
    """
    model = demo_model()
    config_path = store / f"{model_name}-config.yaml"
    store.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(config))
    extra = [demo_profile(store / "profile")] if profile else None
    return archive(
        model,
        ROOT,
        store / "build",
        store,
        extra_files=extra,
        config=config_path,
        model_name=model_name,
    )


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, body[:300]
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def eventually(check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.5) -> Any:
    """Retry ``check`` until it returns without AssertionError; re-raise the last one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(interval)
