"""Models that are not the demo: heads, selectors, keyword forwards, patterns, normalisation,
TorchScript and torch.compile, wide and saturated outputs."""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch import nn

from hookwatch import _catalogue as cat
from hookwatch._body import NoPayload
from hookwatch._config import HandlerConfig, MonitoringConfig
from hookwatch._drift import MAX_BINS
from hookwatch._errors import BadInputError, ConfigError
from hookwatch._hooks import plan_watch, resolve_layers
from hookwatch._metrics import MetricSet
from hookwatch._model import ModelSpec, ScriptedModel, build_model, load_state
from hookwatch._monitor import Monitor
from hookwatch._profile import DriftProfile, build_profile, tracker_for
from hookwatch._service import InputPipeline, ModelService


def value(metrics: MetricSet, name: str, **labels: str) -> float:
    return value_of(metrics.sample_values(), name, **labels)


def value_of(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), float("nan"))


def monitored(
    model: nn.Module,
    handler: HandlerConfig,
    profile: DriftProfile,
    name: str,
    metrics: MetricSet,
) -> tuple[ModelService, Monitor]:
    """``model`` served in process as a worker serves it: its layers resolved, a monitor with
    ``profile``'s drift tracker, the service over it (close the monitor when done)."""
    config = resolve_layers(model, handler.monitoring)
    monitor = Monitor(
        model,
        plan_watch(model, config, name),
        metrics=metrics,
        drift=tracker_for(profile, config, name),
    )
    return ModelService(model, handler.input, monitor, output=config.output), monitor


class KeywordMLP(nn.Module):
    """A regression model whose forward takes its input by keyword only."""

    def __init__(self, inputs: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(inputs, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU())
        self.out = nn.Linear(8, 1)

    def forward(self, *, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.body(features))
        return out


class DictOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.act(self.fc(x))
        return {"hidden": hidden, "logits": hidden * 2 + 1}


def test_layer_patterns_and_types_resolve_in_model_order_and_are_bounded() -> None:
    model = nn.Sequential(
        OrderedDict(
            block1=nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
            block2=nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
            head=nn.Linear(4, 2),
        )
    )
    config = MonitoringConfig.from_mapping({"layers": ["head", "block*.1"]})
    assert not config.resolved
    with pytest.raises(ConfigError, match="resolved against the model"):
        _ = config.watched
    resolved = resolve_layers(model, config)
    assert resolved.layers == ("head", "block1.1", "block2.1")
    typed = resolve_layers(model, MonitoringConfig.from_mapping({"layer_types": ["Linear"]}))
    assert typed.layers == ("block1.0", "block2.0", "head")
    with pytest.raises(ConfigError, match=r"expected at most 2 layers.*got 3"):
        resolve_layers(
            model, MonitoringConfig.from_mapping({"layer_types": ["Linear"], "max_layers": 2})
        )
    with pytest.raises(ConfigError, match=r"pattern 'blok\*' to match"):
        resolve_layers(model, MonitoringConfig.from_mapping({"layers": ["blok*"]}))
    with pytest.raises(ConfigError, match=r"got 'Conv2d' \(the model has: Linear, ReLU, "):
        resolve_layers(model, MonitoringConfig.from_mapping({"layer_types": ["Conv2d"]}))
    # One module under two names: named by its second, it is pointed to its first.
    model.add_module("again", model.block1)
    with pytest.raises(ConfigError, match=r"got 'again.1', which is the module 'block1.1'"):
        resolve_layers(model, MonitoringConfig.from_mapping({"layers": ["again.1"]}))


def test_a_weight_normalised_layer_is_its_own_type_and_its_parametrizations_are_not_layers(
    metrics: MetricSet,
) -> None:
    """``weight_norm``/``spectral_norm`` make a ``ParametrizedLinear`` with modules that compute
    its weight: ``layer_types: [Linear]`` missed it, globs and `layers` offered the weight's
    modules as if they were activations."""
    from torch.nn.utils.parametrizations import spectral_norm, weight_norm

    import hookwatch
    from hookwatch.tools.own_model import discover_layers

    torch.manual_seed(0)
    model = nn.Sequential(
        weight_norm(nn.Linear(4, 8)), nn.Tanh(), spectral_norm(nn.Linear(8, 8)), nn.Linear(8, 3)
    ).eval()
    typed = resolve_layers(model, MonitoringConfig.from_mapping({"layer_types": ["Linear"]}))
    assert typed.layers == ("0", "2", "3")
    globbed = resolve_layers(model, MonitoringConfig.from_mapping({"layers": ["*"]}))
    assert globbed.layers == ("0", "1", "2", "3")
    rows = discover_layers(model, torch.rand(2, 4))
    assert [(r.name, r.type) for r in rows[1:-1]] == [
        ("0", "Linear"),
        ("1", "Tanh"),
        ("2", "Linear"),
        ("3", "Linear"),
    ]
    config = {"layer_types": ["Linear"], "sample_rate": 1.0, "drift": {"window": 20}}
    profile = build_profile(model, config, [torch.randn(32, 4) for _ in range(4)], "wn")
    assert {"0", "2", "3"} <= set(profile.references)
    monitor = hookwatch.watch(model, config, "wn", profile=profile, metrics=metrics)
    with monitor, torch.inference_mode():
        for _ in range(30):
            with monitor.request(4):
                model(torch.randn(4, 4))
    windows = metrics.sample_values()
    assert windows[
        (
            "hookwatch_drift_windows_total",
            (("detector", "0"), ("level", "activation"), ("model", "wn")),
        )
    ]


def test_layers_are_resolved_once_per_watch_profile_and_service(
    metrics: MetricSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hookwatch
    from hookwatch import _hooks

    calls: list[str] = []
    resolve = _hooks.resolve_layers

    def counted(model: nn.Module, config: MonitoringConfig, name: str = "model") -> Any:
        calls.append(name)
        return resolve(model, config, name)

    monkeypatch.setattr(_hooks, "resolve_layers", counted)
    model = DictOutput().eval()
    mapping = {"layer_types": ["ReLU"], "sample_rate": 1.0, "output": {"select": "logits"}}
    profile = build_profile(model, mapping, [torch.randn(40, 4)], "once")
    assert calls == ["once"]  # by build_profile's first step; capture and fit take the plan
    calls.clear()
    monitor = hookwatch.watch(model, mapping, "once", profile=profile, metrics=metrics)
    try:
        assert calls == ["once"]  # the profile matched and the monitor built on one plan
        assert monitor.config.layers == ("act",) and monitor.config.resolved
    finally:
        monitor.close()
    calls.clear()
    handler = HandlerConfig.from_mapping({"input": {"shape": [4]}, "monitoring": mapping})
    service = ModelService.from_handler_config(model, handler, "once", metrics)
    try:
        assert calls == ["once"]
    finally:
        assert service.monitor is not None
        service.monitor.close()


def test_a_watch_plan_is_resolved_and_belongs_to_its_model(metrics: MetricSet) -> None:
    from hookwatch._hooks import WatchPlan, plan_watch

    model = DictOutput().eval()
    plan = plan_watch(model, {"layers": ["a*"], "output": {"select": "logits"}}, "planned")
    assert plan.config.layers == ("act",) and plan.watched == ("input", "act", "output")
    with pytest.raises(ConfigError, match=r"resolved against the model \(plan_watch\)"):
        WatchPlan(MonitoringConfig.from_mapping({"layers": ["a*"]}), "raw", plan.model_ref)
    with pytest.raises(ValueError, match="expected the model the watch plan of 'planned'"):
        Monitor(DictOutput(), plan, metrics=metrics)
    with pytest.raises(ValueError, match="expected model_name 'planned'"):
        Monitor(model, plan, "other", metrics)
    with pytest.raises(TypeError, match=r"expected a WatchPlan .*got MonitoringConfig"):
        Monitor(model, plan.config, metrics=metrics)  # type: ignore[arg-type]
    monitor = Monitor(model, plan, metrics=metrics)
    try:
        assert monitor.config is plan.config and monitor.model_name == "planned"
    finally:
        monitor.close()


def test_keyword_forward_values_head_end_to_end(metrics: MetricSet) -> None:
    torch.manual_seed(0)
    model = KeywordMLP().eval()
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [4], "argument": "features"},
            "monitoring": {
                "layer_types": ["GELU"],
                "sample_rate": 1.0,
                "output": {"head": "values"},
                "drift": {"window": 20},
            },
        }
    )
    reference = [{"features": torch.randn(32, 4)} for _ in range(4)]
    profile = build_profile(model, handler.monitoring, reference, "reg")
    # Regression values are one detector of their own: no softmax, no classes.
    assert set(profile.references) == {"input", "body.1", "body.3", "output"}
    service, monitor = monitored(model, handler, profile, "reg", metrics)
    answers = service.handle([{"data": [0.1, 0.2, 0.3, 0.4]}] * 30 + [{"data": [1, 2]}])
    monitor.flush()
    monitor.close()
    assert set(answers[0]) == {"values"} and len(answers[0]["values"]) == 1
    assert answers[-1]["code"] == 400
    for layer in ("input", "body.1", "body.3", "output"):
        # The input arrived as a keyword argument: the pre-hook saw it, nothing faulted.
        assert value(metrics, "hookwatch_captures_total", model="reg", layer=layer) == 30
        assert value(metrics, "hookwatch_monitor_faults_total", model="reg", layer=layer) == 0
    assert (
        value(
            metrics, "hookwatch_drift_windows_total", model="reg", level="output", detector="output"
        )
        > 0
    )


def test_dict_output_with_a_selector_is_watched_and_answered(metrics: MetricSet) -> None:
    model = DictOutput().eval()
    config = MonitoringConfig.from_mapping(
        {"layers": ["act"], "sample_rate": 1.0, "output": {"select": "logits"}}
    )
    monitor = Monitor(model, plan_watch(model, config, "d"), metrics=metrics)
    service = ModelService(
        model,
        HandlerConfig.from_mapping({"input": {"shape": [4]}}).input,
        monitor,
        output=config.output,
    )
    answers = service.handle([{"data": [1.0, 2.0, 3.0, 4.0]}])
    monitor.flush()
    monitor.close()
    assert set(answers[0]) == {"class", "probabilities"}
    assert value(metrics, "hookwatch_captures_total", model="d", layer="output") == 1
    assert value(metrics, "hookwatch_monitor_faults_total", model="d", layer="output") == 0
    with torch.inference_mode():
        logits = model(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))["logits"]
    mean = value(
        metrics, "hookwatch_activation_statistic_sum", model="d", layer="output", statistic="mean"
    )
    assert mean == pytest.approx(float(logits.mean()), rel=1e-5)


def test_normalisation_is_applied_after_the_range_check_and_seen_by_the_model() -> None:
    spec = HandlerConfig.from_mapping(
        {"input": {"shape": [2, 1, 1], "min": 0, "max": 1, "mean": [0.5, 0.25], "std": [0.5, 0.25]}}
    ).input
    pipeline = InputPipeline(spec)
    item = pipeline.decode({"data": [[[1.0]], [[0.5]]]})
    assert item.flatten().tolist() == [1.0, 0.5]  # raw values, range-checked as sent
    assert pipeline.batch([item]).flatten().tolist() == [1.0, 1.0]  # (1-0.5)/0.5, (0.5-0.25)/0.25
    with pytest.raises(BadInputError, match=r"values in \[0, 1\]"):
        pipeline.decode({"data": [[[2.0]], [[0.5]]]})
    ids = InputPipeline(
        HandlerConfig.from_mapping({"input": {"shape": [3], "dtype": "int64"}}).input
    )
    assert ids.batch([ids.decode({"data": [1, 2, 3]})]).dtype == torch.int64
    with pytest.raises(BadInputError, match="whole numbers"):
        ids.decode({"data": [1, 2.5, 3]})
    with pytest.raises(ConfigError, match=r"input.mean: expected 1 or 2 values"):
        HandlerConfig.from_mapping({"input": {"shape": [2, 4], "mean": [1, 2, 3]}})


def test_a_preprocess_function_in_the_model_directory(tmp_path: Path) -> None:
    (tmp_path / "prep.py").write_text(
        "import torch\n"
        "def to_tensor(payload):\n"
        "    if not isinstance(payload, dict) or 'text' not in payload:\n"
        "        raise ValueError('expected {\"text\": ...}')\n"
        "    return torch.tensor([float(len(payload['text'])), 1.0])\n"
    )
    spec = HandlerConfig.from_mapping(
        {"input": {"shape": [2], "preprocess": "prep:to_tensor"}}
    ).input
    pipeline = InputPipeline(spec, tmp_path)
    assert pipeline.decode(json.dumps({"text": "abc"}).encode()).tolist() == [3.0, 1.0]
    with pytest.raises(BadInputError, match="preprocess function accepts") as error:
        pipeline.decode({"other": 1})
    assert "expected {" in error.value.got
    # A request with no payload (a form post) is refused before the function sees it.
    with pytest.raises(BadInputError, match="preprocess function accepts") as error:
        pipeline.decode(NoPayload(["not json"]))
    assert error.value.reason == "missing_field"
    assert error.value.got.startswith("form fields ['not json'] and no payload")
    with pytest.raises(ConfigError, match=r"expected missing.py in the model directory"):
        InputPipeline(
            HandlerConfig.from_mapping({"input": {"preprocess": "missing:fn"}}).input, tmp_path
        )


def test_a_thousand_classes_stay_bounded_and_a_saturated_softmax_keeps_its_bins(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    # Very confident logits: top probabilities within 1e-9 of 1, most others far below
    # float32's smallest number (the edges of such a model are what float32 used to lose).
    head = nn.Linear(8, 1000)
    with torch.no_grad():
        head.weight.mul_(1000.0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(8, 8), act=nn.ReLU(), head=head)).eval()
    config = MonitoringConfig.from_mapping(
        {"layers": ["act"], "max_features": 32, "drift": {"window": 50, "bins": 10}}
    )
    batches = [torch.randn(100, 8) for _ in range(10)]
    profile = build_profile(model, config, batches, "wide")
    output, mix = profile.references["output"], profile.references["class_mix"]
    assert output.n_features <= 32 and max(output.kept) < 1000
    assert mix.n_bins == MAX_BINS and len(mix.categories) == MAX_BINS - 1
    path = profile.save(tmp_path / "p.npz")
    loaded = DriftProfile.load(path)
    confidence = loaded.references["confidence"]
    # The edges survive the file exactly, so confident samples still spread over the bins.
    np.testing.assert_array_equal(confidence.edges, profile.references["confidence"].edges)
    assert int(confidence.valid.sum()) >= 2
    tracker = tracker_for(loaded, resolve_layers(model, config), "wide")
    scores: dict[str, list[float]] = {}
    with torch.inference_mode():
        for _ in range(8):
            x = torch.randn(50, 8)
            for layer, feats in (("output", model(x).numpy()),):
                for result in tracker.update(layer, feats):
                    scores.setdefault(result.detector, []).append(result.score)
    # Clean data scores like clean data, not like one overfull bin.
    for detector in ("output", "confidence", "entropy", "class_mix"):
        assert np.median(scores[detector]) < 3.0, (detector, scores[detector])


def test_torchscript_models_watch_input_and_output_only(tmp_path: Path, metrics: MetricSet) -> None:
    model = DictOutput()
    scripted = torch.jit.trace(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), torch.randn(2, 4))
    scripted.save(str(tmp_path / "m.pt"))
    wrapped = build_model(ModelSpec("torchscript", "m.pt"), tmp_path)
    assert isinstance(wrapped, ScriptedModel)
    with pytest.raises(ConfigError, match="inside a TorchScript model"):
        resolve_layers(wrapped, MonitoringConfig.from_mapping({"layers": ["scripted.0"]}))
    config = MonitoringConfig.from_mapping({"layers": [], "sample_rate": 1.0})
    monitor = Monitor(wrapped, plan_watch(wrapped, config, "ts"), metrics=metrics)
    with torch.inference_mode(), monitor.request(2):
        wrapped(torch.randn(2, 4))
    monitor.flush()
    monitor.close()
    assert value(metrics, "hookwatch_captures_total", model="ts", layer="input") == 2
    assert value(metrics, "hookwatch_captures_total", model="ts", layer="output") == 2
    with pytest.raises(ConfigError, match="got a TorchScript module"):
        Monitor(scripted, plan_watch(scripted, config, "raw"), metrics=metrics)
    del model


def test_torch_compile_models_are_watched_through_the_original_module(
    metrics: MetricSet, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), act=nn.ReLU(), out=nn.Linear(4, 2)))
    compiled: Any = torch.compile(model.eval(), backend="eager")
    config = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 1.0})
    with caplog.at_level(logging.INFO, logger="hookwatch"):
        monitor = Monitor(compiled, plan_watch(compiled, config, "c"), metrics=metrics)
    assert any("torch.compile" in r.getMessage() for r in caplog.records)
    x = torch.randn(3, 4)
    with torch.inference_mode(), monitor.request(3):
        out = compiled(x)
    monitor.flush()
    monitor.close()
    with torch.inference_mode():
        assert torch.allclose(out, model(x))
    assert value(metrics, "hookwatch_captures_total", model="c", layer="act") == 3


@pytest.mark.parametrize("how", ["torch.compile", "Module.compile"])
def test_models_with_a_compiled_part_are_watched(metrics: MetricSet, how: str) -> None:
    """The compiled part's hooks run in its traced graph, the others eagerly; they share one
    record, which the trace must be able to take (tensors, not numpy arrays, in it)."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), act=nn.ReLU(), out=nn.Linear(4, 2)))
    if how == "torch.compile":
        model.out = torch.compile(model.out, backend="eager")  # type: ignore[assignment]
        layers = ["act", "out._orig_mod"]
    else:
        model.out.compile(backend="eager")
        layers = ["act", "out"]
    config = MonitoringConfig.from_mapping({"layers": layers, "sample_rate": 1.0})
    monitor = Monitor(model.eval(), plan_watch(model.eval(), config, "c"), metrics=metrics)
    x = torch.randn(3, 4)
    for _ in range(2):
        with torch.inference_mode(), monitor.request(3):
            out = model(x)
    monitor.flush()
    monitor.close()
    assert out.shape == (3, 2)
    for layer in ("input", *layers, "output"):
        assert value(metrics, "hookwatch_captures_total", model="c", layer=layer) == 6, layer
    assert value(metrics, "hookwatch_monitor_faults_total", model="c", layer="all") == 0


@pytest.mark.parametrize("how", ["whole", "part", "inside a part"])
def test_a_compiled_model_sampled_now_and_then_captures_every_watched_layer(
    metrics: MetricSet, how: str
) -> None:
    """Found serving a ``torch.compile`` factory at the default sample rate: the graph was
    traced on an unsampled forward, with the hook's closed gate traced into it, and its
    hidden layer was never captured again while the input and output were. Each layer must
    be captured on every sampled forward, whatever the first one was, with no recompiles."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), act=nn.ReLU(), out=nn.Linear(4, 2)))
    if how == "whole":
        watched: Any = torch.compile(model.eval(), backend="eager")
        layers = ["act"]
    elif how == "part":
        model.out = torch.compile(model.out, backend="eager")  # type: ignore[assignment]
        watched, layers = model.eval(), ["act", "out._orig_mod"]
    else:
        part = nn.Sequential(OrderedDict(act=nn.ReLU(), out=nn.Linear(4, 2)))
        model = nn.Sequential(
            OrderedDict(fc=nn.Linear(4, 4), part=torch.compile(part, backend="eager"))
        )
        watched, layers = model.eval(), ["part._orig_mod.act"]
    torch._dynamo.reset()
    counters.clear()
    config = MonitoringConfig.from_mapping({"layers": layers, "sample_rate": 1.0})
    monitor = Monitor(watched, plan_watch(watched, config, "c"), metrics=metrics)
    x = torch.randn(1, 4)
    # The first forwards unsampled (compiled then), the next ones sampled.
    for rate, forwards in ((0.0, 3), (1.0, 5)):
        monitor._gate.sample_rate = rate
        for _ in range(forwards):
            with torch.inference_mode(), monitor.request(1):
                watched(x)
    monitor.flush()
    monitor.close()
    for layer in ("input", *layers, "output"):
        assert value(metrics, "hookwatch_captures_total", model="c", layer=layer) == 5, layer
    assert not counters["recompiles"], dict(counters["recompiles"])


def test_an_input_whose_length_varies_keeps_its_statistics_and_ends_only_its_drift(
    metrics: MetricSet,
) -> None:
    """A variable-length input with no attention mask (a waveform, a series): its flattened
    features change width with the request, so its drift tests cannot run; its statistics,
    and every other layer, go on."""

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(1, 4, 3, padding=1)
            self.act = nn.ReLU()
            self.head = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hidden = self.act(self.conv(x.unsqueeze(1)))  # [B, 4, T]
            out: torch.Tensor = self.head(hidden.mean(dim=2))
            return out

    torch.manual_seed(0)
    model = Pooled().eval()
    config = MonitoringConfig.from_mapping(
        {"layers": ["act"], "sample_rate": 1.0, "drift": {"window": 20}}
    )
    profile = build_profile(model, config, [torch.randn(16, 12) for _ in range(4)], "var")
    config = resolve_layers(model, config)
    monitor = Monitor(
        model,
        plan_watch(model, config, "var"),
        metrics=metrics,
        drift=tracker_for(profile, config, "var"),
    )
    with torch.inference_mode():
        for i in range(60):
            with monitor.request(1):
                model(torch.randn(1, 12 + i % 5))
    monitor.flush()
    monitor.close()
    for layer in ("input", "act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="var", layer=layer) == 60
    # The input's drift ended visibly (one fault); the hidden layer's and the output's go on.
    assert value(metrics, "hookwatch_monitor_faults_total", model="var", layer="input") == 1
    assert value(metrics, "hookwatch_monitor_faults_total", model="var", layer="act") == 0
    assert (
        value(
            metrics, "hookwatch_drift_windows_total", model="var", level="output", detector="output"
        )
        > 0
    )


class Recurrent(nn.Module):
    """An LSTM classifier over ``[B, T, F]`` inputs, sequence-first inside by default (as
    ``nn.LSTM``, ``nn.GRU`` and ``nn.Transformer*`` are unless built with ``batch_first``)."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.rnn = nn.LSTM(6, 8, batch_first=batch_first)
        self.act = nn.Tanh()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(x if self.batch_first else x.transpose(0, 1))
        hidden = self.act(hidden)
        last = hidden[:, -1] if self.batch_first else hidden[-1]
        out: torch.Tensor = self.head(last)
        return out


def test_sequence_first_layers_are_watched_per_request_like_their_batch_first_twins() -> None:
    """A layer whose activations are ``[T, B, H]`` is read with the batch's rows first: each
    request is one sample of it, as with the same weights built ``batch_first``, and a batch
    the per-second cap cut short captures only its first requests' rows (the test below)."""
    torch.manual_seed(0)
    seq_first = Recurrent(batch_first=False).eval()
    twin = Recurrent(batch_first=True).eval()
    twin.load_state_dict(seq_first.state_dict())
    reference = [torch.randn(16, 5, 6) for _ in range(4)]
    config = {"layers": ["rnn", "act"], "sample_rate": 1.0, "drift": {"window": 20}}
    profiles = [build_profile(m, config, reference, "rnn") for m in (seq_first, twin)]
    for layer, ref in profiles[1].references.items():
        # The reference binned per request in both: the same detectors, the same edges.
        np.testing.assert_allclose(profiles[0].references[layer].edges, ref.edges, rtol=1e-5)
    inputs = [torch.randn(3, 5, 6) for _ in range(20)] + [torch.randn(5, 5, 6) for _ in range(5)]
    sets = []
    for model, profile in zip((seq_first, twin), profiles, strict=True):
        metrics = MetricSet(CollectorRegistry())
        resolved = resolve_layers(model, MonitoringConfig.from_mapping(config))
        monitor = Monitor(
            model,
            plan_watch(model, resolved, "rnn"),
            metrics=metrics,
            drift=tracker_for(profile, resolved, "rnn"),
        )
        with torch.inference_mode():
            for x in inputs:  # the last five as long as their batch: [5, 5, 8] either way
                with monitor.request(len(x)):
                    model(x)
        monitor.flush()
        monitor.close()
        sets.append(metrics.sample_values())
    ours, theirs = sets
    for layer in ("rnn", "act"):
        assert value_of(ours, "hookwatch_captures_total", model="rnn", layer=layer) == 85
    watched = {k: v for k, v in theirs.items() if k[0].startswith("hookwatch_activation_")}
    assert watched and all(
        ours[k] == pytest.approx(v, rel=1e-4, abs=1e-6) for k, v in watched.items()
    )
    for key, count in theirs.items():
        if key[0] == "hookwatch_drift_windows_total":
            assert ours[key] == count


def test_hookwatch_layers_shows_sequence_first_layers_batch_first() -> None:
    from hookwatch.tools.own_model import discover_layers, example_input, guess_head

    rows = {r.name: r for r in discover_layers(Recurrent(batch_first=False), example_input((5, 6)))}
    # The dry run's batch of 2 is the second dimension of [5, 2, 8] and of h_n [1, 2, 8].
    assert rows["rnn"].shapes == ((2, 5, 8), (2, 1, 8), (2, 1, 8))
    # Its 8 hidden units (issue 28, item 6), not its 5 steps: the Tanh reads as the LSTM.
    assert rows["act"].shapes == ((2, 5, 8),) and rows["act"].features == 8
    assert rows["act"].reading == "8 units (mean over 5 steps)"

    @dataclasses.dataclass
    class Out:
        hidden: torch.Tensor
        note: str = "kept"

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 4)

        def forward(self, x: torch.Tensor) -> Out:
            return Out(self.fc(x))

    rows = {r.name: r for r in discover_layers(Wrapped(), example_input((6,)))}
    assert rows["output"].shapes == ((2, 4),)
    assert guess_head(list(rows.values())) == "logits"
    squeezed = nn.Sequential(nn.Linear(6, 1), nn.Flatten(0))  # a regression output [B]
    assert guess_head(discover_layers(squeezed, example_input((6,)))) == "values"


def test_hookwatch_layers_notes_experts_and_init_leaves_them_out() -> None:
    """A routed expert's rows are not one per sample: `layers` says so, for the experts that
    did not run on the dry run's inputs' siblings too, and `init` proposes other layers."""
    from hookwatch.tools.own_model import choose_layers, discover_layers, format_layers

    class Experts(nn.Module):
        def __init__(self, split: bool) -> None:
            super().__init__()
            self.split = split
            self.inp = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in "ab")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            if self.split:  # one sample each: other row counts than the batch's
                return torch.cat([self.experts[0](h[:1]), self.experts[1](h[1:])])
            return self.experts[0](h)  # both to the first: the second did not run

    for split in (True, False):
        rows = discover_layers(Experts(split), torch.rand(2, 6))
        by_name = {r.name: r for r in rows}
        assert by_name["experts.0.1"].partial, split
        assert not by_name["inp.1"].partial and not by_name["output"].partial
        assert choose_layers(rows) == ["inp.1"]
        assert "not one per sample" in format_layers(rows, 64)
    assert by_name["experts.0"].partial == "not all of experts ran: chosen per input"
    split_rows = {r.name: r for r in discover_layers(Experts(True), torch.rand(2, 6))}
    assert split_rows["experts.1.1"].partial == "output has 1 rows, the batch 2"


def test_init_watches_a_library_transformer_layer_rather_than_its_attention() -> None:
    """A transformer layer of a library's own class (``BertLayer``, ``ViTLayer``: a class
    named ``...Layer`` holding an attention) is the block whose output is watched; init
    proposed its attention sub-block instead (a BERT built from transformers' config)."""
    from hookwatch.tools.own_model import choose_layers, discover_layers

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.qkv(x)

    class EncoderLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = SelfAttention()
            self.ffn = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ffn(x + self.attention(x))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.ModuleList(EncoderLayer() for _ in range(3))
            self.head = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layer:
                x = layer(x)
            return self.head(x.mean(1))

    rows = discover_layers(Encoder(), torch.rand(2, 5, 8))
    chosen = choose_layers(rows)
    assert {"layer.0", "layer.2"} <= set(chosen), chosen
    assert not any("attention" in name for name in chosen), chosen


def test_a_sequence_first_layer_cut_short_by_the_cap_keeps_only_the_captured_rows(
    metrics: MetricSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A forward is sampled whole; only the per-second cap captures part of one. Sampling
    # unset with a cap of 2 a second, at a share of 1 and with the gate's clock stopped: the
    # first forward of 4 takes the bucket's 2 samples, the others none.
    from hookwatch._monitor import gate as gate_module

    monkeypatch.setattr(gate_module, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    torch.manual_seed(1)
    model = Recurrent(batch_first=False).eval()
    config = resolve_layers(
        model,
        MonitoringConfig.from_mapping({"layers": ["act"], "max_sampled_per_s": 2, "seed": 3}),
    )
    monitor = Monitor(model, plan_watch(model, config, "rnn"), metrics=metrics)
    monitor._gate.sample_rate = 1.0
    with torch.inference_mode():
        for _ in range(40):
            with monitor.request(4):
                model(torch.randn(4, 7, 6))
    monitor.flush()
    monitor.close()
    assert value(metrics, "hookwatch_requests_sampled_total", model="rnn") == 2
    # Two rows of the batch's four, read along the batch's dimension (the second here).
    assert value(metrics, "hookwatch_captures_total", model="rnn", layer="act") == 2


def test_weights_load_from_a_state_dict_or_a_checkpoint(tmp_path: Path) -> None:
    model = KeywordMLP()
    torch.save({"epoch": 3, "model_state_dict": model.state_dict()}, tmp_path / "ckpt.pt")
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, tmp_path / "dp.pt")
    compiled = torch.compile(model)  # its state_dict's keys start with _orig_mod.
    torch.save({"state_dict": compiled.state_dict()}, tmp_path / "compiled.pt")
    for name in ("ckpt.pt", "dp.pt", "compiled.pt"):
        state = load_state(tmp_path / name)
        assert state.keys() == model.state_dict().keys()
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ConfigError, match="expected a state_dict"):
        load_state(tmp_path / "list.pt")


def test_reference_statistics_are_exported_for_alert_thresholds(metrics: MetricSet) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 16), act=nn.ReLU(), out=nn.Linear(16, 3)))
    config = MonitoringConfig.from_mapping({"layers": ["act"], "drift": {"window": 20}})
    data = [torch.randn(64, 4) for _ in range(4)]
    profile = build_profile(model.eval(), config, data, "r")
    with torch.inference_mode():
        act = torch.relu(model.fc(torch.cat(data)))
    zero = profile.statistics["act"][4]
    assert zero == pytest.approx(float((act == 0).float().mean()), abs=1e-6)
    monitor = Monitor(
        model,
        plan_watch(model, config, "r"),
        metrics=metrics,
        drift=tracker_for(profile, config, "r"),
    )
    monitor.close()
    assert value(
        metrics,
        cat.REFERENCE_ACTIVATION_STATISTIC.name,
        model="r",
        layer="act",
        statistic="zero_fraction",
    ) == pytest.approx(zero)
    assert value(metrics, cat.REFERENCE_NONFINITE.name, model="r", layer="act", kind="nan") == 0


def test_a_layer_constant_on_the_reference_is_left_out_visibly(
    tmp_path: Path, metrics: MetricSet
) -> None:
    fc = nn.Linear(4, 8)
    with torch.no_grad():
        fc.bias.fill_(-100.0)  # every unit dead: the ReLU's output is all zeros
    model = nn.Sequential(OrderedDict(fc=fc, act=nn.ReLU(), out=nn.Linear(8, 3))).eval()
    config = MonitoringConfig.from_mapping({"layers": ["act"], "drift": {"window": 20}})
    profile = build_profile(model, config, [torch.randn(64, 4) for _ in range(4)], "dead")
    assert "act" in profile.left_out and "constant" in profile.left_out["act"]
    assert "act" not in profile.references and "input" in profile.references
    loaded = DriftProfile.load(profile.save(tmp_path / "p.npz"))
    assert loaded.left_out == profile.left_out
    monitor = Monitor(
        model,
        plan_watch(model, config, "dead"),
        metrics=metrics,
        drift=tracker_for(loaded, config, "dead"),
    )
    monitor.close()
    usable = cat.DRIFT_DETECTOR_USABLE.name
    assert value(metrics, usable, model="dead", level="activation", detector="act") == 0
    assert value(metrics, usable, model="dead", level="input", detector="input") == 1


class Lookup(nn.Module):
    """Token ids into an embedding of 10: an id past it makes the forward raise."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.act = nn.Tanh()
        self.head = nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if (ids == 7).all(dim=1).any():
            raise MemoryError("stands in for running out of memory")
        out: torch.Tensor = self.head(self.act(self.embed(ids)).mean(dim=1))
        return out


def test_a_request_the_model_refuses_gets_a_422_and_its_batch_is_served(
    metrics: MetricSet,
) -> None:
    """The forward raises on a batch: each request runs alone, the one it refuses gets a 422
    with the model's error, the others the answers they get in a batch without it."""
    torch.manual_seed(0)
    model = Lookup().eval()
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [3], "dtype": "int64"},
            "monitoring": {"layers": ["act"], "sample_rate": 1.0},
        }
    )
    config = resolve_layers(model, handler.monitoring)
    monitor = Monitor(model, plan_watch(model, config, "ids"), metrics=metrics)
    service = ModelService(model, handler.input, monitor, output=config.output)
    good, other = {"data": [1, 2, 3]}, {"data": [4, 5, 6]}
    alone = service.handle([good, other])
    answers = service.handle([good, {"data": [1, 99, 2]}, other, {"data": [1.5, 2, 3]}])
    assert answers[0] == alone[0] and answers[2] == alone[1]
    assert answers[1]["code"] == 422 and answers[1]["got"].startswith("one it refused (IndexError")
    assert answers[3]["code"] == 400  # decoding's own refusal is untouched
    assert service.handle([{"data": [0, 10, 0]}])[0]["code"] == 422
    with pytest.raises(MemoryError):  # the server's fault: TorchServe answers it 507
        service.handle([good, {"data": [7, 7, 7]}])
    monitor.flush()
    monitor.close()
    assert (
        value(metrics, "hookwatch_requests_rejected_total", model="ids", reason="model_refused")
        == 2
    )
    assert value(metrics, "hookwatch_requests_total", model="ids") == 9
    # The batches that raised handed no capture off; the two that ran did, and only those
    # count as sampled (their batch-mates ran alone, unmonitored).
    assert value(metrics, "hookwatch_captures_total", model="ids", layer="act") == 2
    assert value(metrics, "hookwatch_requests_sampled_total", model="ids") == 2


@pytest.mark.parametrize("head", ["logits", "multilabel", "values", "embedding", "none"])
def test_an_output_with_nan_or_infinity_is_answered_in_valid_json(
    metrics: MetricSet, head: str
) -> None:
    """JSON has no NaN or Infinity (a strict client's parser refuses them): such values are
    null, and a logits row with one has no class (its softmax has none)."""

    class Divides(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.fc(x) / (x[:, :1] - 1.0)  # x[0] == 1: Inf or NaN
            return out

    torch.manual_seed(0)
    model = Divides().eval()
    handler = HandlerConfig.from_mapping(
        {"input": {"shape": [2]}, "monitoring": {"layers": ["fc"], "output": {"head": head}}}
    )
    config = resolve_layers(model, handler.monitoring)
    monitor = Monitor(model, plan_watch(model, config, "div"), metrics=metrics)
    service = ModelService(model, handler.input, monitor, output=config.output)
    answers = service.handle([{"data": [1.0, 0.0]}, {"data": [0.5, 0.5]}])
    alone = service.handle([{"data": [0.5, 0.5]}])
    service.close()
    json.dumps(answers, allow_nan=False)  # raises on a NaN or an Infinity
    assert answers[1] == alone[0]  # the finite row is answered as it is alone
    key = {
        "logits": "probabilities",
        "multilabel": "probabilities",
        "values": "values",
        "embedding": "embedding",
    }.get(head, "output")
    assert answers[0][key] == [None, None, None]
    if head == "logits":
        assert answers[0]["class"] is None and isinstance(answers[1]["class"], int)
    if head == "multilabel":
        assert answers[0]["labels"] is None and isinstance(answers[1]["labels"], list)


def test_a_statically_quantized_model_is_watched_on_its_real_values(metrics: MetricSet) -> None:
    """quint8 activations (eager-mode static quantization) are dequantized in the hook:
    before, every layer faulted in the capture thread ("unsupported ScalarType QUInt8")."""

    class Quantized(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.quant = torch.ao.quantization.QuantStub()
            self.fc = nn.Linear(8, 4)
            self.act = nn.ReLU()
            self.dequant = torch.ao.quantization.DeQuantStub()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.dequant(self.act(self.fc(self.quant(x))))
            return out

    torch.manual_seed(0)
    model = Quantized().eval()
    model.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")  # type: ignore[assignment]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager-mode quantization's deprecation notices
        torch.ao.quantization.prepare(model, inplace=True)
        model(torch.randn(64, 8))
        torch.ao.quantization.convert(model, inplace=True)
    x = torch.randn(4, 8)
    config = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 1.0})
    monitor = Monitor(model, plan_watch(model, config, "q"), metrics=metrics)
    with torch.inference_mode(), monitor.request(4):
        out = model(x)
    monitor.flush()
    monitor.close()
    for layer in ("act", "output"):
        assert value(metrics, "hookwatch_monitor_faults_total", model="q", layer=layer) == 0
        assert value(metrics, "hookwatch_captures_total", model="q", layer=layer) == 4
    mean = value(
        metrics, "hookwatch_activation_statistic_sum", model="q", layer="act", statistic="mean"
    )
    assert mean == pytest.approx(float(out.mean(dim=1).sum()), rel=1e-5)


def test_an_integer_output_is_answered_as_integers() -> None:
    # An outside user's argmax model was answered {"values": [1.0]}; ids past 2**24 lost digits.
    from hookwatch._config import InputSpec, OutputSpec
    from hookwatch._service import ModelService

    class Ids(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.argmax(dim=1, keepdim=True) + 16_777_216

    spec = InputSpec.from_mapping({"shape": [3]})
    service = ModelService(Ids(), spec, None, output=OutputSpec.from_mapping({"head": "values"}))
    answers = service.handle([{"data": [0.1, 0.9, 0.2]}, {"data": [0.5, 0.1, 0.9]}])
    assert answers == [{"values": [16_777_217]}, {"values": [16_777_218]}]
    assert all(isinstance(a["values"][0], int) for a in answers)
