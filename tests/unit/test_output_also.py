"""A multi-task model's other heads answered beside the watched one (``output.also``).

A model answering ``{"churn": logits, "spend": value}`` was served its first head only: the
client lost the spend it asked the model for. ``also`` names the parts answered beside the
head's answer, each request its own sample's values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from hookwatch._config import HandlerConfig, OutputSpec
from hookwatch._errors import ConfigError
from hookwatch._service import ModelService
from hookwatch.tools import own_model
from hookwatch.tools.own_model import ModelRef, archive_model

MODEL = '''
import torch
from torch import nn


class MultiTask(nn.Module):
    """Churn logits (2 classes), expected spend (a value a sample) and 3 segment scores."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.churn = nn.Linear(16, 2)
        self.spend = nn.Linear(16, 1)
        self.segment = nn.Linear(16, 3)

    def forward(self, x):
        h = self.body(x)
        if bool((x > 1e6).any()):
            raise ValueError("a value past what the model was trained on")
        return {
            "churn": self.churn(h),
            "spend": self.spend(h).squeeze(-1),
            "segment": self.segment(h),
            "batch_mean": h.mean(),
        }
'''


def _model(tmp_path: Path) -> tuple[nn.Module, ModelRef]:
    (tmp_path / "multitask.py").write_text(MODEL)
    ref = ModelRef.parse(f"{tmp_path / 'multitask.py'}:MultiTask")
    model, _ = own_model.load_user_model(ref, None)
    return model.eval(), ref


def _service(model: nn.Module, also: list[str]) -> ModelService:
    handler = HandlerConfig.from_mapping(
        {"input": {"shape": [6]}, "monitoring": {"layers": [], "output": {"also": also}}}
    )
    return ModelService(model, handler.input, None, output=handler.monitoring.output)


def test_the_config_names_parts_other_than_the_answer_and_its_keys() -> None:
    assert OutputSpec.from_mapping({"also": ["spend", 1]}).also == ("spend", 1)
    refused = {
        "each once": {"also": ["spend", "spend"]},
        "other than the one watched": {"select": "spend", "also": ["spend"]},
        "keys other than the answer's own": {"also": ["probabilities"]},
        "none beside items": {"head": "values", "items": "detections", "also": ["x"]},
    }
    for message, raw in refused.items():
        with pytest.raises(ConfigError, match=message):
            OutputSpec.from_mapping(raw)


def test_each_request_is_answered_its_own_other_heads(tmp_path: Path) -> None:
    model, _ = _model(tmp_path)
    service = _service(model, ["spend", "segment"])
    rows = torch.randn(3, 6)
    with torch.no_grad():
        want = model(rows)
    answers = service.handle([json.dumps({"data": r.tolist()}).encode() for r in rows])
    for i, answer in enumerate(answers):
        assert set(answer) == {"class", "probabilities", "spend", "segment"}
        assert answer["spend"] == pytest.approx(float(want["spend"][i]), abs=1e-5)
        assert answer["segment"] == pytest.approx(want["segment"][i].tolist(), abs=1e-5)
    # A batch whose forward raises runs each request alone: the others keep their parts.
    bad = [0.0] * 5 + [1e7]
    answers = service.handle(
        [json.dumps({"data": rows[0].tolist()}).encode(), json.dumps({"data": bad}).encode()]
    )
    assert answers[0]["spend"] == pytest.approx(float(want["spend"][0]), abs=1e-5)
    assert answers[1]["code"] == 422


def test_archive_refuses_a_part_missing_or_without_a_row_per_sample(tmp_path: Path) -> None:
    _, ref = _model(tmp_path)
    np.save(tmp_path / "ref.npy", np.random.default_rng(0).normal(size=(64, 6)).astype("f4"))
    for also, message in (
        (["price"], r"expected 'price' to pick a tensor .* got none \(its tensors' keys"),
        (["batch_mean"], r"expected 'batch_mean' .* a row per sample \(2 for the dry run\)"),
    ):
        config = tmp_path / "model-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "handler": {
                        "input": {"shape": [6]},
                        "monitoring": {"layers": ["body.1"], "output": {"also": also}},
                    }
                }
            )
        )
        with pytest.raises(ConfigError, match=message):
            archive_model(
                ref,
                "mt",
                config,
                tmp_path / "ref.npy",
                tmp_path / "store",
                tmp_path / "build",
                say=lambda _: None,
            )


def test_init_proposes_the_small_parts_of_a_row_per_sample(tmp_path: Path) -> None:
    model, _ = _model(tmp_path)
    rows = own_model.discover_layers(model, torch.randn(2, 6))
    written = own_model.init_config(rows, (6,), "float32", None, "multitask.py:MultiTask")
    output = yaml.safe_load(written)["handler"]["monitoring"]["output"]
    # The churn head watched; spend and segment answered; a batch-wide scalar is no sample's.
    assert output == {"head": "logits", "also": ["spend", "segment"]}
    assert "select: spend" in written
    HandlerConfig.from_mapping(yaml.safe_load(written)["handler"])


class Pair(NamedTuple):
    logits: torch.Tensor
    score: torch.Tensor


class NamedOut(nn.Module):
    """A named tuple's output: its parts are named by their fields, not their positions."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.body = nn.Linear(6, 4)
        self.score = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> Pair:
        h = self.body(x)
        return Pair(h, self.score(h))


def test_a_named_tuple_s_parts_are_its_fields() -> None:
    model = NamedOut().eval()
    rows = own_model.discover_layers(model, torch.randn(2, 6))
    written = own_model.init_config(rows, (6,), "float32", None, "named.py:NamedOut")
    assert "(logits: 4; score: 1): the head reads logits" in written
    output = yaml.safe_load(written)["handler"]["monitoring"]["output"]
    assert output["also"] == ["score"]
    x = torch.randn(6)
    with torch.no_grad():
        want = float(model(x[None]).score[0, 0])
    answer = _service(model, ["score"]).handle([json.dumps({"data": x.tolist()}).encode()])[0]
    assert answer["score"] == pytest.approx([want], abs=1e-5)
