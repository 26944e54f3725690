"""Faults around the workers, on the real stack: the exporter killed and restarted, Prometheus
down, the metrics directory unwritable and then full under a real TorchServe.

Traffic runs through each fault from a client thread; every answer is compared with the demo
model served unmonitored in this process, and at the end hookwatch's counts equal the requests
sent (and TorchServe's own count). The in-process faults (hooks, capture thread, profile) are
in tests/unit/test_faults.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hookwatch._config import read_model_config
from hookwatch._service import ModelService
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import Stack
from tests.conftest import require, require_binary
from tests.filesystem import fill
from tests.integration.helpers import ROOT, demo_model, eventually, scrape, total

pytestmark = pytest.mark.integration

MODEL = "digits"
BAD = {"data": [1, 2, 3]}  # wrong shape: 400, counted as rejected
SPLIT = load_split()


@pytest.fixture(scope="module")
def expected() -> list[dict[str, Any]]:
    """The answer to each held-out digit from the demo model served unmonitored, here."""
    handler = read_model_config(
        yaml.safe_load((ROOT / "models/digits/model-config.yaml").read_text())
    ).handler
    torch.set_num_threads(handler.torch_threads)  # as the worker computes
    plain = ModelService.from_handler_config(demo_model(), handler, MODEL, monitored=False)
    return plain.handle([{"data": x.tolist()} for x in SPLIT.x_test])


def same(answer: Any, want: dict[str, Any]) -> bool:
    if not isinstance(answer, dict) or answer.get("class") != want["class"]:
        return False
    got = answer.get("probabilities", [])
    return len(got) == len(want["probabilities"]) and all(
        abs(a - b) <= 2e-6 for a, b in zip(got, want["probabilities"], strict=True)
    )


class Traffic:
    """Requests from one client thread, one in 20 a bad one, until stopped; every answer
    checked against ``expected``."""

    def __init__(self, stack: Stack, expected: list[dict[str, Any]], rate: float = 25.0):
        self.stack, self.expected, self.rate = stack, expected, rate
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.wrong: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._one()
            self._stop.wait(1.0 / self.rate)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def send(self, count: int) -> None:
        """``count`` more requests, one after the other, from this thread."""
        for _ in range(count):
            self._one()

    def _one(self) -> None:
        n = sum(self.statuses.values())
        if n % 20 == 19:
            status, _ = self.stack.infer(BAD)
            self.statuses[("bad", status)] += 1
            return
        k = n % len(self.expected)
        status, reply = self.stack.infer({"data": SPLIT.x_test[k].tolist()})
        self.statuses[("valid", status)] += 1
        if status != 200 or not same(reply, self.expected[k]):
            self.wrong.append((k, reply))

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def bad(self) -> int:
        return sum(n for (kind, _), n in self.statuses.items() if kind == "bad")

    def check(self) -> None:
        """Every valid request answered right, every bad one with a 400."""
        assert self.wrong == [], self.wrong[:3]
        assert set(self.statuses) <= {("valid", 200), ("bad", 400)}, self.statuses


def _counts_agree(stack: Stack, traffic: Traffic) -> None:
    samples = scrape(stack.ports.exporter)
    assert total(scrape(stack.ports.metrics), "ts_inference_requests_total", model_name=MODEL) == (
        traffic.sent
    )
    assert total(samples, "hookwatch_requests_total", model=MODEL) == traffic.sent
    assert total(samples, "hookwatch_requests_rejected_total", model=MODEL) == traffic.bad


def _prometheus_agrees(stack: Stack, traffic: Traffic) -> None:
    ours = stack.query(f'sum(hookwatch_requests_total{{model="{MODEL}"}})')
    assert ours and float(ours[0]["value"][1]) == traffic.sent, ours
    # Never lower than before: no reset, so increase() and rate() over the fault are right.
    resets = stack.query(f'sum(resets(hookwatch_requests_total{{model="{MODEL}"}}[15m]))')
    assert resets and float(resets[0]["value"][1]) == 0, resets


def _kill(stack: Stack, name: str) -> None:
    pid = stack.recorded_pids()[name]
    os.killpg(pid, signal.SIGKILL)
    stack._procs[name].wait(30)


def test_exporter_and_prometheus_going_down_never_touch_serving_or_counts(
    make_stack: Callable[..., Stack], expected: list[dict[str, Any]]
) -> None:
    require_binary("prometheus")
    stack = make_stack("down", workers=2, scrape_interval="1s")
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()
    with Traffic(stack, expected) as traffic:
        eventually(lambda: _served_and_scraped(stack), timeout=60)

        # The exporter killed: Prometheus sees its target down and the alert pending.
        _kill(stack, "exporter")

        def exporter_down() -> None:
            up = stack.query('up{job="hookwatch"}')
            assert up and up[0]["value"][1] == "0", up
            alerts = stack.query('ALERTS{alertname="HookwatchExporterDown"}')
            assert alerts and alerts[0]["metric"]["alertstate"] == "pending", alerts

        eventually(exporter_down, timeout=30)
        time.sleep(3.0)
        stack.start_exporter()
        eventually(lambda: _up(stack, "hookwatch"), timeout=30)

        # Prometheus killed: serving and the exporter carry on; it comes back to the same data.
        _kill(stack, "prometheus")
        time.sleep(5.0)
        sent_while_down = traffic.sent
        stack.start_prometheus()
    traffic.check()
    assert traffic.sent > sent_while_down > 0
    eventually(lambda: _counts_agree(stack, traffic), timeout=30)
    eventually(lambda: _prometheus_agrees(stack, traffic), timeout=60)


def _served_and_scraped(stack: Stack) -> None:
    got = stack.query(f'sum(hookwatch_requests_total{{model="{MODEL}"}})')
    assert got and float(got[0]["value"][1]) > 20, got


def _up(stack: Stack, job: str) -> None:
    up = stack.query(f'up{{job="{job}"}}')
    assert up and up[0]["value"][1] == "1", up


# -- the metrics directory unwritable, then full, under TorchServe --------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test (root only), unmounted after the stack stopped."""
    require(os.geteuid() == 0, "root, to mount a small tmpfs as the metrics directory")
    require_binary("mount")
    mount = tmp_path / "metrics-fs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        # The fixture order stops the stack first (make_stack is requested before this one).
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _remount(mount: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)


def _writable(stack: Stack) -> float:
    return scrape(stack.ports.exporter)[("hookwatch_metrics_dir_writable", ())]


def _model_log(stack: Stack) -> str:
    return (stack.logs / "model_log.log").read_text(errors="replace")


def test_an_unwritable_then_full_metrics_directory_never_stops_torchserve(
    make_stack: Callable[..., Stack], small_tmpfs: Path, expected: list[dict[str, Any]]
) -> None:
    directory = small_tmpfs / "metrics"
    directory.mkdir()
    _remount(small_tmpfs, "ro")
    stack = make_stack("tmpfs", workers=2, metrics_dir=directory)
    # Read-only from the start: the workers load and serve without their metric files.
    stack.start_torchserve()
    stack.start_exporter()
    traffic = Traffic(stack, expected)
    traffic.send(60)
    traffic.check()
    time.sleep(3.0)  # every worker tries to publish (each second) and cannot
    assert _writable(stack) == 0
    assert list(directory.iterdir()) == []
    log = _model_log(stack)
    assert log.count("cannot write the metric files") == 2, log[-3000:]  # once per worker

    # Writable again: every request served meanwhile is counted, none twice.
    _remount(small_tmpfs, "rw")
    eventually(lambda: _counts_agree(stack, traffic), timeout=30)
    assert _writable(stack) == 1
    faults = total(scrape(stack.ports.exporter), "hookwatch_monitor_faults_total", layer="all")
    assert faults >= 2  # each worker's publishes that could not write, counted once it could

    # Full: the files exist and keep counting; no worker dies of SIGBUS.
    filler = fill(small_tmpfs)
    workers = sorted(stack.worker_pids())
    traffic.send(60)
    traffic.check()
    eventually(lambda: _counts_agree(stack, traffic), timeout=30)
    assert _writable(stack) == 0
    assert sorted(stack.worker_pids()) == workers

    # A worker replaced while the disk is full loads, serves, and stays up.
    victim = workers[0]
    os.kill(victim, signal.SIGKILL)

    def replaced() -> list[int]:
        now = stack.worker_pids()
        assert victim not in now and len(now) == 2 and stack.ready_workers() == 2
        return now

    after_kill = sorted(eventually(replaced, timeout=120, interval=1.0))
    traffic.send(60)
    traffic.check()
    time.sleep(3.0)  # several publishes that cannot write
    assert sorted(stack.worker_pids()) == after_kill, "a worker died while the disk was full"
    assert "Bus error" not in _model_log(stack) and "SIGBUS" not in _model_log(stack)

    # Space again: the new worker's files appear with everything it counted.
    filler.unlink()
    eventually(lambda: _counts_agree(stack, traffic), timeout=30)
    assert _writable(stack) == 1
    stack.stop()
