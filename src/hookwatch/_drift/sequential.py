"""Anytime-valid drift alarms: a Shiryaev-Roberts e-detector over reference-quantile bins.

The sliding-window test controls its false alarms per verdict; over an unbounded stream it
alarms on healthy traffic again and again. This detector controls them over time instead: its
expected number of samples between false alarms is at least a stated run length, however long
it runs, and the finite reference it was built from is part of the guarantee.

Per feature, with ``q`` the reference's (smoothed) bin shares, ``p_t`` a forecast of the
traffic's bin shares made from samples before ``t`` only (exponentially weighted counts shrunk
towards ``q``), and ``S_t`` the chi-square distance ``sqrt(sum_k (p_t(k) - q(k))^2 / q(k))``,
sample ``t`` falling in bin ``k`` is worth, for a betting fraction ``lam`` in (0, 1],

    e_t = (1 + lam (p_t(k) / q(k) - 1)) / (1 + lam B S_t).

``B`` bounds how far the true clean shares ``q0`` can be from ``q``: the expected value of the
numerator under clean traffic is ``1 + lam sum_k (q0 - q)(p_t - q) / q``, which Cauchy-Schwarz
keeps below ``1 + lam S_t sqrt(chi2(q0, q))``. ``n chi2(q0, q)`` is asymptotically chi-square with
(bins - 1) degrees of freedom, and the Laurent-Massart tail ``k + 2 sqrt(k x) + 2 x`` with
``x = log(features of the profile / delta)`` bounds it for every feature at once with
probability about ``1 - delta`` over the reference draw. On that event every ``e_t`` has
expectation at most 1 given the past, whatever the forecast.

The Shiryaev-Roberts statistic ``R_t = e_t (R_{t-1} + 1)`` then has ``R_t - t`` a
supermartingale, and so has its average over a detector's features and betting fractions.
Stopping when the average reaches ``c`` gives ``E[samples to a false alarm] >= c`` (optional
stopping); restarting at 0 after each alarm keeps false alarms at most one per ``c`` samples in
the long run. A profile's ``D`` detectors share the budget: each stops at ``c D``.

The price of the finite reference is a tolerance: a feature's e-values only grow once its
traffic is further from the reference than ``B`` (in chi-square distance), so shifts within the
reference's own sampling error never alarm, however long they last. ``B`` shrinks like
``1 / sqrt(n)`` with the reference size ``n``.

Anchors: Shin, Ramdas and Rinaldo, "E-detectors: a nonparametric framework for sequential
change detection" (2023), for the e-detector and its run-length bound; Podkopaev and Ramdas
(ICLR 2022) and Shaer, Bar, Prinster and Romano (2026) for tests of deployed models whose
validity holds conditionally on a finite reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hookwatch._drift.bins import BinnedReference, CodeArray, FloatArray, expect, expected_shares

__all__ = ["SequentialAlarm", "SequentialTest", "reference_tolerance"]

#: Samples per forecast: it is frozen over this many samples (it may only use the past), then
#: refreshed. Smaller reacts sooner and costs more Python per sample.
REFRESH = 64
#: Weight of the reference shares in the forecast, in samples: before any traffic the forecast
#: is the reference itself.
PRIOR_SAMPLES = 10.0
#: Betting fractions, averaged: 1 wins fastest on a large shift, 1/4 keeps growing on a shift
#: close to the tolerance. (1, 1/2, 1/4, 1/8) detected no sooner in simulations, at twice the
#: cost.
FRACTIONS = (1.0, 0.25)
#: Range of the log e-values used (see _refresh): capping one from above only makes the test
#: more cautious; raising one from below is paid for by dividing all by 1 + exp(LOG_E_FLOOR).
LOG_E_FLOOR = -8.0
LOG_E_CAP = 8.0


def reference_tolerance(
    valid_bins: NDArray[np.int64], n: int, log_features_over_delta: float
) -> FloatArray:
    """Per feature, ``B``: the chi-square distance the true clean shares may be from the
    reference's, for all features at once with probability about ``1 - delta``."""
    expect(n >= 1, "a reference of at least 1 sample", n)
    expect(log_features_over_delta > 0, "log(features / delta) > 0", log_features_over_delta)
    k = np.maximum(np.asarray(valid_bins, dtype=np.float64) - 1, 1.0)
    x = log_features_over_delta
    result: FloatArray = np.sqrt((k + 2 * np.sqrt(k * x) + 2 * x) / n)
    return result


@dataclass(frozen=True)
class SequentialAlarm:
    """One alarm of a sequential test: ``position`` counts samples since the test started."""

    detector: str
    level: str
    position: int
    log_evidence: float


class SequentialTest:
    """One detector's e-detector: feed it bin codes in arrival order, it returns its alarms.

    ``log_threshold`` is ``log(c D)`` for this detector; ``log_features_over_delta`` sets the
    reference tolerance (:func:`reference_tolerance`); ``memory`` is the forecast's time
    constant in samples. State: O(features x bins) floats.
    """

    def __init__(
        self,
        reference: BinnedReference,
        log_threshold: float,
        log_features_over_delta: float,
        memory: int,
    ) -> None:
        expect(0 < log_threshold <= 100, "a log threshold in (0, 100]", log_threshold)
        expect(memory >= 1, "a forecast memory of at least 1 sample", memory)
        self.detector = reference.name
        self.level = reference.level
        self.log_threshold = float(log_threshold)
        self._threshold = math.exp(log_threshold)
        features, bins = reference.counts.shape
        valid = reference.valid
        self._valid = valid
        self._q = expected_shares(reference.counts, valid)
        self._inv_q = np.where(valid, 1.0 / np.where(valid, self._q, 1.0), 0.0)
        self._tolerance = reference_tolerance(
            valid.sum(axis=1), reference.n_ref, log_features_over_delta
        )
        self._fractions = np.asarray(FRACTIONS)[:, None, None]
        self._decay = 1.0 - 1.0 / memory
        self._offsets = np.arange(features, dtype=np.int64) * bins
        self._shape = (features, bins)
        self._terms = features * len(FRACTIONS)
        self._weighted = np.zeros((features, bins))
        #: log R per (fraction, feature), flattened.
        #: R per (fraction, feature), flattened.
        self._r = np.zeros(len(FRACTIONS) * features)
        self._table = np.ones((features * bins, len(FRACTIONS)))
        self.seen = 0
        self.alarms = 0
        #: log of the mean Shiryaev-Roberts statistic after the latest sample (-inf: restarted).
        self.log_evidence = -math.inf

    def state_bytes(self) -> int:
        """Memory of the test's state: O(features x bins), whatever the traffic."""
        arrays = (self._weighted, self._r, self._table, self._q, self._inv_q, self._tolerance)
        return sum(a.nbytes for a in arrays)

    def update(self, codes: CodeArray) -> list[SequentialAlarm]:
        """Advance over ``codes`` ``[B, F]`` (oldest first); the alarms they raised.

        The forecast is refreshed every ``REFRESH`` samples counted from the start, so the
        result does not depend on how the stream is cut into calls.
        """
        alarms: list[SequentialAlarm] = []
        flat = np.asarray(codes, dtype=np.int64) + self._offsets
        done = 0
        while done < len(flat):
            if self.seen % REFRESH == 0:
                self._refresh()
            block = flat[done : done + REFRESH - self.seen % REFRESH]
            alarms.extend(self._advance(block))
            done += len(block)
        return alarms

    def _refresh(self) -> None:
        """``log e`` of every (fraction, feature, bin) from the forecast of the samples so far."""
        forecast = (self._weighted + PRIOR_SAMPLES * self._q) / (
            self._weighted.sum(axis=1, keepdims=True) + PRIOR_SAMPLES
        )
        distance = np.sqrt(((forecast - self._q) ** 2 * self._inv_q).sum(axis=1))
        lam = self._fractions
        # Bins that do not exist never receive a code: ratio 1 keeps their entries finite.
        ratio = np.where(self._valid, forecast * self._inv_q, 1.0)
        table = np.log1p(lam * (ratio - 1.0)[None]) - np.log1p(
            lam * (self._tolerance * distance)[None, :, None]
        )
        # Clipped to [LOG_E_FLOOR, LOG_E_CAP] and divided by 1 + exp(LOG_E_FLOOR): the
        # expectation bound still holds exactly, and a block's running products stay within
        # float64 (see _roberts).
        floored = np.clip(table, LOG_E_FLOOR, LOG_E_CAP) - math.log1p(math.exp(LOG_E_FLOOR))
        # [F * K, fractions]: a block's gather is then [B, F, fractions], contiguous.
        self._table = np.exp(floored).reshape(len(FRACTIONS), -1).T.copy()

    def _advance(self, flat: NDArray[np.int64]) -> list[SequentialAlarm]:
        alarms: list[SequentialAlarm] = []
        e = self._table[flat].reshape(len(flat), -1)
        done = 0
        while done < len(flat):
            r = _roberts(self._r, e[done:])
            mean = r.sum(axis=1) / self._terms
            over = np.flatnonzero(mean >= self._threshold)
            if over.size == 0:
                self._r = r[-1]
                self.log_evidence = math.log(mean[-1]) if mean[-1] > 0 else -math.inf
                break
            at = int(over[0])
            self.alarms += 1
            position = self.seen + done + at + 1
            alarms.append(SequentialAlarm(self.detector, self.level, position, math.log(mean[at])))
            # Restart: the run-length bound holds afresh from the sample after the alarm.
            self._r = np.zeros_like(self._r)
            self.log_evidence = -math.inf
            done += at + 1
        self._remember(flat)
        self.seen += len(flat)
        return alarms

    def _remember(self, flat: NDArray[np.int64]) -> None:
        m = len(flat)
        # The j-th sample of the block weighs decay ** (m - 1 - j): the newest weighs 1.
        ages = self._decay ** np.arange(m - 1, -1, -1, dtype=np.float64)
        added = np.bincount(
            flat.ravel(), weights=np.repeat(ages, flat.shape[1]), minlength=self._weighted.size
        )
        self._weighted = self._weighted * self._decay**m + added.reshape(self._shape)


def _roberts(r0: FloatArray, e: FloatArray) -> FloatArray:
    """Shiryaev-Roberts over a block: ``R_t = e_t (R_{t-1} + 1)`` per column, ``[B, C]``.

    With ``P_t`` the running product of ``e`` in the block, ``R_t = P_t (R_0 + sum_{s<=t}
    1 / P_{s-1})`` and ``1 / P_{s-1} = e_s / P_s``: a cumulative product and sum, no Python loop
    per sample. Each ``e`` lies in [exp(LOG_E_FLOOR), exp(LOG_E_CAP)] and ``R_0`` below the
    threshold, so over a block of ``REFRESH`` samples (64 x 8 + log threshold < 709) nothing
    leaves float64's range.
    """
    running = np.cumprod(e, axis=0)
    result: FloatArray = running * (r0[None, :] + np.cumsum(e / running, axis=0))
    return result
