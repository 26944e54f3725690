"""TorchServe handler file with tutorial-style capture (``hookwatch.tools.bench.naive``).

Serving is the baseline's; the hooks copy every activation to the host and compute and export
statistics in the request thread: the bench's contrast.
"""

from __future__ import annotations

from typing import Any

from hookwatch.tools.bench.naive import NaiveCapture
from hookwatch.torchserve import UnmonitoredHandler


class NaiveHandler(UnmonitoredHandler):
    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self.capture = NaiveCapture.attach(
            self.model, self.handler_config.monitoring, context.model_name
        )
