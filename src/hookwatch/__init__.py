"""hookwatch: see inside PyTorch models while they serve traffic.

Watch a model's layers with sampled forward hooks, test drift against a reference profile, and
export it all as Prometheus metrics, with the capture work off the request path::

    monitor = hookwatch.watch(model, {"layers": ["act1"]}, name="digits")
    with monitor.request(len(batch)):
        logits = model(batch)

The TorchServe adapter is :mod:`hookwatch.torchserve`; the command-line tools (bench, drift
evaluation, native stack, demo) live in :mod:`hookwatch.tools`. Everything not listed in
``__all__`` is private, and so is every name with a leading underscore on a public class.
Every public name says it is ``hookwatch.X`` (``__module__``, as httpx does), in reprs and
tracebacks; each module that defines one sets it, so it holds however the name was reached.
Every exception derives from :class:`HookwatchError` (:mod:`hookwatch._errors`).

The names load on first use: ``import hookwatch`` (or any ``hookwatch.tools`` module) imports
neither torch nor prometheus-client. prometheus-client decides at its import whether it writes
multiprocess files, so a process that sets ``PROMETHEUS_MULTIPROC_DIR`` itself must do so
before it first uses a name from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hookwatch._errors import BadInputError, ConfigError, HookwatchError, ProfileError

if TYPE_CHECKING:
    from hookwatch._config import MonitoringConfig
    from hookwatch._metrics import MetricSet, MetricsServer, serve_metrics
    from hookwatch._monitor import Monitor
    from hookwatch._profile import DriftProfile, build_profile
    from hookwatch._watch import watch

__version__ = "0.2.0"

__all__ = [
    "BadInputError",
    "ConfigError",
    "DriftProfile",
    "HookwatchError",
    "MetricSet",
    "MetricsServer",
    "Monitor",
    "MonitoringConfig",
    "ProfileError",
    "__version__",
    "build_profile",
    "serve_metrics",
    "watch",
]

#: Where each lazily loaded public name lives.
_LAZY = {
    "DriftProfile": "hookwatch._profile",
    "MetricSet": "hookwatch._metrics",
    "MetricsServer": "hookwatch._metrics",
    "Monitor": "hookwatch._monitor",
    "MonitoringConfig": "hookwatch._config",
    "build_profile": "hookwatch._profile",
    "serve_metrics": "hookwatch._metrics",
    "watch": "hookwatch._watch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hookwatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
