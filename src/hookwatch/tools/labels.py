"""Reference labels for ``hookwatch archive``: the classes the accuracy estimate is fitted on.

Four sources, in this order: ``--reference-labels FILE.npy`` (or an ``.npz`` holding a ``y``
array, or one array), a ``y`` array beside the inputs in the reference ``.npz``, a ``label``
field in every line of the reference ``.jsonl`` (``{"data": [...], "label": 3}``: the request
body with one more key, which requests ignore), the class folders of a reference directory of
images (``hookwatch.tools.images``). Every mistake is one line, "expected X, got Y"
(a :class:`~hookwatch.ConfigError`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from hookwatch._errors import ConfigError
from hookwatch.tools.arrays import ARRAY_SUFFIXES, read_arrays
from hookwatch.tools.images import folder_labels

__all__ = ["LABELS_ARRAY", "LABEL_FIELD", "check_labels", "reference_labels"]

#: The labels' array in an ``.npz`` (the reference's, or ``--reference-labels``'s).
LABELS_ARRAY = "y"
#: The labels' field in a ``.jsonl`` reference's lines.
LABEL_FIELD = "label"


def reference_labels(
    labels: Path | None, reference: Path, class_names: Sequence[str] | None = None
) -> tuple[NDArray[np.int64], str] | None:
    """The reference's labels and where they came from, or None when there are none.

    Read before the model is built, so a bad file fails first; the count is checked against
    the reference's samples by :func:`check_labels`. A directory of images in class folders
    named as ``class_names`` (``handler.labels``) or by class index is labelled by them
    (:func:`~hookwatch.tools.images.folder_labels`).
    """
    if labels is not None:
        return _array(_load(labels, "--reference-labels"), "--reference-labels"), str(labels)
    if reference.is_dir():
        return folder_labels(reference, class_names)
    if reference.suffix in (".npz", ".pt", ".pth"):
        try:
            arrays = read_arrays(reference, "reference")
        except ConfigError:
            return None  # the reference's own reader says what is wrong with it
        if not isinstance(arrays, dict) or LABELS_ARRAY not in arrays:
            return None
        where = f"the {LABELS_ARRAY!r} array of {reference.name}"
        return _array(arrays[LABELS_ARRAY], where), where
    if reference.suffix == ".jsonl":
        return _jsonl(reference)
    if reference.suffix in (".csv", ".tsv"):
        return _table(reference)
    return None


def check_labels(y: NDArray[np.int64], where: str, samples: int, head: str) -> None:
    """Labels that fit the reference (one per sample) and the model's head (``logits``)."""
    if head != "logits":
        raise ConfigError(
            f"{where}: expected a model whose monitoring.output.head is 'logits' (labels are "
            f"classes of its logits), got head {head!r}; archive it without labels"
        )
    if len(y) != samples:
        raise ConfigError(
            f"{where}: expected {samples} labels (one per reference sample), got {len(y)}"
        )


def _load(path: Path, where: str) -> object:
    if path.suffix not in ARRAY_SUFFIXES:
        raise ConfigError(f"{where}: expected a .npy, .npz or .pt file of labels, got {path.name}")
    loaded = read_arrays(path, where)
    if isinstance(loaded, dict):
        if LABELS_ARRAY in loaded:
            return loaded[LABELS_ARRAY]
        if len(loaded) != 1:
            raise ConfigError(
                f"{where}: expected arrays with a {LABELS_ARRAY!r} array (or one array), "
                f"got arrays {list(loaded)}"
            )
        return next(iter(loaded.values()))
    return loaded


def _array(value: object, where: str) -> NDArray[np.int64]:
    a = np.asarray(value)
    if a.ndim != 1:
        raise ConfigError(
            f"{where}: expected a 1-D array of class labels [N], got shape {list(a.shape)}"
        )
    if not np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.bool_):
        raise ConfigError(
            f"{where}: expected integer class labels (the index of the right logit), got dtype "
            f"{a.dtype}"
        )
    if len(a) and int(a.min()) < 0:
        raise ConfigError(f"{where}: expected class labels >= 0, got {int(a.min())}")
    y: NDArray[np.int64] = a.astype(np.int64)
    return y


def _table(reference: Path) -> tuple[NDArray[np.int64], str] | None:
    """A table's ``label`` column (named so in its header), or None where it has none."""
    import csv

    try:
        text = reference.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return None  # the reference's own reader says so
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    delimiter = next((d for d in (",", ";", "\t") if d in lines[0]), ",")
    rows = list(csv.reader(lines, delimiter=delimiter))
    header = [name.strip() for name in rows[0]]
    if LABEL_FIELD not in header:
        return None
    at = header.index(LABEL_FIELD)
    where = f"the {LABEL_FIELD!r} column of {reference.name}"
    try:
        values = [int(row[at]) for row in rows[1:]]
    except (IndexError, ValueError):
        raise ConfigError(
            f"{where}: expected an integer class label on every line (the index of the right logit)"
        ) from None
    return _array(np.asarray(values, dtype=np.int64), where), where


def _jsonl(reference: Path) -> tuple[NDArray[np.int64], str] | None:
    try:
        lines = [line for line in reference.read_text().splitlines() if line.strip()]
    except OSError:
        return None  # the reference's own reader says so
    found: list[object] = []
    missing = 0
    for line in lines:
        try:
            body = json.loads(line)
        except ValueError:
            return None  # the reference's own reader says which line
        if isinstance(body, dict) and LABEL_FIELD in body:
            found.append(body[LABEL_FIELD])
        else:
            missing += 1
    if not found:
        return None
    where = f"the {LABEL_FIELD!r} field of {reference.name}"
    if missing:
        raise ConfigError(
            f"{where}: expected a label on every line (or on none), got {len(found)} lines with "
            f"one and {missing} without"
        )
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in found):
        bad = next(v for v in found if not isinstance(v, int) or isinstance(v, bool))
        raise ConfigError(
            f"{where}: expected integer class labels (the index of the right logit), got {bad!r}"
        )
    return _array(np.asarray(found, dtype=np.int64), where), where
