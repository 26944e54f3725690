"""The package's architecture, checked on its import statements.

Dependencies point one way (adapters → monitor → hooks, stats, drift, capture, metrics); one
package imports prometheus-client, one module imports TorchServe, and the runtime never imports the
tools. The repository's harnesses (bench, soak, drift evaluation, docs generators) live in
``dev/``, outside the installed package, and the package never imports them.
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
DEV = PACKAGE.parents[1] / "dev"
RUNTIME = {name for name in MODULES if not name.startswith("hookwatch.tools")}


def importers(prefix: str) -> set[str]:
    return {
        name
        for name, imported in MODULES.items()
        if any(i == prefix or i.startswith(prefix + ".") for i in imported)
    }


def test_one_package_imports_prometheus_client() -> None:
    found = importers("prometheus_client")
    package = "hookwatch._metrics"
    assert found and all(n == package or n.startswith(package + ".") for n in found), found


def test_the_worker_and_the_exporter_halves_of_metrics_stay_apart() -> None:
    # A worker process's metric set and the exporter's merge share only the file format;
    # serving over HTTP (either half) sits above both.
    worker, exporter = "hookwatch._metrics.worker", "hookwatch._metrics.exporter"
    assert not any(i.startswith(exporter) for i in MODULES[worker])
    assert not any(i.startswith(worker) for i in MODULES[exporter])
    for half in (worker, exporter):
        assert not any(i.startswith("hookwatch._metrics.serve") for i in MODULES[half]), half


def test_one_module_imports_torchserve() -> None:
    assert importers("ts") == {"hookwatch.torchserve"}
    assert not importers("model_archiver")


def top_level_imports(path: Path) -> set[str]:
    """What ``path`` imports at its top level, not inside a function."""
    return {
        str(alias.name if isinstance(node, ast.Import) else node.module)
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }


def test_one_module_imports_transformers_and_only_inside_a_function() -> None:
    assert importers("transformers") == {"hookwatch._text"}
    # The core imports without the text extra: transformers only when a tokenizer is loaded.
    assert not any(
        name.startswith("transformers") for name in top_level_imports(PACKAGE / "_text.py")
    )


def test_one_module_imports_pillow_and_only_inside_a_function() -> None:
    # In the runtime; `hookwatch bench` (a tool) also writes JPEGs to send an image model.
    assert importers("PIL") & RUNTIME == {"hookwatch._image"}
    # Pillow comes with TorchServe: the core imports without it, until an image is decoded.
    assert not any(name.startswith("PIL") for name in top_level_imports(PACKAGE / "_image.py"))


def test_the_runtime_never_imports_the_tools_or_the_adapter() -> None:
    for name in RUNTIME - {"hookwatch.torchserve"}:
        assert not any(i.startswith("hookwatch.tools") for i in MODULES[name]), name
        assert "hookwatch.torchserve" not in MODULES[name], name


def test_runtime_third_party_imports_are_the_core_dependencies() -> None:
    allowed = {
        *("torch", "numpy", "prometheus_client", "yaml", "hookwatch", "ts", "tqdm"),
        "threadpoolctl",
    }
    for name in RUNTIME:
        third_party = {
            i.split(".")[0]
            for i in MODULES[name]
            if i.split(".")[0] not in __import__("sys").stdlib_module_names
        }
        # tqdm: an optional progress bar in build_profile, imported only when installed;
        # threadpoolctl: one BLAS thread for the accuracy estimate, likewise optional;
        # transformers: the text extra, in hookwatch._text only.
        # PIL: image requests, in hookwatch._image only (it comes with TorchServe).
        extra = {"hookwatch._text": {"transformers"}, "hookwatch._image": {"PIL"}}.get(name, set())
        assert third_party <= allowed | extra, (name, third_party - allowed)


def test_dependencies_point_one_way() -> None:
    # What each layer of the core may import from hookwatch (besides itself and _names).
    may_import = {
        # Pure numpy statistics; the drift tracker carries the reference units to the monitor.
        "hookwatch._drift": {"hookwatch._blas", "hookwatch._views"},
        "hookwatch._blas": set(),
        "hookwatch._views": set(),
        "hookwatch._stats": set(),
        "hookwatch._capture": set(),
        "hookwatch._catalogue": set(),
        "hookwatch._errors": set(),
        "hookwatch._config": {"hookwatch._errors"},
        # A padded batch tells the hooks its steps' mask (and, beside input.arguments, which
        # argument is padded): read_padded.
        "hookwatch._hooks": {
            "hookwatch._config",
            "hookwatch._errors",
            "hookwatch._padding",
            "hookwatch._stats",
        },
        # The exporter logs its housekeeping faults through the capture module's rate limit.
        "hookwatch._metrics": {"hookwatch._catalogue", "hookwatch._capture"},
        # The one body limit, for tensor and text requests alike.
        "hookwatch._body": {"hookwatch._errors"},
        "hookwatch._text": {"hookwatch._body", "hookwatch._config", "hookwatch._errors"},
        "hookwatch._image": {"hookwatch._errors"},
        # A padded batch of a variable length: plain torch, shared by the service and the
        # profile builder, which runs the reference through it as a worker runs requests.
        "hookwatch._padding": set(),
        "hookwatch._profile": {
            "hookwatch._config",
            "hookwatch._drift",
            "hookwatch._errors",
            "hookwatch._hooks",
            "hookwatch._padding",
            "hookwatch._stats",
            "hookwatch._views",
        },
        "hookwatch._monitor": {
            "hookwatch",
            "hookwatch._blas",
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


#: The repository's harnesses, moved to dev/: none of them may come back into the package.
HARNESSES = (
    "hookwatch.tools.bench.runner",
    "hookwatch.tools.bench.report",
    "hookwatch.tools.bench.variants",
    "hookwatch.tools.bench.micro",
    "hookwatch.tools.bench.naive",
    "hookwatch.tools.bench.drain",
    "hookwatch.tools.bench.profile",
    "hookwatch.tools.bench.scrape",
    "hookwatch.tools.bench.resnet",
    "hookwatch.tools.evaluation",
    "hookwatch.tools.soak",
    "hookwatch.tools.catalogue_docs",
)


def test_the_package_holds_no_repository_harness() -> None:
    for harness in HARNESSES:
        found = {m for m in MODULES if m == harness or m.startswith(harness + ".")}
        assert not found, f"{sorted(found)}: a repository harness belongs in dev/"
    # They are in dev/, run by the make targets with `python -m dev ...`.
    for path in ("bench/runner.py", "bench/report.py", "evaluation/run.py", "soak/runner.py"):
        assert (DEV / path).is_file(), path
    assert (DEV / "catalogue_docs.py").is_file()


def test_the_installed_package_holds_no_harness() -> None:
    """What pip installs: the package found where the tests import it from."""
    import importlib.util

    import hookwatch

    for harness in HARNESSES:
        parent = harness.rsplit(".", 1)[0]
        if importlib.util.find_spec(parent) is None:
            continue
        assert importlib.util.find_spec(harness) is None, harness
    installed = Path(hookwatch.__file__).resolve().parent
    assert not (installed / "tools" / "soak").exists()
    assert not (installed / "tools" / "evaluation").exists()


def test_nothing_in_the_package_imports_dev() -> None:
    for name, imported in MODULES.items():
        assert not any(i == "dev" or i.startswith("dev.") for i in imported), name


def test_the_harnesses_import_the_package_not_the_other_way() -> None:
    # dev/ uses the package's load generator and statistics (shared with `hookwatch bench`).
    uses = set().union(*(imports(p) for p in DEV.rglob("*.py")))
    assert "hookwatch.tools.bench.loadgen" in uses
    assert "hookwatch.tools.bench.stats" in uses
