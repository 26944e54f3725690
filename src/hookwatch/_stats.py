"""Per-sample activation statistics and drift features, in two forms that agree.

The torch forms (:func:`reduce_activation`, :func:`feature_summary`) run in a hook, on the
activation's own device, when an activation is too large to copy. The numpy forms
(:func:`reduce_rows`, :func:`feature_rows`) run on the capture thread over many samples' host
copies at once: numpy's per-call cost is a fraction of torch's, which dominates at these sizes.

Pure torch/numpy: no Prometheus or TorchServe imports.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from hookwatch._names import STATISTICS

__all__ = [
    "INF_COLUMN",
    "NAN_COLUMN",
    "feature_rows",
    "feature_summary",
    "position_summary",
    "reduce_activation",
    "reduce_rows",
    "token_summary",
]

#: Columns of the rows :func:`reduce_activation` and :func:`reduce_rows` return are STATISTICS.
NAN_COLUMN = STATISTICS.index("nan_count")
INF_COLUMN = STATISTICS.index("inf_count")


def _real(x: torch.Tensor) -> torch.Tensor:
    # A complex activation (a spectral layer's) is read as its magnitude: casting it to a real
    # dtype would keep the real part alone, and warn.
    return x.abs() if x.is_complex() else x


def reduce_activation(activation: torch.Tensor) -> torch.Tensor:
    """Reduce a batch-first activation ``[B, ...]`` to a new float32 ``[B, len(STATISTICS)]``.

    The result owns its storage, so keeping it never keeps the activation alive. Nothing here
    moves data to the host: on a GPU the reduction stays queued on the device's stream and the
    background thread pays for the copy.
    """
    x = _real(activation.detach())
    if x.dim() == 0:
        x = x.reshape(1, 1)
    x = x.reshape(x.shape[0], -1)
    if not x.is_floating_point():
        x = x.float()
    width = x.shape[1]
    if width == 0:
        return torch.zeros((x.shape[0], len(STATISTICS)), dtype=torch.float32, device=x.device)
    if x.device.type != "cpu":
        return _reduce_launches(x, width)
    return _reduce_host(x, width)


def _reduce_host(x: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`reduce_activation` on the host: five passes over the rows, the rest on ``[B]``.

    Plain sums, norms and amin/amax only: torch's std_mean, aminmax and ``x == 0`` reductions
    over a wide row are many times slower on CPU (docs/bench/README.md, "Figures behind the
    code's constants"), and this runs in the request thread. The sums and norms give the
    variance as ``E[x^2] - mean^2`` in float64, as :func:`reduce_rows` does, and a row where
    that cancels or is not finite takes the centred two-pass form; the per-row arithmetic is
    numpy's on a handful of values, where each torch call would cost a few µs of dispatch.
    A float64 activation is reduced in float64 (vector_norm refuses a dtype= narrower than its
    input); half precision widens to float32 (a float16 sum overflows).
    """
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows = x.shape[0]
    # sign() is 0 exactly at 0; its absolute sum counts the non-zeros (exact below 2**24 units).
    parts = torch.stack(
        (
            x.sum(dim=1, dtype=wide),
            torch.linalg.vector_norm(x, dim=1, dtype=wide),
            x.amin(dim=1).to(wide),
            x.amax(dim=1).to(wide),
            x.sign().abs_().sum(dim=1, dtype=wide),
        ),
        dim=1,
    )
    total, norm, lo, hi, nonzero = parts.numpy().astype(np.float64).T
    out = np.zeros((rows, len(STATISTICS)), dtype=np.float32)
    # Inf - Inf is NaN here on purpose (it sends the row to the centred form).
    with np.errstate(invalid="ignore", over="ignore"):
        mean = total / width
        mean_square = np.square(norm) / width
        variance = mean_square - np.square(mean)
        out[:, 0] = mean
        out[:, 1] = np.sqrt(np.maximum(variance, 0.0))
        out[:, 2] = lo
        out[:, 3] = hi
        out[:, 4] = 1.0 - nonzero / width
        # Not finite also where the squares overflowed and the values did not.
        exact = ~((variance * CANCELLATION >= mean_square) & np.isfinite(mean_square))
    if exact.any():
        picked = x[torch.from_numpy(exact)]
        centred_mean = picked.sum(dim=1, dtype=wide) / width
        spread = torch.linalg.vector_norm(
            picked - centred_mean[:, None], dim=1, dtype=wide
        ) / math.sqrt(width)
        with np.errstate(over="ignore"):  # a float64 row past float32's range: Inf
            out[exact, 0] = centred_mean.numpy()
            out[exact, 1] = spread.numpy()
    # On the float32 results, as the numpy form checks them: a float64 mean past float32's
    # range is Inf here. A NaN or Inf anywhere makes a row's mean or std non-finite, so the
    # exact counts are only needed then.
    if not np.isfinite(out[:, :2]).all():
        out[:, 5] = torch.isnan(x).sum(dim=1).numpy()
        out[:, 6] = torch.isinf(x).sum(dim=1).numpy()
    return torch.from_numpy(out)


def _reduce_launches(x: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`reduce_activation` on a device, in about half the kernels of the host form.

    On a GPU what the request thread pays per statistic is the launch (a few µs of CPU each,
    docs/bench/gpu.md), not the pass over memory: one pass for mean and std (Welford), one
    for min and max, one sum over the three counts stacked. Zeros are counted as the host
    array form counts them (``x == 0``: a NaN is not a zero), and the NaN and Inf counts are
    always taken, since a branch on their presence would synchronise the stream.
    """
    xf = x if x.dtype == torch.float32 else x.float()
    std, mean = torch.std_mean(xf, dim=1, correction=0)
    lo, hi = torch.aminmax(xf, dim=1)
    # Summed as integers: a float32 sum would first cast the whole stacked mask.
    counts = torch.stack((xf == 0, torch.isnan(xf), torch.isinf(xf)), dim=1).sum(dim=2).float()
    zero_fraction = counts[:, :1] * (1.0 / width)
    return torch.cat((torch.stack((mean, std, lo, hi), dim=1), zero_fraction, counts[:, 1:]), 1)


def feature_summary(
    activation: torch.Tensor, max_features: int, flatten: bool = False
) -> torch.Tensor:
    """One value per feature and sample, ``[B, F]`` with ``F <= max_features``, for drift tests.

    Convolutional maps ``[B, C, ...]`` become per-channel spatial means, so drift is judged per
    feature; flat layers keep their units. With ``flatten`` (the model input), a map small enough
    to fit in ``max_features`` keeps every value instead: a 1x8x8 image's channel mean would hide
    a rotation. Wider layers keep their first ``max_features`` features: for a layer the profile
    projects, the hook passes the projection's input width here, and the capture thread reduces
    those features to the principal components.
    """
    x = _real(activation.detach())
    if x.dim() == 0:
        x = x.reshape(1, 1)
    if x.dim() == 1:
        x = x.reshape(-1, 1)
    if flatten and x.dim() > 2 and x[0].numel() <= max_features:
        x = x.flatten(1)
    if x.dim() > 2:
        # The means are new storage already (float32, whatever the dtype in): no copy, which
        # on a device would be one more kernel.
        return x.flatten(2).mean(dim=2, dtype=torch.float32)[:, :max_features]
    x = x[:, :max_features]
    return x.float().clone() if x.dtype == torch.float32 else x.float()


def position_summary(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-position logits ``[B, T, C]`` (token classification, CTC) to a new float32
    ``[B, C + 2]``: per sample, the share of its positions predicted as each class (the
    sample's class mix over positions), then minus the mean over positions of the top softmax
    probability (confidence), then minus the mean over positions of the softmax's entropy.

    The softmax is over the last dimension, each position on its own. The two means are
    negated so that the largest value of a row is always one of its class shares (a share of
    at least ``1/C`` against a value of at most 0): the row's argmax is the sample's most
    frequent class (the first one on a tie), as the argmax of a ``[B, C]`` row is its
    predicted class. ``mask`` (``[B, T]``, true where a position counts) leaves padding out.
    """
    x = _real(logits.detach()).float()
    log_p = torch.log_softmax(x, dim=-1)
    p = log_p.exp()
    confidence, predicted = p.max(dim=-1)
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    if mask is None:
        weight = torch.ones(predicted.shape, dtype=torch.float32, device=x.device)
    else:
        weight = mask.to(device=x.device, dtype=torch.float32)
    counted = weight.sum(dim=1).clamp_min(1.0)
    shares = torch.zeros(x.shape[0], x.shape[2], dtype=torch.float32, device=x.device)
    shares.scatter_add_(1, predicted, weight)
    return torch.cat(
        (
            shares / counted[:, None],
            -((confidence * weight).sum(dim=1) / counted)[:, None],
            -((entropy * weight).sum(dim=1) / counted)[:, None],
        ),
        dim=1,
    )


def token_summary(
    activation: torch.Tensor, mask: torch.Tensor, max_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_token_summary`; a series of values ``[B, T]`` (an input of a length each
    request chooses), not token ids, also gives its mean and spread over its own steps as
    features: its length alone would miss a shift in its level or its scale."""
    stats, features = _token_summary(activation, mask, max_features)
    if activation.dim() == 2 and (activation.is_floating_point() or activation.is_complex()):
        features = torch.cat((features, stats[:, :2]), dim=1)
    return stats, features


def _token_summary(
    activation: torch.Tensor, mask: torch.Tensor, max_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Statistics ``[B, 7]`` and drift features of a token activation, padding left out.

    ``mask`` is the attention mask ``[B, T]`` (non-zero: a token, zero: padding). A hidden state
    ``[B, T, H]`` gives statistics over the values of its tokens and, as features, the mean over
    its tokens per hidden unit (the first ``max_features`` units): what a sentence looks like
    to the layer, whatever the batch's padding or the sentence's length. Token ids ``[B, T]``
    (the model's input) give statistics over the ids and, as their one feature, the token count.
    Both results own their storage; a NaN or Inf in the padding counts for nothing.
    """
    x = _real(activation.detach())  # as reduce_activation reads it, not its real part
    valid = mask.detach().to(device=x.device, dtype=torch.bool)
    if x.device.type == "cpu" and bool(valid.all()):
        # No padding (a batch of one text, or of equal lengths): the plain reductions over
        # every token are the same numbers at a third of the cost.
        tokens_all = torch.full((x.shape[0], 1), float(x.shape[1]), dtype=torch.float32)
        if x.dim() == 2:
            return reduce_activation(x), tokens_all
        mean_over_tokens = x.mean(dim=1, dtype=torch.float32)[:, :max_features]
        return reduce_activation(x), mean_over_tokens
    if x.device.type == "cpu":
        return _packed_token_summary(x, valid, max_features)
    return _masked_token_summary(x, valid, max_features)


def _masked_token_summary(
    activation: torch.Tensor, valid: torch.Tensor, max_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_summary` of a padded batch by masking the padding, for devices: packing the
    tokens would bring their count back to the host, a synchronisation in the request
    thread."""
    x = activation
    tokens = valid.sum(dim=1)
    if x.dim() == 2:
        x = x[:, :, None]
    if x.dtype != torch.float32:
        x = x.float()
    width = x.shape[2]
    padding = ~valid[:, :, None]
    count = tokens.clamp(min=1).to(torch.float32)
    elements = count * width
    # masked_fill makes new tensors: nothing here is a view of the activation, so an in-place
    # operation after the hook (ReLU(inplace=True)) cannot reach what was captured.
    values = x.masked_fill(padding, 0.0)
    mean = values.sum(dim=(1, 2), dtype=torch.float32) / elements
    centred = (x - mean[:, None, None]).masked_fill_(padding, 0.0)
    std = torch.linalg.vector_norm(centred, dim=(1, 2), dtype=torch.float32) / elements.sqrt()
    empty = tokens == 0
    lo = x.masked_fill(padding, math.inf).amin(dim=(1, 2)).masked_fill_(empty, 0.0)
    hi = x.masked_fill(padding, -math.inf).amax(dim=(1, 2)).masked_fill_(empty, 0.0)
    # Padding is 0 in ``values``, so it never counts as a non-zero.
    zero_fraction = 1.0 - (values != 0).sum(dim=(1, 2), dtype=torch.float32) / elements
    zero_fraction.masked_fill_(empty, 0.0)
    if x.device.type != "cpu" or not math.isfinite(float((mean + std).sum())):
        nan_count = torch.isnan(values).sum(dim=(1, 2), dtype=torch.float32)
        inf_count = torch.isinf(values).sum(dim=(1, 2), dtype=torch.float32)
    else:
        nan_count = inf_count = torch.zeros_like(mean)
    stats = torch.stack((mean, std, lo, hi, zero_fraction, nan_count, inf_count), dim=1)
    if activation.dim() == 2:
        features = tokens.to(torch.float32)[:, None]
    else:
        features = values[:, :, :max_features].sum(dim=1) / count[:, None]
    return stats, features


def _packed_token_summary(
    activation: torch.Tensor, valid: torch.Tensor, max_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_summary` of a padded batch on the host, from its tokens alone.

    The tokens are packed into ``[N, H]`` (boolean indexing keeps them in row order) and each
    sample's reductions gathered per token with ``index_add_``/``scatter_reduce_``: every
    operation reads only the tokens, and none broadcasts a ``[B, T, 1]`` mask over the hidden
    units, which on CPU is several times slower than the reduction itself (docs/bench/README.md,
    "Figures behind the code's constants").
    """
    x = activation if activation.dim() == 3 else activation[:, :, None]
    if x.dtype != torch.float32:
        x = x.float()
    batch, length, width = x.shape
    tokens = valid.sum(dim=1)
    kept = x.reshape(batch * length, width)[valid.reshape(-1)]
    sample = torch.repeat_interleave(torch.arange(batch), tokens)
    count = tokens.clamp(min=1).to(torch.float32)
    elements = count * width

    def per_sample(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(batch, dtype=torch.float32).index_add_(0, sample, values)

    per_unit = torch.zeros(batch, width, dtype=torch.float32).index_add_(0, sample, kept)
    mean = per_unit.sum(dim=1) / elements
    centred = kept - mean.index_select(0, sample)[:, None]
    std = per_sample(centred.square_().sum(dim=1)).div_(elements).sqrt_()
    # A sample without tokens keeps the zeros it starts from (include_self=False).
    zeros = torch.zeros(batch, dtype=torch.float32)  # whatever the default dtype
    lo = zeros.scatter_reduce(0, sample, kept.amin(dim=1), "amin", include_self=False)
    hi = zeros.scatter_reduce(0, sample, kept.amax(dim=1), "amax", include_self=False)
    if math.isfinite(float((mean + std).sum())):
        nonzero = per_sample(kept.sign().abs_().sum(dim=1))
        nan_count = inf_count = torch.zeros_like(mean)
    else:
        # sign() of a NaN is 0 here: count non-zeros exactly, as the masked path does.
        nonzero = per_sample((kept != 0).sum(dim=1, dtype=torch.float32))
        nan_count = per_sample(torch.isnan(kept).sum(dim=1, dtype=torch.float32))
        inf_count = per_sample(torch.isinf(kept).sum(dim=1, dtype=torch.float32))
    zero_fraction = (1.0 - nonzero / elements).masked_fill_(tokens == 0, 0.0)
    stats = torch.stack((mean, std, lo, hi, zero_fraction, nan_count, inf_count), dim=1)
    if activation.dim() == 2:
        return stats, tokens.to(torch.float32)[:, None]
    return stats, per_unit[:, :max_features] / count[:, None]


def _real_rows(activation: NDArray[Any]) -> NDArray[Any]:
    x = np.asarray(activation)
    return np.abs(x) if x.dtype.kind == "c" else x  # as :func:`_real`


#: A row whose mean square exceeds its variance this many times has its variance from the
#: centred form: ``E[x^2] - mean^2`` loses that factor of the sums' relative precision
#: (~1e-7 in float32), which beyond it would show in the std's sixth digit.
CANCELLATION = 8.0

#: Vectors of ones by width and dtype (read-only, shared by every call): a row sum is then one
#: matrix-vector product.
_ONES: dict[tuple[int, np.dtype[Any]], NDArray[Any]] = {}


def _ones(width: int, dtype: np.dtype[Any]) -> NDArray[Any]:
    key = (width, dtype)
    ones = _ONES.get(key)
    if ones is None:
        if len(_ONES) >= 64:  # a model's layers have a few widths; bounded all the same
            _ONES.clear()
        ones = np.ones(width, dtype=dtype)
        ones.flags.writeable = False
        _ONES[key] = ones
    return ones


def reduce_rows(activation: NDArray[Any]) -> NDArray[np.float32]:
    """:func:`reduce_activation` for a host array ``[B, ...]``: a new float32 ``[B, 7]``.

    The row sums and sums of squares are BLAS products, one pass each: several times faster
    than numpy's reductions along rows on a drain's wide layers (docs/bench/README.md,
    "Figures behind the code's constants"). A caller that serves requests holds numpy's BLAS
    to one thread around it (:class:`hookwatch._blas.OneBlasThread`).
    """
    x = _real_rows(activation)
    if x.ndim == 0:
        x = x.reshape(1, 1)
    x = x.reshape(x.shape[0], -1)
    if x.dtype.kind != "f" or x.itemsize < 4:
        # float16 too: its sums would overflow (and round) in float16, where the torch form
        # sums in float32. float64 stays float64, as in the torch form.
        x = x.astype(np.float32)
    rows, width = x.shape
    out = np.zeros((rows, len(STATISTICS)), dtype=np.float32)
    if width == 0 or rows == 0:
        return out
    # Inf - Inf is NaN here on purpose (it flags the row), not a warning for the worker's log.
    with np.errstate(invalid="ignore", over="ignore"):
        total = x @ _ones(width, x.dtype)
        squares = np.matmul(x[:, None, :], x[:, :, None]).reshape(rows)
        mean = total / x.dtype.type(width)
        # In float64: the difference below is where the precision goes.
        mean_square = squares.astype(np.float64) / width
        variance = mean_square - np.square(mean, dtype=np.float64)
        out[:, 0] = mean
        out[:, 1] = np.sqrt(np.maximum(variance, 0.0))
        # Rows whose variance cancels (a large mean against a small spread, a constant row)
        # or is not finite (NaN, Inf, a square beyond the dtype): the centred two-pass form,
        # as exact as the sums allow, and NaN/Inf exactly where the values have them.
        exact = ~(variance * CANCELLATION >= mean_square)
        if exact.any():
            picked = x[exact]
            centred_mean = picked.sum(axis=1) / x.dtype.type(width)
            centred = picked - centred_mean[:, None]
            out[exact, 0] = centred_mean
            out[exact, 1] = np.sqrt(np.einsum("ij,ij->i", centred, centred) / width)
    np.min(x, axis=1, out=out[:, 2])
    np.max(x, axis=1, out=out[:, 3])
    # A NaN is not a zero (x != 0 holds for it), as count_nonzero counts; summed into int32,
    # half count_nonzero's time per row (its axis form sums a bool copy into int64).
    out[:, 4] = 1.0 - (x != 0).sum(axis=1, dtype=np.int32) / width
    if not np.isfinite(out[:, :2]).all():
        # As in the torch form: only a non-finite value makes the mean or std non-finite.
        out[:, 5] = np.isnan(x).sum(axis=1)
        out[:, 6] = np.isinf(x).sum(axis=1)
    return out


def feature_rows(
    activation: NDArray[Any], max_features: int, flatten: bool = False
) -> NDArray[np.float32]:
    """:func:`feature_summary` for a host array: float32 ``[B, F]``, ``F <= max_features``."""
    x = _real_rows(activation)
    if x.ndim == 0:
        x = x.reshape(1, 1)
    if x.ndim == 1:
        x = x.reshape(-1, 1)
    if flatten and x.ndim > 2 and math.prod(x.shape[1:]) <= max_features:
        x = x.reshape(x.shape[0], -1)
    if x.ndim > 2:
        # Only the kept channels are averaged.
        x = x.reshape(x.shape[0], x.shape[1], -1)[:, :max_features]
        if x.dtype.kind == "f" and x.itemsize >= 4:
            # Per-channel means as one matrix-vector product (as reduce_rows' sums).
            with np.errstate(invalid="ignore", over="ignore"):
                x = (x @ _ones(x.shape[2], x.dtype)) / x.dtype.type(x.shape[2])
        else:
            x = x.mean(axis=2, dtype=np.float32)
    return np.array(x[:, :max_features], dtype=np.float32)
