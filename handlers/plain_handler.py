"""TorchServe adapter without monitoring: the bench's baseline.

The same JSON/float32 decoding, batching and answers as ``hookwatch_handler``, through the same
``ClassifierService``, so a comparison against it isolates what monitoring costs.
"""

from __future__ import annotations

from typing import Any

from ts.torch_handler.base_handler import BaseHandler

from hookwatch.service import ClassifierService, HandlerContract, configure_torch


class PlainHandler(HandlerContract, BaseHandler):  # type: ignore[misc]
    def initialize(self, context: Any) -> None:
        handler_config = (context.model_yaml_config or {}).get("handler", {})
        configure_torch(handler_config)
        super().initialize(context)
        self.service = ClassifierService.from_handler_config(
            self.model, handler_config, context.model_name, device=self.device, monitored=False
        )
