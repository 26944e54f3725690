"""The overhead verdicts are the committed results', rendered, never written by hand: the
blocks of docs/bench/README.md, and README.md's one line per model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dev.bench.report import (
    BLOCKS_FILE,
    README_RESULTS,
    readme_block,
    render,
    render_summary,
    render_verdicts,
    rewrite_readme,
    rewrite_verdicts,
    verdict_block,
)
from dev.bench.runner import BenchResult, read_result
from hookwatch.tools.bench.loadgen import Segment

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("data") / "bench-results.json"


@pytest.mark.parametrize("source", README_RESULTS)
def test_readme_block_is_rendered_from_the_committed_results(source: str) -> None:
    block = readme_block((ROOT / BLOCKS_FILE).read_text(), source)
    assert block == render_summary(read_result(ROOT / source), source), (
        f"{BLOCKS_FILE}'s bench block for {source} is stale: run `python -m dev bench --render`"
    )


def test_readme_states_the_committed_verdict_per_model() -> None:
    results = [read_result(ROOT / source) for source in README_RESULTS]
    assert verdict_block((ROOT / "README.md").read_text()) == render_verdicts(results), (
        "README.md's overhead verdict is stale: run `python -m dev bench --render`"
    )


def test_the_verdict_line_says_missed_where_the_table_does(tmp_path: Path) -> None:
    result = read_result(FIXTURE)
    text = render_verdicts([result])
    # The fixture's full variant loses 10 % of throughput in every round: a resolved miss.
    assert "100 % sampling 0.90 at batch 1 (missed), target 0.95" in text
    assert len(text.splitlines()) == 3  # markers and one line for its one model
    readme = tmp_path / "README.md"
    readme.write_text("before\n" + text.replace("missed", "held") + "\nafter\n")
    rewrite_verdicts(readme, [result])
    assert readme.read_text() == "before\n" + text + "\nafter\n"


def test_the_fixture_reads_back_as_written() -> None:
    result = read_result(FIXTURE)
    assert [g.drift_loaded for g in result.groups] == [{"default": True, "full": True}]
    again = BenchResult.from_dict(json.loads(result.to_json()))
    assert again == result


def test_summary_names_misses_and_unresolved_verdicts_as_the_table_does() -> None:
    result = read_result(FIXTURE)
    summary = render_summary(result)
    table = render(result)
    assert "Drift detection was on in every monitored variant" in summary
    assert "Drift detection was on in every monitored variant" in table
    # The fixture's full variant loses 10 % of throughput in every round: a resolved miss.
    assert "| digits, batch 1 | full | throughput loss (closed loop) | +10.0 % | 5 % |" in summary
    assert "**misses by 5.0 pp**" in summary and "**misses by 5.0 pp**" in table
    assert "**Missed**: digits, batch 1 full throughput loss" in summary
    assert "holds in this run" not in summary
    for line in summary.splitlines():
        if line.startswith("| digits"):
            # Every row of the summary is a row of the table, verdict included.
            cells = line.split(" | ")
            assert any(
                row.startswith(cells[0]) and cells[-1] in row and cells[3] in row
                for row in table.splitlines()
            ), line


def test_summary_says_every_target_holds_only_when_every_verdict_does() -> None:
    result = read_result(FIXTURE)
    same = Segment(1000, 0, 10.0, 1.0, 2.0, 1.0, cpu_ms=0.5, rate_rps=100.0)
    even = [{v: same for v in ("plain", "default", "full", "naive")} for _ in range(6)]
    group = dataclasses.replace(result.groups[0], closed=even, opened=even)
    held = dataclasses.replace(result, groups=[group])
    assert "Every one of the 7 targets holds in this run." in render_summary(held)
    assert "not resolved" not in render_summary(held)


def test_a_run_from_before_the_drift_check_says_so(tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text())
    for group in data["groups"]:
        del group["drift_loaded"], group["closed_s"], group["open_s"]
    for trace in data["rss"]:
        del trace["drift"]
    old = tmp_path / "results.json"
    old.write_text(json.dumps(data))
    summary = render_summary(read_result(old))
    assert "Drift detection was **not checked** in this run" in summary


def test_the_readme_block_is_replaced_in_place(tmp_path: Path) -> None:
    result = read_result(FIXTURE)
    stale = render_summary(result).splitlines()
    readme = tmp_path / "README.md"
    readme.write_text(
        "before\n\n" + "\n".join([stale[0], "hand-written", stale[-1]]) + "\n\nafter\n"
    )
    rewrite_readme(readme, result)
    assert readme.read_text() == "before\n\n" + render_summary(result) + "\n\nafter\n"
    readme.write_text("no block\n")
    with pytest.raises(ValueError, match=r"expected README\.md to hold"):
        rewrite_readme(readme, result)


@pytest.mark.parametrize("source", README_RESULTS)
def test_committed_tables_are_rendered_from_their_results(source: str) -> None:
    table = (ROOT / source).with_suffix(".md").read_text()
    assert table == render(read_result(ROOT / source)), (
        f"{source.removesuffix('.json')}.md is stale: run `python -m dev bench --render`"
    )
