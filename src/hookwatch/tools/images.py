"""A directory of image files as ``hookwatch archive``'s reference (``input.encoding: image``):
which files, in which order, and their classes when they sit in class folders.

The order is the files' paths relative to the directory, sorted: ``--reference-labels`` gives
their labels in it. Images kept one folder per class (``reference/cat/1.jpg``, the layout
torchvision's ``ImageFolder`` reads) are labelled by their folder, but only where the folder
names say which class they are: the names of ``handler.labels``, or class indices. Sorted
folder names are not taken for class indices unasked: a folder per day or per camera would
become wrong labels, and an accuracy estimate fitted on them would page on nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from hookwatch._errors import ConfigError

__all__ = ["AUDIO_SUFFIXES", "IMAGE_SUFFIXES", "class_folders", "folder_labels", "image_files"]

#: What a reference directory's image files may be called.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
#: What a waveform model's reference recordings may be called (PCM WAV, as requests send).
AUDIO_SUFFIXES = frozenset({".wav"})


def image_files(directory: Path) -> list[Path]:
    """The image files (or recordings) under ``directory``, its subdirectories too, sorted by
    their path relative to it."""
    kinds = IMAGE_SUFFIXES | AUDIO_SUFFIXES
    return sorted(
        (p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in kinds),
        key=lambda p: p.relative_to(directory).as_posix(),
    )


def class_folders(directory: Path) -> list[str]:
    """The first-level folders of ``directory`` when every image lies inside one (sorted),
    else none."""
    return _folders(_first_parts(directory))


def _first_parts(directory: Path) -> list[tuple[str, ...]]:
    """Each image file's path relative to ``directory``, as parts, in :func:`image_files`'
    order."""
    return [p.relative_to(directory).parts for p in image_files(directory)]


def _folders(parts: list[tuple[str, ...]]) -> list[str]:
    if not parts or any(len(p) < 2 for p in parts):
        return []
    return sorted({p[0] for p in parts})


def folder_labels(
    directory: Path, class_names: Sequence[str] | None
) -> tuple[NDArray[np.int64], str] | None:
    """Each image's class from its first-level folder, in :func:`image_files`' order, and
    where they came from; None where the images are not all in folders, or where the folders'
    names are neither ``class_names`` (``handler.labels``) nor class indices."""
    parts = _first_parts(directory)  # the directory walked once, for the folders and labels
    folders = _folders(parts)
    if not folders:
        return None
    if class_names is not None and set(folders) & set(class_names):
        unknown = [name for name in folders if name not in class_names]
        if unknown:
            raise ConfigError(
                f"reference: expected class folders named as handler.labels, got "
                f"{', '.join(unknown[:5])} in {directory} that no label is (move them out, or "
                "pass --reference-labels)"
            )
        index = {name: class_names.index(name) for name in folders}
        how = "named as handler.labels"
    elif all(name.isdigit() for name in folders):
        index = {name: int(name) for name in folders}
        how = "named by class index"
    else:
        return None
    y = np.array([index[p[0]] for p in parts], np.int64)
    return y, f"the class folders of {directory.name}/ ({how})"
