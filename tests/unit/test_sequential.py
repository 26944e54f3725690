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


def test_a_group_advances_its_tests_exactly_as_each_would_alone() -> None:
    """Alarms (restarts inside blocks among them), evidence and state: bit for bit the tests'
    own, however the stream is cut into drains."""
    from hookwatch._drift import SequentialGroup

    widths = (6, 1, 3, 9)
    refs_rng = np.random.default_rng(21)
    refs = [
        BinnedReference.fit(f"d{i}", "activation", refs_rng.normal(size=(1500, w)), bins=10)
        for i, w in enumerate(widths)
    ]

    def tests() -> list[SequentialTest]:
        log_d = math.log(sum(widths) / 0.01)
        return [SequentialTest(r, math.log(40.0), log_d, 200) for r in refs]

    rng = np.random.default_rng(22)
    n = 1500
    codes = []
    for i, ref in enumerate(refs):
        x = rng.normal(size=(n, widths[i]))
        if i % 2 == 0:
            x[500:] += 1.5
        codes.append(ref.encode(x))
    alone, together = tests(), tests()
    cuts = np.cumsum(rng.integers(1, 150, size=60))
    cuts = cuts[cuts < n]
    expected: list[tuple[str, int, float]] = []
    got: list[tuple[str, int, float]] = []
    group = SequentialGroup(together)
    for start, end in zip([0, *cuts], [*cuts, n], strict=True):
        for test, c in zip(alone, codes, strict=True):
            expected += [
                (a.detector, a.position, a.log_evidence) for a in test.update(c[start:end])
            ]
        got += [
            (a.detector, a.position, a.log_evidence)
            for a in group.update([c[start:end] for c in codes])
        ]
        for mine, theirs in zip(together, alone, strict=True):
            assert (mine.seen, mine.alarms, mine.log_evidence) == (
                theirs.seen,
                theirs.alarms,
                theirs.log_evidence,
            )
    assert len({d for d, _, _ in expected}) >= 2 and len(expected) > 10
    assert sorted(got) == sorted(expected)
    # Within a member, its alarms come by position, as a test's own.
    assert [p for d, p, _ in got if d == "d0"] == sorted(p for d, p, _ in got if d == "d0")
    for mine, theirs in zip(together, alone, strict=True):
        assert np.array_equal(mine._r, theirs._r)
        assert np.array_equal(mine._weighted, theirs._weighted)
        assert np.array_equal(mine._table, theirs._table)
    # Handed back: a member fed alone goes on from the group's state, and the group knows
    # it is behind.
    extra = refs[1].encode(rng.normal(size=(70, 1)))
    assert group.usable
    together[1].update(extra)
    alone[1].update(extra)
    assert not group.usable
    assert np.array_equal(together[1]._r, alone[1]._r)
    assert together[1].log_evidence == alone[1].log_evidence


def test_the_tracker_advances_a_drains_detectors_together_with_the_same_results() -> None:
    from hookwatch._drift import DriftTracker, calibrate

    rng = np.random.default_rng(23)
    refs = {
        name: BinnedReference.fit(name, "activation", rng.normal(size=(1500, w)), bins=10)
        for name, w in (("a", 5), ("b", 3))
    }

    def tracker() -> DriftTracker:
        log_d = math.log(8 / 0.01)
        return DriftTracker(
            refs,
            calibrate(list(refs.values()), 50, windows=200),
            10,
            sequential={n: SequentialTest(r, math.log(60.0), log_d, 200) for n, r in refs.items()},
        )

    x = {"a": rng.normal(size=(900, 5)) + 1.0, "b": rng.normal(size=(900, 3))}
    immediate, deferred = tracker(), tracker()
    verdicts = 0
    pauses: list[int] = []
    for start in range(0, 900, 40):
        # A drain in which "b" lost some rows (non-finite) is fed detector by detector.
        stop_b = start + (25 if start == 400 else 40)
        expected = []
        for name in ("a", "b"):
            stop = stop_b if name == "b" else start + 40
            expected += immediate.update(name, x[name][start:stop])
        deferred.defer()
        for name in ("a", "b"):
            stop = stop_b if name == "b" else start + 40
            assert deferred.update(name, x[name][start:stop]) == []
        # The capture thread pauses once inside (between the tests and the windows).
        before = len(pauses)
        results, failed = deferred.advance(lambda: pauses.append(1))
        assert failed == {} and results == expected and len(pauses) == before + 1
        verdicts += len(results)
        assert immediate.first_alarms == deferred.first_alarms
        assert immediate.sequential_state() == deferred.sequential_state()
        assert immediate.take_alarms() == deferred.take_alarms()
        # Together while in step; out of step for good once "b" was fed fewer samples.
        assert (deferred._group is not None and deferred._group.usable) is (start < 400)
        windows = deferred._window_group
        assert (windows is not None and windows.usable) is (start < 400)
    assert verdicts > 20 and deferred.sequential_state()["a"][0] > 0
    for name in ("a", "b"):
        assert np.array_equal(immediate._windows[name].ordered(), deferred._windows[name].ordered())


def test_a_failing_test_in_a_drain_is_charged_to_its_layer_only() -> None:
    from hookwatch._drift import DriftTracker, calibrate

    rng = np.random.default_rng(24)
    refs = {
        name: BinnedReference.fit(name, "activation", rng.normal(size=(500, 2)), bins=10)
        for name in ("a", "b")
    }
    log_d = math.log(4 / 0.01)
    tests = {n: SequentialTest(r, math.log(60.0), log_d, 200) for n, r in refs.items()}
    tracker = DriftTracker(
        refs, calibrate(list(refs.values()), 50, windows=200), 10, sequential=tests
    )

    def broken(codes: np.ndarray) -> list[object]:
        raise RuntimeError("boom")

    tests["b"].update = broken  # type: ignore[method-assign]
    tests["b"]._r = np.zeros(3)  # the group's concatenation then fails too
    tracker.defer()
    tracker.update("a", rng.normal(size=(40, 2)))
    tracker.update("b", rng.normal(size=(40, 2)))
    _, failed = tracker.advance()
    assert list(failed) == ["b"] and "boom" in str(failed["b"])
    assert tests["a"].seen == 40
    # The failed layer's window took nothing; the other's took its samples.
    assert (tracker._windows["a"].seen, tracker._windows["b"].seen) == (40, 0)
