"""A user's model, described in a small JSON file and built the same way by tools and workers.

``hookwatch archive`` writes ``hookwatch-model.json`` into the archive beside the model's files:
which Python file and name build the model (an ``nn.Module`` class with constructor arguments,
or a factory function), or which TorchScript or ``torch.export`` file is the model, and which
state_dict to load.
The TorchServe adapter builds the model from it instead of TorchServe's own loader, which takes
only one no-argument class per file.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookwatch._errors import ConfigError, error_line

log = logging.getLogger("hookwatch")

__all__ = [
    "MODEL_SPEC_FILE",
    "ExportedModel",
    "ModelSpec",
    "ScriptedModel",
    "build_model",
    "load_state",
    "serialized_kind",
]

MODEL_SPEC_FILE = "hookwatch-model.json"
_FORMAT = "hookwatch-model"
KINDS = ("class", "factory", "torchscript", "exported")


@dataclass(frozen=True)
class ModelSpec:
    """How to build the model: a file in the model directory and what to call in it."""

    kind: str
    #: The Python file (class, factory), TorchScript file or ``torch.export`` program
    #: (exported), relative to the model directory.
    file: str
    #: The class or factory function in ``file`` (empty for a serialized model).
    name: str = ""
    #: Keyword arguments for the class or factory.
    args: Mapping[str, Any] = field(default_factory=dict)
    #: A state_dict file in the model directory, or None (the constructor sets the weights).
    weights: str | None = None
    #: Arguments naming a directory (a HuggingFace ``save_pretrained`` directory): archived
    #: in the model directory under the argument's name and passed as that path when built.
    directories: tuple[str, ...] = ()
    #: An installed module to import by name (``mycompany.models``: a package installed in
    #: the serving image) instead of ``file``, which is then empty in an archive.
    module: str | None = None
    #: Arguments naming a file (a vocabulary, a label map, a checkpoint the factory reads):
    #: the argument -> the file's name, archived as ``<argument>/<name>`` in the model
    #: directory and passed as that path when built (its name kept: loaders read suffixes).
    files: Mapping[str, str] = field(default_factory=dict)
    #: The distribution that installed ``module`` where it was archived, ``name==version``: a
    #: worker whose environment has another version says so as it loads the model.
    distribution: str | None = None
    #: The answered parts with a step per step of a request's input (a tagger's labels, a
    #: per-step output: cut at each request's own length in a padded batch), as ``archive``
    #: found them by running a sample alone and beside a longer one: ``head`` and
    #: ``output.also`` keys. None where it was not found out (guessed from each batch's
    #: shapes: a fixed number of steps as long as the batch's longest reads as steps).
    answer_steps: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"model: expected a kind in {list(KINDS)}, got {self.kind!r}")

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "version": 1,
                "kind": self.kind,
                "file": self.file,
                "name": self.name,
                "args": dict(self.args),
                "weights": self.weights,
                "directories": list(self.directories),
                **({"module": self.module} if self.module else {}),
                **({"files": dict(self.files)} if self.files else {}),
                **({"distribution": self.distribution} if self.distribution else {}),
                **(
                    {"answer_steps": list(self.answer_steps)}
                    if self.answer_steps is not None
                    else {}
                ),
            },
            indent=2,
        )

    @classmethod
    def load(cls, path: Path) -> ModelSpec:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(f"expected a {_FORMAT} JSON file at {path}, got {error}") from None
        if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
            raise ConfigError(f"expected a {_FORMAT} JSON file at {path}, got {raw!r:.80}")
        return cls(
            kind=str(raw["kind"]),
            file=str(raw["file"]),
            name=str(raw.get("name", "")),
            args=dict(raw.get("args") or {}),
            weights=raw.get("weights"),
            directories=tuple(str(d) for d in raw.get("directories") or ()),
            module=str(raw["module"]) if raw.get("module") else None,
            files={str(k): str(v) for k, v in (raw.get("files") or {}).items()},
            distribution=str(raw["distribution"]) if raw.get("distribution") else None,
            answer_steps=(
                tuple(str(k) for k in raw["answer_steps"])
                if isinstance(raw.get("answer_steps"), list)
                else None
            ),
        )


class ScriptedModel(nn.Module):
    """An eager module around a TorchScript model.

    Forward hooks cannot be registered on a ScriptModule, nor do hooks on its submodules fire;
    around it, hooks on this module see the model's input and output, so those two are watched
    (hidden layers are not: a config that names one fails the load).
    """

    def __init__(self, scripted: torch.jit.ScriptModule) -> None:
        super().__init__()
        self.scripted = scripted

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.scripted(*args, **kwargs)


def serialized_kind(path: Path) -> str:
    """``exported`` for a ``torch.export.save`` archive (``.pt2``: a zip with an
    ``archive_format`` record), else ``torchscript``."""
    if path.suffix == ".pt2":
        return "exported"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return "torchscript"
    return "exported" if any(n.endswith("/archive_format") for n in names) else "torchscript"


def _saved_pickle(path: Path) -> bool:
    """``path`` is what ``torch.save`` writes (a zip with a ``data.pkl`` record), not
    TorchScript (which holds ``constants.pkl`` and code beside it)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
    return any(n.endswith("/data.pkl") for n in names) and not any(
        n.endswith("/constants.pkl") for n in names
    )


def _load_exported(path: Path, device: torch.device) -> nn.Module:
    """A ``torch.export`` program as a module with its authored hierarchy
    (``torch.export.unflatten``): hooks on its submodules fire, under their original paths.

    Each submodule is an ``InterpreterModule`` to torch; the class it was exported from (the
    program's ``nn_module_stack`` records) is kept as its ``hookwatch_type``, what
    ``layer_types`` and ``hookwatch layers`` go by. A program traced for a fixed batch size
    fails the load: every batch of another size would fail its forward.
    """
    try:
        with warnings.catch_warnings():
            # torch's own deprecations inside its loader (a pytree LeafSpec check): not the
            # user's to act on.
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.export.load(str(path))
    except Exception as error:
        raise ConfigError(
            f"model: expected a torch.export file (.pt2) at {path}, got "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        if isinstance(value, torch.Tensor) and value.dim() and isinstance(value.shape[0], int):
            raise ConfigError(
                f"model: expected {path.name} exported with a dynamic batch dimension, got "
                f"input {node.name!r} traced for a batch of exactly {value.shape[0]}: export "
                "it with dynamic_shapes giving dimension 0 torch.export.Dim('batch')"
            )
    types: dict[str, str] = {}
    for node in program.graph.nodes:
        for module_path, qualified in (node.meta.get("nn_module_stack") or {}).values():
            types.setdefault(str(module_path), str(qualified).rsplit(".", 1)[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.export.unflatten(program)
    for name, submodule in module.named_modules():
        if name:
            # A module the program never called as one (a ModuleList of blocks) has no record:
            # a plain Module, not torch's InterpreterModule.
            submodule.hookwatch_type = types.get(name, "Module")
        if hasattr(submodule, "_run_with_interpreter"):
            # The graphs' generated code, as torch.compile runs them, not torch.fx's
            # Interpreter walking them node by node in Python (there for stack traces).
            submodule._run_with_interpreter = False
    return ExportedModel(module, _positional_names(program)).to(device).eval()


class ExportedModel(nn.Module):
    """A ``torch.export`` program's restored module tree, called as its author's module was.

    A program takes its inputs as it was exported, positionally as a rule; a forward of
    several tensors is called with keyword arguments (``input.arguments``), which go to the
    positions of the forward's parameters of those names. Its layers are named from
    ``program`` (see ``_hooks.hookable_root``): ``features.1``, as on the eager model.
    """

    #: The attribute whose ``named_modules()`` name the layers.
    hookwatch_root = "program"

    def __init__(self, program: nn.Module, positional: tuple[str, ...]) -> None:
        super().__init__()
        self.program = program
        self.positional = positional

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs and self.positional:
            # The positions after those given, in order, up to the first not named.
            for name in self.positional[len(args) :]:
                if name not in kwargs:
                    break
                args = (*args, kwargs.pop(name))
        return self.program(*args, **kwargs)


def _positional_names(program: Any) -> tuple[str, ...]:
    """The names of the forward's positional parameters a program was exported with, where
    each is one tensor (its graph's user inputs are then named after them); else none."""
    try:
        spec = program.module_call_graph[0].signature.in_spec
        # children() where torch has it (children_specs is deprecated there).
        children = spec.children() if callable(getattr(spec, "children", None)) else None
        given = (children or spec.children_specs)[0]
    except (AttributeError, IndexError, TypeError):
        return ()
    names = tuple(program.graph_signature.user_inputs)
    if given.num_leaves != given.num_children or len(names) < given.num_children:
        return ()
    return tuple(str(name) for name in names[: given.num_children])


def package_root(path: Path) -> Path | None:
    """The outermost package ``path`` lies in (the highest of its directories, each holding
    an ``__init__.py``, up from its own), or None for a file outside any package."""
    root = None
    directory = path.resolve().parent
    while (directory / "__init__.py").is_file() and directory.parent != directory:
        root = directory
        directory = directory.parent
    return root


def module_name(path: Path) -> str:
    """The name ``path`` is imported under: dotted from its package's parent
    (``netpkg.model``) inside a package, so its relative imports resolve; else a name of its
    own (``hookwatch_model_<stem>``)."""
    root = package_root(path)
    if root is None:
        return f"hookwatch_model_{path.stem}"
    return ".".join(path.resolve().relative_to(root.parent).with_suffix("").parts)


def _import_file(path: Path) -> Any:
    """The module of ``path``, run. Whatever its code raises on import is a
    :class:`ConfigError` naming the file and line (a missing dependency, a syntax error)."""
    if not path.is_file():
        raise ConfigError(f"model: expected a Python file at {path}, got no such file")
    root = package_root(path)
    # The model's own directory first, so the file can import its siblings; inside a
    # package, the package's parent, so `from .blocks import Block` finds its package.
    home = str(path.parent if root is None else root.parent)
    if home not in sys.path:
        sys.path.insert(0, home)
    name = module_name(path)
    try:
        if root is not None:
            _forget_other_package(root)
            return importlib.import_module(name)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"model: cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        # Registered before it runs, as an import would: dataclasses and pickling look it up.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as error:
        sys.modules.pop(name, None)
        raise ConfigError(
            f"model: importing {path} raised {type(error).__name__}{_where(error, path)}: "
            f"{error_line(error)}{_import_hint(error, root)}"
        ) from error
    return module


def _import_module(name: str) -> Any:
    """An installed module by name (the serving environment's own); what its import raises is
    a :class:`ConfigError`, as for a file."""
    try:
        return importlib.import_module(name)
    except Exception as error:
        hint = (
            " (install its package where the model is built and served)"
            if isinstance(error, ModuleNotFoundError)
            else ""
        )
        raise ConfigError(
            f"model: importing module {name} raised {type(error).__name__}: "
            f"{error_line(error)}{hint}"
        ) from error


def attribute(module: Any, dotted: str) -> Any:
    """``module``'s attribute ``dotted`` (``Net``, or a path through classes as entry points
    name one: ``AutoModel.from_pretrained``); None where a part is missing."""
    target = module
    for part in dotted.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def installed_distribution(module: str) -> tuple[str, str] | None:
    """``(name, version)`` of the distribution that installed ``module``'s top package; None
    where none is recorded (a module beside the code, not pip-installed)."""
    from importlib import metadata

    top = module.split(".")[0]
    for name in metadata.packages_distributions().get(top, []):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _check_distribution(spec: ModelSpec) -> None:
    """A warning where the serving environment's version of the model's installed package
    is not the one it was archived with: its code may no longer match the weights or the
    drift profile (a changed layer, a changed preprocessing) without any error."""
    if not spec.distribution or not spec.module:
        return
    name, _, archived = spec.distribution.partition("==")
    from importlib import metadata

    try:
        here: str | None = metadata.version(name)
    except metadata.PackageNotFoundError:
        here = None
    if here != archived:
        log.warning(
            "hookwatch: model module %s was archived with %s %s; this environment has %s "
            "(install %s==%s where it is served, or archive it again here)",
            spec.module,
            name,
            archived,
            f"{name} {here}" if here else f"no {name} installed",
            name,
            archived,
        )


def _forget_other_package(root: Path) -> None:
    """Drop from ``sys.modules`` a package of ``root``'s name imported from elsewhere (another
    model's of the same name, earlier in this process), so this one is imported."""
    loaded = sys.modules.get(root.name)
    where = getattr(loaded, "__file__", None)
    if loaded is None or (where and Path(where).resolve().parent == root.resolve()):
        return
    for key in [k for k in sys.modules if k == root.name or k.startswith(root.name + ".")]:
        del sys.modules[key]


def _where(error: BaseException, path: Path) -> str:
    """`` at file.py:LINE``: the deepest frame of the error in the model's own directory tree,
    or the syntax error's line; empty when none is."""
    if isinstance(error, SyntaxError) and error.filename and error.lineno:
        return f" at {Path(error.filename).name}:{error.lineno}"
    root = package_root(path)
    top = (path.parent if root is None else root).resolve()
    named_from = top if root is None else top.parent
    found = ""
    frame = error.__traceback__
    while frame is not None:
        file = Path(frame.tb_frame.f_code.co_filename)
        if file.is_absolute() and file.resolve().is_relative_to(top):
            found = f" at {file.resolve().relative_to(named_from)}:{frame.tb_lineno}"
        frame = frame.tb_next
    return found


def _import_hint(error: BaseException, root: Path | None) -> str:
    if isinstance(error, ImportError) and "no known parent package" in str(error) and not root:
        return " (a relative import outside a package: give its directory an __init__.py)"
    if isinstance(error, ModuleNotFoundError) and error.name:
        return f" (install {error.name.split('.')[0]} where the model is built and served)"
    return ""


def safe_load(path: Path, what: str, expected: str, hint: str) -> Any:
    """``torch.load`` of ``path`` on the CPU with ``weights_only`` (no code runs from the
    file); a missing file or one that holds more than tensors is a :class:`ConfigError`
    naming ``what`` it is, what was ``expected`` in it, and ``hint``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"{what}: expected a file at {path}, got no such file") from None
    except Exception as error:
        raise ConfigError(
            f"{what}: expected {expected} in {path}, got {type(error).__name__} ({hint})"
        ) from None


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """A state_dict from ``path``, on the CPU: a plain state_dict, or a checkpoint holding one
    under ``state_dict``, ``model_state_dict`` or ``model`` (a ``module.`` prefix from
    DataParallel and an ``_orig_mod.`` prefix from ``torch.compile`` are dropped). Loaded
    with ``weights_only``: no code runs from the file."""
    loaded = safe_load(
        path,
        "weights",
        "a state_dict or a checkpoint of tensors",
        "a pickled model cannot be loaded safely: save model.state_dict()",
    )
    state: Any = loaded
    if isinstance(loaded, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(loaded.get(key), dict):
                state = loaded[key]
                break
    if not (isinstance(state, dict) and all(isinstance(k, str) for k in state)):
        raise ConfigError(
            f"weights: expected a state_dict (parameter names to tensors) in {path}, got "
            f"{type(state).__name__}"
        )
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if state and not tensors:
        # An empty state_dict is a parameter-free model's (an identity, a fixed transform);
        # names without one tensor are something else (a training log, hyperparameters).
        raise ConfigError(
            f"weights: expected a state_dict (parameter names to tensors) in {path}, got a "
            f"dict without tensors (keys {', '.join(sorted(state)[:5])})"
        )
    # DataParallel's wrapper, torch.compile's, or one inside the other.
    for prefix in ("module.", "_orig_mod.", "module."):
        if tensors and all(k.startswith(prefix) for k in tensors):
            tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
    return tensors


def _without_wrapper(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """``state`` with one prefix common to all its names dropped where that makes its names
    exactly ``model``'s: a training wrapper's attribute (a Lightning module's ``model.``,
    ``net.``) around the model. Else ``state`` as it is, for load_state_dict to judge."""
    names = model.state_dict().keys()
    if state.keys() == names or not state:
        return state
    prefix = next(iter(state)).split(".", 1)[0] + "."
    if not all(key.startswith(prefix) for key in state):
        return state
    inner = {key.removeprefix(prefix): value for key, value in state.items()}
    return inner if inner.keys() == names else state


def named_by_state(model: nn.Module) -> nn.Module:
    """The module whose parameter names a state_dict from :func:`load_state` uses: inside
    ``torch.compile``'s wrapper (``_orig_mod``) and DataParallel's (``module``), whose
    prefixes it drops. A factory may return the compiled model itself."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            model = inner
        elif isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def build_model(spec: ModelSpec, directory: Path, device: torch.device | None = None) -> nn.Module:
    """The model ``spec`` describes, from the files in ``directory``, in eval mode."""
    device = device or torch.device("cpu")
    if spec.kind == "torchscript":
        path = directory / spec.file
        try:
            scripted = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
        except Exception as error:
            if _saved_pickle(path):
                # torch.save(model) or a state_dict: torch's own words call it corrupted.
                raise ConfigError(
                    f"model: expected a TorchScript file, a torch.export program (.pt2) or "
                    f"path/file.py:Name, got a torch.save file at {path} (a whole model or a "
                    f"state_dict, not a program that runs without its Python code); give the "
                    f"class and its weights: path/file.py:Name --weights FILE (a whole model: "
                    f"save model.state_dict() first)"
                ) from None
            raise ConfigError(
                f"model: expected a TorchScript file at {path}, got {type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}"
            ) from None
        return ScriptedModel(scripted).eval()
    if spec.kind == "exported":
        return _load_exported(directory / spec.file, device)
    if spec.module:
        module = _import_module(spec.module)
        _check_distribution(spec)
    else:
        module = _import_file(directory / spec.file)
    target = attribute(module, spec.name)
    if target is None:
        found = sorted(
            n
            for n, v in vars(module).items()
            if not n.startswith("_")
            and callable(v)
            and (not isinstance(v, type) or issubclass(v, nn.Module))
            and getattr(v, "__module__", None) == module.__name__
        )
        raise ConfigError(
            f"model: expected {spec.name!r} in {spec.module or spec.file}, got no such name "
            f"(it defines: {', '.join(found) or 'nothing callable'})"
        )
    args = {
        **spec.args,
        **{name: str(directory / name) for name in spec.directories},
        **{name: str(directory / name / file) for name, file in spec.files.items()},
    }
    try:
        model = target(**args)
    except TypeError as error:
        raise ConfigError(
            f"model: expected {spec.name}(**{dict(spec.args)!r}) to build the model, got "
            f"TypeError: {error}"
        ) from None
    except Exception as error:
        # The user's constructor or factory failed on its own (a file it reads, a check).
        raise ConfigError(
            f"model: {spec.name}() raised {type(error).__name__}"
            f"{'' if spec.module else _where(error, directory / spec.file)}: "
            f"{error_line(error)}"
        ) from error
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model: expected {spec.name} to return an nn.Module, got {type(model).__name__}"
        )
    if spec.weights is not None:
        state = _without_wrapper(load_state(directory / spec.weights), named_by_state(model))
        try:
            named_by_state(model).load_state_dict(state)
        except RuntimeError as error:
            first = str(error).splitlines()
            raise ConfigError(
                f"weights: expected the parameters of {spec.name}, got a state_dict that does "
                f"not fit: {' '.join(line.strip() for line in first[:3])}"
            ) from None
    return model.to(device).eval()
