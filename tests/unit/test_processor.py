"""The capture processor alone: records in, tallies out; no thread, no Prometheus."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hookwatch._hooks import Capture, Gate, HookSet, as_array
from hookwatch._monitor import CaptureProcessor, Record
from hookwatch._monitor.processor import CLASS_COLUMNS
from hookwatch._names import OUTPUT_LAYER, SUMMARY_STATISTICS
from hookwatch._stats import INF_COLUMN, NAN_COLUMN, reduce_rows
from hookwatch._views import ClassSlots


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.fc(x))
        return out


class Collect:
    """A hook sink keeping one record per forward, as the request gate hands them off."""

    def __init__(self) -> None:
        self.record: dict[str, Capture] = {}

    def offer(self, capture: Capture) -> bool:
        self.record[capture.layer] = capture
        return True

    def on_fault(self, layer: str, error: BaseException) -> None:
        raise AssertionError(error)


def records(net: Net, inputs: list[torch.Tensor], copy_limit: int) -> list[Record]:
    sink, gate = Collect(), Gate()
    out: list[Record] = []
    with HookSet(gate, sink, copy_limit=copy_limit).attach(net, ["act"]):
        for x in inputs:
            gate.set(True)
            with torch.inference_mode():
                net(x)
            gate.set(False)
            out.append(tuple(sink.record.values()))
            sink.record = {}
    return out


@pytest.mark.parametrize("copy_limit", [0, 4096], ids=["reduced-in-hook", "copied"])
def test_tallies_are_the_statistics_of_every_captured_sample(copy_limit: int) -> None:
    torch.manual_seed(0)
    net = Net()
    inputs = [torch.randn(3, 4) for _ in range(5)]
    threads = threading.active_count()
    processor = CaptureProcessor("m", max_features=256)
    processor.process(records(net, inputs, copy_limit))
    assert threading.active_count() == threads  # processing starts no thread
    taken = processor.take()
    with torch.inference_mode():
        act = torch.cat([net(x) for x in inputs]).numpy()
    tally = taken.layers["act"]
    assert tally.captures == tally.finite == 15
    expected = {
        "mean": act.mean(axis=1),
        "std": act.std(axis=1),
        "min": act.min(axis=1),
        "max": act.max(axis=1),
        "zero_fraction": (act == 0).mean(axis=1),
    }
    for column, statistic in enumerate(SUMMARY_STATISTICS):
        assert tally.sums[column] == pytest.approx(expected[statistic].sum(), rel=1e-5, abs=1e-6)
    assert set(taken.layers) == {"input", "act", "output"}
    assert not taken.drift and not taken.bins  # no profile, no drift
    # take() hands over what accumulated and starts again from nothing.
    assert not processor.take().layers


def test_a_failing_layer_is_switched_off_and_the_others_carry_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    off: list[str] = []
    processor = CaptureProcessor("m", max_features=256, on_layer_off=off.append)
    original = processor._reduce

    def broken(layer: str, items: list[Capture]) -> tuple[np.ndarray, np.ndarray | None]:  # type: ignore[type-arg]
        if layer == "act":
            raise ValueError("broken statistic")
        return original(layer, items)

    monkeypatch.setattr(processor, "_reduce", broken)
    batch = records(Net(), [torch.randn(2, 4) for _ in range(3)], copy_limit=4096)
    processor.process(batch)
    processor.process(batch)
    taken = processor.take()
    assert off == ["act"]  # told once; the layer is skipped from then on
    assert processor.faults == {"act": 1}
    assert "act" not in taken.layers
    assert taken.layers["output"].captures == 12


def _class_tallies_record_by_record(
    batch: list[Record], classes: ClassSlots, layer: str
) -> tuple[np.ndarray, np.ndarray]:
    """The per-class sums the former per-record loop gave: a record's rows take the output's
    predicted classes when it has as many output rows, else no class."""
    n = len(classes.labels)
    sums, counts = np.zeros((n, len(CLASS_COLUMNS))), np.zeros(n, dtype=np.int64)
    for captures in batch:
        record = {c.layer: c for c in captures}
        if layer not in record:
            continue
        raw = record[layer].raw
        assert raw is not None
        rows = reduce_rows(as_array(raw))
        output = record.get(OUTPUT_LAYER)
        if output is None or output.raw is None or len(output.raw) != len(rows):
            continue
        logits = as_array(output.raw)
        for row, logit in zip(rows, logits, strict=True):
            if not np.isfinite(logit).all() or row[NAN_COLUMN] or row[INF_COLUMN]:
                continue
            slot = int(classes.slots(np.array([logit.argmax()]))[0])
            sums[slot] += row[CLASS_COLUMNS]
            counts[slot] += 1
    return sums, counts


def test_class_slots_of_a_whole_drain_equal_the_record_by_record_lookup() -> None:
    """Predicted classes label every layer's rows with array lookups over the whole drain;
    records of other sizes, without an output, or with non-finite logits included."""
    rng = np.random.default_rng(2)
    classes = ClassSlots.tracked([0, 2, 3])
    batch: list[Record] = []
    for i in range(120):
        rows = int(rng.integers(1, 4))
        logits = torch.from_numpy(rng.normal(size=(rows, 5)).astype(np.float32))
        if i % 17 == 0:
            logits[0, 1] = float("nan")
        act_rows = rows if i % 11 else rows + 1  # a layer whose batch differs from the output's
        act = torch.from_numpy(rng.normal(size=(act_rows, 6)).astype(np.float32))
        record = [Capture("act", None, None, act)]
        if i % 13:
            record.append(Capture(OUTPUT_LAYER, None, None, logits))
        batch.append(tuple(record))
    expected_sums, expected_counts = _class_tallies_record_by_record(batch, classes, "act")
    whole = CaptureProcessor("m", max_features=8, widths={OUTPUT_LAYER: 5}, classes=classes)
    whole.process(batch)
    pieces = CaptureProcessor("m", max_features=8, widths={OUTPUT_LAYER: 5}, classes=classes)
    for start in range(0, len(batch), 7):
        pieces.process(batch[start : start + 7])
    for processor in (whole, pieces):
        tally = processor.take().layers["act"]
        assert tally.class_counts is not None and tally.class_sums is not None
        np.testing.assert_array_equal(tally.class_counts, expected_counts)
        np.testing.assert_allclose(tally.class_sums, expected_sums, rtol=1e-5)
    assert expected_counts.sum() > 100


def test_raw_copies_reduce_alike_as_arrays_tensors_or_both() -> None:
    """Host captures hold numpy arrays, device (and bfloat16) ones tensors; a drain may hold
    both, and half precision of either kind is reduced in float32."""
    rng = np.random.default_rng(5)
    acts = [rng.normal(size=(2, 6)).astype(np.float32) for _ in range(9)]

    def tallies(records: list[Record]) -> tuple[int, np.ndarray]:
        processor = CaptureProcessor("m", max_features=8)
        processor.process(records)
        tally = processor.take().layers["act"]
        return tally.captures, tally.sums

    def held(a: np.ndarray, i: int, how: str) -> Any:
        if how == "arrays":
            return a
        if how == "tensors":
            return torch.from_numpy(a)
        if how == "both":
            return torch.from_numpy(a) if i % 2 else a
        if how == "half arrays":
            return a.astype(np.float16)
        return torch.from_numpy(a).half()  # half tensors

    want_count, want_sums = tallies([(("act", None, None, a),) for a in acts])
    assert want_count == 18
    for how in ("tensors", "both", "half arrays", "half tensors"):
        count, sums = tallies([(("act", None, None, held(a, i, how)),) for i, a in enumerate(acts)])
        assert count == want_count, how
        np.testing.assert_allclose(sums, want_sums, rtol=2e-3, atol=2e-3, err_msg=how)


def test_raw_copies_of_different_sample_shapes_in_one_drain_are_grouped() -> None:
    rng = np.random.default_rng(6)
    acts = [rng.normal(size=(1 + i % 2, 4 + 2 * (i % 3))).astype(np.float32) for i in range(12)]
    tallies = []
    for held in (list(acts), [torch.from_numpy(a) for a in acts]):
        processor = CaptureProcessor("m", max_features=8)
        processor.process([(("act", None, None, h),) for h in held])
        tally = processor.take().layers["act"]
        tallies.append((tally.captures, tally.sums))
    rows = reduce_rows(np.concatenate([a.reshape(len(a), -1)[:, :4] for a in acts]))
    assert tallies[0][0] == tallies[1][0] == len(rows) == 18
    np.testing.assert_allclose(tallies[0][1], tallies[1][1], rtol=1e-6)
