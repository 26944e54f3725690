"""``make run`` / ``hookwatch run`` / ``hookwatch serve`` stop cleanly however they are stopped.

Each test starts the real command in a session of its own (as a terminal runs a foreground
job), on free ports and a run directory of its own, and stops it: Ctrl-C (SIGINT to the
whole process group, as a terminal sends it), SIGTERM, or ``make stop`` / ``hookwatch stop``
from another process; while starting, running, or already stopping. Every stop exits 0 and
prints one line; nothing the run started is left running; a second run in the same directory
says so and leaves the first alone; what a run killed with SIGKILL left behind is cleaned up.
"""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import PORT_ENV, Ports, Stack
from tests.conftest import require, require_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MAR = ROOT / "model_store" / "digits.mar"
STOPPED = "stopped TorchServe, exporter and Prometheus"
#: Printed once every process is up (the URL list).
RUNNING = "  hookwatch exporter  http://"
#: Printed as a run begins to start them.
STARTING = "starting TorchServe"
#: A line of every live-view table (every 5 s).
TABLE = "    layer "
START_TIMEOUT = 240.0


def assert_stopped(lines: list[str], ctrl_c: bool = False) -> None:
    """What a stopped run prints after its last frame: the live view's run summary (a headline
    and indented lines; none for a run stopped before its view started), then STOPPED, last;
    with ``ctrl_c`` the terminal's echoed ``^C`` first, alone or in front of the next line."""
    if ctrl_c:
        assert lines and lines[0].startswith("^C"), lines
        lines = [lines[0][2:], *lines[1:]] if lines[0] != "^C" else lines[1:]
    assert lines and lines[-1] == STOPPED, lines
    summary = lines[:-1]
    if summary:
        assert summary[0].startswith("run summary: "), lines
        assert all(line.startswith("  ") for line in summary[1:]), lines


class Command:
    """One command in a session of its own, its output (stdout and stderr) in a file.

    With ``tty`` the session has a terminal (a pseudo-terminal whose other end this test
    holds), as a shell's foreground job has: :meth:`ctrl_c` types Ctrl-C into it and the
    terminal decides who gets SIGINT.
    """

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, tty: bool = False):
        self.log = log
        self._master: int | None = None
        if not tty:
            with log.open("wb") as out:
                self.proc = subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            return
        # The copying thread appends; the file exists before anyone reads it.
        log.write_bytes(b"")
        master, slave = pty.openpty()

        def controlling_terminal() -> None:  # in the child, before exec
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        self._master = master
        threading.Thread(target=self._copy, args=(master,), daemon=True).start()

    def _copy(self, master: int) -> None:
        with self.log.open("ab") as out:
            while True:
                try:
                    data = os.read(master, 4096)
                except OSError:  # EIO: every process holding the terminal has closed it
                    return
                if not data:
                    return
                out.write(data.replace(b"\r\n", b"\n"))
                out.flush()

    def ctrl_c(self) -> None:
        assert self._master is not None
        os.write(self._master, b"\x03")

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = START_TIMEOUT) -> int:
        """Wait until ``text`` is printed; returns how much output there is then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output
            if text in out:
                return len(out)
            assert self.proc.poll() is None, (
                f"exited {self.proc.returncode} before {text!r}:\n{out}"
            )
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} within {timeout:.0f} s:\n{self.output}")

    def quiet_moment(self) -> int:
        """Right after the next live-view table: the one after is 5 s away, so what a stop
        prints is told apart from the view. Returns the length of the output then."""
        seen = self.output.count(TABLE)
        deadline = time.monotonic() + 60
        while self.output.count(TABLE) == seen:
            assert time.monotonic() < deadline, f"no live view:\n{self.output[-2000:]}"
            assert self.proc.poll() is None, self.output[-2000:]
            time.sleep(0.05)
        time.sleep(0.5)  # the rest of the table
        return len(self.output)

    def signal(self, sig: int, group: bool = False) -> None:
        if group:
            os.killpg(self.proc.pid, sig)  # what a terminal's Ctrl-C does to its foreground job
        else:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def after(self, offset: int) -> list[str]:
        """Lines printed after ``offset``."""
        return [line for line in self.output[offset:].splitlines() if line.strip()]


class Runs:
    """Commands against one run directory and one set of free ports."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.run_dir = tmp / "run"
        ports = Ports.free()
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
            **{PORT_ENV[name]: str(getattr(ports, name)) for name in PORT_ENV},
            "HOOKWATCH_RUN_DIR": str(self.run_dir),
            "PYTHONUNBUFFERED": "1",
        }
        self.stack = Stack(root=ROOT, run_dir=self.run_dir, ports=ports)
        self.commands: list[Command] = []

    def hookwatch(self, *args: str, name: str | None = None) -> Command:
        argv = [sys.executable, "-m", "hookwatch.tools.cli", *args]
        if args[0] != "serve":
            # The demo's run and stop find the repository's model store by --root; serve
            # needs no checkout (the run directory comes from HOOKWATCH_RUN_DIR).
            argv += ["--root", str(ROOT)]
        if args[0] in ("run", "serve"):
            # How a run stops is tested here, not the report it writes on the way out.
            argv.append("--no-report")
        return self._start(argv, name or args[0])

    def make(self, target: str, tty: bool = False) -> Command:
        argv = ["make", "--no-print-directory", target]
        if target == "run":
            argv.append("RUN_ARGS=--no-report")
        return self._start(argv, f"make-{target}", tty)

    def _start(self, argv: list[str], name: str, tty: bool = False) -> Command:
        log = self.tmp / f"{name}-{len(self.commands)}.log"
        self.commands.append(Command(argv, self.env, log, tty))
        return self.commands[-1]

    def run(self, *extra: str) -> Command:
        # One worker and a slow trickle of traffic: what is tested is how it stops.
        return self.hookwatch("run", "--workers", "1", "--rate", "2", "--drift-after", "0", *extra)

    def left_running(self) -> list[str]:
        """Processes working in the run directory (every process of the stack does)."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            if cwd == str(self.run_dir) or cwd.startswith(f"{self.run_dir}/"):
                found.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()[:120]!r}")
        return found

    def assert_clean(self) -> None:
        assert self.left_running() == []
        assert not self.stack.pid_file.exists()
        assert not self.stack.owner_file.exists()
        assert not self.stack.held()

    def close(self) -> None:
        for command in self.commands:
            if command.proc.poll() is None:
                command.signal(signal.SIGTERM)
                try:
                    command.proc.wait(60)
                except subprocess.TimeoutExpired:
                    command.proc.kill()
        self.stack.stop()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    require(MAR.exists(), f"{MAR} (make mar builds it)")
    require_binary("java")
    require_binary("prometheus")
    r = Runs(tmp_path)
    yield r
    r.close()


def _served(runs: Runs) -> None:
    x = load_split().x_test[0].tolist()
    status, reply = runs.stack.infer({"data": x})
    assert status == 200 and "class" in reply, reply


def test_make_run_ends_on_ctrl_c_and_a_second_run_is_refused(runs: Runs) -> None:
    require_binary("make")
    first = runs.make("run", tty=True)
    first.wait_for(RUNNING)
    _served(runs)
    # A second run in the same directory: one line naming the first, non-zero, first untouched.
    second = runs.run()
    assert second.finish(60) == 1
    lines = second.after(0)
    assert len(lines) == 1 and "already running" in lines[0], lines
    assert str(runs.stack.owner()["pid"]) in lines[0]  # type: ignore[index]
    _served(runs)
    offset = first.quiet_moment()
    first.ctrl_c()
    # make gets no SIGINT (hookwatch took the terminal's foreground), so it ends as its
    # recipe did: 0.
    assert first.finish() == 0, first.output[-3000:]
    # The terminal echoes the Ctrl-C as ^C, as it does for a person.
    assert_stopped(first.after(offset), ctrl_c=True)
    runs.assert_clean()


def test_serve_ends_on_sigterm(runs: Runs) -> None:
    serve = runs.hookwatch("serve", str(MAR), "--workers", "1")
    serve.wait_for(RUNNING)
    _served(runs)
    offset = serve.quiet_moment()
    serve.signal(signal.SIGTERM)
    assert serve.finish() == 0, serve.output[-3000:]
    assert_stopped(serve.after(offset))
    runs.assert_clean()


def test_make_stop_from_another_shell_ends_a_run(runs: Runs) -> None:
    require_binary("make")
    run = runs.run()
    run.wait_for(RUNNING)
    offset = run.quiet_moment()
    stop = runs.make("stop")
    assert stop.finish() == 0, stop.output
    pid = run.proc.pid
    assert stop.after(0) == [f"stopped hookwatch run (pid {pid}) and everything it started"]
    assert run.finish() == 0, run.output[-3000:]
    assert_stopped(run.after(offset))
    runs.assert_clean()
    # Nothing runs any more: stop says so, in one line, and succeeds.
    again = runs.hookwatch("stop")
    assert again.finish() == 0
    assert again.after(0) == [f"nothing runs in {runs.run_dir}; nothing to stop"]


@pytest.mark.parametrize(
    ("how", "after_s"), [("SIGTERM", 0.2), ("Ctrl-C", 1.5), ("hookwatch stop", 0.8)]
)
def test_a_run_stopped_while_starting_exits_cleanly(runs: Runs, how: str, after_s: float) -> None:
    run = runs.run()
    offset = run.wait_for(STARTING, 60)
    # TorchServe is starting (spawned, its workers loading the model): stop now.
    time.sleep(after_s)
    if how == "hookwatch stop":
        stop = runs.hookwatch("stop")
        assert stop.finish() == 0, stop.output
        assert len(stop.after(0)) == 1 and "stopped hookwatch run" in stop.output
    else:
        run.signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGINT, group=how == "Ctrl-C")
    assert run.finish() == 0, run.output[-3000:]
    assert RUNNING not in run.output, "the stack was up before the stop: not a stop while starting"
    assert_stopped(run.after(offset))
    runs.assert_clean()


def test_signals_while_stopping_change_nothing(runs: Runs) -> None:
    run = runs.run()
    run.wait_for(RUNNING)
    offset = run.quiet_moment()
    run.signal(signal.SIGINT, group=True)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
        time.sleep(0.3)
        if run.proc.poll() is None:
            run.signal(sig, group=sig == signal.SIGINT)
    assert run.finish() == 0, run.output[-3000:]
    assert_stopped(run.after(offset))
    runs.assert_clean()


def test_what_a_killed_run_left_is_stopped_by_the_next_run(runs: Runs) -> None:
    crashed = runs.run()
    crashed.wait_for(RUNNING)
    orphans = runs.stack.live_recorded()
    assert set(orphans) == {"torchserve", "exporter", "prometheus"}
    crashed.signal(signal.SIGKILL)  # the run itself, not the processes it started
    crashed.finish()
    assert runs.left_running(), "the stack should outlive the killed run"
    assert not runs.stack.held()
    # The next run stops them (they are recorded, with their start times) and starts afresh.
    run = runs.run()
    run.wait_for(RUNNING)
    assert run.after(0)[0] == (
        "stopped what a run that is gone left running: exporter, prometheus, torchserve"
    )
    for pid in orphans.values():
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    _served(runs)
    offset = run.quiet_moment()
    run.signal(signal.SIGTERM)
    assert run.finish() == 0
    assert_stopped(run.after(offset))
    runs.assert_clean()


def test_hookwatch_stop_clears_what_a_killed_run_left(runs: Runs) -> None:
    crashed = runs.run()
    crashed.wait_for(RUNNING)
    crashed.signal(signal.SIGKILL)
    crashed.finish()
    stop = runs.hookwatch("stop")
    assert stop.finish() == 0, stop.output
    assert stop.after(0) == [
        "stopped exporter, prometheus, torchserve (left running by a run that is gone)"
    ]
    runs.assert_clean()
