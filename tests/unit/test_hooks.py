from __future__ import annotations

import contextlib
import dataclasses
import gc
import threading
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from hookwatch._errors import ConfigError
from hookwatch._hooks import Capture, Gate, HookSet, HookState, LayerHook, select_tensor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out


class ListSink:
    def __init__(self, fail: bool = False) -> None:
        self.captures: list[Capture] = []
        self.faults: list[tuple[str, BaseException]] = []
        self.fail = fail

    def offer(self, capture: Capture) -> bool:
        if self.fail:
            raise RuntimeError("sink broke")
        self.captures.append(capture)
        return True

    def on_fault(self, layer: str, error: BaseException) -> None:
        self.faults.append((layer, error))


def test_gate_closed_captures_nothing_gate_open_captures_every_layer() -> None:
    net, sink, gate = Net(), ListSink(), Gate()
    with HookSet(gate, sink).attach(net, ["encoder.1", "head"]):
        net(torch.randn(3, 4))
        assert sink.captures == []
        gate.set(True)
        net(torch.randn(3, 4))
    assert [c.layer for c in sink.captures] == ["input", "encoder.1", "head", "output"]
    assert all(c.stats.shape == (3, 7) for c in sink.captures)


def test_an_open_gate_with_a_record_gets_plain_tuples_and_the_sink_nothing() -> None:
    net, sink, gate = Net(), ListSink(), Gate()
    record: dict[str, tuple[object, ...]] = {}
    with HookSet(gate, sink, copy_limit=64).attach(net, ["encoder.1", "head"]):
        gate.set(True, None, 3, record)
        net(torch.randn(3, 4))
        net(torch.randn(3, 4))  # a layer called again keeps its last capture
        gate.set(False)
    assert gate.record is None and sink.captures == []
    assert list(record) == ["input", "encoder.1", "head", "output"]
    for layer, capture in record.items():
        # Exact tuples, never Capture (a tuple subclass the collector keeps tracking).
        assert type(capture) is tuple and capture[0] == layer
        assert capture[1] is None and capture[2] is None and capture[3].shape[0] == 3


def test_detach_is_idempotent_and_removes_hooks() -> None:
    net, sink, gate = Net(), ListSink(), Gate()
    hooks = HookSet(gate, sink).attach(net, ["head"])
    assert hooks.state is HookState.ATTACHED
    hooks.detach()
    hooks.detach()
    assert hooks.state is HookState.DETACHED
    assert not net.head._forward_hooks and not net._forward_pre_hooks
    gate.set(True)
    net(torch.randn(1, 4))
    assert sink.captures == []
    with pytest.raises(RuntimeError, match="expected a detached HookSet"):
        hooks.attach(net, ["head"]).attach(net, ["head"])


def test_unknown_layer_fails_with_close_matches_and_registers_nothing() -> None:
    net = Net()
    with pytest.raises(ConfigError) as info:
        HookSet(Gate(), ListSink()).attach(net, ["head", "encoder.2"])
    message = str(info.value)
    assert "'encoder.2'" in message and "close matches: encoder.1" in message
    assert not net.head._forward_hooks


def test_a_faulting_hook_never_fails_the_forward_and_switches_its_layer_off() -> None:
    net, gate = Net(), Gate()
    sink = ListSink(fail=True)
    hooks = HookSet(gate, sink).attach(net, ["head"], capture_input=False, capture_output=False)
    gate.set(True)
    expected = net.head(net.encoder(torch.ones(1, 4)))
    assert torch.equal(net(torch.ones(1, 4)), expected)
    assert hooks.layer_states() == {"head": HookState.FAULTED}
    assert [layer for layer, _ in sink.faults] == ["head"]
    net(torch.ones(1, 4))
    assert len(sink.faults) == 1  # off means off: no second attempt, no second report


def test_hooks_keep_no_reference_to_activations_or_modules() -> None:
    net, sink, gate = Net(), ListSink(), Gate()
    seen: list[weakref.ReferenceType[torch.Tensor]] = []
    net.head.register_forward_hook(lambda m, a, out: seen.append(weakref.ref(out)))
    hooks = HookSet(gate, sink).attach(net, ["head"])
    gate.set(True)
    net(torch.randn(2, 4))
    gc.collect()
    assert seen and seen[0]() is None  # the captures hold reductions, not the activation
    assert len(sink.captures) == 3
    module_ref = weakref.ref(net.head)
    del net
    gc.collect()
    assert module_ref() is None
    assert all(h.module is None for h in hooks)
    hooks.detach()  # detaching after the model is gone is fine


def test_tuple_outputs_use_the_first_tensor() -> None:
    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, x

    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pair = Pair()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.pair(x)[0]

    net, sink, gate = Wrap(), ListSink(), Gate()
    HookSet(gate, sink).attach(net, ["pair"], capture_input=False, capture_output=False)
    gate.set(True)
    net(torch.ones(1, 3))
    assert sink.captures[0].stats[0, 0].item() == 2.0


def test_nested_and_dataclass_outputs_use_their_first_tensor() -> None:
    @dataclasses.dataclass
    class Out:
        note: str
        hidden: torch.Tensor

    nested = ((torch.full((2, 3), 5.0), None), ("cache", 1))
    assert select_tensor(nested) is nested[0][0]
    flat_first = ((torch.zeros(2),), torch.ones(2))
    assert select_tensor(flat_first) is flat_first[1]  # a tensor item before nested ones
    out = Out("x", torch.ones(2, 2))
    assert select_tensor(out) is out.hidden
    assert select_tensor({"a": [out]}) is out.hidden
    assert select_tensor(((((torch.ones(1),),),),)) is None  # deeper than it looks
    assert select_tensor(("text", 3, None)) is None


def test_the_gate_is_per_thread() -> None:
    net, sink, gate = Net(), ListSink(), Gate()
    HookSet(gate, sink).attach(net, ["head"], capture_input=False, capture_output=False)
    gate.set(True)
    other = threading.Thread(target=net, args=(torch.randn(2, 4),))
    other.start()
    other.join()
    assert sink.captures == []  # opened on this thread only
    net(torch.randn(2, 4))
    assert [c.layer for c in sink.captures] == ["head"]


# -- the repeat of a layer's last capture (LayerHook._hook's short path) ----------------------


def _copied(record: dict[str, tuple[object, ...]], layer: str) -> np.ndarray:
    held = record[layer][3]
    assert isinstance(held, np.ndarray)
    return held


@contextlib.contextmanager
def one_linear() -> Iterator[tuple[LayerHook, Gate, ListSink, dict[str, tuple[object, ...]]]]:
    """The hook of one Linear layer (copied whole: copy_limit), its gate open on a record of a
    batch of 3."""
    model = nn.Sequential(nn.Linear(8, 8))
    gate, sink = Gate(), ListSink()
    with HookSet(gate, sink, copy_limit=1024).attach(model, ["0"], False, False) as hooks:
        (hook,) = list(hooks)
        record: dict[str, tuple[object, ...]] = {}
        gate.set(True, None, 3, record)
        yield hook, gate, sink, record


@pytest.mark.parametrize("shape", [(3, 8), (3, 5, 8)], ids=["features", "sequence"])
def test_a_repeated_capture_keeps_what_the_general_path_keeps(shape: tuple[int, ...]) -> None:
    # A [B, T, H] output of a Linear is read by its units: the short path swaps the same axes.
    with one_linear() as (hook, _, sink, record):
        first = torch.randn(*shape)
        hook.take(first)  # the general path, which arms the short one
        general = _copied(record, "0").copy()
        assert hook._fast_shape == first.shape
        hook.take(first)  # the same value through the short path
        np.testing.assert_array_equal(_copied(record, "0"), general)
        assert _copied(record, "0").shape == general.shape
        again = torch.randn(*shape)
        hook.take(again)
        kept = _copied(record, "0")
        before = kept.copy()
        again.add_(1.0)  # an in-place change after the hook: the copy is the record's own
        assert not np.shares_memory(kept, again.numpy())
        np.testing.assert_array_equal(kept, before)
        assert sink.captures == [] and sink.faults == []


def test_what_the_short_path_does_not_check_sends_a_capture_the_general_way() -> None:
    with one_linear() as (hook, gate, sink, record):
        hook.take(torch.randn(3, 8))
        assert hook._fast_shape is not None
        # Rows picked by the per-second cap: the general path copies those rows only.
        gate.set(True, torch.tensor([0, 2]), 3, record)
        hook.take(torch.randn(3, 8))
        assert _copied(record, "0").shape == (2, 8)
        assert hook._fast_shape is None  # not re-armed by a capture of picked rows
        gate.set(True, None, 3, record)
        hook.take(torch.randn(3, 8))
        assert hook._fast_shape == (3, 8)
        # Another shape, another dtype, a tensor that needs grad: the general path each time.
        hook.take(torch.randn(3, 4))
        assert _copied(record, "0").shape == (3, 4) and hook._fast_shape == (3, 4)
        hook.take(torch.randn(3, 4, dtype=torch.float64))
        assert _copied(record, "0").dtype == np.float64
        hook.take(torch.randn(3, 4, requires_grad=True))
        assert _copied(record, "0").dtype == np.float32
        # Not a tensor: the general path's selection, and its fault when there is none.
        hook.take((torch.randn(3, 4), "extra"))
        assert _copied(record, "0").shape == (3, 4)
        assert sink.faults == []
