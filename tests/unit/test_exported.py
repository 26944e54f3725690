"""A ``torch.export`` program (``.pt2``) as the model: TorchScript's successor, which torch now
points users to. It was refused as "expected a TorchScript file"; it is now loaded with its
authored module hierarchy (``torch.export.unflatten``), so its hidden layers are watched under
their eager paths and class names, archived and served like any other model."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from hookwatch import ConfigError
from hookwatch._config import MonitoringConfig
from hookwatch._hooks import hookable_root, module_type, resolve_layers, watchable_modules
from hookwatch._metrics import MetricSet
from hookwatch._model import ModelSpec, build_model, serialized_kind
from hookwatch._profile import build_profile
from hookwatch.tools.own_model import ModelRef, archive_model, discover_layers
from tests.conftest import require
from tests.fakes import archived_handler, handled


class Net(nn.Module):
    """Nested blocks, a pooled convolution and a classifier: paths a few levels deep."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.pool(self.features(x)))
        return out


def _export(path: Path, dynamic: bool = True) -> Net:
    eager = Net().eval()
    shapes = {"x": {0: torch.export.Dim("batch")}} if dynamic else None
    program = torch.export.export(eager, (torch.rand(2, 2, 5),), dynamic_shapes=shapes)
    torch.export.save(program, str(path))
    return eager


def test_an_exported_program_keeps_its_layers_types_and_answers(
    tmp_path: Path, metrics: MetricSet
) -> None:
    import hookwatch

    eager = _export(tmp_path / "net.pt2")
    model = build_model(ModelSpec("exported", "net.pt2"), tmp_path)
    eager_paths = {name for name, _ in eager.named_modules() if name}
    root = hookable_root(model)
    assert set(watchable_modules(root)) == eager_paths
    assert module_type(root.get_submodule("features.1")) == "ReLU"
    assert module_type(root.get_submodule("head.1")) == "Linear"
    typed = resolve_layers(model, MonitoringConfig.from_mapping({"layer_types": ["ReLU", "GELU"]}))
    assert set(typed.layers) == {"features.1", "head.2"}
    with torch.inference_mode():
        for batch in (1, 5):
            x = torch.rand(batch, 2, 5)
            torch.testing.assert_close(model(x), eager(x))
    rows = {r.name: r for r in discover_layers(model, torch.rand(2, 2, 5))}
    assert rows["head.2"].type == "GELU" and rows["head.2"].shapes == ((2, 8),)
    config = {"layers": ["features.1", "head.2"], "sample_rate": 1.0, "drift": {"window": 20}}
    reference = [torch.rand(16, 2, 5) for _ in range(6)]
    profile = build_profile(model, config, reference, "net")
    assert {"features.1", "head.2", "output"} <= set(profile.references)
    monitor = hookwatch.watch(model, config, "net", profile=profile, metrics=metrics)
    with monitor, torch.inference_mode():
        for _ in range(30):
            with monitor.request(4):
                model(torch.rand(4, 2, 5))
    values = metrics.sample_values()
    assert values[("hookwatch_captures_total", (("layer", "head.2"), ("model", "net")))] == 120
    windows = (("detector", "features.1"), ("level", "activation"), ("model", "net"))
    assert values[("hookwatch_drift_windows_total", windows)] > 0


def test_a_program_traced_for_one_batch_size_is_refused_with_the_fix(tmp_path: Path) -> None:
    """A fixed batch would fail every batch of another size in its forward (the profile's,
    a worker's): refused at the load, saying how to export it."""
    _export(tmp_path / "fixed.pt2", dynamic=False)
    with pytest.raises(ConfigError, match=r"traced for a batch of exactly 2: export it with"):
        build_model(ModelSpec("exported", "fixed.pt2"), tmp_path)
    (tmp_path / "broken.pt2").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=r"expected a torch.export file \(.pt2\)"):
        build_model(ModelSpec("exported", "broken.pt2"), tmp_path)


def test_serialized_files_are_told_apart_by_their_contents(tmp_path: Path) -> None:
    _export(tmp_path / "net.pt2")
    (tmp_path / "renamed.pt").write_bytes((tmp_path / "net.pt2").read_bytes())
    torch.jit.trace(nn.Linear(2, 2), torch.rand(1, 2)).save(str(tmp_path / "scripted.pt"))
    (tmp_path / "junk.pt").write_bytes(b"junk")
    assert serialized_kind(tmp_path / "net.pt2") == "exported"
    assert serialized_kind(tmp_path / "renamed.pt") == "exported"
    assert serialized_kind(tmp_path / "scripted.pt") == "torchscript"
    assert serialized_kind(tmp_path / "junk.pt") == "torchscript"  # whose loader says why
    assert ModelRef.parse(str(tmp_path / "renamed.pt")).spec({}, None).kind == "exported"


def test_a_torch_save_file_as_the_model_says_to_give_the_class_and_weights(
    tmp_path: Path,
) -> None:
    """``torch.save(model)`` (or a state_dict) given as the model: torch's loader called it
    corrupted; the refusal now says what it is and what to pass instead."""
    net = nn.Sequential(nn.Linear(3, 2))
    torch.save(net, tmp_path / "whole.pt")
    torch.save(net.state_dict(), tmp_path / "weights.pt")
    for name in ("whole.pt", "weights.pt"):
        spec = ModelRef.parse(str(tmp_path / name)).spec({}, None)
        with pytest.raises(ConfigError, match=r"got a torch\.save file .*--weights FILE"):
            build_model(spec, tmp_path)


def test_an_exported_program_is_archived_and_served(tmp_path: Path) -> None:
    eager = _export(tmp_path / "net.pt2")
    config = tmp_path / "model-config.yaml"
    monitoring = {"layers": ["head.2"], "drift": {"window": 50}}
    config.write_text(
        yaml.safe_dump({"handler": {"input": {"shape": [2, 5]}, "monitoring": monitoring}})
    )
    reference = tmp_path / "ref.npy"
    np.save(reference, np.random.default_rng(0).random((200, 2, 5), dtype=np.float32))
    said: list[str] = []
    mar = archive_model(
        ModelRef.parse(str(tmp_path / "net.pt2")),
        "net",
        config,
        reference,
        tmp_path / "store",
        tmp_path / "build",
        say=said.append,
    )
    assert said[0].startswith(f"wrote {mar}") and "model exported net.pt2" in said[0], said
    with zipfile.ZipFile(mar) as archived:
        assert "net.pt2" in archived.namelist()
    x = np.random.default_rng(1).random((2, 5), dtype=np.float32)
    with archived_handler(mar, tmp_path / "extracted") as (handler, context):
        (answer,) = handled(handler, [{"body": {"data": x.tolist()}}], context)
    with torch.inference_mode():
        expected = torch.softmax(eager(torch.from_numpy(x)[None]), dim=1)[0]
    assert answer["probabilities"] == pytest.approx(expected.tolist(), abs=1e-5)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(7, 4)
        self.mlp = nn.Sequential(nn.Linear(4 + 5, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, cats: torch.Tensor, nums: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(torch.cat([self.emb(cats).mean(1), nums], dim=1))
        return out


def test_a_program_of_several_tensors_takes_them_by_their_names(tmp_path: Path) -> None:
    """``input.arguments`` calls the forward with keyword arguments; a program exported with
    positional ones refused them ("a kwarg keyword mismatch"). They go to the positions of
    the forward's parameters of those names; layers are named from the program."""
    eager = TwoInputs().eval()
    batch = torch.export.Dim("batch")
    example = (torch.randint(0, 7, (2, 3)), torch.rand(2, 5))
    program = torch.export.export(eager, example, dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, str(tmp_path / "two.pt2"))
    model = build_model(ModelSpec("exported", "two.pt2"), tmp_path)
    cats, nums = torch.randint(0, 7, (5, 3)), torch.rand(5, 5)
    with torch.inference_mode():
        expected = eager(cats, nums)
        torch.testing.assert_close(model(cats=cats, nums=nums), expected)
        torch.testing.assert_close(model(nums=nums, cats=cats), expected)
        torch.testing.assert_close(model(cats, nums=nums), expected)
        torch.testing.assert_close(model(cats, nums), expected)
    assert hookable_root(model) is model.get_submodule("program")
    rows = {r.name: r for r in discover_layers(model, {"cats": cats, "nums": nums})}
    assert rows["mlp.1"].type == "ReLU" and rows["mlp.1"].shapes == ((5, 8),)
    assert rows["input"].features == 8


def test_an_exported_text_model_is_archived_with_its_tokenizer(tmp_path: Path) -> None:
    """A serialized model takes no constructor arguments, so a tokenizer directory could not
    be given (`--model-args` refused): directories are now taken, archived beside the
    program for ``input.text``, and never passed to it."""
    require(importlib.util.find_spec("transformers") is not None, "transformers (hookwatch[text])")
    from tests.tiny_text import TinyEncoder, encode, save_tokenizer, words

    tokenizer = save_tokenizer(tmp_path / "tokenizer")
    eager = TinyEncoder().eval()
    example = encode([[4, 5, 6], [7, 8]])
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens", max=64)
    dims = {"input_ids": {0: batch, 1: tokens}, "attention_mask": {0: batch, 1: tokens}}
    program = torch.export.export(eager, (), kwargs=example, dynamic_shapes=dims)
    torch.export.save(program, str(tmp_path / "text.pt2"))
    config = tmp_path / "model-config.yaml"
    handler = {
        "input": {"text": {"tokenizer": "pretrained", "max_tokens": 32}},
        "monitoring": {
            "layers": ["encoder.layer.1"],
            "output": {"head": "embedding", "select": "pooler_output"},
        },
    }
    config.write_text(yaml.safe_dump({"handler": handler}))
    reference = tmp_path / "reference.jsonl"
    reference.write_text("\n".join(json.dumps(t) for t in words(60, seed=4)) + "\n")
    ref = ModelRef.parse(str(tmp_path / "text.pt2"))
    with pytest.raises(
        ConfigError, match=r"takes no arguments but directories .* got --model-args seed"
    ):
        ref.spec({"pretrained": str(tokenizer), "seed": 1}, None)
    mar = archive_model(
        ref,
        "text",
        config,
        reference,
        tmp_path / "store",
        tmp_path / "build",
        args={"pretrained": str(tokenizer)},
        say=lambda _line: None,
    )
    with zipfile.ZipFile(mar) as archived:
        assert "pretrained/tokenizer_config.json" in archived.namelist()
    with archived_handler(mar, tmp_path / "extracted") as (served, context):
        (answer,) = handled(served, [{"body": "w1 w2 w3"}], context)
    with torch.inference_mode():
        expected = eager(**encode([[5, 6, 7]]))["pooler_output"][0]
    assert answer["embedding"] == pytest.approx(expected.tolist(), abs=1e-5)
