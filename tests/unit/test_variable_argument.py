"""One of several arguments of a length each request chooses (a null in one of
``input.arguments``): a session recommender's recent items beside its user's features, a
series beside its static covariates. Refused at the config before; now the batch pads that
argument to its longest, passes the others beside it, and the input's hook reads it by its
own steps so that no batch changes a request's features."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from hookwatch._config import HandlerConfig, InputSpec
from hookwatch._errors import ConfigError
from hookwatch._metrics import MetricSet
from hookwatch._padding import Padded
from hookwatch._profile import build_profile
from hookwatch._profile.builder import capture_features
from hookwatch._service import ArgumentsPipeline, ModelService
from hookwatch.tools import cli
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.unit.test_any_model import monitored, value
from tests.unit.test_variable_length import _model_class

MODEL = '''
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


class Session(nn.Module):
    """Scores of 50 items from a user's recent items (any number) and 4 user features."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.user = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(16, 50)

    def forward(self, history, user, seen):
        packed = pack_padded_sequence(
            self.emb(history), seen.cpu(), batch_first=True, enforce_sorted=False
        )
        _, last = self.gru(packed)
        return self.head(torch.cat([last[-1], self.user(user)], dim=1))
'''


def _session() -> nn.Module:
    return _model_class(MODEL, "Session")().eval()


ARGUMENTS: dict[str, dict[str, object]] = {
    "user": {"shape": [4]},
    "history": {
        "shape": [None],
        "max_length": 12,
        "dtype": "int64",
        "min": 0,
        "max": 49,
        "lengths": "seen",
    },
}


def _handler(window: int = 20) -> HandlerConfig:
    return HandlerConfig.from_mapping(
        {
            "input": {"arguments": ARGUMENTS},
            "monitoring": {"layers": ["user.1"], "sample_rate": 1.0, "drift": {"window": window}},
        }
    )


def _bodies(
    rng: np.random.Generator, count: int, shift: float = 0.0
) -> list[dict[str, list[float]]]:
    """Requests of 1 to 12 recent items; ``shift`` moves the user features and the items."""
    bodies = []
    for _ in range(count):
        n = int(rng.integers(1, 13))
        items = rng.integers(0, 10, n) if not shift else rng.integers(30, 50, n)
        user = rng.normal(shift, 1.0, 4).round(4)
        bodies.append({"user": user.tolist(), "history": items.tolist()})
    return bodies


def test_one_argument_may_have_a_null_and_the_config_says_what_else_is_refused() -> None:
    spec = InputSpec.from_mapping({"arguments": ARGUMENTS})
    assert spec.variable is not None and spec.variable.field == "history"
    assert spec.variable.shape == (12,) and spec.variable.lengths == "seen"
    two = {"a": {"shape": [None], "max_length": 4}, "b": {"shape": [None, 2], "max_length": 4}}
    with pytest.raises(ConfigError, match=r"at most one argument with a null .*got 2: a, b"):
        InputSpec.from_mapping({"arguments": two})
    with pytest.raises(ConfigError, match=r"input.argument: expected none beside a variable"):
        InputSpec.from_mapping({"arguments": ARGUMENTS, "argument": "batch"})
    clash = {**ARGUMENTS, "history": {**ARGUMENTS["history"], "lengths": "user"}}
    with pytest.raises(ConfigError, match=r"history.lengths: expected a keyword other than"):
        InputSpec.from_mapping({"arguments": clash})
    fixed = {"user": {"shape": [4], "lengths": "seen"}}
    with pytest.raises(ConfigError, match=r"input.arguments.user.lengths: expected a null"):
        InputSpec.from_mapping({"arguments": fixed})


def test_a_request_is_answered_as_if_alone_and_its_bad_argument_named() -> None:
    model = _session()
    handler = _handler()
    service = ModelService(model, handler.input, None)
    rng = np.random.default_rng(0)
    bodies = _bodies(rng, 6)
    together = service.handle([json.dumps(b).encode() for b in bodies])
    alone = [service.handle([json.dumps(b).encode()])[0] for b in bodies]
    for got, want in zip(together, alone, strict=True):
        assert got["class"] == want["class"]
        assert got["top"][0]["probability"] == pytest.approx(want["top"][0]["probability"])
    refused = service.handle(
        [
            json.dumps({"user": [0, 0, 0, 0], "history": list(range(13))}).encode(),
            json.dumps({"user": [0, 0, 0, 0], "history": []}).encode(),
        ]
    )
    assert refused[0]["expected"] == "history: shape [<=12]" and refused[0]["code"] == 400
    assert refused[0]["got"] == "shape [13]"
    assert refused[1]["got"] == "an empty list"
    missing = service.handle([json.dumps({"user": [0, 0, 0, 0]}).encode()])[0]
    assert '"history": <1 to 12 numbers>' in missing["expected"]
    # KServe's and TF Serving's row format: one instance a request, answered as their
    # protocol answers.
    wrapped = service.handle(
        [
            json.dumps({"instances": [bodies[0]]}).encode(),
            json.dumps({"inputs": bodies[0]}).encode(),
            json.dumps({"instances": bodies[:2]}).encode(),
        ]
    )
    assert wrapped[0] == {"predictions": [alone[0]]} and wrapped[1] == alone[0]
    # Several objects under instances: each a sample, answered in order as it is alone.
    assert list(wrapped[2]) == ["predictions"] and len(wrapped[2]["predictions"]) == 2
    for got, want in zip(wrapped[2]["predictions"], alone[:2], strict=True):
        assert got["class"] == want["class"]
        assert got["top"][0]["probability"] == pytest.approx(want["top"][0]["probability"])
    too_many = service.handle([json.dumps({"instances": bodies[:1] * 65}).encode()])[0]
    assert too_many["code"] == 413 and too_many["got"] == "65 instances"
    under_inputs = service.handle([json.dumps({"inputs": bodies[:2]}).encode()])[0]
    assert under_inputs["code"] == 400 and under_inputs["got"] == "2 objects"


def test_the_input_is_read_by_its_own_steps_whatever_the_batch() -> None:
    """A request's input features (the items' count beside the user's four) and a hidden
    layer's are the same alone and padded beside a longer request."""
    model = _session()
    handler = _handler()
    pipeline = ArgumentsPipeline(handler.input)
    short = {"user": torch.randn(4), "history": torch.tensor([3, 1, 4])}
    long_ = {"user": torch.randn(4), "history": torch.arange(12)}
    batch = pipeline.batch([short, long_])
    assert isinstance(batch, Padded) and batch.field == "history"
    assert list(batch.call_arguments()) == ["user", "history", "seen"]
    config = handler.monitoring
    alone = next(iter(capture_features(model, config, [pipeline.batch([short])])))
    padded = next(iter(capture_features(model, config, [batch])))
    for layer in ("input", "user.1", "output"):
        np.testing.assert_allclose(padded[layer][0], alone[layer][0], rtol=1e-5, atol=1e-6)
    # user's four values, then the history's length: the ids themselves are no feature.
    np.testing.assert_allclose(alone["input"][0], [*short["user"].tolist(), 3.0], rtol=1e-6)


def test_profiled_served_and_alarmed_on_a_shift(metrics: MetricSet) -> None:
    model = _session()
    handler = _handler()
    pipeline = ArgumentsPipeline(handler.input)
    rng = np.random.default_rng(1)
    reference = [
        pipeline.batch([pipeline.decode(json.dumps(b).encode()) for b in _bodies(rng, 32)])
        for _ in range(8)
    ]
    profile = build_profile(model, handler.monitoring, reference, "rec")
    assert {"input", "user.1", "output"} <= set(profile.references) and not profile.left_out
    service, monitor = monitored(model, handler, profile, "rec", metrics)
    try:
        for _ in range(6):
            service.handle([json.dumps(b).encode() for b in _bodies(rng, 20)])
        monitor.flush()
        clean = value(
            metrics, "hookwatch_drift_alarms_total", model="rec", level="input", detector="input"
        )
        for _ in range(6):
            service.handle([json.dumps(b).encode() for b in _bodies(rng, 20, shift=2.0)])
        monitor.flush()
    finally:
        monitor.close()
    assert value(metrics, "hookwatch_monitor_faults_total", model="rec", layer="input") == 0
    assert value(metrics, "hookwatch_captures_total", model="rec", layer="input") == 240
    assert not clean
    assert (
        value(metrics, "hookwatch_drift_alarms_total", model="rec", level="input", detector="input")
        >= 1
    )


def test_layers_init_and_archive_from_bodies_or_arrays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "session.py").write_text(MODEL)
    partial = tmp_path / "partial.yaml"
    partial.write_text(
        yaml.safe_dump({"batchSize": 4, "handler": {"input": {"arguments": ARGUMENTS}}})
    )
    model = f"{tmp_path / 'session.py'}:Session"
    assert cli.main(["layers", model, "--config", str(partial)]) == 0
    listed = capsys.readouterr().out
    assert "input " in listed and "emb" in listed
    config = tmp_path / "model-config.yaml"
    assert cli.main(["init", model, "--config", str(partial), "--out", str(config)]) == 0
    written = yaml.safe_load(config.read_text())
    history = written["handler"]["input"]["arguments"]["history"]
    assert (
        history["shape"] == [None] and history["max_length"] == 12 and history["lengths"] == "seen"
    )
    assert written["batchSize"] == 4
    rng = np.random.default_rng(2)
    (tmp_path / "ref.jsonl").write_text("".join(json.dumps(b) + "\n" for b in _bodies(rng, 80)))
    # Request bodies of any length, or an array per argument (the variable one's samples
    # all as long).
    np.savez(
        tmp_path / "ref.npz",
        user=rng.normal(size=(40, 4)).astype(np.float32),
        history=rng.integers(0, 10, (40, 7)),
    )
    for name, reference in (("rec", "ref.jsonl"), ("rec2", "ref.npz")):
        mar = archive_model(
            ModelRef.parse(model),
            name,
            config,
            tmp_path / reference,
            tmp_path / "store",
            tmp_path / f"build-{name}",
            say=lambda _: None,
        )
        assert mar.is_file()


class Forecast(nn.Module):
    """A forecast from a series of 3 features (any length, its mask) and 2 static ones."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.step = nn.Linear(3, 6)
        self.static = nn.Linear(2, 6)
        self.out = nn.Linear(6, 1)

    def forward(
        self, series: torch.Tensor, static: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        steps = torch.tanh(self.step(series)) * valid[..., None]
        pooled = steps.sum(1) / valid.sum(1, keepdim=True)
        out: torch.Tensor = self.out(pooled + self.static(static))
        return out


def test_a_series_beside_static_features_is_read_by_each_feature_over_its_steps() -> None:
    handler = HandlerConfig.from_mapping(
        {
            "input": {
                "arguments": {
                    "series": {"shape": [None, 3], "max_length": 30, "mask": "valid"},
                    "static": {"shape": [2]},
                }
            },
            "monitoring": {"layers": ["step"], "sample_rate": 1.0, "output": {"head": "values"}},
        }
    )
    model = Forecast().eval()
    pipeline = ArgumentsPipeline(handler.input)
    short = {"series": torch.randn(4, 3), "static": torch.tensor([0.5, -1.0])}
    long_ = {"series": torch.randn(30, 3), "static": torch.tensor([1.0, 2.0])}
    config = handler.monitoring
    alone = next(iter(capture_features(model, config, [pipeline.batch([short])])))
    padded = next(iter(capture_features(model, config, [pipeline.batch([short, long_])])))
    for layer in ("input", "step", "output"):
        np.testing.assert_allclose(padded[layer][0], alone[layer][0], rtol=1e-5, atol=1e-6)
    want = [*short["series"].mean(0).tolist(), 0.5, -1.0]
    np.testing.assert_allclose(alone["input"][0], want, rtol=1e-5, atol=1e-6)
