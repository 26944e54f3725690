"""Who runs a run directory and what a run that is gone left, against real processes (moved from
tests/unit/test_devstack.py: they start processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hookwatch.tools import devstack
from hookwatch.tools.devstack import Ports

pytestmark = pytest.mark.integration

HOLDER = """
import sys, time
from pathlib import Path
from hookwatch.tools.devstack import Stack
with Stack(root=Path("."), run_dir=Path(sys.argv[1])).hold("serve"):
    print("held", flush=True)
    time.sleep(60)
"""


def _stack(tmp_path: Path) -> devstack.Stack:
    return devstack.Stack(root=Path("."), run_dir=tmp_path / "run", ports=Ports.free())


def _record(stack: devstack.Stack, **entries: dict[str, int | None]) -> None:
    stack.run_dir.mkdir(parents=True, exist_ok=True)
    stack.pid_file.write_text(json.dumps(entries))


def _sleeper() -> int:
    """A process group of its own that is not our child (as a killed run's orphans are not
    the next run's): ``sleep`` in its own session, handed to init by a shell that exits."""
    out = subprocess.run(
        ["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout)
    deadline = time.monotonic() + 10
    while os.getpgid(pid) != pid:  # the shell reports the pid before setsid has run
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return pid


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_pid_the_system_gave_to_another_process_is_never_signalled(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    other = _sleeper()
    try:
        start = devstack.process_start(other)
        assert start is not None
        # Recorded with another start time: the number was ours once, the process is not.
        _record(stack, torchserve={"pid": other, "start": start - 1})
        assert stack.live_recorded() == {}
        assert stack.clear_stale() == []
        assert not _gone(other) and not stack.pid_file.exists()
        # Recorded with its own start time: ours, stopped.
        _record(stack, torchserve={"pid": other, "start": start})
        assert stack.clear_stale() == ["torchserve"]
        assert _gone(other)
    finally:
        if not _gone(other):
            os.kill(other, signal.SIGKILL)


def test_pids_of_processes_that_are_gone_are_cleared(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    gone = _sleeper()
    start = devstack.process_start(gone)
    os.kill(gone, signal.SIGKILL)
    while not _gone(gone):
        time.sleep(0.01)
    _record(stack, exporter={"pid": gone, "start": start}, prometheus={"pid": gone})
    stack.owner_file.write_text(json.dumps({"pid": gone, "command": "run"}))
    assert not stack.held()
    with stack.hold("run"):
        assert stack.clear_stale() == []
        assert json.loads(stack.owner_file.read_text())["pid"] == os.getpid()
    assert not stack.pid_file.exists() and not stack.owner_file.exists()


def test_one_process_holds_a_run_directory_until_it_ends_however_it_ends(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(stack.run_dir)], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        assert stack.held()
        with pytest.raises(devstack.AlreadyRunning) as refused, stack.hold("run"):
            pass
        assert (refused.value.pid, refused.value.command) == (holder.pid, "serve")
        holder.kill()  # no cleanup runs: the kernel drops the lock with the process
        holder.wait()
        assert not stack.held()
        with stack.hold("run"):
            assert stack.held()
    finally:
        holder.kill()
        holder.wait()
