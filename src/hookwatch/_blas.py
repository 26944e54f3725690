"""numpy's BLAS held to one thread while the capture thread uses it (threadpoolctl).

Pure: no Prometheus, TorchServe or torch imports.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

__all__ = ["OneBlasThread"]


class OneBlasThread:
    """``with limit():`` holds numpy's BLAS to one thread for the block (threadpoolctl, a
    dependency).

    The capture thread's matrix products (the k-NN distances of the accuracy estimate, the
    row sums of the statistics) are small; numpy's BLAS would spread each over every core of a
    machine whose cores serve requests, and costs 20 times more so on a busy 2-core machine
    (docs/accuracy-estimators.md, "Cost and state"). Served, it cost more than that:
    OpenBLAS's worker thread spins on its core for a while after each product, and at 100 %
    sampling a TorchServe worker's spun ~40 % of a core (docs/bench/README.md, the independent
    A/B). The limit is the BLAS libraries threadpoolctl finds (numpy's; torch's intra-op pool
    is set by the monitor, and on x86 its BLAS is linked into torch), process-wide while it is
    held (~5 µs to take and give back). Should threadpoolctl be missing after all (an install
    without dependencies), the block runs with numpy's default threads.
    """

    def __init__(self) -> None:
        # Looked up now, where the owner is built (a worker loading its model), not inside the
        # first drain, whose GIL hold it would lengthen by milliseconds.
        _controller()

    def __call__(self) -> AbstractContextManager[object]:
        controller = _controller()
        if controller is None or _depth() > 0:
            # Already held on this thread (the processor holds it for a whole drain, and the
            # accuracy estimate inside it asks again): taking it again costs ~5 µs for nothing.
            return contextlib.nullcontext()
        return _held(controller)


#: How many blocks of this thread hold the limit.
_HELD = threading.local()


def _depth() -> int:
    depth: int = getattr(_HELD, "depth", 0)
    return depth


@contextlib.contextmanager
def _held(controller: Any) -> Iterator[None]:
    _HELD.depth = _depth() + 1
    try:
        with controller.limit(limits=1, user_api="blas"):
            yield
    finally:
        _HELD.depth -= 1


#: The libraries threadpoolctl found, looked up once per process (~3 ms: it walks the loaded
#: shared objects): empty until then, after it [the controller, or None without threadpoolctl].
_FOUND: list[Any] = []


def _controller() -> Any:
    if not _FOUND:
        try:
            from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]
        except ImportError:
            _FOUND.append(None)
        else:
            # Two threads racing here each build one; either is right.
            _FOUND.append(ThreadpoolController())
    return _FOUND[0]
