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


def _case(name: str, diff: tuple[float, float, float], drain: float = 0.0) -> dict[str, object]:
    low, mid, high = diff
    return {
        "case": name,
        "diff_us": mid,
        "diff_low_us": low,
        "diff_high_us": high,
        "drain_cpu_us": drain,
        "drain_records": 1024,
        "drain_batch": 128,
    }


def test_budget_lines_judge_each_row_by_its_interval() -> None:
    lines = request.budget_lines(
        [
            _case("b1-unsampled-one-handler", (1.0, 1.4, 2.02)),
            _case("b1-unsampled", (3.0, 3.5, 4.0)),
            _case("b8-unsampled", (1.0, 1.2, 1.5)),
            # The capture thread's figure is added to the request thread's whole interval.
            _case("b1-sampled", (29.0, 30.0, 31.0), drain=25.0),
            _case("b8-sampled", (6.0, 7.0, 8.0), drain=60.0),
        ]
    )
    text = "\n".join(lines)
    assert (
        "- b1-unsampled-one-handler: +1.40 µs (+1.00 to +2.02) against 2 µs: "
        "not resolved (median holds)" in text
    )
    assert "- b1-unsampled: +3.50 µs (+3.00 to +4.00) against 2 µs: **misses**" in text
    assert "- b8-unsampled: +1.20 µs (+1.00 to +1.50) against 2 µs: holds" in text
    assert "= 55.0 µs (54.0 to 56.0) against 60 µs: holds" in text
    assert "= 67.0 µs (66.0 to 68.0) against 60 µs: **misses**" in text
    # A run from before the drain pass says nothing of its sampled rows.
    old = request.budget_lines([_case("b1-sampled", (29.0, 30.0, 31.0))])
    assert old == []
