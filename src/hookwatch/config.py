"""The ``handler:`` sections of model-config.yaml, parsed once into frozen dataclasses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hookwatch.errors import ConfigError

#: Pseudo-layer names: the model's input (forward pre-hook on the root) and its output.
INPUT_LAYER = "input"
OUTPUT_LAYER = "output"


def _expect(cond: bool, key: str, expected: str, got: object) -> None:
    if not cond:
        raise ConfigError(f"monitoring.{key}: expected {expected}, got {got!r}")


def _number(raw: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = raw.get(key, default)
    _expect(
        isinstance(value, int | float) and not isinstance(value, bool) and lo <= value <= hi,
        key,
        f"a number in [{lo}, {hi}]",
        value,
    )
    return float(value)


def _integer(raw: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    _expect(
        isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi,
        key,
        f"an integer in [{lo}, {hi}]",
        value,
    )
    return int(value)


@dataclass(frozen=True)
class MonitoringConfig:
    """Validated monitoring knobs. Build with :meth:`from_mapping`; never mutated afterwards."""

    layers: tuple[str, ...]
    sample_rate: float = 0.1
    capture_input: bool = True
    capture_output: bool = True
    queue_size: int = 1024
    flush_interval_s: float = 1.0
    max_features: int = 256
    enabled: bool = True
    seed: int | None = None

    @property
    def watched(self) -> tuple[str, ...]:
        """Every label value the ``layer`` label can take, in a stable order."""
        names: list[str] = []
        if self.capture_input:
            names.append(INPUT_LAYER)
        names.extend(self.layers)
        if self.capture_output:
            names.append(OUTPUT_LAYER)
        return tuple(names)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> MonitoringConfig:
        if raw is None:
            raw = {}
        _expect(isinstance(raw, Mapping), "", "a mapping", raw)
        known = {
            "layers",
            "sample_rate",
            "capture_input",
            "capture_output",
            "queue_size",
            "flush_interval_s",
            "max_features",
            "enabled",
            "seed",
        }
        unknown = sorted(set(raw) - known)
        _expect(not unknown, "", f"only the keys {sorted(known)}", unknown)
        layers = raw.get("layers", [])
        _expect(
            isinstance(layers, list | tuple) and all(isinstance(x, str) and x for x in layers),
            "layers",
            "a list of dotted module paths",
            layers,
        )
        _expect(len(set(layers)) == len(layers), "layers", "no duplicates", layers)
        for reserved in (INPUT_LAYER, OUTPUT_LAYER):
            _expect(reserved not in layers, "layers", f"no layer named {reserved!r}", layers)
        flags: dict[str, bool] = {}
        for key in ("capture_input", "capture_output", "enabled"):
            value = raw.get(key, True)
            _expect(isinstance(value, bool), key, "true or false", value)
            flags[key] = value
        seed = raw.get("seed")
        _expect(
            seed is None or (isinstance(seed, int) and not isinstance(seed, bool)),
            "seed",
            "an integer or null",
            seed,
        )
        return cls(
            layers=tuple(layers),
            sample_rate=_number(raw, "sample_rate", 0.1, 0.0, 1.0),
            capture_input=flags["capture_input"],
            capture_output=flags["capture_output"],
            queue_size=_integer(raw, "queue_size", 1024, 1, 1_000_000),
            flush_interval_s=_number(raw, "flush_interval_s", 1.0, 0.05, 60.0),
            max_features=_integer(raw, "max_features", 256, 1, 65_536),
            enabled=flags["enabled"],
            seed=seed,
        )


@dataclass(frozen=True)
class InputSpec:
    """What one request's payload must look like; parsed from ``handler: input:``."""

    shape: tuple[int, ...]
    min_value: float | None = None
    max_value: float | None = None
    field: str = "data"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> InputSpec:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"input: expected a mapping with a 'shape', got {raw!r}")
        shape = raw.get("shape")
        if not (
            isinstance(shape, list | tuple)
            and shape
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
        ):
            raise ConfigError(f"input.shape: expected a list of positive integers, got {shape!r}")
        bounds: list[float | None] = []
        for key in ("min", "max"):
            value = raw.get(key)
            if value is not None and not (
                isinstance(value, int | float) and not isinstance(value, bool)
            ):
                raise ConfigError(f"input.{key}: expected a number or null, got {value!r}")
            bounds.append(None if value is None else float(value))
        name = raw.get("field", "data")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"input.field: expected a non-empty string, got {name!r}")
        lo, hi = bounds
        if lo is not None and hi is not None and lo > hi:
            raise ConfigError(f"input: expected min <= max, got min={lo}, max={hi}")
        return cls(shape=tuple(shape), min_value=lo, max_value=hi, field=name)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n
