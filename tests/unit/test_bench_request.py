"""docs/bench/request.md's generated table is what docs/bench/request.json holds."""

from __future__ import annotations

import json
from pathlib import Path

from dev.bench import request

ROOT = Path(__file__).resolve().parents[2]


def test_request_table_matches_its_json() -> None:
    runs = json.loads((ROOT / "docs/bench/request.json").read_text())["runs"]
    text = (ROOT / "docs/bench/request.md").read_text()
    assert request.generated_block(text) == request.render(runs), (
        "docs/bench/request.md is stale: `python -m dev bench-request --add <run.json>` or "
        "`make bench-request` regenerates it"
    )


def test_every_run_has_every_case_and_phase() -> None:
    runs = json.loads((ROOT / "docs/bench/request.json").read_text())["runs"]
    assert runs
    for run in runs:
        names = [name for name, *_ in request.CASES]
        # The control (plain against plain) leads every run since it was added, then the
        # one-handler row since it was added.
        assert [c["case"] for c in run["cases"]] in (
            names,
            [request.CONTROL[0], *names],
            [request.CONTROL[0], request.ONE_HANDLER[0], *names],
        )
        for case in run["cases"]:
            control = case["case"] in (request.CONTROL[0], request.ONE_HANDLER[0])
            assert set(case["phases_us"]) == (set() if control else set(request.PHASES))
            assert case["diff_low_us"] <= case["diff_us"] <= case["diff_high_us"]


def test_median_interval_brackets_the_median() -> None:
    median, low, high = request._median_interval([float(v) for v in range(101)])
    assert (median, low <= 50 <= high) == (50.0, True)
    assert low > 35 and high < 65
