"""dev/scale.py: the committed docs/scale.md block is docs/scale.json rendered, and the
harness's pieces (the series counter, the moving recorded scrape, the simulator serving N
replicas, the scrape jobs that name them) do what the measurement relies on. No Prometheus here:
`make scale` runs one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev import scale

EXPOSITION = """\
# HELP hookwatch_requests_total Requests.
# TYPE hookwatch_requests_total counter
hookwatch_requests_total{model="digits"} 120.0
hookwatch_requests_created{model="digits"} 1.7e+09
# HELP hookwatch_drift_score Score.
# TYPE hookwatch_drift_score gauge
hookwatch_drift_score{model="digits",layer="act1",detector="mean"} 0.25
hookwatch_drift_score{model="other",layer="act1",detector="mean"} 0.5
# HELP hookwatch_request_duration_seconds Latency.
# TYPE hookwatch_request_duration_seconds histogram
hookwatch_request_duration_seconds_bucket{model="digits",le="0.1"} 3.0
hookwatch_request_duration_seconds_bucket{model="digits",le="+Inf"} 5.0
hookwatch_request_duration_seconds_count{model="digits"} 5.0
hookwatch_request_duration_seconds_sum{model="digits"} 0.9
# HELP hookwatch_metrics_dir_writable Writable.
# TYPE hookwatch_metrics_dir_writable gauge
hookwatch_metrics_dir_writable 1.0
"""


def test_the_committed_block_is_the_committed_results_rendered() -> None:
    results: dict[str, Any] = json.loads(scale.RESULTS.read_text())
    text = scale.DOC.read_text()
    assert scale.rewrite(text, scale.render(results)) == text, (
        "docs/scale.md's generated block is stale or edited by hand: run "
        "`python -m dev.scale --render`"
    )
    assert text.count(scale.BEGIN) == 1 and text.count(scale.END) == 1


def test_the_committed_results_hold_the_measured_points() -> None:
    results: dict[str, Any] = json.loads(scale.RESULTS.read_text())
    points = results["points"]
    assert [p["replicas"] for p in points] == sorted(p["replicas"] for p in points)
    assert len(points) >= 2
    for point in points:
        # Every simulated replica was a target that answered, in both jobs.
        assert point["targets_up"] == {job: point["replicas"] for job in scale.JOBS}
    assert results["extrapolate_to"] > points[-1]["replicas"]


def test_the_series_counter_counts_samples_per_family_and_model() -> None:
    count = scale.count_series(EXPOSITION)
    assert count.total == 9
    assert count.families == {
        "hookwatch_requests_total": 2,  # _total and _created are both ingested
        "hookwatch_drift_score": 2,
        "hookwatch_request_duration_seconds": 4,
        "hookwatch_metrics_dir_writable": 1,
    }
    assert count.models == {"digits": 7, "other": 1}
    assert count.model_families["other"] == {"hookwatch_drift_score": 1}


def test_a_label_value_with_spaces_braces_and_quotes_is_one_sample() -> None:
    text = '# TYPE x gauge\nx{model="a b",note="{\\"q\\"} z"} 2.0\n'
    count = scale.count_series(text)
    assert count.total == 1 and count.models == {"a b": 1}
    rendered = scale.Template(text).render(3, 1).decode().splitlines()
    assert rendered[1].startswith('x{model="a b",note="{\\"q\\"} z"} ')


def _values(body: bytes) -> dict[str, float]:
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_the_recorded_scrape_moves_counters_up_and_keeps_histograms_cumulative() -> None:
    template = scale.Template(EXPOSITION)
    first, later = _values(template.render(0, 0)), _values(template.render(10, 0))
    counter = 'hookwatch_requests_total{model="digits"}'
    assert first[counter] == 120.0 and later[counter] > first[counter]
    created = 'hookwatch_requests_created{model="digits"}'
    assert later[created] == first[created]  # not a value that moves
    buckets = [
        later['hookwatch_request_duration_seconds_bucket{model="digits",le="0.1"}'],
        later['hookwatch_request_duration_seconds_bucket{model="digits",le="+Inf"}'],
    ]
    assert buckets[0] <= buckets[1]
    assert later['hookwatch_request_duration_seconds_count{model="digits"}'] == buckets[1]
    # A gauge swings; a 0/1 flag stays what it was.
    gauge = 'hookwatch_drift_score{model="digits",layer="act1",detector="mean"}'
    assert {_values(template.render(s, 0))[gauge] for s in range(4)} != {0.25}
    assert later["hookwatch_metrics_dir_writable"] == 1.0
    # Every line is still there, comments included.
    assert len(template.render(5, 3).decode().splitlines()) == len(EXPOSITION.splitlines())


async def _get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = await reader.readexactly(length)
    writer.close()
    return status, body


def test_the_simulator_serves_n_replicas_of_each_job_and_nothing_else(tmp_path: Path) -> None:
    for job in scale.JOBS:
        (tmp_path / f"{job}.txt").write_text(EXPOSITION)
    n = 12
    replicas = scale.Replicas(scale.load_templates(tmp_path), n, step_s=15.0, start=0.0)

    async def run() -> list[tuple[int, bytes]]:
        ready = asyncio.Event()
        from hookwatch.tools.devstack import Ports

        port = Ports.free().exporter
        task = asyncio.create_task(scale.serve(replicas, port, ready))
        await asyncio.wait_for(ready.wait(), 10)
        try:
            paths = [f"/replica/{i}/{job}" for i in range(n) for job in scale.JOBS]
            paths += [f"/replica/{n}/hookwatch", "/replica/0/other", "/metrics"]
            return [await _get(port, p) for p in paths]
        finally:
            task.cancel()

    answers = asyncio.run(run())
    served, refused = answers[: 2 * n], answers[2 * n :]
    assert all(status == 200 for status, _ in served)
    assert all(scale.count_series(body.decode()).total == 9 for _, body in served)
    assert [status for status, _ in refused] == [404, 404, 404]


def test_the_scrape_jobs_make_each_replica_a_target_with_its_own_instance() -> None:
    exported = {job: {"job_name": job, "honor_labels": False} for job in scale.JOBS}
    configs = scale.scrape_config(exported, 500, port=20001, self_port=20002)
    assert [c["job_name"] for c in configs] == ["prometheus", *scale.JOBS]
    for config in configs[1:]:
        assert config["honor_labels"] is False  # the exported job's settings are kept
        groups = config["static_configs"]
        instances = {g["labels"]["instance"] for g in groups}
        paths = {g["labels"]["__metrics_path__"] for g in groups}
        assert len(instances) == len(paths) == 500
        assert all(g["targets"] == ["127.0.0.1:20001"] for g in groups)
    yaml.safe_dump(configs)  # what measure() writes


def test_the_extrapolation_is_a_least_squares_line() -> None:
    points = [
        {"replicas": 10, "y": 30.0},
        {"replicas": 100, "y": 210.0},
        {"replicas": 500, "y": 1010.0},
    ]
    line = scale.fit(points, "y", 1000)
    assert line is not None
    assert line["per_replica"] == pytest.approx(2.0)
    assert line["intercept"] == pytest.approx(10.0)
    assert line["at"] == pytest.approx(2010.0)
    assert scale.fit(points[:1], "y", 1000) is None


def test_the_block_is_rewritten_in_place() -> None:
    results: dict[str, Any] = json.loads(scale.RESULTS.read_text())
    text = f"before\n\n{scale.BEGIN}\nstale\n{scale.END}\nafter\n"
    assert scale.rewrite(text, scale.render(results)) == (
        f"before\n\n{scale.render(results)}after\n"
    )
    with pytest.raises(ValueError, match="expected the markers"):
        scale.rewrite("no block\n", "x")
