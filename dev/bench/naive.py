"""The capture a tutorial writes, kept as the bench's contrast to hookwatch.

Every forward is captured; each hook copies its activation to the host and computes the
statistics and writes the metrics in the request thread. Same statistics and metrics as
hookwatch, so the difference the bench shows is where and how often the work happens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn
from torch.utils.hooks import RemovableHandle

from hookwatch import _catalogue as cat
from hookwatch._config import MonitoringConfig
from hookwatch._hooks import resolve_layer, resolve_layers, select_tensor
from hookwatch._metrics import MetricSet, default_metrics
from hookwatch._names import SUMMARY_STATISTICS


class NaiveCapture:
    """Forward hooks on the same layers hookwatch watches, doing all their work inline."""

    def __init__(self, model_name: str, metrics: MetricSet) -> None:
        self.model_name = model_name
        self.metrics = metrics
        self._handles: list[RemovableHandle] = []

    @classmethod
    def attach(
        cls,
        model: nn.Module,
        config: MonitoringConfig,
        model_name: str,
        metrics: MetricSet | None = None,
    ) -> NaiveCapture:
        capture = cls(model_name, metrics if metrics is not None else default_metrics())
        config = resolve_layers(model, config, model_name)
        if config.capture_input:
            capture._handles.append(
                model.register_forward_pre_hook(
                    # A keyword-argument forward (a transformer's input_ids=...) has no args.
                    lambda _m, args, kwargs: capture.record(
                        "input", args[0] if args else select_tensor(kwargs)
                    ),
                    with_kwargs=True,
                )
            )
        for name in config.layers:
            capture._handles.append(
                resolve_layer(model, name).register_forward_hook(capture.hook_for(name))
            )
        if config.capture_output:
            capture._handles.append(model.register_forward_hook(capture.hook_for("output")))
        return capture

    def hook_for(self, layer: str) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            self.record(layer, select_tensor(output))

        return hook

    def record(self, layer: str, activation: Any) -> None:
        values = activation.detach().cpu().numpy().reshape(activation.shape[0], -1)
        finite = np.isfinite(values)
        stats = (
            values.mean(axis=1),
            values.std(axis=1),
            values.min(axis=1),
            values.max(axis=1),
            (values == 0).mean(axis=1),
        )
        labels = {"model": self.model_name, "layer": layer}
        m = self.metrics
        m.inc(cat.CAPTURES, values.shape[0], **labels)
        m.inc(
            cat.ACTIVATION_NONFINITE,
            float(np.isnan(values).sum()),
            kind="nan",
            **labels,
        )
        m.inc(
            cat.ACTIVATION_NONFINITE,
            float((~finite & ~np.isnan(values)).sum()),
            kind="inf",
            **labels,
        )
        for statistic, column in zip(SUMMARY_STATISTICS, stats, strict=True):
            m.observe(cat.ACTIVATION_STATISTIC, column.tolist(), statistic=statistic, **labels)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
