"""The capture processor alone: records in, tallies out; no thread, no Prometheus."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn

from hookwatch._hooks import Capture, Gate, HookSet
from hookwatch._monitor import CaptureProcessor, Record
from hookwatch._names import SUMMARY_STATISTICS


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
        self.record: Record = {}

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
            out.append(sink.record)
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
