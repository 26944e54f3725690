"""hookwatch: see inside PyTorch models while they serve traffic.

Watch a model's layers with sampled forward hooks, test drift against a reference profile, and
export it all as Prometheus metrics, with the capture work off the request path::

    monitor = hookwatch.watch(model, {"layers": ["act1"]}, name="digits")
    with monitor.request(len(batch)):
        logits = model(batch)

The TorchServe adapter is :mod:`hookwatch.torchserve`; the command-line tools (bench, drift
evaluation, native stack, demo) live in :mod:`hookwatch.tools`. Everything not listed in
``__all__`` is private.
"""

from __future__ import annotations

from hookwatch._config import MonitoringConfig
from hookwatch._errors import BadInputError, ConfigError, HookwatchError, ProfileError
from hookwatch._metrics import MetricsServer, serve_metrics
from hookwatch._monitor import Monitor
from hookwatch._profile import DriftProfile, build_profile
from hookwatch._watch import watch

__version__ = "0.2.0"

__all__ = [
    "BadInputError",
    "ConfigError",
    "DriftProfile",
    "HookwatchError",
    "MetricsServer",
    "Monitor",
    "MonitoringConfig",
    "ProfileError",
    "__version__",
    "build_profile",
    "serve_metrics",
    "watch",
]
