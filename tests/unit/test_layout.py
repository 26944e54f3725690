"""The package's architecture, checked on its import statements.

Dependencies point one way (adapters → monitor → hooks, stats, drift, capture, metrics); one
module imports prometheus-client, one imports TorchServe, and the runtime never imports the
tools.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hookwatch"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}
RUNTIME = {name for name in MODULES if not name.startswith("hookwatch.tools")}


def importers(prefix: str) -> set[str]:
    return {
        name
        for name, imported in MODULES.items()
        if any(i == prefix or i.startswith(prefix + ".") for i in imported)
    }


def test_one_module_imports_prometheus_client() -> None:
    assert importers("prometheus_client") == {"hookwatch._metrics"}


def test_one_module_imports_torchserve() -> None:
    assert importers("ts") == {"hookwatch.torchserve"}
    assert not importers("model_archiver")


def test_one_module_imports_transformers_and_only_inside_a_function() -> None:
    assert importers("transformers") == {"hookwatch._text"}
    tree = ast.parse((PACKAGE / "_text.py").read_text())
    top = {
        alias.name if isinstance(node, ast.Import) else node.module
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    # The core imports without the text extra: transformers only when a tokenizer is loaded.
    assert not any(str(name).startswith("transformers") for name in top)


def test_the_runtime_never_imports_the_tools_or_the_adapter() -> None:
    for name in RUNTIME - {"hookwatch.torchserve"}:
        assert not any(i.startswith("hookwatch.tools") for i in MODULES[name]), name
        assert "hookwatch.torchserve" not in MODULES[name], name


def test_runtime_third_party_imports_are_the_core_dependencies() -> None:
    allowed = {"torch", "numpy", "prometheus_client", "yaml", "hookwatch", "ts", "tqdm"}
    for name in RUNTIME:
        third_party = {
            i.split(".")[0]
            for i in MODULES[name]
            if i.split(".")[0] not in __import__("sys").stdlib_module_names
        }
        # tqdm: an optional progress bar in build_profile, imported only when installed;
        # transformers: the text extra, in hookwatch._text only.
        extra = {"transformers"} if name == "hookwatch._text" else set()
        assert third_party <= allowed | extra, (name, third_party - allowed)


def test_dependencies_point_one_way() -> None:
    # What each layer of the core may import from hookwatch (besides itself and _names).
    may_import = {
        # Pure numpy statistics; the drift tracker carries the reference units to the monitor.
        "hookwatch._drift": {"hookwatch._views"},
        "hookwatch._views": set(),
        "hookwatch._stats": set(),
        "hookwatch._capture": set(),
        "hookwatch._catalogue": set(),
        "hookwatch._errors": set(),
        "hookwatch._config": {"hookwatch._errors"},
        "hookwatch._hooks": {"hookwatch._config", "hookwatch._errors", "hookwatch._stats"},
        # The exporter logs its housekeeping faults through the capture module's rate limit.
        "hookwatch._metrics": {"hookwatch._catalogue", "hookwatch._capture"},
        "hookwatch._text": {"hookwatch._config", "hookwatch._errors"},
        "hookwatch._profile": {
            "hookwatch._config",
            "hookwatch._drift",
            "hookwatch._errors",
            "hookwatch._hooks",
            "hookwatch._stats",
            "hookwatch._views",
        },
        "hookwatch._monitor": {
            "hookwatch",
            "hookwatch._capture",
            "hookwatch._catalogue",
            "hookwatch._config",
            "hookwatch._drift",
            "hookwatch._hooks",
            "hookwatch._metrics",
            "hookwatch._stats",
            "hookwatch._views",
        },
    }
    for name in RUNTIME:
        layer = next((key for key in may_import if name.startswith(key)), None)
        if layer is None:
            continue
        own = {i for i in MODULES[name] if i.startswith("hookwatch")}
        for imported in own:
            top = ".".join(imported.split(".")[:2])
            if top in (layer, "hookwatch._names") or imported.startswith(layer + "."):
                continue
            assert top in may_import[layer], f"{name} imports {imported}"
