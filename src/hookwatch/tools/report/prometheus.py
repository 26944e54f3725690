"""The few calls of Prometheus' HTTP API the report makes: range queries, label values and the
scrape interval. Standard library and numpy only."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

FloatArray = npt.NDArray[np.float64]

#: Prometheus' own default when a config sets no global scrape_interval.
DEFAULT_SCRAPE_INTERVAL_S = 60.0

_DURATION_PART = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or refused a query."""


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels, and its samples (NaN where Prometheus had one)."""

    labels: dict[str, str]
    times: FloatArray
    values: FloatArray


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as ``5s`` or ``1m30s``."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"expected a Prometheus duration such as 15s or 1m30s, got {text!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


class Prometheus:
    """A Prometheus server at ``url`` (e.g. ``http://127.0.0.1:9090``)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// Prometheus URL, got {url!r}")
        self.url = url.rstrip("/")
        self._timeout = timeout

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self._timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            # A refused query still answers JSON that says why (bad_data, timeout, ...).
            raise PrometheusError(_refusal(error.code, error.read(), params)) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise PrometheusError(
                f"expected Prometheus at {self.url}, got no answer ({reason})"
            ) from None
        try:
            payload = json.loads(body)
        except ValueError:
            raise PrometheusError(
                f"expected JSON from the Prometheus API at {self.url}, got {body[:80]!r}"
            ) from None
        if not isinstance(payload, dict) or payload.get("status") != "success":
            raise PrometheusError(_refusal(200, body, params))
        return payload["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get(
            "query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"expected a matrix for {expr!r}, got {data.get('resultType')}")
        return [_series(row) for row in data["result"]]

    def label_values(self, label: str, selector: str, start: float, end: float) -> list[str]:
        data = self._get(
            f"label/{urllib.parse.quote(label)}/values",
            {"match[]": selector, "start": f"{start:.3f}", "end": f"{end:.3f}"},
        )
        return sorted(str(v) for v in data)

    def scrape_interval(self) -> float:
        """The global scrape interval in seconds, from the server's loaded config."""
        config = yaml.safe_load(self._get("status/config", {})["yaml"]) or {}
        interval = (config.get("global") or {}).get("scrape_interval")
        return parse_duration(str(interval)) if interval else DEFAULT_SCRAPE_INTERVAL_S


def _series(row: dict[str, Any]) -> Series:
    samples = row.get("values", [])
    times = np.array([float(t) for t, _ in samples], dtype=np.float64)
    # Prometheus writes values as strings, NaN and ±Inf included; float() reads them all.
    values = np.array([float(v) for _, v in samples], dtype=np.float64)
    return Series(dict(row.get("metric", {})), times, values)


def _refusal(status: int, body: bytes, params: dict[str, str]) -> str:
    try:
        error = str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        error = body[:200].decode(errors="replace")
    what = params.get("query") or params.get("match[]") or "the request"
    return f"expected Prometheus to answer {what!r}, got HTTP {status}: {error}"
