"""The words hookwatch's metrics and profiles are made of: one definition each.

Layer pseudo-names, statistic names, drift levels and detectors become label values and profile
keys. Config, statistics, drift, the catalogue and the tools all import them from here, so a
label value can never be spelled two ways. Plain data, no imports.
"""

from __future__ import annotations

#: Pseudo-layer names: the model's input (forward pre-hook on the root) and its output.
INPUT_LAYER = "input"
OUTPUT_LAYER = "output"
#: ``layer`` label value for faults that belong to no single layer.
ALL_LAYERS = "all"

#: Columns of a per-sample statistics row, in order.
STATISTICS: tuple[str, ...] = (
    "mean",
    "std",
    "min",
    "max",
    "zero_fraction",
    "nan_count",
    "inf_count",
)
#: The statistics exported as per-sample summaries (the ``statistic`` label); the non-finite
#: counts go to a counter instead.
SUMMARY_STATISTICS: tuple[str, ...] = STATISTICS[:5]
#: Values of the ``kind`` label of the non-finite counter.
NONFINITE_KINDS: tuple[str, ...] = ("nan", "inf")

#: Statistics exported per predicted class (the ``statistic`` label of the per-class summary):
#: the two a pruning or debugging question asks first, at a fraction of the series.
CLASS_STATISTICS: tuple[str, ...] = ("mean", "zero_fraction")
#: ``class`` label value shared by every class past ``max_classes``.
OTHER_CLASS = "other"

#: Why a request was answered with a 4xx (the ``reason`` label of the reject counter): a
#: fixed vocabulary, never text from the request.
REJECT_REASONS: tuple[str, ...] = (
    "too_large",  # the body, or a text model's texts, tokens or characters, over a limit (413)
    "not_json",  # the body does not parse: as JSON, or as the file it came as (image, WAV)
    "not_utf8",  # text that is not UTF-8: undecodable bytes or an unpaired surrogate
    "too_deep",  # nested deeper than the input's shape allows
    "missing_field",  # no input field in the JSON object
    "wrong_shape",  # a shape, or a ragged or non-numeric array, other than the input's; no text
    "not_finite",  # NaN or Infinity
    "out_of_range",  # outside the input's range, or beyond float32
    "wrong_type",  # fractional values for an integer input; not a string for a text input
    "preprocess",  # the model's own preprocess function refused the payload
    "model_refused",  # decoded, but the model's forward raised on it alone (422)
    "unreadable",  # decoding failed in a way hookwatch does not name (logged)
    "other",  # turned away by serving code that named no reason (Monitor.reject)
)

#: Levels a drift detector belongs to (the ``level`` label).
LEVELS: tuple[str, ...] = ("input", "activation", "output", "prediction")
#: Detectors derived from the model's output logits, in the order they are built.
OUTPUT_DETECTORS: tuple[str, ...] = ("output", "confidence", "entropy", "class_mix")


def drift_detectors(watched: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Values of the ``detector`` label: each watched layer, and for the output its four."""
    names = [w for w in watched if w != OUTPUT_LAYER]
    if OUTPUT_LAYER in watched:
        names.extend(OUTPUT_DETECTORS)
    return tuple(names)


def unit_layers(watched: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Layers whose units are tracked (dead, saturated): the hidden ones, not the model's
    input pixels or output logits."""
    return tuple(w for w in watched if w not in (INPUT_LAYER, OUTPUT_LAYER))


def class_labels(max_classes: int) -> tuple[str, ...]:
    """Values of the ``class`` label: a slot per tracked class, then the shared one."""
    return (*(str(i) for i in range(max_classes)), OTHER_CLASS) if max_classes else ()


def level_of(detector: str) -> str:
    """The ``level`` label value of a detector."""
    if detector == INPUT_LAYER:
        return "input"
    if detector == "output":
        return "output"
    if detector in OUTPUT_DETECTORS:
        return "prediction"
    return "activation"
