"""Real TorchServe with 4 workers: hookwatch's numbers are exact sums over workers, survive a
SIGKILLed worker without stale or doubled series, and pass ``promtool check metrics``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from prometheus_client.mmap_dict import MmapedDict

import hookwatch._metrics.exporter as metrics_module
from dev.bench import scrape as scrape_bench
from dev.bench.scrape import compare
from hookwatch._catalogue import CATALOGUE, SERIES_PER_MODEL_TARGET, series_per_model
from hookwatch._metrics import ARCHIVE_MANIFEST, compact_dead_workers, exporter_registry, render
from hookwatch.tools.cli import DEMO_MODEL_CONFIG, demo_fleet_bins, demo_watched_layers
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import Stack, http_get
from tests.conftest import require_binary
from tests.integration.helpers import ROOT, eventually, scrape, total

pytestmark = pytest.mark.integration

WORKERS = 4
MODEL = "digits"
#: Series every worker declares when its model loads, before any traffic.
DECLARED_AT_START = {
    "hookwatch_requests_total",
    "hookwatch_requests_sampled_total",
    "hookwatch_requests_rejected_total",
    "hookwatch_captures_total",
    "hookwatch_captures_dropped_total",
    "hookwatch_capture_queue_depth",
    "hookwatch_capture_queue_capacity",
    "hookwatch_activation_statistic",
    "hookwatch_activation_nonfinite_total",
    "hookwatch_layer_enabled",
    "hookwatch_monitor_faults_total",
}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _queue_size() -> int:
    config = yaml.safe_load((ROOT / DEMO_MODEL_CONFIG).read_text())
    return int(config["handler"]["monitoring"]["queue_size"])


def _send(stack: Stack, count: int, offset: int) -> None:
    """``count`` valid requests from 4 client threads, so every worker gets some."""
    split = load_split()

    def one(i: int) -> None:
        status, reply = stack.infer({"data": split.x_test[i % len(split.x_test)].tolist()})
        assert status == 200, reply

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, range(offset, offset + count)))


def _torchserve_requests(stack: Stack) -> float:
    samples = scrape(stack.ports.metrics)
    return total(samples, "ts_inference_requests_total", model_name=MODEL)


def _per_pid_requests(multiproc_dir: Path) -> dict[str, float]:
    """hookwatch_requests_total as each worker's own files hold it, by pid (``counter_<pid>``
    and the request path's ``counter_slots-<pid>-<n>``), and the dead workers' archive."""
    out: dict[str, float] = {}
    for path in sorted(multiproc_dir.glob("counter_*.db")):
        owner = re.sub(r"^counter_(?:slots-)?(\d+)(?:-\d+)?$", r"\1", path.stem)
        owner = owner.removeprefix("counter_")
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            _, name, labels, _ = json.loads(key)
            if name == "hookwatch_requests_total" and labels.get("model") == MODEL and value:
                out[owner] = out.get(owner, 0.0) + value
    return out


def _series_by_metric(samples: Samples) -> Counter[str]:
    base = {n: spec.name for spec in CATALOGUE for n in spec.exposed_names}
    return Counter(base[name] for name, labels in samples if dict(labels).get("model") == MODEL)


def _check_metrics(text: bytes) -> str:
    binary = require_binary("promtool")
    result = subprocess.run(
        [binary, "check", "metrics"], input=text, capture_output=True, check=False
    )
    return (result.stdout + result.stderr).decode() + f"(rc={result.returncode})"


def _exact(stack: Stack, expected: int) -> Samples:
    """Exporter == TorchServe == sent, and every sampled request captured on every layer."""
    samples = scrape(stack.ports.exporter)
    assert _torchserve_requests(stack) == expected
    assert total(samples, "hookwatch_requests_total", model=MODEL) == expected
    sampled = total(samples, "hookwatch_requests_sampled_total", model=MODEL)
    assert 0 < sampled <= expected
    assert total(samples, "hookwatch_captures_dropped_total", model=MODEL) == 0
    for layer in demo_watched_layers(ROOT / DEMO_MODEL_CONFIG):
        captured = total(samples, "hookwatch_captures_total", model=MODEL, layer=layer)
        assert captured == sampled, layer
        count = total(
            samples,
            "hookwatch_activation_statistic_count",
            model=MODEL,
            layer=layer,
            statistic="zero_fraction",
        )
        assert count == sampled, layer
    return samples


def test_four_workers_sum_exactly_and_survive_sigkill(make_stack: Callable[..., Stack]) -> None:
    require_binary("prometheus")
    require_binary("promtool")
    stack = make_stack("workers", workers=WORKERS, scrape_interval="1s")
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()
    pids = sorted(stack.worker_pids())
    assert len(pids) == WORKERS

    first = 200
    _send(stack, first, 0)
    samples = eventually(lambda: _exact(stack, first), timeout=30)

    # The fleet total is the sum of what each worker process wrote, over several workers.
    per_pid = _per_pid_requests(stack.multiproc_dir)
    assert sum(per_pid.values()) == first
    assert set(per_pid) <= {str(p) for p in pids}
    assert sum(1 for v in per_pid.values() if v > 0) >= 2, per_pid

    capacity = WORKERS * _queue_size()
    assert total(samples, "hookwatch_capture_queue_capacity", model=MODEL) == capacity
    for layer in demo_watched_layers(ROOT / DEMO_MODEL_CONFIG):
        assert total(samples, "hookwatch_layer_enabled", model=MODEL, layer=layer) == 1

    # Cardinality: the live scrape stays within the catalogue's per-model bound, no pid label.
    bound = series_per_model(
        demo_watched_layers(ROOT / DEMO_MODEL_CONFIG),
        fleet=demo_fleet_bins(ROOT / DEMO_MODEL_CONFIG),
    )
    series = _series_by_metric(samples)
    assert set(series) <= set(bound)
    assert set(series) >= DECLARED_AT_START, DECLARED_AT_START - set(series)
    for name, count in series.items():
        assert count <= bound[name], (name, count, bound[name])
    assert sum(series.values()) <= SERIES_PER_MODEL_TARGET
    assert not [labels for _, labels in samples if "pid" in dict(labels)]

    status, text = http_get(f"http://127.0.0.1:{stack.ports.exporter}/metrics")
    assert status == 200
    assert _check_metrics(text) == "(rc=0)"

    # SIGKILL one worker once its counts are published; TorchServe starts a replacement.
    victim = pids[0]
    os.kill(victim, signal.SIGKILL)

    def replaced() -> list[int]:
        now = stack.worker_pids()
        assert victim not in now and len(now) == WORKERS
        assert stack.ready_workers() == WORKERS
        return now

    new_pids = eventually(replaced, timeout=120, interval=1.0)
    second = 120
    _send(stack, second, first)
    after = eventually(lambda: _exact(stack, first + second), timeout=30)

    # Live gauges cover live workers only: the dead worker's capacity is gone, not added.
    def gauges_live() -> None:
        now = scrape(stack.ports.exporter)
        assert total(now, "hookwatch_capture_queue_capacity", model=MODEL) == capacity

    eventually(gauges_live, timeout=15)
    # The exporter reaped the dead worker's gauge files and folded its counter and summary
    # files into the archive: its published counts stay in the total (checked by _exact).
    assert sorted(p.name for p in stack.multiproc_dir.glob(f"*_{victim}.*")) == []
    per_file = _per_pid_requests(stack.multiproc_dir)
    assert set(per_file) == {str(p) for p in new_pids} | {"archive-1"}
    assert per_file["archive-1"] == per_pid[str(victim)]
    assert sum(per_file.values()) == first + second
    # Same series as before the kill: nothing stale, nothing doubled.
    assert _series_by_metric(after) == series

    # Prometheus sees the same totals and evaluates the repository's rules without errors.
    def in_prometheus() -> None:
        ours = stack.query(f'sum(hookwatch_requests_total{{model="{MODEL}"}})')
        theirs = stack.query(f'sum(ts_inference_requests_total{{model_name="{MODEL}"}})')
        assert ours and float(ours[0]["value"][1]) == first + second
        assert theirs and float(theirs[0]["value"][1]) == first + second

    eventually(in_prometheus, timeout=30)
    status, body = http_get(f"http://127.0.0.1:{stack.ports.prometheus}/api/v1/rules")
    groups = json.loads(body)["data"]["groups"]
    alerts = {r["name"]: r for g in groups for r in g["rules"] if r["type"] == "alerting"}
    assert {"HookwatchExporterDown", "HookwatchTorchServeDown", "HookwatchDeadUnits"} <= set(alerts)

    def evaluated() -> None:
        status, body = http_get(f"http://127.0.0.1:{stack.ports.prometheus}/api/v1/rules")
        assert status == 200
        rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
        assert all(r["health"] == "ok" for r in rules), [
            (r["name"], r["health"], r.get("lastError")) for r in rules
        ]

    eventually(evaluated, timeout=15)


# -- dead workers' files: compaction keeps totals exact -------------------------------------------


@pytest.fixture(scope="module")
def dead_workers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files of 6 real worker processes (demo CNN under a Monitor) that have exited."""
    directory = tmp_path_factory.mktemp("dead-workers")
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "dev.bench.scrape",
                "simulate",
                "--dir",
                str(directory),
            ),
            *("--config", str(ROOT / DEMO_MODEL_CONFIG), "--dead", "6", "--live", "0"),
            *("--requests", "3"),
        ],
        input=b"",
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return directory


def _scrape_dir(directory: Path, compact: bool) -> bytes:
    return render(exporter_registry(str(directory), reap_dead_pids=True, compact=compact))


def test_compaction_folds_dead_workers_into_one_archive_exactly(
    dead_workers: Path, tmp_path: Path
) -> None:
    work = tmp_path / "mp"
    shutil.copytree(dead_workers, work)
    before = _scrape_dir(work, compact=False)
    # Per worker: prometheus-client's counter file and the request path's count slots.
    assert sorted(p.name.split("_")[0] for p in work.glob("*.db")).count("counter") == 2 * 6
    assert total_of(before, "hookwatch_requests_total") == 6 * 3

    # One live pid stays out of the archive; the five dead ones go in.
    live = sorted(int(p.stem.split("_")[1]) for p in work.glob("counter_[0-9]*.db"))[0]
    absorbed = compact_dead_workers(str(work), alive=lambda pid: pid == live)
    # 5 x (counter, counter slots, histogram, histogram slots, summary); the live gauges
    # (livesum/livemin/livemax) of a dead worker are dropped, not archived.
    assert absorbed == 5 * 5
    names = sorted(p.name for p in work.iterdir())
    archives = [f"{kind}_archive-1.db" for kind in ("counter", "histogram", "summary")]
    own = [
        *(f"{kind}_{live}.db" for kind in ("counter", "histogram", "summary")),
        f"counter_slots-{live}-0.db",
        f"histogram_slots-{live}-1.db",
    ]
    assert names == sorted([*own, *archives, ARCHIVE_MANIFEST])
    assert compare(before, _scrape_dir(work, compact=False)) == []
    # A second round (the live one died too) builds generation 2 from 1 plus the new files.
    assert compact_dead_workers(str(work), alive=lambda pid: False) == 5
    assert sorted(p.name for p in work.glob("*.db")) == [
        f"{kind}_archive-2.db" for kind in ("counter", "histogram", "summary")
    ]
    assert compare(before, _scrape_dir(work, compact=True)) == []


def test_interrupted_compaction_never_loses_or_doubles_counts(
    dead_workers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "mp"
    shutil.copytree(dead_workers, work)
    before = _scrape_dir(work, compact=False)

    # Killed before the commit: files are renamed away and a partial archive exists.
    def no_commit(src: str, dst: str) -> None:
        raise KeyboardInterrupt("exporter killed before the manifest rename")

    monkeypatch.setattr(metrics_module.os, "replace", no_commit)
    with pytest.raises(KeyboardInterrupt):
        compact_dead_workers(str(work), alive=lambda pid: False)
    monkeypatch.undo()
    assert list(work.glob("*.compacting")), "the interruption left renamed files behind"
    # The next scrape finishes the job first: same totals, nothing missing.
    assert compare(before, _scrape_dir(work, compact=True)) == []
    assert not list(work.glob("*.compacting"))

    # Killed after the commit but before deleting what it absorbed: a leftover named in the
    # manifest must be deleted, not counted again.
    manifest = json.loads((work / ARCHIVE_MANIFEST).read_text())
    leftover = manifest["absorbed"][0]
    original = dead_workers / (leftover.split(".g")[0] + ".db")
    shutil.copy(original, work / leftover)
    assert compare(before, _scrape_dir(work, compact=True)) == []
    assert not (work / leftover).exists()


def test_scrape_bench_harness_runs(tmp_path: Path) -> None:
    out = tmp_path / "scrape.md"
    text, problems = scrape_bench.run(ROOT, dead=3, live=1, requests=2, scrapes=3, out=out)
    assert problems == []
    assert out.read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| 1 live")]
    assert len(rows) == 3, text
    # Each worker writes 8 files (counter, counter slots, histogram, histogram slots, summary,
    # livesum/livemin/livemax gauges): 4 x 8. Compaction leaves the live worker's 8 plus one
    # archive per counter-like type (counter, histogram, summary).
    assert "| 1 live + 3 dead, compaction | 32 → 11 |" in text, text


def total_of(body: bytes, name: str) -> float:
    return sum(v for (n, _), v in scrape_bench.totals(body).items() if n == name)


def test_a_worker_killed_under_load_loses_no_count(make_stack: Callable[..., Stack]) -> None:
    """SIGKILL in the middle of traffic from four clients: hookwatch's request count equals
    TorchServe's afterwards (the request path writes its counts as it goes)."""
    import threading
    import time

    stack = make_stack("killed", workers=WORKERS)
    stack.start_torchserve()
    stack.start_exporter()
    split = load_split()
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def client(offset: int) -> None:
        i = offset
        while not stop.is_set():
            status, _ = stack.infer({"data": split.x_test[i % len(split.x_test)].tolist()})
            with lock:
                statuses[status] += 1
            i += WORKERS

    threads = [threading.Thread(target=client, args=(k,)) for k in range(WORKERS)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3.0)
        victim = stack.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        eventually(lambda: _assert_replaced(stack, victim), timeout=120, interval=1.0)
        time.sleep(2.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    sent = sum(statuses.values())
    # The request the killed worker held gets an error; every other one is served.
    assert statuses[200] >= sent - 2, statuses

    def agree() -> None:
        theirs = _torchserve_requests(stack)
        ours = total(scrape(stack.ports.exporter), "hookwatch_requests_total", model=MODEL)
        # Every request a worker answered is counted, none twice. The only difference allowed:
        # a request TorchServe accepted and handed to the worker just killed, which no
        # handler ever read (answered 507), at most one per error.
        errors = sent - statuses[200]
        assert theirs == sent and statuses[200] <= ours <= theirs, (ours, theirs, statuses)
        assert theirs - ours <= errors, (ours, theirs, statuses)

    eventually(agree, timeout=30)


def _assert_replaced(stack: Stack, victim: int) -> None:
    now = stack.worker_pids()
    assert victim not in now and len(now) == WORKERS and stack.ready_workers() == WORKERS
