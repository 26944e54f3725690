"""The eval-drift harness: its statistics, its protocol, and that it measures the product."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import ks_2samp

from dev.evaluation import baselines
from dev.evaluation.protocol import JUDGEMENTS, Windows
from dev.evaluation.significance import compare, interval, sign_flip_p


def test_the_harness_finds_the_repository_it_evaluates() -> None:
    from dev.evaluation import run

    assert (run.ROOT / "models" / "digits" / "model-config.yaml").is_file()
    assert (run.ROOT / "docs" / "eval-drift.md").is_file()


def test_sign_flip_p_is_exact_for_few_streams() -> None:
    rng = np.random.default_rng(0)
    # Ten streams all better by the same amount: only the all-positive and all-negative sign
    # patterns are as extreme, 2 of 1024.
    assert sign_flip_p(np.full(10, 0.2), rng) == pytest.approx(2 / 1024)
    assert sign_flip_p(np.zeros(20), rng) == 1.0
    # Balanced differences are no evidence.
    assert sign_flip_p(np.array([0.2, -0.2, 0.4, -0.4]), rng) == 1.0


def test_a_comparison_calls_a_win_only_when_the_paired_test_says_so() -> None:
    rng = np.random.default_rng(1)
    mine = np.ones(20)
    assert compare(mine, np.zeros(20), rng).verdict == "win"
    assert compare(np.zeros(20), mine, rng).verdict == "loss"
    # One stream of twenty better: a tie, however large its difference.
    theirs = np.ones(20)
    theirs[0] = 0.0
    assert compare(mine, theirs, rng).verdict == "tie"


def test_interval_brackets_the_mean_and_collapses_when_every_stream_agrees() -> None:
    rng = np.random.default_rng(2)
    rates = np.array([0.2, 0.4, 0.6, 0.8, 1.0] * 4)
    lo, hi = interval(rates, rng)
    assert lo < rates.mean() < hi
    assert interval(np.ones(20), rng) == (1.0, 1.0)


def test_judged_windows_are_the_last_w_requests_at_every_judgement() -> None:
    w = 8
    streams = {"shift": np.arange(2 * 3 * w).reshape(2, 3 * w)}
    win = Windows(w, streams, np.arange(5 * w).reshape(5, w) + 1000)
    judged = win.judged()
    layout = win.layout()
    rows = judged[layout["shift"]].reshape(2, JUDGEMENTS, w)
    for s in range(2):
        for k in range(JUDGEMENTS):
            end = w + (k + 1) * win.step
            assert np.array_equal(rows[s, k], streams["shift"][s, end - w : end])
    assert np.array_equal(judged[layout["clean"]], win.clean)


def test_the_baselines_ks_distance_is_scipys_with_ties() -> None:
    rng = np.random.default_rng(3)
    # Rounded values make ties inside and across the two samples.
    ref = np.round(rng.normal(size=(120, 3)), 1).astype(np.float32)
    window = np.round(rng.normal(0.3, size=(40, 3)), 1).astype(np.float32)
    pooled = np.concatenate([ref, window])
    assign = baselines._assignments(len(ref), len(window), 5, rng)
    distances = baselines._ks_max_distance(pooled, assign, len(ref))
    expected = max(ks_2samp(ref[:, f], window[:, f]).statistic for f in range(3))
    assert distances[0] == pytest.approx(expected)
    for row, a in zip(distances[1:], assign[1:], strict=True):
        permuted = max(ks_2samp(pooled[a, f], pooled[~a, f]).statistic for f in range(3))
        assert row == pytest.approx(permuted)


def test_the_baselines_mmd_is_the_unbiased_estimate_for_every_permutation() -> None:
    rng = np.random.default_rng(4)
    n, m = 30, 12
    z = rng.normal(size=(n + m, 2))
    kernel = np.exp(-((z[:, None] - z[None]) ** 2).sum(-1))
    np.fill_diagonal(kernel, 0.0)
    assign = baselines._assignments(n, m, 4, rng)
    got = baselines._mmd2(kernel, assign, n)
    for value, a in zip(got, assign, strict=True):
        kx, ky, kxy = kernel[np.ix_(a, a)], kernel[np.ix_(~a, ~a)], kernel[np.ix_(a, ~a)]
        expected = kx.sum() / (n * (n - 1)) + ky.sum() / (m * (m - 1)) - 2 * kxy.mean()
        assert value == pytest.approx(expected)


def test_the_ks_ensemble_counts_the_permutations_as_extreme_as_the_observed_split() -> None:
    n, m = 100, 50
    features = [4, 30]
    distances = np.array([[0.30, 0.10], [0.35, 0.0], [0.0, 0.40], [0.1, 0.1], [0.31, 0.2]])
    observed = min(
        baselines._ks_pvalue(d, f, n, m) for d, f in zip(distances[0], features, strict=True)
    )
    direct = np.mean(
        [
            min(baselines._ks_pvalue(d, f, n, m) for d, f in zip(row, features, strict=True))
            <= observed
            for row in distances[1:]
        ]
    )
    assert baselines._ks_or_pvalue(distances, features, n, m) == pytest.approx(direct)


def _committed() -> dict[str, Any]:
    from dev.evaluation import run

    results: dict[str, Any] = json.loads((run.ROOT / "docs" / "eval-drift.json").read_text())
    return results


def test_the_readme_block_is_the_committed_results_rendered_whole() -> None:
    """The eval-drift findings block (docs/your-model.md) is rendered from docs/eval-drift.json,
    every sentence of it: compared whole, markers included, so a hand-written claim inside it
    fails here."""
    from dev.evaluation import report, run

    results = _committed()
    readme = (run.ROOT / report.FINDINGS_FILE).read_text()
    assert report.find_readme_block(readme) == report.readme_block(results), (
        f"{report.FINDINGS_FILE}'s eval-drift block is stale or edited by hand: run "
        "`python -m dev.evaluation.run --render docs/eval-drift.json`"
    )
    # The rendered table is the one the JSON renders to.
    rendered = report.markdown(results) + "\n"
    assert (run.ROOT / "docs" / "eval-drift.md").read_text() == rendered


def test_the_readme_block_names_a_method_that_missed_windows() -> None:
    """ "Every window detected" is said of a method only when every harmful cell is 100 %;
    one that fell short is named with its lowest cell (MMD-OR at 96 % in the committed run)."""
    from dev.evaluation import report

    results = _committed()
    block = report.readme_block(results)
    harmful = [c for c in results["cells"] if c["harmful"]]
    assert f"in all {len(harmful)} cells by hookwatch and KS-OR;" in block
    assert (
        f"in {len(harmful) - 1} of {len(harmful)} by MMD-OR (lowest: 96 %, noise-high at W=50)"
        in block
    )

    lowered = copy.deepcopy(results)
    cell = next(c for c in lowered["cells"] if c["harmful"] and c["scenario"] == "blur")
    cell["methods"]["hookwatch"]["rate"] = 0.5
    block = report.readme_block(lowered)
    assert "by hookwatch and" not in block
    assert f"by hookwatch (lowest: 50 %, blur at W={cell['w']})" in block


def test_the_readme_block_is_rewritten_in_place(tmp_path: Path) -> None:
    from dev.evaluation import report

    results = _committed()
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n\n{report.README_BEGIN}\nstale\n{report.README_END}\n\nafter\n")
    report.rewrite_readme(readme, results)
    assert readme.read_text() == f"before\n\n{report.readme_block(results)}\n\nafter\n"
    readme.write_text("no block\n")
    with pytest.raises(ValueError, match=r"expected docs/your-model\.md to hold"):
        report.rewrite_readme(readme, results)
