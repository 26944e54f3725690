"""TorchServe handler file for a monitored model: all logic lives in ``hookwatch.torchserve``."""

from __future__ import annotations

from hookwatch.torchserve import HookwatchHandler as _HookwatchHandler


class HookwatchHandler(_HookwatchHandler):
    """The class TorchServe loads from this file (it takes the one class the file defines)."""
