"""The anytime-valid drift test: run length on clean streams, power, streaming arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hookwatch._drift import BinnedReference, SequentialTest, reference_tolerance
from hookwatch._drift.sequential import _roberts

FEATURES = 4


def _reference(n: int = 2000, seed: int = 0) -> BinnedReference:
    rng = np.random.default_rng(seed)
    return BinnedReference.fit("layer", "activation", rng.normal(size=(n, FEATURES)), bins=10)


def _test(ref: BinnedReference, run_length: float) -> SequentialTest:
    return SequentialTest(ref, math.log(run_length), math.log(FEATURES / 0.01), memory=200)


def test_roberts_block_equals_the_recursion_sample_by_sample() -> None:
    rng = np.random.default_rng(1)
    log_e = rng.normal(scale=0.7, size=(32, 3))
    r0 = np.array([0.0, 0.3, 7.0])
    block = _roberts(r0, np.exp(log_e))
    r = r0.copy()
    for t in range(32):
        r = np.exp(log_e[t]) * (r + 1)
        assert np.allclose(block[t], r, rtol=1e-9)


def test_clean_streams_stay_far_below_the_stated_false_alarm_rate() -> None:
    """At a run length of 500 samples a clean stream of 200,000 may alarm 400 times in
    expectation; the reference tolerance keeps it far below. Over several reference draws."""
    alarms = 0
    for seed in range(3):
        ref = _reference(seed=seed)
        test = _test(ref, 500)
        rng = np.random.default_rng(100 + seed)
        alarms += len(test.update(ref.encode(rng.normal(size=(200_000, FEATURES)))))
    assert alarms <= 3 * 200_000 / 500 * 0.1, alarms


def test_without_the_reference_tolerance_a_finite_reference_alarms_on_clean_traffic() -> None:
    """What the tolerance is for: betting on the reference's shares as if they were exact, a
    long clean stream finds the reference's own sampling error and alarms over and over."""
    ref = _reference(n=300)
    test = _test(ref, 500)
    test._tolerance = np.zeros_like(test._tolerance)
    rng = np.random.default_rng(7)
    alarms = test.update(ref.encode(rng.normal(size=(200_000, FEATURES))))
    assert len(alarms) > 200_000 / 500, len(alarms)


@pytest.mark.parametrize(("shift", "within"), [(1.0, 300), (0.5, 2000)])
def test_a_mean_shift_alarms_soon_at_a_thirty_day_run_length(shift: float, within: int) -> None:
    ref = _reference()
    test = _test(ref, 25_920_000 * 10)
    rng = np.random.default_rng(3)
    assert test.update(ref.encode(rng.normal(size=(2000, FEATURES)))) == []
    alarms = test.update(ref.encode(rng.normal(size=(within, FEATURES)) + shift))
    assert alarms and alarms[0].position <= 2000 + within
    assert (alarms[0].detector, alarms[0].level) == ("layer", "activation")


def test_a_shift_within_the_reference_tolerance_is_not_an_alarm() -> None:
    ref = _reference(n=500)
    test = _test(ref, 25_920_000 * 10)
    rng = np.random.default_rng(4)
    assert test.update(ref.encode(rng.normal(size=(50_000, FEATURES)) + 0.05)) == []


def test_results_do_not_depend_on_how_the_stream_is_cut() -> None:
    ref = _reference()
    rng = np.random.default_rng(5)
    codes = ref.encode(
        np.concatenate([rng.normal(size=(3000, FEATURES)), rng.normal(size=(3000, FEATURES)) + 0.7])
    )
    whole = _test(ref, 1e6)
    expected = [a.position for a in whole.update(codes)]
    pieces = _test(ref, 1e6)
    got: list[int] = []
    cuts = np.cumsum(rng.integers(1, 90, size=400))
    for part in np.split(codes, cuts[cuts < len(codes)]):
        got += [a.position for a in pieces.update(part)]
    assert expected and got == expected
    assert math.isclose(whole.log_evidence, pieces.log_evidence, rel_tol=1e-9, abs_tol=1e-9)


def test_the_tolerance_shrinks_like_one_over_root_n() -> None:
    small, large = (
        reference_tolerance(np.array([10]), 1000, 10.0),
        reference_tolerance(np.array([10]), 4000, 10.0),
    )
    assert math.isclose(float(small[0] / large[0]), 2.0)


def test_the_tracker_hands_over_its_sequential_alarms_once_and_holds_a_bounded_list() -> None:
    from hookwatch._drift import DriftTracker, calibrate
    from hookwatch._drift.tracker import MAX_PENDING_ALARMS

    ref = _reference()
    rng = np.random.default_rng(9)

    def tracker() -> DriftTracker:
        return DriftTracker(
            {"layer": ref},
            calibrate([ref], 50, windows=200),
            10,
            sequential={"layer": _test(ref, 100)},
        )

    t = tracker()
    shifted = rng.normal(size=(3000, FEATURES)) + 2.0
    t.update("layer", shifted)
    alarms = t.take_alarms()
    assert alarms and [a.position for a in alarms] == sorted(a.position for a in alarms)
    assert alarms[-1].position <= 3000 and t.take_alarms() == []
    # Never taken: the list stops growing; the test still counts every alarm.
    untaken = tracker()
    for _ in range(40):
        untaken.update("layer", shifted)
    assert len(untaken._alarms) == MAX_PENDING_ALARMS
    assert untaken.sequential["layer"].alarms > MAX_PENDING_ALARMS


def _one_by_one(test: SequentialTest, codes: np.ndarray) -> tuple[list[int], list[float]]:
    """The e-detector written sample by sample from its definition: the reference the block
    arithmetic (cumulative products, alarms and restarts found inside a block) must match.
    Returns the alarm positions and the log evidence after every sample."""
    from hookwatch._drift.sequential import FRACTIONS, LOG_E_CAP, LOG_E_FLOOR, PRIOR_SAMPLES

    features, bins = test._shape
    lam = np.asarray(FRACTIONS)
    weighted = np.zeros((features, bins))
    r = np.zeros((len(FRACTIONS), features))
    e = np.ones((len(FRACTIONS), features, bins))
    alarms: list[int] = []
    evidence: list[float] = []
    for t, row in enumerate(codes.astype(np.int64)):
        if t % 64 == 0:
            forecast = (weighted + PRIOR_SAMPLES * test._q) / (
                weighted.sum(axis=1, keepdims=True) + PRIOR_SAMPLES
            )
            distance = np.sqrt(((forecast - test._q) ** 2 * test._inv_q).sum(axis=1))
            ratio = np.where(test._valid, forecast * test._inv_q, 1.0)
            log_e = np.log1p(lam[:, None, None] * (ratio - 1.0)) - np.log1p(
                lam[:, None, None] * (test._tolerance * distance)[None, :, None]
            )
            e = np.exp(np.clip(log_e, LOG_E_FLOOR, LOG_E_CAP) - math.log1p(math.exp(LOG_E_FLOOR)))
        r = e[:, np.arange(features), row] * (r + 1.0)
        mean = r.mean()
        if mean >= test._threshold:
            alarms.append(t + 1)
            r = np.zeros_like(r)
            evidence.append(-math.inf)
        else:
            evidence.append(math.log(mean))
        weighted = weighted * test._decay
        weighted[np.arange(features), row] += 1.0
    return alarms, evidence


def test_the_block_arithmetic_equals_the_detector_sample_by_sample() -> None:
    """Alarms (several restarts inside one block among them) at the same samples, and the same
    evidence, as the detector's definition applied one sample at a time."""
    ref = _reference()
    rng = np.random.default_rng(11)
    codes = ref.encode(
        np.concatenate([rng.normal(size=(700, FEATURES)), rng.normal(size=(900, FEATURES)) + 1.5])
    )
    expected, evidence = _one_by_one(_test(ref, 50), codes)
    gaps = np.diff(expected)
    assert len(expected) > 10 and gaps.min() < 64  # restarts within a refresh block
    cuts = np.cumsum(rng.integers(1, 300, size=60))
    for parts in ([codes], np.split(codes, cuts[cuts < len(codes)])):
        test = _test(ref, 50)
        got: list[int] = []
        ends: list[int] = []
        logs: list[float] = []
        for part in parts:
            got += [a.position for a in test.update(part)]
            ends.append(test.seen)
            logs.append(test.log_evidence)
        assert got == expected
        assert test.alarms == len(expected)
        for end, log in zip(ends, logs, strict=True):
            assert math.isclose(log, evidence[end - 1], rel_tol=1e-9, abs_tol=1e-9)
