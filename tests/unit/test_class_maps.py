"""A segmentation net's class map ``[batch, classes, height, width]`` under ``head: logits``:
answered per pixel (``[H][W]`` classes and probabilities), watched per pixel as per-position
logits are (class shares, mean confidence and entropy over the pixels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hookwatch._config import HandlerConfig, InputSpec, OutputSpec
from hookwatch._errors import ConfigError
from hookwatch._metrics import MetricSet
from hookwatch._profile import DriftProfile, build_profile
from hookwatch._service import ModelService
from hookwatch.tools import own_model
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.fakes import archived_handler, handled
from tests.unit.test_any_model import monitored, value

MODEL = (
    "import torch\nfrom torch import nn\n\n"
    "class Seg(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())\n"
    "        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)\n\n"
    "    def forward(self, x):\n"
    "        return self.up(self.down(x))\n"
)


def test_each_pixel_is_answered_with_its_class_and_probability() -> None:
    service = ModelService(
        torch.nn.Identity(),
        InputSpec(shape=(3, 2, 2)),
        None,
        labels=["sky", "road", "car"],
        output=OutputSpec(head="logits"),
    )
    logits = [[[5.0, 0.0], [0.0, 0.0]], [[0.0, 5.0], [0.0, 0.0]], [[0.0, 0.0], [5, 0]]]
    (answer,) = service.handle([{"data": logits}])
    assert answer["classes"] == [["sky", "road"], ["car", "sky"]]
    assert answer["confidence"][0][0] == pytest.approx(np.exp(5) / (np.exp(5) + 2), abs=1e-6)
    assert answer["confidence"][1][1] == pytest.approx(1 / 3, abs=1e-6)
    # A pixel holding NaN has no class: null there, the others answered.
    row = torch.tensor(logits)
    row[0, 1, 1] = float("nan")
    mapped = service._map_answer(row)
    assert mapped["classes"] == [["sky", "road"], ["car", None]]
    assert mapped["confidence"][1][1] is None


def _archive(tmp_path: Path, labels: list[str] | None = None) -> Path:
    (tmp_path / "seg.py").write_text(MODEL)
    config = tmp_path / "model-config.yaml"
    handler: dict[str, object] = {
        "input": {"shape": [3, 16, 16]},
        "monitoring": {"layers": ["down.1"], "output": {"head": "logits"}, "sample_rate": 1.0},
    }
    if labels is not None:
        handler["labels"] = labels
    config.write_text(yaml.safe_dump({"handler": handler}))
    rng = np.random.default_rng(0)
    np.save(tmp_path / "ref.npy", rng.random((120, 3, 16, 16)).astype(np.float32))
    return archive_model(
        ModelRef.parse(f"{tmp_path / 'seg.py'}:Seg"),
        "seg",
        config,
        tmp_path / "ref.npy",
        tmp_path / "store",
        tmp_path / "build",
        say=lambda _line: None,
    )


def test_archived_and_served_per_pixel(tmp_path: Path) -> None:
    mar = _archive(tmp_path, ["a", "b", "c", "d"])
    with archived_handler(mar, tmp_path / "served") as (handler, context):
        profile = DriftProfile.load(tmp_path / "served" / "drift-profile.npz")
        assert profile.positions
        assert {"output", "confidence", "entropy", "class_mix"} <= set(profile.references)
        image = np.random.default_rng(1).random((3, 16, 16)).round(3).tolist()
        answers = handled(handler, [{"body": {"data": image}}] * 3, context)
        classes = answers[0]["classes"]
        assert len(classes) == 16 and all(len(row) == 16 for row in classes)
        assert {c for row in classes for c in row} <= {"a", "b", "c", "d"}
        monitor = handler.service.monitor
        monitor.flush()
        counts = monitor._counts()
        assert counts.requests == 3 and not counts.rejected
        faults = handler.service.monitor._gate.hook_faults()
        assert not faults, faults


def test_every_sampled_map_is_captured_and_tested_for_drift(metrics: MetricSet) -> None:
    namespace: dict[str, object] = {}
    exec(compile(MODEL, "seg.py", "exec"), namespace)
    model = namespace["Seg"]().eval()  # type: ignore[operator]
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [3, 16, 16]},
            "monitoring": {
                "layers": ["down.1"],
                "sample_rate": 1.0,
                "output": {"head": "logits"},
                "drift": {"window": 20},
            },
        }
    )
    rng = np.random.default_rng(2)
    reference = [torch.from_numpy(rng.random((40, 3, 16, 16), dtype=np.float32)) for _ in range(3)]
    profile = build_profile(model, handler.monitoring, reference, "s")
    service, monitor = monitored(model, handler, profile, "s", metrics)
    image = rng.random((3, 16, 16)).round(3).tolist()
    answers = service.handle([{"data": image}] * 45)
    monitor.flush()
    monitor.close()
    assert all(len(a["classes"]) == 16 for a in answers)
    for layer in ("input", "down.1", "output"):
        assert value(metrics, "hookwatch_captures_total", model="s", layer=layer) == 45
        assert value(metrics, "hookwatch_monitor_faults_total", model="s", layer=layer) == 0
    for detector in ("output", "confidence", "entropy", "class_mix"):
        windows = value(
            metrics,
            "hookwatch_drift_windows_total",
            model="s",
            detector=detector,
            level="output" if detector == "output" else "prediction",
        )
        assert windows >= 2, detector


def test_labels_name_the_map_s_classes_its_first_dimension(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"expected 4 names \(one per class"):
        _archive(tmp_path, ["a", "b"])


def test_init_proposes_logits_for_a_map_over_the_input_s_pixels(tmp_path: Path) -> None:
    (tmp_path / "seg.py").write_text(MODEL)
    model, _ = own_model.load_user_model(ModelRef.parse(f"{tmp_path / 'seg.py'}:Seg"), None)
    rows = own_model.discover_layers(model, torch.zeros(2, 3, 16, 16))
    assert own_model.guess_head(rows) == "logits"
    written = own_model.init_config(rows, (3, 16, 16), "float32", None, "seg.py:Seg")
    assert "a class map" in written and "output: {head: logits}" in written
    # An image out (a denoiser's, ending in a sigmoid) is not a class map.
    denoiser = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 3, 3, padding=1), torch.nn.Sigmoid()
    )
    rows = own_model.discover_layers(denoiser, torch.zeros(2, 3, 16, 16))
    assert own_model.guess_head(rows) == "embedding"
    # A feature map of another size (an encoder's) stays an embedding.
    encoder = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    assert own_model.guess_head(own_model.discover_layers(encoder, torch.zeros(2, 3, 16, 16))) == (
        "embedding"
    )
