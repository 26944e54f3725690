"""Text requests for a transformer: validate, tokenise per request, pad per batch.

The one module that imports ``transformers`` (the ``hookwatch[text]`` extra), and only when a
model-config has ``input.text``: the core imports without it. Each request is tokenised on its
own, so a text that is too long, not text, or not UTF-8 gets its own 4xx and the rest of its
batch is served; the batch is padded to its longest text, and the attention mask goes to the
forward (and through ``monitoring.mask`` to the hooks, so padding never counts).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from hookwatch._body import JsonBody, NoPayload, check_body_size, loads_json
from hookwatch._config import TextSpec
from hookwatch._errors import BadInputError, ConfigError

__all__ = ["TextItem", "TextPipeline", "Tokenizer", "load_tokenizer"]

log = logging.getLogger("hookwatch")

_TOO_LARGE = 413


class Tokenizer(Protocol):
    """What hookwatch uses of a HuggingFace tokenizer."""

    pad_token_id: int | None
    padding_side: str
    model_max_length: int

    def __call__(self, text: list[str], **kwargs: Any) -> Any: ...


def load_tokenizer(directory: Path) -> Tokenizer:
    """The tokenizer saved in ``directory`` (``AutoTokenizer``, offline: nothing downloaded)."""
    if not directory.is_dir():
        raise ConfigError(
            f"input.text.tokenizer: expected a tokenizer directory at {directory}, got no such "
            "directory (archive it with the model)"
        )
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ConfigError(
            "input.text: expected transformers to tokenise text, got none installed: "
            "pip install 'hookwatch[text]'"
        ) from None
    # Its warnings would otherwise reach the worker log once per long text.
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        tokenizer: Tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"input.text.tokenizer: expected a saved tokenizer in {directory}, got "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    return tokenizer


@dataclass(frozen=True)
class TextItem:
    """One request, tokenised: per text, each tokenizer output the model takes."""

    tokens: tuple[dict[str, list[int]], ...]
    #: The request sent a list (its answer is a list too), not one string.
    listed: bool
    #: Sent under ``instances`` (KServe's and TF Serving's clients): answered
    #: ``{"predictions": [...]}``, as their protocol answers.
    wrapped: bool = False

    @property
    def rows(self) -> int:
        return len(self.tokens)


#: The keys of a JSON object whose value is a request's texts (a string or a list of them):
#: text-serving APIs' (``inputs``), KServe's and TF Serving's (``instances``), TorchServe's
#: examples' (``data``), plain ones.
TEXT_KEYS = ("text", "texts", "inputs", "input", "instances", "data")


class TextPipeline:
    """Text requests → token tensors: :meth:`decode` per request, :meth:`batch` per forward."""

    def __init__(
        self, spec: TextSpec, model_dir: str | Path | None, argument: str | None = None
    ) -> None:
        self.spec = spec
        #: The tokens together as one dict under this keyword of forward() (``input.argument``:
        #: a sentence-transformers model's ``forward(input)``); None: each as its own.
        self.argument = argument
        directory = Path(model_dir) if model_dir is not None else Path.cwd()
        self._tokenizer = load_tokenizer(directory / spec.tokenizer)
        limit = self._tokenizer.model_max_length
        default = TextSpec.__dataclass_fields__["max_tokens"].default
        if spec.max_tokens == default and limit < default:
            # Left at its default: the tokenizer's own length is the limit (`init` and
            # `layers` of a 128-token model failed on a value nobody had set).
            spec = self.spec = dataclasses.replace(spec, max_tokens=int(limit))
        if spec.max_tokens > limit:
            raise ConfigError(
                f"input.text.max_tokens: expected at most the tokenizer's model_max_length "
                f"({limit}), got {spec.max_tokens}"
            )
        probe = self._tokenizer(["probe"], add_special_tokens=True)
        missing = [a for a in spec.arguments if a not in probe]
        if missing:
            raise ConfigError(
                f"input.text.arguments: expected outputs of the tokenizer "
                f"({', '.join(probe.keys())}), got {missing}"
            )
        self._pad = {
            name: (self._tokenizer.pad_token_id or 0) if name == "input_ids" else 0
            for name in spec.arguments
        }
        self._expected = (
            f"a JSON string or a list of 1 to {spec.max_texts} strings (or a text/plain body, "
            'or either under "text", "inputs", "instances" or "data" in a JSON object), of at '
            f"most {spec.max_chars} characters and {spec.max_tokens} tokens each"
        )

    def decode(self, body: Any) -> TextItem:
        """One request's body → its texts, tokenised; raises :class:`BadInputError`."""
        payload = self._parse(body)
        texts, listed = self._texts(payload)
        wrapped = type(payload) is dict and "instances" in payload and listed
        encoded = self._tokenizer(texts, add_special_tokens=True, truncation=False)
        tokens = []
        for index, ids in enumerate(encoded["input_ids"]):
            if len(ids) > self.spec.max_tokens:
                raise BadInputError(
                    f"texts of at most {self.spec.max_tokens} tokens",
                    f"{len(ids)} tokens in {_which(index, listed)}",
                    status=_TOO_LARGE,
                    reason="too_large",
                )
            tokens.append({name: list(encoded[name][index]) for name in self.spec.arguments})
        return TextItem(tuple(tokens), listed, wrapped)

    def _parse(self, body: Any) -> Any:
        """TorchServe hands over a JSON body (application/json) parsed, a text/* body as a
        string, anything else as bytes: a string is one text either way, bytes are one text
        in UTF-8, a list holds several. Each is held to the body limit first."""
        check_body_size(body)
        if type(body) is JsonBody:
            # Declared JSON: a JSON body, or a 400 (read as one text, `{"text": "abc` was
            # answered as a text).
            return loads_json(body, self._expected)
        if isinstance(body, str) and body.startswith("\ufeff"):
            return body[1:]  # a byte-order mark is no part of the text (nor its tokens)
        if isinstance(body, bytes | bytearray):
            try:
                # utf-8-sig: a byte-order mark, where an editor wrote one, is dropped.
                return bytes(body).decode("utf-8-sig")
            except UnicodeDecodeError as error:
                raise BadInputError(
                    f"{self._expected}, in UTF-8",
                    f"bytes that are not UTF-8 ({error.reason})",
                    reason="not_utf8",
                ) from None
        return body

    def _texts(self, payload: Any) -> tuple[list[str], bool]:
        spec = self.spec
        if isinstance(payload, NoPayload):
            raise BadInputError(self._expected, repr(payload), reason="missing_field")
        if isinstance(payload, dict):
            # {"inputs": ...} as text-serving APIs take it, or {"text": ...}: the one such key
            # is the texts (others, such as generation parameters, do not apply here).
            keys = [key for key in TEXT_KEYS if key in payload]
            if len(keys) != 1:
                raise BadInputError(
                    self._expected,
                    f"an object with keys [{', '.join(map(str, list(payload)[:8]))}]",
                    reason="missing_field",
                )
            payload = payload[keys[0]]
        listed = isinstance(payload, list)
        texts = payload if listed else [payload]
        if not texts or not all(isinstance(t, str) for t in texts):
            got = (
                "an empty list"
                if listed and not texts
                else f"a list holding {_kinds(texts)}"
                if listed
                else _kinds([payload])
            )
            # No text at all is a shape the input does not take; anything else is not text.
            empty = listed and not texts
            raise BadInputError(
                self._expected, got, reason="wrong_shape" if empty else "wrong_type"
            )
        if len(texts) > spec.max_texts:
            raise BadInputError(
                f"at most {spec.max_texts} texts per request",
                f"{len(texts)} texts",
                status=_TOO_LARGE,
                reason="too_large",
            )
        for index, text in enumerate(texts):
            if len(text) > spec.max_chars:
                raise BadInputError(
                    f"texts of at most {spec.max_chars} characters",
                    f"{len(text)} characters in {_which(index, listed)}",
                    status=_TOO_LARGE,
                    reason="too_large",
                )
            if not text.strip():
                kind = "an empty text" if not text else "a text of only white space"
                raise BadInputError(
                    self._expected,
                    f"{kind} ({_which(index, listed)})" if listed else kind,
                    reason="wrong_shape",
                )
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                # A lone surrogate (JSON "\ud800") is not text a tokenizer can take.
                raise BadInputError(
                    f"{self._expected}, in UTF-8",
                    f"an unpaired surrogate in {_which(index, listed)}",
                    reason="not_utf8",
                ) from None
        return texts, listed

    def batch(self, items: Sequence[TextItem]) -> dict[str, torch.Tensor]:
        """Every text of ``items``, padded to the longest, as the forward's keyword arguments."""
        rows = [tokens for item in items for tokens in item.tokens]
        width = max(
            len(r["input_ids"] if "input_ids" in r else next(iter(r.values()))) for r in rows
        )
        left = self._tokenizer.padding_side == "left"
        out: dict[str, torch.Tensor] = {}
        for name in self.spec.arguments:
            pad = self._pad[name]
            padded = [
                ([pad] * (width - len(r[name])) + r[name])
                if left
                else (r[name] + [pad] * (width - len(r[name])))
                for r in rows
            ]
            out[name] = torch.tensor(padded, dtype=torch.long)
        return out


def _which(index: int, listed: bool) -> str:
    return f"text {index}" if listed else "the text"


def _kinds(values: Sequence[Any]) -> str:
    others = [v for v in values if not isinstance(v, str)]
    if others and all(v is None or isinstance(v, bool) for v in others):
        return json.dumps(others[0])  # null, true, false: as the JSON said them
    names = sorted({_JSON_NAMES.get(type(v), type(v).__name__) for v in others})
    sample = next(iter(others), None)
    return f"{'/'.join(names)} {json.dumps(sample) if sample is None else repr(sample)[:40]}"


#: What a parsed JSON value was, by its Python type, in the words of an answer.
_JSON_NAMES = {dict: "object", list: "list", int: "int", float: "float"}
