"""One TorchServe that starts with no model loaded; a bench registers its variants itself.

Shared by ``hookwatch bench MAR`` (a user's archive, plain against hookwatch) and the
repository's overhead bench (``python -m dev bench``).
"""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from collections.abc import Sequence

from hookwatch.tools.devstack import Stack, http_get, http_post, load_failure


class BenchServer(Stack):
    """A Stack that starts with no model loaded; the bench registers its variants itself."""

    def _torchserve_ready(self) -> bool:
        status, _ = http_get(f"http://127.0.0.1:{self.ports.management}/models")
        return status == 200

    def register(
        self, names: Sequence[str], timeout: float = 300.0, workers: int = 1, suffix: str = ""
    ) -> None:
        """Register each of ``names`` from ``NAME + suffix`` in the model store (a model
        directory, or with ``suffix=".mar"`` an archive) and wait for its workers."""
        base = f"http://127.0.0.1:{self.ports.management}/models"
        for name in names:
            query = urllib.parse.urlencode(
                {
                    "url": name + suffix,
                    "model_name": name,
                    "initial_workers": workers,
                    "synchronous": "false",
                }
            )
            status, body = http_post(f"{base}?{query}", b"", content_type="text/plain")
            if status not in (200, 202):
                raise RuntimeError(
                    f"register {name}: expected 200/202, got {status} {body[:300]!r}"
                )
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            pending = [n for n in pending if self.ready_workers(n) < workers]
            failed = load_failure(self.logs, pending[0]) if pending else None
            if failed is not None:
                raise RuntimeError(
                    f"expected the workers of {', '.join(pending)} to load the model, got: {failed}"
                )
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"workers of {pending} not ready after {timeout:.0f} s")
            time.sleep(0.5)

    def unregister(self, names: Sequence[str]) -> None:
        for name in names:
            request_url = f"http://127.0.0.1:{self.ports.management}/models/{name}"
            request = urllib.request.Request(request_url, method="DELETE")
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()
