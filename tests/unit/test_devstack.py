from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from hookwatch.tools import devstack
from hookwatch.tools.devstack import PORT_ENV, Ports


def test_ports_from_env_override_each_default() -> None:
    assert Ports.from_env({}) == Ports()
    ports = Ports.from_env({"PROMETHEUS_PORT": "19090", "TS_GRPC_INFERENCE_PORT": "17070"})
    assert ports.prometheus == 19090 and ports.grpc_inference == 17070
    assert ports.inference == 8080
    with pytest.raises(ValueError, match=r"TS_METRICS_PORT: expected a TCP port, got 'x'"):
        Ports.from_env({"TS_METRICS_PORT": "x"})


def test_every_port_has_an_environment_variable() -> None:
    assert set(PORT_ENV) == set(Ports.__dataclass_fields__)


def test_free_ports_are_distinct_and_busy_names_the_variable() -> None:
    ports = Ports.free()
    values = list(ports.__dict__.values())
    assert len(set(values)) == len(values)
    assert ports.busy() == []
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports.exporter))
        holder.listen()
        assert ports.busy() == [
            f"port {ports.exporter} (exporter) is in use: set HOOKWATCH_EXPORTER_PORT"
        ]


def test_free_ports_stay_below_the_ephemeral_range() -> None:
    # Outgoing connections take source ports from the ephemeral range; a port chosen there can
    # be taken by any client socket before the server binds it.
    low = devstack._ephemeral_low()
    for seed in range(20):
        ports = Ports.free(random.Random(seed))
        assert all(devstack._FREE_PORT_RANGE[0] <= p < low for p in ports.__dict__.values())


def test_free_ports_skip_a_port_in_use() -> None:
    first = Ports.free(random.Random(7))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first.inference))
        holder.listen()
        again = Ports.free(random.Random(7))
    assert first.inference not in again.__dict__.values()
    assert again.inference == first.management  # the same draws, the busy one passed over


def test_ephemeral_low_falls_back_when_unreadable(tmp_path: Path) -> None:
    assert devstack._ephemeral_low(tmp_path / "missing") == 32768
    (tmp_path / "range").write_text("40000\t60999\n")
    assert devstack._ephemeral_low(tmp_path / "range") == 40000


def test_a_relative_run_dir_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TorchServe runs with the run directory as its working directory: a config file that
    # names a relative path inside it (``--run-dir .run-x``) was never found, and the stack
    # never started.
    from hookwatch.tools.devstack import Stack

    monkeypatch.chdir(tmp_path)
    stack = Stack(root=Path("."), run_dir=Path(".run-x"), mar_files=[Path("m.mar")])
    assert stack.run_dir == tmp_path / ".run-x" and stack.root == tmp_path
    assert list(stack.mar_files) == [tmp_path / "m.mar"]
    stack.run_dir.mkdir()
    rendered = stack._render_ts_config().read_text()
    assert f"model_store={tmp_path / '.run-x' / 'model-store'}" in rendered
    assert f"-Djava.io.tmpdir={tmp_path / '.run-x' / 'tmp'}" in rendered


def test_a_process_counts_as_exited_once_it_is_a_zombie_or_gone() -> None:
    # `hookwatch stop` says "stopped" once the run's process has exited: a zombie its parent
    # has not reaped yet (a test's Popen) has.
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not devstack._exited(proc.pid)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not devstack._exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert devstack._exited(proc.pid)  # a zombie until the wait below
    finally:
        proc.kill()
        proc.wait()
    assert devstack._exited(proc.pid)
