"""TorchServe adapter without monitoring: the bench's baseline.

The same JSON/float32 decoding, batching and answers as ``hookwatch_handler``, through the same
``ClassifierService``, so a comparison against it isolates what monitoring costs.
"""

from __future__ import annotations

from typing import Any

from ts.torch_handler.base_handler import BaseHandler

from hookwatch.service import BatchResult, ClassifierService, DecodedBatch, configure_torch


class PlainHandler(BaseHandler):  # type: ignore[misc]
    def initialize(self, context: Any) -> None:
        handler_config = (context.model_yaml_config or {}).get("handler", {})
        configure_torch(handler_config)
        super().initialize(context)
        self.service = ClassifierService.from_handler_config(
            self.model, handler_config, context.model_name, device=self.device, monitored=False
        )

    def preprocess(self, data: list[dict[str, Any]]) -> DecodedBatch:
        return self.service.decode([row.get("data", row.get("body")) for row in data])

    def inference(self, data: DecodedBatch, *args: Any, **kwargs: Any) -> BatchResult:
        return self.service.infer(data)

    def postprocess(self, data: BatchResult) -> list[dict[str, Any]]:
        for index, error in data.errors.items():
            self.context.set_response_status(error.status, "Bad Request", index)
        return self.service.encode(data)
