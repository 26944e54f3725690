"""Drift statistics against numpy/scipy references, calibration, and the streaming window."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from hookwatch._drift import (
    BinnedReference,
    ChiSquare,
    DriftTracker,
    Projection,
    SlidingWindow,
    bin_counts,
    calibrate,
    derive,
    expected_shares,
)


def _reference(
    n: int = 2000, features: int = 3, bins: int = 20, seed: int = 0
) -> tuple[np.ndarray, BinnedReference]:
    x = np.random.default_rng(seed).normal(size=(n, features))
    return x, BinnedReference.fit("layer", "activation", x, bins=bins)


def test_chi_square_is_scipys_pearson_statistic_rescaled_for_the_reference_size() -> None:
    _, ref = _reference(bins=10)
    y = np.random.default_rng(3).normal(loc=0.1, size=(200, 3))
    counts = bin_counts(ref.encode(y)[None], ref.n_bins)[0]
    got = ChiSquare(ref.counts, ref.valid, ref.n_ref)(counts)
    q = expected_shares(ref.counts, ref.valid)
    for j in range(3):
        k = ref.valid[j]
        pearson = stats.chisquare(counts[j][k], f_exp=200 * q[j][k]).statistic
        dof = k.sum() - 1
        assert got[j] == pytest.approx(pearson * ref.n_ref / (ref.n_ref + 200) / dof, rel=1e-9)


def test_ties_merge_and_constant_features_are_dropped() -> None:
    rng = np.random.default_rng(4)
    relu = np.maximum(rng.normal(size=1000) - 0.5, 0.0)  # ~70 % zeros
    constant = np.zeros(1000)
    x = np.stack([relu, constant, rng.normal(size=1000)], axis=1)
    ref = BinnedReference.fit("act", "activation", x, bins=10, min_share=0.01)
    assert ref.kept == (0, 2) and ref.dropped == (1,)
    # All zeros share the first bin; every remaining bin holds at least 1 % of the reference.
    assert ref.counts[0, 0] == np.sum(relu == 0)
    held = ref.counts[ref.valid]
    assert held.min() >= 10
    assert ref.valid[1].sum() == 10 and ref.valid[0].sum() < 10
    codes = ref.encode(x[:5])
    assert codes.shape == (5, 2) and codes.dtype == np.uint8


def test_constant_features_after_the_kept_ones_are_skipped_too() -> None:
    # Kept features that are a prefix (0, 1) were once read as "every feature kept": a layer
    # whose constant columns all came last (a one-hot input's unused slot) was encoded whole,
    # its profile refused at archive time and its drift test faulted when served.
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(size=(500, 2)), np.zeros((500, 3))], axis=1)
    ref = BinnedReference.fit("input", "input", x, bins=8)
    assert ref.kept == (0, 1) and ref.dropped == (2, 3, 4)
    alone = BinnedReference.fit("input", "input", x[:, :2], bins=8)
    assert ref.encode(x[:50]).tolist() == alone.encode(x[:50, :2]).tolist()


def _correlated(n: int, seed: int, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, 1))
    return 0.7 * base + 0.7 * rng.normal(size=(n, 8)) + shift


@pytest.mark.parametrize("window", [20, 100])
def test_calibrated_false_alarm_rate_holds_on_fresh_clean_windows(window: int) -> None:
    """Measured, not assumed: fresh null windows alarm at about the target, drift far more."""
    x = _correlated(1500, seed=5)
    detectors = [
        BinnedReference.fit("a", "activation", x[:, :4], bins=10),
        BinnedReference.fit("b", "activation", x[:, 4:], bins=10, aggregation="max"),
    ]
    target = 0.05
    cal = calibrate(detectors, window, target, windows=3000, seed=0)

    def alarm_rate(data: np.ndarray) -> float:
        windows = data.reshape(-1, window, 8)
        fired = np.zeros(len(windows), dtype=bool)
        for d, cols in zip(detectors, (slice(0, 4), slice(4, 8)), strict=True):
            counts = bin_counts(np.stack([d.encode(w[:, cols]) for w in windows]), d.n_bins)
            fired |= d.score(counts) > cal.thresholds[d.name]
        return float(fired.mean())

    clean = alarm_rate(_correlated(window * 1500, seed=6))
    drifted = alarm_rate(_correlated(window * 200, seed=7, shift=1.0))
    # 1500 windows: a binomial 95 % interval around 5 % is about +-1.1 %; the scale factor for
    # the reference's own sampling error is asymptotic, so allow a little more.
    assert 0.02 <= clean <= 0.075, clean
    assert drifted >= 0.9, drifted
    assert 0.0 < cal.per_detector_rate <= target


def test_sliding_window_counts_equal_a_recount_of_the_last_w_codes() -> None:
    rng = np.random.default_rng(8)
    window = SlidingWindow(size=37, features=3, bins=5)
    history = []
    for size in (5, 30, 1, 60, 7, 100):
        codes = rng.integers(0, 5, size=(size, 3)).astype(np.uint8)
        window.push(codes)
        history.append(codes)
        everything = np.concatenate(history)
        expected = bin_counts(everything[-37:][None], 5)[0]
        np.testing.assert_array_equal(window.counts, expected)
        assert window.filled == min(37, len(everything))
    assert window._codes.nbytes == 37 * 3  # bounded by the window, not the traffic


def test_output_logits_give_softmax_confidence_entropy_and_class() -> None:
    logits = np.array([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    got = derive("output", logits)
    assert set(got) == {"output", "confidence", "entropy", "class_mix"}
    np.testing.assert_allclose(got["output"].sum(1), 1.0)
    np.testing.assert_allclose(got["entropy"][1, 0], np.log(3))
    assert got["class_mix"][:, 0].tolist() == [0.0, 0.0]
    assert got["confidence"][0, 0] == pytest.approx(np.exp(2) / (np.exp(2) + 2))
    assert set(derive("act1", logits)) == {"act1"}


def test_tracker_gives_a_verdict_every_step_once_the_window_is_full() -> None:
    x = _correlated(1000, seed=9)
    ref = BinnedReference.fit("act", "activation", x, bins=8)
    cal = calibrate([ref], window=40, false_alarm_rate=0.01, windows=1000)
    tracker = DriftTracker({"act": ref}, cal, step=10)
    assert tracker.update("act", x[:39]) == []  # not full yet
    verdicts = tracker.update("act", x[39:40])
    assert len(verdicts) == 1 and not verdicts[0].is_drift
    assert tracker.update("act", x[40:49]) == []  # 9 new samples < step
    assert len(tracker.update("act", x[49:50])) == 1
    assert tracker.update("other", x[:50]) == []  # a layer without a detector is ignored
    shifted = _correlated(40, seed=10, shift=2.0)
    verdict = tracker.update("act", shifted)[-1]
    assert verdict.is_drift and verdict.score > verdict.threshold
    report = verdict.as_dict()
    assert report["data"]["is_drift"] == 1 and report["meta"]["level"] == "activation"


def test_categorical_reference_counts_classes() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    ref = BinnedReference.categorical("class_mix", "prediction", labels, classes=4)
    assert ref.counts.tolist() == [[1, 2, 3, 0]]
    assert ref.encode(np.array([[3.0], [0.0]]))[:, 0].tolist() == [3, 0]


def test_invalid_arguments_fail_with_expected_and_got() -> None:
    with pytest.raises(ValueError, match="expected bins in"):
        BinnedReference.fit("a", "activation", np.zeros((10, 1)), bins=1)
    with pytest.raises(ValueError, match="expected a level"):
        BinnedReference.fit("a", "nowhere", np.random.default_rng(0).normal(size=(10, 1)))
    _, ref = _reference()
    with pytest.raises(ValueError, match="expected a false alarm rate"):
        calibrate([ref], 10, 0.0)


@pytest.mark.parametrize(("n", "width"), [(500, 40), (30, 80)])
def test_projection_matches_sklearn_pca_and_keeps_the_residual(n: int, width: int) -> None:
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(3)
    # Low rank plus a little noise, scaled unevenly: the shape of a real layer's activations.
    x = rng.normal(size=(n, 6)) @ rng.normal(size=(6, width)) * rng.uniform(0.5, 3, width)
    x += 0.01 * rng.normal(size=(n, width)) + 5.0
    projection = Projection.fit("layer", x, 5)
    reference = PCA(n_components=4, svd_solver="full").fit(x)
    assert projection.width == 5 and projection.residual and projection.input_width == width
    assert projection.explained == pytest.approx(reference.explained_variance_ratio_.sum(), 1e-5)
    # The same scores up to each component's sign (which the projection fixes itself) ...
    ours, theirs = projection.apply(x), reference.transform(x)
    signs = np.sign((ours[:, :4] * theirs).sum(axis=0))
    scale = np.abs(theirs).max()
    np.testing.assert_allclose(ours[:, :4], theirs * signs, rtol=1e-3, atol=1e-3 * scale)
    # ... and last, the distance from the reconstruction through those four components.
    distance = np.linalg.norm(x - reference.inverse_transform(theirs), axis=1)
    np.testing.assert_allclose(ours[:, 4], distance, rtol=1e-3, atol=1e-3 * distance.max())


def test_projection_leaves_out_directions_without_reference_variance() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 3)) @ rng.normal(size=(3, 50))
    projection = Projection.fit("layer", x, 10)
    # Three directions hold everything: no empty components, no residual binned on rounding.
    assert projection.width == 3 and not projection.residual
    assert projection.explained == pytest.approx(1.0)
    refit = Projection.fit("layer", x[::-1].copy(), 10)
    np.testing.assert_allclose(np.abs(refit.components - projection.components).max(), 0, atol=1e-5)
    with pytest.raises(ValueError, match=r"expected features \[B, 50\]"):
        projection.apply(x[:, :49])
    # A shift off the reference's subspace moves the residual when one is kept.
    full = Projection.fit("layer", x + 0.01 * rng.normal(size=x.shape), 4)
    assert full.residual and full.width == 4
    moved = x + 0.5 * rng.normal(size=x.shape)
    assert full.apply(moved)[:, 3].mean() > 20 * full.apply(x)[:, 3].mean()


def test_the_detector_that_alarms_first_is_remembered_for_the_episode() -> None:
    x = _correlated(1000, seed=9)
    refs = {name: BinnedReference.fit(name, "activation", x, bins=8) for name in ("early", "late")}
    cal = calibrate(list(refs.values()), window=40, false_alarm_rate=0.01, windows=1000)
    tracker = DriftTracker(refs, cal, step=40)
    shifted = _correlated(40, seed=10, shift=2.0)
    for name in refs:
        tracker.new_round()
        tracker.update(name, x[:40])
    assert tracker.first_alarms == frozenset()
    tracker.new_round()
    assert tracker.update("early", shifted)[-1].is_drift
    tracker.new_round()
    assert tracker.update("late", shifted)[-1].is_drift
    assert tracker.first_alarms == {"early"}  # "late" joined an episode already running
    # Both quiet again: the episode ends; the next one starts with whoever alarms then, and
    # detectors alarming in the same round share it.
    for name in refs:
        tracker.new_round()
        tracker.update(name, x[40:80])
    assert tracker.first_alarms == frozenset()
    tracker.new_round()
    tracker.update("late", shifted)
    tracker.update("early", shifted)
    assert tracker.first_alarms == {"early", "late"}


def _verdicts_one_chunk_at_a_time(
    ref: BinnedReference, size: int, step: int, batches: list[np.ndarray]
) -> list[float]:
    """The tracker's former loop, kept as the reference: push up to the next step boundary,
    recount the window and score it, one verdict at a time."""
    window = SlidingWindow(size, ref.n_features, ref.n_bins)
    since = 0
    scores: list[float] = []
    for x in batches:
        codes = ref.encode(x)
        start = 0
        while start < len(codes):
            take = step - since if since < step else window.size - window.filled
            chunk = codes[start : start + max(1, take)]
            window.push(chunk)
            start += len(chunk)
            since += len(chunk)
            if window.full and since >= step:
                since = 0
                scores.append(float(ref.score(window.counts)))
    return scores


@pytest.mark.parametrize(("size", "step"), [(40, 10), (40, 1), (40, 40), (20, 7), (20, 30)])
def test_batched_verdicts_equal_the_chunk_by_chunk_reference(size: int, step: int) -> None:
    """Verdicts of a batch are scored at once from gathered window counts; they must be the
    same scores, at the same samples, as pushing and recounting up to every step boundary,
    however the stream is cut (one sample at a time included)."""
    rng = np.random.default_rng(3)
    x = np.concatenate([_correlated(500, seed=4), _correlated(300, seed=5, shift=1.5)])
    ref = BinnedReference.fit("act", "activation", _correlated(1000, seed=9), bins=8)
    cal = calibrate([ref], window=size, false_alarm_rate=0.01, windows=300)
    cuts = np.cumsum(rng.integers(1, 120, size=100))
    for batches in (np.split(x, cuts[cuts < len(x)]), np.split(x, len(x)), [x]):
        expected = _verdicts_one_chunk_at_a_time(ref, size, step, batches)
        tracker = DriftTracker({"act": ref}, cal, step=step)
        got = [r for b in batches for r in tracker.update("act", b)]
        assert expected and [r.score for r in got] == expected  # exactly: the same integers
        threshold = cal.thresholds["act"]
        assert [r.is_drift for r in got] == [s > threshold for s in expected]
        assert any(r.is_drift for r in got)


def test_batched_verdicts_of_several_detectors_keep_their_order_and_episodes() -> None:
    """The output's four detectors: one drain's verdicts come detector by detector, each in
    sample order, the same as when the samples arrive one by one."""
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(2000, 5)) * 2
    refs = {
        name: BinnedReference.fit(name, "output", x, bins=6)
        for name, x in derive("output", logits[:1000]).items()
        if name != "class_mix"
    }
    refs["class_mix"] = BinnedReference.categorical(
        "class_mix", "output", logits[:1000].argmax(1), 5
    )
    cal = calibrate(list(refs.values()), window=50, false_alarm_rate=0.01, windows=300)
    stream = np.concatenate([logits[1000:1300], logits[1300:] + np.array([3.0, 0, 0, 0, 0])])
    one = DriftTracker(refs, cal, step=10)
    batched = DriftTracker(refs, cal, step=10)
    by_one: dict[str, list[tuple[float, bool]]] = {name: [] for name in refs}
    by_batch: dict[str, list[tuple[float, bool]]] = {name: [] for name in refs}
    for row in stream:
        for r in one.update("output", row[None]):
            by_one[r.detector].append((r.score, r.is_drift))
    for part in np.split(stream, [37, 38, 250, 420, 999]):
        batched.new_round()
        results = batched.update("output", part)
        order = [r.detector for r in results]
        # Grouped by detector: each detector's verdicts of the drain are contiguous.
        assert order == sorted(order, key=list(refs).index)
        for r in results:
            by_batch[r.detector].append((r.score, r.is_drift))
    assert by_batch == by_one
    assert any(drift for verdicts in by_one.values() for _, drift in verdicts)
    assert batched.first_alarms  # the shift was seen and the episode remembered


def test_bin_codes_count_the_edges_strictly_below_each_value() -> None:
    """The encoding compares plane by plane over the bins; it is still, per feature, the number
    of its edges strictly below the value (searchsorted, left), padded edges never counted and
    NaN in bin 0."""
    rng = np.random.default_rng(12)
    x = rng.normal(size=(300, 5))
    x[:40] = np.round(x[:40], 1)  # values on an edge go to the bin that ends there
    ref = BinnedReference.fit("act", "activation", np.round(rng.normal(size=(2000, 5)), 1), bins=9)
    codes = ref.encode(x)
    for f in range(ref.n_features):
        edges = ref.edges[f][np.isfinite(ref.edges[f])]
        np.testing.assert_array_equal(codes[:, f], np.searchsorted(edges, x[:, f], side="left"))
    x[3, 2] = np.nan
    assert ref.encode(x)[3, 2] == 0 and codes.dtype == np.uint8


def test_projection_residual_is_exact_where_it_is_a_small_share_of_the_row() -> None:
    # Rows almost inside the components' subspace: |x|^2 - |P'x|^2 would lose the residual's
    # digits to rounding, so those rows take the distance from an explicit reconstruction.
    rng = np.random.default_rng(5)
    basis = rng.normal(size=(3, 200))
    x = rng.normal(size=(400, 3)) @ basis * 10.0 + 1e-2 * rng.normal(size=(400, 200))
    projection = Projection.fit("layer", x, 4)
    assert projection.residual
    rows = np.vstack([x[:20], x[:20] + rng.normal(size=(20, 200))])  # near and far rows
    centred = (rows - projection.mean).astype(np.float64)
    components = projection.components.astype(np.float64)
    expected = np.linalg.norm(centred - centred @ components @ components.T, axis=1)
    np.testing.assert_allclose(projection.apply(rows)[:, -1], expected, rtol=1e-2)
