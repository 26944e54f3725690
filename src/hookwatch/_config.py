"""The ``handler:`` section of model-config.yaml, parsed once into frozen dataclasses.

:func:`read_model_config` is the one place a model-config file is read: the TorchServe
adapter, the tools and the tests all go through it (or through :meth:`HandlerConfig.from_mapping`
when TorchServe has parsed the file already).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from hookwatch._errors import ConfigError
from hookwatch._names import INPUT_LAYER, OUTPUT_LAYER

__all__ = [
    "DriftConfig",
    "HandlerConfig",
    "InputSpec",
    "ModelConfig",
    "MonitoringConfig",
    "OutputSpec",
    "TextSpec",
    "as_monitoring_config",
    "read_model_config",
]
#: ``input.encoding`` values. "float32": a body that TorchServe did not parse as JSON (any
#: Content-Type but application/json) is read as raw little-endian float32 values, which keeps
#: large inputs (3x224x224 images) from spending the request in a JSON parser.
INPUT_ENCODINGS = ("json", "float32")
#: Default ``drift.fleet_detectors``: the detectors derived from the output's logits.
FLEET_DETECTORS = ("output", "confidence", "entropy", "class_mix")
#: How wide layers are reduced for drift (``monitoring.drift.projection``).
PROJECTIONS = ("pca", "none")
#: What the model's output is (``monitoring.output.head``): it decides the output's drift
#: detectors and the answer. ``logits``: class scores (softmax, confidence, entropy, predicted
#: class); ``values``: regression outputs, tested per output; ``embedding``: a vector, tested
#: like a hidden layer; ``none``: statistics only, no output drift.
HEADS = ("logits", "values", "embedding", "none")
#: ``monitoring.hooks``: registered around sampled forwards only, or once for good.
HOOK_MODES = ("sampled", "always")
#: Input dtypes a request can be converted to (``handler.input.dtype``).
INPUT_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool")
#: ``module:function`` of ``input.preprocess``.
_FUNCTION_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
#: Characters that make a ``monitoring.layers`` entry a glob pattern.
GLOB_CHARS = frozenset("*?[")


def _expect(cond: bool, key: str, expected: str, got: object) -> None:
    if not cond:
        where = f"monitoring.{key}" if key else "monitoring"
        raise ConfigError(f"{where}: expected {expected}, got {got!r}")


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


def _strings(raw: Mapping[str, Any], key: str, what: str) -> list[str]:
    value = raw.get(key, [])
    _expect(
        isinstance(value, list | tuple) and all(isinstance(x, str) and x for x in value),
        key,
        f"a list of {what}",
        value,
    )
    return list(value)


def _section(cls: type, raw: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    """``raw`` as a mapping whose keys are all fields of ``cls`` (a typo fails the load)."""
    if raw is None:
        raw = {}
    _expect(isinstance(raw, Mapping), key, "a mapping", raw)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    _expect(not unknown, key, f"only the keys {sorted(known)}", unknown)
    return raw


@dataclass(frozen=True)
class DriftConfig:
    """``monitoring.drift``: sliding-window drift tests against the model's reference profile."""

    enabled: bool = True
    #: Samples per sliding window (sampled requests, not all requests).
    window: int = 200
    #: A verdict every ``step`` new samples once the window is full; 0 means window // 4.
    step: int = 0
    #: Share of clean windows allowed to alarm, over all detectors together.
    false_alarm_rate: float = 0.01
    #: Profile file name inside the model directory (``make mar`` puts it into the .mar).
    profile: str = "drift-profile.npz"
    #: Reference-quantile bins per feature when a profile is built.
    bins: int = 10
    #: Resampled reference windows the thresholds are calibrated on at load.
    calibration_windows: int = 4000
    #: Detectors whose per-bin sample counts are exported for fleet-wide drift (PromQL over
    #: every worker and replica). Each costs two series per bin, so the default keeps the
    #: output-derived ones only: the demo then stays far below its series target.
    fleet_detectors: tuple[str, ...] = FLEET_DETECTORS
    #: How a layer with more features than ``max_features`` is reduced for drift when a profile
    #: is built: "pca" keeps its principal components on the reference, "none" its first
    #: ``max_features`` features. The profile records the result; serving follows the profile.
    projection: str = "pca"
    #: With "pca", the most features per sample captured from a wide layer and projected: it
    #: bounds the copy a sampled forward makes and the size of the projection in the profile.
    projection_width: int = 4096
    #: Anytime-valid alarms (hookwatch._drift.sequential) beside the sliding windows; the
    #: drift alert pages on them.
    sequential: bool = True
    #: Expected sampled requests between two false alarms of the sequential tests, all
    #: detectors together (per worker, and so for the fleet's samples too). The default is
    #: 30 days at 10 sampled requests per second (100 requests/s at 10 % sampling).
    run_length: int = 25_920_000
    #: Probability that the reference-sampling bounds the sequential tests rest on hold.
    reference_confidence: float = 0.99

    @property
    def effective_step(self) -> int:
        return self.step or max(1, self.window // 4)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> DriftConfig:
        raw = _section(cls, raw, "drift")
        enabled = raw.get("enabled", True)
        _expect(isinstance(enabled, bool), "drift.enabled", "true or false", enabled)
        profile = raw.get("profile", cls.profile)
        _expect(
            isinstance(profile, str) and bool(profile) and "/" not in profile,
            "drift.profile",
            "a file name in the model directory",
            profile,
        )
        fleet = raw.get("fleet_detectors", list(FLEET_DETECTORS))
        _expect(
            isinstance(fleet, list | tuple)
            and all(isinstance(x, str) and x for x in fleet)
            and len(set(fleet)) == len(fleet),
            "drift.fleet_detectors",
            "a list of distinct detector names",
            fleet,
        )
        projection = raw.get("projection", cls.projection)
        _expect(projection in PROJECTIONS, "drift.projection", f"one of {PROJECTIONS}", projection)
        # Prefixed keys so errors name the full path, e.g. monitoring.drift.window.
        keyed = {f"drift.{k}": v for k, v in raw.items()}
        rate = _number(keyed, "drift.false_alarm_rate", cls.false_alarm_rate, 0.0, 0.5)
        _expect(rate > 0.0, "drift.false_alarm_rate", "a number in (0, 0.5]", rate)
        window = _integer(keyed, "drift.window", cls.window, 2, 100_000)
        sequential = raw.get("sequential", True)
        _expect(isinstance(sequential, bool), "drift.sequential", "true or false", sequential)
        confidence = _number(
            keyed, "drift.reference_confidence", cls.reference_confidence, 0.5, 1.0
        )
        _expect(confidence < 1.0, "drift.reference_confidence", "a number in [0.5, 1)", confidence)
        return cls(
            enabled=enabled,
            window=window,
            step=_integer(keyed, "drift.step", cls.step, 0, window),
            false_alarm_rate=rate,
            profile=profile,
            bins=_integer(keyed, "drift.bins", cls.bins, 2, 64),
            calibration_windows=_integer(keyed, "drift.calibration_windows", 4000, 500, 1_000_000),
            fleet_detectors=tuple(fleet),
            projection=projection,
            projection_width=_integer(
                keyed, "drift.projection_width", cls.projection_width, 1, 65_536
            ),
            sequential=sequential,
            run_length=_integer(keyed, "drift.run_length", cls.run_length, 100, 10**15),
            reference_confidence=confidence,
        )


@dataclass(frozen=True)
class OutputSpec:
    """``monitoring.output``: what the output is, and which part of it to watch and answer."""

    head: str = "logits"
    #: For a tuple/list output its index, for a dict (or a ``ModelOutput``) its key; None: the
    #: output itself if it is a tensor, else its first tensor.
    select: int | str | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> OutputSpec:
        raw = _section(cls, raw, "output")
        head = raw.get("head", cls.head)
        _expect(head in HEADS, "output.head", f"one of {list(HEADS)}", head)
        select = raw.get("select")
        _expect(
            select is None
            or (isinstance(select, int) and not isinstance(select, bool) and select >= 0)
            or (isinstance(select, str) and bool(select)),
            "output.select",
            "a tuple index (integer >= 0), a dict key (string) or null",
            select,
        )
        return cls(head=head, select=select)


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
    copy_limit: int = 4096
    enabled: bool = True
    seed: int | None = None
    drift: DriftConfig = DriftConfig()
    #: Module class names whose every instance is watched too (``Conv2d``, ``ReLU``).
    layer_types: tuple[str, ...] = ()
    #: The most layers the patterns may resolve to: each costs series and capture work.
    max_layers: int = 32
    output: OutputSpec = OutputSpec()
    #: Units (channels of a conv map, units of a flat layer) per hidden layer whose activity is
    #: counted for the dead/saturated views; 0 switches them off. Each costs two series.
    max_units: int = 64
    #: Predicted classes whose activation statistics are kept apart (logits head); the rest
    #: share the ``other`` class; 0 switches per-class statistics off.
    max_classes: int = 20
    #: The forward's attention-mask argument (keyword name or position): hidden states
    #: ``[B, T, H]`` and the input's token ids ``[B, T]`` are then reduced over the tokens it
    #: marks, padding left out. None: activations are reduced by shape alone.
    mask: str | int | None = None
    #: When the hooks are registered: ``sampled`` only around a sampled forward (an unsampled
    #: forward runs the model as if unwatched), ``always`` once at load (the hooks then cost
    #: a closed-gate check on every forward; for models whose code inspects its own hooks).
    hooks: str = "sampled"

    @property
    def resolved(self) -> bool:
        """True once ``layers`` names modules only: no glob pattern, no type left to match."""
        return not self.layer_types and not any(GLOB_CHARS & set(layer) for layer in self.layers)

    @property
    def watched(self) -> tuple[str, ...]:
        """Every label value the ``layer`` label can take, in a stable order.

        Needs concrete layers: patterns and types are resolved against the model first
        (``hookwatch._hooks.resolve_layers``).
        """
        if not self.resolved:
            raise ConfigError(
                f"monitoring.layers: expected module paths resolved against the model, got "
                f"patterns {list(self.layers)} and types {list(self.layer_types)}"
            )
        names: list[str] = []
        if self.capture_input:
            names.append(INPUT_LAYER)
        names.extend(self.layers)
        if self.capture_output:
            names.append(OUTPUT_LAYER)
        return tuple(names)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> MonitoringConfig:
        raw = _section(cls, raw, "")
        layers = _strings(raw, "layers", "dotted module paths or glob patterns (features.*)")
        types = _strings(raw, "layer_types", "module class names (Conv2d, ReLU)")
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
        mask = raw.get("mask")
        _expect(
            mask is None
            or (isinstance(mask, str) and mask.isidentifier())
            or (isinstance(mask, int) and not isinstance(mask, bool) and mask >= 0),
            "mask",
            "the forward's attention-mask argument: a keyword name, a position (integer >= 0) "
            "or null",
            mask,
        )
        hooks = raw.get("hooks", "sampled")
        _expect(hooks in HOOK_MODES, "hooks", f"one of {list(HOOK_MODES)}", hooks)
        max_features = _integer(raw, "max_features", 256, 1, 65_536)
        drift = DriftConfig.from_mapping(raw.get("drift"))
        _expect(
            drift.projection == "none" or drift.projection_width >= max_features,
            "drift.projection_width",
            f"at least max_features ({max_features}) with projection 'pca'",
            drift.projection_width,
        )
        return cls(
            layers=tuple(layers),
            layer_types=tuple(types),
            max_layers=_integer(raw, "max_layers", 32, 1, 1024),
            output=OutputSpec.from_mapping(raw.get("output")),
            sample_rate=_number(raw, "sample_rate", 0.1, 0.0, 1.0),
            capture_input=flags["capture_input"],
            capture_output=flags["capture_output"],
            queue_size=_integer(raw, "queue_size", 1024, 1, 1_000_000),
            flush_interval_s=_number(raw, "flush_interval_s", 1.0, 0.05, 60.0),
            max_features=max_features,
            copy_limit=_integer(raw, "copy_limit", 4096, 0, 1 << 20),
            enabled=flags["enabled"],
            seed=seed,
            drift=drift,
            max_units=_integer(raw, "max_units", 64, 0, 4096),
            max_classes=_integer(raw, "max_classes", 20, 0, 256),
            mask=mask,
            hooks=hooks,
        )


def as_monitoring_config(config: MonitoringConfig | Mapping[str, Any] | None) -> MonitoringConfig:
    """A :class:`MonitoringConfig` as given, or parsed from a ``monitoring:`` mapping."""
    if isinstance(config, MonitoringConfig):
        return config
    return MonitoringConfig.from_mapping(config)


def _numbers(raw: Mapping[str, Any], key: str) -> tuple[float, ...] | None:
    value = raw.get(key)
    if value is None:
        return None
    items = value if isinstance(value, list | tuple) else [value]
    if not items or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in items
    ):
        raise ConfigError(
            f"input.{key}: expected a number or a list of numbers (one per channel), got {value!r}"
        )
    return tuple(float(v) for v in items)


@dataclass(frozen=True)
class TextSpec:
    """``input.text``: requests are text, tokenised per request by the archived tokenizer.

    A request is a JSON string or a list of strings; each text is one row of the model's batch
    and the model is called with the tokenizer's outputs named in ``arguments``, as keywords.
    """

    #: The tokenizer's directory inside the model directory (what ``save_pretrained`` wrote).
    tokenizer: str
    #: Characters per text; a longer text gets a 413 before it is tokenised.
    max_chars: int = 5000
    #: Tokens per text, special tokens included; a longer text gets a 413 (never truncated).
    max_tokens: int = 256
    #: Texts per request; more get a 413.
    max_texts: int = 16
    #: Tokenizer outputs passed to the forward, by keyword, in this order.
    arguments: tuple[str, ...] = ("input_ids", "attention_mask")

    @classmethod
    def from_mapping(cls, raw: Any) -> TextSpec:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"input.text: expected a mapping with a 'tokenizer', got {raw!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"input.text: expected only the keys {sorted(known)}, got {unknown}")
        tokenizer = raw.get("tokenizer")
        if not (isinstance(tokenizer, str) and tokenizer and not Path(tokenizer).is_absolute()):
            raise ConfigError(
                "input.text.tokenizer: expected a directory in the model directory (a relative "
                f"path), got {tokenizer!r}"
            )
        limits: dict[str, int] = {}
        for key, hi in (("max_chars", 1_000_000), ("max_tokens", 65_536), ("max_texts", 4096)):
            value = raw.get(key, getattr(cls, key))
            if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= hi):
                raise ConfigError(
                    f"input.text.{key}: expected an integer in [1, {hi}], got {value!r}"
                )
            limits[key] = value
        arguments = raw.get("arguments", list(cls.arguments))
        if not (
            isinstance(arguments, list | tuple)
            and arguments
            and all(isinstance(a, str) and a.isidentifier() for a in arguments)
            and len(set(arguments)) == len(arguments)
        ):
            raise ConfigError(
                "input.text.arguments: expected a list of distinct tokenizer outputs passed to "
                f"forward() by keyword (input_ids, attention_mask, ...), got {arguments!r}"
            )
        return cls(tokenizer=tokenizer, arguments=tuple(arguments), **limits)


@dataclass(frozen=True)
class InputSpec:
    """What one request's payload must look like and how it becomes the model's input.

    Parsed from ``handler: input:``. Either the declared form (``shape``, ``dtype``, range,
    ``mean``/``std`` normalisation), or a ``preprocess`` function shipped in the archive that
    turns one request's payload into a tensor.
    """

    shape: tuple[int, ...] | None
    min_value: float | None = None
    max_value: float | None = None
    field: str = "data"
    #: How a raw (non-JSON) body is read: "json" only, or also "float32" (little-endian bytes).
    encoding: str = "json"
    #: dtype of the tensor the model is given.
    dtype: str = "float32"
    #: Per-channel (first dimension) or scalar normalisation, applied after the range check:
    #: the model sees (x - mean) / std; requests and reference data come un-normalised.
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    #: Pass the input as this keyword argument (``forward(self, *, features)``) instead of
    #: positionally.
    argument: str | None = None
    #: ``module:function`` in the model directory: payload -> tensor of one item (raise
    #: ValueError for a payload it cannot take). Replaces shape/dtype/range/normalisation.
    preprocess: str | None = None
    #: Text requests, tokenised by an archived tokenizer. Replaces all of the above.
    text: TextSpec | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> InputSpec:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"input: expected a mapping with a 'shape', got {raw!r}")
        known = {f.name for f in fields(cls)} - {"min_value", "max_value"} | {"min", "max"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"input: expected only the keys {sorted(known)}, got {unknown}")
        if "text" in raw:
            others = sorted(set(raw) - {"text"})
            if others:
                raise ConfigError(
                    f"input: expected only 'text' for a text model (the tokenizer decides the "
                    f"rest), got also {others}"
                )
            return cls(shape=None, text=TextSpec.from_mapping(raw["text"]))
        preprocess = raw.get("preprocess")
        if preprocess is not None and not (
            isinstance(preprocess, str) and _FUNCTION_PATH.fullmatch(preprocess)
        ):
            raise ConfigError(
                f"input.preprocess: expected 'module:function' (a file in the archive), "
                f"got {preprocess!r}"
            )
        shape = raw.get("shape")
        if shape is None and preprocess is not None:
            parsed_shape = None
        elif not (
            isinstance(shape, list | tuple)
            and shape
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
        ):
            raise ConfigError(f"input.shape: expected a list of positive integers, got {shape!r}")
        else:
            parsed_shape = tuple(shape)
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
        encoding = raw.get("encoding", "json")
        if encoding not in INPUT_ENCODINGS:
            raise ConfigError(
                f"input.encoding: expected one of {list(INPUT_ENCODINGS)}, got {encoding!r}"
            )
        if encoding == "float32" and parsed_shape is None:
            raise ConfigError("input.encoding: float32 bodies need input.shape, got none")
        dtype = raw.get("dtype", "float32")
        if dtype not in INPUT_DTYPES:
            raise ConfigError(f"input.dtype: expected one of {list(INPUT_DTYPES)}, got {dtype!r}")
        mean, std = _numbers(raw, "mean"), _numbers(raw, "std")
        for key, values in (("mean", mean), ("std", std)):
            channels = parsed_shape[0] if parsed_shape else 1
            if values is not None and len(values) not in (1, channels):
                raise ConfigError(
                    f"input.{key}: expected 1 or {channels} values (one per channel of shape "
                    f"{list(parsed_shape or ())}), got {len(values)}"
                )
        if std is not None and min(std) <= 0:
            raise ConfigError(f"input.std: expected positive numbers, got {list(std)}")
        argument = raw.get("argument")
        if argument is not None and not (isinstance(argument, str) and argument.isidentifier()):
            raise ConfigError(
                f"input.argument: expected a keyword argument name of forward(), got {argument!r}"
            )
        return cls(
            shape=parsed_shape,
            min_value=lo,
            max_value=hi,
            field=name,
            encoding=encoding,
            dtype=dtype,
            mean=mean,
            std=std,
            argument=argument,
            preprocess=preprocess,
        )

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 0


@dataclass(frozen=True)
class HandlerConfig:
    """The whole ``handler:`` section: input, monitoring, class labels and torch threads."""

    input: InputSpec
    monitoring: MonitoringConfig
    labels: tuple[str, ...] | None = None
    #: torch intra-op threads per worker; 1 is fastest for small models on few cores.
    torch_threads: int = 1

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> HandlerConfig:
        section = raw if raw is not None else {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"handler: expected a mapping, got {section!r}")
        if "input" not in section:
            raise ConfigError("handler.input: expected a mapping with a 'shape', got nothing")
        labels = section.get("labels")
        if labels is not None and not (
            isinstance(labels, list) and all(isinstance(x, str) for x in labels)
        ):
            raise ConfigError(f"handler.labels: expected a list of strings, got {labels!r}")
        threads = section.get("torch_threads", 1)
        if not (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1):
            raise ConfigError(
                f"handler.torch_threads: expected a positive integer, got {threads!r}"
            )
        spec = InputSpec.from_mapping(section["input"])
        monitoring = MonitoringConfig.from_mapping(section.get("monitoring"))
        raw_monitoring = section.get("monitoring") or {}
        if spec.text is not None and "mask" not in raw_monitoring:
            # A text model is called with the tokenizer's attention mask: padding never counts.
            monitoring = replace(monitoring, mask="attention_mask")
        return cls(
            input=spec,
            monitoring=monitoring,
            labels=tuple(labels) if labels is not None else None,
            torch_threads=threads,
        )


@dataclass(frozen=True)
class ModelConfig:
    """A model-config.yaml: TorchServe's own keys as they are, and the parsed ``handler:``."""

    raw: Mapping[str, Any]
    handler: HandlerConfig

    @property
    def monitoring(self) -> MonitoringConfig:
        return self.handler.monitoring


def read_model_config(source: str | Path | Mapping[str, Any]) -> ModelConfig:
    """Parse a model-config.yaml (a path, or the mapping TorchServe already loaded)."""
    if isinstance(source, Mapping):
        raw: Any = source
    else:
        import yaml

        path = Path(source)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except OSError as error:
            raise ConfigError(f"expected a readable model-config file, got {error}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: expected YAML, got {error}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"model-config: expected a mapping, got {type(raw).__name__}")
    return ModelConfig(raw, HandlerConfig.from_mapping(raw.get("handler")))
