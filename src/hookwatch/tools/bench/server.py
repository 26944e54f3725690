"""One TorchServe that starts with no model loaded; a bench registers its variants itself.

Shared by ``hookwatch bench MAR`` (a user's archive, plain against hookwatch) and the
repository's overhead bench (``python -m dev bench``).
"""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from collections.abc import Sequence

from hookwatch.tools.devstack import Stack, http_get, http_post


class BenchServer(Stack):
    """A Stack that starts with no model loaded; the bench registers its variants itself."""

    def _torchserve_ready(self) -> bool:
        status, _ = http_get(f"http://127.0.0.1:{self.ports.management}/models")
        return status == 200

    def _load_failed(self) -> str | None:
        """The worker log's tail when TorchServe said a model failed to load, else None."""
        log = self.logs / "torchserve.out"
        if not (log.exists() and "Load model failed" in log.read_text(errors="replace")):
            return None
        model_log = self.logs / "model_log.log"
        return model_log.read_text(errors="replace")[-4000:] if model_log.exists() else ""

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
            failed = self._load_failed() if pending else None
            if failed is not None:
                last = (failed.strip().splitlines() or ["no worker log"])[-1]
                raise RuntimeError(
                    f"expected the workers of {', '.join(pending)} to load the model, got a "
                    f"failed load ({last}; logs in {self.logs})"
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
