"""`hookwatch serve` from any folder: what it writes into its run directory, and what a machine
without Java or Prometheus is missing. The one line a user gets from the command (no Java, a
.mar that is not hookwatch's, a run directory it cannot write) is
tests/integration/test_serve_anywhere_cli.py; the served walk-through from the installed wheel
is tests/integration/test_walkthrough.py."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from hookwatch.tools import assets, devstack
from hookwatch.tools.devstack import Ports, Stack


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
    # A hint of the command to run is said as it is (it read "install pip install ...").
    hint = "pip install 'hookwatch[torchserve]'"
    with pytest.raises(FileNotFoundError, match=r"found none: pip install 'hookwatch\[torch"):
        devstack.require_binary("torchserve", hint)


def test_torchserve_takes_the_bodies_a_large_input_needs(tmp_path: Path) -> None:
    # TorchServe refuses a body over its max_request_size (6.5 MB) before the handler sees
    # it: a [3, 512, 512] model's requests as JSON (up to ~20 MB) need it raised.
    def mar(name: str, handler: dict[str, object]) -> Path:
        path = a_mar(tmp_path / f"{name}.mar", None)
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr("model-config.yaml", yaml.safe_dump({"handler": handler}))
        return path

    small = mar("small", {"input": {"shape": [3, 32, 32]}})
    big = mar("big", {"input": {"shape": [3, 512, 512]}})
    capped = mar("capped", {"input": {"shape": [3, 512, 512], "max_body_bytes": 4096}})

    def rendered(*mars: Path) -> str:
        run = tmp_path / f"run-{len(mars)}-{mars[-1].stem}"
        run.mkdir()
        stack = Stack(root=tmp_path, run_dir=run, ports=Ports.free(), mar_files=list(mars))
        return stack._render_ts_config().read_text()

    assert "max_request_size" not in rendered(small)
    assert "max_request_size" not in rendered(capped)
    assert f"max_request_size={25 * 3 * 512 * 512 + 64}" in rendered(small, big)
