"""Hooks registered around sampled forwards only (``monitoring.hooks: sampled``)."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import pytest
import torch
from torch import nn

from hookwatch._config import MonitoringConfig
from hookwatch._errors import ConfigError
from hookwatch._hooks import LayerHook, plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.act(self.fc(x)))
        return out


class Probe(nn.Module):
    """Net whose forward records how many hooks its modules carry while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Net()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(hook_count(self))
        out: torch.Tensor = self.inner(x)
        return out


def hook_count(model: nn.Module) -> int:
    """Hooks on the model's modules, forward taps included (a ``forward`` of the instance:
    what the flat arm puts on a module with no hooks of its own, HookSet.arm)."""
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + tapped(m) for m in model.modules()
    )


def tapped(module: nn.Module) -> bool:
    return getattr(module.__dict__.get("forward"), "__name__", "") == "forward_tap"


def value(metrics: MetricSet, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return metrics.sample_values().get(key, float("nan"))


def config(rate: float, **extra: Any) -> MonitoringConfig:
    return MonitoringConfig.from_mapping(
        {"layers": ["inner.act"], "sample_rate": rate, "seed": 3, **extra}
    )


def serve(monitor: Monitor, model: nn.Module, requests: int) -> None:
    for _ in range(requests):
        with torch.inference_mode(), monitor.request(1):
            model(torch.randn(1, 4))


def test_unsampled_forwards_find_no_hook_and_sampled_ones_find_all(metrics: MetricSet) -> None:
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(0.3), "m"), metrics=metrics)
    assert hook_count(model) == 0  # nothing registered at load
    serve(monitor, model, 200)
    monitor.flush()
    monitor.close()
    sampled = value(metrics, "hookwatch_requests_sampled_total", model="m")
    # input pre-hook, inner.act hook, output hook: on during sampled forwards only.
    assert sorted(set(model.seen)) == [0, 3]
    assert model.seen.count(3) == sampled and 30 < sampled < 90
    assert hook_count(model) == 0
    for layer in ("input", "inner.act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == sampled


def test_other_codes_hooks_stay_and_keep_running(metrics: MetricSet) -> None:
    model = Probe()
    calls: list[str] = []
    before = model.inner.act.register_forward_hook(lambda *a: calls.append("before"))
    monitor = Monitor(model, plan_watch(model, config(0.5), "m"), metrics=metrics)
    after = model.inner.act.register_forward_hook(lambda *a: calls.append("after"))
    serve(monitor, model, 40)
    monitor.close()
    assert calls == ["before", "after"] * 40
    assert len(model.inner.act._forward_hooks) == 2
    before.remove()
    after.remove()
    assert hook_count(model) == 0


def test_hooks_come_off_when_the_forward_raises(metrics: MetricSet) -> None:
    class Raises(Probe):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            super().forward(x)  # every layer ran, the hooks with it
            raise RuntimeError("after the model's layers")

    model = Raises()
    monitor = Monitor(model, plan_watch(model, config(0.99), "m"), metrics=metrics)
    for _ in range(5):
        with pytest.raises(RuntimeError), torch.inference_mode(), monitor.request(1):
            model(torch.randn(1, 4))
        assert hook_count(model) == 0
    monitor.close()
    assert 3 in model.seen  # sampled forwards ran with the hooks on
    assert monitor._worker.accepted == 0


def test_full_sampling_keeps_the_hooks_on_until_the_rate_drops(metrics: MetricSet) -> None:
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(1.0), "m"), metrics=metrics)
    serve(monitor, model, 3)
    assert hook_count(model) == 3  # pinned between requests at rate 1
    # What drops a running monitor's rate: the capture thread giving up sets it to 0 (and
    # marks each layer off, which takes no hook off its module: the unpinning does).
    monitor._capture_off()
    serve(monitor, model, 2)
    assert hook_count(model) == 0
    assert model.seen == [3, 3, 3, 0, 0]
    monitor.close()


def test_closing_takes_pinned_hooks_off(metrics: MetricSet) -> None:
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(1.0), "m"), metrics=metrics)
    serve(monitor, model, 1)
    assert hook_count(model) == 3
    monitor.close()  # detaching takes pinned hooks off too
    assert hook_count(model) == 0


def test_the_capture_thread_giving_up_stops_registration(metrics: MetricSet) -> None:
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(1.0), "m"), metrics=metrics)
    serve(monitor, model, 2)
    monitor._capture_off()
    serve(monitor, model, 2)
    assert hook_count(model) == 0
    assert model.seen == [3, 3, 0, 0]
    monitor.close()


def test_concurrent_sampled_and_unsampled_forwards(metrics: MetricSet) -> None:
    model = Net()
    cfg = MonitoringConfig.from_mapping({"layers": ["act"], "sample_rate": 0.5, "seed": 5})
    monitor = Monitor(model, plan_watch(model, cfg, "m"), metrics=metrics)
    errors: list[BaseException] = []

    def client() -> None:
        try:
            serve(monitor, model, 300)
        except BaseException as error:  # any failure fails the test below
            errors.append(error)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monitor.flush()
    monitor.close()
    assert errors == []
    assert hook_count(model) == 0
    sampled = value(metrics, "hookwatch_requests_sampled_total", model="m")
    assert 450 < sampled < 750
    # Every sampled forward captured every layer, whatever the other threads were doing.
    for layer in ("input", "act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == sampled
    for layer in ("all", "input", "act", "output"):
        assert value(metrics, "hookwatch_monitor_faults_total", model="m", layer=layer) == 0


def test_a_failed_registration_is_a_fault_and_the_request_is_served(
    metrics: MetricSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(1.0), "m"), metrics=metrics)
    real = LayerHook.register

    def broken(self: LayerHook) -> None:
        if self.name == "output":
            raise RuntimeError("registration refused")
        real(self)

    monkeypatch.setattr(LayerHook, "register", broken)
    with torch.inference_mode(), monitor.request(1):
        out = model(torch.randn(1, 4))
    assert out.shape == (1, 3)
    monkeypatch.undo()
    assert hook_count(model) == 0  # the failed arm took every hook off again
    monitor.flush()
    monitor.close()
    assert model.seen == [0]
    assert value(metrics, "hookwatch_monitor_faults_total", model="m", layer="all") == 1


def test_always_keeps_the_hooks_registered(metrics: MetricSet) -> None:
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(0.0, hooks="always"), "m"), metrics=metrics)
    assert hook_count(model) == 3
    serve(monitor, model, 2)
    assert model.seen == [3, 3]
    monitor.close()
    assert hook_count(model) == 0


def test_a_compiled_model_keeps_its_hooks_registered(metrics: MetricSet) -> None:
    inner = Probe()
    compiled = torch.compile(inner)  # lazy: nothing compiles until it is called
    assert isinstance(compiled, nn.Module)
    monitor = Monitor(compiled, plan_watch(compiled, config(0.5), "m"), metrics=metrics)
    # Registering per sampled forward would invalidate the compiled graphs' guards.
    # (input and output hooks on the compiled wrapper, inner.act on the original module).
    assert hook_count(compiled) == 3
    monitor.close()
    assert hook_count(compiled) == 0


def test_hooks_mode_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"monitoring.hooks: expected one of \['sampled'"):
        MonitoringConfig.from_mapping({"layers": [], "hooks": "sometimes"})


def test_later_arms_put_back_the_first_ones_registrations_until_a_layer_goes_off(
    metrics: MetricSet,
) -> None:
    # After the first sampled forward, arming puts the same entries back into torch's hook
    # tables (HookSet._entries) instead of registering hook by hook; a layer switched off
    # (a fault) is left off from the next sampled forward on, and nothing stays behind.
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(1.0), "m"), metrics=metrics)
    hooks = monitor._hooks
    monitor._gate.sample_rate = 0.5  # unpinned: arm and disarm around each sampled forward
    serve(monitor, model, 40)
    assert hooks._entries is not None and len(hooks._entries) == 3
    assert sorted(set(model.seen)) == [0, 3]
    hooks.disable("inner.act")
    model.seen.clear()
    serve(monitor, model, 40)
    assert sorted(set(model.seen)) == [0, 2]
    assert hooks._entries is not None and len(hooks._entries) == 2
    assert hook_count(model) == 0
    monitor.close()
    assert hook_count(model) == 0 and hooks._entries is None


class Tapped(Probe):
    """Probe that also records whether inner.act carries a forward tap while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.taps: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.taps.append(tapped(self.inner.act))
        return super().forward(x)


def test_a_module_without_hooks_of_its_own_is_tapped_for_sampled_forwards(
    metrics: MetricSet,
) -> None:
    # From the second sampled forward (the flat arm), inner.act gets a forward tap instead of a
    # forward hook: the same captures, the same outputs, nothing left on the module after.
    model = Tapped()
    plain = Net()
    plain.load_state_dict(model.inner.state_dict())
    monitor = Monitor(model, plan_watch(model, config(0.5), "m"), metrics=metrics)
    for _ in range(60):
        x = torch.randn(1, 4)
        with torch.inference_mode(), monitor.request(1):
            out = model(x)
        with torch.inference_mode():
            assert torch.equal(out, plain(x))
        assert "forward" not in model.inner.act.__dict__
    monitor.flush()
    monitor.close()
    sampled = value(metrics, "hookwatch_requests_sampled_total", model="m")
    assert model.taps.count(True) == sampled - 1  # all but the first sampled forward
    assert model.seen.count(3) == sampled
    for layer in ("input", "inner.act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == sampled


def test_a_module_with_a_forward_of_its_own_or_hooks_keeps_a_forward_hook(
    metrics: MetricSet,
) -> None:
    # A forward set on the instance (as accelerate's hooks set one) stays the module's, and a
    # module with forward hooks keeps ours after theirs, where it sees what they return.
    model = Tapped()
    calls: list[int] = []
    own = model.inner.fc.forward

    def instance_forward(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return own(x)

    model.inner.fc.forward = instance_forward  # type: ignore[method-assign]
    model.inner.head.register_forward_hook(lambda module, args, output: output * 0)
    cfg = MonitoringConfig.from_mapping(
        {"layers": ["inner.fc", "inner.head"], "sample_rate": 0.5, "seed": 3, "copy_limit": 64}
    )
    monitor = Monitor(model, plan_watch(model, cfg, "m"), metrics=metrics)
    record: list[tuple[object, ...]] = []
    real_offer = monitor._worker.offer

    def offer(item: Any) -> bool:
        record.append(item)
        return bool(real_offer(item))

    monitor._gate._offer = offer
    serve(monitor, model, 40)
    monitor.flush()
    monitor.close()
    assert model.inner.fc.__dict__["forward"] is instance_forward and len(calls) == 40
    assert not tapped(model.inner.head) and len(model.inner.head._forward_hooks) == 1
    assert not any(model.taps)
    sampled = value(metrics, "hookwatch_requests_sampled_total", model="m")
    assert len(record) == sampled > 5
    for captured in record:
        layers = {entry[0]: entry for entry in captured}  # type: ignore[index]
        head = layers["inner.head"][3]
        assert head is not None and not head.any()  # type: ignore[union-attr]  # after theirs


def test_the_service_hands_the_models_input_and_output_to_their_hooks(
    metrics: MetricSet,
) -> None:
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(0.5), "m"), metrics=metrics)
    path = monitor._request_path()
    assert path.take_input is not None and path.take_output is not None
    for _ in range(60):
        x = torch.randn(1, 4)
        with torch.inference_mode(), monitor.request(1):
            path.take_input(x)
            out = model(x)
            path.take_output(out)
    monitor.flush()
    monitor.close()
    sampled = value(metrics, "hookwatch_requests_sampled_total", model="m")
    # On the model itself, inner.act's hook (or tap) alone; input and output from the caller.
    assert sorted(set(model.seen)) == [0, 1] and model.seen.count(1) == sampled
    for layer in ("input", "inner.act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == sampled
    assert hook_count(model) == 0


def test_the_model_keeps_its_own_hooks_where_the_caller_cannot_take_them(
    metrics: MetricSet,
) -> None:
    # A mask pre-hook must read the forward's arguments before the input's hook does, and
    # hooks registered for good (always) stay where they are.
    for extra in ({"mask": "attention_mask"}, {"hooks": "always"}):
        model = Probe()
        monitor = Monitor(model, plan_watch(model, config(0.5, **extra), "m"), metrics=metrics)
        path = monitor._request_path()
        assert path.take_input is None and path.take_output is None
        monitor.close()


def test_a_failed_arm_leaves_the_callers_hooks_closed_too(
    metrics: MetricSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Probe()
    monitor = Monitor(model, plan_watch(model, config(0.99), "m"), metrics=metrics)
    path = monitor._request_path()
    assert path.take_input is not None and path.take_output is not None
    monkeypatch.setattr(monitor._hooks, "arm", lambda: False)
    monitor._gate.arm_with(monitor._hooks.arm, monitor._hooks.disarm)
    with torch.inference_mode(), monitor.request(1):
        x = torch.randn(1, 4)
        path.take_input(x)
        path.take_output(model(x))
    monitor.flush()
    monitor.close()
    for layer in ("input", "output"):
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == 0


def test_a_tapped_forward_shows_the_modules_own_signature(metrics: MetricSet) -> None:
    # Code that reads a layer's forward during a sampled forward (a pre-hook here) finds the
    # tap, with the bound forward's signature.
    model = Probe()
    seen: list[tuple[bool, str]] = []
    model.inner.fc.register_forward_pre_hook(
        lambda module, args: seen.append((tapped(module), str(inspect.signature(module.forward))))
    )
    cfg = MonitoringConfig.from_mapping({"layers": ["inner.fc"], "sample_rate": 1.0, "seed": 3})
    monitor = Monitor(model, plan_watch(model, cfg, "m"), metrics=metrics)
    monitor._gate.sample_rate = 0.99  # unpinned: the flat arm, from the second forward on
    serve(monitor, model, 6)
    monitor.close()
    assert [t for t, _ in seen].count(True) >= 4
    assert {signature for _, signature in seen} == {str(inspect.signature(nn.Linear(4, 4).forward))}


def test_hooks_held_at_full_sampling_are_forward_hooks_never_taps(metrics: MetricSet) -> None:
    # At a rate of 1 the hooks stay on between forwards, where other code may copy or save the
    # model: a tap there would be an instance attribute bound to the original module.
    model = Probe()
    cfg = MonitoringConfig.from_mapping({"layers": ["inner.fc"], "sample_rate": 0.5, "seed": 3})
    monitor = Monitor(model, plan_watch(model, cfg, "m"), metrics=metrics)
    serve(monitor, model, 20)  # the flat arm's entries exist: taps on sampled forwards
    monitor._gate.sample_rate = 1.0
    serve(monitor, model, 3)
    assert hook_count(model) == 3 and not any(tapped(m) for m in model.modules())
    assert len(model.inner.fc._forward_hooks) == 1
    monitor._gate.sample_rate = 0.5
    serve(monitor, model, 20)  # unpinned: taps again on sampled forwards, none between
    assert hook_count(model) == 0
    monitor.close()
