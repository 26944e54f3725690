"""The one limit on a request body, held for every content type however the body arrives.

TorchServe hands a handler an ``application/json`` body parsed, a ``text/*`` body as a string
and anything else as bytes. Bytes are measured by their length and a string by its UTF-8
length; a parsed JSON value's bytes are gone, so it is measured as its compact JSON encoding
(whitespace the client sent is not counted), by a walk that stops as soon as the value is
known to be over the limit. Lists of numbers are bounded from their length first and only
encoded, number by number, when the bound alone cannot decide: a request of a few thousand
numbers costs microseconds, not an encoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from hookwatch._errors import BadInputError

__all__ = [
    "IMAGE_BODY_BYTES",
    "JSON_BYTES_PER_NUMBER",
    "MAX_BODY_BYTES",
    "MAX_DERIVED_BODY_BYTES",
    "JsonBody",
    "NoPayload",
    "body_limit",
    "check_body_size",
    "loads_json",
    "over_limit",
]

#: Largest request body hookwatch decodes by default, in bytes, tensors and text alike: larger
#: is a 413. A tensor model whose one input needs more gets more (:func:`body_limit`).
MAX_BODY_BYTES = 1 << 20
#: The most a number takes in compact JSON, its comma included ("-1.2345678901234567e-308,").
JSON_BYTES_PER_NUMBER = 25
#: The most the shape alone raises the limit to: past it a client sends raw float32
#: (``input.encoding``) or the config sets ``input.max_body_bytes``. TorchServe holds a body
#: whole in its frontend's heap before the handler sees it.
MAX_DERIVED_BODY_BYTES = 64 << 20

#: Body limit of an image input (``input.encoding: image``) unless configured: a photo is
#: sent as its camera wrote it (a 12-megapixel JPEG takes 3-6 MB) and is resized here.
IMAGE_BODY_BYTES = 16 << 20

#: Scalars a parsed JSON list of numbers holds; each is 3 to 24 characters as JSON ("0.5",
#: "-1.2345678901234567e-308", "true", "null").
_NUMBERS = frozenset({float, bool, type(None)})
#: Scalars whose JSON length is their ``repr``'s (Python ints can be 4,300 digits long).
_SCALARS = frozenset({int, float, bool, type(None)})
_MOST_CHARS = 24
_FEWEST_CHARS = 3


def loads_json(text: str | bytes | bytearray, expected: str) -> Any:
    """``text`` parsed as JSON, or a :class:`BadInputError` saying ``expected`` and why not:
    ``too_deep`` past the parser's nesting, ``not_json`` for anything else it refuses."""
    try:
        return json.loads(text)
    except RecursionError:
        # Python's parser gives up around a thousand levels; no input needs a tenth.
        raise BadInputError(
            expected, "JSON nested too deeply to parse", reason="too_deep"
        ) from None
    except (UnicodeDecodeError, ValueError) as error:
        # ValueError covers malformed JSON and integers too long to convert.
        detail = str(error).splitlines()[0][:120] if str(error) else type(error).__name__
        raise BadInputError(
            expected, f"a body that is not JSON ({detail})", reason="not_json"
        ) from None


class JsonBody(bytes):
    """A body its client declared JSON that reaches the handler unparsed: TorchServe parses
    ``application/json`` exactly, so ``application/json; charset=utf-8`` (what many HTTP
    libraries send) arrives as bytes, and so does JSON that does not parse. Marked, it is read
    as JSON by every input, never as a text, an array of raw floats or a file."""

    __slots__ = ()


class NoPayload:
    """A request with nothing where a payload is looked for, and what it carried instead.

    A server adapter hands this over in place of a body: TorchServe, for one, passes a body
    sent without ``Content-Type: application/json`` on as the form's fields, so ``curl -d
    'a=1'`` arrives as a field named ``a`` and no payload, and ``curl -d 'x'`` as a form of no
    fields (a field without a value is dropped). Its ``repr`` is the 400's *got*.
    """

    __slots__ = ("fields",)

    def __init__(self, fields: Iterable[object] = ()) -> None:
        #: The first few field names, sorted and cut short: they come from the request.
        self.fields = tuple(sorted(str(f)[:40] for f in fields))[:5]

    def __repr__(self) -> str:
        if any("\ufffd" in f or not f.isprintable() for f in self.fields):
            # A file's bytes read as a form (`curl --data-binary @photo.png` sends it as
            # application/x-www-form-urlencoded): its "field names" are noise, not worth echoing.
            return (
                "a form whose fields are not text and no payload (a file sent as a form: curl "
                "--data-binary sends application/x-www-form-urlencoded; send it with curl -T "
                "FILE, or with its own Content-Type)"
            )
        carried = f"form fields [{', '.join(map(repr, self.fields))}]" if self.fields else "a form"
        return (
            f"{carried} and no payload (a body sent without Content-Type: application/json "
            "is read as a form)"
        )


def _utf8_size(text: str, limit: int) -> int:
    if len(text) > limit or text.isascii():
        return len(text)  # past the limit already (a character is a byte or more), or exact
    return len(text.encode("utf-8", "surrogatepass"))


def _json_bounds(value: Any, limit: int, exact: bool) -> tuple[int, int]:
    """Lower and upper bounds on ``value``'s compact JSON length, the walk stopped as soon as
    the lower bound passes ``limit``. ``exact``: lists of numbers are encoded (bounds equal)."""
    low = high = 0
    stack = [value]
    while stack and low <= limit:
        item = stack.pop()
        kind = type(item)
        if kind is list or kind is tuple:  # a tuple: a value handed over in process
            size = max(len(item) + 1, 2)  # brackets and commas
            types = set(map(type, item))
            if not exact and _NUMBERS.issuperset(types):
                low += size + _FEWEST_CHARS * len(item)
                high += size + _MOST_CHARS * len(item)
                continue
            if _SCALARS.issuperset(types):
                size += sum(map(len, map(repr, item)))
            else:
                stack.extend(item)
        elif kind is dict:
            size = max(2 * len(item) + 1, 2)  # braces, colons and commas
            stack.extend(item.keys())
            stack.extend(item.values())
        elif kind is str:
            size = 2 + _utf8_size(item, limit)
        else:
            size = len(repr(item))
        low += size
        high += size
    return low, high


def over_limit(body: Any, limit: int = MAX_BODY_BYTES) -> bool:
    """Whether ``body`` (bytes, a string or a parsed JSON value) is over ``limit`` bytes."""
    if isinstance(body, bytes | bytearray):
        return len(body) > limit
    if isinstance(body, str):
        return _utf8_size(body, limit) > limit
    low, high = _json_bounds(body, limit, exact=False)
    if high <= limit or low > limit:
        return low > limit
    return _json_bounds(body, limit, exact=True)[0] > limit


def body_limit(numel: int, configured: int | None = None, image: bool = False) -> int:
    """The body limit of a tensor model whose one input holds ``numel`` numbers: ``configured``
    (``input.max_body_bytes``) when set, else :data:`MAX_BODY_BYTES` or, where one input
    written out in JSON can take more, that much (a [3, 512, 512] image's numbers as JSON are
    up to ~20 MB), at most :data:`MAX_DERIVED_BODY_BYTES`: a request of the declared shape is
    not refused for its size. An ``image`` input takes at least :data:`IMAGE_BODY_BYTES`."""
    if configured is not None:
        return configured
    derived = min(max(MAX_BODY_BYTES, JSON_BYTES_PER_NUMBER * numel + 64), MAX_DERIVED_BODY_BYTES)
    return max(derived, IMAGE_BODY_BYTES) if image else derived


def check_body_size(body: Any, limit: int = MAX_BODY_BYTES, setting: str = "") -> None:
    """Raise a 413 (``reason="too_large"``) for a body over ``limit`` bytes; ``setting`` names
    the option that sets it, for the answer."""
    if not over_limit(body, limit):
        return
    got = (
        f"{len(body)} bytes"
        if isinstance(body, bytes | bytearray)
        else f"more than {limit} bytes" + ("" if isinstance(body, str) else " as compact JSON")
    )
    raise BadInputError(
        f"a body of at most {limit} bytes" + (f" ({setting} sets it)" if setting else ""),
        got,
        status=413,
        reason="too_large",
    )
