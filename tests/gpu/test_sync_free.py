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

from hookwatch.bench.resnet import ResNet18
from hookwatch.config import MonitoringConfig
from hookwatch.demo.digits_cnn import DigitsCNN
from hookwatch.hooks import HookState
from hookwatch.metrics import MetricSet
from hookwatch.monitor import Monitor

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
    config = MonitoringConfig.from_mapping({"layers": layers, "sample_rate": 1.0})
    # The worker thread is started only after the checked window: its .cpu() copies are
    # supposed to synchronise, and the debug mode is process-wide.
    monitor = Monitor(config, "gpu", MetricSet(CollectorRegistry()))
    monitor.hooks.attach(model, config.layers, config.capture_input, config.capture_output)
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
    states = monitor.hooks.layer_states()
    assert all(state is HookState.ATTACHED for state in states.values()), states
    assert monitor.worker.accepted == 3 * len(config.watched)
    monitor.worker.start()
    try:
        assert monitor.flush(timeout=30.0)
        samples = monitor.metrics.sample_values()
        for layer in config.watched:
            key = ("hookwatch_captures_total", (("layer", layer), ("model", "gpu")))
            assert samples[key] == 3 * shape[0]
    finally:
        monitor.close()
