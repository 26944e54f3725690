"""Bad and boundary request payloads for the fuzz tests: generated (hypothesis) and mutated.

Each payload is ``(content_type, body bytes)``, as a client sends it. ``as_delivered`` turns it
into what TorchServe's Python worker hands a handler, so in-process tests see what the real
server would give them.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from hypothesis import strategies as st

from hookwatch._body import MAX_BODY_BYTES

Payload = tuple[str, bytes]

CONTENT_TYPES = ("application/json", "application/octet-stream", "text/plain")


def valid_body(image: list[Any]) -> bytes:
    return json.dumps({"data": image}).encode()


def as_delivered(content_type: str, body: bytes) -> Any:
    """What TorchServe 0.12's worker hands the handler: JSON parsed when it parses (raw bytes
    when it does not), text decoded when it decodes, bytes otherwise."""
    if content_type == "application/json":
        try:
            return json.loads(body.decode("utf-8"))
        except Exception:
            return body
    if content_type.startswith("text"):
        try:
            return body.decode("utf-8")
        except Exception:
            return body
    return body


_numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 16, 16.0000001, -0.0, 1e38, 3.5e38, 1e308, -1e308]),
)
_scalars = st.one_of(st.none(), st.booleans(), _numbers, st.text(max_size=20))
_json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=10), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=80,
)


def _encode(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def _shaped(draw: st.DrawFn) -> bytes:
    """Arrays of numbers in shapes near the input's, sometimes ragged or holding junk."""
    shape = draw(st.lists(st.integers(0, 9), min_size=0, max_size=4))
    fill = draw(st.one_of(_numbers, _scalars))

    def build(dims: list[int]) -> Any:
        if not dims:
            return fill
        return [build(dims[1:]) for _ in range(dims[0])]

    data = build(shape)
    if draw(st.booleans()) and isinstance(data, list) and data:
        data[-1] = draw(_scalars)  # ragged or mixed
    key = draw(st.sampled_from(["data", "data", "Data", "pixels", ""]))
    return _encode({key: data})


@st.composite
def _mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """A valid body with bytes flipped, cut, or inserted."""
    body = bytearray(valid)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "duplicate"]))
        if not body:
            break
        at = draw(st.integers(0, len(body) - 1))
        if kind == "flip":
            body[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del body[at:]
        elif kind == "insert":
            body[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            body[at:at] = body[at : at + draw(st.integers(1, 40))]
    return bytes(body)


def _deep(levels: int, wrapped: bool) -> bytes:
    nested = "[" * levels + "1" + "]" * levels
    return (f'{{"data": {nested}}}' if wrapped else nested).encode()


def _sized(size: int) -> bytes:
    """A JSON body of exactly ``size`` bytes: a valid-looking object padded with an extra key,
    so its size survives TorchServe parsing it (the handler sees the parsed value)."""
    head = b'{"data":[0],"pad":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def _spaced(size: int) -> bytes:
    """A JSON body of exactly ``size`` bytes padded with spaces: parsed, nothing of the padding
    is left to measure (TorchServe's ``max_request_size`` bounds it)."""
    head = b'{"data": [0]'
    return head + b" " * (size - len(head) - 1) + b"}"


def oversized(content_type: str, body: bytes) -> bool:
    """Whether the handler must answer ``body`` with a 413 (``reason="too_large"``): it is over
    the limit as delivered, bytes and text by their length, parsed JSON as compact JSON."""
    delivered = as_delivered(content_type, body)
    if isinstance(delivered, str):
        delivered = delivered.encode("utf-8", "surrogatepass")
    if not isinstance(delivered, bytes):
        compact = json.dumps(delivered, separators=(",", ":"), ensure_ascii=False)
        delivered = compact.encode("utf-8", "surrogatepass")
    return len(delivered) > MAX_BODY_BYTES


#: Fixed edge cases every fuzz run sends: the deep nesting seen to answer 503 once, bodies at
#: the size limit, numbers past every range, and odd encodings.
EDGES: tuple[bytes, ...] = (
    _deep(100_000, wrapped=True),
    _deep(50_000, wrapped=False),
    _deep(990, wrapped=True),
    _deep(4, wrapped=True),
    _sized(MAX_BODY_BYTES),
    _sized(MAX_BODY_BYTES + 1),
    _sized(2 * MAX_BODY_BYTES),
    _spaced(MAX_BODY_BYTES + 1),
    b'{"data": [' + b"9" * 5000 + b"]}",
    b'{"data": [' + b", ".join([b"1e400"] * 64) + b"]}",
    b'{"data": [' + b", ".join([b"99999999999999999999999"] * 64) + b"]}",
    b'{"data": [NaN' + b", 0" * 63 + b"]}",
    b'{"data": [Infinity' + b", 0" * 63 + b"]}",
    b"",
    b"null",
    b"\xff\xfe\x00\x01",
    '{"data": "\u00e9\u4e2d\U0001f600"}'.encode(),
    b'{"data": [' + b", ".join([b"true"] * 64) + b"]}",
    b'{"data": {"0": 1}}',
    b"\x00" * 256,
)


_DATATYPES = st.sampled_from(["FP32", "FP64", "INT64", "BOOL", "BYTES", "UINT8", "FP16", "X"])


@st.composite
def _structured(draw: st.DrawFn) -> bytes:
    """Other servers' request forms with their parts drawn at random: the Open Inference
    Protocol's tensors (names, shapes, datatypes, data, outputs, id), MLflow's tables and
    records."""
    kind = draw(st.sampled_from(["oip", "split", "records"]))
    if kind == "oip":
        tensors = []
        for _ in range(draw(st.integers(0, 3))):
            shape = draw(st.lists(st.integers(-1, 70), max_size=5))
            tensor: dict[str, Any] = {
                "name": draw(st.one_of(st.text(max_size=6), st.none(), st.integers())),
                "shape": shape,
                "datatype": draw(_DATATYPES),
            }
            if draw(st.booleans()):
                tensor["data"] = draw(
                    st.one_of(st.lists(st.one_of(_numbers, _scalars), max_size=80), _json_values)
                )
            else:
                tensor["parameters"] = {"binary_data_size": draw(st.integers(-5, 300))}
            tensors.append(tensor)
        body: dict[str, Any] = {"inputs": tensors}
        if draw(st.booleans()):
            body["outputs"] = draw(
                st.one_of(
                    st.lists(st.fixed_dictionaries({"name": st.text(max_size=6)})), _json_values
                )
            )
        if draw(st.booleans()):
            body["id"] = draw(_scalars)
        tail = draw(st.binary(max_size=64)) if draw(st.booleans()) else b""
        return _encode(body) + tail
    if kind == "split":
        frame = {
            "columns": draw(st.one_of(st.lists(st.text(max_size=4), max_size=6), _scalars)),
            "data": draw(
                st.one_of(st.lists(st.lists(_numbers, max_size=70), max_size=4), _json_values)
            ),
        }
        return _encode({"dataframe_split": draw(st.one_of(st.just(frame), _json_values))})
    records = draw(st.lists(st.dictionaries(st.text(max_size=4), _scalars, max_size=6), max_size=4))
    return _encode({"dataframe_records": records})


def other_forms(valid: bytes) -> list[bytes]:
    """``valid``'s item as other clients send it: the Open Inference Protocol's JSON and its
    binary extension, an ``.npy`` file and a CSV line."""
    item = np.asarray(json.loads(valid)["data"], dtype=np.float32)
    shape = [1, *item.shape]
    tensor = {"name": "x", "shape": shape, "datatype": "FP32"}
    oip = _encode({"inputs": [{**tensor, "data": item.ravel().tolist()}]})
    header = _encode({"inputs": [{**tensor, "parameters": {"binary_data_size": item.nbytes}}]})
    npy = io.BytesIO()
    np.save(npy, item)
    csv = ",".join(repr(float(v)) for v in item.ravel()).encode()
    return [oip, header + item.tobytes(), npy.getvalue(), csv]


def _npy_claiming(shape: tuple[int, ...]) -> bytes:
    """An ``.npy`` header claiming ``shape`` of float64, followed by 8 bytes."""
    header = repr({"descr": "<f8", "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 8


#: The other forms' edges: sizes claimed far past what came, a tensor of too many dimensions,
#: texts for numbers.
FORM_EDGES: tuple[bytes, ...] = (
    _npy_claiming((10**12,)),
    _npy_claiming((1, 1, 8, 8)),
    b"\x93NUMPY\x01\x00\xff\xff{",
    # A header cut inside its shape's tuple: numpy's literal parser raises tokenize's error.
    b"\x93NUMPY\x01\x00\x36\x00{'descr': '<f8', 'fortran_order': False, 'shape': (10,  \n",
    _encode({"inputs": [{"name": "x", "shape": [10**9], "datatype": "FP32", "data": [1.0]}]}),
    _encode({"inputs": [{"name": "x", "shape": [1] * 9, "datatype": "FP32", "data": [1.0]}]}),
    _encode(
        {"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "BYTES", "data": ["a"] * 64}]}
    ),
    _encode({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1.0]}]}),
    _encode(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 10**12},
                }
            ]
        }
    )
    + b"\0\0\0\0",
    _encode(
        {
            "inputs": [
                {"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [1.0] * 64}
            ],
            "outputs": [{"name": "nope"}],
        }
    ),
    _encode({"inputs": [], "outputs": 3}),
)


def payloads(valid: bytes) -> st.SearchStrategy[Payload]:
    bodies = st.one_of(
        st.binary(max_size=512),
        _json_values.map(_encode),
        _shaped(),
        _mutated(valid),
        st.sampled_from(EDGES),
        *(_mutated(form) for form in other_forms(valid)),
        st.sampled_from(FORM_EDGES),
        _structured(),
    )
    return st.tuples(st.sampled_from(CONTENT_TYPES), bodies)
