"""numpy's BLAS held to one thread by the capture thread (hookwatch._blas)."""

from __future__ import annotations

import threading

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from hookwatch._blas import OneBlasThread


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_the_limit_holds_through_nested_blocks_and_is_given_back_once() -> None:
    assert np.ones(2) @ np.ones(2) == 2.0  # numpy's BLAS is loaded
    assert _blas_threads(), "numpy's wheels bundle OpenBLAS: threadpoolctl should see it"
    with threadpool_limits(limits=2, user_api="blas"):
        limit = OneBlasThread()
        with limit():
            assert set(_blas_threads()) == {1}
            # The processor holds it for a drain and the accuracy estimate asks again inside.
            with OneBlasThread()():
                assert set(_blas_threads()) == {1}
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {2}


def test_another_thread_takes_the_limit_itself() -> None:
    # The depth is per thread: a block on one thread does not make another's a no-op.
    limit = OneBlasThread()
    seen: list[bool] = []

    def other() -> None:
        context = limit()
        seen.append(type(context).__name__ != "nullcontext")

    with limit():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == [bool(_blas_threads())]
