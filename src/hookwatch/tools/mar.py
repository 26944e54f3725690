"""Reading an eager-mode ``.mar`` the way TorchServe loads it (for the tools, not for serving)."""

from __future__ import annotations

import importlib.util
import inspect
import io
import json
import tempfile
import zipfile
from pathlib import Path

import torch
from torch import nn

from hookwatch._config import ModelConfig, read_model_config
from hookwatch._errors import ProfileError
from hookwatch._model import MODEL_SPEC_FILE, ModelSpec, build_model

__all__ = ["load_mar_model"]


def load_mar_model(mar: Path) -> tuple[nn.Module, ModelConfig, str]:
    """Model, model-config and model name of an eager ``.mar`` (as TorchServe loads it)."""
    import yaml

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
