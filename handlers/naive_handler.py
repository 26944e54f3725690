"""TorchServe adapter with tutorial-style capture (``hookwatch.bench.naive``): bench contrast.

Serving is the baseline's; the hooks copy every activation to the host and compute and export
statistics in the request thread.
"""

from __future__ import annotations

from typing import Any

from ts.torch_handler.base_handler import BaseHandler

from hookwatch.bench.naive import NaiveCapture
from hookwatch.config import MonitoringConfig
from hookwatch.metrics import MetricSet
from hookwatch.service import ClassifierService, HandlerContract, configure_torch


class NaiveHandler(HandlerContract, BaseHandler):  # type: ignore[misc]
    def initialize(self, context: Any) -> None:
        handler_config = (context.model_yaml_config or {}).get("handler", {})
        configure_torch(handler_config)
        super().initialize(context)
        self.service = ClassifierService.from_handler_config(
            self.model, handler_config, context.model_name, device=self.device, monitored=False
        )
        config = MonitoringConfig.from_mapping(handler_config.get("monitoring"))
        self.capture = NaiveCapture.attach(self.model, config, context.model_name, MetricSet())
