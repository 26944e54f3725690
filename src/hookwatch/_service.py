"""Request handling for a monitored model, free of TorchServe.

:mod:`hookwatch.torchserve` adapts this to TorchServe's ``initialize → preprocess → inference
→ postprocess`` contract. Bad requests become :class:`BadInputError` per item, so one malformed
request in a batch gets its own 4xx and the rest of the batch is still served.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from hookwatch._config import HandlerConfig, InputSpec
from hookwatch._errors import BadInputError
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch._profile import load_tracker

__all__ = ["BatchResult", "ClassifierService", "DecodedBatch", "decode_payload"]

MAX_BODY_BYTES = 1 << 20


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        keys = ", ".join(sorted(map(str, value))[:5])
        return f"an object with keys [{keys}]"
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}"


def _shape_of(value: Any) -> tuple[int, ...] | None:
    """Shape of a rectangular nested list of numbers, or None if it is ragged or not numeric."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return ()
    if not isinstance(value, list) or not value:
        return None
    inner = _shape_of(value[0])
    if inner is None:
        return None
    for item in value[1:]:
        if _shape_of(item) != inner:
            return None
    return (len(value), *inner)


def _decode_float32(body: bytes | bytearray, spec: InputSpec) -> torch.Tensor:
    expected = spec.numel * 4
    if len(body) != expected:
        raise BadInputError(
            f"{expected} bytes of little-endian float32 (shape {list(spec.shape)}) "
            'or a JSON body sent as "Content-Type: application/json"',
            f"{len(body)} bytes",
        )
    # astype copies into native order, so the tensor owns its memory, not the request buffer.
    values = np.frombuffer(body, dtype="<f4").astype(np.float32)
    return torch.from_numpy(values).reshape(spec.shape)


def _check_values(tensor: torch.Tensor, spec: InputSpec) -> torch.Tensor:
    if not bool(torch.isfinite(tensor).all()):
        raise BadInputError("finite numbers", "NaN or Infinity")
    lo, hi = spec.min_value, spec.max_value
    if lo is not None or hi is not None:
        vmin, vmax = float(tensor.min()), float(tensor.max())
        if (lo is not None and vmin < lo) or (hi is not None and vmax > hi):
            raise BadInputError(
                f"values in [{lo if lo is not None else -math.inf}, "
                f"{hi if hi is not None else math.inf}]",
                f"values in [{vmin:g}, {vmax:g}]",
            )
    return tensor


def decode_payload(body: Any, spec: InputSpec) -> torch.Tensor:
    """One request's payload → a float32 tensor of ``spec.shape``; raises :class:`BadInputError`.

    TorchServe hands a body sent as ``application/json`` over already parsed; any other body
    arrives as bytes, which are JSON text, or raw float32 when ``spec.encoding`` says so.
    """
    expected_body = f'a JSON object {{"{spec.field}": <{"x".join(map(str, spec.shape))} numbers>}}'
    if isinstance(body, bytes | bytearray):
        if len(body) > MAX_BODY_BYTES:
            raise BadInputError(
                f"a body of at most {MAX_BODY_BYTES} bytes", f"{len(body)} bytes", status=413
            )
        if spec.encoding == "float32":
            return _check_values(_decode_float32(body, spec), spec)
        try:
            body = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise BadInputError(expected_body, f"a body that is not JSON ({error})") from None
    elif isinstance(body, str):
        try:
            body = json.loads(body)
        except json.JSONDecodeError as error:
            raise BadInputError(expected_body, f"a body that is not JSON ({error})") from None
    if not isinstance(body, dict):
        raise BadInputError(expected_body, _describe(body))
    if spec.field not in body:
        raise BadInputError(expected_body, _describe(body))
    values = body[spec.field]
    shape = _shape_of(values)
    if shape is None:
        raise BadInputError(
            f"a rectangular array of numbers of shape {list(spec.shape)} "
            f"(or {spec.numel} numbers flat)",
            _describe(values) if not isinstance(values, list) else "a ragged or non-numeric list",
        )
    if shape != spec.shape and shape != (spec.numel,):
        raise BadInputError(
            f"shape {list(spec.shape)} (or {spec.numel} numbers flat)", f"shape {list(shape)}"
        )
    return _check_values(torch.tensor(values, dtype=torch.float32).reshape(spec.shape), spec)


@dataclass
class DecodedBatch:
    """Valid inputs stacked for one forward pass, and the error of each invalid item."""

    size: int
    inputs: torch.Tensor | None
    positions: list[int]
    errors: dict[int, BadInputError]


@dataclass
class BatchResult:
    size: int
    outputs: torch.Tensor | None
    positions: list[int]
    errors: dict[int, BadInputError]


class ClassifierService:
    """Decode JSON, run the model under its monitor, answer class + probabilities.

    ``monitor=None`` serves the same requests unmonitored: the baseline the bench compares to.
    """

    def __init__(
        self,
        model: nn.Module,
        spec: InputSpec,
        monitor: Monitor | None,
        labels: Sequence[str] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.model = model
        self.spec = spec
        self.monitor = monitor
        self.labels = list(labels) if labels is not None else None
        self.device = device or torch.device("cpu")

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
    ) -> ClassifierService:
        """Serve ``model`` as a model-config's ``handler:`` section says.

        ``monitored=False`` serves the same requests with nothing attached. The drift profile
        is looked up in ``model_dir`` (where TorchServe extracts the .mar).
        """
        monitor = None
        if monitored:
            config = handler.monitoring
            drift = load_tracker(config, model_dir, model_name)
            monitor = Monitor(model, config, model_name, metrics, drift=drift)
        return cls(model, handler.input, monitor, handler.labels, device)

    def decode(self, bodies: Sequence[Any]) -> DecodedBatch:
        tensors: list[torch.Tensor] = []
        positions: list[int] = []
        errors: dict[int, BadInputError] = {}
        for index, body in enumerate(bodies):
            try:
                tensors.append(decode_payload(body, self.spec))
                positions.append(index)
            except BadInputError as error:
                errors[index] = error
        if errors and self.monitor is not None:
            self.monitor.reject(len(errors))
        inputs = torch.stack(tensors).to(self.device) if tensors else None
        return DecodedBatch(len(bodies), inputs, positions, errors)

    def infer(self, batch: DecodedBatch) -> BatchResult:
        outputs = None
        if batch.inputs is not None:
            scope = (
                self.monitor.request(len(batch.positions))
                if self.monitor is not None
                else contextlib.nullcontext()
            )
            with torch.inference_mode(), scope:
                outputs = self.model(batch.inputs)
        return BatchResult(batch.size, outputs, batch.positions, batch.errors)

    def encode(self, result: BatchResult) -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = [{} for _ in range(result.size)]
        for index, error in result.errors.items():
            answers[index] = error.as_dict()
        if result.outputs is not None:
            probabilities = torch.softmax(result.outputs.float(), dim=1).cpu()
            classes = probabilities.argmax(dim=1).tolist()
            for row, index in enumerate(result.positions):
                cls = int(classes[row])
                answers[index] = {
                    "class": self.labels[cls] if self.labels else cls,
                    "probabilities": [round(p, 6) for p in probabilities[row].tolist()],
                }
        return answers

    def handle(self, bodies: Sequence[Any]) -> list[dict[str, Any]]:
        return self.encode(self.infer(self.decode(bodies)))

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
