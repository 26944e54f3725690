"""Every statistic of hookwatch._stats, over every dtype an activation can have, on the host.

A float64 model (``.double()``) failed to archive: ``vector_norm(..., dtype=torch.float32)``
refuses a float64 input. Each public function is run here on float64, float32, float16,
bfloat16, integer, bool and complex activations; its result must be float32 and agree with
the same values written out in float64 numpy, and the numpy forms with the torch forms.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from numpy.typing import NDArray

from hookwatch._stats import (
    STATISTICS,
    _masked_token_summary,
    _packed_token_summary,
    _reduce_launches,
    feature_rows,
    feature_summary,
    position_summary,
    reduce_activation,
    reduce_rows,
    token_summary,
)
from tests.unit.test_stats import _numpy_reference

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
]
FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _values(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Activations of ``dtype``, about half of them zeros (as after a ReLU)."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.relu(torch.randn(*shape, generator=gen, dtype=torch.float64)) * 3
    if dtype == torch.bool:
        return base > 0
    if dtype.is_complex:
        return torch.complex(base, torch.randn(*shape, generator=gen, dtype=torch.float64)).to(
            dtype
        )
    if not dtype.is_floating_point:
        return base.round().to(dtype)  # small non-negative integers fit uint8 and int8
    return base.to(dtype)


def _float64(x: torch.Tensor) -> NDArray[np.float64]:
    """The values the statistics read, exactly, in float64 (a complex value's magnitude)."""
    return (x.abs() if x.is_complex() else x).double().numpy()


def _host(x: torch.Tensor) -> NDArray[np.generic]:
    # bfloat16 has no numpy twin: the capture thread widens it before the numpy forms.
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


def _as_reduced(x: torch.Tensor) -> torch.Tensor:
    # What reduce_activation hands its device form: rows of a real, floating dtype.
    x = (x.abs() if x.is_complex() else x).reshape(len(x), -1)
    return x if x.is_floating_point() else x.float()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4, 3), (3, 4, 5), (2, 3, 4, 4)])
def test_statistics_of_every_dtype_are_float32_and_agree_with_numpy(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    x = _values(shape, dtype)
    want = _numpy_reference(_float64(x).reshape(shape[0], -1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no complex-to-real cast dropping the imaginary part
        host = reduce_activation(x)
        device = _reduce_launches(_as_reduced(x), int(np.prod(shape[1:])))
        rows = reduce_rows(_host(x))
    for got in (host.numpy(), device.numpy(), rows):
        assert got.dtype == np.float32 and got.shape == (shape[0], len(STATISTICS))
        # float32 sums of the exact values in (float64 ones: exact to far below this).
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4, 3), (3, 4, 5), (2, 3, 4, 4)])
def test_features_of_every_dtype_are_float32_and_agree_with_numpy(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    x = _values(shape, dtype, seed=1)
    exact = _float64(x)
    for cap, flatten in ((2, False), (8, False), (64, True)):
        if flatten and int(np.prod(shape[1:])) <= cap:
            want = exact.reshape(shape[0], -1)[:, :cap]
        elif len(shape) > 2:
            want = exact.reshape(shape[0], shape[1], -1).mean(axis=2)[:, :cap]
        else:
            want = exact[:, :cap]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            summary = feature_summary(x, cap, flatten)
            rows = feature_rows(_host(x), cap, flatten)
        assert summary.dtype == torch.float32 and rows.dtype == np.float32
        np.testing.assert_allclose(summary.numpy(), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(rows, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nonfinite_values_of_every_float_dtype_are_counted(dtype: torch.dtype) -> None:
    x = torch.zeros(3, 10, dtype=dtype)
    x[0, 1] = x[0, 2] = float("nan")
    x[1, 3], x[1, 4] = float("inf"), float("-inf")
    x[2, 0] = 1.0
    for got in (
        reduce_activation(x).numpy(),
        _reduce_launches(x, 10).numpy(),
        reduce_rows(_host(x)),
        token_summary(x[:, :, None], torch.ones(3, 10), 4)[0].numpy(),
    ):
        assert got[:, STATISTICS.index("nan_count")].tolist() == [2.0, 0.0, 0.0]
        assert got[:, STATISTICS.index("inf_count")].tolist() == [0.0, 2.0, 0.0]
        assert got[2, STATISTICS.index("mean")] == pytest.approx(0.1)


def test_float64_statistics_keep_their_precision_and_float16_sums_do_not_overflow() -> None:
    # A float64 layer far from zero: its spread is still measured (a float32 pass would
    # round 1e9 + 0.5 to 1e9 and report no spread at all).
    x = torch.tensor([[1e9, 1e9 + 1.0]], dtype=torch.float64)
    for got in (reduce_activation(x).numpy(), reduce_rows(x.numpy())):
        assert got[0, STATISTICS.index("std")] == pytest.approx(0.5)
    # float16 values whose sum is past float16's largest (65504): a finite mean, no NaN.
    wide = torch.full((1, 4096), 60.0, dtype=torch.float16)
    for got in (reduce_activation(wide).numpy(), reduce_rows(wide.numpy())):
        assert got[0, : STATISTICS.index("nan_count")].tolist() == [60.0, 0.0, 60.0, 60.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_token_summaries_of_every_dtype_leave_padding_out(dtype: torch.dtype) -> None:
    x = _values((3, 5, 4), dtype, seed=2)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    exact = _float64(x)
    keep = mask.bool().numpy()
    want_stats = np.stack([_numpy_reference(exact[i][keep[i]].reshape(1, -1))[0] for i in range(3)])
    want_features = np.stack([exact[i][keep[i]].mean(axis=0) for i in range(3)])
    real = x.abs() if x.is_complex() else x  # what token_summary hands its two forms
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results = [
            token_summary(x, mask, 3),
            token_summary(x, torch.ones(3, 5), 3),
            _packed_token_summary(real, mask.bool(), 3),
            _masked_token_summary(real, mask.bool(), 3),
        ]
    whole = _numpy_reference(exact.reshape(3, -1))
    for i, (stats, features) in enumerate(results):
        assert stats.dtype == torch.float32 and features.dtype == torch.float32
        if i == 1:  # no padding
            np.testing.assert_allclose(stats.numpy(), whole, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(features.numpy(), exact.mean(axis=1)[:, :3], rtol=1e-5)
        else:
            np.testing.assert_allclose(stats.numpy(), want_stats, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(features.numpy(), want_features[:, :3], rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_position_summaries_of_every_dtype_are_float32(dtype: torch.dtype) -> None:
    logits = _values((2, 5, 3), dtype, seed=3)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = position_summary(logits, mask)
    # The softmax is taken in float32 whatever the dtype in: the same values, widened.
    want = position_summary(torch.from_numpy(_float64(logits)).float(), mask)
    assert got.dtype == torch.float32 and got.shape == (2, 5)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
