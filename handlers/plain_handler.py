"""TorchServe handler file without monitoring: the bench's baseline.

The same JSON/float32 decoding, batching and answers as ``hookwatch_handler``, through the same
service, so a comparison against it isolates what monitoring costs.
"""

from __future__ import annotations

from hookwatch.torchserve import UnmonitoredHandler


class PlainHandler(UnmonitoredHandler):
    """The class TorchServe loads from this file."""
