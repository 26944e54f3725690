"""Request handling for a monitored model, free of TorchServe.

:mod:`hookwatch.torchserve` adapts this to TorchServe's ``initialize → preprocess → inference
→ postprocess`` contract. Bad requests become :class:`BadInputError` per item, so one malformed
request in a batch gets its own 4xx and the rest of the batch is still served.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from hookwatch import _oip
from hookwatch._audio import decode_wav, wav_like
from hookwatch._body import (
    MAX_BODY_BYTES,
    JsonBody,
    NoPayload,
    body_limit,
    check_body_size,
    loads_json,
)
from hookwatch._capture import RateLimitedLog
from hookwatch._config import HandlerConfig, InputSpec, OutputSpec
from hookwatch._errors import BadInputError, ConfigError, error_line
from hookwatch._hooks import (
    as_items,
    as_logits,
    per_sample_items,
    plan_watch,
    read_padded,
    select_tensor,
)
from hookwatch._image import decode_image, image_bytes
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor, ReceivedRequests
from hookwatch._padding import Padded
from hookwatch._profile import serving_tracker
from hookwatch._text import TextPipeline

__all__ = [
    "ArgumentsPipeline",
    "BatchResult",
    "DecodedBatch",
    "InputPipeline",
    "ModelInputs",
    "ModelService",
    "Padded",
    "Pipeline",
    "batch_inputs",
    "call_model",
    "decode_as",
    "decode_payload",
    "decode_values",
    "fits_shape",
    "input_tensor",
    "load_preprocess",
    "make_pipeline",
]

log = logging.getLogger("hookwatch")


def _describe(value: Any) -> str:
    if isinstance(value, NoPayload):
        return repr(value)
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        keys = ", ".join(sorted(map(str, value))[:5])
        return f"an object with keys [{keys}]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"  # as the JSON said it
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}"


def _shape_of(value: Any, depth: int, booleans: bool = False) -> tuple[int, ...] | None:
    """Shape of a rectangular nested list of numbers at most ``depth`` levels deep, or None if
    it is ragged, not numeric or deeper (a request cannot make this recurse without bound).
    JSON's true and false are numbers only for a bool input (``booleans``)."""
    if isinstance(value, bool):
        return () if booleans else None
    if isinstance(value, int | float):
        return ()
    if depth <= 0 or not isinstance(value, list) or not value:
        return None
    inner = _shape_of(value[0], depth - 1, booleans)
    if inner is None:
        return None
    for item in value[1:]:
        if _shape_of(item, depth - 1, booleans) != inner:
            return None
    return (len(value), *inner)


def _list_fault(value: list[Any], depth: int, booleans: bool) -> str:
    """What makes ``value`` no rectangular array of numbers ``depth`` levels deep, said with
    where (``null at [6]``, ``rows of 3 and 4 items at [0] and [1]``); only on the refusal's
    path. The walk stops at the first fault, as deep as the shape and no deeper."""

    def walk(item: Any, level: int, at: str) -> str | tuple[int, ...]:
        if isinstance(item, bool) and not booleans:
            return f"{str(item).lower()} at {at}" if at else str(item).lower()
        if isinstance(item, int | float):
            return ()
        if not isinstance(item, list):
            what = _describe(item)
            return f"{what} at {at}" if at else what
        if level >= depth:
            return f"a list where a number belongs at {at}"
        if not item:
            return f"an empty list at {at}" if at else "an empty list"
        shapes: list[tuple[int, ...]] = []
        for i, inner in enumerate(item):
            got = walk(inner, level + 1, f"{at}[{i}]")
            if isinstance(got, str):
                return got
            if shapes and got != shapes[0]:
                first, other = (_items(g) for g in (shapes[0], got))
                return f"ragged: {first} at {at}[0], {other} at {at}[{i}]"
            shapes.append(got)
        return (len(item), *shapes[0])

    fault = walk(value, 0, "")
    if not isinstance(fault, str):
        return "a ragged or non-numeric list"
    if fault.startswith("ragged: "):
        return f"a ragged list: {fault.removeprefix('ragged: ')}"
    return f"a list holding {fault}"


def _items(shape: tuple[int, ...]) -> str:
    """A nested list's shape as a fault's text says it: a number, 3 items, 2 x 3 items."""
    if not shape:
        return "a number"
    return f"{' x '.join(map(str, shape))} items"


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of lists in ``value``, counted up to ``limit + 1`` and no further."""
    depth = 0
    while isinstance(value, list) and value and depth <= limit:
        value = value[0]
        depth += 1
    return depth


def _decode_float32(body: bytes | bytearray, shape: tuple[int, ...]) -> torch.Tensor:
    expected = math.prod(shape) * 4
    if len(body) != expected:
        raise BadInputError(
            f"{expected} bytes of little-endian float32 (shape {list(shape)}) "
            'or a JSON body sent as "Content-Type: application/json"',
            f"{len(body)} bytes",
            reason="wrong_shape",
        )
    # astype copies into native order, so the tensor owns its memory, not the request buffer.
    values = np.frombuffer(body, dtype="<f4").astype(np.float32)
    return torch.from_numpy(values).reshape(shape)


def _check_values(tensor: torch.Tensor, spec: InputSpec) -> torch.Tensor:
    if not bool(torch.isfinite(tensor).all()):
        raise BadInputError("finite numbers", "NaN or Infinity", reason="not_finite")
    lo, hi = spec.min_value, spec.max_value
    if lo is not None or hi is not None:
        vmin, vmax = float(tensor.min()), float(tensor.max())
        if (lo is not None and vmin < lo) or (hi is not None and vmax > hi):
            raise BadInputError(
                # 6, not 6.0, for a bound the config gave as a whole number (an id's range).
                f"values in [{lo if lo is not None else -math.inf:g}, "
                f"{hi if hi is not None else math.inf:g}]",
                f"values in [{vmin:g}, {vmax:g}]" if tensor.numel() > 1 else f"{vmin:g}",
                reason="out_of_range",
            )
    if (
        tensor.is_floating_point()
        and not _DTYPES[spec.dtype].is_floating_point
        and not bool((tensor == tensor.round()).all())
    ):
        raise BadInputError(
            f"whole numbers (input dtype {spec.dtype})", "fractional values", reason="wrong_type"
        )
    return tensor


#: What a tensor model's 413 names as the way to a larger limit.
_LIMIT_SETTING = "input.max_body_bytes"


def _parse_json(body: Any, expected: str, limit: int = MAX_BODY_BYTES) -> Any:
    """A body as TorchServe hands it over, parsed: JSON sent as application/json arrives
    parsed already, anything else as bytes (or text). Either is held to the body limit."""
    check_body_size(body, limit, _LIMIT_SETTING)
    if isinstance(body, bytes | bytearray | str):
        if type(body) is str and body.startswith("\ufeff"):
            body = body[1:]  # a byte-order mark (json.loads skips it in bytes, not in text)
        return loads_json(body, expected)
    return body


@dataclass(frozen=True)
class Items:
    """A request's several items of the input's shape (``{"instances": [[...], [...]]}``),
    ``[k, *shape]`` (for a length each item chooses, a tensor each, padded with the batch):
    answered as a list, an answer an item, in order."""

    rows: torch.Tensor | tuple[torch.Tensor, ...]
    #: Sent as KServe's and TF Serving's clients send a batch (``{"instances": [...]}``):
    #: answered as their protocol answers, ``{"predictions": [...]}``, for one item too.
    wrapped: bool = False

    def __len__(self) -> int:
        rows = self.rows
        return len(rows) if isinstance(rows, tuple) else int(rows.shape[0])

    def each(self) -> Sequence[torch.Tensor]:
        """The items one by one."""
        rows = self.rows
        return rows if isinstance(rows, tuple) else rows.unbind(0)


def _stacked_rows(items: Items) -> torch.Tensor:
    """A request's items as one tensor ``[k, *shape]`` (they are of one shape)."""
    rows = items.rows
    return rows if isinstance(rows, torch.Tensor) else torch.stack(rows)


def _one_length(shapes: Sequence[torch.Size], what: str) -> None:
    """A 400 for a request's several items of different lengths where the model is served
    one request a batch (nothing of it is ever padded)."""
    if len(set(shapes)) > 1:
        raise BadInputError(
            f"{what} of one length a request (the model is served one request a batch, "
            "batchSize: 1: nothing it takes is padded)",
            f"shapes {sorted({str(list(shape)) for shape in shapes})}",
            reason="wrong_shape",
        )


def _each_item(decode: Callable[[Any], Any], items: Sequence[Any], name: bool) -> list[Any]:
    """``decode`` of each item, in order; with ``name``, an error says which item it was."""
    out = []
    for index, item in enumerate(items):
        try:
            out.append(decode(item))
        except BadInputError as error:
            if not name:
                raise
            raise BadInputError(
                error.expected, f"{error.got} in item {index}", error.status, error.reason
            ) from None
    return out


def _each_of_length(values: list[Any], spec: InputSpec, wrapped: bool) -> Items:
    """A request's items of a length each chooses (``[[1, 2, 3], [4, 5]]``), each decoded and
    checked as a lone item is; an error names the item."""
    _count_items(len(values), spec)
    return Items(tuple(_each_item(lambda value: decode_values(value, spec), values, True)), wrapped)


def decode_payload(
    body: Any, spec: InputSpec, limit: int | None = None, several: bool = False
) -> torch.Tensor | Items:
    """One request's payload → a float32 tensor of ``spec.shape``; raises :class:`BadInputError`.

    Values are checked against the spec's range as sent (before any normalisation). The body
    is held to ``limit`` bytes (by default the spec's, :func:`~hookwatch._body.body_limit`).
    ``several``: a list of up to ``spec.max_items`` items is taken too, as :class:`Items`
    (the service's pipeline; a caller that takes one item leaves it false).
    """
    shape = spec.shape
    if shape is None:
        raise ConfigError("input: expected a shape (or a preprocess function), got neither")
    image = spec.encoding == "image"
    if limit is None:
        limit = body_limit(spec.numel, spec.max_body_bytes, image=image)
    numbers = _numbers_text(spec)
    expected_body = f'a JSON object {{"{spec.field}": {numbers}}}'
    if _npy_like(body, spec):
        check_body_size(body, limit, _LIMIT_SETTING)
        return _npy_items(bytes(body), spec, several)
    if len(shape) in (1, 2) and not image and wav_like(body):
        # A recording, as speech clients send one: its samples, checked as any input's.
        check_body_size(body, limit, _LIMIT_SETTING)
        wave = decode_wav(bytes(body), shape, spec.length_dim, spec.sample_rate)
        return _check_values(
            wave if spec.dtype == "float32" else wave.to(_DTYPES[spec.dtype]), spec
        )
    if (
        spec.encoding == "float32"
        and isinstance(body, bytes | bytearray)
        and type(body) is not JsonBody
    ):
        check_body_size(body, limit, _LIMIT_SETTING)
        return _check_values(_decode_float32(body, shape), spec)
    if image:
        expected_body = (
            f'an image file as the body, or a JSON object {{"{spec.field}": <the file in '
            f"base64, or {numbers}>}}"
        )
        if isinstance(body, bytes | bytearray) and not _looks_like_json(body):
            check_body_size(body, limit, _LIMIT_SETTING)
            return _check_values(decode_image(bytes(body), shape, _DTYPES[spec.dtype]), spec)
        if type(body) is str and body.lstrip()[:1] not in ("{", "[", ""):
            # A bare JSON string (TorchServe hands it over parsed) or a text body: the file
            # in base64, or a data: URL.
            check_body_size(body, limit, _LIMIT_SETTING)
            data = image_bytes(body)
            assert data is not None  # a string always decodes or raises
            return _check_values(decode_image(data, shape, _DTYPES[spec.dtype]), spec)
    csv = spec.encoding == "json" and _csv_like(body, spec.features)
    rows = _csv_values(body, spec.features) if csv else None
    if rows is not None:
        check_body_size(body, limit, _LIMIT_SETTING)
        return _csv_items(rows, spec, several)
    if spec.features is not None:
        expected_body += f' or a record {{"{spec.features[0]}": <a number>, ...}}'
    body = _parse_json(body, expected_body, limit)
    frame = _dataframe(body, spec) if type(body) is dict else _MISSING
    values = _field_value(body, spec.field) if frame is _MISSING else frame
    if spec.features is not None and frame is _MISSING:
        if type(body) is dict and (values is _MISSING or spec.field in spec.features):
            values = body  # the record itself
        values = _from_records(values, spec.features)
    if values is _MISSING:
        raise BadInputError(expected_body, _describe(body), reason="missing_field")
    # KServe's and TF Serving's protocol: {"instances": [...]} answered {"predictions": [...]}.
    wrapped = several and (
        frame is not _MISSING
        or (type(body) is dict and "instances" in body and _instances(body, spec))
    )
    if image:
        # Several files: under `instances`, or a list of strings under the field.
        several_files = (
            several
            and type(values) is list
            and len(values) > 1
            and (wrapped or all(type(v) is str for v in values))
        )
        listed = values if several_files else [values]
        files = _each_item(image_bytes, listed, several_files)
        if all(data is not None for data in files):
            _count_items(len(files), spec)
            images: list[torch.Tensor] = _each_item(
                lambda data: _check_values(decode_image(data, shape, _DTYPES[spec.dtype]), spec),
                files,
                several_files,
            )
            if several_files or wrapped:
                return Items(torch.stack(images), wrapped)
            return images[0]
    depth = _depth(values, len(shape))
    if several and depth > len(shape) and spec.length_dim is not None:
        # A list of items, each of its own length: each decoded alone, padded with the batch.
        if type(values) is list and (len(values) > 1 or wrapped):
            return _each_of_length(values, spec, wrapped)
    elif several and depth > len(shape):
        # A list of items, each of the input's shape: decoded and checked as one array.
        outer = _shape_of(values, len(shape) + 1, spec.dtype == "bool")
        if outer is not None and outer[1:] == shape and (outer[0] > 1 or wrapped):
            _count_items(outer[0], spec)
            return Items(decode_values(values, replace(spec, shape=outer)), wrapped)
        if type(values) is list and (len(values) > 1 or wrapped):
            # Items, one of them not of the input's shape (ragged, a string): each decoded
            # alone names the one and what is wrong with it ("nested more than 2 levels"
            # said nothing of either).
            each = _each_of_length(values, spec, wrapped)  # counts, and raises naming the item
            # Or each is one (some flat, some nested): the items, as one array.
            return Items(torch.stack(list(each.each())), wrapped)
    tensor = decode_values(values, spec, depth)
    return Items(tensor.unsqueeze(0), True) if wrapped else tensor


#: What every ``.npy`` file opens with.
_NPY_MAGIC = b"\x93NUMPY"


def _npy_like(body: Any, spec: InputSpec) -> bool:
    """A body that is an ``.npy`` file (``numpy.save``'s bytes, as SageMaker's
    ``application/x-npy`` clients send an array); not a raw float32 body of the input's exact
    size that happens to open alike."""
    return (
        isinstance(body, bytes | bytearray)
        and body[:6] == _NPY_MAGIC
        and not (spec.encoding == "float32" and len(body) == spec.numel * 4)
    )


def _npy_items(body: bytes, spec: InputSpec, several: bool) -> torch.Tensor | Items:
    """An ``.npy`` body's array: of the input's shape, the item; one dimension more, the
    request's items (as ``{"data": [...]}`` one level deeper), each checked as JSON values are
    (dtype, range). No pickled objects are read."""
    values, outer = _npy_values(body)
    shape = spec.shape or ()
    if several and len(outer) == len(shape) + 1 and outer[0] > 1:
        if spec.length_dim is not None:
            return _each_of_length(values, spec, False)
        if outer[1:] == shape:
            _count_items(outer[0], spec)
            return Items(decode_values(values, replace(spec, shape=outer)))
    if spec.length_dim is not None and len(outer) not in (len(shape), len(shape) + 1):
        items = " or one dimension more (items)" if several else ""
        raise BadInputError(
            f"an .npy array of shape {spec.shape_text} (an item){items}",
            f"an array of shape {list(outer)}",
            reason="wrong_shape",
        )
    if spec.length_dim is None and outer not in (shape, (spec.numel,), (1, *shape)):
        # Neither an item nor items of the input's shape: its shape, not "nested more than
        # N levels" (a [2, 3] array to a [4] input read so).
        items = f" or [N, {', '.join(map(str, shape))}] (N items)" if several else ""
        raise BadInputError(
            f"an .npy array of shape {list(shape)} (an item){items}",
            f"an array of shape {list(outer)}",
            reason="wrong_shape",
        )
    return decode_values(values, spec, len(outer))


def _npy_values(body: bytes) -> tuple[Any, tuple[int, ...]]:
    """An ``.npy`` file's numbers as nested lists, and its shape. Its header is read first,
    and its data must be exactly what the header says: numpy's own loader allocates the
    header's claimed size before it reads a stream."""
    import io

    expected = "an .npy file of numbers (numpy.save, no pickled objects)"
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(stream)
    except Exception as error:
        # numpy parses the header as a Python literal: whatever that raises (ValueError,
        # SyntaxError, tokenize's TokenError, ...) is the header's fault.
        detail = str(error).splitlines()[0][:120] if str(error) else type(error).__name__
        raise BadInputError(
            expected, f"one whose header does not read ({detail})", reason="not_json"
        ) from None
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise BadInputError(
            "an .npy array of numbers", f"an array of dtype {dtype}", reason="wrong_type"
        )
    data = body[stream.tell() :]
    count = math.prod(shape)
    if len(data) != count * dtype.itemsize:
        raise BadInputError(
            f"{expected}: {count * dtype.itemsize} bytes of data for shape {list(shape)}",
            f"{len(data)} bytes",
            reason="wrong_shape",
        )
    array = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")
    return array.tolist(), tuple(int(d) for d in shape)


#: MLflow's scoring server's request forms of a table: ``{"dataframe_split": {"columns": [...],
#: "data": [[...]]}}`` and ``{"dataframe_records": [{...}]}`` (answered, as it answers,
#: ``{"predictions": [...]}``).
DATAFRAME_KEYS = ("dataframe_split", "dataframe_records")


def _dataframe(body: Mapping[str, Any], spec: InputSpec) -> Any:
    """A table sent as MLflow's clients send one, as rows in the input's order (by column
    name where ``input.features`` names them); :data:`_MISSING` where the body is no such
    table."""
    if "dataframe_records" in body:
        records = body["dataframe_records"]
        if spec.features is None:
            raise BadInputError(
                "rows as arrays (or input.features naming the columns, to read records)",
                "dataframe_records",
                reason="wrong_shape",
            )
        if not (type(records) is list and records and all(type(r) is dict for r in records)):
            raise BadInputError(
                "dataframe_records: a list of records", _describe(records), reason="wrong_shape"
            )
        return _from_records(records, spec.features)
    split = body.get("dataframe_split")
    if split is None:
        return _MISSING
    data = split.get("data") if type(split) is dict else None
    if type(data) is not list or not data:
        raise BadInputError(
            'dataframe_split: an object {"columns": [...], "data": [[...], ...]}',
            _describe(split),
            reason="wrong_shape",
        )
    columns = split.get("columns")
    if spec.features is None or columns is None:
        return data  # positional: the columns in the input's order
    if type(columns) is not list or not all(type(c) is str for c in columns):
        raise BadInputError(
            "dataframe_split.columns: the column names", _describe(columns), reason="wrong_type"
        )
    return _from_records(
        [dict(zip(columns, row, strict=False)) if type(row) is list else row for row in data],
        spec.features,
    )


def _from_records(values: Any, names: Sequence[str]) -> Any:
    """A record (``{"age": 41, "income": 3.5}``), or a list of them, as the input's numbers
    in the order of ``input.features``; anything else as it is. A feature missing from a
    record is a 400 naming it; other keys (an id, a timestamp) are not read."""
    if type(values) is dict:
        return _record(values, names, "the record")
    if type(values) is list and values and all(type(v) is dict for v in values):
        return [_record(v, names, f"record {i}") for i, v in enumerate(values)]
    return values


def _record(record: Mapping[str, Any], names: Sequence[str], which: str) -> list[Any]:
    _all_named(names, record, "a value for each", f" in {which}")
    return [record[name] for name in names]


def _all_named(names: Sequence[str], present: Container[str], what: str, where: str) -> None:
    """A 400 naming the features (``input.features``) ``present`` lacks, if any."""
    missing = [name for name in names if name not in present]
    if missing:
        shown = ", ".join(map(repr, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise BadInputError(
            f"{what} of the {len(names)} features (input.features)",
            f"none for {shown}{where}",
            reason="missing_field",
        )


def _instances(body: Mapping[str, Any], spec: InputSpec) -> bool:
    """Whether ``body`` sends its input under ``instances`` (the default field absent, no
    ``inputs`` beside it: what :func:`_field_value` took)."""
    return (
        spec.field == InputSpec.field
        and "instances" in body
        and spec.field not in body
        and "inputs" not in body
    )


def _count_items(count: int, spec: InputSpec) -> None:
    """A 413 for a request of more than ``input.max_items`` items."""
    if count > spec.max_items:
        raise BadInputError(
            f"at most {spec.max_items} items of shape {spec.shape_text} a request "
            "(input.max_items)",
            f"{count} items",
            reason="too_large",
            status=413,
        )


#: Where other serving APIs put a request's input, taken when the default ``data`` is absent:
#: KServe's and TF Serving's ``instances`` (a batch, of which one item is taken), their and
#: text-serving APIs' ``inputs``.
FIELD_ALIASES = ("instances", "inputs")
#: No input in a request (a JSON null is one, which its check then refuses).
_MISSING: Any = object()


def _field_value(body: Any, field_name: str) -> Any:
    """A request's input in its parsed JSON: the field's value; a bare array (the input
    itself, as clients of array-taking servers send it); with the default field, one of
    :data:`FIELD_ALIASES` alone. :data:`_MISSING` where there is none."""
    if isinstance(body, list):
        return body
    if not isinstance(body, dict):
        return _MISSING
    if field_name in body:
        return body[field_name]
    return _aliased(body) if field_name == InputSpec.field else _MISSING


def _aliased(body: Mapping[str, Any]) -> Any:
    """What the one of :data:`FIELD_ALIASES` in ``body`` holds; :data:`_MISSING` where there
    is none, or more than one."""
    present = [key for key in FIELD_ALIASES if key in body]
    return body[present[0]] if len(present) == 1 else _MISSING


#: The byte-order mark some editors and spreadsheets put before UTF-8 text.
_UTF8_BOM = b"\xef\xbb\xbf"


def _csv_like(body: Any, features: Sequence[str] | None = None) -> bool:
    """A body that may be CSV (``text/csv``, as batch-scoring clients send a table's rows):
    text that opens with a number (JSON's objects and arrays open with a bracket), or with a
    line of column names before a line that does."""
    if not isinstance(body, str | bytes | bytearray):
        return False
    head = body[:64]
    if isinstance(head, bytes | bytearray):
        head = bytes(head).removeprefix(_UTF8_BOM).decode("latin-1")
    head = head.removeprefix("\ufeff").lstrip()
    if head[:1].isdigit() or head[:1] in ("-", "+", "."):
        return True
    if not head or head[0] in ("{", "["):
        return False  # JSON (or nothing): the common case stops here
    # A header line first (column names): CSV where a line of numbers follows it.
    text = body[:4096]
    if isinstance(text, bytes | bytearray):
        text = bytes(text).removeprefix(_UTF8_BOM).decode("latin-1")
    lines = text.removeprefix("\ufeff").lstrip().split("\n", 2)
    if features is not None and len(lines) > 1:
        # A header naming the input's features: its lines may open with an id.
        names = {c.strip().strip('"') for c in re.split("[,;\t]", lines[0])}
        if names.issuperset(features):
            return True
    return (
        len(lines) > 1
        and any(mark in lines[0] for mark in (",", ";", "\t"))
        and (lines[1].lstrip()[:1].isdigit() or lines[1].lstrip()[:1] in ("-", "+", "."))
    )


def _csv_values(
    body: str | bytes | bytearray, features: Sequence[str] | None = None
) -> list[list[int | float]] | None:
    """A CSV body's rows of numbers (its columns in the order ``features`` names them, where
    it has a header and the input names its features). None where it is no text (the JSON
    path then says what came); a 400 naming the first field that is not a number."""
    try:
        # utf-8-sig: a spreadsheet's export opens with a byte-order mark, no part of a field.
        text = body if isinstance(body, str) else bytes(body).decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    text = text.removeprefix("\ufeff")
    if text.lstrip()[:1] in ("[", "{") or not text.strip():
        return None  # a JSON array or object after all (a number may open it: [1, ...])
    rows: list[list[int | float]] = []
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    delimiter = _delimiter(lines[first]) if first is not None else ","
    columns: list[int] | None = None
    if first is not None and not any(_is_number(c) for c in lines[first].split(delimiter)):
        # The column names: the rows follow, in their order, or by name (input.features).
        header = [c.strip().strip('"') for c in lines[first].split(delimiter)]
        columns = _columns(header, features) if features is not None else None
        lines[first] = ""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = []
        cells = line.split(delimiter)
        # By name, the features' columns only: an id or a timestamp beside them is not read.
        for cell in cells if columns is None else _picked(cells, columns, number):
            try:
                row.append(_number(cell))
            except ValueError:
                raise BadInputError(
                    "CSV rows of numbers (or a JSON body)",
                    f"{cell.strip()[:40]!r} in line {number}",
                    reason="wrong_type",
                ) from None
        rows.append(row)
    return rows or None


def _columns(header: Sequence[str], features: Sequence[str]) -> list[int]:
    """Where each of ``features`` stands in a CSV header; a 400 naming those it lacks."""
    _all_named(features, header, "a CSV header naming each", "")
    return [header.index(name) for name in features]


def _picked(row: list[str], columns: Sequence[int], number: int) -> list[str]:
    if len(row) <= max(columns):
        raise BadInputError(
            "as many fields in each CSV line as its header names",
            f"{len(row)} in line {number}",
            reason="wrong_shape",
        )
    return [row[at] for at in columns]


def _csv_items(
    rows: list[list[int | float]], spec: InputSpec, several: bool
) -> torch.Tensor | Items:
    """A CSV body's rows, each one item flat (its numbers in the shape's order): one row the
    item, several a request's :class:`Items` (where the pipeline takes several)."""
    if len(rows) == 1:
        return decode_values(rows[0], spec)
    if several and spec.length_dim is not None and len(spec.shape or ()) == 1:
        return _each_of_length(list(rows), spec, False)  # a line a sequence, of its length
    if not several or spec.length_dim is not None:
        raise BadInputError(
            f"one item of shape {spec.shape_text} a request (TorchServe batches requests)",
            f"{len(rows)} CSV rows",
            reason="wrong_shape",
        )
    _count_items(len(rows), spec)
    shape = spec.shape or ()
    flat = decode_values(rows, replace(spec, shape=(len(rows), spec.numel)))
    return Items(flat.reshape(len(rows), *shape))


def _delimiter(line: str) -> str:
    """A table's field separator, from its first line: commas, else semicolons (a spreadsheet
    of a locale whose decimal mark is the comma), else tabs (TSV)."""
    for candidate in (",", ";", "\t"):
        if candidate in line:
            return candidate
    return ","


def _is_number(field: str) -> bool:
    try:
        _number(field)
    except ValueError:
        return False
    return True


def _number(field: str) -> int | float:
    """A CSV field as JSON would read it: an integer exactly, else a float."""
    text = field.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def _looks_like_json(body: bytes | bytearray) -> bool:
    """A body that starts as a JSON object or array does (sent without its Content-Type):
    no image file format starts with either."""
    head = bytes(body[:64]).lstrip()
    return head[:1] in (b"{", b"[")


def decode_values(values: Any, spec: InputSpec, depth: int | None = None) -> torch.Tensor:
    """One input's parsed JSON values → a tensor of ``spec.shape`` (nested as the shape, or
    flat), checked against the spec's dtype and range; raises :class:`BadInputError`.
    ``depth``: the values' nesting as :func:`_depth` counts it, where the caller has it."""
    shape = spec.shape
    assert shape is not None
    # The payload may nest at most as deep as the shape (or one level, flat).
    if depth is None:
        depth = _depth(values, len(shape))
    if depth > len(shape):
        # One level more: a batch around the item. A batch of one is the item (clients
        # written for servers that take a batch send [[...]]); more is refused by its count,
        # as TorchServe batches requests itself.
        outer = _shape_of(values, len(shape) + 1, spec.dtype == "bool")
        if outer is not None and (
            fits_shape(outer[1:], spec) if spec.length_dim is not None else outer[1:] == shape
        ):
            if outer[0] == 1:
                return decode_values(values[0], spec)
            raise BadInputError(
                f"one item of shape {spec.shape_text} a request (TorchServe batches requests)",
                f"{outer[0]} items (shape {list(outer)})",
                reason="wrong_shape",
            )
        raise BadInputError(
            f"an array nested {len(shape)} levels deep (shape {spec.shape_text})",
            f"one nested more than {len(shape)} levels",
            reason="too_deep",
        )
    got = _shape_of(values, len(shape), spec.dtype == "bool")
    if got is None:
        raise BadInputError(
            f"a rectangular array of numbers of shape {spec.shape_text}{_flat(spec)}",
            _describe(values)
            if not isinstance(values, list)
            else "an empty list"
            if not values
            else _list_fault(values, len(shape), spec.dtype == "bool"),
            reason="wrong_shape",
        )
    if spec.length_dim is not None:
        if not fits_shape(got, spec):
            raise BadInputError(
                f"shape {spec.shape_text}", f"shape {list(got)}", reason="wrong_shape"
            )
        shape = got
    elif got != shape and got != (spec.numel,):
        raise BadInputError(
            f"shape {list(shape)}{_flat(spec)}", f"shape {list(got)}", reason="wrong_shape"
        )
    if spec.dtype != "float32" and spec.mean is None and spec.std is None:
        # Decoded as the model takes them: through float32, large integers would lose digits
        # and values outside the dtype's range would wrap or overflow without a word.
        return _check_values(decode_as(values, spec.dtype).reshape(shape), spec)
    try:
        tensor = torch.tensor(values, dtype=torch.float32)
    except (OverflowError, RuntimeError, TypeError):
        # Integers beyond what a float32 or an int64 holds.
        raise BadInputError(
            "numbers within float32's range", "a number too large to convert", reason="out_of_range"
        ) from None
    try:
        return _check_values(tensor.reshape(shape), spec)
    except BadInputError as error:
        if error.reason == "not_finite":
            # Only on this path, not per request: tell a number past float32's range from NaN.
            _check_finite_range(values, "float32")
        raise


def _count_text(spec: InputSpec) -> str:
    """An input's dimensions as a request's numbers: ``3x4``; ``1 to 50`` or ``(1 to 50)x3``
    for a length each request chooses."""
    shape, at = spec.shape or (), spec.length_dim
    dims = [str(d) for d in shape]
    if at is not None:
        dims[at] = f"1 to {shape[at]}" if len(shape) == 1 else f"(1 to {shape[at]})"
    return "x".join(dims)


def _numbers_text(spec: InputSpec) -> str:
    """What a request sends for an input, in an answer's ``expected``: ``<3x4 numbers>``, or
    ``<a number>`` for a scalar one (``shape: []``; it read ``< numbers>``)."""
    return f"<{_count_text(spec)} numbers>" if spec.shape else "<a number>"


def _flat(spec: InputSpec) -> str:
    """How else a fixed shape may be sent: its numbers flat (not a variable length's)."""
    return f" (or {spec.numel} numbers flat)" if spec.length_dim is None else ""


def fits_shape(got: Sequence[int], spec: InputSpec) -> bool:
    """``got`` is an input of ``spec.shape``: equal, but for a variable length (``null``),
    which may be from 1 to ``input.max_length``."""
    shape, at = spec.shape or (), spec.length_dim
    return len(got) == len(shape) and all(
        (1 <= g <= d) if i == at else g == d
        for i, (g, d) in enumerate(zip(got, shape, strict=True))
    )


def _check_finite_range(values: Any, dtype: str) -> None:
    """A value finite as sent but beyond ``dtype``'s range is ``out_of_range``, not NaN."""
    try:
        wide = np.asarray(values, dtype=np.float64)
    except (OverflowError, ValueError, TypeError):
        wide = None
    if wide is None or bool(np.isfinite(wide).all()):
        raise BadInputError(
            f"numbers within {dtype}'s range", "a number too large for it", reason="out_of_range"
        )


#: Whole numbers from here on are not all float64's: 2**53 + 1 reads as 2**53.
_FLOAT_WHOLE = float(2**53)


def _exact_whole(values: Any, lo: int, hi: int, dtype: str) -> np.ndarray[Any, Any]:
    """``values`` as int64, each number as it was sent (a Python int exactly), checked against
    ``[lo, hi]``: the slow path for numbers past float64's whole ones."""
    objects = np.array(values, dtype=object)
    whole: list[int] = []
    for value in objects.flat:
        if isinstance(value, float | np.floating) and float(value).is_integer():
            value = int(value)
        if not isinstance(value, int | np.integer):
            raise BadInputError(
                f"whole numbers (input dtype {dtype})", _describe(value), reason="wrong_type"
            )
        if not lo <= int(value) <= hi:
            raise BadInputError(
                f"whole numbers in [{lo}, {hi}] (input dtype {dtype})",
                f"{int(value)}",
                reason="out_of_range",
            )
        whole.append(int(value))
    return np.array(whole, dtype=np.int64).reshape(objects.shape)


def decode_as(values: Any, dtype: str) -> torch.Tensor:
    """Rectangular numbers (nested lists, or an array) as a tensor of ``dtype``, exactly, or
    :class:`BadInputError` for a value that dtype cannot hold: a request's payload, and a
    reference array, as the model takes them."""
    target = _DTYPES[dtype]
    if target.is_floating_point:
        try:
            wide = torch.tensor(values, dtype=torch.float64)
        except (OverflowError, RuntimeError, TypeError):
            raise BadInputError(
                f"numbers within {dtype}'s range",
                "a number too large to convert",
                reason="out_of_range",
            ) from None
        if not bool(torch.isfinite(wide).all()):
            raise BadInputError("finite numbers", "NaN or Infinity", reason="not_finite")
        if target != torch.float64:
            top = float(torch.finfo(target).max)
            if float(wide.abs().max()) > top:
                raise BadInputError(
                    f"numbers within {dtype}'s range (|x| <= {top:g})",
                    f"values up to {float(wide.abs().max()):g}",
                    reason="out_of_range",
                )
        return wide.to(target)
    # Whole numbers: ints stay ints (no rounding through a float), floats must be whole.
    if target == torch.bool:
        lo, hi = 0, 1
    else:
        info = torch.iinfo(target)
        lo, hi = info.min, info.max
    array = np.asarray(values)
    if array.dtype.kind == "f":
        if not bool(np.isfinite(array).all()):
            raise BadInputError("finite numbers", "NaN or Infinity", reason="not_finite")
        if not bool((array == np.round(array)).all()):
            raise BadInputError(
                f"whole numbers (input dtype {dtype})", "fractional values", reason="wrong_type"
            )
        if array.size and float(np.abs(array).max()) >= _FLOAT_WHOLE:
            # Past 2**53 a float64 holds only some whole numbers: an int sent beside a float
            # (or past int64) was rounded as numpy read it, and 2**63 - 1 reads as 2**63.
            array = _exact_whole(values, lo, hi, dtype)
    elif array.dtype.kind not in "iub":  # JSON's true and false: a bool input's 1 and 0
        # Python ints beyond uint64 make an object array.
        array = _exact_whole(values, lo, hi, dtype)
    if array.size and (array.min() < lo or array.max() > hi):
        raise BadInputError(
            f"whole numbers in [{lo}, {hi}] (input dtype {dtype})",
            f"values in [{array.min():g}, {array.max():g}]",
            reason="out_of_range",
        )
    return torch.from_numpy(array.astype(np.int64)).to(target)


_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    # Raw image bytes: a model that converts and scales them itself.
    "uint8": torch.uint8,
    "bool": torch.bool,
}

Preprocess = Callable[[Any], Any]


def load_preprocess(path: str, model_dir: str | Path | None) -> Preprocess:
    """The ``module:function`` of ``input.preprocess``, imported from the model directory."""
    module_name, function = path.split(":")
    directory = Path(model_dir) if model_dir is not None else Path.cwd()
    file = directory / (module_name.replace(".", "/") + ".py")
    if not file.is_file():
        raise ConfigError(
            f"input.preprocess: expected {file.name} in the model directory {directory}, "
            "got no such file (add it to the archive)"
        )
    spec = importlib.util.spec_from_file_location(f"hookwatch_preprocess_{module_name}", file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"input.preprocess: cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError(
            f"input.preprocess: expected a function {function!r} in {file.name}, got "
            f"{type(fn).__name__}"
        )
    return cast(Preprocess, fn)


class InputPipeline:
    """A request's payload → one item of the model's input, and items → the model's batch.

    :meth:`decode` runs per request (bad payloads raise :class:`BadInputError`);
    :meth:`batch` stacks decoded items and applies dtype and normalisation once per batch.
    Reference data for a profile goes through :meth:`batch` too, so the profile sees exactly
    what serving feeds the model.
    """

    def __init__(self, spec: InputSpec, model_dir: str | Path | None = None) -> None:
        self.spec = spec
        self._preprocess = (
            load_preprocess(spec.preprocess, model_dir) if spec.preprocess is not None else None
        )
        self._dtype = _DTYPES[spec.dtype]
        #: A request may send a list of several items (not to a preprocess function: it
        #: takes the payload whole).
        self.takes_several = spec.max_items > 1 and spec.preprocess is None
        #: A request's items of a length each chooses may differ in length (padded together).
        #: False where the model is served one request a batch: its padding was never
        #: checked (``archive`` profiles such a model unpadded), so they must be of one length.
        self.mixed_lengths = True
        #: Set when :meth:`decode` gave :class:`Items` since the service last looked (one
        #: attribute read a batch, where a scan of its items would cost every batch).
        self.several_seen = False
        # Decided once: a request pays a comparison for it (a preprocess model's shape, where
        # given, sizes it too; without one, 1 MiB unless configured).
        self._limit = body_limit(spec.numel, spec.max_body_bytes, image=spec.encoding == "image")
        shape = spec.shape or ()
        view = (-1, *([1] * (len(shape) - 1))) if shape else (-1,)
        self._mean = (
            torch.tensor(spec.mean, dtype=torch.float32).reshape(view)
            if spec.mean is not None
            else None
        )
        self._std = (
            torch.tensor(spec.std, dtype=torch.float32).reshape(view)
            if spec.std is not None
            else None
        )

    def decode(self, body: Any) -> torch.Tensor | Items:
        """One request's payload → one item, or :class:`Items` for a list of several."""
        if self._preprocess is None:
            item = decode_payload(body, self.spec, self._limit, self.takes_several)
            if type(item) is Items:
                self.several_seen = True
                if not self.mixed_lengths and type(item.rows) is tuple:
                    _one_length([row.shape for row in item.rows], "items")
            return item
        payload = _parse_json(
            body, "a payload the model's preprocess function accepts", self._limit
        )
        if isinstance(payload, NoPayload):
            # Never the user's function's to see: it is hookwatch's marker, not a request's.
            raise BadInputError(
                "a payload the model's preprocess function accepts",
                repr(payload),
                reason="missing_field",
            )
        try:
            result = self._preprocess(payload)
        except (ValueError, TypeError, KeyError, IndexError, RecursionError) as error:
            raise BadInputError(
                "a payload the model's preprocess function accepts",
                f"{error}"[:200] or type(error).__name__,
                reason="preprocess",
            ) from None
        tensor = result if isinstance(result, torch.Tensor) else torch.as_tensor(result)
        if self.spec.shape is not None and not fits_shape(tensor.shape, self.spec):
            raise BadInputError(
                f"shape {self.spec.shape_text}",
                f"shape {list(tensor.shape)}",
                reason="wrong_shape",
            )
        return tensor

    def table(self, text: str) -> torch.Tensor:
        """A CSV table (a reference's held-out rows) as raw items ``[N, *shape]``: read as a
        CSV body is, its header matched by name (``input.features``), without the per-request
        item limit; a :class:`BadInputError` says what is wrong where."""
        rows = _csv_values(text, self.spec.features)
        if not rows:
            raise BadInputError("CSV rows of numbers", "none", reason="wrong_shape")
        numel = self.spec.numel
        flat = decode_values(rows, replace(self.spec, shape=(len(rows), numel), length_dim=None))
        return flat.reshape(len(rows), *(self.spec.shape or ()))

    def decode_rows(self, rows: list[Any]) -> torch.Tensor | Items:
        """A request's items sent as a tensor's rows (the Open Inference Protocol's batch,
        :mod:`hookwatch._oip`): several as :class:`Items`, answered an answer an item; an
        image a row where the rows are files in base64."""
        spec = self.spec
        if spec.encoding == "image" and all(isinstance(row, str | bytes) for row in rows):
            shape, dtype = spec.shape or (), _DTYPES[spec.dtype]
            files = [image_bytes(row) for row in rows]
            _count_items(len(files), spec)
            images = [
                _check_values(decode_image(f, shape, dtype), spec) for f in files if f is not None
            ]
            self.several_seen = True
            return Items(torch.stack(images), True)
        if not self.takes_several:
            if len(rows) != 1:
                raise BadInputError(
                    f"one item of shape {spec.shape_text} a request (input.max_items is 1)",
                    f"{len(rows)} items",
                    reason="wrong_shape",
                )
            return decode_values(rows[0], spec)
        if spec.length_dim is not None:
            self.several_seen = True
            return _each_of_length(rows, spec, True)
        _count_items(len(rows), spec)
        shape = (len(rows), *(spec.shape or ()))
        try:
            values = decode_values(rows, replace(spec, shape=shape))
        except BadInputError as error:
            if error.reason != "wrong_shape":
                raise
            raise BadInputError(
                f"{len(rows)} items of shape {spec.shape_text} (shape {list(shape)})",
                error.got,
                reason="wrong_shape",
            ) from None
        self.several_seen = True
        return Items(values, True)

    def batch(self, items: Sequence[torch.Tensor | Items] | torch.Tensor) -> torch.Tensor | Padded:
        """Stacked items as the model takes them: dtype, then ``(x - mean) / std``; items of
        a variable length padded to the longest (:class:`Padded`)."""
        at = self.spec.length_dim
        if at is not None:
            if not isinstance(items, torch.Tensor) and any(type(i) is Items for i in items):
                # A request's several items: each its own row of the padded batch.
                items = [
                    row
                    for item in items
                    for row in (item.each() if isinstance(item, Items) else (item,))
                ]
            return self._padded(items, at)  # type: ignore[arg-type]
        return self.stacked(items)

    def stacked(self, items: Sequence[torch.Tensor | Items] | torch.Tensor) -> torch.Tensor:
        """Items of one shape stacked as the model takes them (:meth:`batch` without the
        padding of a variable length); a request's several (:class:`Items`) in its place."""
        if isinstance(items, torch.Tensor):
            x = items
        elif any(isinstance(item, Items) for item in items):
            x = torch.cat(
                [
                    _stacked_rows(item) if isinstance(item, Items) else item.unsqueeze(0)
                    for item in items
                ]
            )
        else:
            x = torch.stack(list(items))  # type: ignore[arg-type]
        return self._scaled(x)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        if self._mean is not None or self._std is not None:
            x = x.float()
            if self._mean is not None:
                x = x - self._mean
            if self._std is not None:
                x = x / self._std
        return x if x.dtype == self._dtype else x.to(self._dtype)

    def _padded(self, items: Sequence[torch.Tensor] | torch.Tensor, at: int) -> Padded:
        """Items of a variable length ``at`` as one batch: each scaled as a fixed-shape
        batch is, and padded after it with ``input.pad_value`` (what the model sees there)."""
        if isinstance(items, torch.Tensor):
            # Equal lengths (a reference array): nothing to pad.
            x = self._scaled(items)
            lengths = torch.full((x.shape[0],), x.shape[at + 1], dtype=torch.int64)
            return self._wrap(x, lengths, at)
        counts = [int(item.shape[at]) for item in items]
        longest = max(counts)
        first = items[0]
        shape = (len(items), *first.shape[:at], longest, *first.shape[at + 1 :])
        raw = first.new_zeros(shape)
        for row, (item, count) in enumerate(zip(items, counts, strict=True)):
            raw[row].narrow(at, 0, count).copy_(item)
        x = self._scaled(raw)
        lengths = torch.tensor(counts, dtype=torch.int64)
        padded = self._wrap(x, lengths, at)
        if min(counts) < longest:
            x.masked_fill_(~padded.valid(), self.spec.pad_value)
        return padded

    def _wrap(self, x: torch.Tensor, lengths: torch.Tensor, at: int) -> Padded:
        spec = self.spec
        return Padded(x, lengths, at + 1, spec.lengths, spec.mask, spec.pad_value)

    def call(self, model: nn.Module, x: torch.Tensor | Padded) -> Any:
        """The forward pass, with the input positional or as ``input.argument``; a padded
        batch with its lengths or mask as their keywords."""
        if isinstance(x, Padded):
            return x.call(model)
        if self.spec.argument is None:
            return model(x)
        return model(**{self.spec.argument: x})


@dataclass(frozen=True)
class InstanceArguments:
    """A request's objects of arguments sent as ``{"instances": [{...}, ...]}`` (one or up
    to :data:`MAX_INSTANCES`), each a sample: answered ``{"predictions": [...]}``, as
    KServe's and TF Serving's protocol answers."""

    rows: tuple[dict[str, torch.Tensor], ...]

    def __len__(self) -> int:
        return len(self.rows)


#: Most objects of arguments one request may send under ``instances`` (``input.max_items``'s
#: default: a several-argument input takes no keys beside ``arguments``).
MAX_INSTANCES = 64


def _count_instances(count: int, expected: str) -> None:
    """One to :data:`MAX_INSTANCES` objects of arguments in a request's list: none is a 400
    (an empty batch reached the forward: a 503), more a 413."""
    if not count:
        raise BadInputError(expected, "an empty list", reason="wrong_shape")
    if count > MAX_INSTANCES:
        raise BadInputError(
            f"at most {MAX_INSTANCES} instances a request",
            f"{count} instances",
            reason="too_large",
            status=413,
        )


class ArgumentsPipeline:
    """A request of several tensors (``input.arguments``) → one item per keyword argument of
    the forward, and items → the forward's keyword arguments.

    The request is one JSON object with a field per argument, named as the argument; each
    field is decoded and checked as a single input of its declaration is, and an error names
    the argument. Each argument is stacked, cast and normalised on its own.
    """

    def __init__(self, spec: InputSpec, model_dir: str | Path | None = None) -> None:
        self.spec = spec
        self.parts = {part.field: InputPipeline(part, model_dir) for part in spec.arguments}
        self._limit = body_limit(spec.numel, spec.max_body_bytes)
        fields_ = ", ".join(f'"{part.field}": {_numbers_text(part)}' for part in spec.arguments)
        self._expected = f"a JSON object {{{fields_}}}"
        #: Set when :meth:`decode` gave :class:`InstanceArguments` since the service last
        #: looked (as :attr:`InputPipeline.several_seen`).
        self.several_seen = False
        #: As :attr:`InputPipeline.mixed_lengths`, for the objects under ``instances``.
        self.mixed_lengths = True
        #: The argument of a variable length (padded), and where it is declared; None: none.
        self._variable = next(
            (i for i, part in enumerate(spec.arguments) if part.length_dim is not None), None
        )

    def decode(self, body: Any) -> dict[str, torch.Tensor] | InstanceArguments:
        """One request's object of arguments → an item; its objects under ``instances``
        (KServe's and TF Serving's row format) → :class:`InstanceArguments`."""
        parsed = _parse_json(body, self._expected, self._limit)
        payload = self._fields(parsed)
        if type(payload) is list:
            # Sent as KServe's and TF Serving's clients send it: answered as they read it.
            _count_instances(len(payload), self._expected)
            self.several_seen = True
            several = InstanceArguments(tuple(self._item(row) for row in payload))
            if self._variable is not None and not self.mixed_lengths:
                name = self.spec.arguments[self._variable].field
                _one_length([row[name].shape for row in several.rows], f"{name}s")
            return several
        return self._item(payload)

    def _item(self, payload: Any) -> dict[str, torch.Tensor]:
        if not isinstance(payload, dict) or not all(name in payload for name in self.parts):
            raise BadInputError(self._expected, _describe(payload), reason="missing_field")
        item: dict[str, torch.Tensor] = {}
        for name, part in self.parts.items():
            try:
                item[name] = decode_values(payload[name], part.spec)
            except BadInputError as error:
                raise BadInputError(
                    f"{name}: {error.expected}", error.got, error.status, error.reason
                ) from None
        return item

    def _fields(self, payload: Any) -> Any:
        """The object holding the arguments' fields: the payload, or where it lacks them, what
        one of :data:`FIELD_ALIASES` alone holds; under ``instances``, the list of objects
        (KServe's and TF Serving's row format), of one to :data:`MAX_INSTANCES`."""
        if not isinstance(payload, dict) or all(name in payload for name in self.parts):
            return payload
        inner = _aliased(payload)
        if isinstance(inner, list) and not inner:
            _count_instances(0, self._expected)
        if isinstance(inner, list) and all(isinstance(row, dict) for row in inner) and inner:
            if "instances" not in payload:
                if len(inner) > 1:
                    raise BadInputError(
                        "one object of arguments a request (or several under instances)",
                        f"{len(inner)} objects",
                        reason="wrong_shape",
                    )
                return inner[0]
            _count_instances(len(inner), self._expected)
            return inner
        return inner if isinstance(inner, dict) else payload

    def batch(
        self, items: Sequence[Mapping[str, torch.Tensor] | InstanceArguments]
    ) -> dict[str, torch.Tensor] | Padded:
        """Each argument's items stacked, cast and normalised as its declaration says; one of
        a variable length padded to its longest, the others beside it (:class:`Padded`); a
        request's several objects (:class:`InstanceArguments`) in its place."""
        rows = [
            row
            for item in items
            for row in (item.rows if isinstance(item, InstanceArguments) else (item,))
        ]
        return self.columns({name: [row[name] for row in rows] for name in self.parts})

    def columns(
        self, values: Mapping[str, Sequence[torch.Tensor] | torch.Tensor]
    ) -> dict[str, torch.Tensor] | Padded:
        """:meth:`batch` of each argument's items, or of its samples stacked (a reference
        array per argument)."""
        if self._variable is None:
            return {name: part.stacked(values[name]) for name, part in self.parts.items()}
        fixed: list[tuple[str, torch.Tensor]] = []
        padded: Padded | None = None
        field_name = ""
        for name, part in self.parts.items():
            batched = part.batch(values[name])
            if isinstance(batched, Padded):
                padded, field_name = batched, name
            else:
                fixed.append((name, batched))
        assert padded is not None
        return replace(padded, field=field_name, others=tuple(fixed), at=self._variable)


#: A forward's input: one tensor, or keyword arguments (token ids, attention mask, ...), or a
#: padded batch of a variable length.
ModelInputs = torch.Tensor | dict[str, torch.Tensor] | Padded
#: Decodes requests for a model: a tensor (``input.shape``/``preprocess``), several
#: (``input.arguments``) or text.
Pipeline = InputPipeline | ArgumentsPipeline | TextPipeline


def make_pipeline(spec: InputSpec, model_dir: str | Path | None = None) -> Pipeline:
    """The pipeline ``spec`` asks for; text needs ``hookwatch[text]`` (transformers)."""
    if spec.text is not None:
        return TextPipeline(spec.text, model_dir, spec.argument)
    if spec.arguments:
        return ArgumentsPipeline(spec, model_dir)
    return InputPipeline(spec, model_dir)


def batch_inputs(pipeline: Pipeline, items: Sequence[Any]) -> ModelInputs:
    """Decoded items as one forward's input."""
    # Calls that read alike: the pipelines batch different items (token lists, tensors).
    if isinstance(pipeline, TextPipeline):
        return pipeline.batch(items)
    if isinstance(pipeline, ArgumentsPipeline):
        return pipeline.batch(items)
    return pipeline.batch(items)


def _with_steps(output: OutputSpec, answer_steps: Sequence[str] | None) -> OutputSpec:
    """``output`` with ``steps`` as the archive found the head (:attr:`ModelSpec.answer_steps`)
    where the config leaves it unset; else as it is."""
    if answer_steps is None or output.steps is not None:
        return output
    return replace(output, steps="head" in answer_steps)


def _step_mask(inputs: ModelInputs | None) -> torch.Tensor | None:
    """Which steps of a padded batch are each sample's own, ``[rows, steps]``: a batch padded
    to its longest (a variable first dimension), or texts padded to the longest (their
    attention mask, whichever side the tokenizer pads); None for any other batch."""
    if isinstance(inputs, Padded):
        mask = inputs.step_mask()
    elif isinstance(inputs, dict):
        mask = inputs.get("attention_mask")
    else:
        return None
    if mask is None or mask.dim() != 2:
        return None
    return mask.bool()


def _has_steps(outputs: Any, mask: torch.Tensor, dims: int) -> bool:
    """``outputs`` may have a step per step of the batch ``mask`` describes: ``dims``
    dimensions or more, its first two the mask's. Where the archive did not find out, the
    head's shape is all there is (a ``[batch, C]`` head is left whole even when C equals the
    longest: three dimensions are asked of it)."""
    return (
        isinstance(outputs, torch.Tensor)
        and outputs.dim() >= dims
        and tuple(outputs.shape[:2]) == tuple(mask.shape)
    )


def _all_finite(x: torch.Tensor) -> bool:
    """No NaN or Infinity in ``x`` (on the host). A float64 sum first: finite exactly when
    every value is, short of an overflow, which the exact test then settles; a third of the
    cost of ``torch.isfinite(x).all()`` on a small output, paid on every batch."""
    if not x.is_floating_point():
        return True
    try:
        values = x.numpy()
    except TypeError:  # bfloat16: numpy has no such dtype
        return bool(torch.isfinite(x).all())
    return math.isfinite(float(values.sum(dtype=np.float64))) or bool(np.isfinite(values).all())


def _nulls(value: Any) -> Any:
    """``value`` (nested lists of numbers) with NaN and Infinity as None: JSON has neither."""
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return value if not isinstance(value, float) or math.isfinite(value) else None


def _items_to_host(item: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.detach().cpu() for key, value in item.items()}


def _v2_error(error: BadInputError) -> dict[str, Any]:
    """An error as the Open Inference Protocol's clients read it: the whole message under
    ``error`` (what they raise), hookwatch's fields beside it."""
    return {**error.as_dict(), "error": str(error)}


def _items_answer(item: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """A sample's dict of tensors as JSON: each entry's values nested as its shape, integers
    exact, NaN and Infinity as null."""
    answer: dict[str, Any] = {}
    for key, value in item.items():
        if value.is_floating_point():
            wide = value.dtype == torch.float64  # kept: as float32 it lost digits
            answer[str(key)] = _nulls((value if wide else value.float()).tolist())
        elif value.is_complex():
            answer[str(key)] = _nulls(value.abs().float().tolist())
        else:
            answer[str(key)] = value.tolist()
    return answer


def _row_dims(outputs: torch.Tensor | list[Any]) -> int:
    """Dimensions of one output row: of ``[B, C]`` 1, of per-position ``[B, T, C]`` 2."""
    if isinstance(outputs, torch.Tensor):
        return outputs.dim() - 1
    return outputs[0].dim() if outputs else 0


def _out_of_resources(error: BaseException) -> bool:
    # The server's fault, not the request's: TorchServe answers these with a 507 (a CUDA
    # error, a device-side assert included, leaves the device unusable for every request).
    return isinstance(error, MemoryError | torch.OutOfMemoryError) or "CUDA" in str(error)


def _error_summary(error: BaseException) -> str:
    """An exception's type and the first line of its message, short."""
    text = error_line(error)
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


def _refused(error: BaseException) -> BadInputError:
    """A 422 for a request the model's forward raised on alone, with what it said."""
    return BadInputError(
        "an input the model's forward accepts",
        f"one it refused ({_error_summary(error)})",
        status=422,
        reason="model_refused",
    )


def call_model(pipeline: Pipeline, model: nn.Module, inputs: ModelInputs) -> Any:
    """The forward pass: keyword arguments as they are (``input.arguments`` with
    ``input.argument``: together as one dict under that keyword), a tensor as the input spec
    says, a padded batch with its own keywords."""
    if isinstance(inputs, Padded):
        return inputs.call(model)
    if isinstance(inputs, dict):
        if isinstance(pipeline, ArgumentsPipeline) and pipeline.spec.argument is not None:
            return model(**{pipeline.spec.argument: inputs})
        if isinstance(pipeline, TextPipeline) and pipeline.argument is not None:
            # A copy: such a forward may add its outputs to the dict it is given.
            return model(**{pipeline.argument: dict(inputs)})
        return model(**inputs)
    assert isinstance(pipeline, InputPipeline)
    return pipeline.call(model, inputs)


def to_device(inputs: ModelInputs, device: torch.device) -> ModelInputs:
    if isinstance(inputs, dict):
        return {name: value.to(device) for name, value in inputs.items()}
    return inputs.to(device)


def input_tensor(inputs: ModelInputs) -> torch.Tensor | dict[str, torch.Tensor]:
    """What the model's input hook reads of a forward's input: a padded batch's values (beside
    ``input.arguments``, the keyword arguments the forward is called with)."""
    if isinstance(inputs, Padded):
        return inputs.values if inputs.field is None else inputs.call_arguments()
    return inputs


@dataclass
class DecodedBatch:
    """Valid inputs stacked for one forward pass, and the error of each invalid item."""

    size: int
    inputs: ModelInputs | None
    positions: list[int]
    errors: dict[int, BadInputError]
    #: Rows of the forward's batch per valid request, in ``positions`` order (None: one each;
    #: a request of several texts has several).
    sizes: list[int] | None = None
    #: Requests that sent a list of items: their answer is a list.
    listed: frozenset[int] = frozenset()
    #: ``time.perf_counter()`` when the batch was received: its answers' duration starts here.
    received: float = 0.0
    #: The decoded items, in ``positions`` order: a batch whose forward raised runs them alone.
    items: list[Any] = field(default_factory=list)
    #: The monitor's requests, counted on arrival (None: unmonitored): the batch's forward and
    #: rejects go through it, so that none is counted twice.
    arrivals: ReceivedRequests | None = None
    #: The batch's forward is due to be sampled (``RequestPath.arrived``): it is decided
    #: before the forward; any other forward runs unhooked.
    due: bool = False
    #: Requests of ``listed`` sent as ``{"instances": [...]}``: answered
    #: ``{"predictions": [...]}``, as KServe's and TF Serving's protocol answers.
    wrapped: frozenset[int] = frozenset()
    #: Requests of the Open Inference Protocol, by position: answered as its response
    #: (None: no such request in the batch, most batches).
    v2: dict[int, _oip.InferRequest] | None = None


@dataclass
class BatchResult:
    size: int
    #: The forward's output rows: a tensor, or a list of rows where requests ran alone, or
    #: of one dict of tensors a sample (a detector's).
    outputs: torch.Tensor | list[Any] | None
    positions: list[int]
    errors: dict[int, BadInputError]
    sizes: list[int] | None = None
    listed: frozenset[int] = frozenset()
    received: float = 0.0
    #: The forward was sampled (hooked): its duration measures what sampling costs.
    sampled: bool = False
    #: Each row's own steps where the output has a step per step of a padded batch
    #: (``[rows, longest, ...]``): its answer holds those, padding is no sample's.
    steps: torch.Tensor | None = None
    #: The same for the ``output.also`` parts with a step per input step (the archive's
    #: :attr:`ModelSpec.answer_steps`), where one is answered.
    also_steps: torch.Tensor | None = None
    #: The output's other parts answered beside the head's (``output.also``), a row each.
    also: dict[str, torch.Tensor] | None = None
    #: Requests answered ``{"predictions": [...]}`` (:attr:`DecodedBatch.wrapped`).
    wrapped: frozenset[int] = frozenset()
    #: Requests answered as the Open Inference Protocol's response (:attr:`DecodedBatch.v2`).
    v2: dict[int, _oip.InferRequest] | None = None


#: A logits head answers every class's probability up to this many classes, the top 5 above.
FULL_PROBABILITIES = 20


class ModelService:
    """Decode requests, run the model under its monitor, answer as the output head says.

    ``monitor=None`` serves the same requests unmonitored: the baseline the bench compares to.
    """

    def __init__(
        self,
        model: nn.Module,
        spec: InputSpec,
        monitor: Monitor | None,
        labels: Sequence[str] | None = None,
        device: torch.device | None = None,
        output: OutputSpec | None = None,
        model_dir: str | Path | None = None,
        model_name: str = "",
        answer_steps: Sequence[str] | None = None,
    ) -> None:
        self.model = model
        #: Named in the Open Inference Protocol's responses.
        self.model_name = model_name
        self.spec = spec
        self.pipeline = make_pipeline(spec, model_dir)
        #: The pipeline when its requests may send several items (:class:`Items`), or their
        #: arguments under ``instances`` (:class:`InstanceArguments`).
        self._items: InputPipeline | ArgumentsPipeline | None = (
            self.pipeline
            if isinstance(self.pipeline, ArgumentsPipeline)
            or (isinstance(self.pipeline, InputPipeline) and self.pipeline.takes_several)
            else None
        )
        self.monitor = monitor
        self.labels = list(labels) if labels is not None else None
        self.device = device or torch.device("cpu")
        self.output = output or OutputSpec()
        self._log = RateLimitedLog(log)
        # The monitor's request path, bound once: one call per phase on every batch.
        self._path = monitor._request_path() if monitor is not None else None
        #: Batches are padded (a length each request chooses): decided once, not per batch.
        self._padded = spec.variable is not None
        #: A per-step output may be cut at each sample's own steps: padded or text batches.
        self._stepped = self._padded or isinstance(self.pipeline, TextPipeline)
        #: Which answered parts have a step per input step (:attr:`ModelSpec.answer_steps`):
        #: the head's cut where None (not known) when its shape reads so; the
        #: ``output.also`` parts named here cut too.
        self._head_steps = _with_steps(self.output, answer_steps).steps
        self._also_steps = frozenset(answer_steps or ()) & {str(p) for p in self.output.also}
        if self._head_steps is False and not self._also_steps:
            self._stepped = False
        #: Requests may come as the Open Inference Protocol's tensors: not to a preprocess
        #: function (it reads its own payloads).
        self._oip = not (isinstance(self.pipeline, InputPipeline) and spec.preprocess is not None)

    @classmethod
    def from_handler_config(
        cls,
        model: nn.Module,
        handler: HandlerConfig,
        model_name: str,
        metrics: MetricSet | None = None,
        device: torch.device | None = None,
        monitored: bool = True,
        model_dir: str | None = None,
        batch_size: int | None = None,
        answer_steps: Sequence[str] | None = None,
    ) -> ModelService:
        """Serve ``model`` as a model-config's ``handler:`` section says.

        ``monitored=False`` serves the same requests with nothing attached. The drift profile
        is looked up in ``model_dir`` (where TorchServe extracts the .mar). ``batch_size``:
        the server's (TorchServe's ``batchSize``); 1 keeps a request's several items of a
        variable length to one length (nothing is padded). ``answer_steps``: the archive's
        :attr:`ModelSpec.answer_steps`.
        """
        config = handler.monitoring
        # As the archive found it: the hooks read the output's steps the way it is answered.
        output = _with_steps(config.output, answer_steps)
        if output is not config.output:
            config = replace(config, output=output)
        monitor = None
        if monitored:
            plan = plan_watch(model, config, model_name)
            config = plan.config
            drift, faulted = serving_tracker(config, model_dir, model_name)
            monitor = Monitor(model, plan, metrics=metrics, drift=drift, load_faults=int(faulted))
        service = cls(
            model,
            handler.input,
            monitor,
            handler.labels,
            device,
            config.output,
            model_dir,
            model_name,
            answer_steps,
        )
        if batch_size == 1 and isinstance(service.pipeline, InputPipeline | ArgumentsPipeline):
            service.pipeline.mixed_lengths = False
        return service

    def decode(self, bodies: Sequence[Any]) -> DecodedBatch:
        received = time.perf_counter()
        items: list[Any] = []
        positions: list[int] = []
        errors: dict[int, BadInputError] = {}
        # Counted on arrival: a worker killed while decoding or running the batch has still
        # counted it, as TorchServe has.
        path = self._path
        arrivals = None
        due = False
        if path is not None:
            due = path.arrived(len(bodies))
            arrivals = path.received
        v2: dict[int, _oip.InferRequest] | None = None
        for index, body in enumerate(bodies):
            try:
                if self._oip and _oip.candidate(body):
                    v2 = v2 or {}
                    # Answered in the protocol's form, an error too (the request, once read).
                    v2[index] = _oip.InferRequest(())
                    request = self._read_request(body)
                    if request is None:
                        del v2[index]
                    else:
                        v2[index] = request
                        items.append(self._request_item(request))
                        positions.append(index)
                        continue
                items.append(self.pipeline.decode(body))
                positions.append(index)
            except BadInputError as error:
                errors[index] = error
            except Exception as error:
                # Whatever a payload makes decoding raise is the payload's fault: a 400 for
                # that item, never a 5xx for the batch. Logged: it names a decoder gap.
                errors[index] = BadInputError(
                    "a payload this model can decode",
                    f"one that failed decoding ({type(error).__name__})",
                    reason="unreadable",
                )
                self._log.warning(
                    f"decode:{type(error).__name__}",
                    "hookwatch: decoding a request failed (%s: %s); answered 400",
                    type(error).__name__,
                    str(error)[:200],
                )
        if errors and arrivals is not None:
            for reason, count in Counter(e.reason for e in errors.values()).items():
                arrivals.reject(count, reason)
        inputs = to_device(batch_inputs(self.pipeline, items), self.device) if items else None
        sizes: list[int] | None = None
        listed: frozenset[int] = frozenset()
        wrapped: frozenset[int] = frozenset()
        if isinstance(self.pipeline, TextPipeline):
            sizes = [item.rows for item in items]
            listed = frozenset(p for p, item in zip(positions, items, strict=True) if item.listed)
            wrapped = frozenset(p for p, item in zip(positions, items, strict=True) if item.wrapped)
        elif self._items is not None and self._items.several_seen:
            # A request of several items: its rows side by side, answered as a list.
            self._items.several_seen = False
            sizes = [
                len(item) if type(item) is Items or type(item) is InstanceArguments else 1
                for item in items
            ]
            several = [
                (p, item)
                for p, item in zip(positions, items, strict=True)
                if type(item) is Items or type(item) is InstanceArguments
            ]
            listed = frozenset(p for p, _ in several)
            wrapped = frozenset(
                p for p, item in several if not isinstance(item, Items) or item.wrapped
            )
        return DecodedBatch(
            len(bodies),
            inputs,
            positions,
            errors,
            sizes,
            listed,
            received,
            items,
            arrivals,
            due,
            wrapped,
            v2,
        )

    def _read_request(self, body: Any) -> _oip.InferRequest | None:
        """An Open Inference Protocol request in ``body`` (held to the body limit first, as
        any body), or None where it is none."""
        pipeline = self.pipeline
        limit = MAX_BODY_BYTES if isinstance(pipeline, TextPipeline) else pipeline._limit
        check_body_size(body, limit, _LIMIT_SETTING)
        return _oip.read_request(body)

    def _request_item(self, request: _oip.InferRequest) -> Any:
        """An Open Inference Protocol request's tensors as the pipeline's item: its rows
        (the first dimension, a sample each) as the request's several items, texts or
        objects of arguments."""
        pipeline = self.pipeline
        if isinstance(pipeline, TextPipeline):
            tensor = request.only()
            if tensor.datatype != _oip.BYTES:
                raise BadInputError(
                    f"{tensor.name}: texts ({_oip.BYTES})", tensor.datatype, reason="wrong_type"
                )
            return pipeline.decode({"instances": list(tensor.data)})
        if isinstance(pipeline, ArgumentsPipeline):
            return pipeline.decode({"instances": self._argument_rows(request, pipeline)})
        tensor = request.only()
        if tensor.datatype == _oip.BYTES:
            return pipeline.decode_rows(list(tensor.data))
        return pipeline.decode_rows(tensor.rows(len(self.spec.shape or ()), self.spec.shape_text))

    @staticmethod
    def _argument_rows(
        request: _oip.InferRequest, pipeline: ArgumentsPipeline
    ) -> list[dict[str, Any]]:
        """A tensor per argument, named as it: an object of arguments per row."""
        tensors = {t.name: t for t in request.inputs}
        names = list(pipeline.parts)
        if sorted(tensors) != sorted(names):
            raise BadInputError(
                f"input tensors named [{', '.join(names)}]",
                f"[{', '.join(tensors)}]",
                reason="missing_field",
            )
        rows = {
            name: tensors[name].rows(len(part.spec.shape or ()), part.spec.shape_text)
            for name, part in pipeline.parts.items()
        }
        counts = {len(r) for r in rows.values()}
        if len(counts) != 1:
            raise BadInputError(
                "as many rows in each input tensor",
                ", ".join(f"{name}: {len(r)}" for name, r in rows.items()),
                reason="wrong_shape",
            )
        return [{name: r[i] for name, r in rows.items()} for i in range(counts.pop())]

    def infer(self, batch: DecodedBatch) -> BatchResult:
        outputs: torch.Tensor | list[torch.Tensor] | None = None
        also: dict[str, torch.Tensor] | None = None
        sampled = False
        if batch.inputs is not None:
            path = self._path
            # Not due (most batches): the countdown moved on arrival, nothing to decide.
            scope = (
                path.decide(len(batch.positions), batch.sizes)
                if batch.due and path is not None
                else None
            )
            try:
                if scope is not None and scope.picked:
                    sampled = True
                    assert path is not None
                    with torch.inference_mode(), scope:
                        if self._padded and isinstance(batch.inputs, Padded):
                            # Padding is no sample's: the hooks reduce steps over its mask.
                            read_padded(path.hook_flag, batch.inputs)
                        # The model's own input and output: handed to their hooks here
                        # when the monitor lets the service (RequestPath.take_input).
                        take = path.take_input
                        if take is not None:
                            take(input_tensor(batch.inputs))
                        raw = call_model(self.pipeline, self.model, batch.inputs)
                        take = path.take_output
                        if take is not None:
                            take(raw)
                    # Counted once the forward ran: one that raised captured nothing, and
                    # its requests run alone, unmonitored.
                    path.sampled(scope.picked)
                else:
                    # Unsampled (or unmonitored): the scope would enter and leave doing
                    # nothing; two calls fewer on most requests.
                    with torch.inference_mode():
                        raw = call_model(self.pipeline, self.model, batch.inputs)
            except Exception as error:
                if _out_of_resources(error) or not batch.items:
                    raise
                return self._rerun_each_alone(batch, error)
            rows = sum(batch.sizes) if batch.sizes else len(batch.positions)
            outputs = self._output_rows(raw, rows)
            if self.output.also:
                also = self._also_rows(raw, rows)
        return BatchResult(
            batch.size,
            outputs,
            batch.positions,
            batch.errors,
            batch.sizes,
            batch.listed,
            batch.received,
            sampled,
            *(self._steps(batch.inputs, outputs, also) if self._stepped else (None, None)),
            also,
            batch.wrapped,
            batch.v2,
        )

    def _steps(
        self, inputs: ModelInputs | None, outputs: Any, also: dict[str, torch.Tensor] | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Each row's own steps for the head's answer, and for the ``output.also`` parts
        with a step per input step (:attr:`BatchResult.steps`, :attr:`also_steps`)."""
        mask = _step_mask(inputs)
        if mask is None:
            return None, None
        head = None
        if self._head_steps is not False and _has_steps(outputs, mask, 3):
            head = mask
        parts = None
        if also is not None and any(_has_steps(also[k], mask, 2) for k in self._also_steps):
            parts = mask
        return head, parts

    def _output_rows(self, raw: Any, rows: int) -> torch.Tensor | list[Any]:
        """The forward's output, a row per sample: its (selected) tensor batch-first, or
        the list of one dict a sample a detector gives, answered as each sample's dict (and
        a list of one tensor a sample, ``output.items``, as such dicts)."""
        raw = as_items(raw, self.output.items)
        if per_sample_items(raw):
            return list(raw)
        return self._batch_first(self._output_tensor(raw), rows)

    def _also_rows(self, raw: Any, rows: int) -> dict[str, torch.Tensor]:
        """The output's other parts answered beside the head's (``output.also``), each
        batch-first: a part missing or without a row per sample fails the batch, as the
        head's own would (``archive`` refuses such a config first)."""
        parts: dict[str, torch.Tensor] = {}
        for part in self.output.also:
            tensor = select_tensor(raw, part)
            if tensor is None:
                raise TypeError(
                    f"expected the model's output to hold a tensor at {part!r} "
                    f"(monitoring.output.also), got none"
                )
            parts[str(part)] = self._batch_first(tensor, rows)
        return parts

    def _output_tensor(self, raw: Any) -> torch.Tensor:
        outputs = select_tensor(raw, self.output.select)
        if outputs is None:
            raise TypeError(
                f"expected the model's output to hold a tensor (monitoring.output.select="
                f"{self.output.select!r}), got {type(raw).__name__}"
            )
        if self.output.probabilities:
            return as_logits(outputs, self.output.head)
        return outputs

    def _batch_first(self, outputs: torch.Tensor, rows: int) -> torch.Tensor:
        """A sequence-first output ``[T, B, ...]`` (the layout ``nn.CTCLoss`` takes, an
        ``nn.Transformer``'s by default) as ``[B, T, ...]``, when its second dimension alone is
        the batch's ``rows``; the output's hook reads it the same way. A sequence as long as
        the batch stays as it is. An output with no row per sample fails the batch: answered
        row by row, each request would get another's answer."""
        if outputs.dim() > 2 and outputs.shape[0] != rows and outputs.shape[1] == rows:
            return outputs.transpose(0, 1)
        if outputs.dim() == 0 or outputs.shape[0] != rows:
            raise RuntimeError(
                f"expected the model's output to have a row per sample ({rows}), got shape "
                f"{list(outputs.shape)}"
            )
        return outputs

    def _rerun_each_alone(self, batch: DecodedBatch, error: Exception) -> BatchResult:
        """A batch whose forward raised: each request runs alone, unmonitored (its capture
        was dropped with the forward). A request the model refuses alone gets a 422 with the
        model's error; the others are answered as if the batch had run."""
        errors = dict(batch.errors)
        rows: list[Any] = []
        positions: list[int] = []
        sizes: list[int] = []
        also: dict[str, list[torch.Tensor]] = {}
        each = batch.sizes or [1] * len(batch.positions)
        if len(batch.items) == 1:
            errors[batch.positions[0]] = _refused(error)  # a batch of one ran alone already
        else:
            for index, item, size in zip(batch.positions, batch.items, each, strict=True):
                try:
                    inputs = to_device(batch_inputs(self.pipeline, [item]), self.device)
                    with torch.inference_mode():
                        raw = call_model(self.pipeline, self.model, inputs)
                    out = self._output_rows(raw, size)
                    if isinstance(out, list):
                        if len(out) != size:
                            raise TypeError(f"expected {size} output items, got {len(out)}")
                    elif out.dim() == 0 or out.shape[0] != size:
                        raise TypeError(f"expected {size} output rows, got shape {list(out.shape)}")
                    parts = self._also_rows(raw, size) if self.output.also else {}
                except Exception as failed:
                    if _out_of_resources(failed):
                        raise
                    errors[index] = _refused(failed)
                    continue
                for key, part in parts.items():
                    also.setdefault(key, []).extend(part)
                rows.extend(out)
                positions.append(index)
                sizes.append(size)
        refused = len(errors) - len(batch.errors)
        if refused:
            self._log.warning(
                f"forward:{type(error).__name__}",
                "hookwatch: the model's forward raised on a batch (%s); run alone, %d of its "
                "%d requests were refused and answered 422",
                _error_summary(error),
                refused,
                len(batch.positions),
            )
            if batch.arrivals is not None:
                batch.arrivals.reject(refused, "model_refused")
        return BatchResult(
            batch.size,
            rows,
            positions,
            errors,
            sizes if batch.sizes else None,
            batch.listed,
            batch.received,
            also={key: torch.stack(part) for key, part in also.items()} if also else None,
            wrapped=batch.wrapped,
            v2=batch.v2,
        )

    def _answer(self, row: torch.Tensor) -> dict[str, Any]:
        head = self.output.head
        if head == "logits":
            logits = row.float().reshape(-1)
            if logits.numel() == 1:
                # A binary classifier's one logit z: the classes' logits are [0, z], so the
                # answer reads as any classifier's (class 1 with probability sigmoid(z)).
                logits = torch.cat([logits.new_zeros(1), logits])
            probabilities = torch.softmax(logits, dim=0)
            cls = int(probabilities.argmax())
            answer: dict[str, Any] = {"class": self.labels[cls] if self.labels else cls}
            if probabilities.numel() <= FULL_PROBABILITIES:
                answer["probabilities"] = [round(p, 6) for p in probabilities.tolist()]
            else:
                top = torch.topk(probabilities, 5)
                answer["top"] = [
                    {"class": self.labels[i] if self.labels else i, "probability": round(p, 6)}
                    for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
                ]
            return answer
        if head == "multilabel":
            return self._labels_answer(row)
        # Nested as the row is ([24, 3]: a forecast of 24 steps, 3 quantiles each), not
        # flattened: the client reads the model's own shape. An integer output (class or token
        # ids) is answered as integers: as floats an id read "1.0", and one past 2**24 lost
        # its last digits.
        row = row.reshape(1) if row.dim() == 0 else row  # a value a sample: still a list
        # A float64 model's answers as it computed them (as float32 they lost digits).
        exact = not (row.is_floating_point() or row.is_complex()) or row.dtype == torch.float64
        values = row.tolist() if exact else row.float().tolist()
        if head == "values":
            return {"values": values}
        if head == "embedding":
            return {"embedding": values}
        return {"output": row.tolist()}

    def _labels_answer(self, row: torch.Tensor) -> dict[str, Any]:
        """One independent logit per label: the labels whose sigmoid is above 0.5, in label
        order, and every label's probability (up to :data:`FULL_PROBABILITIES` labels; above,
        the ``top`` 5)."""
        probabilities = torch.sigmoid(row.float().reshape(-1))
        names = self.labels
        on = (probabilities > 0.5).nonzero().flatten().tolist()
        answer: dict[str, Any] = {"labels": [names[i] if names else i for i in on]}
        if probabilities.numel() <= FULL_PROBABILITIES:
            answer["probabilities"] = [round(p, 6) for p in probabilities.tolist()]
        else:
            top = torch.topk(probabilities, 5)
            answer["top"] = [
                {"label": names[i] if names else i, "probability": round(p, 6)}
                for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
            ]
        return answer

    def _positions_answer(self, row: torch.Tensor) -> dict[str, Any]:
        """Per-position logits ``[T, C]`` (token classification, CTC): per position, the
        class of the softmax over its ``C`` logits and that class's probability (``T`` of
        each, as many as the model's output has positions). A position holding NaN or
        Infinity has no class: null in both lists."""
        top = torch.softmax(row.float(), dim=-1).max(dim=-1)
        finite = torch.isfinite(row).all(dim=-1).tolist()
        labels = self.labels
        classes = [
            (labels[i] if labels else i) if ok else None
            for i, ok in zip(top.indices.tolist(), finite, strict=True)
        ]
        confidence = [
            round(p, 6) if ok else None for p, ok in zip(top.values.tolist(), finite, strict=True)
        ]
        return {"classes": classes, "confidence": confidence}

    def _map_answer(self, row: torch.Tensor) -> dict[str, Any]:
        """A class map ``[C, *spatial]`` (segmentation): per pixel, as per position, the
        class and its probability, nested as the map is (``[H][W]`` for an image)."""
        spatial = tuple(row.shape[1:])
        flat = self._positions_answer(row.flatten(1).transpose(0, 1))
        return {
            key: np.array(values, dtype=object).reshape(spatial).tolist()
            for key, values in flat.items()
        }

    def _non_finite_answer(self, row: torch.Tensor) -> dict[str, Any]:
        """An output row holding NaN or Infinity, in valid JSON: no class (a softmax of it
        has none), null where a value is not a number. The output's non-finite counts show
        in ``hookwatch_activation_nonfinite_total{layer="output"}``."""
        head = self.output.head
        if head == "logits":
            if row.numel() <= FULL_PROBABILITIES:
                return {"class": None, "probabilities": [None] * max(2, row.numel())}
            return {"class": None, "top": []}
        if head == "multilabel":
            if row.numel() <= FULL_PROBABILITIES:
                return {"labels": None, "probabilities": [None] * row.numel()}
            return {"labels": None, "top": []}
        return {key: _nulls(values) for key, values in self._answer(row).items()}

    def encode(self, result: BatchResult) -> list[Any]:
        """One answer per request: an object, or a list of them for a request that sent a list."""
        answers: list[Any] = [{} for _ in range(result.size)]
        v2 = result.v2
        for index, error in result.errors.items():
            answers[index] = error.as_dict() if v2 is None or index not in v2 else _v2_error(error)
        if result.outputs is not None:
            items = isinstance(result.outputs, list) and per_sample_items(result.outputs)
            outputs: torch.Tensor | list[Any] = (
                [_items_to_host(row) if items else row.detach().cpu() for row in result.outputs]
                if isinstance(result.outputs, list)
                else result.outputs.detach().cpu()
            )
            sizes = result.sizes or [1] * len(result.positions)
            answer: Callable[[Any], dict[str, Any]] = self._answer
            non_finite_answer: Callable[[Any], dict[str, Any]] = self._non_finite_answer
            if items:
                # One dict a sample (a detector's): answered as it is, whatever the head.
                answer = non_finite_answer = _items_answer
            elif self.output.head == "logits" and _row_dims(outputs) >= 2:
                # Per-position logits, or a class map: decided once per batch, so a [B, C]
                # row pays nothing.
                answer = non_finite_answer = (
                    self._positions_answer if _row_dims(outputs) == 2 else self._map_answer
                )
            # One check per batch: only a batch with a NaN or an Infinity takes the slow path.
            finite = items or (isinstance(outputs, torch.Tensor) and _all_finite(outputs))
            also_host: dict[str, Any] = (
                {key: part.detach().cpu() for key, part in result.also.items()}
                if result.also is not None
                else {}
            )
            if result.also_steps is not None:
                own = result.also_steps.cpu()
                for key in self._also_steps & also_host.keys():
                    if _has_steps(also_host[key], own, 2):
                        also_host[key] = [p[k] for p, k in zip(also_host[key], own, strict=True)]
            if result.steps is not None and isinstance(outputs, torch.Tensor):
                # Each sample's own steps: the same answer alone or beside a longer one.
                kept = result.steps.cpu()
                outputs = [o[k] for o, k in zip(outputs, kept, strict=True)]
            row = 0
            for index, size in zip(result.positions, sizes, strict=True):
                rows = [
                    answer(outputs[r])
                    if finite or _all_finite(outputs[r])
                    else non_finite_answer(outputs[r])
                    for r in range(row, row + size)
                ]
                if result.also is not None:
                    for r, each in enumerate(rows, start=row):
                        each.update(_items_answer({k: v[r] for k, v in also_host.items()}))
                if v2 is not None and index in v2:
                    answers[index] = self._v2_answer(rows, v2[index], result, index)
                else:
                    answers[index] = (
                        ({"predictions": rows} if index in result.wrapped else rows)
                        if index in result.listed
                        else rows[0]
                    )
                row += size
        path = self._path
        if path is not None and result.received:
            # The one check an unsampled batch pays for the cost cap, which measures the
            # sampled forwards' durations apart (answered_sampled: None without the cap).
            if result.sampled and path.answered_sampled is not None:
                path.answered_sampled(time.perf_counter() - result.received, result.size)
            else:
                # Binned by the capture thread (RequestTally.fold): a C call, no frame.
                path.durations.append((time.perf_counter() - result.received, result.size))
        return answers

    def _v2_answer(
        self, rows: list[Any], request: _oip.InferRequest, result: BatchResult, index: int
    ) -> dict[str, Any]:
        """A request's answers as the Open Inference Protocol's response; an output it asks
        for that its answers lack is its 400 (counted as a request turned away)."""
        try:
            return _oip.response(rows, request, self.model_name)
        except BadInputError as error:
            result.errors[index] = error
            if self._path is not None:
                self._path.received.reject(1, error.reason)
            return _v2_error(error)

    def handle(self, bodies: Sequence[Any]) -> list[Any]:
        return self.encode(self.infer(self.decode(bodies)))

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
