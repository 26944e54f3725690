"""The fleet's drift page: a test on the bin counts merged over every worker and replica, whose
false pages are budgeted in time, whatever the fleet's size and traffic.

The recording rules (``hookwatch-fleet-drift.yml``) evaluate it in PromQL every rule
evaluation on the fleet's last 10 minutes of counts; this module is the same arithmetic in
numpy, for the simulation that measures it (``python -m dev fleet-sim``) and the tests that
compare both.

Per fleet feature (a (detector, feature) pair with per-bin counters), with ``c_k`` the fleet's
samples in bin ``k`` over the window, ``W = sum_k c_k``, ``q_k`` the reference's smoothed share
(:func:`expected_shares`), ``k_f = max(bins - 1, 1)`` and ``n_ref`` the reference size, the
observed chi-square distance is ``D = sqrt(sum_k (c_k / W - q_k)^2 / q_k)``. The feature pages
when

    D > B + sqrt((k_f + 2 sqrt(k_f y) + 2 y) / W)

with ``B`` the reference tolerance of :func:`reference_tolerance` (``x = log(F / delta)``, ``F``
the model's fleet features, ``delta = FLEET_REFERENCE_DELTA``) and ``y = log(F * budget /
MIN_EVALUATION_INTERVAL_S)``, ``budget`` the page budget in seconds.

Why that bounds false pages. Let ``q0`` be the true clean shares. On the event, of probability
about ``1 - delta`` over the reference draw, that every feature has ``||q0 - q|| <= B`` (the
chi-square distance weighted by ``1 / q``), the triangle inequality gives ``D <= ||p - q0|| +
B`` for the window's shares ``p``, and ``W ||p - q0||^2`` is Pearson's chi-square with ``k_f``
degrees of freedom (asymptotically), whose tail beyond ``k_f + 2 sqrt(k_f y) + 2 y`` is at most
``exp(-y)`` (Laurent and Massart). So on clean traffic one evaluation pages one feature with
probability at most ``exp(-y) = MIN_EVALUATION_INTERVAL_S / (F * budget)``; a union bound over
the ``F`` features and the at most ``budget / MIN_EVALUATION_INTERVAL_S`` evaluations of a
budget period bounds the expected number of evaluations that page, and so of false pages, by 1
per budget period. Nothing in that depends on the number of workers, replicas or samples: more
traffic only makes ``W`` larger, which shrinks the noise term towards the tolerance ``B``.
Overlapping windows and correlated evaluations do not matter to a union bound.

What is approximate: the chi-square tail for small windows (the page needs ``W`` at least
``drift.window``), ``1 / q`` weights instead of ``1 / q0``, and ``increase()``'s
extrapolation of the counts at the window's edges in PromQL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from hookwatch._drift.bins import BinnedReference, FloatArray, expect, expected_shares
from hookwatch._drift.sequential import reference_tolerance

__all__ = [
    "FLEET_REFERENCE_DELTA",
    "MIN_EVALUATION_INTERVAL_S",
    "FleetPageTest",
    "chi_square_tail",
]

#: Probability, over the reference draw, that the tolerance ``B`` fails for some fleet feature
#: (the rules' constant; ``drift.reference_confidence`` is the per-worker tests' own).
FLEET_REFERENCE_DELTA = 0.01
#: The budget counts rule evaluations as if they came once a second: valid for any evaluation
#: interval of at least 1 s (Prometheus' default is 1 minute, the package's 15 s).
MIN_EVALUATION_INTERVAL_S = 1.0


def chi_square_tail(dof: NDArray[np.float64] | float, y: float) -> FloatArray:
    """Laurent-Massart: a chi-square with ``dof`` degrees of freedom exceeds this with
    probability at most ``exp(-y)``."""
    k = np.asarray(dof, dtype=np.float64)
    result: FloatArray = k + 2 * np.sqrt(k * y) + 2 * y
    return result


class FleetPageTest:
    """The fleet page of one model: its fleet features, their tolerances and the page budget.

    ``references`` and ``indices`` are the fleet detectors and, per detector, the features whose
    bins are counted (``DriftTracker.fleet_features``); ``budget_s`` is
    ``drift.false_page_days`` in seconds.
    """

    def __init__(
        self,
        references: Sequence[BinnedReference],
        indices: Sequence[NDArray[np.intp]],
        budget_s: float,
    ) -> None:
        expect(len(references) == len(indices) > 0, "one index per fleet detector", indices)
        expect(budget_s > 0, "a page budget > 0 seconds", budget_s)
        self.names = tuple(r.name for r in references)
        self.features = int(sum(len(i) for i in indices))
        self.log_features_over_delta = math.log(self.features / FLEET_REFERENCE_DELTA)
        self.log_budget = math.log(self.features * budget_s / MIN_EVALUATION_INTERVAL_S)
        self._q: list[FloatArray] = []
        self._inv_q: list[FloatArray] = []
        self._dof: list[FloatArray] = []
        self._tolerance: list[FloatArray] = []
        for ref, index in zip(references, indices, strict=True):
            valid = ref.valid[index]
            q = expected_shares(ref.counts[index], valid)
            self._q.append(q)
            self._inv_q.append(np.where(valid, 1.0 / np.where(valid, q, 1.0), 0.0))
            self._dof.append(np.maximum(valid.sum(axis=1) - 1, 1).astype(np.float64))
            self._tolerance.append(
                reference_tolerance(valid.sum(axis=1), ref.n_ref, self.log_features_over_delta)
            )

    def ratios(self, counts: Sequence[NDArray[np.int64]]) -> list[FloatArray]:
        """Per detector, ``D / threshold`` per feature for counts ``[..., F_d, K]`` (the window's,
        summed over the fleet); a feature pages above 1. NaN where a feature has no samples."""
        out: list[FloatArray] = []
        for d, c in enumerate(counts):
            c = np.asarray(c, dtype=np.float64)
            w = c.sum(axis=-1)
            with np.errstate(invalid="ignore", divide="ignore"):
                share = c / w[..., None]
                distance = np.sqrt(((share - self._q[d]) ** 2 * self._inv_q[d]).sum(axis=-1))
                noise = np.sqrt(chi_square_tail(self._dof[d], self.log_budget) / w)
                ratio: FloatArray = np.where(w > 0, distance / (self._tolerance[d] + noise), np.nan)
            out.append(ratio)
        return out

    def pages(self, counts: Sequence[NDArray[np.int64]], min_samples: int) -> NDArray[np.bool_]:
        """Whether the window pages (any fleet feature over its threshold, among detectors whose
        window holds at least ``min_samples`` samples), per leading index of ``counts``."""
        paged: NDArray[np.bool_] | None = None
        for c, ratio in zip(counts, self.ratios(counts), strict=True):
            enough = np.asarray(c).sum(axis=-1).max(axis=-1) >= min_samples
            hit = (np.nan_to_num(ratio, nan=0.0) > 1.0).any(axis=-1) & enough
            paged = hit if paged is None else paged | hit
        assert paged is not None
        return paged
