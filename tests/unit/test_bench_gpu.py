"""docs/bench/gpu.md's generated block is what docs/bench/gpu.json holds, and the GPU harness
runs (on the host here: no CI machine has a GPU)."""

from __future__ import annotations

import contextlib
import json
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from dev.bench import gpu
from tests.conftest import MAR, require

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_table_matches_its_json() -> None:
    runs = json.loads((ROOT / "docs/bench/gpu.json").read_text())["runs"]
    text = (ROOT / "docs/bench/gpu.md").read_text()
    assert gpu.generated_block(text) == gpu.render(runs), (
        "docs/bench/gpu.md is stale: `python -m dev bench-gpu --add <run.json>` regenerates it"
    )
    for run in runs:
        assert run["label"] and (run["groups"] or run["profiles"] or run.get("steady"))
        for group in run["groups"]:
            assert [v["variant"] for v in group["variants"]] == list(gpu.VARIANTS)
            for v in group["variants"]:
                assert v["ratio_low"] <= v["ratio"] <= v["ratio_high"]


@contextlib.contextmanager
def _digits(tmp_path: Path) -> Iterator[Path]:
    """The demo archive extracted as TorchServe extracts it, its model file importable."""
    require(MAR.exists(), f"{MAR} (make mar builds it)")
    model_dir = tmp_path / "digits"
    with zipfile.ZipFile(MAR) as archive:
        archive.extractall(model_dir)
    sys.path.insert(0, str(model_dir))
    try:
        yield model_dir
    finally:
        sys.path.remove(str(model_dir))


def test_the_harness_measures_the_handlers(tmp_path: Path) -> None:
    with _digits(tmp_path) as model_dir:
        group = gpu.measure_group("digits", model_dir, 8, rounds=3, seconds=0.02, device="cpu")
    by_variant = {v.variant: v for v in group.variants}
    assert by_variant["plain"].ratio == 1.0 and by_variant["plain"].hooked_share == 0.0
    # Every forward of the full variant is hooked; the capture thread did work for it.
    assert by_variant["full"].hooked_share == 1.0
    assert by_variant["full"].capture_cpu_us >= 0.0
    assert all(v.us_per_request > 0 for v in group.variants)


def test_the_steady_blocks_measure_the_default(tmp_path: Path) -> None:
    with _digits(tmp_path) as model_dir:
        row = gpu.measure_steady("digits", model_dir, 1, blocks=2, seconds=0.3, device="cpu")
    assert row.plain_us > 0 and row.default_us > 0
    assert row.ratio_low <= row.ratio <= row.ratio_high
    # The default samples some forwards and not all of them.
    assert 0.0 < row.hooked_share < 1.0
    # The cost cap's estimate, read after each default block (None before its first).
    assert len(row.cost_extra_us) == 2
    # Each hooked forward was timed against the others, and every publish's update traced.
    assert row.measured_hooked > 0 and len(row.hooked_us_quantiles) == 4
    assert row.trace and all("extra" in update for update in row.trace)
    lines = gpu._steady_lines([asdict(row)])
    assert lines[-2].startswith("| digits | 1 |")
    assert lines[-2].count("|") == lines[2].count("|")  # a cell for every heading
