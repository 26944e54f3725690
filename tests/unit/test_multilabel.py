"""``head: multilabel``: one independent logit per label (``BCEWithLogitsLoss`` over several
labels), answered as the labels whose sigmoid is above 0.5 and every label's probability, its
drift tested per label as regression values are."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hookwatch._config import InputSpec, OutputSpec
from hookwatch._errors import ConfigError
from hookwatch._profile import DriftProfile
from hookwatch._service import ModelService
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.fakes import archived_handler, handled

MODEL = (
    "import torch\nfrom torch import nn\n\n"
    "class Tags(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.fc = nn.Linear(5, 12)\n"
    "        self.act = nn.ReLU()\n"
    "        self.out = nn.Linear(12, 4)\n\n"
    "    def forward(self, x):\n"
    "        return self.out(self.act(self.fc(x)))\n"
)


def _archive(tmp_path: Path, labels: list[str]) -> Path:
    (tmp_path / "tags.py").write_text(MODEL)
    config = tmp_path / "model-config.yaml"
    handler = {
        "input": {"shape": [5]},
        "labels": labels,
        "monitoring": {"layers": ["act"], "output": {"head": "multilabel"}},
    }
    config.write_text(yaml.safe_dump({"handler": handler}))
    rng = np.random.default_rng(0)
    np.save(tmp_path / "ref.npy", rng.normal(size=(300, 5)).astype(np.float32))
    return archive_model(
        ModelRef.parse(f"{tmp_path / 'tags.py'}:Tags"),
        "tags",
        config,
        tmp_path / "ref.npy",
        tmp_path / "store",
        tmp_path / "build",
        say=lambda _line: None,
    )


def test_the_labels_above_one_half_and_every_probability() -> None:
    model = torch.nn.Identity()
    service = ModelService(
        model,
        InputSpec(shape=(3,)),
        None,
        labels=["a", "b", "c"],
        output=OutputSpec(head="multilabel"),
    )
    (answer,) = service.handle([{"data": [2.0, -1.0, 0.5]}])
    assert answer["labels"] == ["a", "c"]
    expected = [1 / (1 + math.exp(-z)) for z in (2.0, -1.0, 0.5)]
    assert answer["probabilities"] == pytest.approx(expected, abs=1e-6)
    (none,) = service.handle([{"data": [-3.0, -1.0, -0.5]}])
    assert none["labels"] == []


def test_archived_and_served(tmp_path: Path) -> None:
    names = ["sports", "politics", "tech", "arts"]
    mar = _archive(tmp_path, names)
    with archived_handler(mar, tmp_path / "served") as (handler, context):
        profile = DriftProfile.load(tmp_path / "served" / "drift-profile.npz")
        # Tested per label, as values: no softmax-derived detectors.
        assert "output" in profile.references and "confidence" not in profile.references
        (answer,) = handled(handler, [{"body": {"data": [0.3, -1, 2, 0.5, 1]}}], context)
        assert set(answer) == {"labels", "probabilities"} and len(answer["probabilities"]) == 4
        above = [n for n, p in zip(names, answer["probabilities"], strict=True) if p > 0.5]
        assert answer["labels"] == above


def test_names_that_do_not_match_the_labels_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^handler.labels: expected 4 names \(one per label"):
        _archive(tmp_path, ["a", "b"])
