"""TorchServe handler file with tutorial-style capture (``dev/bench/naive.py``).

Serving is the baseline's; the hooks copy every activation to the host and compute and export
statistics in the request thread: the bench's contrast. The bench ships ``naive.py`` in this
variant's model directory (``dev.bench.variants.HANDLER_FILES``), beside this file: ``dev/`` is a
folder of the repository, on no worker's path.
"""

from __future__ import annotations

from typing import Any

from naive import NaiveCapture

from hookwatch.torchserve import UnmonitoredHandler


class NaiveHandler(UnmonitoredHandler):
    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self.capture = NaiveCapture.attach(
            self.model, self.handler_config.monitoring, context.model_name
        )
