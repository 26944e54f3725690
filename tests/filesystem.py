"""Filling a filesystem, for the tests of a full metrics directory."""

from __future__ import annotations

import contextlib
from pathlib import Path


def fill(directory: Path) -> Path:
    """Write zeros into a file in ``directory`` until its filesystem has no block left."""
    filler = directory / "filler"
    # Unbuffered, so the write that finds the disk full is the one that raises.
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 16, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler
