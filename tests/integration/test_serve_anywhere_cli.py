"""hookwatch serve and --version from any folder, run as a user runs the command (moved from
tests/unit/test_serve_anywhere.py: each runs hookwatch in a process of its own)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import PORT_ENV, Ports
from tests.conftest import require
from tests.integration.helpers import MAR, hookwatch
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


def test_serve_sends_the_user_s_request_files_and_checks_their_labels(tmp_path: Path) -> None:
    """`serve --traffic clean.jsonl:shifted.jsonl` on the demo's archive: the clean bodies,
    then the shifted ones, every one answered, the labelled ones checked (the summary's
    accuracy), and a missing file refused in one line before anything starts."""
    require(MAR.is_file(), f"{MAR} (make mar builds it)")
    split = load_split()
    clean, shifted = tmp_path / "clean.jsonl", tmp_path / "shifted.jsonl"
    clean.write_text(
        "".join(
            json.dumps({"data": x.tolist(), "label": int(y)}) + "\n"
            for x, y in zip(split.x_test[:60], split.y_test[:60], strict=True)
        )
    )
    shifted.write_text(
        "".join(json.dumps({"data": (16 - x).tolist()}) + "\n" for x in split.x_test[:60])
    )
    missing = hookwatch("serve", str(MAR), "--traffic", "clean.jsonl:none.jsonl", cwd=tmp_path)
    assert missing.returncode == 2 and "expected a readable .jsonl file" in missing.stderr
    assert missing.stderr.count("\n") == 1 and not (tmp_path / ".run").exists()
    ports = Ports.free()
    env = {PORT_ENV[f]: str(getattr(ports, f)) for f in PORT_ENV}
    done = hookwatch(
        "serve",
        str(MAR),
        "--traffic",
        "clean.jsonl:shifted.jsonl",
        "--rate",
        "10",
        "--drift-after",
        "12",
        "--seconds",
        "25",
        "--no-report",
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sending clean.jsonl at 10/s, shifted.jsonl after 12 s" in done.stdout
    summary = done.stdout[done.stdout.index("run summary") :]
    sent = re.search(r"(\d+) requests sent, (\d+) answered", summary)
    assert sent is not None and sent.group(1) == sent.group(2) and int(sent.group(1)) > 100
    assert "shifted.jsonl from" in summary
    accuracy = re.search(r"accuracy \(labels known\): clean\.jsonl (\d+) %", summary)
    assert accuracy is not None and int(accuracy.group(1)) >= 80, summary
