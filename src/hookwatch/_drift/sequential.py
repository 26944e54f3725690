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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hookwatch._drift.bins import BinnedReference, CodeArray, FloatArray, expect, expected_shares

__all__ = ["SequentialAlarm", "SequentialGroup", "SequentialTest", "reference_tolerance"]

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
        """``e`` of every (feature, bin, fraction) from the forecast of the samples so far."""
        self._table = _e_table(
            self._weighted, self._q, self._inv_q, self._valid, self._tolerance, self._fractions
        )

    def _advance(self, flat: NDArray[np.int64]) -> list[SequentialAlarm]:
        e = self._table[flat].reshape(len(flat), -1)
        alarms, self._r, self.log_evidence = _run_block(self, self._r, e, self.seen)
        self.alarms += len(alarms)
        self._remember(flat)
        self.seen += len(flat)
        return alarms

    def _remember(self, flat: NDArray[np.int64]) -> None:
        self._weighted = _remembered(self._weighted, flat, self._decay)


class SequentialGroup:
    """Several detectors' tests advanced together: one pass per block over all their features.

    A drain feeds every detector the same samples, and each test's work per block is a dozen
    numpy calls whatever its width; side by side, the detectors of a profile cost those calls
    once (``make bench-drain``). The arithmetic is the tests' own, feature by feature, so the
    alarms, evidence and state after :meth:`update` are bit for bit those each test reaches
    on its own (``tests/unit/test_sequential.py``).

    The tests stay the state's owners: the group copies their state in when built and hands
    each its part back after every update, so a test updated on its own later goes on from
    there. It is usable only while every member has seen as many samples as it has
    (:attr:`usable`): a member updated on its own leaves it behind for good.
    """

    def __init__(self, tests: Sequence[SequentialTest]) -> None:
        expect(len(tests) >= 1, "at least one test", len(tests))
        first = tests[0]
        bins, seen, decay = first._shape[1], first.seen, first._decay
        for test in tests:
            expect(test._shape[1] == bins, f"tests of {bins} bins", test._shape[1])
            expect(test.seen == seen, f"tests that have seen {seen} samples", test.seen)
            expect(test._decay == decay, f"tests of one memory ({decay})", test._decay)
        self.tests = tuple(tests)
        self.seen = seen
        self._decay = decay
        self._fractions = first._fractions
        widths = [t._shape[0] for t in tests]
        #: Feature bounds of each member, and of its columns (feature, fraction) in a block.
        self._features = np.cumsum([0, *widths])
        self._columns = self._features * len(FRACTIONS)
        features = int(self._features[-1])
        self._bins = bins
        self._offsets = np.arange(features, dtype=np.int64) * bins
        self._valid = np.concatenate([t._valid for t in tests])
        self._q = np.concatenate([t._q for t in tests])
        self._inv_q = np.concatenate([t._inv_q for t in tests])
        self._tolerance = np.concatenate([t._tolerance for t in tests])
        self._weighted = np.concatenate([t._weighted for t in tests])
        self._r = np.concatenate([t._r for t in tests])
        self._table = np.concatenate([t._table for t in tests])

    @property
    def usable(self) -> bool:
        """Every member has seen exactly the samples the group has (none was fed alone)."""
        return all(test.seen == self.seen for test in self.tests)

    def state_bytes(self) -> int:
        arrays = (self._weighted, self._r, self._table, self._q, self._inv_q, self._tolerance)
        return sum(a.nbytes for a in arrays)

    def update(self, codes: Sequence[CodeArray]) -> list[SequentialAlarm]:
        """Advance every member over its codes ``[B, F_i]`` (one ``B`` for all, oldest first);
        the alarms they raised, member by member in order, each member's by position."""
        expect(len(codes) == len(self.tests), f"codes for {len(self.tests)} tests", len(codes))
        expect(self.usable, "members at the group's sample count", [t.seen for t in self.tests])
        n = len(codes[0])
        expect(
            all(len(c) == n for c in codes), f"{n} samples for every test", [len(c) for c in codes]
        )
        flat = np.concatenate([np.asarray(c, dtype=np.int64) for c in codes], axis=1)
        flat += self._offsets
        raised: list[list[SequentialAlarm]] = [[] for _ in self.tests]
        evidence = [test.log_evidence for test in self.tests]
        done = 0
        while done < n:
            if self.seen % REFRESH == 0:
                self._table = _e_table(
                    self._weighted,
                    self._q,
                    self._inv_q,
                    self._valid,
                    self._tolerance,
                    self._fractions,
                )
            block = flat[done : done + REFRESH - self.seen % REFRESH]
            self._advance(block, raised, evidence)
            self._weighted = _remembered(self._weighted, block, self._decay)
            self.seen += len(block)
            done += len(block)
        bins = self._bins
        for i, test in enumerate(self.tests):
            f0, f1 = self._features[i], self._features[i + 1]
            test._weighted = self._weighted[f0:f1]
            test._table = self._table[f0 * bins : f1 * bins]
            test._r = self._r[self._columns[i] : self._columns[i + 1]]
            test.seen = self.seen
            test.alarms += len(raised[i])
            test.log_evidence = evidence[i]
        return [alarm for alarms in raised for alarm in alarms]

    def _advance(
        self,
        flat: NDArray[np.int64],
        raised: list[list[SequentialAlarm]],
        evidence: list[float],
    ) -> None:
        """One block for every member: the shared part in one pass, a member that alarms
        inside the block carried on alone from its restart, as :meth:`SequentialTest._advance`
        does."""
        e = self._table[flat].reshape(len(flat), -1)
        r = _roberts(self._r, e)
        last = np.empty_like(self._r)
        for i, test in enumerate(self.tests):
            c0, c1 = self._columns[i], self._columns[i + 1]
            alarms, last[c0:c1], evidence[i] = _run_block(
                test, self._r[c0:c1], e[:, c0:c1], self.seen, r[:, c0:c1]
            )
            raised[i].extend(alarms)
        self._r = last


def _run_block(
    test: SequentialTest,
    r0: FloatArray,
    e: FloatArray,
    seen: int,
    r: FloatArray | None = None,
) -> tuple[list[SequentialAlarm], FloatArray, float]:
    """One block of ``test``'s e-values ``e`` ``[B, C]`` from its statistic ``r0`` after
    ``seen`` samples (``r``: the block's statistic, when a group computed it with others'):
    the alarms inside the block, each restarting the statistic, then the statistic after the
    block and its log evidence. The one definition both a test and a group run."""
    alarms: list[SequentialAlarm] = []
    done = 0
    while True:
        if r is None:
            r = _roberts(r0, e[done:])
        # Summed over the detector's own columns: the same sums whether alone or in a group.
        mean = r.sum(axis=1) / test._terms
        over = np.flatnonzero(mean >= test._threshold)
        if over.size == 0:
            return alarms, r[-1], math.log(mean[-1]) if mean[-1] > 0 else -math.inf
        at = int(over[0])
        position = seen + done + at + 1
        alarms.append(SequentialAlarm(test.detector, test.level, position, math.log(mean[at])))
        # Restart: the run-length bound holds afresh from the sample after the alarm.
        done += at + 1
        r0, r = np.zeros_like(r0), None
        if done == len(e):
            return alarms, r0, -math.inf


def _e_table(
    weighted: FloatArray,
    q: FloatArray,
    inv_q: FloatArray,
    valid: NDArray[np.bool_],
    tolerance: FloatArray,
    fractions: FloatArray,
) -> FloatArray:
    """``e`` per (feature, bin) and betting fraction, ``[F * K, fractions]``, from the forecast
    of the samples so far (``weighted``): per feature alone, so the table of several
    detectors' features side by side is theirs side by side."""
    forecast = (weighted + PRIOR_SAMPLES * q) / (
        weighted.sum(axis=1, keepdims=True) + PRIOR_SAMPLES
    )
    distance = np.sqrt(((forecast - q) ** 2 * inv_q).sum(axis=1))
    # Bins that do not exist never receive a code: ratio 1 keeps their entries finite.
    ratio = np.where(valid, forecast * inv_q, 1.0)
    table = np.log1p(fractions * (ratio - 1.0)[None]) - np.log1p(
        fractions * (tolerance * distance)[None, :, None]
    )
    # Clipped to [LOG_E_FLOOR, LOG_E_CAP] and divided by 1 + exp(LOG_E_FLOOR): the
    # expectation bound still holds exactly, and a block's running products stay within
    # float64 (see _roberts).
    floored = np.clip(table, LOG_E_FLOOR, LOG_E_CAP) - math.log1p(math.exp(LOG_E_FLOOR))
    # [F * K, fractions]: a block's gather is then [B, F, fractions], contiguous.
    result: FloatArray = np.exp(floored).reshape(len(fractions), -1).T.copy()
    return result


def _remembered(weighted: FloatArray, flat: NDArray[np.int64], decay: float) -> FloatArray:
    """The forecast's weighted counts after the block of codes ``flat`` (offset per feature)."""
    m = len(flat)
    # The j-th sample of the block weighs decay ** (m - 1 - j): the newest weighs 1.
    ages = decay ** np.arange(m - 1, -1, -1, dtype=np.float64)
    added = np.bincount(
        flat.ravel(), weights=np.repeat(ages, flat.shape[1]), minlength=weighted.size
    )
    result: FloatArray = weighted * decay**m + added.reshape(weighted.shape)
    return result


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
