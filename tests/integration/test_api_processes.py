"""The public API in fresh processes: names and imports as a user's interpreter sees them, and
docs/api.md's example started as a user starts it (moved from tests/unit/test_api.py: they start
processes and servers)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import hookwatch
from hookwatch._metrics import MetricSet
from hookwatch.tools.devstack import Ports
from tests.fakes import FakeContext, handled, load_handler

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
API_DOC = ROOT / "docs" / "api.md"
#: What a serving process must never need: tools, evaluation, TorchServe and text dependencies.
HEAVY = ("sklearn", "scipy", "tqdm", "psutil", "ts", "model_archiver", "transformers", "tokenizers")
#: A meta-path finder that makes the heavy packages unimportable, as on a core-only install.
BLOCKER = textwrap.dedent(
    f"""
    import sys

    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {HEAVY!r}:
                raise ImportError(f"{{name}} is not installed (core-only install)")
            return None

    sys.meta_path.insert(0, _Block())
    """
)


def example_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", API_DOC.read_text(), re.S)
    assert blocks, "docs/api.md has no python example"
    return str(blocks[0])


def test_public_names_say_they_are_hookwatch_reached_through_their_own_module() -> None:
    # Reached through its own module first, in a fresh process: the same name.
    code = (
        "from hookwatch._monitor.monitor import Monitor\n"
        "from hookwatch._profile import build_profile\n"
        "from hookwatch._config import MonitoringConfig\n"
        "assert Monitor.__module__ == build_profile.__module__ == 'hookwatch'\n"
        "assert MonitoringConfig.__module__ == 'hookwatch'\n"
        "import pickle, hookwatch\n"
        "config = MonitoringConfig(layers=('act',))\n"
        "assert pickle.loads(pickle.dumps(config)) == config\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_importing_every_public_name_pulls_in_no_tool_or_torchserve_module() -> None:
    code = BLOCKER + textwrap.dedent(
        f"""
        import hookwatch
        # Nothing loads before a name is used: tools and the exporter's environment rely on it.
        assert "torch" not in sys.modules and "prometheus_client" not in sys.modules
        for name in hookwatch.__all__:
            getattr(hookwatch, name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        assert not loaded, loaded
        assert not any(m.startswith("hookwatch.tools") for m in sys.modules)
        try:
            import hookwatch.torchserve
        except ImportError as error:
            assert "hookwatch[torchserve]" in str(error), error
        else:
            raise AssertionError("hookwatch.torchserve imported without TorchServe")
        # The service imports without the text extra; a text model says what is missing.
        from hookwatch._config import InputSpec
        from hookwatch._errors import ConfigError
        from hookwatch._service import make_pipeline
        try:
            make_pipeline(InputSpec.from_mapping({{"text": {{"tokenizer": "models"}}}}), ".")
        except ConfigError as error:
            assert "pip install 'hookwatch[text]'" in str(error), error
        else:
            raise AssertionError("a text pipeline without transformers")
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def _post(url: str, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None


def series(text: str, model: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(sample name, labels) of one model's hookwatch series, leaving out ``_created``.

    The per-bin drift series keep their label names but not their feature/bin values: which
    bins exist depends on the reference data, not on the code that exports them.
    """
    out: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("hookwatch_") or sample.name.endswith("_created"):
                continue
            if sample.labels.get("model") != model:
                continue
            labels = {k: ("*" if k in ("feature", "bin") else v) for k, v in sample.labels.items()}
            out.add((sample.name, tuple(sorted(labels.items()))))
    return out


@pytest.fixture
def example(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """docs/api.md's example, started as a user would start it, on free loopback ports."""
    ports = Ports.free()
    app, metrics = ports.inference, ports.exporter
    script = tmp_path / "app.py"
    script.write_text(BLOCKER + example_code())  # as on a core-only install
    env = {**os.environ, "PORT": str(app), "METRICS_PORT": str(metrics)}
    process = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"http://127.0.0.1:{metrics}/metrics", timeout=1)
                _post(f"http://127.0.0.1:{app}/", b'{"data": [[0, 0, 0, 0]]}')
                break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    output = process.stdout.read().decode() if process.stdout else ""
                    pytest.fail(f"the example did not start: {output[-2000:]}")
                time.sleep(0.2)
        yield app, metrics
    finally:
        process.terminate()
        process.wait(10)


def test_the_api_example_serves_and_exports_what_the_torchserve_handler_does(
    example: tuple[int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, metrics_port = example
    generator = torch.Generator().manual_seed(1)
    bodies = [
        json.dumps({"data": torch.randn(2, 4, generator=generator).tolist()}).encode()
        for _ in range(60)
    ]
    for body in bodies:
        status, answer = _post(f"http://127.0.0.1:{app}/", body)
        assert status == 200 and len(answer["class"]) == 2
    assert _post(f"http://127.0.0.1:{app}/", b'{"data": [1, 2, 3]}')[0] == 400
    # Published every flush_interval_s (1 s): wait until the counts of every request (the
    # last one a reject) have arrived; a publish can fall between any two requests. The
    # captures come with the drain after the traffic stops (under traffic, fewer than 64
    # records wait for up to 5 s), which can be a publish after the counts.
    expected = (
        'hookwatch_requests_total{model="tabular"} 122.0',  # 1 probe + 60 x 2 + the 400
        'hookwatch_requests_rejected_total{model="tabular",reason="other"} 1.0',
        'hookwatch_captures_total{layer="act",model="tabular"} 121.0',
    )
    deadline = time.monotonic() + 10
    while True:
        text = _get(f"http://127.0.0.1:{metrics_port}/metrics")
        if all(line in text for line in expected) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert expected[0] in text
    assert 'hookwatch_requests_rejected_total{model="tabular",reason="other"} 1.0' in text
    assert 'hookwatch_drift_profile_loaded{model="tabular"} 1.0' in text
    assert 'hookwatch_captures_total{layer="act",model="tabular"} 121.0' in text
    from_example = series(text, "tabular")

    # The same model and monitoring behind the TorchServe handler (BaseHandler, fake context).
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "tabular_model.py").write_text(
        textwrap.dedent(
            """
            from collections import OrderedDict

            from torch import nn


            class Tabular(nn.Sequential):
                def __init__(self) -> None:
                    super().__init__(
                        OrderedDict(fc1=nn.Linear(4, 16), act=nn.ReLU(), fc2=nn.Linear(16, 3))
                    )
            """
        )
    )
    monkeypatch.syspath_prepend(str(model_dir))
    from tabular_model import Tabular  # type: ignore[import-not-found]

    model = Tabular().eval()
    torch.save(model.state_dict(), model_dir / "tabular.pt")
    monitoring = {"layers": ["act"], "sample_rate": 1.0, "drift": {"window": 50}}
    held_out = [torch.randn(64, 4, generator=generator) for _ in range(8)]
    hookwatch.build_profile(model, monitoring, held_out, "tabular").save(
        model_dir / "drift-profile.npz"
    )
    # The handler writes to the process-wide metric set: a fresh one, served like the example's.
    registry_metrics = MetricSet()
    monkeypatch.setattr("hookwatch._metrics.worker._DEFAULT", registry_metrics)
    context = FakeContext(
        model_dir,
        {"handler": {"input": {"shape": [4]}, "monitoring": monitoring}},
        model_name="tabular",
        serialized_file="tabular.pt",
        model_file="tabular_model.py",
    )
    handler = load_handler("hookwatch_handler")()
    handler.initialize(context)
    try:
        for body in bodies:
            rows = json.loads(body)["data"]
            handled(handler, [{"body": {"data": row}} for row in rows], context)
        handled(handler, [{"body": {"data": [1, 2, 3]}}], context)
        handler.service.monitor.flush()
    finally:
        handler.service.close()
    with hookwatch.serve_metrics(0, metrics=registry_metrics) as server:
        from_handler = series(_get(server.url), "tabular")
    names = {name for name, _ in from_example}
    # Every kind of series is there: counts, statistics, drift verdicts and fleet bins.
    assert {
        "hookwatch_requests_total",
        "hookwatch_activation_statistic_count",
        "hookwatch_drift_score",
        "hookwatch_drift_bin_samples_total",
    } <= names, names
    assert from_example == from_handler


def test_a_process_writing_metric_files_serves_its_own_request_counts(tmp_path: Path) -> None:
    """`serve_metrics(port)` in a process with PROMETHEUS_MULTIPROC_DIR set (one of several
    processes of an own server) served its request counters as 0: they live in the count
    slot files, never in the registry (found by an outside run, 2026-12-07). It now serves
    the process's own files merged; the exporter still merges every process's."""
    code = textwrap.dedent(
        """
        import urllib.request
        import torch
        from torch import nn
        import hookwatch

        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
        monitor = hookwatch.watch(model, {"layers": ["1"], "sample_rate": 1.0}, name="files")
        for _ in range(7):
            with torch.inference_mode(), monitor.request(2):
                model(torch.randn(2, 4))
        monitor.flush()
        with hookwatch.serve_metrics(0) as server:
            print(urllib.request.urlopen(server.url, timeout=10).read().decode())
        monitor.close()
        """
    )
    directory = tmp_path / "metrics"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    samples = {
        (s.name, s.labels.get("layer", "")): s.value
        for family in text_string_to_metric_families(done.stdout)
        for s in family.samples
        if s.labels.get("model") == "files"
    }
    assert samples[("hookwatch_requests_total", "")] == 14, samples
    assert samples[("hookwatch_requests_sampled_total", "")] == 14
    assert samples[("hookwatch_captures_total", "1")] >= 1
