"""``hookwatch archive`` of a model whose state_dict is not all tensors (quantize_dynamic's
packed int8 parameters): a worker loads weights as tensors only, so the archive ships none
when the factory rebuilds the same model, and says why in one line when it does not.

Found by an outside run of the built wheel (2026-11-27): such an archive was written with a
weights.pt that every worker then refused to load."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hookwatch._errors import ConfigError
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.fakes import FakeContext, handled, load_handler

# torch warns that its quantized tensors and torch.ao.quantization are deprecated: the models
# users serve today still use them.
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MODEL = """
import torch
from torch import nn


class Intent(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 8)
        self.lstm = nn.LSTM(8, 12, batch_first=True)
        self.act = nn.ReLU()
        self.out = nn.Linear(12, 3)

    def forward(self, tokens):
        seq, _ = self.lstm(self.emb(tokens))
        return self.out(self.act(seq[:, -1]))


def build():
    {seed}
    {read}
    model = Intent().eval()
    return torch.ao.quantization.quantize_dynamic(model, {{nn.LSTM, nn.Linear}}, dtype=torch.qint8)
"""


def _archive(
    tmp_path: Path, seed: str = "torch.manual_seed(0)", read: str = ""
) -> tuple[Path, list[str]]:
    (tmp_path / "intent.py").write_text(MODEL.format(seed=seed, read=read))
    config = tmp_path / "model-config.yaml"
    handler = {
        "input": {"shape": [6], "dtype": "int64"},
        "monitoring": {"layers": ["lstm", "act"], "drift": {"window": 50}},
    }
    config.write_text(yaml.safe_dump({"handler": handler}))
    reference = tmp_path / "ref.npy"
    np.save(reference, np.random.default_rng(0).integers(0, 100, size=(120, 6)))
    said: list[str] = []
    mar = archive_model(
        ModelRef.parse(f"{tmp_path / 'intent.py'}:build"),
        "intent",
        config,
        reference,
        tmp_path / "store",
        tmp_path / "build",
        say=said.append,
    )
    return mar, said


def test_a_seeded_quantized_factory_is_archived_without_weights_and_served(
    tmp_path: Path,
) -> None:
    mar, said = _archive(tmp_path)
    assert any(line.startswith("  weights: none archived") for line in said), said
    model_dir = tmp_path / "extracted"
    with zipfile.ZipFile(mar) as archived:
        assert "weights.pt" not in archived.namelist()
        archived.extractall(model_dir)
    manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    config = yaml.safe_load((tmp_path / "model-config.yaml").read_text())
    context = FakeContext(
        model_dir, config, model_name="intent", serialized_file=manifest["model"]["serializedFile"]
    )
    handler = load_handler("hookwatch_handler")()
    handler.initialize(context)
    try:
        tokens = [3, 14, 15, 92, 65, 35]
        (answer,) = handled(handler, [{"body": {"data": tokens}}], context)
        answer = json.loads(answer) if isinstance(answer, str | bytes) else answer
        # The factory's own model, built here: the worker serves exactly it.
        torch.manual_seed(0)
        namespace: dict[str, object] = {}
        exec((tmp_path / "intent.py").read_text(), namespace)  # the test's own file
        model = namespace["build"]()  # type: ignore[operator]
        with torch.inference_mode():
            expected = torch.softmax(model(torch.tensor([tokens])), dim=-1)[0]
        assert answer["class"] == int(expected.argmax())
        assert np.allclose(answer["probabilities"], expected.numpy(), atol=1e-5)
    finally:
        handler.service.close()


def test_an_unseeded_quantized_factory_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="builds the same each time") as raised:
        _archive(tmp_path, seed="pass")
    message = str(raised.value)
    assert "\n" not in message and "ScriptObject" in message and "quantize_dynamic" in message


def test_a_factory_reading_a_file_a_worker_lacks_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "vocab.txt").write_text("a b c\n")
    read = "open(__import__('pathlib').Path(__file__).with_name('vocab.txt')).read()"
    with pytest.raises(ConfigError, match="to build again from the files a worker gets") as raised:
        _archive(tmp_path, read=read)
    assert "FileNotFoundError" in str(raised.value) and "--extra-files" in str(raised.value)


COMPILED = """
import torch
from torch import nn


def build():
    # Unseeded: only the archived weights can make a worker's model this one.
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    return torch.compile(model, backend="eager")
"""


def test_a_compiled_factory_keeps_its_weights(tmp_path: Path) -> None:
    # Found by an outside run of the built wheel (2026-12-07): the check that the saved
    # state_dict loads as a worker loads it compared load_state's names (torch.compile's
    # "_orig_mod." prefix dropped) with the wrapper's own (prefixed); every compiled factory
    # was taken for one of packed parameters, and refused unless it was seeded.
    (tmp_path / "net.py").write_text(COMPILED)
    config = tmp_path / "model-config.yaml"
    handler = {"input": {"shape": [6]}, "monitoring": {"layers": ["1"], "drift": {"window": 50}}}
    config.write_text(yaml.safe_dump({"handler": handler}))
    reference = tmp_path / "ref.npy"
    np.save(reference, np.random.default_rng(0).normal(size=(120, 6)).astype(np.float32))
    said: list[str] = []
    mar = archive_model(
        ModelRef.parse(f"{tmp_path / 'net.py'}:build"),
        "net",
        config,
        reference,
        tmp_path / "store",
        tmp_path / "build",
        say=said.append,
    )
    assert not any("none archived" in line for line in said), said
    with zipfile.ZipFile(mar) as archived:
        assert "weights.pt" in archived.namelist()
        state = torch.load(archived.open("weights.pt"), map_location="cpu", weights_only=True)
    # Saved as the wrapper names them; the worker's loader drops the prefix.
    assert sorted(state) == [f"_orig_mod.{k}" for k in ("0.bias", "0.weight", "2.bias", "2.weight")]
    model_dir = tmp_path / "extracted"
    with zipfile.ZipFile(mar) as archived:
        archived.extractall(model_dir)
    manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    context = FakeContext(
        model_dir,
        yaml.safe_load(config.read_text()),
        model_name="net",
        serialized_file=manifest["model"]["serializedFile"],
    )
    served = load_handler("hookwatch_handler")()
    served.initialize(context)
    try:
        row = [0.5, -1.0, 2.0, 0.0, 1.5, -0.25]
        (answer,) = handled(served, [{"body": {"data": row}}], context)
        answer = json.loads(answer) if isinstance(answer, str | bytes) else answer
        plain = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        plain.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in state.items()})
        with torch.inference_mode():
            expected = torch.softmax(plain(torch.tensor([row])), dim=-1)[0]
        assert np.allclose(answer["probabilities"], expected.numpy(), atol=1e-5)
    finally:
        served.service.close()


def test_a_dynamically_quantized_lstm_is_read_by_its_units_not_its_steps() -> None:
    # quantize_dynamic's LSTM and Linear are no subclasses of nn.LSTM and nn.Linear: an
    # outside run's [6, 4] series read as 6 "channels" (its steps) by 16 (2026-12-07).
    from torch import nn

    from hookwatch.tools.own_model import discover_layers

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(4, 16, batch_first=True)
            self.fc = nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.fc(self.lstm(x)[0][:, -1])
            return out

    quantized = torch.ao.quantization.quantize_dynamic(
        Tagger().eval(), {nn.LSTM, nn.Linear}, dtype=torch.qint8
    )
    rows = {row.name: row for row in discover_layers(quantized, torch.zeros(2, 6, 4))}
    assert rows["lstm"].features == 16 and rows["fc"].features == 3
