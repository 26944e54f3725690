"""The Open Inference Protocol's JSON form (KServe's v2, as Triton's and MLServer's clients
speak it): a request's tensors read, and a request's answers written as its response.

TorchServe hands ``POST /v2/models/<name>/infer`` to the handler with the body as sent, so a
client of that protocol reaches the model unchanged; a body of this form on any other path
is read alike. Pure Python: the service turns the tensors into its own items, and its
answers (an object a sample) into the response's tensors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hookwatch._errors import BadInputError

__all__ = ["InferRequest", "Tensor", "candidate", "read_request", "response"]

#: The protocol's datatypes of numbers (a JSON body's ``data`` holds them as JSON numbers).
NUMERIC = frozenset(
    (
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP16",
        "FP32",
        "FP64",
        "BF16",
    )
)
#: Strings (texts; images in base64).
BYTES = "BYTES"


@dataclass(frozen=True)
class Tensor:
    """One of a request's input tensors: its values flat, in row-major order."""

    name: str
    shape: tuple[int, ...]
    datatype: str
    data: tuple[Any, ...]

    def rows(self, item_dims: int, item_shape: str) -> list[Any]:
        """The tensor's items, each nested as an item of ``item_dims`` dimensions (shown as
        ``item_shape``): the first dimension's rows where the shape has one more (the
        protocol's batch), else the tensor as one item."""
        shape = self.shape
        if len(shape) == item_dims + 1:
            return _nest(list(self.data), shape)
        if len(shape) == item_dims:
            return [_nest(list(self.data), (1, *shape))[0]]
        batch = f"[N, {item_shape[1:]}" if item_dims else "[N]"
        raise BadInputError(
            f"{self.name}: shape {batch} (N items of shape {item_shape})",
            f"shape {list(shape)}",
            reason="wrong_shape",
        )


@dataclass(frozen=True)
class InferRequest:
    """A request's tensors, its ``id`` (echoed in the response) and the outputs it asks for
    (None: all)."""

    inputs: tuple[Tensor, ...]
    id: str | None = None
    outputs: tuple[str, ...] | None = None

    def only(self) -> Tensor:
        """The one input tensor of a model of one input."""
        if len(self.inputs) != 1:
            raise BadInputError(
                "one input tensor (this model takes one input)",
                f"{len(self.inputs)} tensors ({', '.join(t.name for t in self.inputs)})",
                reason="wrong_shape",
            )
        return self.inputs[0]


def candidate(body: Any) -> bool:
    """Whether ``body`` may be such a request: cheap enough for every request (a parsed
    object's keys looked up; raw JSON searched for the protocol's ``"datatype"`` key)."""
    kind = type(body)
    if kind is dict:
        inputs = body.get("inputs")
        return type(inputs) is list and bool(inputs) and type(inputs[0]) is dict
    if kind is bytes or kind is bytearray:
        return bytes(body[:1]) == b"{" and b'"datatype"' in body
    if kind is str:
        return body[:1] == "{" and '"datatype"' in body
    return False


def read_request(body: Any) -> InferRequest | None:
    """``body`` (parsed, or raw JSON) as a request of the protocol; None where it is none
    (no ``inputs`` list of tensors with a ``datatype``): the body is then read as any other.
    A request of the protocol that is malformed is a :class:`BadInputError` naming where.

    Raw bytes may carry the tensors' values after the JSON, as the binary tensor extension
    sends them (Triton's client does by default): an input then gives its bytes' count as
    ``parameters.binary_data_size`` in place of ``data``."""
    tail = b""
    if isinstance(body, str | bytes | bytearray):
        try:
            body = json.loads(body)
        except (UnicodeDecodeError, ValueError, RecursionError):
            if isinstance(body, str):
                return None
            body, tail = _binary(bytes(body))
    if not isinstance(body, dict):
        return None
    inputs = body.get("inputs")
    if not (
        isinstance(inputs, list)
        and inputs
        and all(isinstance(t, dict) and "datatype" in t for t in inputs)
    ):
        return None
    values = _Values(tail)
    tensors = tuple(_tensor(t, f"inputs[{i}]", values) for i, t in enumerate(inputs))
    values.done()
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise BadInputError(
            "input tensors of different names", f"names {names}", reason="wrong_shape"
        )
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadInputError("id: a string", _kind(request_id), reason="wrong_type")
    return InferRequest(tensors, request_id, _requested(body.get("outputs")))


def _binary(body: bytes) -> tuple[Any, bytes]:
    """A body of JSON followed by tensors' bytes: the JSON and the bytes after it (None and
    nothing where it opens with no JSON object)."""
    try:
        # Latin-1 maps each byte to one character: the JSON's end is its length in bytes
        # (the extension's JSON is ASCII; a non-ASCII name would read as other characters).
        header, end = json.JSONDecoder().raw_decode(body.decode("latin-1"))
    except (ValueError, RecursionError):
        return None, b""
    return header, body[end:]


#: The protocol's numeric datatypes as little-endian numpy dtypes (BF16 read as its top
#: half of a float32).
_BINARY = {
    "BOOL": "|b1",
    "UINT8": "|u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "|i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
    "BF16": "<u2",
}


class _Values:
    """The tensors' bytes after a body's JSON (the binary tensor extension), taken in the
    inputs' order."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def take(self, size: Any, datatype: str, where: str) -> list[Any]:
        if type(size) is not int or size < 0 or self._at + size > len(self._data):
            raise BadInputError(
                f"{where}: parameters.binary_data_size within the "
                f"{len(self._data) - self._at} bytes after the JSON",
                repr(size)[:40],
                reason="wrong_shape",
            )
        chunk = self._data[self._at : self._at + size]
        self._at += size
        if datatype == BYTES:
            return _strings(chunk, where)
        dtype = np.dtype(_BINARY[datatype])
        if size % dtype.itemsize:
            raise BadInputError(
                f"{where}: a whole number of {datatype} values ({dtype.itemsize} bytes each)",
                f"{size} bytes",
                reason="wrong_shape",
            )
        array = np.frombuffer(chunk, dtype)
        if datatype == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        values: list[Any] = array.tolist()
        return values

    def done(self) -> None:
        if self._at != len(self._data):
            raise BadInputError(
                "the binary_data_size of the inputs to add up to the bytes after the JSON",
                f"{len(self._data) - self._at} bytes left over",
                reason="wrong_shape",
            )


def _strings(chunk: bytes, where: str) -> list[Any]:
    """A BYTES tensor's binary form: each element's length (4 bytes, little-endian), then
    its bytes; text where they are UTF-8, else the bytes (an image file's)."""
    out: list[Any] = []
    at = 0
    while at < len(chunk):
        size = int.from_bytes(chunk[at : at + 4], "little") if at + 4 <= len(chunk) else -1
        if size < 0 or at + 4 + size > len(chunk):
            raise BadInputError(
                f"{where}: BYTES elements, each a 4-byte length and as many bytes",
                f"a length past the input's end at byte {at}",
                reason="wrong_shape",
            )
        element = chunk[at + 4 : at + 4 + size]
        try:
            out.append(element.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(element)
        at += 4 + size
    return out


def _tensor(value: Mapping[str, Any], where: str, values: _Values) -> Tensor:
    name = value.get("name")
    if not isinstance(name, str):
        raise BadInputError(f"{where}.name: a string", _kind(name), reason="missing_field")
    where = f"{where} ({name!r})"
    shape = value.get("shape")
    if not (
        isinstance(shape, list)
        and all(type(d) is int and d >= 0 for d in shape)
        and len(shape) <= _MAX_DIMS
    ):
        raise BadInputError(
            f"{where}.shape: a list of at most {_MAX_DIMS} whole numbers",
            _kind(shape),
            reason="wrong_shape",
        )
    datatype = value["datatype"]
    if datatype not in NUMERIC and datatype != BYTES:
        raise BadInputError(
            f"{where}.datatype: one of {', '.join(sorted(NUMERIC))} or {BYTES}",
            repr(datatype)[:40],
            reason="wrong_type",
        )
    parameters = value.get("parameters")
    if "data" in value:
        flat = _flatten(value["data"], len(shape))
    elif isinstance(parameters, dict) and "binary_data_size" in parameters:
        flat = values.take(parameters["binary_data_size"], datatype, where)
    else:
        raise BadInputError(
            f"{where}.data: its values (or parameters.binary_data_size)",
            "neither",
            reason="missing_field",
        )
    if flat is None:
        raise BadInputError(
            f"{where}.data: values flat or nested as shape {shape}",
            "lists nested deeper than the shape",
            reason="too_deep",
        )
    count = math.prod(shape)
    if count == 0:
        raise BadInputError(
            f"{where}.shape: a row or more of values", f"shape {shape}", reason="wrong_shape"
        )
    if len(flat) != count:
        raise BadInputError(
            f"{where}.data: {count} values (shape {shape})",
            f"{len(flat)} values",
            reason="wrong_shape",
        )
    # Numbers are checked where they are decoded, against the model's own dtype and range.
    text = datatype == BYTES
    wrong = (
        next((i for i, v in enumerate(flat) if not isinstance(v, str | bytes)), None)
        if text
        else None
    )
    if wrong is not None or (not text and isinstance(flat[0], str)):
        at = wrong or 0
        raise BadInputError(
            f"{where}.data: {'strings' if text else 'numbers'} ({datatype})",
            f"{_kind(flat[at])} at [{at}]",
            reason="wrong_type",
        )
    return Tensor(name, tuple(shape), datatype, tuple(flat))


#: Dimensions a request's tensor may have: no model's input has more, and each level is a
#: Python frame to flatten.
_MAX_DIMS = 8


def _flatten(data: Any, depth: int) -> list[Any] | None:
    """``data`` flat in row-major order: the protocol sends it flat, or nested as its shape
    (at most ``depth`` levels); None where it nests deeper."""
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data  # flat (a list among its values is refused where they are decoded)
    if depth <= 1:
        return None
    out: list[Any] = []
    for value in data:
        inner = _flatten(value, depth - 1)
        if inner is None:
            return None
        out.extend(inner)
    return out


def _nest(flat: list[Any], shape: Sequence[int]) -> list[Any]:
    """``flat`` (of ``prod(shape)`` values) as nested lists of ``shape``: its first
    dimension's rows."""
    nested = flat
    for size in reversed(shape[1:]):
        nested = [nested[i : i + size] for i in range(0, len(nested), size)]
    return nested


def _requested(value: Any) -> tuple[str, ...] | None:
    """The request's ``outputs``: the names of the outputs it wants (None: every one)."""
    if value is None:
        return None
    if not (
        isinstance(value, list)
        and all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in value)
    ):
        raise BadInputError(
            'outputs: a list of {"name": ...} objects', _kind(value), reason="wrong_type"
        )
    return tuple(o["name"] for o in value)


def _kind(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, str):
        return f"str {value[:40]!r}"
    return type(value).__name__


def response(answers: Sequence[Any], request: InferRequest, model_name: str) -> dict[str, Any]:
    """A request's answers (one a sample, in order) as the protocol's response: an output
    tensor per key of the answers' objects (``class``, ``probabilities``, ...), each with a
    row per sample; a value that is no rectangular array of numbers (a label, a ragged list,
    a null) is a ``BYTES`` row holding its JSON. A requested output the answers lack is a
    :class:`BadInputError` naming those they have."""
    objects = all(isinstance(a, dict) for a in answers)
    names = list(answers[0]) if objects and answers else ["output-0"]
    columns = {name: [a.get(name) for a in answers] if objects else list(answers) for name in names}
    wanted = request.outputs if request.outputs is not None else tuple(names)
    missing = [name for name in wanted if name not in columns]
    if missing:
        raise BadInputError(
            f"outputs among [{', '.join(names)}]",
            f"{', '.join(map(repr, missing))}",
            reason="missing_field",
        )
    body: dict[str, Any] = {"model_name": model_name}
    if request.id is not None:
        body["id"] = request.id
    body["outputs"] = [_output(name, columns[name]) for name in wanted]
    return body


def _output(name: str, column: list[Any]) -> dict[str, Any]:
    """One output tensor of ``column`` (a value a sample)."""
    shape = _rectangle(column)
    flat = _flatten(column, len(shape)) if shape is not None else None
    if shape is not None and flat is not None:
        if all(type(v) is bool for v in flat):
            datatype = "BOOL"
        elif all(type(v) is int for v in flat):
            datatype = "INT64"
        elif all(type(v) is int or type(v) is float for v in flat):
            # A float64 model's answers keep their digits: FP64 where float32 would round one.
            narrow = np.asarray(flat, dtype=np.float64)
            datatype = "FP32" if bool((narrow.astype(np.float32) == narrow).all()) else "FP64"
        elif all(type(v) is str for v in flat) and len(shape) == 1:
            datatype = BYTES
        else:
            flat = None
        if flat is not None:
            return {"name": name, "shape": list(shape), "datatype": datatype, "data": flat}
    return {
        "name": name,
        "shape": [len(column)],
        "datatype": BYTES,
        "data": [json.dumps(v, separators=(",", ":")) for v in column],
    }


def _rectangle(value: list[Any]) -> tuple[int, ...] | None:
    """The shape of nested lists whose every level is equally long; None where ragged."""
    shape = [len(value)]
    level = value
    while level and all(isinstance(v, list) for v in level):
        size = len(level[0])
        if any(len(v) != size for v in level):
            return None
        shape.append(size)
        level = [w for v in level for w in v]
    if any(isinstance(v, list | dict) for v in level):
        return None
    return tuple(shape)
