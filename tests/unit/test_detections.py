"""A detector's output: one dict of tensors a sample (``boxes``, ``scores``, ``labels``, as
torchvision's detectors answer), a varying number of rows each. Each request was answered with
a row of the first image's boxes (the first tensor read as if batch-first); it is now answered
with its own sample's dict, and watched per sample by each entry's count and mean (how many
objects, how sure), one drift detector under ``head: values``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from hookwatch._config import HandlerConfig, InputSpec, OutputSpec
from hookwatch._errors import ConfigError
from hookwatch._hooks import per_sample_items, per_sample_summary, select_tensor
from hookwatch._metrics import MetricSet
from hookwatch._profile import build_profile
from hookwatch._service import ModelService, _items_answer
from hookwatch.tools import own_model
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.unit.test_any_model import monitored, value

MODEL = (
    "import torch\nfrom torch import nn\n\n"
    "class Detector(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())\n"
    "        self.cls = nn.Conv2d(8, 3, 1)\n"
    "        self.box = nn.Conv2d(8, 4, 1)\n\n"
    "    def forward(self, x):\n"
    "        f = self.backbone(x)\n"
    "        scores = self.cls(f).sigmoid().flatten(2)\n"
    "        boxes = self.box(f).flatten(2).transpose(1, 2)\n"
    "        out = []\n"
    "        for i in range(x.shape[0]):\n"
    "            best, labels = scores[i].max(0)\n"
    "            keep = best > 0.5\n"
    "            kept = {'boxes': boxes[i][keep], 'scores': best[keep]}\n"
    "            out.append({**kept, 'labels': labels[keep]})\n"
    "        return out\n"
)


class Fixed(torch.nn.Module):
    """Answers sample i with i boxes, scores i/10 and labels i (the input's first value)."""

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        out = []
        for row in x:
            n = int(row[0])
            out.append(
                {
                    "boxes": torch.full((n, 4), float(n)),
                    "scores": torch.full((n,), n / 10),
                    "labels": torch.full((n,), n, dtype=torch.int64),
                }
            )
        return out


def _detector() -> torch.nn.Module:
    namespace: dict[str, object] = {}
    exec(compile(MODEL, "det.py", "exec"), namespace)
    model: torch.nn.Module = namespace["Detector"]().eval()  # type: ignore[operator]
    return model


def _archive(tmp_path: Path, model: str, shape: list[int], monitoring: dict[str, Any]) -> Path:
    """``hookwatch archive`` of ``model`` (``file.py:Name`` in ``tmp_path``) with this input
    shape and monitoring section, on 40 random reference samples."""
    config = tmp_path / "model-config.yaml"
    config.write_text(
        yaml.safe_dump({"handler": {"input": {"shape": shape}, "monitoring": monitoring}})
    )
    np.save(tmp_path / "ref.npy", np.random.default_rng(0).random((40, *shape), dtype=np.float32))
    return archive_model(
        ModelRef.parse(str(tmp_path / model)),
        "model",
        config,
        tmp_path / "ref.npy",
        tmp_path / "store",
        tmp_path / "build",
        say=lambda _line: None,
    )


def test_each_request_is_answered_with_its_own_sample_s_dict() -> None:
    service = ModelService(Fixed(), InputSpec(shape=(1,)), None, output=OutputSpec(head="values"))
    answers = service.handle([{"data": [2]}, {"data": [0]}, {"data": [1]}])
    assert answers[0] == {
        "boxes": [[2.0] * 4, [2.0] * 4],
        "scores": [pytest.approx(0.2)] * 2,
        "labels": [2, 2],
    }
    assert answers[1] == {"boxes": [], "scores": [], "labels": []}
    assert answers[2]["labels"] == [1] and len(answers[2]["boxes"]) == 1
    # A non-finite score is null in valid JSON; the other entries as they were.
    broken = {"scores": torch.tensor([0.5, math.nan]), "labels": torch.tensor([1, 2])}
    assert _items_answer(broken) == {"scores": [0.5, None], "labels": [1, 2]}


def test_per_sample_dicts_are_read_as_each_entry_s_count_and_mean() -> None:
    items = Fixed()(torch.tensor([[3.0], [0.0]]))
    assert per_sample_items(items)
    assert not per_sample_items((torch.zeros(2, 3), torch.zeros(2, 3)))  # a batch-first tuple
    assert not per_sample_items([])
    summary = select_tensor(items)
    assert summary is not None
    torch.testing.assert_close(
        summary, torch.tensor([[3.0, 3.0, 3.0, 0.3, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    )
    torch.testing.assert_close(
        select_tensor(items, "scores"), torch.tensor([[3.0, 0.3], [0.0, 0.0]])
    )
    missing = per_sample_summary([{"scores": torch.ones(2)}, {"other": torch.ones(1)}])
    assert missing[0].tolist() == [2.0, 1.0] and all(math.isnan(v) for v in missing[1].tolist())


def _served(
    model: torch.nn.Module, monitoring: dict[str, Any], metrics: MetricSet, name: str
) -> tuple[list[Any], Any]:
    """45 random 3x8x8 images through ``model`` monitored at every request (its profile from
    120 others, which must test the output): the answers, and the model's own outputs."""
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [3, 8, 8]},
            "monitoring": {**monitoring, "sample_rate": 1.0, "drift": {"window": 20}},
        }
    )
    rng = np.random.default_rng(0)
    reference = [torch.from_numpy(rng.random((40, 3, 8, 8), dtype=np.float32)) for _ in range(3)]
    profile = build_profile(model, handler.monitoring, reference, name)
    assert "output" in profile.references and not profile.left_out
    service, monitor = monitored(model, handler, profile, name, metrics)
    images = rng.random((45, 3, 8, 8)).round(3)
    answers = service.handle([{"data": image.tolist()} for image in images])
    monitor.flush()
    monitor.close()
    with torch.inference_mode():
        expected = model(torch.tensor(images, dtype=torch.float32))
    return answers, expected


def test_a_detector_is_served_and_its_detections_tested_for_drift(metrics: MetricSet) -> None:
    model = _detector()
    monitoring = {"layers": ["backbone.1"], "output": {"head": "values"}}
    answers, expected = _served(model, monitoring, metrics, "d")
    for answer, sample in zip(answers, expected, strict=True):
        assert answer["labels"] == sample["labels"].tolist()
        assert len(answer["boxes"]) == len(sample["boxes"])
    assert any(answer["labels"] for answer in answers)  # some detections, so a real check
    assert value(metrics, "hookwatch_captures_total", model="d", layer="output") == 45
    assert value(metrics, "hookwatch_monitor_faults_total", model="d", layer="output") == 0
    windows = value(
        metrics, "hookwatch_drift_windows_total", model="d", detector="output", level="output"
    )
    assert windows >= 2


def test_init_proposes_values_and_archive_refuses_a_class_head(tmp_path: Path) -> None:
    (tmp_path / "det.py").write_text(MODEL)
    model, _ = own_model.load_user_model(ModelRef.parse(f"{tmp_path / 'det.py'}:Detector"), None)
    rows = own_model.discover_layers(model, torch.rand(2, 3, 8, 8))
    assert rows[-1].items == ("boxes", "scores", "labels")
    assert rows[-1].shapes == ((2, 6),) and rows[-1].features == 6
    assert own_model.guess_head(rows) == "values"
    written = own_model.init_config(rows, (3, 8, 8), "float32", None, "det.py:Detector")
    assert "one dict a sample (boxes, scores, labels" in written
    assert "output: {head: values}" in written and "classes' logits" not in written
    monitoring = {"layers": ["backbone.1"], "output": {"head": "logits"}}
    with pytest.raises(ConfigError, match=r"expected values \(or none\) for an output of one dict"):
        _archive(tmp_path, "det.py:Detector", [3, 8, 8], monitoring)


FLAT_MODEL = (
    "import torch\nfrom torch import nn\n\n"
    "class Flat(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.proj = nn.Linear(4, 3)\n\n"
    "    def forward(self, x):\n"
    "        return self.proj(x).reshape(-1, 3)  # [batch x 5 positions, 3]\n"
)


def test_an_output_without_a_row_per_sample_is_refused_not_misanswered(tmp_path: Path) -> None:
    """Answers go out row i to request i: a flattened ``[batch x positions, C]`` would answer
    each request with another's rows. `archive` refuses it, saying how to fix it; a worker
    fails such a batch rather than answer it. A sequence-first ``[T, B, H]`` under any head
    is answered batch-first (only logits heads were: an embedding got time steps)."""
    (tmp_path / "flat.py").write_text(FLAT_MODEL)
    monitoring = {"layers": [], "output": {"head": "embedding"}}
    with pytest.raises(ConfigError, match=r"expected a row per sample, got shape \[10, 3\]"):
        _archive(tmp_path, "flat.py:Flat", [5, 4], monitoring)
    flat = ModelService(
        torch.nn.Flatten(0, 1), InputSpec(shape=(2, 3)), None, output=OutputSpec(head="values")
    )
    with pytest.raises(RuntimeError, match=r"a row per sample \(2\), got shape \[4, 3\]"):
        flat.handle([{"data": [[1, 2, 3], [4, 5, 6]]}] * 2)

    class SequenceFirst(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.transpose(0, 1)  # [B, T, H] -> [T, B, H]

    service = ModelService(
        SequenceFirst(), InputSpec(shape=(3, 2)), None, output=OutputSpec(head="embedding")
    )
    rows = [[[float(i), float(i)]] * 3 for i in range(2)]
    answers = service.handle([{"data": row} for row in rows])
    # Each sample's [3, 2] rows, nested as they are.
    assert [a["embedding"] for a in answers] == [[[0.0] * 2] * 3, [[1.0] * 2] * 3]


ROWS_MODEL = (
    "import torch\nfrom torch import nn\n\n"
    "class Rows(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())\n"
    "        self.head = nn.Conv2d(8, 6, 1)\n\n"
    "    def forward(self, x):\n"
    "        rows = self.head(self.backbone(x)).flatten(2).transpose(1, 2)\n"
    "        # [x1, y1, x2, y2, score, class] rows kept by score: a varying count a sample.\n"
    "        return [r[r[:, 4].sigmoid() > 0.5] for r in rows]\n"
)


class FixedRows(torch.nn.Module):
    """Answers sample i with n rows of 6 values n (n the input's first value)."""

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [torch.full((int(row[0]), 6), float(row[0])) for row in x]


def test_a_list_of_one_tensor_a_sample_is_answered_and_watched_per_sample(
    metrics: MetricSet, tmp_path: Path
) -> None:
    """A detector that answers its rows after NMS as a list of ``[N_i, 6]`` tensors (found by
    an outside run, 2026-12-07: refused as "expected a row per sample, got shape [64, 6]",
    the first image's rows read as a batch). Declared as ``output.items`` (a list's length
    cannot tell a batch's samples from several outputs), each request is answered its own
    rows, an empty one too, and watched by its row count and mean."""
    spec = OutputSpec(head="values", items="detections")
    service = ModelService(FixedRows(), InputSpec(shape=(1,)), None, output=spec)
    answers = service.handle([{"data": [2]}, {"data": [0]}, {"data": [1]}])
    assert answers == [
        {"detections": [[2.0] * 6, [2.0] * 6]},
        {"detections": []},
        {"detections": [[1.0] * 6]},
    ]
    with pytest.raises(ConfigError, match="expected head values"):
        OutputSpec(head="logits", items="detections")
    with pytest.raises(ConfigError, match="expected null"):
        OutputSpec(head="values", items="detections", select=0)
    # init proposes it from the dry run; archive holds the output to it.
    (tmp_path / "rows.py").write_text(ROWS_MODEL)
    model, _ = own_model.load_user_model(ModelRef.parse(f"{tmp_path / 'rows.py'}:Rows"), None)
    rows = own_model.discover_layers(model, torch.rand(2, 3, 8, 8))
    assert rows[-1].listed and rows[-1].items == ("detections",)
    written = own_model.init_config(rows, (3, 8, 8), "float32", None, "rows.py:Rows")
    assert "output: {head: values, items: detections}" in written
    monitoring = yaml.safe_load(written)["handler"]["monitoring"]
    assert _archive(tmp_path, "rows.py:Rows", [3, 8, 8], monitoring).is_file()
    flat = tmp_path / "flat"  # a directory of its own: rows.py is imported in this process
    flat.mkdir()
    (flat / "flat.py").write_text(FLAT_MODEL)
    items = {"layers": [], "output": {"head": "values", "items": "detections"}}
    with pytest.raises(ConfigError, match=r"one tensor a sample \(2 tensors for .* got Tensor"):
        _archive(flat, "flat.py:Flat", [5, 4], items)
    with pytest.raises(ConfigError, match=r"expected a row per sample.*output.items"):
        _archive(tmp_path, "rows.py:Rows", [3, 8, 8], {**monitoring, "output": {"head": "values"}})
    # Served monitored: every sampled request's rows captured, drift tested.
    answers, expected = _served(model, monitoring, metrics, "r")
    for answer, sample in zip(answers, expected, strict=True):
        assert len(answer["detections"]) == len(sample)
    assert {len(a["detections"]) for a in answers} != {0}  # some rows, so a real check
    assert value(metrics, "hookwatch_captures_total", model="r", layer="output") == 45
    assert value(metrics, "hookwatch_monitor_faults_total", model="r", layer="output") == 0
