"""``hookwatch units``: the pruning candidates per layer, from an exporter or Prometheus.

From a running exporter (``--exporter URL``) the counts are cumulative since each worker
started; from Prometheus (``--prometheus URL``) they are the increase over ``--range``, summed
over every worker and replica. A unit that was never active while its layer was captured is a
pruning candidate; one saturated on every captured sample carries no information either.
"""

from __future__ import annotations

import itertools
import json
import re
import urllib.parse
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hookwatch._errors import ConfigError
from hookwatch.tools.devstack import http_get

__all__ = ["LayerUnits", "from_exporter", "from_prometheus", "table"]

ACTIVE = "hookwatch_unit_active_samples_total"
SATURATED = "hookwatch_unit_saturated_samples_total"
CAPTURES = "hookwatch_captures_total"
REFERENCE_DEAD = "hookwatch_reference_dead_units"
REFERENCE_SATURATED = "hookwatch_reference_saturated_units"


@dataclass
class LayerUnits:
    """One layer's units: samples captured, per unit its active and saturated samples."""

    model: str
    layer: str
    samples: float = 0.0
    active: dict[int, float] = field(default_factory=dict)
    saturated: dict[int, float] = field(default_factory=dict)
    reference_dead: float | None = None
    reference_saturated: float | None = None

    @property
    def dead(self) -> list[int]:
        """Units never active while the layer was captured."""
        return sorted(u for u, n in self.active.items() if n == 0) if self.samples else []

    @property
    def stuck(self) -> list[int]:
        """Units saturated on every captured sample (a margin for counts read at slightly
        different times)."""
        if not self.samples:
            return []
        return sorted(u for u, n in self.saturated.items() if n >= 0.999 * self.samples)


Key = tuple[str, str]


def _collect(
    rows: Iterable[tuple[str, dict[str, str], float]],
) -> list[LayerUnits]:
    layers: dict[Key, LayerUnits] = {}
    captures: dict[Key, float] = defaultdict(float)

    def layer(labels: dict[str, str]) -> LayerUnits:
        key = (labels.get("model", ""), labels.get("layer", ""))
        if key not in layers:
            layers[key] = LayerUnits(*key)
        return layers[key]

    for name, labels, value in rows:
        if name == CAPTURES:
            captures[(labels.get("model", ""), labels.get("layer", ""))] += value
        elif name in (ACTIVE, SATURATED):
            units = layer(labels).active if name == ACTIVE else layer(labels).saturated
            unit = int(labels["unit"])
            units[unit] = units.get(unit, 0.0) + value
        elif name == REFERENCE_DEAD:
            layer(labels).reference_dead = value
        elif name == REFERENCE_SATURATED:
            layer(labels).reference_saturated = value
    for key, found in layers.items():
        found.samples = captures.get(key, 0.0)
    return [layers[k] for k in sorted(layers) if layers[k].active]


#: One sample line of the text exposition format: name, optional labels, value.
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """The samples of a ``/metrics`` page (prometheus-client stays the runtime's one importer;
    hookwatch's label values hold no quotes or escapes)."""
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        yield name, dict(_LABEL.findall(labels or "")), float(value)


#: What to do when the source does not answer, by its option.
_NEXT_STEP = {
    "--exporter": "is the stack running (`hookwatch serve`)? else pass the exporter's URL",
    "--prometheus": "is the stack running (`hookwatch serve`)? else pass Prometheus' URL",
}


def _get(option: str, what: str, base: str, path: str) -> tuple[int, bytes]:
    """``base`` + ``path``, or a one-line :class:`ConfigError` saying who did not answer."""
    if not base.startswith(("http://", "https://")):
        raise ConfigError(
            f"{option}: expected an http:// or https:// URL ({what}), got {base!r}: "
            "try http://127.0.0.1:9090 for Prometheus, http://127.0.0.1:9101 for the exporter"
        )
    try:
        return http_get(base.rstrip("/") + path)
    except OSError as error:  # urllib's URLError is one; its reason is the socket's error
        reason = getattr(error, "reason", error)
        reason = getattr(reason, "strerror", None) or reason
        raise ConfigError(
            f"expected {what} at {base}, got no answer ({reason}): {_NEXT_STEP[option]}"
        ) from None


def from_exporter(url: str) -> list[LayerUnits]:
    """Cumulative counts from an exporter's ``/metrics`` (every worker since it started)."""
    status, body = _get("--exporter", "a hookwatch exporter", url, "/metrics")
    if status != 200:
        raise ConfigError(
            f"expected a hookwatch exporter at {url} (200 from /metrics), got HTTP {status}: "
            "is that the exporter's port (9101 by default)?"
        )
    text = body.decode(errors="replace")
    if "hookwatch_" not in text:
        # Another program's /metrics (Prometheus' own, TorchServe's) answers too: without a
        # word, its absent series would read as "no unit counts yet".
        raise ConfigError(
            f"expected a hookwatch exporter at {url} (hookwatch_ series in /metrics), got "
            "metrics without one: is that the exporter's port (9101 by default), not "
            "Prometheus' or TorchServe's?"
        )
    return _collect(_samples(text))


def _query(url: str, promql: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, float(value[1])) for labels, value in _answer(url, promql)]


def _exact_increases(
    url: str, selector: str, window: str, by: tuple[str, ...]
) -> list[tuple[dict[str, str], float]]:
    """Each series' increase over its samples in ``window``, summed ``by`` those labels:
    exact counts, where ``increase()`` extrapolates to the window's ends (40 captures read
    as 42). A drop is a restart: the count starts again from its new value."""
    totals: dict[tuple[str, ...], float] = defaultdict(float)
    for labels, values in _answer(url, f"{selector}[{window}]"):
        counts = [float(v) for _, v in values]
        grown = sum(b - a if b >= a else b for a, b in itertools.pairwise(counts))
        totals[tuple(labels.get(k, "") for k in by)] += grown
    return [(dict(zip(by, key, strict=True)), value) for key, value in totals.items()]


def _answer(url: str, promql: str) -> list[tuple[dict[str, str], Any]]:
    """The result of an instant query: each series' labels and its value (a vector) or its
    values (a range selector's matrix)."""
    query = urllib.parse.urlencode({"query": promql})
    status, body = _get("--prometheus", "Prometheus", url, f"/api/v1/query?{query}")
    payload = json.loads(body) if body.startswith(b"{") else {}
    if status != 200 or payload.get("status") != "success":
        why = payload.get("error") or body[:120].decode(errors="replace").strip()
        raise ConfigError(
            f"expected Prometheus at {url} to answer a query, got HTTP {status} ({why}): is "
            "that Prometheus' URL (port 9090 by default), and --range a PromQL duration (1h)?"
        )
    return [(r["metric"], r.get("values", r.get("value"))) for r in payload["data"]["result"]]


def from_prometheus(url: str, window: str, model: str | None = None) -> list[LayerUnits]:
    """Increases over the last ``window`` (a PromQL duration), over every worker and replica,
    counted from the samples Prometheus holds (not ``increase()``'s extrapolation)."""
    match = f'{{model="{model}"}}' if model else ""
    counted = {
        ACTIVE: ("model", "layer", "unit"),
        SATURATED: ("model", "layer", "unit"),
        CAPTURES: ("model", "layer"),
    }
    rows = [
        (name, labels, value)
        for name, by in counted.items()
        for labels, value in _exact_increases(url, f"{name}{match}", window, by)
    ]
    queries = {
        REFERENCE_DEAD: f"max by (model, layer) ({REFERENCE_DEAD}{match})",
        REFERENCE_SATURATED: f"max by (model, layer) ({REFERENCE_SATURATED}{match})",
    }
    rows += [
        (name, labels, value) for name, q in queries.items() for labels, value in _query(url, q)
    ]
    found = _collect(rows)
    if model and not found:
        # Asked of a model that has none, beside others that have: said so (with the others),
        # not "no unit counts yet".
        others = {
            labels.get("model", "") for labels, _ in _query(url, f"count by (model) ({ACTIVE})")
        }
        _check_model(model, others - {""})
    return found


def _check_model(model: str, models: set[str]) -> None:
    """A one-line :class:`ConfigError` for ``--model`` naming none of ``models`` (those with
    unit counts) where there are any."""
    if models and model not in models:
        raise ConfigError(
            f"--model: expected one of the models with unit counts {sorted(models)}, got {model!r}"
        )


def _share(units: list[int], total: int) -> str:
    return f"{100 * len(units) / total:.0f} %" if total else "-"


def _listed(units: list[int], limit: int = 24) -> str:
    shown = ", ".join(map(str, units[:limit]))
    return shown + (f" (+{len(units) - limit} more)" if len(units) > limit else "") or "-"


def table(layers: list[LayerUnits], model: str | None = None) -> str:
    """The units of ``layers`` (``model``'s only, when given), or a one-line
    :class:`ConfigError` for a model none of them is from while others are."""
    if model is not None:
        _check_model(model, {u.model for u in layers})
    chosen = [u for u in layers if model is None or u.model == model]
    if not chosen:
        return (
            "no unit counts yet: no hidden layer has been captured (or monitoring.max_units is 0)"
        )
    lines = []
    for u in chosen:
        total = len(u.active)
        ref_dead = "-" if u.reference_dead is None else f"{100 * u.reference_dead:.0f} %"
        ref_sat = "-" if u.reference_saturated is None else f"{100 * u.reference_saturated:.0f} %"
        lines += [
            f"{u.model}/{u.layer}: {total} units tracked, {u.samples:.0f} samples",
            f"  never active: {_share(u.dead, total)} (reference {ref_dead}): {_listed(u.dead)}",
            f"  saturated:    {_share(u.stuck, total)} (reference {ref_sat}): {_listed(u.stuck)}",
        ]
    return "\n".join(lines)
