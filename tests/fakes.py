"""A stand-in for TorchServe's worker Context, for handler tests without Java; a stand-in
for an HTTP endpoint that serves text."""

from __future__ import annotations

import http.server
import importlib.util
import json
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

HANDLERS = Path(__file__).resolve().parents[1] / "handlers"


def load_handler(name: str, path: Path | None = None) -> Any:
    """The handler class TorchServe would load from ``handlers/<name>.py`` (or ``path``)."""
    spec = importlib.util.spec_from_file_location(name, path or HANDLERS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    classes = [
        c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__
    ]
    assert len(classes) == 1, f"TorchServe takes the one class a handler file defines: {classes}"
    return classes[0]


class FakeMetrics:
    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []

    def add_time(self, name: str, value: float, *args: Any, **kwargs: Any) -> None:
        self.times.append((name, value))


class FakeContext:
    """What BaseHandler reads at initialize and handle, plus per-item response statuses."""

    def __init__(
        self,
        model_dir: Path,
        model_yaml_config: dict[str, Any],
        model_name: str = "digits",
        serialized_file: str = "digits_cnn.pt",
        model_file: str = "digits_cnn.py",
    ) -> None:
        self.model_name = model_name
        self.manifest = {"model": {"serializedFile": serialized_file, "modelFile": model_file}}
        self.system_properties = {"model_dir": str(model_dir), "gpu_id": None, "batch_size": 8}
        self.model_yaml_config = model_yaml_config
        self.metrics = FakeMetrics()
        self.statuses: dict[int, tuple[int, str]] = {}
        self.content_types: dict[int, str] = {}
        self.request_ids: dict[int, str] = {}
        #: Each request's headers as TorchServe keeps them: a part's Content-Type under the
        #: part's name (``{"body": {"content-type": ...}}``).
        self.request_headers: dict[int, dict[str, Any]] = {}

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.statuses[idx] = (code, phrase)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.content_types[idx] = value

    def get_request_header(self, idx: int, key: str) -> Any:
        return self.request_headers.get(idx, {}).get(key)


def handled(handler: Any, rows: list[dict[str, Any]], context: FakeContext) -> list[Any]:
    """``handler.handle(rows, context)``'s answers as a client reads them: each is JSON, sent
    as such (every answer's Content-Type is set)."""
    context.content_types.clear()
    encoded = handler.handle(rows, context)
    assert context.content_types == dict.fromkeys(range(len(rows)), "application/json")
    return [json.loads(answer) for answer in encoded]


@contextmanager
def archived_handler(mar: Path, into: Path) -> Iterator[tuple[Any, FakeContext]]:
    """The hookwatch handler on ``mar`` (a ``hookwatch archive`` output) as a worker loads it:
    the archive extracted into ``into``, the context from its manifest and model-config;
    yields ``(handler, context)`` and closes the handler's service afterwards."""
    with zipfile.ZipFile(mar) as archived:
        archived.extractall(into)
    manifest = json.loads((into / "MAR-INF" / "MANIFEST.json").read_text())["model"]
    context = FakeContext(
        into,
        yaml.safe_load((into / manifest["configFile"]).read_text()),
        model_name=manifest["modelName"],
        serialized_file=manifest["serializedFile"],
    )
    handler = load_handler("hookwatch_handler")()
    handler.initialize(context)
    try:
        yield handler, context
    finally:
        handler.service.close()


@contextmanager
def text_server(body: dict[str, str]) -> Iterator[int]:
    """A loopback HTTP server answering every GET with ``body["text"]`` as it is then (a test
    may change it between requests); yields its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body["text"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
