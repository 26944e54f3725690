"""TorchServe adapter: TorchServe's handler contract over hookwatch's TorchServe-free service.

Importable only where TorchServe is installed (``pip install 'hookwatch[torchserve]'``). A
handler file archived into a ``.mar`` subclasses one of these (TorchServe loads the one class
the file itself defines)::

    from hookwatch.torchserve import HookwatchHandler

    class Handler(HookwatchHandler):
        pass

Nothing else in hookwatch imports TorchServe: replacing it means another adapter like this one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any, ClassVar

import torch

try:
    from ts.torch_handler.base_handler import BaseHandler
except ImportError as error:  # pragma: no cover - exercised where TorchServe is absent
    raise ImportError(
        "hookwatch.torchserve needs TorchServe: pip install 'hookwatch[torchserve]'"
    ) from error

from hookwatch._body import JsonBody, NoPayload
from hookwatch._config import HandlerConfig, read_model_config
from hookwatch._model import MODEL_SPEC_FILE, ModelSpec, build_model
from hookwatch._service import BatchResult, DecodedBatch, ModelService

__all__ = ["HookwatchHandler", "UnmonitoredHandler"]


#: The Content-Type of every answer.
JSON = "application/json"
_compact = json.JSONEncoder(separators=(",", ":")).encode


def _body(row: dict[str, Any], context: Any = None, index: int = 0) -> Any:
    """A request's payload as TorchServe hands it over: under ``data`` or ``body``, else what
    it carried instead (a body sent as a form arrives as its fields, none of them those).
    Bytes its client declared JSON come marked (:class:`JsonBody`)."""
    for key in ("data", "body"):
        if key in row:
            value = row[key]
            # Only bytes ask: a parsed body (most of them) pays nothing here.
            if (
                (type(value) is bytes or type(value) is bytearray)
                and context is not None
                and _declared_json(context, index, key)
            ):
                return JsonBody(value)
            return value
    return NoPayload(row)


def _declared_json(context: Any, index: int, key: str) -> bool:
    """The request's ``key`` part was sent as JSON (``application/json`` with parameters, or a
    ``+json`` type): TorchServe keeps each part's Content-Type under the part's name."""
    try:
        header = context.get_request_header(index, key)
    except Exception:  # a context without the request's headers: as before, undeclared
        return False
    kind = header.get("content-type") if isinstance(header, dict) else header
    if not isinstance(kind, str):
        return False
    media = kind.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _batch_size(raw: Mapping[str, Any], context: Any) -> int:
    """TorchServe's batch size for the model: what the worker was given (the registration's,
    or the model-config's ``batchSize``), else the model-config's, else 1."""
    size = (context.system_properties or {}).get("batch_size")
    if size is None:
        size = raw.get("batchSize", 1)
    try:
        return int(size)
    except (TypeError, ValueError):
        return 1


class HookwatchHandler(BaseHandler):  # type: ignore[misc]
    """A monitored model: the ``handler:`` section of its model-config decides the rest."""

    #: Subclasses that serve the same requests without monitoring set this to False.
    monitored: ClassVar[bool] = True
    service: ModelService
    handler_config: HandlerConfig

    def initialize(self, context: Any) -> None:
        model_config = read_model_config(context.model_yaml_config or {})
        self.handler_config = model_config.handler
        torch.set_num_threads(self.handler_config.torch_threads)
        model_dir = (context.system_properties or {}).get("model_dir")
        spec_file = Path(model_dir) / MODEL_SPEC_FILE if model_dir else None
        spec = None
        if spec_file is not None and spec_file.is_file():
            spec = ModelSpec.load(spec_file)
            self._initialize_from_spec(context, spec)
        else:
            # An archive made without `hookwatch archive`: TorchServe's own loader (one
            # no-argument nn.Module class in the model file, or TorchScript).
            super().initialize(context)
        self.service = ModelService.from_handler_config(
            self.model,
            self.handler_config,
            context.model_name,
            device=self.device,
            monitored=self.monitored,
            model_dir=model_dir,
            batch_size=_batch_size(model_config.raw, context),
            answer_steps=spec.answer_steps if spec is not None else None,
        )

    def _initialize_from_spec(self, context: Any, spec: ModelSpec) -> None:
        """What BaseHandler.initialize sets up, with the model built as the spec says."""
        properties = context.system_properties or {}
        gpu = properties.get("gpu_id")
        if torch.cuda.is_available() and gpu is not None:
            self.map_location = "cuda"
            self.device = torch.device(f"cuda:{gpu}")
        else:
            self.map_location = "cpu"
            self.device = torch.device("cpu")
        self.manifest = context.manifest
        self.model_yaml_config = context.model_yaml_config
        self.model = build_model(spec, Path(properties["model_dir"]), self.device)
        self.initialized = True

    def preprocess(self, data: list[dict[str, Any]]) -> DecodedBatch:
        context = self.context
        return self.service.decode([_body(row, context, i) for i, row in enumerate(data)])

    def inference(self, data: DecodedBatch, *args: Any, **kwargs: Any) -> BatchResult:
        return self.service.infer(data)

    def postprocess(self, data: BatchResult) -> list[Any]:
        answers = self.service.encode(data)
        # Per-item status codes: one bad request in a batch gets its 4xx, the rest are served
        # (after encode: an answer may refuse what a request asked of it).
        context = self.context
        for index, error in data.errors.items():
            context.set_response_status(error.status, HTTPStatus(error.status).phrase, index)
        # Encoded here, compact, and said to be JSON: TorchServe writes an object it is handed
        # through json.dumps(indent=2), Python's pure encoder rather than its C one (and more
        # bytes) and sends it with no Content-Type at all.
        for index in range(len(answers)):
            context.set_response_content_type(index, JSON)
        return [_compact(answer).encode() for answer in answers]


class UnmonitoredHandler(HookwatchHandler):
    """The same decoding, batching and answers with nothing attached: the bench's baseline."""

    monitored: ClassVar[bool] = False
