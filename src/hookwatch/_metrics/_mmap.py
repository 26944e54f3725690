"""prometheus-client's metric file, with its disk blocks allocated before they are mapped.

Shared by both halves: a worker writes its metric files through it, the exporter writes its
archive through it and probes the directory with it. Importing this module installs
:class:`ReservedMmapedDict` as the class prometheus-client opens every metric file of this
process with.

It subclasses ``prometheus_client.mmap_dict.MmapedDict``, reads its private ``_used``,
``_capacity`` and ``_f`` and replaces ``prometheus_client.values.MmapedDict``: none of that is
public API, so the dependency is pinned to the versions this was verified on
(``pyproject.toml``) and ``tests/unit/test_prometheus_client_pin.py`` fails on any other.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from prometheus_client import mmap_dict as _mmap_dict
from prometheus_client import values as _values

__all__ = ["INITIAL_FILE_SIZE", "MmapedDict", "ReservedMmapedDict", "create_reserved"]

#: Size prometheus-client gives a new metric file (it doubles it when full).
INITIAL_FILE_SIZE: int = getattr(_mmap_dict, "_INITIAL_MMAP_SIZE", 1 << 16)


def create_reserved(filename: str, size: int) -> None:
    """Create ``filename`` (or keep it) with its first ``size`` bytes allocated on disk.

    Raises OSError (ENOSPC on a full filesystem, EACCES/EROFS where it is unwritable) and
    then leaves no empty file behind for the exporter to trip over.
    """
    fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        existing = os.fstat(fd).st_size
        try:
            os.posix_fallocate(fd, 0, max(existing, size))
        except OSError:
            if existing == 0:
                with contextlib.suppress(OSError):
                    os.unlink(filename)
            raise
    finally:
        os.close(fd)


def _entry_size(key: str) -> int:
    """Bytes prometheus-client's file takes for one more key (length, padded key, 2 doubles)."""
    encoded = len(key.encode("utf-8"))
    return 4 + encoded + (8 - (encoded + 4) % 8) + 16


class ReservedMmapedDict(_mmap_dict.MmapedDict):
    """prometheus-client's metric file with its disk blocks allocated before they are mapped.

    prometheus-client sizes a file with ftruncate, which allocates nothing: the first write to
    each page of the map allocates it, and on a full filesystem the kernel answers that write
    with SIGBUS, which kills the process (a TorchServe worker, over a metric). Allocating the
    blocks up front (posix_fallocate) turns a full disk into an OSError where the file is
    created or grown, which hookwatch catches, and every later write to the map lands on
    blocks the file owns already. Installed for every metric file a process writes (see below).
    """

    def __init__(self, filename: str, read_mode: bool = False) -> None:
        if not read_mode:
            create_reserved(filename, INITIAL_FILE_SIZE)
        super().__init__(filename, read_mode)  # type: ignore[no-untyped-call]

    def _init_value(self, key: str) -> None:
        # Grown as prometheus-client would (doubling), but allocated before it maps the growth.
        needed = self._used + _entry_size(key)
        capacity = self._capacity
        while needed > capacity:
            capacity *= 2
        if capacity > self._capacity:
            os.posix_fallocate(self._f.fileno(), 0, capacity)
        super()._init_value(key)  # type: ignore[no-untyped-call]


# prometheus-client looks this name up in its values module each time it opens a process's
# metric file: every value file of this process is reserved from now on.
setattr(_values, "MmapedDict", ReservedMmapedDict)  # noqa: B010 - not exported upstream

#: prometheus-client's mmap file format (untyped upstream), with reserved blocks.
MmapedDict: Any = ReservedMmapedDict
