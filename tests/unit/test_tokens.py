"""Transformers: token-aware statistics and drift features (attention mask, keyword forwards,
dict outputs, layer globs), per-request sampling inside a batch, and in-place safety."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hookwatch._capture import CaptureWorker
from hookwatch._config import MonitoringConfig
from hookwatch._hooks import Capture, Gate, HookSet, HookState, plan_watch, resolve_layers
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch._monitor.gate import RequestGate
from hookwatch._monitor.tally import RequestTally
from hookwatch._profile import build_profile, tracker_for
from hookwatch._stats import _masked_token_summary, _packed_token_summary, token_summary
from tests.tiny_text import TinyEncoder, encode, sentences
from tests.unit.test_hooks import ListSink

LAYERS = ["encoder.layer.*.output"]


def as_tensors(c: Capture) -> Capture:
    """The capture with tensor fields (a host capture holds numpy arrays), to compare."""
    return Capture(c.layer, *(None if f is None else torch.as_tensor(f) for f in c[1:]))


def by_layer(sink: ListSink) -> dict[str, Capture]:
    return {c.layer: as_tensors(c) for c in sink.captures}


def capture(
    model: nn.Module, batch: dict[str, torch.Tensor], mask: str | int | None = "attention_mask"
) -> dict[str, Capture]:
    config = resolve_layers(model, MonitoringConfig.from_mapping({"layers": LAYERS}))
    sink, gate = ListSink(), Gate()
    with HookSet(gate, sink).attach(model, config.layers, output_select="pooler_output", mask=mask):
        gate.set(True)
        with torch.inference_mode():
            model(**batch)
        gate.set(False)
    assert not sink.faults, sink.faults
    return by_layer(sink)


def reference_summary(x: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """token_summary written out per sample, in float64."""
    stats, features = [], []
    for sample, keep in zip(x, mask.astype(bool), strict=True):
        tokens = sample[keep].astype(np.float64)
        values = tokens.reshape(-1)
        stats.append(
            [
                values.mean(),
                values.std(),
                values.min(),
                values.max(),
                np.mean(values == 0),
                np.isnan(values).sum(),
                np.isinf(values).sum(),
            ]
        )
        features.append(tokens.mean(axis=0) if x.ndim == 3 else [keep.sum()])
    return np.array(stats), np.array(features)


def test_token_summary_leaves_padding_out_and_agrees_with_a_per_sample_reference() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 4, generator=generator)
    x[0, 1, 2] = 0.0
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    # Padding holds garbage, a NaN among it: none of it may count.
    x[0, 3:] = 1e6
    x[2, 1, 0] = float("nan")
    stats, features = token_summary(x, mask, max_features=256)
    want_stats, want_features = reference_summary(x.numpy(), mask.numpy())
    np.testing.assert_allclose(stats.numpy(), want_stats, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(features.numpy(), want_features, rtol=1e-5, atol=1e-6)
    assert features.shape == (3, 4)  # per hidden unit, not per position
    ids = torch.tensor([[101, 7, 0, 0], [101, 0, 9, 102]])
    id_stats, counts = token_summary(ids, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]), 256)
    assert counts.flatten().tolist() == [2.0, 4.0]
    assert id_stats[0, 3].item() == 101 and id_stats[0, 4].item() == 0.0  # pad ids not counted
    assert id_stats[1, 4].item() == 0.25  # a real 0 id among the tokens is


@pytest.mark.parametrize(
    "summary", [_packed_token_summary, _masked_token_summary], ids=["packed", "masked"]
)
def test_both_padded_paths_agree_with_the_per_sample_reference(
    summary: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
) -> None:
    # The host packs the tokens, a device masks the padding: the tests run on the host, so
    # the device's path is called directly, on the same cases.
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, 5, generator=generator)
    mask = torch.tensor(
        [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0]]
    )  # a full row, an empty one, a left-padded one
    x[0] = x[0].abs() + 0.5  # a minimum above zero: no sample starts from a zero of its own
    x[3, 2, :2] = 0.0
    x[0, 4:] = float("inf")  # in the padding: counts for nothing
    x[3, 3, 1] = float("nan")  # among the tokens: counted, and not a zero
    x[1, 2, 0] = float("-inf")
    valid = mask.to(torch.bool)
    stats, features = summary(x, valid, 3)
    assert features.shape == (4, 3)
    # A sample without tokens reads zeros (the reference has nothing to reduce).
    assert not stats[2].any() and not features[2].any()
    rows = [0, 1, 3]
    with np.errstate(invalid="ignore"):  # the reference's spread of an -Inf row is NaN
        want_stats, want_features = reference_summary(x.numpy()[rows], mask.numpy()[rows])
    got_stats, got_features = stats.numpy()[rows], features.numpy()[rows]
    # Row 0 is finite; 1 holds an -Inf and 3 a NaN, whose mean and spread are not numbers:
    # there the counts must still be exact.
    np.testing.assert_allclose(got_stats[0], want_stats[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_features[0], want_features[0, :3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_stats[:, 4:], want_stats[:, 4:], rtol=1e-5, atol=1e-6)
    assert got_stats[1, 2] == -np.inf and np.isnan(got_stats[2, :2]).all()
    ids = torch.tensor([[101, 7, 0, 0], [101, 0, 9, 102]])
    id_stats, counts = summary(ids, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]).bool(), 256)
    assert counts.flatten().tolist() == [2.0, 4.0]
    assert id_stats[:, 4].tolist() == [0.0, 0.25]
    # A model that set float64 as torch's default dtype gets the same float32 results.
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        again, _ = summary(x, valid, 3)
    finally:
        torch.set_default_dtype(default)
    assert again.dtype == torch.float32
    torch.testing.assert_close(again, stats, equal_nan=True)


def test_statistics_and_features_of_a_sentence_do_not_depend_on_its_batch_padding() -> None:
    model = TinyEncoder().eval()
    short, long = sentences(2, seed=3, low=3, high=3)[0], sentences(1, seed=4, low=11, high=11)[0]
    alone = capture(model, encode([short]))
    padded = capture(model, encode([short, long]))
    for layer in ("encoder.layer.0.output", "encoder.layer.1.output", "input"):
        a, b = alone[layer], padded[layer]
        assert a.stats is not None and b.stats is not None
        assert a.features is not None and b.features is not None
        torch.testing.assert_close(b.stats[0], a.stats[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.features[0], a.features[0], atol=1e-5, rtol=1e-5)
    assert padded["encoder.layer.1.output"].features.shape == (2, 8)  # type: ignore[union-attr]
    assert padded["input"].features.flatten().tolist() == [5.0, 13.0]  # type: ignore[union-attr]
    # Without the mask, the same sentence reads differently once its batch is padded: the
    # failure this replaces (padding counted in each unit's mean over the positions).
    plain_alone = capture(model, encode([short]), mask=None)["encoder.layer.1.output"]
    plain_padded = capture(model, encode([short, long]), mask=None)["encoder.layer.1.output"]
    assert plain_alone.features is not None and plain_padded.features is not None
    assert plain_alone.features.shape == (1, 8) and plain_padded.features.shape == (2, 8)
    assert not torch.allclose(plain_padded.features[0], plain_alone.features[0], atol=1e-3)


def test_keyword_forward_dict_output_and_globs() -> None:
    model = TinyEncoder(layers=3).eval()
    config = resolve_layers(model, MonitoringConfig.from_mapping({"layers": LAYERS}))
    assert config.layers == tuple(f"encoder.layer.{i}.output" for i in range(3))
    batch = encode(sentences(4))
    captured = capture(model, batch)
    # The forward took only keyword arguments: the input pre-hook saw the token ids.
    assert set(captured) == {"input", *config.layers, "output"}
    # The dict output's selected tensor is a pooled [B, H]: reduced as any flat output.
    output = captured["output"]
    assert output.features is not None and output.features.shape == (4, 8)
    # Attention returns a tuple (output, weights): the first tensor, [B, T, H], is watched.
    attention = capture_one(model, batch, "encoder.layer.0.attention")
    assert attention.features is not None and attention.features.shape == (4, 8)


def capture_one(model: nn.Module, batch: dict[str, torch.Tensor], layer: str) -> Capture:
    sink, gate = ListSink(), Gate()
    with HookSet(gate, sink).attach(
        model, [layer], capture_input=False, capture_output=False, mask="attention_mask"
    ):
        gate.set(True)
        with torch.inference_mode():
            model(**batch)
    return by_layer(sink)[layer]


def test_the_mask_by_position_and_a_forward_without_one() -> None:
    class Positional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = TinyEncoder()

        def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            return self.inner(input_ids=ids, attention_mask=mask)["pooler_output"]

    model = Positional().eval()
    batch = encode([sentences(1, seed=5, low=4, high=4)[0], sentences(1, seed=6)[0]])
    sink, gate = ListSink(), Gate()
    with HookSet(gate, sink).attach(model, ["inner.encoder.layer.1.output"], mask=1):
        gate.set(True)
        with torch.inference_mode():
            model(batch["input_ids"], batch["attention_mask"])
            by_position = by_layer(sink)
            sink.captures.clear()
            # No mask given: no padding, every token counts (the count is the full width).
            model(batch["input_ids"][:1, :6])
    assert not sink.faults
    lengths = batch["attention_mask"].sum(1).tolist()
    assert by_position["input"].features.flatten().tolist() == lengths  # type: ignore[union-attr]
    assert by_layer(sink)["input"].features.flatten().tolist() == [6.0]  # type: ignore[union-attr]
    torch.testing.assert_close(
        by_layer(sink)["inner.encoder.layer.1.output"].features[0],  # type: ignore[index]
        by_position["inner.encoder.layer.1.output"].features[0],  # type: ignore[index]
        atol=1e-5,
        rtol=1e-5,
    )


def test_a_mask_that_is_not_a_tensor_switches_the_mask_hook_off_visibly() -> None:
    class TakesAnyMask(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, attention_mask: object = None) -> torch.Tensor:
            out: torch.Tensor = self.fc(x)
            return out

    model = TakesAnyMask().eval()
    sink, gate = ListSink(), Gate()
    hooks = HookSet(gate, sink).attach(model, ["fc"], capture_input=False, mask="attention_mask")
    gate.set(True)
    with torch.inference_mode():
        out = model(torch.ones(2, 3, 4), attention_mask="all of them")
    assert out.shape == (2, 3, 4)  # the request is served
    assert [layer for layer, _ in sink.faults] == ["all"]
    assert "attention mask" in str(sink.faults[0][1]) and "got str" in str(sink.faults[0][1])
    # Token layers fall back to plain reductions; the mask hook stays off.
    assert [c.layer for c in sink.captures] == ["fc", "output"]
    hooks.detach()


def test_a_batch_is_sampled_whole_with_every_text_of_its_requests() -> None:
    tally = RequestTally("m", MetricSet())
    gate = RequestGate("m", 0.5, lambda record: True, tally, seed=3)
    scopes = [gate.request(8) for _ in range(400)]
    assert sum(s.requests for s in scopes) == 3200
    # Per forward, not per request: about half of the batches, each all or nothing.
    assert all(s.picked in (0, 8) and s._rows is None for s in scopes)
    assert 160 < sum(1 for s in scopes if s.picked) < 240  # Binomial(400, 0.5): sd 10
    texts = RequestGate("m", 0.5, lambda record: True, tally, seed=1)
    scopes = [texts.request(3, sizes=[2, 1, 3]) for _ in range(50)]
    sampled = [s for s in scopes if s.picked]
    assert sampled and len(sampled) < 50
    assert all(s.picked == 3 and s._rows is None and s._batch == 6 for s in sampled)
    # Cut short by the per-second cap (a bucket of 2 samples), a request of several texts is
    # still captured whole: the rows of the first 2 requests, 3 of the batch's 6.
    capped = RequestGate("m", 1.0, lambda record: True, tally, max_per_s=2.0)
    scope = capped.request(3, sizes=[2, 1, 3])
    assert scope.picked == 2 and scope._batch == 6
    assert scope._rows is not None and scope._rows.tolist() == [0, 1, 2]


def test_only_the_sampled_requests_rows_are_captured_with_their_mask(
    metrics: MetricSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = TinyEncoder().eval()
    # A forward is sampled whole; only the per-second cap captures part of one. Sampling
    # unset with a cap of 3 a second, at a share of 1: the first forward of 6 takes the
    # bucket's 3 samples.
    config = MonitoringConfig.from_mapping(
        {
            "layers": LAYERS,
            "max_sampled_per_s": 3,
            "seed": 7,
            "mask": "attention_mask",
            "output": {"head": "embedding", "select": "pooler_output"},
        }
    )
    texts = sentences(6, seed=8)
    batch = encode(texts)
    records: list[dict[str, Capture]] = []

    def keep(worker: CaptureWorker[Any], record: Any) -> bool:
        records.append({c[0]: as_tensors(Capture(*c)) for c in record})
        return True

    # Each record as the capture buffer is offered it, in the request's thread.
    monkeypatch.setattr(CaptureWorker, "offer", keep)
    monitor = Monitor(model, plan_watch(model, config, "tiny"), metrics=metrics)
    monitor._gate.sample_rate = 1.0
    scopes = 0
    while not any(0 < len(r["input"].stats) < 6 for r in records):  # type: ignore[arg-type]
        with torch.inference_mode(), monitor.request(6):
            model(**batch)
        scopes += 1
        assert scopes < 50
    monitor.close()
    record = next(r for r in records if 0 < len(r["input"].stats) < 6)  # type: ignore[arg-type]
    counts = record["input"].features.flatten().tolist()  # type: ignore[union-attr]
    # Each captured row is one of the batch's sentences, with its own token count.
    lengths = [len(t) + 2 for t in texts]
    assert all(c in lengths for c in counts)
    alone = {
        len(t) + 2: capture(model, encode([t]))["encoder.layer.1.output"].features[0]  # type: ignore[index]
        for t in texts
    }
    for count, row in zip(counts, record["encoder.layer.1.output"].features, strict=True):  # type: ignore[arg-type]
        torch.testing.assert_close(row, alone[int(count)], atol=1e-5, rtol=1e-5)


def test_a_text_profile_and_monitor_see_no_drift_in_differently_padded_batches(
    metrics: MetricSet,
) -> None:
    model = TinyEncoder().eval()
    config = MonitoringConfig.from_mapping(
        {
            "layers": LAYERS,
            "sample_rate": 1.0,
            "mask": "attention_mask",
            "output": {"head": "embedding", "select": "pooler_output"},
            "drift": {"window": 60, "bins": 5},
        }
    )
    reference = [encode(sentences(16, seed=s)) for s in range(20)]
    profile = build_profile(model, config, reference, "tiny")
    assert {"input", "encoder.layer.0.output", "encoder.layer.1.output", "output"} <= set(
        profile.references
    )
    assert profile.references["encoder.layer.1.output"].edges.shape[0] == 8
    plan = plan_watch(model, config, "tiny")
    monitor = Monitor(model, plan, metrics=metrics, drift=tracker_for(profile, plan.config, "t"))
    # Same kind of sentences, one alone and seven together: padding differs, drift must not
    # show.
    for seed in range(100, 140):
        texts = sentences(8, seed=seed)
        for batch in (texts[:1], texts[1:]):
            with torch.inference_mode(), monitor.request(len(batch)):
                model(**encode(batch))
    monitor.flush()
    states = monitor._hooks.layer_states()
    monitor.close()
    assert set(states.values()) == {HookState.ATTACHED} and not monitor._processor.faults
    samples = metrics.sample_values()

    def total(name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))

    assert total("hookwatch_captures_total", layer="encoder.layer.1.output") == 40 * 8
    for detector in ("input", "encoder.layer.1.output", "output"):
        assert total("hookwatch_drift_windows_total", detector=detector) > 0, detector
    assert total("hookwatch_drift_alarms_total") == 0
    assert total("hookwatch_drift_sequential_alarms_total") == 0


class InPlaceAfter(nn.Module):
    """A watched Linear whose output the next step rewrites in place, twice over."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        out: torch.Tensor = self.act(h)
        out.mul_(0.0)  # and one more in-place op on the same storage
        return out


@pytest.mark.parametrize("copy_limit", [0, 4096], ids=["reduced-in-hook", "owned-copy"])
def test_in_place_operations_after_a_hook_never_reach_what_it_captured(copy_limit: int) -> None:
    torch.manual_seed(0)
    model = InPlaceAfter().eval()
    x = torch.randn(5, 6)
    with torch.inference_mode():
        expected = model.fc(x)
    sink, gate = ListSink(), Gate()
    with HookSet(gate, sink, copy_limit=copy_limit).attach(
        model, ["fc"], capture_input=False, capture_output=False
    ):
        gate.set(True)
        with torch.inference_mode():
            model(x)
    fc = by_layer(sink)["fc"]
    if copy_limit:
        assert fc.raw is not None
        torch.testing.assert_close(fc.raw, expected)
    else:
        assert fc.stats is not None and fc.features is not None
        assert fc.stats[:, 2].min().item() < 0  # the pre-ReLU minimum survived
        torch.testing.assert_close(fc.features, expected)


def test_in_place_operations_after_a_token_hook_or_a_partial_sample_never_reach_it() -> None:
    class Rewrites(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = TinyEncoder()

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask)
            return hidden["last_hidden_state"].relu_()

    model = Rewrites().eval()
    batch = encode(sentences(3, seed=2))
    with torch.inference_mode():
        clean = model.inner(**batch)["last_hidden_state"]
    want, _ = token_summary(clean, batch["attention_mask"], 256)
    sink, gate = ListSink(), Gate()
    with HookSet(gate, sink, copy_limit=1 << 20).attach(
        model, ["inner.encoder.layer.1.output"], mask="attention_mask"
    ):
        gate.set(True, rows=torch.tensor([0, 2]), batch=3)
        with torch.inference_mode():
            model(**batch).mul_(0.0)  # the caller rewrites the answer in place
    captured = by_layer(sink)
    layer = captured["inner.encoder.layer.1.output"]
    assert layer.stats is not None
    torch.testing.assert_close(layer.stats, want[[0, 2]])
    assert layer.stats[:, 2].min().item() < 0  # not the ReLU'd, zeroed tensor
    # The output was zeroed in place after the forward returned; its capture was not.
    output = captured["output"]
    relu_want, _ = token_summary(clean.relu(), batch["attention_mask"], 256)
    assert output.stats is not None
    torch.testing.assert_close(output.stats, relu_want[[0, 2]])
    assert output.stats[:, 0].min().item() > 0
