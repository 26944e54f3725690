"""The label-free accuracy estimate (hookwatch._drift.accuracy) where the truth is known.

Gaussian blobs, four classes at the corners of a square in the first two of four dimensions,
and a nearest-mean linear classifier that also leans on the third dimension (a weight the
reference never exercises). The hidden layer is the input itself.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from hookwatch._drift import AccuracyDropTest, AccuracyEstimator
from hookwatch._drift.accuracy import MAX_DIMS, MAX_SAMPLES, score_tolerance

MEANS = np.array([[3.0, 3.0, 0, 0], [-3.0, 3.0, 0, 0], [-3.0, -3.0, 0, 0], [3.0, -3.0, 0, 0]])
#: The classifier's spurious weight on dimension 3, per class: class 1 gains from large x3.
SPURIOUS = np.array([0.0, 2.0, 0.0, 0.0])


def blobs(n: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=n).astype(np.int64)
    return MEANS[y] + rng.normal(size=(n, 4)) * 1.2, y


def logits(x: NDArray[np.float64]) -> NDArray[np.float64]:
    z: NDArray[np.float64] = (
        x @ MEANS.T - 0.5 * (MEANS**2).sum(axis=1) + np.outer(x[:, 2], SPURIOUS)
    )
    return z


def actual(x: NDArray[np.float64], y: NDArray[np.int64]) -> float:
    return float(np.mean(logits(x).argmax(axis=1) == y))


@pytest.fixture(scope="module")
def fitted() -> AccuracyEstimator:
    x, y = blobs(800, seed=0)
    return AccuracyEstimator.fit(x, logits(x), y)


def test_clean_traffic_is_estimated_near_its_accuracy(fitted: AccuracyEstimator) -> None:
    x, y = blobs(2000, seed=1)
    result = fitted.estimate(x, logits(x))
    assert abs(result.estimated_accuracy - actual(x, y)) < 0.03
    assert abs(fitted.reference_score - fitted.reference_accuracy) < 0.03
    assert result.count == 2000
    assert math.isclose(result.correct_sum, result.scores.sum())


def test_a_shift_out_of_the_support_into_the_wrong_class_drops_the_estimate_with_the_accuracy(
    fitted: AccuracyEstimator,
) -> None:
    x, y = blobs(2000, seed=2)
    clean = fitted.estimate(x, logits(x)).estimated_accuracy
    shifted = x.copy()
    # Class 0 drifts along dimension 3: the classifier's spurious weight turns it into class 1.
    shifted[y == 0, 2] += 12.0
    truth = actual(shifted, y)
    assert truth < 0.85
    result = fitted.estimate(shifted, logits(shifted))
    assert result.estimated_accuracy < clean - 0.1
    assert abs(result.estimated_accuracy - truth) < 0.06
    assert result.outside_support >= 0.9 * (y == 0).sum()
    # The per-class hint: the classes the shifted samples are taken for (1) or still given
    # (0, out of the support) fail; the untouched ones do not.
    per_class = result.class_accuracy()
    assert per_class[0] < 0.5 and per_class[1] < 0.7
    assert per_class[2] > 0.9 and per_class[3] > 0.9


def test_what_no_label_free_estimate_sees_a_class_moved_into_another_class_support(
    fitted: AccuracyEstimator,
) -> None:
    """The limit, pinned: class 0 moved into class 1's blob looks like class 1 to the model, to
    the neighbours and to any statistic of the unlabelled traffic. The accuracy drops, the
    estimate does not (docs/accuracy-estimators.md)."""
    x, y = blobs(2000, seed=3)
    shifted = x.copy()
    shifted[y == 0, 0] -= 4.5
    truth = actual(shifted, y)
    assert truth < 0.8
    assert fitted.estimate(shifted, logits(shifted)).estimated_accuracy > 0.95


def test_a_harmless_shift_within_the_support_is_not_flagged(fitted: AccuracyEstimator) -> None:
    x, y = blobs(3000, seed=4)
    # Each blob shrinks towards its centre: distribution drift, no harm.
    shrunk = MEANS[y] + (x - MEANS[y]) * 0.6
    truth = actual(shrunk, y)
    result = fitted.estimate(shrunk, logits(shrunk))
    assert truth >= actual(x, y)
    assert abs(result.estimated_accuracy - truth) < 0.03
    test = fitted.drop_test(max_drop=0.05, run_length=1000)
    assert test.update(result.scores) == []


def test_the_drop_test_pages_on_harm_and_not_on_clean_traffic(fitted: AccuracyEstimator) -> None:
    x, y = blobs(5000, seed=5)
    clean = fitted.drop_test()
    assert clean.update(fitted.estimate(x, logits(x)).scores) == []
    shifted = x.copy()
    shifted[y == 0, 2] += 12.0
    harmed = fitted.drop_test()
    alarms = harmed.update(fitted.estimate(shifted, logits(shifted)).scores)
    assert alarms and alarms[0].position < 500


def test_the_drop_test_does_not_depend_on_how_the_stream_is_cut() -> None:
    rng = np.random.default_rng(6)
    scores = (rng.random(3000) < 0.8).astype(np.float64)
    whole = AccuracyDropTest(0.95, 0.05, 1000.0)
    pieces = AccuracyDropTest(0.95, 0.05, 1000.0)
    expected = [a.position for a in whole.update(scores)]
    got = [
        a.position
        for start in range(0, 3000, 37)
        for a in pieces.update(scores[start : start + 37])
    ]
    assert expected and got == expected


def test_false_alarms_stay_rare_at_the_boundary() -> None:
    # Scores whose mean is exactly the bound: the e-detector's run length is respected.
    rng = np.random.default_rng(7)
    test = AccuracyDropTest(0.95, 0.05, 1000.0)
    alarms = test.update((rng.random(20_000) < test.bound).astype(np.float64))
    assert len(alarms) <= 20_000 / 1000 * 2


def test_counts_add_over_workers(fitted: AccuracyEstimator) -> None:
    x, _ = blobs(300, seed=8)
    whole = fitted.estimate(x, logits(x))
    a, b = fitted.estimate(x[:120], logits(x[:120])), fitted.estimate(x[120:], logits(x[120:]))
    assert math.isclose(a.correct_sum + b.correct_sum, whole.correct_sum)
    assert a.count + b.count == whole.count
    np.testing.assert_allclose(a.class_correct_sum + b.class_correct_sum, whole.class_correct_sum)
    np.testing.assert_array_equal(a.class_count + b.class_count, whole.class_count)


def test_the_state_round_trips_through_an_npz(fitted: AccuracyEstimator) -> None:
    buffer = io.BytesIO()
    arrays: dict[str, Any] = dict(fitted.to_arrays())
    np.savez(buffer, **arrays)
    buffer.seek(0)
    with np.load(buffer) as stored:
        loaded = AccuracyEstimator.from_arrays(dict(stored))
    x, _ = blobs(200, seed=9)
    np.testing.assert_array_equal(
        loaded.estimate(x, logits(x)).scores, fitted.estimate(x, logits(x)).scores
    )
    assert loaded.radius == fitted.radius and loaded.k == fitted.k
    assert all(isinstance(v, np.ndarray) for v in fitted.to_arrays().values())


def test_the_state_is_bounded_however_large_the_reference() -> None:
    rng = np.random.default_rng(10)
    n, w = 5000, 200
    x = rng.normal(size=(n, w))
    y = rng.integers(0, 10, size=n).astype(np.int64)
    z = rng.normal(size=(n, 10))
    est = AccuracyEstimator.fit(x, z, y)
    assert est.features.shape == (MAX_SAMPLES, MAX_DIMS)
    assert est.components.shape == (w, MAX_DIMS)
    assert set(np.unique(est.labels)) == set(range(10))
    bound = MAX_SAMPLES * MAX_DIMS * 4 + MAX_SAMPLES * 8 + w * MAX_DIMS * 4 + w * 4 + 1024
    assert est.state_bytes() <= bound
    assert est.estimate(x[:10], z[:10]).count == 10


def test_the_tolerance_shrinks_with_the_reference() -> None:
    assert score_tolerance(0.02, 2000, 0.01) < score_tolerance(0.02, 400, 0.01)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (np.zeros(99, dtype=np.int64), "expected reference labels as a 1-D array of 100"),
        (np.zeros((100, 1), dtype=np.int64), "expected reference labels as a 1-D array of 100"),
        (np.zeros(100), r"expected integer class labels, got dtype\('float64'\)"),
        (np.full(100, 4, dtype=np.int64), r"expected labels in \[0, 4\)"),
        (np.zeros(100, dtype=bool), "expected integer class labels"),
        ([str(i) for i in range(100)], "expected integer class labels"),
    ],
)
def test_bad_labels_say_what_was_expected(labels: object, message: str) -> None:
    x, _ = blobs(100, seed=11)
    with pytest.raises(ValueError, match=message):
        AccuracyEstimator.fit(x, logits(x), labels)


def test_bad_features_and_logits_say_what_was_expected(fitted: AccuracyEstimator) -> None:
    x, y = blobs(100, seed=12)
    with pytest.raises(ValueError, match="expected reference logits with 100 rows"):
        AccuracyEstimator.fit(x, logits(x)[:50], y)
    with pytest.raises(ValueError, match="expected features of width 4"):
        fitted.estimate(x[:, :3], logits(x))
    with pytest.raises(ValueError, match="expected logits of 4 classes"):
        fitted.estimate(x, logits(x)[:, :3])
    with pytest.raises(ValueError, match="expected finite features"):
        fitted.estimate(np.full((2, 4), np.nan), logits(x[:2]))
    with pytest.raises(ValueError, match="expected accuracy state arrays"):
        AccuracyEstimator.from_arrays({"mean": np.zeros(4)})


def test_the_committed_page_and_readme_block_are_the_committed_results_rendered() -> None:
    """docs/accuracy-estimators.md and README's accuracy block come from the committed JSON
    (`make eval-drift` writes all three); a hand-edited figure fails here."""
    import json
    from pathlib import Path

    from dev.evaluation import accuracy_estimators as harness

    root = Path(__file__).resolve().parents[2]
    results = json.loads((root / "docs" / "accuracy-estimators.json").read_text())
    assert (root / "docs" / "accuracy-estimators.md").read_text() == harness.render(results)
    readme = (root / "README.md").read_text()
    assert harness.README_BEGIN in readme
    assert harness.rewrite_readme(readme, results) == readme
