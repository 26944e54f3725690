"""Per-sample activation statistics: the cheap reduction done on the request path.

Pure torch/numpy: no Prometheus or TorchServe imports.
"""

from __future__ import annotations

import torch

#: Columns of the tensor :func:`reduce_activation` returns, in order.
STATISTICS: tuple[str, ...] = (
    "mean",
    "std",
    "min",
    "max",
    "zero_fraction",
    "nan_count",
    "inf_count",
)
#: The statistics exported as per-sample summaries (the non-finite counts are exported as counters).
SUMMARY_STATISTICS: tuple[str, ...] = STATISTICS[:5]
NAN_COLUMN = STATISTICS.index("nan_count")
INF_COLUMN = STATISTICS.index("inf_count")


def reduce_activation(activation: torch.Tensor) -> torch.Tensor:
    """Reduce a batch-first activation ``[B, ...]`` to a new float32 ``[B, len(STATISTICS)]``.

    The result owns its storage, so keeping it never keeps the activation alive. Nothing here
    moves data to the host: on a GPU the reduction stays queued on the device's stream and the
    background thread pays for the copy.
    """
    x = activation.detach()
    if x.dim() == 0:
        x = x.reshape(1, 1)
    x = x.reshape(x.shape[0], -1)
    if not x.is_floating_point():
        x = x.float()
    width = x.shape[1]
    if width == 0:
        return torch.zeros((x.shape[0], len(STATISTICS)), dtype=torch.float32, device=x.device)
    # unbiased=False: a layer of width 1 is a legal, if odd, thing to watch.
    std, mean = torch.std_mean(x, dim=1, correction=0)
    lo, hi = torch.aminmax(x, dim=1)
    zero_fraction = (x == 0).sum(dim=1, dtype=torch.float32) / width
    nan_count = torch.isnan(x).sum(dim=1, dtype=torch.float32)
    inf_count = torch.isinf(x).sum(dim=1, dtype=torch.float32)
    return torch.stack(
        (mean.float(), std.float(), lo.float(), hi.float(), zero_fraction, nan_count, inf_count),
        dim=1,
    )


def feature_summary(activation: torch.Tensor, max_features: int) -> torch.Tensor:
    """One value per feature and sample, ``[B, F]`` with ``F <= max_features``, for drift tests.

    Convolutional maps ``[B, C, ...]`` become per-channel spatial means, so drift is judged per
    feature; flat layers keep their units. Wider layers keep the first ``max_features`` units; a
    projection fitted on the reference profile replaces that where one is configured.
    """
    x = activation.detach()
    if x.dim() == 0:
        x = x.reshape(1, 1)
    if x.dim() == 1:
        x = x.reshape(-1, 1)
    if x.dim() > 2:
        x = x.flatten(2).mean(dim=2) if x.is_floating_point() else x.flatten(2).float().mean(dim=2)
    x = x[:, :max_features]
    return x.float().clone() if x.dtype == torch.float32 else x.float()
