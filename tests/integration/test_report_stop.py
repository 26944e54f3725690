"""hookwatch stop against real processes: the running hookwatch asked first, a stale pid never
signalled (moved from tests/unit/test_report.py: they start processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hookwatch.tools.devstack import Stack

pytestmark = pytest.mark.integration


def test_stop_asks_the_running_hookwatch_first(tmp_path: Path) -> None:
    """`hookwatch stop` sends SIGTERM to the process holding the run directory and waits for
    it, so that it writes its report before the stack goes."""
    got = tmp_path / "got-sigterm"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time, pathlib  # stands in for hookwatch run\n"
            "from hookwatch.tools.devstack import Stack\n"
            "def stop(*_):\n"
            f"    pathlib.Path({str(got)!r}).write_text('yes'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            f"stack = Stack(root=pathlib.Path({str(tmp_path)!r}), "
            f"run_dir=pathlib.Path({str(tmp_path / '.run')!r}))\n"
            "with stack.hold('run'):\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        done = subprocess.run(
            [sys.executable, "-m", "hookwatch.tools.cli", "stop", "--root", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert got.read_text() == "yes"
        assert f"stopped hookwatch run (pid {holder.pid})" in done.stdout
    finally:
        holder.kill()
        holder.wait(10)


def test_a_pid_in_a_stale_run_file_is_never_signalled(tmp_path: Path) -> None:
    """A run.json left by a run that is gone names a pid the system may have given to
    another program: without the directory's lock held, nobody is asked to stop."""
    stack = Stack(root=tmp_path, run_dir=tmp_path / ".run")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        stack.run_dir.mkdir(parents=True)
        stack.owner_file.write_text(json.dumps({"pid": sleeper.pid, "command": "run"}))
        stack.lock_file.touch()
        assert stack.stop_holder(timeout=2) is None
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait(10)
