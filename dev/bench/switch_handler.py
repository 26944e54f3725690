"""The bench's switched handler (``make bench-inworker``): hookwatch's monitored handler whose
request path a byte in its model directory binds and unbinds, batch by batch.

Unbound (byte 0), a batch runs the path a plain handler's service runs (``service._path``
None: no count, no countdown, no hook; ``dev.bench.request``'s one-handler row does the same
in process); bound (byte 1), the monitored path as served. Both in one worker process, so a
comparison of the two is not also a comparison of where two workers landed
(docs/bench/README.md, *Worker starts*). Harness only: copied into the bench's model
directories, never installed.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

from hookwatch.torchserve import HookwatchHandler

#: The file in the model directory whose first byte says whether the path is bound.
SWITCH_FILE = "bench-switch"


class SwitchedHandler(HookwatchHandler):
    """The class TorchServe loads from this file."""

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        path = Path(context.system_properties["model_dir"]) / SWITCH_FILE
        with path.open("rb") as file:
            # A shared mapping: the harness's writes to the file show here at once.
            self._switch = mmap.mmap(file.fileno(), 1, access=mmap.ACCESS_READ)
        self._bound = self.service._path
        if self._bound is None:
            raise RuntimeError("expected a monitored service with a request path, got none")

    def preprocess(self, data: list[dict[str, Any]]) -> Any:
        # Read once per batch, before decoding: the batch's arrival, forward and answer all
        # take the path it finds here (a batch never sees half of each).
        self.service._path = self._bound if self._switch[0] else None
        return super().preprocess(data)
