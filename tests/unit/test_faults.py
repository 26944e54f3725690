"""Monitoring never hurts serving: faults injected into each part of it, in process.

Every test serves the demo CNN through :class:`ModelService` with monitoring and compares each
answer with the same model served unmonitored; then it checks that the fault shows in a state
metric and in one log line, and that what was counted before the fault is still there.
A metrics directory that is unwritable or full needs prometheus-client's multiprocess mode,
which a process chooses once: those run in a child process on a small tmpfs of its own
(tests/integration/test_metrics_dir_faults.py).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from hookwatch._capture import MAX_RESTARTS
from hookwatch._config import read_model_config
from hookwatch._hooks import resolve_layers
from hookwatch._metrics import MetricSet
from hookwatch._profile import build_profile
from hookwatch._service import ModelService
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.demo.digits_cnn import DigitsCNN

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "models/digits/model-config.yaml").read_text())
SPLIT = load_split()
PROFILE = "drift-profile.npz"
LAYERS = ("input", "act1", "act2", "act3", "output")


def handler_config(**monitoring: Any) -> Any:
    config = copy.deepcopy(CONFIG)
    # Every request sampled and published every 50 ms: each fault is hit at once.
    config["handler"]["monitoring"].update(
        {"sample_rate": 1.0, "flush_interval_s": 0.05, "seed": 0, **monitoring}
    )
    return read_model_config(config).handler


def demo_model() -> DigitsCNN:
    torch.manual_seed(0)
    return DigitsCNN().eval()


def bodies(start: int, count: int) -> list[dict[str, Any]]:
    return [
        {"data": SPLIT.x_test[i % len(SPLIT.x_test)].tolist()} for i in range(start, start + count)
    ]


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drift profile of the demo model on held-out digits, as an archive carries it."""
    model = demo_model()
    config = resolve_layers(model, handler_config().monitoring, "digits")
    x = torch.from_numpy(np.asarray(SPLIT.x_test[:300], dtype=np.float32))
    profile = build_profile(model, config, [x[i : i + 100] for i in range(0, 300, 100)], "digits")
    return profile.save(tmp_path_factory.mktemp("profile") / PROFILE)


class Served:
    """The monitored service and its unmonitored twin, fed the same requests."""

    def __init__(self, metrics: MetricSet, model_dir: Path | None = None, **monitoring: Any):
        handler = handler_config(**monitoring)
        model = demo_model()
        self.plain = ModelService.from_handler_config(
            copy.deepcopy(model), handler, "digits", monitored=False
        )
        self.service = ModelService.from_handler_config(
            model, handler, "digits", metrics, model_dir=str(model_dir) if model_dir else None
        )
        self.metrics = metrics
        self.sent = 0

    @property
    def monitor(self) -> Any:
        return self.service.monitor

    def send(self, count: int, batch: int = 1) -> None:
        """``count`` requests in batches of ``batch``; each answer equals the unmonitored one."""
        for start in range(self.sent, self.sent + count, batch):
            requests = bodies(start, batch)
            answers = self.service.handle(requests)
            assert answers == self.plain.handle(requests)
            assert all("class" in a for a in answers), answers
        self.sent += count

    def value(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"model": "digits", **labels}.items())))
        return self.metrics.sample_values().get(key, float("nan"))

    def published(self) -> None:
        assert self.monitor.flush()

    def close(self) -> None:
        self.service.close()


@pytest.fixture
def served(metrics: MetricSet) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def make(model_dir: Path | None = None, **monitoring: Any) -> Served:
        made.append(Served(metrics, model_dir, **monitoring))
        return made[-1]

    yield make
    for s in made:
        s.close()


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# -- a hook that raises ----------------------------------------------------------------------


def test_a_hook_that_raises_switches_its_layer_off_and_serving_goes_on(
    served: Callable[..., Served], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = served()
    s.send(10)
    s.published()
    real_numpy = torch.Tensor.numpy

    def numpy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # act2 is the demo's only layer of 32 channels. The host copy is where both of the
        # hook's paths meet (the general one and the repeat of its last capture).
        if tensor.dim() == 4 and tensor.shape[1] == 32:
            raise ValueError("injected: the hook on act2 fails")
        return real_numpy(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "numpy", numpy)
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        s.send(30)
        s.published()
    assert s.value("hookwatch_layer_enabled", layer="act2") == 0
    assert s.value("hookwatch_monitor_faults_total", layer="act2") == 1
    # Counted before the fault, kept; the other layers miss nothing.
    assert s.value("hookwatch_captures_total", layer="act2") == 10
    for layer in ("input", "act1", "act3", "output"):
        assert s.value("hookwatch_layer_enabled", layer=layer) == 1
        assert s.value("hookwatch_captures_total", layer=layer) == 40
    assert s.value("hookwatch_requests_total") == 40
    assert len(lines(caplog, "'act2'")) == 1


# -- the capture thread dying ------------------------------------------------------------------


class Killed(BaseException):
    """What ends a thread without being an Exception (SystemExit from processing code)."""


def test_a_capture_thread_that_dies_once_is_restarted(
    served: Callable[..., Served], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = served()
    s.send(10)
    s.published()
    process = s.monitor._processor.process
    failed: list[int] = []

    def dies_once(records: list[Any]) -> None:
        if not failed:
            failed.append(len(records))
            raise Killed("injected: the capture loop ends")
        process(records)

    monkeypatch.setattr(s.monitor._processor, "process", dies_once)
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        s.send(10)
        s.published()
        s.send(20)
        s.published()
    worker = s.monitor._worker
    assert worker.running and worker.restarts == 1 and not worker.off
    assert s.value("hookwatch_monitor_faults_total", layer="all") == 1
    # The batch in hand when the loop died is lost to the statistics, nothing else is.
    assert worker.lost == failed[0] > 0
    for layer in LAYERS:
        assert s.value("hookwatch_layer_enabled", layer=layer) == 1
        assert s.value("hookwatch_captures_total", layer=layer) == 40 - failed[0]
    assert s.value("hookwatch_requests_total") == 40
    assert len(lines(caplog, "capture thread failed")) == 1


def test_a_capture_thread_that_keeps_dying_turns_capture_off_visibly(
    served: Callable[..., Served], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = served()
    s.send(5)
    s.published()

    def always_dies(records: list[Any]) -> None:
        raise Killed("injected: the capture loop ends on every batch")

    monkeypatch.setattr(s.monitor._processor, "process", always_dies)
    worker = s.monitor._worker
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        while not worker.off:
            s.send(1)
            s.published()
            assert worker.restarts <= MAX_RESTARTS + 1
        s.send(20)
        s.published()
    assert worker.restarts == MAX_RESTARTS + 1
    sampled_when_off = s.value("hookwatch_requests_sampled_total")
    s.send(10)
    s.published()
    # Off: nothing sampled or captured any more, every layer says so, requests still counted.
    assert s.value("hookwatch_requests_sampled_total") == sampled_when_off
    assert s.value("hookwatch_requests_total") == s.sent
    for layer in LAYERS:
        assert s.value("hookwatch_layer_enabled", layer=layer) == 0
        assert s.value("hookwatch_captures_total", layer=layer) == 5
    assert s.value("hookwatch_monitor_faults_total", layer="all") == MAX_RESTARTS + 1
    assert len(lines(caplog, "capture is off")) == 1
    assert len(lines(caplog, "capture thread failed")) == 2  # one restart line a minute, then off


# -- the drift profile -------------------------------------------------------------------------


def _truncated(good: Path, target: Path) -> None:
    target.write_bytes(good.read_bytes()[: good.stat().st_size // 2])


def _corrupt(good: Path, target: Path) -> None:
    data = bytearray(good.read_bytes())
    rng = np.random.default_rng(0)
    for at in rng.integers(0, len(data), 200):
        data[at] ^= 0xFF
    target.write_bytes(bytes(data))


def _garbage(good: Path, target: Path) -> None:
    target.write_bytes(b"not a profile at all\n" * 10)


def _wrong_version(good: Path, target: Path) -> None:
    with np.load(good, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(arrays["header"].tobytes())
    header["version"] = 99
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    with target.open("wb") as f:
        np.savez(f, **arrays)


def _other_layers(good: Path, target: Path) -> None:
    model = demo_model()
    config = resolve_layers(model, handler_config(layers=["act1"]).monitoring, "digits")
    x = torch.from_numpy(np.asarray(SPLIT.x_test[:200], dtype=np.float32))
    build_profile(model, config, [x[:100], x[100:]], "digits").save(target)


BROKEN: dict[str, Callable[[Path, Path], None]] = {
    "truncated": _truncated,
    "corrupt": _corrupt,
    "garbage": _garbage,
    "wrong version": _wrong_version,
    "for other layers": _other_layers,
}


@pytest.mark.parametrize("damage", list(BROKEN), ids=list(BROKEN))
def test_a_broken_profile_serves_without_drift_visibly(
    damage: str,
    profile_file: Path,
    tmp_path: Path,
    served: Callable[..., Served],
    caplog: pytest.LogCaptureFixture,
) -> None:
    BROKEN[damage](profile_file, tmp_path / PROFILE)
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        s = served(tmp_path)
    s.send(30)
    s.published()
    assert s.monitor._drift is None
    assert s.value("hookwatch_drift_profile_loaded") == 0
    assert s.value("hookwatch_monitor_faults_total", layer="all") == 1
    for layer in LAYERS:
        assert s.value("hookwatch_captures_total", layer=layer) == 30
    assert len(lines(caplog, "could not be used")) == 1


def test_a_missing_profile_serves_without_drift_and_is_no_fault(
    tmp_path: Path, served: Callable[..., Served], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        s = served(tmp_path)
    s.send(10)
    s.published()
    assert s.value("hookwatch_drift_profile_loaded") == 0
    assert s.value("hookwatch_monitor_faults_total", layer="all") == 0
    assert len(lines(caplog, "has no drift profile")) == 1


def test_the_intact_profile_loads(
    profile_file: Path, tmp_path: Path, served: Callable[..., Served]
) -> None:
    # The control for the damaged copies above: the same file, undamaged, runs drift.
    shutil.copy(profile_file, tmp_path / PROFILE)
    s = served(tmp_path)
    s.send(10)
    s.published()
    assert s.monitor._drift is not None
    assert s.value("hookwatch_drift_profile_loaded") == 1
    assert s.value("hookwatch_monitor_faults_total", layer="all") == 0


# -- the exporter's housekeeping fails or a file is damaged ------------------------------------


def _worker_file(directory: Path, pid: int, requests: float) -> None:
    """A dead worker's counter file as prometheus-client writes it."""
    from prometheus_client.mmap_dict import mmap_key

    from hookwatch._catalogue import REQUESTS
    from hookwatch._metrics import MmapedDict

    f = MmapedDict(str(directory / f"counter_{pid}.db"))
    key = mmap_key("hookwatch_requests", REQUESTS.name, ["model"], ["digits"], REQUESTS.help)
    f.write_value(key, requests, 0.0)
    f.close()


def _exporter(directory: Path) -> Callable[[], dict[Any, float]]:
    """Scrapes of one exporter over ``directory`` (its log limit holds across them)."""
    from hookwatch._metrics import exporter_registry, parse_samples, render

    registry = exporter_registry(str(directory))
    return lambda: parse_samples(render(registry).decode())


def test_the_exporter_leaves_out_a_damaged_file_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    _worker_file(tmp_path, 4_000_001, 5.0)
    garbage = b"\x40\x00\x00\x00garbage"
    # A live worker's file cut short (this test's pid is alive): merged around, every scrape.
    (tmp_path / f"counter_{os.getpid()}.db").write_bytes(garbage)
    (tmp_path / f"gauge_livesum_{os.getpid()}.db").write_bytes(b"")
    # A dead worker's: set aside by compaction, out of every archive.
    (tmp_path / "counter_4000002.db").write_bytes(garbage)
    scrape = _exporter(tmp_path)
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        first, second = scrape(), scrape()
    for samples in (first, second):
        assert samples[("hookwatch_requests_total", (("model", "digits"),))] == 5
        assert samples[("hookwatch_metrics_dir_writable", ())] == 1
    assert (tmp_path / "counter_4000002.db.damaged").read_bytes() == garbage
    assert len(lines(caplog, "left out 2 metric files that cannot be read")) == 1
    assert len(lines(caplog, "counter_4000002.db cannot be read")) == 1


def test_a_compaction_that_cannot_write_loses_no_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hookwatch._metrics.exporter as metrics_module

    for pid, count in ((4_000_011, 3.0), (4_000_012, 4.0)):
        _worker_file(tmp_path, pid, count)

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    # A full disk: the dead workers' files are renamed for compaction, the archive cannot be
    # written. Every scrape still counts them, once.
    monkeypatch.setattr(metrics_module.os, "posix_fallocate", no_space)
    scrape = _exporter(tmp_path)
    with caplog.at_level(logging.WARNING, logger="hookwatch"):
        for _ in range(3):
            samples = scrape()
            assert samples[("hookwatch_requests_total", (("model", "digits"),))] == 7
            assert samples[("hookwatch_metrics_dir_writable", ())] == 0
    assert list(tmp_path.glob("*.compacting"))
    assert len(lines(caplog, "compacting dead workers' files")) == 1
    monkeypatch.undo()
    samples = scrape()
    assert samples[("hookwatch_requests_total", (("model", "digits"),))] == 7
    assert samples[("hookwatch_metrics_dir_writable", ())] == 1
    assert not list(tmp_path.glob("*.compacting"))
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["counter_archive-1.db"]
