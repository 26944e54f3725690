"""TorchServe adapter: maps the handler contract onto hookwatch.service. No logic lives here."""

from __future__ import annotations

from typing import Any

from ts.torch_handler.base_handler import BaseHandler

from hookwatch.service import ClassifierService, HandlerContract, configure_torch


class HookwatchHandler(HandlerContract, BaseHandler):  # type: ignore[misc]
    def initialize(self, context: Any) -> None:
        handler_config = (context.model_yaml_config or {}).get("handler", {})
        configure_torch(handler_config)
        super().initialize(context)
        self.service = ClassifierService.from_handler_config(
            self.model,
            handler_config,
            context.model_name,
            device=self.device,
            model_dir=(context.system_properties or {}).get("model_dir"),
        )
