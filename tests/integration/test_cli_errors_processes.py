"""A user's mistake on the command line, from `python -m hookwatch.tools.cli` in a process of
its own: one line on stderr, exit status 2, no traceback (moved from
tests/unit/test_cli_errors.py: each test runs the command as a process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.helpers import hookwatch
from tests.unit.test_cli_errors import _free_port

pytestmark = pytest.mark.integration


def test_the_issues_offenders_in_a_real_process() -> None:
    """`hookwatch units` without Prometheus and `hookwatch profile --mar /nonexistent.mar`: one
    line each on stderr, from the installed entry point's module, exit 2."""
    port = _free_port()
    for args in (
        ("units", "--prometheus", f"http://127.0.0.1:{port}"),
        ("profile", "--mar", "/nonexistent.mar"),
    ):
        done = hookwatch(*args)
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"hookwatch {args[0]}: error: "), done.stderr
        assert "expected" in done.stderr and "Errno" not in done.stderr, done.stderr


def test_report_without_prometheus_says_where_it_looked(tmp_path: Path) -> None:
    port = _free_port()
    done = hookwatch("report", "--prometheus", f"http://127.0.0.1:{port}", "--out", str(tmp_path))
    assert done.returncode == 2, done
    assert done.stderr.strip() == (
        f"hookwatch report: error: expected Prometheus at http://127.0.0.1:{port}, got no answer "
        "(Connection refused): is Prometheus running (`hookwatch serve` starts one)? "
        "else pass --prometheus URL"
    )
    assert not (tmp_path / "index.html").exists()
