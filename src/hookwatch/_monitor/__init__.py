"""One model's monitor and its parts: request ``gate``, request ``tally``, capture ``processor``,
``publisher``."""

from __future__ import annotations

from hookwatch._monitor.gate import Record, RequestGate
from hookwatch._monitor.monitor import Monitor, ReceivedRequests
from hookwatch._monitor.processor import CaptureProcessor, Processed
from hookwatch._monitor.publisher import Publisher, Snapshot
from hookwatch._monitor.tally import RequestCounts, RequestTally

__all__ = [
    "CaptureProcessor",
    "Monitor",
    "Processed",
    "Publisher",
    "ReceivedRequests",
    "Record",
    "RequestCounts",
    "RequestGate",
    "RequestTally",
    "Snapshot",
]
