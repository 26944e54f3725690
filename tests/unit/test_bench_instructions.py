"""The instruction-count harness: what it reads from cachegrind, its arithmetic, and that
docs/bench/request.md's counted block is what docs/bench/instructions.json holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dev.bench import instructions, runs

ROOT = Path(__file__).resolve().parents[2]

SUMMARY = """\
==7318== I   refs:      12,096,950,063
==7318== I1  misses:        70,748,647
==7318== LLi misses:           207,011
==7318== I1  miss rate:           0.58%
==7318== D   refs:       5,375,755,632  (3,616,068,506 rd   + 1,759,687,126 wr)
==7318== D1  misses:       103,831,151  (   90,414,657 rd   +    13,416,494 wr)
==7318== Branches:       2,023,457,234  (1,727,152,091 cond +   296,305,143 ind)
==7318== Mispredicts:      205,533,020  (  115,741,114 cond +    89,791,906 ind)
==7318== Mispred rate:            10.2% (          6.7%     +          30.4%   )
"""


def test_reads_the_totals_of_cachegrinds_summary() -> None:
    assert instructions.parse_summary("noise\n" + SUMMARY) == {
        "I": 12_096_950_063,
        "I1": 70_748_647,
        "D1": 103_831_151,
        "Mispredicts": 205_533_020,
    }


def test_a_summary_without_branch_simulation_is_refused() -> None:
    text = "\n".join(line for line in SUMMARY.splitlines() if "Mispredicts" not in line)
    with pytest.raises(ValueError, match=r"expected cachegrind's totals for \['Mispredicts'\]"):
        instructions.parse_summary(text)


def test_per_request_takes_start_up_out() -> None:
    short = {"I": 1000, "I1": 10, "D1": 20, "Mispredicts": 30}
    long = {"I": 6000, "I1": 60, "D1": 70, "Mispredicts": 80}
    assert instructions.per_request(short, long, 100) == {
        "I": 50.0,
        "I1": 0.5,
        "D1": 0.5,
        "Mispredicts": 0.5,
    }
    with pytest.raises(ValueError, match="expected the long run to serve more requests"):
        instructions.per_request(short, long, 0)


def test_counted_block_matches_its_json() -> None:
    path = ROOT / "docs/bench/instructions.json"
    committed = json.loads(path.read_text())["runs"]
    assert committed, "docs/bench/instructions.json holds no run"
    text = (ROOT / "docs/bench/request.md").read_text()
    block = runs.block(text, instructions.BEGIN, instructions.END)
    assert block == instructions.render(committed), (
        "docs/bench/request.md's counted block is stale: `make bench-instructions` rewrites it"
    )
    for run in committed:
        assert [case["name"] for case in run["cases"]] == [n for n, *_ in instructions.CASES]
        for case in run["cases"]:
            assert set(case["plain"]) == set(case["monitored"]) == set(instructions.EVENTS)
