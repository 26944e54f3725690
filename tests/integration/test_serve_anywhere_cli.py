"""hookwatch serve and --version from any folder, run as a user runs the command (moved from
tests/unit/test_serve_anywhere.py: each runs hookwatch in a process of its own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.helpers import hookwatch
from tests.unit.test_serve_anywhere import a_mar

pytestmark = pytest.mark.integration


def test_a_mar_that_is_not_hookwatchs_is_one_line(tmp_path: Path) -> None:
    a_mar(tmp_path / "plain.mar", None)
    a_mar(tmp_path / "other.mar", "from ts.torch_handler.base_handler import BaseHandler")
    (tmp_path / "junk.mar").write_text("not a zip")
    for name, expected in (
        ("plain.mar", "expected a .mar built by `hookwatch archive`"),
        ("other.mar", "got other.mar with handler 'handler.py'"),
        ("junk.mar", "expected a TorchServe .mar at junk.mar, got BadZipFile"),
    ):
        done = hookwatch("serve", name, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert expected in done.stderr, done.stderr
    assert not (tmp_path / ".run").exists()


def test_an_unwritable_run_directory_is_one_line(tmp_path: Path) -> None:
    mar = a_mar(tmp_path / "m.mar", "from hookwatch.torchserve import HookwatchHandler")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = hookwatch(
        "serve", str(mar), cwd=tmp_path, env={"HOOKWATCH_RUN_DIR": str(blocker / "run")}
    )
    assert done.returncode == 2
    assert "error: expected a writable run directory (--run-dir or HOOKWATCH_RUN_DIR), got" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_serve_without_java_says_so_before_starting_anything(tmp_path: Path) -> None:
    mar = a_mar(tmp_path / "m.mar", "from hookwatch.torchserve import HookwatchHandler")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # A PATH with Python and the venv's torchserve, and no java and no prometheus.
    (bindir / "python").symlink_to(sys.executable)
    done = hookwatch("serve", str(mar), cwd=tmp_path, env={"PATH": str(bindir)})
    assert done.returncode == 1
    assert "expected 'java' on PATH, found none: install a Java runtime" in done.stderr
    assert "expected 'prometheus' on PATH" in done.stderr
    assert not (tmp_path / ".run" / "pids.json").exists()


def test_version() -> None:
    from hookwatch import __version__

    done = hookwatch("--version", cwd=Path.cwd())
    assert done.returncode == 0 and done.stdout.strip() == f"hookwatch {__version__}"
