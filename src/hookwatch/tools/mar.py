"""Reading an eager-mode ``.mar`` the way TorchServe loads it (for the tools, not for serving)."""

from __future__ import annotations

import importlib.util
import inspect
import io
import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookwatch._config import ModelConfig, read_model_config
from hookwatch._errors import ConfigError, ProfileError
from hookwatch._model import MODEL_SPEC_FILE, ModelSpec, build_model

__all__ = ["HookwatchArchive", "load_mar_model", "read_hookwatch_mar"]


@dataclass(frozen=True)
class HookwatchArchive:
    """What the commands that take a user's ``.mar`` (serve, bench) read of it."""

    path: Path
    #: The TorchServe model name (the manifest's ``modelName``).
    name: str
    #: The handler file's name inside the archive (the manifest's ``handler``).
    handler_file: str
    #: The archived model-config, parsed (None: the archive has none).
    config: Any


def read_hookwatch_mar(mar: Path) -> HookwatchArchive:
    """A ``.mar`` whose handler is hookwatch's; a one-line :class:`ConfigError` for a missing
    file, a file that is not a ``.mar``, or an archive served by another handler (it would
    serve and show nothing)."""
    import yaml

    if not mar.is_file():
        raise ConfigError(
            f"expected a .mar file at {mar}, got no such file: build one with `hookwatch archive`"
        )
    if mar.suffix != ".mar":
        raise ConfigError(f"expected a .mar file (hookwatch archive writes one), got {mar.name}")
    try:
        with zipfile.ZipFile(mar) as archive:
            manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))["model"]
            names = set(archive.namelist())
            handler_file = str(manifest.get("handler", ""))
            source = (
                archive.read(handler_file).decode(errors="replace") if handler_file in names else ""
            )
            config_file = manifest.get("configFile")
            config = (
                yaml.safe_load(archive.read(config_file))
                if config_file and config_file in names
                else None
            )
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as error:
        raise ConfigError(
            f"expected a TorchServe .mar at {mar}, got {type(error).__name__}: {error}"
        ) from None
    # `hookwatch archive` and the demo's handler file both subclass HookwatchHandler; a plain
    # handler (UnmonitoredHandler, TorchServe's own) serves without monitoring.
    if "hookwatch.torchserve" not in source or "HookwatchHandler" not in source:
        raise ConfigError(
            f"expected a .mar built by `hookwatch archive` (a handler file subclassing "
            f"hookwatch.torchserve.HookwatchHandler), got {mar.name} with handler "
            f"{handler_file or 'none'!r}"
        )
    return HookwatchArchive(mar, str(manifest.get("modelName", mar.stem)), handler_file, config)


def load_mar_model(mar: Path) -> tuple[nn.Module, ModelConfig, str]:
    """Model, model-config and model name of an eager ``.mar`` (as TorchServe loads it)."""
    import yaml

    if not mar.is_file():
        raise ConfigError(
            f"--mar: expected a .mar file at {mar}, got no such file: build one with `hookwatch "
            "archive` (the demo's with `hookwatch build-demo`)"
        )
    if not zipfile.is_zipfile(mar):
        raise ConfigError(
            f"--mar: expected a .mar (a zip archive) at {mar}, got another kind of file: "
            "`hookwatch archive` writes one"
        )
    with zipfile.ZipFile(mar) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))["model"]
        if MODEL_SPEC_FILE in archive.namelist():
            # Written by `hookwatch archive`: built the way the worker builds it.
            config_name = manifest.get("configFile")
            raw = yaml.safe_load(archive.read(config_name)) if config_name else None
            with tempfile.TemporaryDirectory() as tmp:
                archive.extractall(tmp)
                built = build_model(ModelSpec.load(Path(tmp) / MODEL_SPEC_FILE), Path(tmp))
            return built, read_model_config(raw or {}), str(manifest.get("modelName", mar.stem))
        for key in ("modelFile", "serializedFile"):
            if key not in manifest:
                raise ProfileError(f"expected an eager-mode .mar with a {key}, got {manifest}")
        config_name = manifest.get("configFile")
        raw = yaml.safe_load(archive.read(config_name)) if config_name else None
        config = read_model_config(raw or {})
        with tempfile.TemporaryDirectory() as tmp:
            archive.extract(manifest["modelFile"], tmp)
            spec = importlib.util.spec_from_file_location(
                "hookwatch_profile_model", Path(tmp) / manifest["modelFile"]
            )
            if spec is None or spec.loader is None:
                raise ProfileError(f"cannot import {manifest['modelFile']} from {mar}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        classes = [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, nn.Module) and c.__module__ == module.__name__
        ]
        if len(classes) != 1:
            raise ProfileError(
                f"expected exactly one nn.Module class in {manifest['modelFile']}, "
                f"got {[c.__name__ for c in classes]}"
            )
        model: nn.Module = classes[0]()
        state = torch.load(io.BytesIO(archive.read(manifest["serializedFile"])), weights_only=True)
        model.load_state_dict(state)
    model.eval()
    return model, config, str(manifest.get("modelName", mar.stem))
