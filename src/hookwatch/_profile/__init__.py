"""Drift reference profiles: the file ``format``, the ``builder`` and serving-time ``loading``."""

from __future__ import annotations

from hookwatch._profile.builder import build_profile, capture_features
from hookwatch._profile.format import FORMAT, READABLE, VERSION, DriftProfile
from hookwatch._profile.loading import load_tracker, serving_tracker, tracker_for

__all__ = [
    "FORMAT",
    "READABLE",
    "VERSION",
    "DriftProfile",
    "build_profile",
    "capture_features",
    "load_tracker",
    "serving_tracker",
    "tracker_for",
]

build_profile.__module__ = "hookwatch"  # public as hookwatch.build_profile
