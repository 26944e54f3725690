"""One model's monitor and its parts: request ``gate``, capture ``processor``, ``publisher``."""

from __future__ import annotations

from hookwatch._monitor.gate import Record, RequestCounts, RequestGate
from hookwatch._monitor.monitor import Monitor
from hookwatch._monitor.processor import CaptureProcessor, Processed
from hookwatch._monitor.publisher import Publisher, Snapshot

__all__ = [
    "CaptureProcessor",
    "Monitor",
    "Processed",
    "Publisher",
    "Record",
    "RequestCounts",
    "RequestGate",
    "Snapshot",
]
