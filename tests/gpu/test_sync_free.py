"""On a GPU, a sampled forward under hookwatch forces no host synchronisation.

The hooks reduce on the device and queue the small results; the capture thread pays for the
copies. ``torch.cuda.set_sync_debug_mode("error")`` turns any synchronising call made during
the forward (``.item()``, ``.cpu()``, a data-dependent branch) into an exception.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from prometheus_client import CollectorRegistry

from dev.bench.resnet import ResNet18
from hookwatch._config import MonitoringConfig
from hookwatch._hooks import HookState, plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch.tools.demo.digits_cnn import DigitsCNN

pytestmark = pytest.mark.gpu

CASES = [
    (DigitsCNN, (4, 1, 8, 8), ["act1", "act2", "act3"]),
    (ResNet18, (2, 3, 224, 224), ["blocks.1.act", "blocks.3.act", "blocks.5.act", "blocks.7.act"]),
]


@pytest.fixture
def cuda() -> Iterator[torch.device]:
    # The gpu marker is deselected by `make test`; here a machine without CUDA has nothing to
    # check, so skipping is the honest outcome.
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    yield torch.device("cuda")
    torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(("factory", "shape", "layers"), CASES, ids=["digits", "resnet18"])
def test_sampled_forward_is_free_of_host_syncs(
    cuda: torch.device, factory: type[torch.nn.Module], shape: tuple[int, ...], layers: list[str]
) -> None:
    model = factory().to(cuda).eval()
    # The capture thread must not drain inside the checked window: its .cpu() copies are
    # supposed to synchronise, and the debug mode is process-wide. It drains once 64 records
    # wait or a publish is due; three records and a 60 s interval keep it idle until flush().
    config = MonitoringConfig.from_mapping(
        {"layers": layers, "sample_rate": 1.0, "flush_interval_s": 60.0}
    )
    monitor = Monitor(
        model, plan_watch(model, config, "gpu"), metrics=MetricSet(CollectorRegistry())
    )
    x = torch.rand(*shape, device=cuda)
    with torch.inference_mode():
        model(x)  # warm-up: cuDNN autotuning and allocator growth may synchronise
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                with monitor.request(shape[0]):
                    model(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    states = monitor._hooks.layer_states()
    assert all(state is HookState.ATTACHED for state in states.values()), states
    # One record per sampled forward, holding every watched layer's capture.
    assert monitor._worker.accepted == 3
    assert monitor._worker.processed == 0
    try:
        assert monitor.flush(timeout=30.0)
        samples = monitor._metrics.sample_values()
        for layer in config.watched:
            key = ("hookwatch_captures_total", (("layer", layer), ("model", "gpu")))
            assert samples[key] == 3 * shape[0]
    finally:
        monitor.close()
