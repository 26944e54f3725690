"""On a GPU, a watched model exports the statistics it exports on the host.

The hooks reduce large activations with the device form of the statistics
(``hookwatch._stats._reduce_launches``) and the capture thread moves each layer's reductions
of a drain to the host in one copy (``_device_rows``); neither runs on a machine without a
GPU. Same weights, same inputs, every forward sampled: the per-layer statistics exported on
``cuda`` and on the host must agree.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

import pytest
import torch
from prometheus_client import CollectorRegistry

from hookwatch._config import MonitoringConfig
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from tests.gpu.test_sync_free import CASES

pytestmark = pytest.mark.gpu

STATISTIC = "hookwatch_activation_statistic"


def exported(
    model: torch.nn.Module, layers: list[str], x: torch.Tensor, forwards: int = 6
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The activation statistics' sums and counts after ``forwards`` sampled forwards."""
    config = MonitoringConfig.from_mapping(
        {"layers": layers, "sample_rate": 1.0, "flush_interval_s": 60.0}
    )
    monitor = Monitor(model, plan_watch(model, config, "m"), metrics=MetricSet(CollectorRegistry()))
    try:
        with torch.inference_mode():
            for _ in range(forwards):
                with monitor.request(x.shape[0]):
                    model(x)
        assert monitor.flush(timeout=60.0)
        return {
            key: value
            for key, value in monitor._metrics.sample_values().items()
            if key[0] in (f"{STATISTIC}_sum", f"{STATISTIC}_count")
        }
    finally:
        monitor.close()


@pytest.fixture
def cuda() -> Iterator[torch.device]:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    # Exact float32 on the device: TF32 convolutions would differ from the host by ~1e-3.
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield torch.device("cuda")
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.mark.parametrize(("factory", "shape", "layers"), CASES, ids=["digits", "resnet18"])
def test_statistics_on_the_device_agree_with_the_host(
    cuda: torch.device, factory: type[torch.nn.Module], shape: tuple[int, ...], layers: list[str]
) -> None:
    torch.manual_seed(0)
    host_model = factory().eval()
    device_model = copy.deepcopy(host_model).to(cuda)
    x = torch.rand(*shape)
    host = exported(host_model, layers, x)
    device = exported(device_model, layers, x.to(cuda))
    assert host.keys() == device.keys()
    assert {labels for name, labels in host if name == f"{STATISTIC}_count"}, host
    for key, want in host.items():
        got = device[key]
        assert math.isfinite(got), key
        # zero_fraction may move by a unit where an activation is within rounding of zero.
        assert got == pytest.approx(want, rel=1e-3, abs=2e-3), key
