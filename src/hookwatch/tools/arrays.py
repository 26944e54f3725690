"""Array files a user hands ``hookwatch archive`` (reference inputs, their labels): numpy's
``.npy`` and ``.npz``, and ``torch.save``'s ``.pt``/``.pth`` of a tensor or a dict of
tensors, read alike. Every mistake is one line, "expected X, got Y"."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from hookwatch._errors import ConfigError
from hookwatch._model import safe_load

__all__ = ["ARRAY_SUFFIXES", "read_arrays"]

#: The suffixes :func:`read_arrays` reads.
ARRAY_SUFFIXES = (".npy", ".npz", ".pt", ".pth")


def read_arrays(path: Path, what: str) -> NDArray[Any] | dict[str, NDArray[Any]]:
    """One array (``.npy``, a tensor's ``.pt``) or arrays by name (``.npz``, a dict of
    tensors' ``.pt``). A ``.pt`` is loaded with ``weights_only``: no code runs from the file.
    ``what`` names the file's role in messages (``reference``)."""
    if path.suffix in (".pt", ".pth"):
        return _torch_arrays(path, what)
    try:
        # An .npy is mapped, not read: a reference larger than memory is read a batch at a time.
        loaded = np.load(path, mmap_mode="r" if path.suffix == ".npy" else None, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise ConfigError(f"{what}: expected a numpy array in {path}, got {error}") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            return {name: loaded[name] for name in loaded.files}
    array: NDArray[Any] = loaded
    return array


def _torch_arrays(path: Path, what: str) -> NDArray[Any] | dict[str, NDArray[Any]]:
    loaded = safe_load(
        path,
        what,
        "a tensor or a dict of tensors saved by torch.save",
        "a dataset or other object cannot be loaded safely: save its tensors",
    )
    if isinstance(loaded, torch.Tensor):
        return _numpy(loaded, path, what)
    if (
        isinstance(loaded, dict)
        and loaded
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items())
    ):
        return {name: _numpy(tensor, path, what) for name, tensor in loaded.items()}
    kind = type(loaded).__name__
    if isinstance(loaded, tuple | list):
        kind = f"a {kind} of {len(loaded)}"
    raise ConfigError(
        f"{what}: expected a tensor or a dict of tensors (name: tensor) in {path.name}, got "
        f"{kind}: save the inputs as one tensor, or {{'x': inputs, 'y': labels}}"
    )


def _numpy(tensor: torch.Tensor, path: Path, what: str) -> NDArray[Any]:
    """A tensor's values as numpy holds them (bfloat16, which numpy lacks, as float32)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    try:
        array: NDArray[Any] = tensor.numpy()
    except (RuntimeError, TypeError) as error:
        raise ConfigError(
            f"{what}: expected dense tensors of numbers in {path.name}, got one of dtype "
            f"{tensor.dtype} and layout {tensor.layout} ({str(error).splitlines()[0]})"
        ) from None
    return array
