"""One number a sample (``input.shape: []``): an item tower's id, a sensor's one reading.
A model whose forward takes ``[batch]`` could only be declared ``[1]`` before, and was given
``[batch, 1]``: its embedding came back ``[batch, 1, D]``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hookwatch._config import HandlerConfig, InputSpec
from hookwatch._errors import BadInputError
from hookwatch._service import ModelService, decode_payload
from hookwatch.tools import cli
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.unit.test_variable_length import _model_class

TOWER = '''
import torch
from torch import nn


class Tower(nn.Module):
    """An item's embedding from its id: forward(ids [batch]) -> [batch, 4]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(100, 8)
        self.proj = nn.Sequential(nn.Linear(8, 4), nn.Tanh())

    def forward(self, ids):
        assert ids.dim() == 1, f"expected ids [batch], got {list(ids.shape)}"
        return self.proj(self.emb(ids))
'''


def test_a_sample_of_one_number_is_sent_bare_or_in_a_list() -> None:
    spec = InputSpec.from_mapping({"shape": [], "dtype": "int64", "min": 0, "max": 99})
    assert spec.shape == () and spec.numel == 1
    for data in (7, [7]):
        assert decode_payload({"data": data}, spec).shape == ()
    with pytest.raises(BadInputError, match=r"2 items"):
        decode_payload({"data": [7, 8]}, spec)
    with pytest.raises(BadInputError, match=r"values in \[0, 99\], got 100$"):
        decode_payload({"data": 100}, spec)
    # Said as one number (it read "< numbers>").
    with pytest.raises(BadInputError, match=r'\{"data": <a number>\}'):
        decode_payload({"id": 7}, spec)


def test_the_model_gets_a_batch_of_numbers_and_is_watched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tower.py").write_text(TOWER)
    model = f"{tmp_path / 'tower.py'}:Tower"
    args = ["--input-shape", "", "--input-dtype", "int64"]
    assert cli.main(["layers", model, *args]) == 0
    assert "scalar" in capsys.readouterr().out
    config = tmp_path / "model-config.yaml"
    assert cli.main(["init", model, *args, "--out", str(config)]) == 0
    written = yaml.safe_load(config.read_text())
    assert written["handler"]["input"]["shape"] == []
    assert written["handler"]["input"]["max"] == 99  # the embedding's rows
    # Out of a Tanh: an embedding, not logits (proposed as logits before).
    assert written["handler"]["monitoring"]["output"] == {"head": "embedding"}
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 100, 300))
    mar = archive_model(
        ModelRef.parse(model),
        "tower",
        config,
        tmp_path / "ids.npy",
        tmp_path / "store",
        tmp_path / "build",
        say=lambda _: None,
    )
    assert mar.is_file()
    handler = HandlerConfig.from_mapping(written["handler"])
    net = _model_class(TOWER, "Tower")().eval()
    service = ModelService(net, handler.input, None, output=handler.monitoring.output)
    answers = service.handle([json.dumps({"data": i}).encode() for i in (3, 4)])
    with torch.no_grad():
        want = net(torch.tensor([3, 4]))
    for answer, row in zip(answers, want, strict=True):
        assert answer["embedding"] == pytest.approx(row.tolist(), abs=1e-6)
