"""``watch()``: the one call that puts a monitor on a model."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torch import nn

from hookwatch._config import MonitoringConfig
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch._profile import DriftProfile, tracker_for

__all__ = ["watch"]


def watch(
    model: nn.Module,
    config: MonitoringConfig | Mapping[str, Any] | None = None,
    name: str = "model",
    *,
    profile: DriftProfile | str | os.PathLike[str] | None = None,
    metrics: MetricSet | None = None,
) -> Monitor:
    """Hook ``model``'s watched layers and start its capture thread; returns the monitor.

    ``config`` is a :class:`MonitoringConfig` or the mapping of a model-config's
    ``handler: monitoring:`` section (layers, sampling, drift settings). ``name`` is the
    ``model`` label of every series. With ``profile`` (a :class:`DriftProfile` or its file),
    drift is tested against it; a profile built for other layers fails here. The metrics go to
    ``metrics`` or, by default, to the process-wide set that :func:`serve_metrics` serves.
    Run each forward pass inside ``with monitor.request(batch_size):``::

        monitor = hookwatch.watch(model, {"layers": ["act"]}, "tabular", profile=profile)
    """
    # Patterns and types resolved once, first: the profile is matched to the layers they name,
    # and the monitor takes the same plan.
    plan = plan_watch(model, config, name)
    tracker = None
    if profile is not None and plan.config.enabled and plan.config.drift.enabled:
        loaded = profile if isinstance(profile, DriftProfile) else DriftProfile.load(profile)
        tracker = tracker_for(loaded, plan.config, name)
    return Monitor(model, plan, metrics=metrics, drift=tracker)


watch.__module__ = "hookwatch"  # public as hookwatch.watch (reprs, tracebacks)
