"""The public API: its names, their signatures and docstrings against docs/api.md, what
importing them loads, and docs/api.md's example, run."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
import traceback
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
from tests.fakes import FakeContext, load_handler

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


def test_public_names_are_exactly_the_documented_ones() -> None:
    doc = API_DOC.read_text()
    for name in hookwatch.__all__:
        assert hasattr(hookwatch, name), name
        if name != "__version__":
            assert f"`{name}" in doc, f"{name} is public but docs/api.md does not list it"
    assert len(hookwatch.__all__) <= 13


#: A signature in docs/api.md's table: ``name(params)`` or ``Owner.name(params)``, backticked.
SIGNATURE = re.compile(r"`([A-Za-z_][\w.]*)\(([^`]*)\)(?: -> [\w.]+)?`")
NO_DEFAULT = object()


def api_table() -> list[tuple[str, str]]:
    """docs/api.md's table of public names: (first column, second column) per row."""
    doc = API_DOC.read_text()
    table = doc[doc.index("| name | what it is |") :].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    return [tuple(cell.strip() for cell in row.strip("|").split(" | ", 1)) for row in rows]  # type: ignore[misc]


def documented_signatures() -> list[tuple[str, Any, str]]:
    """(where, object, documented parameters) of every signature in the table.

    A name without an owner is looked up on the row's class (``request`` in the ``Monitor``
    row), else in ``hookwatch``; ``Owner.name`` from ``hookwatch.Owner``.
    """
    found = []
    for first, second in api_table():
        owner_name = re.fullmatch(r"`(\w+)`", first)
        owner = getattr(hookwatch, owner_name.group(1)) if owner_name else None
        for name, params in SIGNATURE.findall(f"{first} {second}"):
            if "." in name:
                head, attr = name.split(".", 1)
                obj = getattr(getattr(hookwatch, head), attr)
            elif owner is not None and name in vars(owner):
                obj = getattr(owner, name)
            else:
                assert name in hookwatch.__all__, f"docs/api.md documents {name}(), not public"
                obj = getattr(hookwatch, name)
            found.append((f"{name}({params})", obj, params))
    return found


def doc_parameters(params: str) -> tuple[list[tuple[str, str, Any]], bool]:
    """(name, kind, default or NO_DEFAULT) per documented parameter; True when it ends in
    ``...`` (the rest are keywords documented elsewhere)."""
    partial = params.rstrip().endswith("...")
    if partial:
        params = params.rstrip()[:-3].rstrip().rstrip(",")
    args = ast.parse(f"def f({params}): pass").body[0].args  # type: ignore[attr-defined]
    out: list[tuple[str, str, Any]] = []
    positional = args.args
    defaults = [NO_DEFAULT] * (len(positional) - len(args.defaults)) + [
        ast.literal_eval(d) for d in args.defaults
    ]
    for arg, default in zip(positional, defaults, strict=True):
        out.append((arg.arg, "POSITIONAL_OR_KEYWORD", default))
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        value = NO_DEFAULT if kw_default is None else ast.literal_eval(kw_default)
        out.append((arg.arg, "KEYWORD_ONLY", value))
    return out, partial


def test_the_table_lists_every_public_callable_with_its_signature() -> None:
    def key(obj: Any) -> int:
        return id(getattr(obj, "__func__", obj))  # a classmethod is bound anew each time

    documented = {key(obj) for _, obj, _ in documented_signatures()}
    for name in ("watch", "build_profile", "serve_metrics", "MetricSet"):
        assert key(getattr(hookwatch, name)) in documented, name
    methods = [
        hookwatch.Monitor.request,
        hookwatch.Monitor.reject,
        hookwatch.Monitor.receive,
        hookwatch.Monitor.answered,
        hookwatch.Monitor.flush,
        hookwatch.Monitor.close,
        hookwatch.DriftProfile.save,
        hookwatch.DriftProfile.load,
        hookwatch.MonitoringConfig.from_mapping,
        hookwatch.MetricsServer.close,
    ]
    for method in methods:
        assert key(method) in documented, method.__qualname__


@pytest.mark.parametrize(
    ("where", "obj", "params"),
    [pytest.param(*found, id=found[0]) for found in documented_signatures()],
)
def test_each_documented_signature_is_the_code_s(where: str, obj: Any, params: str) -> None:
    expected, partial = doc_parameters(params)
    actual = [
        p for p in inspect.signature(obj).parameters.values() if p.name not in ("self", "cls")
    ]
    if partial:
        actual = actual[: len(expected)]
    assert [(name, kind) for name, kind, _ in expected] == [
        (p.name, p.kind.name) for p in actual
    ], f"docs/api.md says {where}, the code {inspect.signature(obj)}"
    for (name, _, default), parameter in zip(expected, actual, strict=True):
        if default is not NO_DEFAULT:
            assert parameter.default == default, f"{where}: {name}={parameter.default!r}"


def public_objects() -> dict[str, Any]:
    return {name: getattr(hookwatch, name) for name in hookwatch.__all__ if name != "__version__"}


def test_every_public_name_and_documented_method_has_a_usage_example() -> None:
    """A docstring with a literal block (``::``) whose code uses the name."""
    targets = {name: obj for name, obj in public_objects().items()}
    for where, obj, _ in documented_signatures():
        targets[where.split("(")[0]] = obj
    for where, obj in targets.items():
        doc = inspect.getdoc(obj) or ""
        example = re.search(r"::\n\n((?:    .*\n?|\n)+)", doc)
        assert example, f"{where} has no usage example in its docstring"
        short = where.rsplit(".", 1)[-1]
        assert short in example.group(1), f"{where}'s example does not use it"


def test_public_names_say_they_are_hookwatch_however_they_were_imported() -> None:
    for name, obj in public_objects().items():
        assert obj.__module__ == "hookwatch", name
    assert repr(hookwatch.Monitor) == "<class 'hookwatch.Monitor'>"
    line = traceback.format_exception_only(hookwatch.ConfigError("expected x, got y"))
    assert line == ["hookwatch.ConfigError: expected x, got y\n"]
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


def test_one_exception_hierarchy_under_hookwatch_error() -> None:
    errors = [obj for obj in public_objects().values() if isinstance(obj, type)]
    errors = [e for e in errors if issubclass(e, BaseException)]
    assert {e.__name__ for e in errors} == {
        "HookwatchError",
        "ConfigError",
        "ProfileError",
        "BadInputError",
    }
    assert all(issubclass(e, hookwatch.HookwatchError) for e in errors)
    # A profile that cannot be used fails the load as a configuration does; existing
    # ``except ValueError`` around profile reading still holds.
    assert issubclass(hookwatch.ProfileError, hookwatch.ConfigError)
    assert issubclass(hookwatch.ProfileError, ValueError)
    assert not issubclass(hookwatch.BadInputError, hookwatch.ConfigError)


def test_a_monitor_shows_only_its_documented_face() -> None:
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with hookwatch.watch(model, {"layers": ["1"]}, "face", metrics=MetricSet()) as monitor:
        public = {name for name in dir(monitor) if not name.startswith("_")}
    assert public == {
        "answered",
        "close",
        "config",
        "flush",
        "model_name",
        "receive",
        "reject",
        "request",
    }


def test_the_core_install_asks_for_four_packages_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=\[ ]", dep)[0] for dep in project["dependencies"]]
    assert sorted(names) == ["numpy", "prometheus-client", "pyyaml", "torch"]
    assert set(project["optional-dependencies"]) >= {"torchserve", "tools", "eval", "dev"}


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
    # last one a reject) have arrived; a publish can fall between any two requests.
    expected = (
        'hookwatch_requests_total{model="tabular"} 122.0',  # 1 probe + 60 x 2 + the 400
        'hookwatch_requests_rejected_total{model="tabular",reason="other"} 1.0',
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
            handler.handle([{"body": {"data": row}} for row in rows], context)
        handler.handle([{"body": {"data": [1, 2, 3]}}], context)
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
