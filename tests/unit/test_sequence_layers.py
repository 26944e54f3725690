"""Sequence layers read per hidden unit, on a real recurrent model (issue 28, items 6 and 7).

The model is a small CRNN, a text recognizer's shape: a Conv2d stem, a Conv1d over the width,
a 2-layer bidirectional LSTM and a Linear CTC head giving per-position logits ``[B, T, C]``.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch import nn

import hookwatch
from hookwatch._config import HandlerConfig, MonitoringConfig
from hookwatch._drift import derive
from hookwatch._hooks import Capture, Gate, HookSet, as_array, feature_reading, resolve_layers
from hookwatch._metrics import MetricSet
from hookwatch._names import OUTPUT_LAYER, STATISTICS, level_of
from hookwatch._profile import build_profile
from hookwatch._profile.builder import capture_features
from hookwatch._service import BatchResult, ModelService
from hookwatch._stats import feature_rows, position_summary, reduce_rows

STEPS, HIDDEN, CLASSES = 15, 24, 11

CRNN_SOURCE = '''
import torch
from torch import nn


class CRNN(nn.Module):
    """Conv2d stem -> Conv1d over the width -> 2-layer BiLSTM -> Linear CTC head [B, T, C]."""

    def __init__(self, batch_first: bool = True, classes: int = 11) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.stem = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d((2, 1))
        )
        self.conv1d = nn.Conv1d(32, 16, 3, padding=1)
        self.rnn = nn.LSTM(16, 12, num_layers=2, bidirectional=True, batch_first=batch_first)
        self.act = nn.Tanh()
        self.head = nn.Linear(24, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.stem(x).flatten(1, 2)  # [B, 32, T]
        f = torch.relu(self.conv1d(f)).transpose(1, 2)  # [B, T, 16]
        hidden, _ = self.rnn(f if self.batch_first else f.transpose(0, 1))
        hidden = self.act(hidden)  # [B, T, 24], or [T, B, 24] sequence-first
        if not self.batch_first:
            hidden = hidden.transpose(0, 1)
        out: torch.Tensor = self.head(hidden)  # [B, T, classes]
        return out
'''

_namespace: dict[str, object] = {}
exec(compile(CRNN_SOURCE, "crnn.py", "exec"), _namespace)
CRNN: type[nn.Module] = _namespace["CRNN"]  # type: ignore[assignment]

EMBEDDING = {"head": "embedding"}
LAYERS = ["conv1d", "rnn", "act", "head"]


def crnn(batch_first: bool = True, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = CRNN(batch_first=batch_first)
    # Batch norm statistics that are not the identity, so the stem is a real map.
    norm = model.get_submodule("stem.1")
    assert isinstance(norm, nn.BatchNorm2d)
    assert norm.running_mean is not None and norm.running_var is not None
    norm.running_mean.uniform_(-0.2, 0.2)
    norm.running_var.uniform_(0.5, 1.5)
    return model.eval()


def images(batches: int, rows: int = 8, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(rows, 1, 8, STEPS, generator=generator) for _ in range(batches)]


def activations(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each watched module's output for ``x``, batch-first, by plain forward hooks."""
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for name in LAYERS:
        module = model.get_submodule(name)

        def keep(_m: nn.Module, _a: object, out: object, name: str = name) -> None:
            tensor = out[0] if isinstance(out, tuple) else out
            assert isinstance(tensor, torch.Tensor)
            seen[name] = tensor.detach().clone()

        handles.append(module.register_forward_hook(keep))
    try:
        with torch.inference_mode():
            seen[OUTPUT_LAYER] = model(x)
    finally:
        for handle in handles:
            handle.remove()
    if not getattr(model, "batch_first", True):
        for name in ("rnn", "act"):
            seen[name] = seen[name].transpose(0, 1)
    return seen


def by_hand_statistics(x: torch.Tensor) -> np.ndarray:
    flat = x.reshape(len(x), -1).double()
    return np.stack(
        [
            flat.mean(1).numpy(),
            flat.std(1, unbiased=False).numpy(),
            flat.amin(1).numpy(),
            flat.amax(1).numpy(),
            (flat == 0).double().mean(1).numpy(),
        ],
        axis=1,
    )


class Sink:
    def __init__(self) -> None:
        self.captures: dict[str, Capture] = {}
        self.faults: list[tuple[str, BaseException]] = []

    def offer(self, capture: Capture) -> bool:
        self.captures[capture.layer] = capture
        return True

    def on_fault(self, layer: str, error: BaseException) -> None:
        self.faults.append((layer, error))


def test_the_feature_rule_is_decided_by_module_type() -> None:
    model = crnn()
    readings = {name: feature_reading(model, name) for name in ("stem.0", "stem.1", "stem.2")}
    assert all(not r.units_last for r in readings.values())
    assert readings["stem.2"].by == "after" and readings["stem.2"].source == "BatchNorm2d"
    assert feature_reading(model, "conv1d") == (False, "type", "Conv1d")
    assert feature_reading(model, "rnn") == (True, "type", "LSTM")
    assert feature_reading(model, "head") == (True, "type", "Linear")
    # A Tanh, a module of no known class, reads as the LSTM registered before it; a block
    # as the last known module inside it; the model's output as its last known module.
    assert feature_reading(model, "act") == (True, "after", "LSTM")
    assert feature_reading(model, "stem") == (False, "inside", "MaxPool2d")
    assert feature_reading(model, "") == (True, "inside", "Linear")
    # Inferred, only a [B, T, H] is read by its last dimension; by type, any map.
    assert feature_reading(model, "act").max_dims == 3
    assert feature_reading(model, "head").max_dims > 4
    # Nothing known anywhere: channels-first.
    lone = nn.Sequential(nn.Identity(), nn.Tanh())
    assert feature_reading(lone, "1") == (False, "default", "")


@pytest.mark.parametrize("copy_limit", [0, 1 << 20])
def test_a_recurrent_layer_is_read_per_hidden_unit_as_the_mean_over_its_steps(
    copy_limit: int,
) -> None:
    """The hook's features of a [B, T, H] layer are its H units, each the mean over T, and
    its statistics those of every value; a Conv1d [B, C, L] keeps its C channels. Both in the
    hook (copy_limit 0) and from a raw copy reduced on the capture thread."""
    model, x = crnn(), images(1)[0]
    expected = activations(model, x)
    sink, gate = Sink(), Gate()
    with HookSet(gate, sink, max_features=256, copy_limit=copy_limit).attach(
        model, LAYERS, capture_input=False, output_head="embedding"
    ):
        gate.set(True, None, len(x))
        with torch.inference_mode():
            model(x)
        gate.set(False)
    assert not sink.faults
    for layer in [*LAYERS, OUTPUT_LAYER]:
        capture = sink.captures[layer]
        activation = expected[layer]
        if capture.raw is not None:
            raw = as_array(capture.raw)
            stats, features = reduce_rows(raw), feature_rows(raw, 256)
        else:
            assert capture.stats is not None and capture.features is not None
            stats, features = as_array(capture.stats), as_array(capture.features)
        if layer == "conv1d":
            assert activation.shape == (8, 16, STEPS)
            by_hand = activation.mean(dim=2)  # C channels, each over its L steps
        else:
            assert activation.shape[:2] == (8, STEPS)
            by_hand = activation.mean(dim=1)  # H units, each over its T steps
        assert features.shape == by_hand.shape
        np.testing.assert_allclose(features, by_hand.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            stats[:, : STATISTICS.index("nan_count")],
            by_hand_statistics(activation),
            rtol=1e-4,
            atol=1e-6,
        )


def test_a_profile_tests_drift_per_hidden_unit() -> None:
    model = crnn()
    config = MonitoringConfig.from_mapping({"layers": LAYERS, "output": EMBEDDING})
    data = images(4)
    captured = list(capture_features(model, config, data))
    for batch, features in zip(data, captured, strict=True):
        expected = activations(model, batch)
        np.testing.assert_allclose(
            features["rnn"], expected["rnn"].mean(dim=1).numpy(), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            features["conv1d"], expected["conv1d"].mean(dim=2).numpy(), rtol=1e-5, atol=1e-6
        )
    profile = build_profile(model, config, data, "crnn")
    widths = {name: len(ref.kept) + len(ref.dropped) for name, ref in profile.references.items()}
    assert widths == {
        "input": 8 * STEPS,  # the input's 1x8x15 map fits the budget: every value
        "conv1d": 16,
        "rnn": HIDDEN,
        "act": HIDDEN,
        "head": CLASSES,
        "output": CLASSES,
    }


def test_a_profile_read_per_step_is_stale_and_its_layers_drift_is_off_visibly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A profile built before sequence layers were read per hidden unit (every layer read by
    dimension 1: a [B, T, H] layer's T steps) is refused per layer on its first capture: one
    line naming the layer, the profile's feature count, the hooks' and "rebuild the profile";
    that layer's drift is off (a fault), the layers read as before keep their drift tests."""
    from hookwatch import _hooks
    from hookwatch._hooks import FeatureReading

    model = crnn()
    config = MonitoringConfig.from_mapping(
        {"layers": LAYERS, "output": EMBEDDING, "sample_rate": 1.0, "drift": {"window": 20}}
    )
    with monkeypatch.context() as before:
        before.setattr(_hooks, "feature_reading", lambda root, path: FeatureReading(False, "old"))
        old = build_profile(model, config, images(6), "crnn")
    widths = {name: len(ref.kept) + len(ref.dropped) for name, ref in old.references.items()}
    assert widths == {
        "input": 8 * STEPS, "conv1d": 16, "rnn": STEPS, "act": STEPS, "head": STEPS, "output": STEPS
    }  # fmt: skip
    metrics = MetricSet(CollectorRegistry())
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        monitor = hookwatch.watch(model, config, "crnn", profile=old, metrics=metrics)
        for x in images(6, seed=5):
            with torch.inference_mode(), monitor.request(len(x)):
                model(x)
        assert monitor.flush(10)
        monitor.close()
    stale = {r.getMessage() for r in caplog.records if "stale profile" in r.getMessage()}
    now = {"rnn": HIDDEN, "act": HIDDEN, "head": CLASSES, "output": CLASSES}
    assert len(stale) == len(now), stale
    for layer, width in now.items():
        (line,) = [m for m in stale if f"on layer {layer!r}" in m]
        assert "\n" not in line
        assert f"expected {STEPS} features per sample (the profile's), got {width}" in line
        assert "rebuild the profile" in line and "drift for that layer is off" in line
    values = metrics.sample_values()

    def faults(layer: str) -> float:
        key = ("hookwatch_monitor_faults_total", (("layer", layer), ("model", "crnn")))
        return values.get(key, 0.0)

    assert {layer: faults(layer) for layer in [*now, "conv1d", "input"]} == {
        **dict.fromkeys(now, 1.0), "conv1d": 0.0, "input": 0.0
    }  # fmt: skip
    # The layers read as before still test drift: conv1d's windows were scored.
    window = (
        "hookwatch_drift_windows_total",
        (("detector", "conv1d"), ("level", level_of("conv1d")), ("model", "crnn")),
    )
    assert values[window] > 0


def test_the_sequence_first_twin_matches_its_batch_first_twin() -> None:
    """The same CRNN with a sequence-first LSTM ([T, B, H]) is read as the batch-first one:
    the same profile, and the same statistics and drift windows when watched."""
    seq_first, twin = crnn(batch_first=False), crnn(batch_first=True)
    twin.load_state_dict(seq_first.state_dict())
    config = {"layers": LAYERS, "output": EMBEDDING, "sample_rate": 1.0, "drift": {"window": 8}}
    reference = images(4)
    profiles = [build_profile(m, config, reference, "crnn") for m in (seq_first, twin)]
    for name, ref in profiles[1].references.items():
        np.testing.assert_allclose(profiles[0].references[name].edges, ref.edges, rtol=1e-5)
    inputs = [*images(10, rows=3, seed=2), *images(2, rows=STEPS, seed=3)]
    sets = []
    for model, profile in zip((seq_first, twin), profiles, strict=True):
        metrics = MetricSet(CollectorRegistry())
        monitor = hookwatch.watch(model, config, "crnn", metrics=metrics, profile=profile)
        with torch.inference_mode():
            for x in inputs:  # the last two as long as their sequence: [15, 15, 24] either way
                with monitor.request(len(x)):
                    model(x)
        monitor.flush()
        monitor.close()
        sets.append(metrics.sample_values())
    ours, theirs = sets
    watched = {k: v for k, v in theirs.items() if k[0].startswith("hookwatch_activation_")}
    assert watched and all(
        ours[k] == pytest.approx(v, rel=1e-4, abs=1e-6) for k, v in watched.items()
    )
    windows = {k: v for k, v in theirs.items() if k[0] == "hookwatch_drift_windows_total"}
    assert any(v > 0 for v in windows.values())
    assert all(ours[k] == v for k, v in windows.items())


def by_hand_positions(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-position classification of ``x`` by hand, in float64: softmax over the classes of
    each position, its argmax and top probability, their means over the positions."""
    with torch.inference_mode():
        p = torch.softmax(model(x).double(), dim=-1)
    top = p.max(dim=-1)
    shares = nn.functional.one_hot(top.indices, CLASSES).double().mean(dim=1)
    return {
        "classes": top.indices,
        "top": top.values,
        "confidence": top.values.mean(dim=1),
        "entropy": -(p * p.log()).sum(dim=-1).mean(dim=1),
        "shares": shares,
        # Ties to the first class, as numpy's and torch's argmax.
        "most_frequent": torch.tensor([int(np.argmax(row)) for row in shares.numpy()]),
    }


def test_a_logits_head_over_positions_is_read_per_position() -> None:
    model = crnn()
    config = resolve_layers(model, MonitoringConfig.from_mapping({"layers": ["rnn"]}))
    x = images(1, rows=6, seed=7)[0]
    hand = by_hand_positions(model, x)
    features = next(iter(capture_features(model, config, [x])))[OUTPUT_LAYER]
    assert features.shape == (6, CLASSES + 2)
    derived = derive(OUTPUT_LAYER, features, positions=True)
    assert set(derived) == {"output", "confidence", "entropy", "class_mix"}
    np.testing.assert_allclose(derived["output"], hand["shares"].numpy(), atol=1e-6)
    np.testing.assert_allclose(derived["confidence"][:, 0], hand["confidence"], rtol=1e-5)
    np.testing.assert_allclose(derived["entropy"][:, 0], hand["entropy"], rtol=1e-5)
    assert derived["class_mix"][:, 0].tolist() == hand["most_frequent"].tolist()
    # The row's argmax, which class-conditioned statistics are keyed by, is that class too.
    assert features.argmax(axis=1).tolist() == hand["most_frequent"].tolist()
    # More dimensions are a class map [batch, classes, *spatial] (segmentation), never read
    # flattened: here 2 classes over 15 x 11 positions (equal ones: every pixel's confidence
    # is one half, constant, so only the class mix is tested).
    profile = build_profile(Unsqueezed(model), {"layers": ["inner.rnn"]}, images(2), "crnn")
    assert profile.positions and "class_mix" in profile.references
    assert "constant" in profile.left_out["confidence"]


def test_padded_positions_are_left_out_and_a_non_finite_position_has_no_class() -> None:
    logits = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(3))
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    masked = position_summary(logits, mask)
    assert torch.equal(masked[0], position_summary(logits[:1])[0])
    torch.testing.assert_close(masked[1], position_summary(logits[1:2, :4])[0])
    spec = HandlerConfig.from_mapping({"input": {"shape": [2]}}).input
    output = MonitoringConfig.from_mapping({}).output
    service = ModelService(nn.Identity(), spec, None, output=output)
    row = logits[0].clone()
    row[2, 1] = float("nan")
    answer = service.encode(BatchResult(1, row[None], [0], {}))[0]
    p = torch.softmax(logits[0], dim=-1).max(dim=-1)
    expected = [int(c) for c in p.indices]
    expected[2] = None
    assert answer["classes"] == expected
    assert answer["confidence"][2] is None
    assert answer["confidence"][:2] == pytest.approx(p.values[:2].tolist(), abs=1e-6)


class SequenceFirst(nn.Module):
    """The CRNN with its logits sequence-first, ``[T, B, C]``, as ``nn.CTCLoss`` takes them."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        return out.transpose(0, 1)


def test_sequence_first_logits_are_answered_and_read_as_their_batch_first_twin() -> None:
    model = crnn()
    x = images(1, rows=6, seed=7)[0]
    answers = []
    features = []
    for served in (model, SequenceFirst(model).eval()):
        config = resolve_layers(served, MonitoringConfig.from_mapping({}))
        spec = HandlerConfig.from_mapping({"input": {"shape": [1, 8, STEPS]}}).input
        service = ModelService(served, spec, None, output=config.output)
        answers.append(service.handle([{"data": sample.tolist()} for sample in x]))
        features.append(next(iter(capture_features(served, config, [x])))[OUTPUT_LAYER])
    assert answers[1] == answers[0]
    assert [len(a["classes"]) for a in answers[1]] == [STEPS] * 6
    np.testing.assert_allclose(features[1], features[0], rtol=1e-6, atol=1e-7)


class Unsqueezed(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        return torch.stack((out, out), dim=1)


def test_a_logits_head_over_positions_is_answered_and_watched_per_position() -> None:
    model = crnn()
    config = resolve_layers(
        model,
        MonitoringConfig.from_mapping(
            {"layers": ["rnn"], "sample_rate": 1.0, "drift": {"window": 20}}
        ),
    )
    profile = build_profile(model, config, images(6), "crnn")
    assert profile.positions
    assert {"output", "confidence", "entropy", "class_mix"} <= set(profile.references)
    x = images(1, rows=24, seed=7)[0]
    hand = by_hand_positions(model, x)
    metrics = MetricSet(CollectorRegistry())
    monitor = hookwatch.watch(model, config, "crnn", metrics=metrics, profile=profile)
    spec = HandlerConfig.from_mapping({"input": {"shape": [1, 8, STEPS]}}).input
    service = ModelService(model, spec, monitor, output=config.output)
    answers = service.handle([{"data": sample.tolist()} for sample in x])
    monitor.flush()
    monitor.close()
    for answer, classes, top in zip(answers, hand["classes"], hand["top"], strict=True):
        assert set(answer) == {"classes", "confidence"}
        assert answer["classes"] == classes.tolist()  # one per position: STEPS of them
        assert answer["confidence"] == pytest.approx(top.tolist(), abs=2e-6)
    values = metrics.sample_values()
    for detector in ("output", "confidence", "entropy", "class_mix"):
        key = (
            "hookwatch_drift_windows_total",
            (("detector", detector), ("level", level_of(detector)), ("model", "crnn")),
        )
        assert values[key] > 0, detector
    faults = ("hookwatch_monitor_faults_total", (("layer", "output"), ("model", "crnn")))
    assert values.get(faults, 0) == 0
    # Class-conditioned statistics count each sample under its most frequent class.
    counted = {
        dict(labels)["class"]: v
        for (name, labels), v in values.items()
        if name == "hookwatch_class_activation_statistic_count"
        and dict(labels)["layer"] == "rnn"
        and dict(labels)["statistic"] == "mean"
        and v
    }
    expected = np.bincount(hand["most_frequent"].numpy(), minlength=CLASSES)
    assert counted == {str(c): n for c, n in enumerate(expected.tolist()) if n}


def test_hookwatch_layers_says_how_each_layer_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hookwatch.tools.cli import main

    source = tmp_path / "crnn.py"
    source.write_text(textwrap.dedent(CRNN_SOURCE))
    assert main(["layers", f"{source}:CRNN", "--input-shape", f"1,8,{STEPS}"]) == 0
    table = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "24 units (mean over 15 steps)" in table["rnn"]
    assert "24 units (mean over 15 steps)" in table["act"]
    assert "11 units (mean over 15 steps)" in table["head"]
    assert "11 units (mean over 15 steps)" in table["output"]
    assert "16 channels (mean over 15 steps)" in table["conv1d"]
    assert "8 channels (mean over 8x15 positions)" in table["stem.0"]
    assert f"{HIDDEN:>8}  features: {HIDDEN} units" in table["rnn"]
    assert f"{16:>8}  features: 16 channels" in table["conv1d"]
    out = tmp_path / "config.yaml"
    assert main(["init", f"{source}:CRNN", "--input-shape", f"1,8,{STEPS}", "--out", str(out)]) == 0
    written = out.read_text()
    # The recurrent block is proposed, with activations spread over the rest of the model.
    assert "layers: [stem.2, rnn, act]" in written
    # Its output is the Linear CTC head's: per-position logits, not an embedding.
    assert "head: logits" in written and "[batch, 15, 11]" in written


TAGGER_SOURCE = '''
import torch
from torch import nn


class Tagger(nn.Module):
    """An LSTM over [B, T, 6] and a Linear over 5 classes per position: [B, T, 5]; with
    ``ctc`` log-probabilities (nn.CTCLoss's input), with ``hidden`` only the LSTM's states."""

    def __init__(self, ctc: bool = False, hidden: bool = False) -> None:
        super().__init__()
        self.rnn = nn.LSTM(6, 8, batch_first=True)
        self.classifier = nn.Linear(8, 5)
        self.ctc, self.hidden = ctc, hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(x)
        if self.hidden:
            return states
        out: torch.Tensor = self.classifier(states)
        return out.log_softmax(-1) if self.ctc else out
'''


def test_init_proposes_per_position_logits_for_a_recurrent_tagger(tmp_path: Path) -> None:
    from hookwatch.tools.cli import main
    from hookwatch.tools.own_model import discover_layers, example_input, guess_head

    namespace: dict[str, object] = {}
    exec(compile(TAGGER_SOURCE, "tagger.py", "exec"), namespace)
    tagger: type[nn.Module] = namespace["Tagger"]  # type: ignore[assignment]
    x = example_input((9, 6))
    rows = discover_layers(tagger().eval(), x)
    assert rows[-1].shapes == ((2, 9, 5),) and guess_head(rows) == "logits"
    # A log_softmax after the Linear (a CTC head) keeps it logits: their softmax is the same.
    head = torch.nn.Sequential(tagger(), torch.nn.LogSoftmax(-1))
    assert guess_head(discover_layers(head.eval(), x)) == "logits"
    assert guess_head(discover_layers(tagger(ctc=True).eval(), x)) == "logits"
    # The LSTM's own states [B, T, 8] are no classifier's: an embedding.
    assert guess_head(discover_layers(tagger(hidden=True).eval(), x)) == "embedding"
    source = tmp_path / "tagger.py"
    source.write_text(textwrap.dedent(TAGGER_SOURCE))
    out = tmp_path / "config.yaml"
    assert main(["init", f"{source}:Tagger", "--input-shape", "9,6", "--out", str(out)]) == 0
    written = out.read_text()
    assert "output: {head: logits}" in written and "[batch, 9, 5]" in written
    assert "layers: [rnn]" in written
