"""The eval-drift harness: how the baseline window sizes are shared between processes."""

from __future__ import annotations

from hookwatch.tools.evaluation.run import _shards


def test_every_window_size_runs_once_and_the_costliest_runs_alone() -> None:
    shards = _shards([20, 50, 100, 200, 500], n_ref=378, shards=2)
    assert sorted(w for shard in shards for w in shard) == [20, 50, 100, 200, 500]
    # W=500's MMD costs about as much as the four others together.
    assert [500] in shards and len(shards) == 2


def test_one_process_takes_everything_and_no_shard_is_empty() -> None:
    assert _shards([100, 20], n_ref=378, shards=1) == [[100, 20]]
    assert _shards([50], n_ref=378, shards=2) == [[50]]


def test_the_harness_finds_the_repository_it_evaluates() -> None:
    from hookwatch.tools.evaluation import run

    assert (run.ROOT / "models" / "digits" / "model-config.yaml").is_file()
    assert (run.ROOT / "docs" / "eval-drift.md").is_file()
