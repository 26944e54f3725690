from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from hookwatch._stats import (
    STATISTICS,
    feature_rows,
    feature_summary,
    reduce_activation,
    reduce_rows,
)


def _numpy_reference(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(x.shape[0], -1).astype(np.float64)
    return np.stack(
        [
            flat.mean(1),
            flat.std(1),
            flat.min(1),
            flat.max(1),
            (flat == 0).mean(1),
            np.isnan(flat).sum(1),
            np.isinf(flat).sum(1),
        ],
        axis=1,
    )


def test_reduction_matches_numpy_for_conv_and_linear_shapes() -> None:
    gen = torch.Generator().manual_seed(0)
    for shape in [(4, 16, 8, 8), (3, 64), (2, 5, 7)]:
        x = torch.relu(torch.randn(*shape, generator=gen))
        got = reduce_activation(x).numpy()
        assert got.shape == (shape[0], len(STATISTICS))
        np.testing.assert_allclose(got, _numpy_reference(x.numpy()), rtol=1e-5, atol=1e-6)


def test_nonfinite_values_are_counted() -> None:
    x = torch.zeros(2, 10)
    x[0, 1] = float("nan")
    x[0, 2] = float("nan")
    x[1, 3] = float("inf")
    x[1, 4] = float("-inf")
    got = reduce_activation(x)
    assert got[:, STATISTICS.index("nan_count")].tolist() == [2.0, 0.0]
    assert got[:, STATISTICS.index("inf_count")].tolist() == [0.0, 2.0]


def test_integer_activations_and_result_owns_its_storage() -> None:
    x = torch.arange(12).reshape(3, 4)
    got = reduce_activation(x)
    assert got.dtype == torch.float32
    assert got[0, STATISTICS.index("zero_fraction")] == 0.25
    y = torch.ones(2, 3)
    features = feature_summary(y, max_features=8)
    y.fill_(5.0)  # a later in-place write to the activation must not reach the capture
    assert features.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    assert torch.equal(features, torch.ones(2, 3))


def test_feature_summary_is_per_channel_for_maps_and_capped() -> None:
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 2, 2)
    got = feature_summary(x, max_features=2)
    assert got.shape == (2, 2)
    np.testing.assert_allclose(got.numpy(), x.numpy().reshape(2, 3, 4).mean(2)[:, :2])
    # A projected layer's hook passes its input width: more features kept, and an input that
    # fits them is flattened.
    wide = feature_summary(x, max_features=3)
    np.testing.assert_allclose(wide.numpy(), x.numpy().reshape(2, 3, 4).mean(2))
    flat = feature_summary(x, max_features=12, flatten=True)
    np.testing.assert_allclose(flat.numpy(), x.numpy().reshape(2, 12))


@pytest.mark.parametrize(
    "shape", [(5, 16, 8, 8), (4, 64), (3, 10), (2, 5, 7), (6, 1, 8, 8), (4,), (3, 1)]
)
def test_numpy_forms_agree_with_the_torch_forms(shape: tuple[int, ...]) -> None:
    # The capture thread reduces host copies with the numpy forms; hooks on large activations
    # use the torch forms; a layer must export the same numbers whichever ran.
    x = torch.relu(torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))))
    np.testing.assert_allclose(
        reduce_rows(x.numpy()), reduce_activation(x).numpy(), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        reduce_rows(x.numpy()),
        _numpy_reference(x.numpy().reshape(len(x) if x.dim() else 1, -1)),
        rtol=1e-5,
        atol=1e-6,
    )
    for flatten in (False, True):
        for cap in (3, 40, 256):
            got = feature_rows(x.numpy(), cap, flatten)
            want = feature_summary(x, cap, flatten).numpy()
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_row_sums_keep_the_std_where_the_mean_dominates() -> None:
    # reduce_rows takes the variance as E[x^2] - mean^2 from BLAS sums; a row whose mean
    # dwarfs its spread (an offset layer, a constant row) must still get the centred form's
    # std, and a row of zeros none at all. Each row against float64 numpy.
    rng = np.random.default_rng(7)
    width = 2048
    rows = [
        rng.standard_normal(width),  # the fast form
        np.maximum(rng.standard_normal(width), 0.0),  # post-ReLU: the fast form
        1000.0 + 1e-3 * rng.standard_normal(width),  # mean^2 / var = 1e12: centred
        3.0 + rng.standard_normal(width),  # mean^2 / var = 9, just past CANCELLATION
        np.full(width, 2.5),  # constant: std 0, not sqrt of a rounding error
        np.zeros(width),
        128.0 + 64.0 * rng.standard_normal(width),  # an unnormalised image's pixels
    ]
    for dtype in (np.float32, np.float64):
        x = np.stack(rows).astype(dtype)
        got = reduce_rows(x)
        want = _numpy_reference(x)
        np.testing.assert_allclose(got[:, 0], want[:, 0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got[:, 1], want[:, 1], rtol=1e-5, atol=1e-6)
        assert got[4, 1] == 0.0 and got[5, 1] == 0.0
        np.testing.assert_allclose(got[:, 2:], want[:, 2:], rtol=1e-6)


def test_rows_beyond_the_dtype_keep_their_nonfinite_form() -> None:
    # A square beyond float32 (values of 1e20) and an Inf - Inf: the std is Inf or NaN as the
    # centred form makes it, and only a NaN or Inf value is counted as one.
    x = np.zeros((3, 4), dtype=np.float32)
    x[0] = [1e20, -1e20, 1e20, -1e20]
    x[1, 0], x[1, 1] = np.inf, -np.inf
    x[2, 2] = np.nan
    got = reduce_rows(x)
    assert got[0, 0] == 0.0 and np.isinf(got[0, 1])
    assert np.isnan(got[1, 0]) and np.isnan(got[2, 0]) and np.isnan(got[2, 1])
    assert got[:, STATISTICS.index("nan_count")].tolist() == [0.0, 0.0, 1.0]
    assert got[:, STATISTICS.index("inf_count")].tolist() == [0.0, 2.0, 0.0]
    # Rows the fast form keeps are not touched by a neighbour's fallback.
    mixed = np.vstack([x, np.ones((1, 4), dtype=np.float32) * [1, 2, 3, 4]])
    np.testing.assert_allclose(reduce_rows(mixed)[3, :2], [2.5, np.sqrt(1.25)], rtol=1e-6)


def test_numpy_forms_count_nonfinite_values_and_take_integers() -> None:
    x = np.zeros((2, 10), dtype=np.float32)
    x[0, 1] = x[0, 2] = np.nan
    x[1, 3], x[1, 4] = np.inf, -np.inf
    got = reduce_rows(x)
    assert got[:, STATISTICS.index("nan_count")].tolist() == [2.0, 0.0]
    assert got[:, STATISTICS.index("inf_count")].tolist() == [0.0, 2.0]
    ints = np.arange(12).reshape(3, 4)
    np.testing.assert_allclose(
        reduce_rows(ints), reduce_activation(torch.from_numpy(ints)).numpy(), rtol=1e-6
    )
    assert reduce_rows(ints)[0, STATISTICS.index("zero_fraction")] == 0.25
    features = feature_rows(x, 4)
    x[:] = 5.0  # the features own their storage
    assert features[0, 0] == 0.0


def test_complex_activations_are_read_as_their_magnitude() -> None:
    """A spectral layer's complex output: both forms reduce its magnitude, with no warning
    (a cast to float would keep the real part alone)."""
    generator = torch.Generator().manual_seed(2)
    x = torch.complex(torch.randn(3, 4, 5, generator=generator), torch.randn(3, 4, 5))
    magnitude = x.abs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for reduced, want in (
            (reduce_activation(x), reduce_activation(magnitude)),
            (feature_summary(x, 8), feature_summary(magnitude, 8)),
            (torch.from_numpy(reduce_rows(x.numpy())), reduce_activation(magnitude)),
            (torch.from_numpy(feature_rows(x.numpy(), 8)), feature_summary(magnitude, 8)),
        ):
            torch.testing.assert_close(reduced, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_the_device_form_agrees_with_the_host_forms(dtype: torch.dtype) -> None:
    # reduce_activation takes _reduce_launches on a GPU, where no CI machine runs it: it is
    # checked here on the host, against float64 numpy (it accumulates in float32 whatever the
    # dtype in, as the host forms do for float32) and against the numpy form for float32.
    from hookwatch._stats import _reduce_launches

    x = torch.relu(torch.randn(6, 3, 5, 5, generator=torch.Generator().manual_seed(3)))
    x = (x * 4).to(dtype)
    flat = x.reshape(6, -1)
    got = _reduce_launches(flat, flat.shape[1]).numpy()
    reference = _numpy_reference(x.float().numpy().reshape(6, -1))
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
    if dtype == torch.float32:
        np.testing.assert_allclose(got, reduce_rows(x.numpy()), rtol=1e-5, atol=1e-6)
    if dtype.is_floating_point:
        # NaN and Inf counted on every row (no branch on their presence); a NaN is no zero.
        odd = torch.zeros(2, 10, dtype=dtype)
        odd[0, 1] = odd[0, 2] = float("nan")
        odd[1, 3], odd[1, 4] = float("inf"), float("-inf")
        got = _reduce_launches(odd, 10)
        assert got[:, STATISTICS.index("nan_count")].tolist() == [2.0, 0.0]
        assert got[:, STATISTICS.index("inf_count")].tolist() == [0.0, 2.0]
        assert got[:, STATISTICS.index("zero_fraction")].tolist() == pytest.approx([0.8, 0.8])
    assert _reduce_launches(flat, flat.shape[1]).dtype == torch.float32


def test_map_features_are_float32_means_of_their_own() -> None:
    x = torch.rand(2, 3, 4, 4, dtype=torch.float16)
    got = feature_summary(x, max_features=8)
    assert got.dtype == torch.float32
    assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    np.testing.assert_allclose(got.numpy(), x.float().numpy().reshape(2, 3, 16).mean(2), rtol=1e-3)
