"""Inputs of a length each request chooses (``null`` in ``input.shape``): a series of any
length, a waveform, raw token ids. A fixed shape refused every request of another length (a
400), so such a model could only be served at batch 1 and one length. Requests are now taken
at any length up to ``input.max_length``, a batch is padded to its longest, the forward is given
the lengths or a mask where it takes them, padding is left out of what the hooks read, and a
per-step answer is cut at its sample's own length."""

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
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._padding import Padded
from hookwatch._profile import DriftProfile, build_profile
from hookwatch._profile.builder import (
    PADDING_READ,
    STEPS_WIDE,
    capture_features,
    padding_readers,
)
from hookwatch._service import InputPipeline, ModelService
from hookwatch.tools import own_model
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.unit.test_any_model import monitored, value

ALARMS = "hookwatch_drift_alarms_total"

MODELS = '''
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


class Packed(nn.Module):
    """An LSTM classifier over series of any length: packed by lengths, last hidden state."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(3, 16)
        self.act = nn.Tanh()
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x, lengths):
        h = self.act(self.proj(x))
        packed = pack_padded_sequence(h, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (last, _) = self.lstm(packed)
        return self.head(last[-1])
'''


WAVE = '''
import torch
from torch import nn


class Wave(nn.Module):
    """A waveform of any length through two convolutions, averaged over time padding and all:
    its answer to a request depends on how long the batch's longest is."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.conv = nn.Conv1d(1, 8, 9, stride=2, padding=4)
        self.act = nn.ReLU()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.act(self.conv(x[:, None, :])).mean(-1))
'''


def _model_class(source: str, name: str) -> type[nn.Module]:
    """The class ``name`` defined by ``source`` (a model file's text)."""
    namespace: dict[str, object] = {}
    exec(compile(source, f"{name.lower()}.py", "exec"), namespace)
    found = namespace[name]
    assert isinstance(found, type) and issubclass(found, nn.Module)
    return found


#: The LSTM classifier of ``MODELS``, in process.
Packed = _model_class(MODELS, "Packed")


class Tagger(nn.Module):
    """A per-step tagger given a mask (True at a sample's steps): ``[B, T, 5]`` logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Linear(3, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.out = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.encoder(self.embed(x), src_key_padding_mask=~mask))
        return out


def _series(rng: np.random.Generator, count: int, shift: float = 0.0) -> list[list[list[float]]]:
    """``count`` series of 3 features, each of its own length from 2 to 20."""
    return [
        (rng.standard_normal((int(rng.integers(2, 21)), 3)) + shift).round(4).tolist()
        for _ in range(count)
    ]


def _handler(**input_keys: object) -> HandlerConfig:
    return HandlerConfig.from_mapping(
        {
            "input": {"shape": [None, 3], "max_length": 20, **input_keys},
            "monitoring": {"layers": ["act"], "sample_rate": 1.0, "drift": {"window": 20}},
        }
    )


def test_a_null_dimension_is_declared_with_its_longest() -> None:
    spec = InputSpec.from_mapping({"shape": [None, 3], "max_length": 50, "lengths": "lengths"})
    assert spec.shape == (50, 3) and spec.length_dim == 0 and spec.shape_text == "[<=50, 3]"
    refused = {
        "expected a positive integer bounding": {"shape": [None, 3]},
        "one of them null": {"shape": [None, None], "max_length": 4},
        "expected a null in input.shape for it to bound": {"shape": [3], "max_length": 4},
        "input.lengths: expected a null": {"shape": [3], "lengths": "n"},
        "is passed positionally": {"shape": [None], "max_length": 4, "argument": "x"},
        "sent as JSON": {"shape": [None], "max_length": 4, "encoding": "float32"},
        "input.mean: expected one value": {"shape": [None, 2], "max_length": 4, "mean": [0, 1]},
        "two keyword arguments": {"shape": [None], "max_length": 4, "lengths": "n", "mask": "n"},
    }
    for message, raw in refused.items():
        with pytest.raises(ConfigError, match=message):
            InputSpec.from_mapping(raw)
    # One of several arguments may have one (tests/unit/test_variable_argument.py), two not.
    two = {"x": {"shape": [None], "max_length": 3}, "y": {"shape": [None], "max_length": 3}}
    with pytest.raises(ConfigError, match=r"at most one argument with a null"):
        InputSpec.from_mapping({"arguments": two})


def test_requests_of_any_length_up_to_the_longest_are_answered_as_if_alone() -> None:
    """The model packs by the lengths it is given: a request's answer does not depend on the
    batch it came in. Longer than the longest, or of another feature count: a 400 that says
    what was expected."""
    service = ModelService(Packed().eval(), _handler(lengths="lengths").input, None)
    rng = np.random.default_rng(0)
    series = _series(rng, 6)
    alone = [service.handle([{"data": s}])[0] for s in series]
    together = service.handle([{"data": s} for s in series])
    for one, batched in zip(alone, together, strict=True):
        assert one["class"] == batched["class"]
        assert one["probabilities"] == pytest.approx(batched["probabilities"], abs=1e-5)
    too_long, narrow = service.handle([{"data": [[0.0] * 3] * 21}, {"data": [[0.0, 1.0]]}])
    assert too_long["code"] == 400 and too_long["expected"] == "shape [<=20, 3]"
    assert too_long["got"] == "shape [21, 3]" and narrow["got"] == "shape [1, 2]"


def test_a_request_of_several_series_is_each_padded_with_the_batch(metrics: MetricSet) -> None:
    """``{"instances": [s1, s2]}`` of series of different lengths (and the Open Inference
    Protocol's rows, of one length; an ``.npy`` array ``[N, T, F]``) was a 400 "one item a
    request": each is now an item of its own length, padded with the batch and answered as it
    is alone, a per-step answer cut at its own steps; each is a sample of the hooks."""
    import io

    handler = _handler(lengths="lengths")
    model = Packed().eval()
    rng = np.random.default_rng(3)
    pipeline = InputPipeline(handler.input)
    reference = [
        pipeline.batch([torch.tensor(s, dtype=torch.float32) for s in _series(rng, 32)])
        for _ in range(4)
    ]
    profile = build_profile(model, handler.monitoring, reference, "packed")
    service, monitor = monitored(model, handler, profile, "packed", metrics)
    series = _series(rng, 4)
    alone = [service.handle([{"data": s}])[0] for s in series]
    same = rng.standard_normal((2, 6, 3)).round(4)
    alone_same = [service.handle([{"data": s.tolist()}])[0] for s in same]
    npy = io.BytesIO()
    np.save(npy, same.astype(np.float32))
    v2 = {
        "inputs": [
            {"name": "x", "shape": [2, 6, 3], "datatype": "FP32", "data": same.ravel().tolist()}
        ]
    }
    too_long = {"instances": [series[0], [[0.0] * 3] * 21]}
    out = service.handle(
        [
            {"data": series[0]},
            {"instances": series[1:]},
            {"data": series[2:]},
            npy.getvalue(),
            v2,
            too_long,
        ]
    )
    monitor.flush()
    monitor.close()

    def close(got: dict[str, object], want: dict[str, object]) -> None:
        assert got["class"] == want["class"]
        assert got["probabilities"] == pytest.approx(want["probabilities"], abs=1e-5)

    close(out[0], alone[0])
    assert list(out[1]) == ["predictions"] and len(out[1]["predictions"]) == 3
    for got, want in zip(out[1]["predictions"], alone[1:], strict=True):
        close(got, want)
    for got, want in zip(out[2], alone[2:], strict=True):
        close(got, want)
    for got, want in zip(out[3], alone_same, strict=True):
        close(got, want)
    assert out[4]["outputs"][0]["data"] == [a["class"] for a in alone_same]
    assert out[5]["code"] == 400 and out[5]["got"] == "shape [21, 3] in item 1", out[5]
    # Each item a sample: 1 + 3 + 2 + 2 + 2 in the batch, after 4 + 2 alone.
    assert value(metrics, "hookwatch_captures_total", model="packed", layer="act") == 16
    # Served one request a batch (batchSize: 1), the model's padding was never checked: a
    # request's items must then be of one length, as nothing is padded.
    alone_served = ModelService.from_handler_config(
        model, handler, "packed", monitored=False, batch_size=1
    )
    mixed, even = alone_served.handle([{"instances": series[:2]}, {"instances": same.tolist()}])
    assert mixed["code"] == 400 and mixed["expected"].startswith("items of one length a request")
    assert [a["class"] for a in even["predictions"]] == [a["class"] for a in alone_same]


def test_padding_holds_pad_value_after_normalisation_and_the_mask_marks_steps() -> None:
    spec = InputSpec.from_mapping(
        {"shape": [None, 2], "max_length": 5, "mean": [1.0], "pad_value": -9, "mask": "m"}
    )
    batch = InputPipeline(spec).batch([torch.ones(3, 2), torch.full((1, 2), 3.0)])
    assert isinstance(batch, Padded)
    assert batch.values[0].tolist() == [[0.0, 0.0]] * 3
    assert batch.values[1].tolist() == [[2.0, 2.0], [-9.0, -9.0], [-9.0, -9.0]]
    assert batch.lengths.tolist() == [3, 1]
    assert batch.keywords()["m"].tolist() == [[True, True, True], [True, False, False]]
    # A [channels, time] series: padded along time, no steps' mask for the hooks.
    wide = InputSpec.from_mapping({"shape": [2, None], "max_length": 6})
    padded = InputPipeline(wide).batch([torch.ones(2, 4), torch.ones(2, 6)])
    assert isinstance(padded, Padded) and padded.values.shape == (2, 2, 6)
    assert padded.values[0, :, 4:].abs().sum() == 0 and padded.step_mask() is None


def test_a_per_step_answer_is_cut_at_its_own_length() -> None:
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [None, 3], "max_length": 20, "mask": "mask"},
            "monitoring": {"layers": [], "output": {"head": "logits"}},
        }
    )
    service = ModelService(Tagger().eval(), handler.input, None, output=handler.monitoring.output)
    rng = np.random.default_rng(1)
    short, long_ = rng.standard_normal((4, 3)).tolist(), rng.standard_normal((11, 3)).tolist()
    alone = service.handle([{"data": short}])[0]
    first, second = service.handle([{"data": short}, {"data": long_}])
    assert len(first["classes"]) == 4 and len(second["classes"]) == 11
    assert first["classes"] == alone["classes"]
    assert first["confidence"] == pytest.approx(alone["confidence"], abs=1e-5)


def test_the_hooks_leave_padding_out_of_what_they_read() -> None:
    """A sample's captured features are the same alone and padded beside a longer one: the
    input's per-feature means and the step activations' are over its own steps."""
    model = Packed().eval()
    handler = _handler(lengths="lengths")
    pipeline = InputPipeline(handler.input)
    short, long_ = torch.randn(3, 3), torch.randn(15, 3)
    alone = next(iter(capture_features(model, handler.monitoring, [pipeline.batch([short])])))
    pair = [pipeline.batch([short, long_])]
    padded = next(iter(capture_features(model, handler.monitoring, pair)))
    for layer in ("input", "act"):
        np.testing.assert_allclose(padded[layer][0], alone[layer][0], rtol=1e-5, atol=1e-6)
    assert alone["input"].shape == (1, 3)  # the input's three features' means


def test_a_variable_length_model_is_profiled_served_and_alarms_on_a_shift(
    metrics: MetricSet,
) -> None:
    model = Packed().eval()
    handler = _handler(lengths="lengths")
    pipeline = InputPipeline(handler.input)
    rng = np.random.default_rng(2)
    reference = [
        pipeline.batch([torch.tensor(s, dtype=torch.float32) for s in _series(rng, 32)])
        for _ in range(8)
    ]
    profile = build_profile(model, handler.monitoring, reference, "seq")
    assert {"input", "act", "output"} <= set(profile.references) and not profile.left_out
    service, monitor = monitored(model, handler, profile, "seq", metrics)
    try:
        for _ in range(6):
            service.handle([{"data": s} for s in _series(rng, 20)])
        monitor.flush()
        clean = value(metrics, ALARMS, model="seq", level="activation", detector="act")
        for _ in range(6):
            service.handle([{"data": s} for s in _series(rng, 20, shift=2.0)])
        monitor.flush()
    finally:
        monitor.close()
    assert value(metrics, "hookwatch_monitor_faults_total", model="seq", layer="act") == 0
    assert value(metrics, "hookwatch_captures_total", model="seq", layer="act") == 240
    assert clean == 0
    assert value(metrics, ALARMS, model="seq", level="activation", detector="act") >= 1


def test_archive_takes_request_bodies_of_any_length_and_layers_tries_two(
    tmp_path: Path,
) -> None:
    (tmp_path / "seq.py").write_text(MODELS)
    ref = ModelRef.parse(f"{tmp_path / 'seq.py'}:Packed")
    model, _ = own_model.load_user_model(ref, None)
    spec = InputSpec.from_mapping({"shape": [None, 3], "max_length": 20, "lengths": "lengths"})
    batch = InputPipeline(spec).batch([torch.rand(20, 3), torch.rand(10, 3)])
    found = own_model.discover_layers(model, batch)
    rows = {row.name: row for row in found}
    assert rows["input"].features == 3 and rows["act"].features == 16
    # `init --config` writes the null and its keys back, not the longest as a fixed shape.
    written = own_model.init_config(found, spec.shape or (), "float32", None, "seq.py", (), spec)
    assert "shape: [null, 3]" in written and "max_length: 20" in written
    again = HandlerConfig.from_mapping(yaml.safe_load(written)["handler"]).input
    assert (again.shape, again.length_dim, again.lengths) == ((20, 3), 0, "lengths")
    config = tmp_path / "model-config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "handler": {
                    "input": {"shape": [None, 3], "max_length": 20, "lengths": "lengths"},
                    "monitoring": {"layers": ["act"]},
                }
            }
        )
    )
    rng = np.random.default_rng(3)
    lines = [json.dumps({"data": s}) for s in _series(rng, 60)]
    (tmp_path / "ref.jsonl").write_text("\n".join(lines) + "\n")
    mar = archive_model(
        ref,
        "seq",
        config,
        tmp_path / "ref.jsonl",
        tmp_path / "store",
        tmp_path / "build",
        say=lambda _line: None,
    )
    assert mar.is_file()
    # An array reference holds samples of one length; a longer one is refused, saying why.
    np.save(tmp_path / "long.npy", np.zeros((4, 25, 3), dtype=np.float32))
    with pytest.raises(ConfigError, match=r"every sample as long \(a \.jsonl"):
        archive_model(
            ref,
            "seq",
            config,
            tmp_path / "long.npy",
            tmp_path / "store",
            tmp_path / "build2",
            say=lambda _line: None,
        )


STEPPED = '''
import torch
from torch import nn


class Stepped(nn.Module):
    """A score a step of a series, [batch, steps] (no trailing dimension)."""

    def __init__(self, keep: bool = False):
        super().__init__()
        torch.manual_seed(6)
        self.rnn = nn.GRU(1, 8, batch_first=True)
        self.out = nn.Linear(8, 1)
        self.keep = keep

    def forward(self, x):
        scores = self.out(self.rnn(x[:, :, None])[0])
        return scores if self.keep else scores.squeeze(-1)
'''


def _archive_wave(
    tmp_path: Path,
    batch_size: int,
    source: str = WAVE,
    name: str = "Wave",
    layer: str = "act",
    head: str = "logits",
    **args: object,
) -> Path:
    (tmp_path / "wave.py").write_text(source)
    config = tmp_path / "model-config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "batchSize": batch_size,
                "handler": {
                    "input": {"shape": [None], "max_length": 400},
                    "monitoring": {"layers": [layer], "output": {"head": head}},
                },
            }
        )
    )
    rng = np.random.default_rng(4)
    lines = [
        json.dumps({"data": rng.standard_normal(int(rng.integers(50, 400))).round(3).tolist()})
        for _ in range(80)
    ]
    (tmp_path / "ref.jsonl").write_text("\n".join(lines) + "\n")
    return archive_model(
        ModelRef.parse(f"{tmp_path / 'wave.py'}:{name}"),
        "wave",
        config,
        tmp_path / "ref.jsonl",
        tmp_path / "store",
        tmp_path / "build",
        args=dict(args),
        say=lambda _line: None,
    )


def test_a_model_that_reads_its_padding_is_refused_batched_and_served_alone(
    tmp_path: Path,
) -> None:
    """A model that averages over its padding answers a request by its batch's longest:
    `archive` refuses it under dynamic batching, saying how to fix it, and archives it for
    one request a batch (nothing padded, the reference neither)."""
    with pytest.raises(ConfigError, match=r"another answer for a sample padded beside a longer"):
        _archive_wave(tmp_path, 4)
    mar = _archive_wave(tmp_path, 1)
    assert mar.is_file()


def test_a_value_a_step_without_a_trailing_dimension_is_refused_batched(tmp_path: Path) -> None:
    """``[batch, steps]`` cannot be told from ``[batch, classes]`` when a batch's longest is
    as long as the classes are many, so it is answered whole: batched, a request would get
    its batch's padded steps. Found by an outside run (2026-12-07): the archive failed on
    numpy's "could not broadcast" (the output's width changed from one reference batch to
    the next). Refused batched, saying how to return it; archived for one request a batch,
    its drift left out (statistics kept); as [batch, steps, 1] archived batched."""
    with pytest.raises(ConfigError, match=r"return the output as \[batch, steps, 1\]"):
        _archive_wave(tmp_path, 4, STEPPED, "Stepped", "rnn", "values")
    mar = _archive_wave(tmp_path, 1, STEPPED, "Stepped", "rnn", "values")
    profile = build_profile_of(mar, tmp_path / "one")
    assert profile.left_out["output"] == STEPS_WIDE and "rnn" in profile.references
    assert _archive_wave(tmp_path, 4, STEPPED, "Stepped", "rnn", "values", keep=True).is_file()


def build_profile_of(mar: Path, into: Path) -> DriftProfile:
    import zipfile

    with zipfile.ZipFile(mar) as archived:
        archived.extractall(into)
    return DriftProfile.load(into / "drift-profile.npz")


def test_layers_that_read_the_padding_keep_their_statistics_not_their_drift() -> None:
    """A convolution's ``[batch, channels, time]`` has no steps the mask could name: its
    features of a request would move with the batch's longest, so its detector is left out,
    saying why; a model that packs by its lengths has none."""
    wave = _model_class(WAVE, "Wave")().eval()
    spec = InputSpec.from_mapping({"shape": [None], "max_length": 400})
    rng = np.random.default_rng(5)
    items = [torch.randn(int(rng.integers(50, 400))) for _ in range(48)]
    pipeline = InputPipeline(spec)
    batches = [pipeline.batch(items[i : i + 16]) for i in range(0, 48, 16)]
    profile = build_profile(wave, {"layers": ["act"]}, batches, "wave")
    assert profile.left_out["act"] == PADDING_READ and profile.left_out["output"] == PADDING_READ
    assert "input" in profile.references  # its length, read from the lengths themselves
    packed = Packed().eval()
    handler = _handler(lengths="lengths")
    series = [torch.randn(int(n), 3) for n in rng.integers(2, 21, 16)]
    batch = InputPipeline(handler.input).batch(series)
    assert isinstance(batch, Padded)
    plan = plan_watch(packed, handler.monitoring, "seq")
    assert padding_readers(packed, plan, batch) == {}
    # Every sample as long: the first cut to half its length is the probe.
    same = InputPipeline(handler.input).batch(torch.randn(4, 10, 3))
    assert isinstance(same, Padded)
    probe = same.probe()
    assert probe is not None and probe[1].lengths.tolist() == [5, 10]
    assert probe[0].values.shape == (1, 5, 3)


def test_a_one_dimensional_series_is_read_by_its_length_level_and_spread() -> None:
    """Token ids ``[B, T]`` are read by their count; a series of values ``[B, T]`` (a waveform)
    by its count, mean and spread over its own steps, so a louder one drifts at the input
    even at the same lengths."""
    spec = InputSpec.from_mapping({"shape": [None], "max_length": 50})
    series = [torch.full((4,), 2.0), torch.tensor([1.0, 3.0, 1.0, 3.0, 1.0, 3.0])]
    batch = InputPipeline(spec).batch(series)
    model = nn.Sequential(nn.Identity())
    features = next(iter(capture_features(model, {"layers": []}, [batch])))
    np.testing.assert_allclose(features["input"], [[4.0, 2.0, 0.0], [6.0, 2.0, 1.0]], atol=1e-6)
    rows = own_model.discover_layers(model, batch)
    assert rows[0].features == 3


def test_a_lengths_argument_is_a_mask_for_a_model_watched_in_its_own_server() -> None:
    """`monitoring.mask` naming a forward's lengths (an integer tensor [batch]): a server of
    the user's own pads its batches, and the hooks read each sample over its own steps."""
    model = Packed().eval()
    config = {"layers": ["act"], "mask": "lengths"}
    short, long_ = torch.randn(1, 4, 3), torch.randn(1, 12, 3)
    padded = torch.cat([torch.nn.functional.pad(short, (0, 0, 0, 8)), long_])
    alone = {"x": short, "lengths": torch.tensor([4])}
    both = {"x": padded, "lengths": torch.tensor([4, 12])}
    first = next(iter(capture_features(model, config, [alone])))
    second = next(iter(capture_features(model, config, [both])))
    for layer in ("input", "act"):
        np.testing.assert_allclose(second[layer][0], first[layer][0], rtol=1e-5, atol=1e-6)


class LongOnly(nn.Module):
    """Refuses series shorter than 6 steps (as a stack of unpadded convolutions would)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] < 6:
            raise RuntimeError("expected at least 6 steps")
        out: torch.Tensor = self.proj(x).mean(1)
        return out


def test_a_probe_the_model_refuses_leaves_the_profile_to_the_reference(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = InputSpec.from_mapping({"shape": [None, 3], "max_length": 20})
    batch = InputPipeline(spec).batch(torch.randn(8, 8, 3))  # every sample 8 long
    profile = build_profile(LongOnly().eval(), {"layers": ["proj"]}, [batch, batch], "long")
    assert "proj" in profile.references and not profile.left_out
    assert "could not try a sample alone and padded (RuntimeError" in caplog.text


def _archive_series(
    tmp_path: Path,
    model: str,
    config: Path,
    rng: np.random.Generator,
    series: list[list[list[float]]] | None = None,
    into: str = "",
) -> Path:
    """``model`` archived with a reference of request bodies of ``series`` (default: 60 of
    :func:`_series`), its files in ``tmp_path`` under names ending in ``into``."""
    series = _series(rng, 60) if series is None else series
    lines = [json.dumps({"data": one}) for one in series]
    (tmp_path / f"ref{into}.jsonl").write_text("\n".join(lines) + "\n")
    return archive_model(
        ModelRef.parse(model),
        model.rsplit(":", 1)[1].lower(),
        config,
        tmp_path / f"ref{into}.jsonl",
        tmp_path / f"store{into}",
        tmp_path / f"build{into}",
        say=lambda _line: None,
    )


DECODER = '''
import torch
from torch import nn


class Decoder(nn.Module):
    """A series of any length in; out, a forecast of a fixed 6 steps ([B, 6, 2]) and each
    input step's weight beside it ([B, T], none on the padding)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.proj = nn.Linear(3, 8)
        self.act = nn.Tanh()
        self.score = nn.Linear(8, 1)
        self.out = nn.Linear(8, 12)

    def forward(self, x, lengths):
        h = self.act(self.proj(x))
        own = torch.arange(x.shape[1])[None, :] < lengths[:, None]
        weights = self.score(h).squeeze(-1).masked_fill(~own, float("-inf")).softmax(-1)
        pooled = (weights[:, :, None] * h).sum(1)
        return self.out(pooled).reshape(-1, 6, 2), weights
'''


def test_a_fixed_number_of_steps_is_never_cut_and_a_part_a_step_is(tmp_path: Path) -> None:
    """A forecast of a fixed 6 steps from a series of any length: where a batch's longest
    happened to be 6 steps too, each answer was cut at its own length (a 3-step request got
    3 of the 6, by the length of the requests batched with it: found by an outside run,
    2026-12-07); an ``also`` part with a weight an input step came back with the batch's
    padding. `archive` now finds which answered parts follow the input's length (a sample
    alone and beside a longer one) and the worker cuts those, and only those."""
    import zipfile

    from tests.fakes import archived_handler, handled

    (tmp_path / "decoder.py").write_text(DECODER)
    config = tmp_path / "model-config.yaml"
    handler = {
        "input": {"shape": [None, 3], "max_length": 20, "lengths": "lengths"},
        "monitoring": {
            "layers": ["act"],
            "sample_rate": 1.0,
            "output": {"head": "values", "select": 0, "also": [1]},
        },
    }
    config.write_text(yaml.safe_dump({"batchSize": 4, "handler": handler}))
    rng = np.random.default_rng(6)
    mar = _archive_series(tmp_path, f"{tmp_path / 'decoder.py'}:Decoder", config, rng)
    with zipfile.ZipFile(mar) as archived:
        spec = json.loads(archived.read("hookwatch-model.json"))
    assert spec["answer_steps"] == ["1"]
    three, six, eleven = (rng.standard_normal((n, 3)).round(4).tolist() for n in (3, 6, 11))
    with archived_handler(mar, tmp_path / "served") as (served, context):
        (alone,) = handled(served, [{"body": {"data": three}}], context)
        assert len(alone["values"]) == 6 and len(alone["1"]) == 3, alone
        for other in (six, eleven):  # the longest as long as the forecast, and longer
            beside, _ = handled(
                served, [{"body": {"data": three}}, {"body": {"data": other}}], context
            )
            assert len(beside["values"]) == 6 and len(beside["1"]) == 3, beside
            np.testing.assert_allclose(beside["values"], alone["values"], atol=1e-5)
            np.testing.assert_allclose(beside["1"], alone["1"], atol=1e-5)
    # Every reference sample as long as the forecast: the profile read the output over the
    # probe's own steps beside a longer one and refused the model as reading its padding
    # (an outside run's 8-step decoder on a reference of 8-step samples, 2026-12-07).
    six = [rng.standard_normal((6, 3)).round(4).tolist() for _ in range(60)]
    again = _archive_series(tmp_path, f"{tmp_path / 'decoder.py'}:Decoder", config, rng, six, "6")
    assert "output" in build_profile_of(again, tmp_path / "p6").references


NESTED = '''
import torch
from torch import nn


class Encoder(nn.Module):
    """nn.TransformerEncoder given a padding mask, as built by default: in inference its
    layers pass nested tensors (each sample's own steps) from one to the next."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.embed = nn.Linear(3, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(16, 4)

    def forward(self, x, mask):
        h = self.encoder(self.embed(x), src_key_padding_mask=~mask)
        own = mask[:, :, None].float()
        return self.head((h * own).sum(1) / own.sum(1))
'''


def test_layers_that_pass_nested_tensors_are_listed_archived_and_watched(
    tmp_path: Path,
) -> None:
    """`layers`, `init` and `archive` failed on such a model ("NestedTensorImpl doesn't
    support sizes": found by an outside run, 2026-12-07), and a watched encoder layer failed
    its capture. A nested tensor is read as each sample's mean over its own steps."""
    import zipfile

    from hookwatch.tools.cli import main
    from tests.fakes import archived_handler, handled

    source = tmp_path / "encoder.py"
    source.write_text(NESTED)
    config = tmp_path / "model-config.yaml"
    handler = {
        "input": {"shape": [None, 3], "max_length": 20, "mask": "mask"},
        "monitoring": {
            "layers": ["encoder.layers.0", "encoder.layers.1"],
            "sample_rate": 1.0,
            "output": {"head": "logits"},
        },
    }
    config.write_text(yaml.safe_dump({"batchSize": 4, "handler": handler}))
    assert main(["layers", f"{source}:Encoder", "--config", str(config)]) == 0
    out = tmp_path / "init.yaml"
    assert main(["init", f"{source}:Encoder", "--config", str(config), "--out", str(out)]) == 0
    rng = np.random.default_rng(8)
    mar = _archive_series(tmp_path, f"{source}:Encoder", config, rng)
    profile = build_profile_of(mar, tmp_path / "profile")
    # Each sample's own steps: the same alone as padded, so their drift is watched.
    for layer in ("encoder.layers.0", "encoder.layers.1"):
        assert layer in profile.references and layer not in profile.left_out, profile.left_out
    with zipfile.ZipFile(mar) as archived:
        assert "hookwatch-model.json" in archived.namelist()
    short, long_ = (rng.standard_normal((n, 3)).round(4).tolist() for n in (4, 12))
    with archived_handler(mar, tmp_path / "served") as (served, context):
        (alone,) = handled(served, [{"body": {"data": short}}], context)
        beside, _ = handled(served, [{"body": {"data": short}}, {"body": {"data": long_}}], context)
        assert beside["class"] == alone["class"]
        np.testing.assert_allclose(beside["probabilities"], alone["probabilities"], atol=1e-5)
        monitor = served.service.monitor
        monitor.flush()
        assert monitor._counts().requests == 3
        faults = monitor._gate.hook_faults()
        assert not faults, faults
