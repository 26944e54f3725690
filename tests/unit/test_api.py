"""The public API: its names, their signatures and docstrings against docs/api.md. What
importing them loads in a fresh process, and docs/api.md's example run as a user runs it, are
in tests/integration/test_api_processes.py."""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
import traceback
from pathlib import Path
from typing import Any

import pytest

import hookwatch
from hookwatch._metrics import MetricSet

ROOT = Path(__file__).resolve().parents[2]
API_DOC = ROOT / "docs" / "api.md"


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
    # Reached through their own modules first, in a fresh process:
    # tests/integration/test_api_processes.py.
    for name, obj in public_objects().items():
        assert obj.__module__ == "hookwatch", name
    assert repr(hookwatch.Monitor) == "<class 'hookwatch.Monitor'>"
    line = traceback.format_exception_only(hookwatch.ConfigError("expected x, got y"))
    assert line == ["hookwatch.ConfigError: expected x, got y\n"]


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


def test_the_core_install_asks_for_five_packages_only() -> None:
    # threadpoolctl: the capture thread's accuracy estimate holds numpy's BLAS to one thread
    # (hookwatch._blas.OneBlasThread); without it OpenBLAS spun a core.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=\[ ]", dep)[0] for dep in project["dependencies"]]
    assert sorted(names) == ["numpy", "prometheus-client", "pyyaml", "threadpoolctl", "torch"]
    assert set(project["optional-dependencies"]) >= {"torchserve", "tools", "eval", "dev"}
