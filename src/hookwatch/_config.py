"""The ``handler:`` section of model-config.yaml, parsed once into frozen dataclasses.

:func:`read_model_config` is the one place a model-config file is read: the TorchServe
adapter, the tools and the tests all go through it (or through :meth:`HandlerConfig.from_mapping`
when TorchServe has parsed the file already).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from hookwatch._errors import ConfigError
from hookwatch._names import INPUT_LAYER, OUTPUT_LAYER

__all__ = [
    "OPTION",
    "DriftConfig",
    "HandlerConfig",
    "HarmConfig",
    "InputSpec",
    "ModelConfig",
    "MonitoringConfig",
    "Option",
    "OutputSpec",
    "TextSpec",
    "as_monitoring_config",
    "interval",
    "options",
    "read_model_config",
]
#: ``input.encoding`` values. "float32": a body that TorchServe did not parse as JSON (any
#: Content-Type but application/json) is read as raw little-endian float32 values, which keeps
#: large inputs (3x224x224 images) from spending the request in a JSON parser. "image": such a
#: body is an image file (JPEG, PNG...), decoded and fitted to the shape (hookwatch._image).
INPUT_ENCODINGS = ("json", "float32", "image")
#: Default ``drift.fleet_detectors``: every detector (glob patterns; hidden layers and the
#: input on ``drift.fleet_features`` features each).
FLEET_DETECTORS = ("*",)
#: Default ``drift.fleet_features``: a compact layer's leading components and its residual.
FLEET_FEATURES = 4
#: ``sample_rate`` unset: this share of the requests, at most ``max_sampled_per_s`` of them a
#: second per worker (20 a second fill a 200-sample drift window in 10 s; on the demo CNN at
#: ~900 requests/s it is ~2 % of them: docs/bench/results.md).
DEFAULT_SAMPLE_RATE = 0.1
DEFAULT_MAX_SAMPLED_PER_S = 20.0
#: ``sample_rate`` unset: sampled forwards add at most this share of a worker's wall time
#: (what they cost over unsampled ones, measured on the served requests). Half of the 1 %
#: the default may cost in all: the cap does not see the unsampled requests' own few µs, the
#: publishes, or a worker's threads taking a core the frontend needs (the figures that chose
#: it: docs/bench/README.md, *Figures behind the code's constants*).
DEFAULT_MAX_OVERHEAD = 0.005
#: How wide layers are reduced for drift (``monitoring.drift.projection``).
PROJECTIONS = ("pca", "none")
#: What the model's output is (``monitoring.output.head``): it decides the output's drift
#: detectors and the answer. ``logits``: class scores (softmax, confidence, entropy, predicted
#: class); ``multilabel``: one independent logit per label (a sigmoid each), tested per label
#: as ``values`` are; ``values``: regression outputs, tested per output; ``embedding``: a
#: vector, tested like a hidden layer; ``none``: statistics only, no output drift.
HEADS = ("logits", "multilabel", "values", "embedding", "none")
#: ``monitoring.hooks``: registered around sampled forwards only, or once for good.
HOOK_MODES = ("sampled", "always")
#: Input dtypes a request can be converted to (``handler.input.dtype``).
INPUT_DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)
#: ``module:function`` of ``input.preprocess``.
_FUNCTION_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
#: Characters that make a ``monitoring.layers`` entry a glob pattern.
GLOB_CHARS = frozenset("*?[")


#: ``field.metadata`` key under which a config field carries its :class:`Option`.
OPTION = "option"


@dataclass(frozen=True)
class Option:
    """What a config field carries beside its type and default: its bounds and its meaning.

    Written once, on the field (``field(default=..., metadata={OPTION: Option(...)})``, built by
    :func:`_option`): the constructor checks a value against it (``__post_init__``), the
    ``from_mapping`` parsers leave an absent key to the field's default, and
    ``dev/config_docs.py`` writes the option tables of docs/configuration.md from it.
    """

    #: What the option does: the "meaning" column of docs/configuration.md.
    doc: str
    #: How a value is checked: "number" / "integer" (within ``bounds``), "bool", "choice"
    #: (one of ``choices``) or "check" (``check``, described by ``expected``).
    kind: str
    #: Closed bounds of a number or integer; an upper bound that is a string names another
    #: field of the same section (``step`` is at most ``window``).
    bounds: tuple[float, float | str] | None = None
    #: "lo" or "hi": that end of ``bounds`` is excluded too (checked after the closed range).
    open_end: str = ""
    #: The values of a "choice", shown in the error message as given (a list or a tuple).
    choices: tuple[str, ...] | list[str] | None = None
    check: Callable[[Any], bool] | None = None
    #: What ``check`` expects, in "expected X, got Y".
    expected: str = ""
    #: Further (check, expected) pairs, in order, once the value passed ``check``.
    also: tuple[tuple[Callable[[Any], bool], str], ...] = ()
    #: A list is kept as a tuple (the config stays hashable and frozen).
    sequence: bool = False
    #: The value ``from_mapping`` gives a required field whose key is absent (None: none).
    absent: tuple[str, ...] | None = None
    #: The "type" column where it is not derived from the above.
    type_doc: str = ""
    #: Appended to the derived "type" column (a constraint against another option).
    type_note: str = ""

    def validate(self, where: str, value: Any, section: object) -> Any:
        """``value`` as the field keeps it, or a :class:`ConfigError` naming ``where``."""
        if self.kind == "check":
            assert self.check is not None
            _expect(self.check(value), where, self.expected, value)
            for check, expected in self.also:
                _expect(check(value), where, expected, value)
            return tuple(value) if self.sequence else value
        if self.kind == "choice":
            _expect(value in (self.choices or ()), where, f"one of {self.choices!r}", value)
            return value
        if self.kind == "bool":
            _expect(isinstance(value, bool), where, "true or false", value)
            return value
        assert self.bounds is not None
        lo, hi_bound = self.bounds
        hi = getattr(section, hi_bound) if isinstance(hi_bound, str) else hi_bound
        integer = self.kind == "integer"
        _expect(
            (isinstance(value, int) if integer else isinstance(value, int | float))
            and not isinstance(value, bool)
            and lo <= value <= hi,
            where,
            f"an integer in [{lo}, {hi}]" if integer else f"a number in [{lo}, {hi}]",
            value,
        )
        kept = int(value) if integer else float(value)
        if self.open_end:
            inside = kept > lo if self.open_end == "lo" else kept < hi
            _expect(inside, where, f"a number in {interval(lo, hi, self.open_end)}", kept)
        return kept


def interval(lo: float, hi: float | str, open_end: str = "") -> str:
    """``[lo, hi]`` with ``open_end``'s bracket turned, numbers written short (0, 0.5, 10^6)."""

    def short(bound: float | str) -> str:
        if isinstance(bound, str):
            return bound
        if isinstance(bound, int) and bound >= 10**6 and str(bound).rstrip("0") == "1":
            return f"10^{len(str(bound)) - 1}"
        return f"{bound:g}" if isinstance(bound, float) else str(bound)

    left = "(" if open_end == "lo" else "["
    right = ")" if open_end == "hi" else "]"
    return f"{left}{short(lo)}, {short(hi)}{right}"


_T = TypeVar("_T")


def _option(
    default: _T,
    doc: str,
    *,
    bounds: tuple[float, float | str] | None = None,
    open_end: str = "",
    choices: tuple[str, ...] | list[str] | None = None,
    check: Callable[[Any], bool] | None = None,
    expected: str = "",
    also: tuple[tuple[Callable[[Any], bool], str], ...] = (),
    type_doc: str = "",
    type_note: str = "",
) -> _T:
    """A dataclass field with its default and its :class:`Option`; the kind follows from them."""
    if check is not None:
        kind = "check"
    elif choices is not None:
        kind = "choice"
    elif isinstance(default, bool):
        kind = "bool"
    elif bounds is not None:
        kind = "integer" if isinstance(default, int) else "number"
    else:
        raise TypeError(f"expected bounds, choices or a check for default {default!r}, got none")
    option = Option(
        doc=doc,
        kind=kind,
        bounds=bounds,
        open_end=open_end,
        choices=choices,
        check=check,
        expected=expected,
        also=also,
        sequence=isinstance(default, tuple) and check is not None,
        type_doc=type_doc,
        type_note=type_note,
    )
    value: _T = dataclasses.field(default=default, metadata={OPTION: option})
    return value


def options(cls: type) -> list[tuple[dataclasses.Field[Any], Option]]:
    """``cls``'s fields that carry an :class:`Option`, in field order."""
    return [(f, f.metadata[OPTION]) for f in fields(cls) if OPTION in f.metadata]


def _validate(section: object, where: str) -> None:
    """Check every option field of a frozen ``section`` in field order, keeping the result."""
    for f, option in options(type(section)):
        value = getattr(section, f.name)
        kept = option.validate(f"{where}.{f.name}", value, section)
        if kept is not value:
            object.__setattr__(section, f.name, kept)


def _given(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw``'s keys, plus the ``absent`` value of a required field it leaves out.

    An absent key with a default is left out: the dataclass default applies.
    """
    values = dict(raw)
    for f, option in options(cls):
        if f.name not in values and option.absent is not None:
            values[f.name] = option.absent
    return values


def _expect(cond: bool, where: str, expected: str, got: object) -> None:
    if not cond:
        raise ConfigError(f"{where}: expected {expected}, got {got!r}")


def _strings(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(x, str) and x for x in value)


def _distinct(value: Any) -> bool:
    return len(set(value)) == len(value)


def _number(value: Any) -> bool:
    """A finite int or float, never a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _index(value: Any) -> bool:
    """An integer >= 0 (a position, a tuple index), never a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _section(cls: type, raw: Mapping[str, Any] | None, where: str) -> Mapping[str, Any]:
    """``raw`` as a mapping whose keys are all fields of ``cls`` (a typo fails the load)."""
    if raw is None:
        raw = {}
    _expect(isinstance(raw, Mapping), where, "a mapping", raw)
    _known_keys(raw, sorted(f.name for f in fields(cls)), where)
    return raw


def _known_keys(raw: Mapping[Any, Any], known: Sequence[str], where: str) -> None:
    """A :class:`ConfigError` for a key of ``raw`` not in ``known``, naming the nearest known
    key where one is near (a typo: `windw`, `monitorng`)."""
    import difflib

    unknown = sorted(str(key) for key in raw if key not in known)
    if not unknown:
        return
    near = [
        f"{key}: did you mean {close[0]}?"
        for key in unknown
        if (close := difflib.get_close_matches(key, known, n=1, cutoff=0.6))
    ]
    raise ConfigError(
        f"{where}: expected only the keys {list(known)}, got {unknown}"
        + (f" ({'; '.join(near)})" if near else "")
    )


@dataclass(frozen=True)
class DriftConfig:
    """``monitoring.drift``: sliding-window drift tests against the model's reference profile.

    Validated on construction: a value out of its bounds raises :class:`ConfigError`.
    """

    enabled: bool = _option(True, "false: no drift tests even with a profile")
    window: int = _option(200, "samples per sliding window", bounds=(2, 100_000))
    step: int = _option(
        0,
        "a verdict every `step` new samples once the window is full; 0 means window / 4",
        bounds=(0, "window"),
    )
    false_alarm_rate: float = _option(
        0.01,
        "share of clean windows allowed to alarm, over all detectors and layers together",
        bounds=(0.0, 0.5),
        open_end="lo",
    )
    profile: str = _option(
        "drift-profile.npz",
        "profile inside the model directory (`make mar` archives it)",
        check=lambda v: isinstance(v, str) and bool(v) and "/" not in v,
        expected="a file name in the model directory",
        type_doc="file name",
    )
    bins: int = _option(
        10, "reference-quantile bins per feature when a profile is built", bounds=(2, 64)
    )
    calibration_windows: int = _option(
        4000,
        "resampled reference windows the thresholds are calibrated on at load",
        bounds=(500, 1_000_000),
    )
    fleet_detectors: tuple[str, ...] = _option(
        FLEET_DETECTORS,
        "detectors whose per-bin sample counts are exported "
        "(`hookwatch_drift_bin_samples_total`) for the fleet-wide score in PromQL, as names or "
        "glob patterns (`*`: every detector); each costs two series per bin it counts: the "
        "output's detectors every feature, the input and hidden layers `fleet_features` each "
        "([drift.md](drift.md#fleet-wide-drift)); names the profile does not have are ignored",
        check=lambda v: _strings(v) and _distinct(v),
        expected="a list of distinct detector names or patterns",
        type_doc="list of detector names or patterns",
    )
    fleet_features: int = _option(
        FLEET_FEATURES,
        "features of an input or hidden-layer fleet detector whose bins are counted: its first "
        "`fleet_features - 1` and its last (for a projected layer the leading principal "
        "components and the residual distance); all of them when it has no more",
        bounds=(1, 256),
    )
    projection: str = _option(
        "pca",
        "how a layer or input with more than `max_features` features is reduced when a profile "
        "is built: its top principal components on the reference (`components`) plus the "
        "distance from them (`pca`), or its first `max_features` features (`none`); the profile "
        "records it and serving follows the profile ([drift.md](drift.md#wide-layers-projection))",
        choices=PROJECTIONS,
    )
    projection_width: int = _option(
        4096,
        "the most features per sample a projected layer hands to the capture thread; bounds the "
        "copy on a sampled forward and the projection's size in the profile",
        bounds=(1, 65_536),
        type_note="at least `max_features` with `pca`",
    )
    components: int | None = _option(
        None,
        "principal components a projected layer keeps (`pca`); they are fitted on a random "
        "half of the reference and the layer is binned on the other; null sizes them from the "
        "reference: one per 25 reference samples, at most `max_features - 1` (components "
        "fitted on fewer samples each follow the reference's noise and keep less of the data's "
        "variance), and the profile build logs the count chosen; a number asks for that many, "
        "and the build warns when the reference has fewer than 25 samples per component",
        check=lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
        expected="an integer >= 1 or null",
        type_doc="int or null",
        type_note="at most `max_features - 1`",
    )
    sequential: bool = _option(
        True,
        "run the anytime-valid test per detector beside the "
        "windows: the per-worker drift warning (HookwatchDriftWarning) needs it; the page "
        "(HookwatchDrift) is the fleet's test ([drift.md](drift.md#anytime-valid-alarms))",
    )
    false_page_days: float = _option(
        30.0,
        "the drift page's budget: at most one false page (HookwatchDrift) per model per this "
        "many days in expectation over the whole fleet, whatever its size and traffic; the page "
        "is a test on the fleet's merged bin counts in the recording rules "
        "([drift.md](drift.md#the-false-page-budget))",
        bounds=(0.01, 3650.0),
    )
    run_length: int = _option(
        25_920_000,
        "expected sampled requests between two false alarms of all detectors together, per "
        "worker: the per-worker anytime-valid tests, which warn (HookwatchDriftWarning) and do "
        "not page; the default is 30 days at 10 sampled requests/s (100 requests/s at 10 % "
        "sampling)",
        bounds=(100, 10**15),
    )
    reference_confidence: float = _option(
        0.99,
        "probability, over the reference draw, that the bound on the reference's sampling error "
        "the anytime-valid test rests on holds; higher is more cautious and less sensitive",
        bounds=(0.5, 1.0),
        open_end="hi",
    )

    def __post_init__(self) -> None:
        _validate(self, "monitoring.drift")

    @property
    def effective_step(self) -> int:
        return self.step or max(1, self.window // 4)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> DriftConfig:
        return cls(**_given(cls, _section(cls, raw, "monitoring.drift")))


@dataclass(frozen=True)
class HarmConfig:
    """``monitoring.harm``: the accuracy estimate without labels, and the page on its drop.

    Needs a profile built with reference labels and a ``logits`` head
    ([drift.md](drift.md#harm-pages-drift-warns)); without them the model pages on drift.
    """

    enabled: bool = _option(
        True,
        "false: no accuracy estimate even with a labelled reference (the model then pages on "
        "drift, HookwatchDrift)",
    )
    layer: str | None = _option(
        None,
        "the watched hidden layer whose features the estimate reads when a profile is built "
        "with labels; null: the last watched hidden layer, unless its estimate on the "
        "reference itself sits more than 10 points from the model's accuracy there and another "
        "watched layer's sits nearer (that one is read, and the build log says why; `archive` "
        "warns where the layer read still sits that far). The profile records it and serving "
        "follows the profile",
        check=lambda v: v is None or (isinstance(v, str) and bool(v)),
        expected="a watched layer's name or null",
        type_doc="layer name or null",
    )
    max_drop: float = _option(
        0.05,
        "how far (a share: 0.05 is 5 points) the estimated accuracy may fall below the "
        "reference's before the anytime-valid drop test pages (HookwatchAccuracyDrop)",
        bounds=(0.0, 0.5),
        open_end="lo",
    )
    run_length: int = _option(
        25_920_000,
        "expected sampled requests between two false alarms of the drop test, per worker, "
        "while the estimate holds (as `drift.run_length`: 30 days at 10 sampled requests/s)",
        bounds=(100, 10**15),
    )
    neighbours: int = _option(
        10,
        "labelled reference samples voting on each sampled request (k of the k-NN) when a "
        "profile is built",
        bounds=(1, 100),
    )
    support_quantile: float = _option(
        0.99,
        "a sampled request farther from its neighbours than this quantile of the reference's "
        "own distances counts as an error (outside the reference's support); 1 switches the "
        "gate off. Read when a profile is built",
        bounds=(0.5, 1.0),
        open_end="lo",
    )

    def __post_init__(self) -> None:
        _validate(self, "monitoring.harm")

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> HarmConfig:
        return cls(**_given(cls, _section(cls, raw, "monitoring.harm")))


@dataclass(frozen=True)
class OutputSpec:
    """``monitoring.output``: what the output is, and which part of it to watch and answer."""

    head: str = _option(
        "logits",
        "what the output is: `logits` gives the softmax, confidence, entropy and class-mix "
        "detectors (any number of classes: the per-class detector keeps the `max_features` "
        "classes with most reference probability, the class mix the 63 most frequent classes "
        "plus `other`); a binary classifier's one logit a sample (`[batch, 1]` or `[batch]`, "
        "as `BCEWithLogitsLoss` trains it) is read as two classes' logits `[0, z]`: class 1 "
        "where it is positive, with probability sigmoid(z); `multilabel`: one independent "
        "logit per label (`BCEWithLogitsLoss` over several labels), answered as the `labels` "
        "whose sigmoid is above 0.5 and every label's probability, its drift tested per "
        "label as `values` are; per-position logits "
        "`[batch, positions, classes]` (token "
        "classification, CTC) give each sample's class shares over its positions, the mean "
        "confidence and entropy over them and its most frequent class, and so does a class "
        "map `[batch, classes, height, width]` (segmentation, classes first as a convolution "
        "gives them) over its pixels, answered per pixel as `[H][W]` lists; `values` (regression) "
        "and `embedding` are one detector of their "
        "features, projected like a layer when wider than `max_features`; `none`: statistics "
        "only. A detector's output, one dict of tensors a sample (`[{boxes, scores, labels}, "
        "...]`), is answered as each sample's dict whatever the head; under `values` its "
        "features are each entry's count and mean per sample (how many objects, how sure); "
        "`logits` and `multilabel` are refused for it",
        choices=list(HEADS),
    )
    select: int | str | None = _option(
        None,
        "which part of a tuple/list (index) or dict/`ModelOutput` (key) output to watch and "
        "answer; null: the output itself if it is a tensor, else its first tensor. Over a "
        "detector's one dict a sample, a key watches that entry alone",
        check=lambda v: v is None or _index(v) or (isinstance(v, str) and bool(v)),
        expected="a tuple index (integer >= 0), a dict key (string) or null",
        type_doc="int, string or null",
    )
    items: str | None = _option(
        None,
        "the output is a list of one tensor a sample (`[N_i, ...]`, N_i varying: a detector's "
        "rows after its own thresholding or NMS, `[x1, y1, x2, y2, score, class]` each): each "
        'sample is answered its tensor under this key (`{"detections": [[...], ...]}`) and '
        "watched as a detector's dicts are (its row count and mean, under head `values`). A "
        "list's length cannot tell a batch's samples from a model's several outputs, so it is "
        "declared; null: the output is not such a list",
        check=lambda v: v is None or (isinstance(v, str) and bool(v.strip())),
        expected="a key (a non-empty string) or null",
        type_doc="string or null",
    )
    also: tuple[int | str, ...] = _option(
        (),
        "other parts of a tuple/list (index) or dict/`ModelOutput` (key) output answered "
        "beside the head's, each request its own sample's values under that key "
        '(`{"class": 1, "probabilities": [...], "spend": 12.5}`: a multi-task model\'s other '
        "heads; a value a sample is a number); answered, not watched. `hookwatch init` lists "
        "the output's other tensors of a row per sample (at most 64 values each); `archive` "
        "refuses a part that is missing or has no row per sample",
        check=lambda v: (
            isinstance(v, list | tuple)
            and all(_index(x) or (isinstance(x, str) and bool(x)) for x in v)
            and _distinct(v)
        ),
        expected="a list of tuple indices (integers >= 0) or dict keys (strings), each once",
        type_doc="list of int or string",
    )
    steps: bool | None = _option(
        None,
        "the watched and answered output has a step per step of the input (`[batch, steps, "
        "...]` of a length each request chooses, or of a text's tokens): read over each "
        "sample's own steps and answered cut at its length; false: a fixed number of steps (a "
        "decoder's 8, a forecast's horizon), read and answered whole even where a batch's "
        "longest is as long. null: as `archive` found it (a reference sample run alone and "
        "beside a longer one), else from each batch's shapes",
        check=lambda v: v is None or isinstance(v, bool),
        expected="true, false or null",
        type_doc="bool or null",
    )
    probabilities: bool = _option(
        False,
        "the output is probabilities already (the model ends in a softmax or a sigmoid): "
        "hookwatch reads log(p) (a softmax's) or log(p / (1 - p)) (a sigmoid's: `multilabel`, "
        "a binary classifier's one value) as the logits its head takes, for answers and "
        "detectors alike (else the softmax or sigmoid were applied twice: every binary "
        "answer class 1, every label on). `hookwatch init` sets it for a model whose last "
        "module is `Softmax` or `Sigmoid`; `archive` refuses `logits` over rows that sum to "
        "1 without it. `logits` and `multilabel` heads only",
    )

    def __post_init__(self) -> None:
        _validate(self, "monitoring.output")
        if self.probabilities and self.head not in ("logits", "multilabel"):
            raise ConfigError(
                f"monitoring.output.probabilities: expected a logits or multilabel head, got "
                f"head {self.head}: only class scores are read as probabilities"
            )
        if self.items is not None and self.head not in ("values", "none"):
            raise ConfigError(
                f"monitoring.output.items: expected head values (or none), got head "
                f"{self.head}: a sample's tensor of rows holds no class scores of its own"
            )
        if self.also and self.items is not None:
            raise ConfigError(
                f"monitoring.output.also: expected none beside items (each sample's tensor is "
                f"the whole answer), got {list(self.also)}"
            )
        for part in self.also:
            if part == self.select:
                raise ConfigError(
                    f"monitoring.output.also: expected parts other than the one watched and "
                    f"answered by the head (output.select), got {part!r}"
                )
            if str(part) in ANSWER_KEYS:
                raise ConfigError(
                    f"monitoring.output.also: expected keys other than the answer's own "
                    f"({', '.join(sorted(ANSWER_KEYS))}), got {part!r}"
                )
        if self.items is not None and self.select not in (None, self.items):
            raise ConfigError(
                f"monitoring.output.select: expected null (or {self.items!r}) beside items, "
                f"got {self.select!r}: each sample's tensor is the output"
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> OutputSpec:
        return cls(**_given(cls, _section(cls, raw, "monitoring.output")))


#: The keys a head's answer holds (``output.also`` cannot name one).
ANSWER_KEYS = frozenset(
    {
        "class",
        "probabilities",
        "top",
        "labels",
        "values",
        "embedding",
        "output",
        "classes",
        "confidence",
    }
)


@dataclass(frozen=True)
class MonitoringConfig:
    """Validated monitoring knobs, never mutated once built.

    Build with :meth:`from_mapping` (the ``monitoring:`` section) or directly; both check
    every value against its field's bounds and raise :class:`ConfigError` "expected X, got Y"::

        config = hookwatch.MonitoringConfig(layers=("act",), sample_rate=0.5)
    """

    layers: tuple[str, ...] = dataclasses.field(
        metadata={
            OPTION: Option(
                doc="layers whose output is watched; a pattern (`features.*.relu`, "
                "`blocks.?.act`) matches paths in the model's order (`*` matches dots too: in "
                "a BERT, `encoder.layer.*.output` also matches "
                "`encoder.layer.0.attention.output`; `encoder.layer.?.output` is the blocks' "
                "outputs only, up to 10 layers); a tuple, list, dict (`ModelOutput`) or "
                "dataclass output is watched at its first tensor (an item that is a tensor "
                "first, else one nested up to three levels down: an LSTM's `(out, (h, c))` at "
                "`out`); an entry that matches nothing fails the load with the model's paths; "
                "`input`/`output` are reserved",
                kind="check",
                check=_strings,
                expected=(
                    "a list of dotted module paths or glob patterns (features.*), as strings "
                    "(quote a path YAML reads as a number: an nn.Sequential's ['0', '2'])"
                ),
                also=(
                    (_distinct, "no duplicates"),
                    (lambda v: INPUT_LAYER not in v, f"no layer named {INPUT_LAYER!r}"),
                    (lambda v: OUTPUT_LAYER not in v, f"no layer named {OUTPUT_LAYER!r}"),
                ),
                sequence=True,
                absent=(),
                type_doc="list of dotted `named_modules()` paths or glob patterns",
            )
        }
    )
    sample_rate: float | None = _option(
        None,
        "share of forward passes captured, each on its own draw, a sampled one with all its "
        "requests (each request is captured at this rate; a request of several texts is "
        "captured whole), taken exactly; "
        f"null: hookwatch's default, {DEFAULT_SAMPLE_RATE:g} of the requests and at most "
        "`max_sampled_per_s` of them a second per worker, their hooks at most `max_overhead` "
        "of its time",
        check=lambda v: v is None or (_number(v) and 0.0 <= v <= 1.0),
        expected="a number in [0.0, 1.0] or null",
        type_doc="number in [0, 1] or null",
    )
    max_sampled_per_s: float = _option(
        DEFAULT_MAX_SAMPLED_PER_S,
        "with `sample_rate` unset, the most requests a worker samples per second: above "
        f"{DEFAULT_MAX_SAMPLED_PER_S / DEFAULT_SAMPLE_RATE:g} requests/s (at the default share) "
        "the share drops so that the samples a second stay at this, re-decided on every "
        "publish (`flush_interval_s`) from the requests counted since the last, and held "
        "between publishes by a bucket of a second's samples (a burst after a quiet spell is "
        "capped from its first request); it bounds what "
        "monitoring costs a busy worker (a sampled request costs its forward tens of µs and "
        "the capture thread as much again: docs/bench/request.md) while a quiet one is "
        "sampled at the full share. A `sample_rate` that is set is taken exactly, and this is "
        "ignored",
        bounds=(0.01, 1_000_000),
    )
    max_overhead: float = _option(
        DEFAULT_MAX_OVERHEAD,
        "with `sample_rate` unset, the share of a worker's time that sampled forwards may add "
        "over unsampled ones: the share also drops so that (sampled forwards a second) x "
        "(what a sampled forward takes more than an unsampled one, plus the capture thread's "
        "CPU for its record) stays at this. Measured on the served requests' durations "
        "(those of sampled forwards against the others', smoothed over publishes; at least 3 "
        "sampled forwards per estimate; the first 10 and the first drain, which pay one-time "
        "costs, left out) and on the capture thread's own CPU clock, "
        "re-decided on every publish with `max_sampled_per_s`, whichever gives the lower "
        "share; what a hooked forward costs differs by orders of magnitude between models "
        "and devices ([architecture](architecture.md#two-paths), *How many are sampled*). "
        "Measured where hookwatch's handler serves the model (it reports which forwards were "
        "sampled). A `sample_rate` that is set is taken exactly, and this is ignored",
        bounds=(0.0, 1.0),
        open_end="lo",
    )
    capture_input: bool = _option(True, 'watch the model\'s input (`layer="input"`)')
    capture_output: bool = _option(True, 'watch the model\'s output (`layer="output"`)')
    queue_size: int = _option(
        1024,
        "capacity per worker of the buffer between the request thread and the capture thread, "
        "in sampled forward passes (one record of every watched layer each); when full, a "
        "record is dropped and its captures counted",
        bounds=(1, 1_000_000),
    )
    flush_interval_s: float = _option(
        1.0,
        "how often the capture thread publishes what it accumulated (statistics, drift "
        "verdicts, fleet bin counts, gauges, the request-duration histogram) to the metric "
        "files: how far a scrape can lag "
        "behind, and what a worker killed with SIGKILL loses (request counts are written as "
        "they happen and are never lost); under traffic, sampled forwards are processed once "
        "128 wait or within 5 s, so statistics and verdicts can lag by up to 5 s more",
        bounds=(0.05, 60.0),
    )
    max_features: int = _option(
        256,
        "features per layer and sample tested for drift (per-channel means for conv maps); a "
        "wider layer is projected to this many (`drift.projection`)",
        bounds=(1, 65_536),
    )
    copy_limit: int = _option(
        4096,
        "activations of at most this many elements per sample are handed off as an owned copy "
        "and reduced in batches on the capture thread; larger ones are reduced in the hook (0: "
        "always in the hook)",
        bounds=(0, 1 << 20),
    )
    enabled: bool = _option(True, "false: no hooks at all, requests still counted")
    seed: int | None = _option(
        None,
        "seed of the sampling draw (tests)",
        check=lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
        expected="an integer or null",
        type_doc="int or null",
    )
    drift: DriftConfig = DriftConfig()
    layer_types: tuple[str, ...] = _option(
        (),
        "also watch every module of these classes (`ReLU`, `Conv2d`), in the model's order",
        check=_strings,
        expected="a list of module class names (Conv2d, ReLU)",
        type_doc="list of module class names",
    )
    max_layers: int = _option(
        32,
        "the most layers `layers` and `layer_types` may resolve to (each costs series and "
        "capture work); more is a load error naming the patterns. The resolved list is logged "
        "at load",
        bounds=(1, 1024),
    )
    output: OutputSpec = OutputSpec()
    harm: HarmConfig = HarmConfig()
    max_units: int = _option(
        64,
        "units (channels of a conv map, units of a flat layer) per hidden layer whose activity "
        "is counted for the never-active and saturated views (`hookwatch_unit_*`, `hookwatch "
        "units`); each tracked unit costs two series, 0 switches the views off",
        bounds=(0, 4096),
    )
    max_classes: int = _option(
        20,
        "predicted classes whose activation statistics (mean, zero fraction) are kept apart "
        "(`hookwatch_class_activation_statistic`; logits head): the ones predicted most often "
        'on the reference, the rest as `class="other"`; each costs 4 series per watched layer, '
        "0 switches them off",
        bounds=(0, 256),
    )
    mask: str | int | None = _option(
        None,
        "the forward's attention-mask argument (`attention_mask`, or `1` for `forward(ids, "
        "mask)`): token activations are then reduced over the tokens it marks, padding left "
        "out: a hidden state `[B, T, H]` gives statistics over its tokens' values and, for "
        "drift, the mean over tokens per hidden unit (`H` features, projected when wider than "
        "`max_features`); the input's token ids `[B, T]` give statistics over the ids and the "
        "token count as their feature. Other shapes (a pooled `[B, H]`, attention weights "
        "`[B, heads, T, T]`) are reduced as usual. A forward called without the mask counts "
        "every token. It may name each sample's lengths instead, an integer tensor `[B]` "
        "(`forward(x, lengths)`, for `pack_padded_sequence`): its steps of the padded batch "
        "`[B, T, ...]` are then the tokens. Text inputs (`input.text`) default it to "
        "`attention_mask`",
        check=lambda v: v is None or (isinstance(v, str) and v.isidentifier()) or _index(v),
        expected="the forward's attention-mask argument: a keyword name, a position (integer "
        ">= 0) or null",
        type_doc="keyword name, position or null",
    )
    hooks: str = _option(
        "sampled",
        "when hookwatch's hooks are on the modules: `sampled` registers them around each "
        "sampled forward and removes them after it (an unsampled forward runs the model as if "
        "unwatched; a watched layer with no hooks of its own gets a forward tap on its "
        "instance instead of a hook, and under TorchServe the model itself gets none: "
        "[architecture](architecture.md#hooks-only-around-sampled-forwards)); `always` "
        "registers them once at load (each forward then pays PyTorch's "
        "hook dispatch; for models whose own code inspects their hooks). A model with "
        "`torch.compile`d parts, or compiled whole, always gets `always` "
        "([architecture](architecture.md#hooks-only-around-sampled-forwards))",
        choices=list(HOOK_MODES),
    )

    def __post_init__(self) -> None:
        _validate(self, "monitoring")
        if self.sample_rate is not None:
            object.__setattr__(self, "sample_rate", float(self.sample_rate))
        for name, section in (
            ("drift", DriftConfig),
            ("output", OutputSpec),
            ("harm", HarmConfig),
        ):
            value = getattr(self, name)
            _expect(
                isinstance(value, section),
                f"monitoring.{name}",
                f"a {section.__name__} ({section.__name__}.from_mapping parses a mapping)",
                value,
            )
        _expect(
            self.drift.projection == "none" or self.drift.projection_width >= self.max_features,
            "monitoring.drift.projection_width",
            f"at least max_features ({self.max_features}) with projection 'pca'",
            self.drift.projection_width,
        )
        _expect(
            self.drift.components is None or self.drift.components < self.max_features,
            "monitoring.drift.components",
            f"at most max_features - 1 ({self.max_features - 1}): the distance from the "
            "components is one more feature",
            self.drift.components,
        )

    @property
    def share(self) -> float:
        """The share of requests sampled: ``sample_rate``, or the default's share."""
        return DEFAULT_SAMPLE_RATE if self.sample_rate is None else self.sample_rate

    @property
    def sample_cap(self) -> float | None:
        """The most requests sampled per second and worker: ``max_sampled_per_s`` with
        ``sample_rate`` unset, None (no cap) with it set."""
        return self.max_sampled_per_s if self.sample_rate is None else None

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
        """The config of a model-config's ``handler: monitoring:`` section, checked.

        Usage::

            config = hookwatch.MonitoringConfig.from_mapping({"layers": ["act"]})
        """
        raw = _section(cls, raw, "monitoring")
        return cls(
            **{
                **_given(cls, raw),
                "drift": DriftConfig.from_mapping(raw.get("drift")),
                "output": OutputSpec.from_mapping(raw.get("output")),
                "harm": HarmConfig.from_mapping(raw.get("harm")),
            }
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
    Validated on construction, like :class:`MonitoringConfig`.
    """

    tokenizer: str = dataclasses.field(
        metadata={
            OPTION: Option(
                doc="a text model: the tokenizer's directory in the model directory (a "
                "`--model-args` directory archived with the model, under the argument's name). "
                "With `input.text` no other `input` key is allowed but `argument` (the tokens "
                "together as one dict under that keyword)",
                kind="check",
                check=lambda v: isinstance(v, str) and bool(v) and not Path(v).is_absolute(),
                expected="a directory in the model directory (a relative path)",
                type_doc="relative path",
            )
        }
    )
    max_chars: int = _option(
        5000,
        "characters per text; a longer text gets a 413 before it is tokenised",
        bounds=(1, 1_000_000),
    )
    max_tokens: int = _option(
        256,
        "tokens per text, special tokens included; a longer text gets a 413 (texts are never "
        "truncated). Left at 256, the tokenizer's `model_max_length` where that is less",
        bounds=(1, 65_536),
        type_note="at most the tokenizer's `model_max_length`",
    )
    max_texts: int = _option(
        16, "texts per request (a JSON list); more get a 413", bounds=(1, 4096)
    )
    arguments: tuple[str, ...] = _option(
        ("input_ids", "attention_mask"),
        "what the forward is called with, by keyword, in this order; a name the tokenizer does "
        "not produce fails the load",
        check=lambda v: (
            isinstance(v, list | tuple)
            and bool(v)
            and all(isinstance(a, str) and a.isidentifier() for a in v)
            and _distinct(v)
        ),
        expected="a list of distinct tokenizer outputs passed to forward() by keyword "
        "(input_ids, attention_mask, ...)",
        type_doc="list of tokenizer outputs",
    )

    def __post_init__(self) -> None:
        _validate(self, "input.text")

    @classmethod
    def from_mapping(cls, raw: Any) -> TextSpec:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"input.text: expected a mapping with a 'tokenizer', got {raw!r}")
        return cls(**{**_section(cls, raw, "input.text"), "tokenizer": raw.get("tokenizer")})


#: Keys of a single input that an argument of ``input.arguments`` does not take.
_SINGLE_INPUT_KEYS = frozenset(
    {
        "arguments",
        "argument",
        "field",
        "encoding",
        "max_body_bytes",
        "max_items",
        "preprocess",
        "sample_rate",
        "features",
        "text",
    }
)


#: What an image input's pixels may become: floats over 255, or the bytes themselves.
_IMAGE_DTYPES = ("float32", "float64", "float16", "bfloat16", "uint8")


def _feature_names(
    raw: Any, shape: tuple[int, ...] | None, length_dim: int | None, encoding: str
) -> tuple[str, ...] | None:
    """``input.features``: one distinct name per value of a ``[F]`` input."""
    if raw is None:
        return None
    width = shape[0] if shape is not None and len(shape) == 1 and length_dim is None else None
    if (
        not isinstance(raw, list)
        or not all(isinstance(n, str) and n for n in raw)
        or len(set(raw)) != len(raw)
        or width is None
        or len(raw) != width
        or encoding == "image"
    ):
        raise ConfigError(
            "input.features: expected a distinct name per value of a tabular input "
            f"(input.shape [{len(raw) if isinstance(raw, list) else 'F'}]: its columns, in "
            f"order), got {raw!r} for shape {list(shape) if shape is not None else None}"
        )
    return tuple(raw)


def _check_image_input(shape: tuple[int, ...] | None, dtype: Any, preprocess: Any) -> None:
    if preprocess is not None:
        raise ConfigError(
            "input.encoding: image decodes the body itself, got input.preprocess too (a "
            "preprocess function takes parsed JSON: leave encoding json)"
        )
    if shape is None or len(shape) != 3 or shape[0] not in (1, 3, 4):
        raise ConfigError(
            "input.encoding: image needs input.shape [channels, height, width] with 1 "
            f"(grey), 3 (RGB) or 4 (RGBA) channels, got {list(shape) if shape else shape}"
        )
    if dtype not in _IMAGE_DTYPES:
        raise ConfigError(
            f"input.encoding: image gives pixels over 255 as a float dtype, or uint8 bytes: "
            f"expected input.dtype one of {list(_IMAGE_DTYPES)}, got {dtype!r}"
        )


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
    #: How a raw (non-JSON) body is read: "json" only, or also "float32" (little-endian bytes)
    #: or "image" (an image file; or base64 in the JSON field).
    encoding: str = "json"
    #: Largest request body, in bytes; None: 1 MiB, or more where one input of ``shape`` as
    #: JSON needs it (:func:`hookwatch._body.body_limit`).
    max_body_bytes: int | None = None
    #: dtype of the tensor the model is given.
    dtype: str = "float32"
    #: Per-channel (first dimension) or scalar normalisation, applied after the range check:
    #: the model sees (x - mean) / std; requests and reference data come un-normalised.
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    #: Pass the input as this keyword argument (``forward(self, *, features)``) instead of
    #: positionally; beside ``arguments``, pass them together as one dict under this
    #: keyword (``forward(self, batch)`` reading ``batch["ids"]``) rather than each as its own.
    argument: str | None = None
    #: ``module:function`` in the model directory: payload -> tensor of one item (raise
    #: ValueError for a payload it cannot take). Replaces shape/dtype/range/normalisation.
    preprocess: str | None = None
    #: Text requests, tokenised by an archived tokenizer. Replaces all of the above.
    text: TextSpec | None = None
    #: Several tensors a request (``input.arguments``): each a field of the request's JSON
    #: object and a keyword argument of forward(), named alike, declared as one input is
    #: (shape, dtype, range, normalisation). Replaces the single input's keys.
    arguments: tuple[InputSpec, ...] = ()
    #: The dimension of ``shape`` whose length each request chooses (``null`` in the
    #: model-config), from 1 to ``shape[length_dim]`` (``input.max_length``, substituted into
    #: ``shape``: body limits use the longest, ``bench``'s synthetic requests lengths up to
    #: it). None: a fixed shape. A batch is padded to its longest with ``pad_value``.
    length_dim: int | None = None
    #: Pass each sample's length (int64 ``[batch]``) as this keyword argument of forward().
    lengths: str | None = None
    #: Pass a bool mask ``[batch, longest]`` (True at a sample's own steps, False at padding)
    #: as this keyword argument of forward().
    mask: str | None = None
    #: What padding holds, in the model's units (after normalisation).
    pad_value: float = 0.0
    #: Most items one request may send as a list of them (``{"instances": [[...], [...]]}``),
    #: each answered in order; 1: one item a request. Not with a preprocess function.
    max_items: int = 64
    #: A waveform input's rate: a WAV body recorded at another is refused (nothing is
    #: resampled). None: any rate.
    sample_rate: int | None = None
    #: A tabular input's column names, in the order of ``shape [F]``: a request may send a
    #: record ``{"age": 41, ...}`` (or several), and a CSV header is matched by name.
    features: tuple[str, ...] | None = None

    @property
    def shape_text(self) -> str:
        """The shape as messages show it: ``[<=512, 8]`` for a variable length."""
        dims = [
            f"<={d}" if i == self.length_dim else str(d) for i, d in enumerate(self.shape or ())
        ]
        return f"[{', '.join(dims)}]"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> InputSpec:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"input: expected a mapping with a 'shape', got {raw!r}")
        known = {f.name for f in fields(cls)} - {"min_value", "max_value", "length_dim"} | {
            "min",
            "max",
            "max_length",
        }
        _known_keys(raw, sorted(known), "input")
        if "text" in raw:
            others = sorted(set(raw) - {"text", "argument"})
            if others:
                raise ConfigError(
                    f"input: expected only 'text' (and 'argument') for a text model (the "
                    f"tokenizer decides the rest), got also {others}"
                )
            argument = raw.get("argument")
            if argument is not None and not (isinstance(argument, str) and argument.isidentifier()):
                raise ConfigError(
                    "input.argument: expected a keyword argument name of forward(), got "
                    f"{argument!r}"
                )
            # argument: the tokens together as one dict under that keyword (forward(input)).
            return cls(shape=None, text=TextSpec.from_mapping(raw["text"]), argument=argument)
        if "arguments" in raw:
            return cls._from_arguments(raw)
        preprocess = raw.get("preprocess")
        if preprocess is not None and not (
            isinstance(preprocess, str) and _FUNCTION_PATH.fullmatch(preprocess)
        ):
            raise ConfigError(
                f"input.preprocess: expected 'module:function' (a file in the archive), "
                f"got {preprocess!r}"
            )
        shape = raw.get("shape")
        length_dim: int | None = None
        if shape is None and preprocess is not None:
            parsed_shape = None
        elif not (
            isinstance(shape, list | tuple)
            and all(
                d is None or (isinstance(d, int) and not isinstance(d, bool) and d > 0)
                for d in shape
            )
            and sum(d is None for d in shape) <= 1
        ):
            raise ConfigError(
                f"input.shape: expected a list of positive integers (one of them null for a "
                f"length each request chooses; [] for one number a sample), got {shape!r}"
            )
        else:
            length_dim = next((i for i, d in enumerate(shape) if d is None), None)
            parsed_shape = cls._with_max_length(raw, shape, length_dim)
        bounds: list[float | None] = []
        for key in ("min", "max"):
            value = raw.get(key)
            if value is not None and not (
                isinstance(value, int | float) and not isinstance(value, bool)
            ):
                raise ConfigError(f"input.{key}: expected a number or null, got {value!r}")
            bounds.append(None if value is None else float(value))
        name = raw.get("field", cls.field)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"input.field: expected a non-empty string, got {name!r}")
        lo, hi = bounds
        if lo is not None and hi is not None and lo > hi:
            raise ConfigError(f"input: expected min <= max, got min={lo}, max={hi}")
        encoding = raw.get("encoding", cls.encoding)
        if encoding not in INPUT_ENCODINGS:
            raise ConfigError(
                f"input.encoding: expected one of {list(INPUT_ENCODINGS)}, got {encoding!r}"
            )
        if encoding == "float32" and parsed_shape is None:
            raise ConfigError("input.encoding: float32 bodies need input.shape, got none")
        if encoding == "image":
            _check_image_input(parsed_shape, raw.get("dtype", cls.dtype), preprocess)
        max_body = raw.get("max_body_bytes")
        if max_body is not None and not (
            isinstance(max_body, int)
            and not isinstance(max_body, bool)
            and 1024 <= max_body <= 1 << 30
        ):
            raise ConfigError(
                f"input.max_body_bytes: expected an integer from 1024 to {1 << 30} (bytes) or "
                f"null, got {max_body!r}"
            )
        dtype = raw.get("dtype", cls.dtype)
        if dtype not in INPUT_DTYPES:
            raise ConfigError(f"input.dtype: expected one of {list(INPUT_DTYPES)}, got {dtype!r}")
        mean, std = _numbers(raw, "mean"), _numbers(raw, "std")
        for key, values in (("mean", mean), ("std", std)):
            # A variable first dimension is a length, not channels: one value for all.
            channels = parsed_shape[0] if parsed_shape and length_dim != 0 else 1
            if values is not None and len(values) not in (1, channels):
                what = (
                    "one value (the first dimension is a length each request chooses, not channels)"
                    if length_dim == 0
                    else f"1 or {channels} values (one per channel of shape "
                    f"{list(parsed_shape or ())})"
                )
                raise ConfigError(f"input.{key}: expected {what}, got {len(values)}")
        if std is not None and min(std) <= 0:
            raise ConfigError(f"input.std: expected positive numbers, got {list(std)}")
        argument = raw.get("argument")
        if argument is not None and not (isinstance(argument, str) and argument.isidentifier()):
            raise ConfigError(
                f"input.argument: expected a keyword argument name of forward(), got {argument!r}"
            )
        lengths, mask, pad_value = cls._length_keys(raw, length_dim, encoding, argument)
        max_items = raw.get("max_items", cls.max_items)
        if not (isinstance(max_items, int) and not isinstance(max_items, bool)) or not (
            1 <= max_items <= 4096
        ):
            raise ConfigError(
                f"input.max_items: expected an integer from 1 to 4096 (items a request), got "
                f"{max_items!r}"
            )
        sample_rate = raw.get("sample_rate")
        if sample_rate is not None and not (
            type(sample_rate) is int
            and 1 <= sample_rate <= 10_000_000
            and parsed_shape is not None
            and len(parsed_shape) in (1, 2)
        ):
            raise ConfigError(
                "input.sample_rate: expected samples a second (an integer) of a waveform input "
                f"(input.shape [samples] or [channels, samples]), got {sample_rate!r} for "
                f"shape {list(parsed_shape) if parsed_shape is not None else None}"
            )
        features = _feature_names(raw.get("features"), parsed_shape, length_dim, encoding)
        return cls(
            shape=parsed_shape,
            min_value=lo,
            max_value=hi,
            field=name,
            encoding=encoding,
            max_body_bytes=max_body,
            dtype=dtype,
            mean=mean,
            std=std,
            argument=argument,
            preprocess=preprocess,
            length_dim=length_dim,
            lengths=lengths,
            mask=mask,
            pad_value=pad_value,
            max_items=max_items,
            sample_rate=sample_rate,
            features=features,
        )

    @staticmethod
    def _with_max_length(
        raw: Mapping[str, Any], shape: Sequence[int | None], length_dim: int | None
    ) -> tuple[int, ...]:
        """``shape`` with ``input.max_length`` in place of its null."""
        longest = raw.get("max_length")
        if length_dim is None:
            if longest is not None:
                raise ConfigError(
                    f"input.max_length: expected a null in input.shape for it to bound, got "
                    f"shape {list(shape)}"
                )
            return tuple(d for d in shape if d is not None)
        if not (isinstance(longest, int) and not isinstance(longest, bool) and longest > 0):
            raise ConfigError(
                f"input.max_length: expected a positive integer bounding input.shape's null "
                f"dimension (the longest input a request may send), got {longest!r}"
            )
        return tuple(longest if d is None else d for d in shape)

    @staticmethod
    def _length_keys(
        raw: Mapping[str, Any],
        length_dim: int | None,
        encoding: str,
        argument: str | None,
    ) -> tuple[str | None, str | None, float]:
        """``lengths``, ``mask`` and ``pad_value`` of a variable-length input, checked."""
        if length_dim is None:
            given = [k for k in ("lengths", "mask", "pad_value") if k in raw]
            if given:
                raise ConfigError(
                    f"input.{given[0]}: expected a null in input.shape (a length each request "
                    f"chooses) for it, got a fixed shape"
                )
            return None, None, 0.0
        if encoding != "json":
            raise ConfigError(
                f"input.encoding: a variable-length input (null in input.shape) is sent as "
                f"JSON, got {encoding!r}"
            )
        if argument is not None:
            raise ConfigError(
                "input.argument: a variable-length input (null in input.shape) is passed "
                "positionally, got a keyword for it; name its lengths or mask with "
                "input.lengths or input.mask"
            )
        names: list[str | None] = []
        for key in ("lengths", "mask"):
            name = raw.get(key)
            if name is not None and not (isinstance(name, str) and name.isidentifier()):
                raise ConfigError(
                    f"input.{key}: expected a keyword argument name of forward(), got {name!r}"
                )
            names.append(name)
        if names[0] is not None and names[0] == names[1]:
            raise ConfigError(
                f"input.lengths and input.mask: expected two keyword arguments, got "
                f"{names[0]!r} for both"
            )
        pad = raw.get("pad_value", 0.0)
        if not (isinstance(pad, int | float) and not isinstance(pad, bool) and math.isfinite(pad)):
            raise ConfigError(f"input.pad_value: expected a finite number, got {pad!r}")
        return names[0], names[1], float(pad)

    @classmethod
    def _from_arguments(cls, raw: Mapping[str, Any]) -> InputSpec:
        others = sorted(set(raw) - {"arguments", "max_body_bytes", "argument"})
        if others:
            raise ConfigError(
                f"input: expected only 'arguments', 'argument' and 'max_body_bytes' beside "
                f"input.arguments (each argument declares its own shape, dtype and range), got "
                f"also {others}"
            )
        arguments = raw["arguments"]
        if not (isinstance(arguments, Mapping) and arguments):
            raise ConfigError(
                "input.arguments: expected a mapping of forward()'s keyword arguments to their "
                f"inputs ({{x: {{shape: [16]}}, lengths: {{shape: [1], dtype: int64}}}}), got "
                f"{arguments!r}"
            )
        parts: list[InputSpec] = []
        for name, declared in arguments.items():
            where = f"input.arguments.{name}"
            if not (isinstance(name, str) and name.isidentifier()):
                raise ConfigError(
                    f"input.arguments: expected keyword argument names of forward(), got {name!r}"
                )
            if not isinstance(declared, Mapping):
                raise ConfigError(f"{where}: expected a mapping with a 'shape', got {declared!r}")
            single = sorted(set(declared) & _SINGLE_INPUT_KEYS)
            if single:
                raise ConfigError(
                    f"{where}: expected shape, dtype, min, max, mean and std only (the argument's "
                    f"name is its field and keyword), got also {single}"
                )
            try:
                part = cls.from_mapping(declared)
            except ConfigError as error:
                raise ConfigError(str(error).replace("input.", f"{where}.", 1)) from None
            parts.append(replace(part, field=name, argument=name))
        spec = cls.from_mapping({k: v for k, v in raw.items() if k != "arguments"} | {"shape": [1]})
        spec = replace(spec, shape=None, arguments=tuple(parts))
        cls._check_variable_argument(spec)
        return spec

    @staticmethod
    def _check_variable_argument(spec: InputSpec) -> None:
        """At most one of ``input.arguments`` of a variable length (one batch is padded to one
        longest), its lengths and mask keywords none of the arguments' names."""
        variable = [part for part in spec.arguments if part.length_dim is not None]
        if len(variable) > 1:
            raise ConfigError(
                f"input.arguments: expected at most one argument with a null in its shape (a "
                f"batch is padded along one length), got {len(variable)}: "
                f"{', '.join(part.field for part in variable)}"
            )
        if not variable:
            return
        (part,) = variable
        if spec.argument is not None:
            raise ConfigError(
                f"input.argument: expected none beside a variable-length argument (each "
                f"argument is passed as its own keyword), got {spec.argument!r}"
            )
        names = {other.field for other in spec.arguments}
        for key, keyword in (("lengths", part.lengths), ("mask", part.mask)):
            if keyword in names:
                raise ConfigError(
                    f"input.arguments.{part.field}.{key}: expected a keyword other than the "
                    f"arguments' own ({', '.join(sorted(names))}), got {keyword!r}"
                )

    @property
    def variable(self) -> InputSpec | None:
        """The input of a length each request chooses: this one, or the one of
        ``input.arguments`` that is; None where every shape is fixed."""
        if self.length_dim is not None:
            return self
        return next((part for part in self.arguments if part.length_dim is not None), None)

    @property
    def numel(self) -> int:
        if self.arguments:
            return sum(part.numel for part in self.arguments)
        return math.prod(self.shape) if self.shape is not None else 0


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
        # A typo here dropped a whole section silently (`monitorng:`: nothing watched).
        _known_keys(section, _HANDLER_KEYS, "handler")
        if "input" not in section:
            raise ConfigError("handler.input: expected a mapping with a 'shape', got nothing")
        labels = section.get("labels")
        if labels is not None and not (
            isinstance(labels, list) and all(isinstance(x, str) for x in labels)
        ):
            raise ConfigError(f"handler.labels: expected a list of strings, got {labels!r}")
        threads = section.get("torch_threads", cls.torch_threads)
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


#: What ``handler:`` holds; TorchServe's own keys sit beside it, at the top.
_HANDLER_KEYS = ("input", "monitoring", "labels", "torch_threads")


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
    if "handler" not in raw:
        import difflib

        near = difflib.get_close_matches("handler", [str(k) for k in raw], n=1, cutoff=0.6)
        if near:
            raise ConfigError(
                f"model-config: expected a handler: section, got {near[0]!r} (did you mean "
                "handler?)"
            )
    return ModelConfig(raw, HandlerConfig.from_mapping(raw.get("handler")))


# Public as hookwatch.MonitoringConfig: reprs and tracebacks say so.
MonitoringConfig.__module__ = "hookwatch"
