"""`hookwatch serve` from any folder: what it writes into its run directory, and the one line a
user gets for a machine without Java or Prometheus, a .mar that is not hookwatch's, or a run
directory it cannot write. The served walk-through from the installed wheel is
tests/integration/test_walkthrough.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from hookwatch.tools import assets, devstack
from hookwatch.tools.devstack import Ports, Stack


def hookwatch(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if k not in ("HOOKWATCH_DEBUG", "HOOKWATCH_RUN_DIR")
    }
    return subprocess.run(
        [sys.executable, "-m", "hookwatch.tools.cli", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def a_mar(path: Path, handler_source: str | None) -> Path:
    """A minimal archive: a manifest and, if given, its handler file."""
    model = {"modelName": path.stem}
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        if handler_source is not None:
            model["handler"] = "handler.py"
            archive.writestr("handler.py", handler_source)
        else:
            model["handler"] = "image_classifier"
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": model}))
    return path


def test_the_run_directory_holds_what_the_stack_reads(tmp_path: Path) -> None:
    mar = a_mar(tmp_path / "elsewhere" / "m.mar", "from hookwatch.torchserve import X")
    run = tmp_path / "run"
    stack = Stack(root=tmp_path / "no-checkout", run_dir=run, ports=Ports.free(), mar_files=[mar])
    run.mkdir()
    stack._link_mar_files()
    assert (run / "model-store" / "m.mar").resolve() == mar.resolve()
    config = stack._render_ts_config().read_text()
    assert f"model_store={run / 'model-store'}" in config
    # The package's TorchServe config, with every key but the overridden ones as it is.
    assert "metrics_mode=prometheus" in config and "enable_model_api=true" in config
    rendered = yaml.safe_load(stack.render_prometheus_config().read_text())
    assert rendered["rule_files"] == [str(run / "rules" / "*.yml")]
    copied = sorted(p.name for p in (run / "rules").glob("*.yml"))
    assert copied == sorted(p.name for p in assets.RULES.glob("*.yml")) and copied


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


def test_missing_system_parts_name_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    monkeypatch.setattr(devstack.sys, "executable", str(tmp_path / "python"))
    lines = devstack.missing_parts()
    assert lines == [
        "expected 'torchserve', found none: pip install 'hookwatch[torchserve]'",
        "expected 'java' on PATH, found none: install a Java runtime for TorchServe's frontend "
        "(apt-get install openjdk-17-jre-headless)",
        "expected 'prometheus' on PATH, found none: install Prometheus (apt-get install "
        "prometheus, or its release binary on PATH)",
    ]
    with pytest.raises(FileNotFoundError, match="install Prometheus"):
        devstack.require_binary("prometheus")


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
