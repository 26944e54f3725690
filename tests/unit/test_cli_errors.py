"""A user's mistake on the command line: one line saying what was expected and what came."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGENET = "models/imagenet/model.py:build"
CONFIG = "models/imagenet/model-config.yaml"


def hookwatch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HOOKWATCH_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "hookwatch.tools.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def wrong_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ref") / "ref.npy"
    np.save(path, np.zeros((10, 3, 28, 28), dtype=np.float32))
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("layers", "missing.py:Net", "--input-shape", "3"), "expected a file at missing.py"),
        (("layers", IMAGENET.replace("build", "biuld"), "--input-shape", "3,32,32"), "'biuld'"),
        (("layers", "models/imagenet/model.py", "--input-shape", "3"), "without a name"),
        (("layers", IMAGENET, "--input-shape", "3,28"), "expected the model to accept"),
        (("layers", IMAGENET, "--input-shape", "a,b"), "expected positive integers"),
        (("layers", IMAGENET, "--model-args", "{nope", "--input-shape", "3"), "JSON object"),
        (("serve", "model_store/none.mar"), "expected a .mar file at"),
        (("report", "--since", "yesterday"), "--since: expected Unix seconds or an ISO 8601"),
        (("report", "--prometheus", "localhost:9090"), "expected an http:// or https://"),
        (
            ("archive", IMAGENET, "--name", "x", "--config", "nope.yaml", "--reference", "r.npy"),
            "expected a readable model-config file",
        ),
    ],
)
def test_bad_input_gets_one_line_and_no_traceback(args: tuple[str, ...], message: str) -> None:
    done = hookwatch(*args)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and message in errors[0], done.stderr
    assert errors[0].startswith(f"hookwatch {args[0]}: error: ")
    assert "Traceback" not in done.stderr


def test_a_reference_of_the_wrong_shape_says_which_shape(
    wrong_reference: Path, tmp_path: Path
) -> None:
    done = hookwatch(
        "archive", IMAGENET, "--name", "x", "--config", CONFIG,
        "--reference", str(wrong_reference), "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        "expected an array of shape [N, 3, 32, 32] (handler.input.shape), got [10, 3, 28, 28]"
        in (done.stderr)
    )
    assert "Traceback" not in done.stderr


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "model-config.yaml"
    out.write_text("mine")
    done = hookwatch("init", IMAGENET, "--input-shape", "3,32,32", "--out", str(out))
    assert done.returncode == 2 and "pass --force" in done.stderr
    assert out.read_text() == "mine"


def test_report_without_prometheus_says_where_it_looked(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on once released
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = hookwatch("report", "--prometheus", f"http://127.0.0.1:{port}", "--out", str(tmp_path))
    assert done.returncode == 2, done
    assert done.stderr.strip() == (
        f"hookwatch report: error: expected Prometheus at http://127.0.0.1:{port}, got no answer "
        "([Errno 111] Connection refused)"
    )
    assert not (tmp_path / "index.html").exists()
