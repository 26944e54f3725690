"""docs/deploy.md, "Add hookwatch to the TorchServe you already run", done as written with no
hookwatch launcher: the test's own config.properties, a .mar from `hookwatch archive`, a plain
`torchserve --start` with PROMETHEUS_MULTIPROC_DIR set to an empty directory, `hookwatch
exporter` beside it, and a real Prometheus loaded with what `hookwatch export-monitoring` writes
(renamed jobs, a namespace label). It checks that the exported rules pass promtool and load,
per-layer series, and a drift alarm after a shift in the inputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest

from hookwatch.tools.devstack import Ports, http_get
from tests.conftest import require_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MODEL = "regression"
EXPORTER_JOB, TORCHSERVE_JOB, NAMESPACE = "hw-exporter", "ts-metrics", "serving"


def _http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    status, answer, _ = _http_typed(method, url, body)
    return status, answer


def _http_typed(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes, str]:
    """Status, body and Content-Type of one request."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type", "")


def _eventually(check: Callable[[], Any], timeout: float, what: str, logs: list[Path]) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            return check()
        except (AssertionError, OSError, KeyError, ValueError) as error:
            last = error
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in logs if p.exists())
    pytest.fail(f"{what}: not within {timeout:.0f} s ({last!r})\n{tails}")


class Processes:
    """What the test starts, each in its own session; stopped by process group."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._files: list[IO[bytes]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        out = (self.logs / f"{name}.out").open("wb")
        self._files.append(out)
        self.procs[name] = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def alive(self, name: str) -> None:
        code = self.procs[name].poll()
        assert code is None, f"{name} exited with {code}"

    def stop(self) -> None:
        for proc in reversed(self.procs.values()):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            # TorchServe's workers are in its process group; a leftover one is killed too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for f in self._files:
            f.close()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Processes(logs)
    try:
        yield procs
    finally:
        procs.stop()


def _run(*cmd: str | Path, cwd: Path) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    status, body = http_get(
        f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(promql)}"
    )
    assert status == 200, body[:300]
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


def test_hookwatch_added_to_a_plain_torchserve(tmp_path: Path, processes: Processes) -> None:
    require_binary("java")
    prometheus = require_binary("prometheus")
    promtool = require_binary("promtool")
    torchserve = BIN / "torchserve"
    hookwatch = BIN / "hookwatch"
    assert torchserve.exists() and hookwatch.exists(), "expected the venv's torchserve/hookwatch"
    ports = Ports.free()
    logs = processes.logs

    # 1. The model archived with `hookwatch archive`, as a user does.
    _run(sys.executable, ROOT / "models/regression/make_data.py", tmp_path / "data", cwd=tmp_path)
    store = tmp_path / "model-store"
    _run(
        hookwatch, "archive", ROOT / "models/regression/model.py:RegressionMLP",
        "--model-args", '{"inputs": 8}', "--name", MODEL,
        "--config", ROOT / "models/regression/model-config.yaml",
        "--reference", tmp_path / "data/reference.jsonl", "--out", store,
        cwd=tmp_path,
    )  # fmt: skip
    assert (store / f"{MODEL}.mar").exists()

    # 2. The user's own TorchServe: their config.properties, nothing of hookwatch's.
    java_tmp = tmp_path / "java-tmp"
    java_tmp.mkdir()
    config = tmp_path / "config.properties"
    config.write_text(
        "\n".join(
            [
                f"inference_address=http://127.0.0.1:{ports.inference}",
                f"management_address=http://127.0.0.1:{ports.management}",
                f"metrics_address=http://127.0.0.1:{ports.metrics}",
                f"grpc_inference_port={ports.grpc_inference}",
                f"grpc_management_port={ports.grpc_management}",
                "metrics_mode=prometheus",
                f"model_store={store}",
                f"load_models={MODEL}.mar",
                "default_workers_per_model=1",
                "disable_token_authorization=true",
                "install_py_dep_per_model=false",
                f"vmargs=-Djava.io.tmpdir={java_tmp} -XX:+UseSerialGC -Xmx512m",
            ]
        )
        + "\n"
    )
    metrics_dir = tmp_path / "multiproc"
    metrics_dir.mkdir()  # empty when TorchServe starts
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "TMPDIR": str(java_tmp),
        "LOG_LOCATION": str(logs),
        "METRICS_LOCATION": str(logs),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    processes.start(
        "torchserve",
        [str(torchserve), "--start", "--foreground", "--ncs", "--ts-config", str(config)],
        env,
        tmp_path,
    )
    # 3. The exporter beside it, reading the same directory (same host, same pid namespace).
    exporter_env = {k: v for k, v in env.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    processes.start(
        "exporter",
        [str(hookwatch), "exporter", "--dir", str(metrics_dir), "--port", str(ports.exporter)],
        exporter_env,
        tmp_path,
    )

    # 4. The monitoring for the user's Prometheus, with their job names and namespace.
    exported = tmp_path / "monitoring"
    _run(
        hookwatch, "export-monitoring", exported,
        "--exporter-target", f"127.0.0.1:{ports.exporter}",
        "--torchserve-target", f"127.0.0.1:{ports.metrics}",
        "--exporter-job", EXPORTER_JOB, "--torchserve-job", TORCHSERVE_JOB,
        "--namespace", NAMESPACE, "--scrape-interval", "1s",
        cwd=tmp_path,
    )  # fmt: skip
    rules = sorted((exported / "prometheus/rules").glob("*.yml"))
    assert len(rules) >= 3
    checked = _run(promtool, "check", "rules", *rules, cwd=tmp_path)
    assert checked.count("SUCCESS") == len(rules), checked
    processes.start(
        "prometheus",
        [
            prometheus,
            f"--config.file={exported / 'prometheus/prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{ports.prometheus}",
        ],
        exporter_env,
        tmp_path,
    )
    all_logs = sorted(logs.glob("*"))

    # 5. Ready: the model's worker, not /ping (which answers before any model loads).
    def model_ready() -> None:
        processes.alive("torchserve")
        status, body = http_get(f"http://127.0.0.1:{ports.management}/models/{MODEL}")
        assert status == 200, body[:200]
        workers = json.loads(body)[0]["workers"]
        assert any(w["status"] == "READY" for w in workers), workers

    _eventually(model_ready, 180, "TorchServe's model ready", all_logs)

    def send(rows: np.ndarray) -> None:
        url = f"http://127.0.0.1:{ports.inference}/predictions/{MODEL}"
        for row in rows:
            status, body, kind = _http_typed(
                "POST", url, json.dumps({"data": row.tolist()}).encode()
            )
            # Answers are JSON and say so (TorchServe alone sends no Content-Type).
            assert status == 200 and kind == "application/json", (kind, body[:300])
            assert "values" in json.loads(body)

    rng = np.random.default_rng(1)
    loc = np.array([0, 1, 2, 3, 0, 0, -1, 5], dtype=float)
    send(rng.normal(loc=loc, scale=1.0, size=(120, 8)).round(4))

    # Both jobs scraped under the user's names, with the namespace label; the rules loaded.
    def scraped() -> None:
        processes.alive("exporter")
        processes.alive("prometheus")
        up = _query(ports.prometheus, f'up{{namespace="{NAMESPACE}"}} == 1')
        assert {r["metric"]["job"] for r in up} == {EXPORTER_JOB, TORCHSERVE_JOB}, up
        status, body = http_get(f"http://127.0.0.1:{ports.prometheus}/api/v1/rules")
        assert status == 200, body[:300]
        groups = json.loads(body)["data"]["groups"]
        assert groups and all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
        assert {Path(g["file"]).name for g in groups} == {p.name for p in rules}

    _eventually(scraped, 60, "both jobs up in Prometheus and the rules loaded", all_logs)

    # Series per watched layer, read back from Prometheus.
    def per_layer() -> set[str]:
        result = _query(
            ports.prometheus,
            f'count by (layer) (hookwatch_activation_statistic_count{{model="{MODEL}",'
            f'statistic="mean",job="{EXPORTER_JOB}"}})',
        )
        layers = {r["metric"]["layer"] for r in result}
        # The two GELUs (layer_types: [GELU]), the input and the output head.
        assert len(layers) >= 4 and {"input", "output"} <= layers, layers
        return layers

    _eventually(per_layer, 60, "per-layer activation series in Prometheus", all_logs)
    drifted = f'max by (level) (hookwatch_drift_detected{{model="{MODEL}"}}) == 1'
    assert _query(ports.prometheus, drifted) == [], "drift on clean traffic"

    # 6. Shifted inputs: every feature 4 standard deviations off. The drift alarm shows.
    send(rng.normal(loc=loc + 4.0, scale=1.0, size=(120, 8)).round(4))

    def drift() -> None:
        levels = {r["metric"]["level"] for r in _query(ports.prometheus, drifted)}
        assert "input" in levels, levels
        alarms = _query(
            ports.prometheus, f'sum(hookwatch_drift_alarms_total{{model="{MODEL}"}}) > 0'
        )
        assert alarms, "no drift alarm counted"

    _eventually(drift, 60, "a drift alarm in Prometheus after the shift", all_logs)
