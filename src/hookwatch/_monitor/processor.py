"""The capture path's work, with no thread and no Prometheus: records in, tallies out.

:meth:`CaptureProcessor.process` turns a batch of records into per-layer statistic tallies,
drift verdicts and fleet bin counts; :meth:`CaptureProcessor.take` hands what accumulated to
whoever publishes it and starts afresh. The capture thread calls both; a test can call them
directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import numpy as np
import torch

from hookwatch._blas import OneBlasThread
from hookwatch._capture import RateLimitedLog
from hookwatch._drift import (
    AccuracyTracker,
    DriftResult,
    DriftTracker,
    IntArray,
    class_logits,
)
from hookwatch._hooks import Held, PlainCapture, as_array
from hookwatch._monitor.gate import Record
from hookwatch._names import (
    CLASS_STATISTICS,
    INPUT_LAYER,
    OUTPUT_LAYER,
    STATISTICS,
    SUMMARY_STATISTICS,
)
from hookwatch._stats import INF_COLUMN, NAN_COLUMN, feature_rows, reduce_rows
from hookwatch._views import ClassSlots, UnitReference, active_counts

__all__ = ["AccuracyTally", "CaptureProcessor", "DriftTally", "LayerTally", "Processed"]

log = logging.getLogger("hookwatch")


#: How long the capture thread sleeps at each pause within a drain (see yield_gil).
YIELD_S = 0.0001


def yield_gil() -> None:
    """Let a thread that waits for the GIL have it.

    numpy's calls on arrays this small keep the GIL, and a request thread that gave it up for
    a torch operation waits for it until the interpreter's switch interval (5 ms) forces a
    hand-over, once per operation. A sleep releases it at once; a short sleep rather than
    ``sleep(0)`` so the waiting thread wakes and takes it before this one does (the measured
    p99s are in docs/bench/README.md, "Figures behind the code's constants"). It costs the
    capture thread wall time, not CPU.
    """
    time.sleep(YIELD_S)


#: Where a record's capture (a plain tuple of :class:`~hookwatch._hooks.Capture`'s fields)
#: keeps its raw copy.
RAW: Final = 3

#: Columns of a statistics row exported per predicted class.
CLASS_COLUMNS = [STATISTICS.index(s) for s in CLASS_STATISTICS]


@dataclass
class LayerTally:
    """A layer's statistics since the last take."""

    captures: int = 0
    nan: float = 0.0
    inf: float = 0.0
    finite: int = 0
    sums: np.ndarray[Any, np.dtype[np.float64]] = field(
        default_factory=lambda: np.zeros(len(SUMMARY_STATISTICS))
    )
    #: Per tracked unit, the finite samples on which it was active / saturated (None: not
    #: tracked for this layer, or no reference to tell saturation by).
    active: IntArray | None = None
    saturated: IntArray | None = None
    #: Per class slot, the sums of the CLASS_STATISTICS columns ``[slots, 2]`` and the finite
    #: samples ``[slots]`` (None: no per-class statistics).
    class_sums: np.ndarray[Any, np.dtype[np.float64]] | None = None
    class_counts: IntArray | None = None

    def add_units(self, active: IntArray, saturated: IntArray | None) -> None:
        self.active = active if self.active is None else self.active + active
        if saturated is not None:
            self.saturated = saturated if self.saturated is None else self.saturated + saturated

    def add_classes(self, sums: np.ndarray[Any, np.dtype[np.float64]], counts: IntArray) -> None:
        if self.class_sums is None or self.class_counts is None:
            self.class_sums, self.class_counts = sums, counts
        else:
            self.class_sums = self.class_sums + sums
            self.class_counts = self.class_counts + counts


@dataclass
class DriftTally:
    """A detector's verdicts since the last take: how many, how many alarmed, the latest."""

    latest: DriftResult
    windows: int = 0
    alarms: int = 0


@dataclass(frozen=True)
class AccuracyTally:
    """The accuracy estimate as of the last drain: the window's estimate and the cumulative
    sums since the worker started (the publisher turns them into counter increments)."""

    estimated_accuracy: float
    correct_sum: float
    count: int
    outside_support: int
    alarms: int
    #: Per predicted class (its index in the logits): summed scores and samples ``[C]``.
    class_correct_sum: np.ndarray[Any, np.dtype[np.float64]] | None = None
    class_count: IntArray | None = None


@dataclass
class Processed:
    """What accumulated between two takes."""

    layers: dict[str, LayerTally] = field(default_factory=lambda: defaultdict(LayerTally))
    drift: dict[str, DriftTally] = field(default_factory=dict)
    #: Fleet bin counts ``[F, K]`` per tallied detector.
    bins: dict[str, IntArray] = field(default_factory=dict)
    #: The detectors that alarmed first in the current alarm episode, as of the last drain
    #: with verdicts (None: no verdict since the last take).
    first_alarms: frozenset[str] | None = None
    #: Per detector with a sequential test: its alarms so far (cumulative) and its current
    #: log evidence, as of the last drain.
    sequential: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: The accuracy estimate as of the last drain that had one (None: none since the take).
    accuracy: AccuracyTally | None = None
    #: A fault turned the accuracy estimate off in this worker since the last take.
    accuracy_off: bool = False


class CaptureProcessor:
    """Reduces records, feeds drift windows and tallies results until :meth:`take`.

    A failure processing a layer switches that layer off (``on_layer_off`` is told, so the
    monitor can stop its hook) and a failure feeding its drift windows ends drift for it; both
    are counted in :attr:`faults` and logged, rate-limited.
    """

    def __init__(
        self,
        model_name: str,
        max_features: int,
        drift: DriftTracker | None = None,
        widths: Mapping[str, int] | None = None,
        on_layer_off: Callable[[str], None] | None = None,
        units: Mapping[str, int] | None = None,
        classes: ClassSlots | None = None,
        pause: Callable[[], None] | None = yield_gil,
    ) -> None:
        self.model_name = model_name
        #: Called between the steps of a drain (a layer's statistics, its drift windows), so
        #: one drain holds the GIL a step at a time; None: no pauses.
        self._pause = pause
        self.drift = drift
        #: Units tracked per hidden layer (at most ``max_units``), and their references.
        self.units: dict[str, int] = dict(units or {})
        self._unit_refs: Mapping[str, UnitReference] = drift.units if drift is not None else {}
        #: Per-class statistics by the output's predicted class (logits head), or None.
        self.classes = classes
        self._max_features = max_features
        #: Features kept per layer where more than max_features are needed: a projected
        #: layer's input width, every logit of the output.
        self.widths: dict[str, int] = dict(widths or {})
        self._on_layer_off = on_layer_off
        self._log = RateLimitedLog(log)
        self._disabled: set[str] = set()
        self._drift_off: set[str] = set()
        #: The accuracy estimate (a profile with a labelled reference); None: none, or off
        #: after a fault.
        self.accuracy = drift.accuracy if drift is not None else None
        # One lock for what take() swaps out and the fault counts; held only to add or copy.
        self._lock = threading.Lock()
        self._pending = Processed()
        self._faults: dict[str, int] = defaultdict(int)
        self._one_blas_thread = OneBlasThread()

    def process(self, records: Sequence[Record]) -> None:
        # The reductions' and the estimate's matrix products on one thread: a served worker's
        # cores are the requests' (hookwatch._blas).
        with self._one_blas_thread():
            self._process(records)

    def _process(self, records: Sequence[Record]) -> None:
        if self.drift is not None:
            self.drift.new_round()
            # The detectors' tests and windows advance together after the layers (one pass for
            # all: a drain feeds each the same records).
            self.drift.defer()
        by_layer = _by_layer(records)
        # The output first: its predictions label every layer's rows with a class.
        order = sorted(by_layer, key=lambda layer: layer != OUTPUT_LAYER)
        # Filled by the output layer, even when a later step of its own processing fails.
        predicted: list[_Predictions] = []
        # The accuracy estimate's inputs: the logits' and the harm layer's rows of this drain.
        estimated: dict[str, _Rows] = {}
        for layer in order:
            if layer in self._disabled:
                continue
            if self._pause is not None:
                self._pause()
            try:
                self._process_layer(layer, len(records), *by_layer[layer], predicted, estimated)
            except Exception as error:
                self._disabled.add(layer)
                if self._on_layer_off is not None:
                    self._on_layer_off(layer)
                self._fault("processing", layer, error, "capture for that layer is off")
        if self.accuracy is not None and len(estimated) == 2:
            if self._pause is not None:
                self._pause()
            self._update_accuracy(self.accuracy, len(records), estimated)
        if self.drift is not None:
            if self._pause is not None:
                self._pause()
            results, failed = self.drift.advance(self._pause)
            self._tally_verdicts(results)
            for layer, failure in failed.items():
                self._drift_off.add(layer)
                self._fault(
                    "drift tests",
                    layer,
                    failure,
                    "drift for that layer is off, statistics continue",
                )
            counts = self.drift.take_counts()
            sequential = self.drift.sequential_state()
            for alarm in self.drift.take_alarms():
                # An alarm is the paging event; on a lasting shift the restarted test alarms
                # again every few dozen samples, hence one line per detector a minute.
                self._log.warning(
                    f"alarm:{alarm.detector}",
                    "hookwatch: drift alarm on %r (level %s) of model %r: its anytime-valid "
                    "test's evidence reached e^%.1f after %d sampled requests",
                    alarm.detector,
                    alarm.level,
                    self.model_name,
                    alarm.log_evidence,
                    alarm.position,
                )
            with self._lock:
                self._pending.sequential = sequential
            if counts:
                with self._lock:
                    bins = self._pending.bins
                    for detector, tally in counts.items():
                        pending = bins.get(detector)
                        bins[detector] = tally if pending is None else pending + tally

    def take(self) -> Processed:
        """Everything processed since the last call; the next call starts from nothing."""
        with self._lock:
            taken, self._pending = self._pending, Processed()
        return taken

    @property
    def faults(self) -> dict[str, int]:
        """Faults so far per layer (cumulative)."""
        with self._lock:
            return dict(self._faults)

    def _reduce(
        self, layer: str, items: Sequence[PlainCapture]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None, list[int]]:
        """Statistics ``[N, 7]``, drift features ``[N, F]`` and rows per item, in item order.

        Raw copies of small activations are stacked and reduced together in numpy, a batch per
        sample shape; captures the hook already reduced only move to the host. Rows come back
        in the items' order, so they line up with other layers' rows of the same records.
        """
        width = self.widths.get(layer, self._max_features)
        raws = [c[RAW] for c in items]
        if all(type(t) is np.ndarray for t in raws):
            # The usual drain on the host: every item a raw copy of one sample shape, so one
            # batch in item order, with no grouping step per item. numpy checks the shapes
            # (a per-item check in Python cost more than the concatenation); mixed dtypes
            # are promoted to a common one, which the statistics do not mind.
            arrays = cast("list[np.ndarray[Any, Any]]", raws)
            try:
                x = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            except ValueError:
                pass  # sample shapes differ: grouped below
            else:
                rows, feats = self._reduce_array(layer, x, width)
                return rows, feats, [a.shape[0] for a in arrays]
        # (`None in raws` would compare arrays with ==.)
        elif all(t is None for t in raws):
            moved = _device_rows(items)
            if moved is not None:
                return moved
        elif all(t is not None for t in raws):
            # Device copies of one sample shape and dtype: one batch, one move to the host.
            held = cast("list[Held]", raws)
            kind, shape, dtype = type(held[0]), held[0].shape[1:], held[0].dtype
            if all(type(t) is kind and t.shape[1:] == shape and t.dtype == dtype for t in held):
                rows, feats = self._reduce_batch(layer, held, width)
                return rows, feats, [t.shape[0] for t in held]
        stats: list[np.ndarray[Any, Any] | None] = [None] * len(items)
        features: list[np.ndarray[Any, Any] | None] = [None] * len(items)
        groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
        for i, (_, c_stats, c_features, raw) in enumerate(items):
            if raw is not None:
                groups[(type(raw), tuple(raw.shape[1:]), raw.dtype)].append(i)
            else:
                if c_stats is not None:
                    stats[i] = as_array(c_stats)
                if c_features is not None:
                    features[i] = as_array(c_features)
        for members in groups.values():
            tensors = [t for t in (items[i][RAW] for i in members) if t is not None]
            rows, feats = self._reduce_batch(layer, tensors, width)
            if len(members) == len(items):
                # Every item in one batch, already in item order (the usual drain).
                return rows, feats, [t.shape[0] for t in tensors]
            cuts = np.cumsum([t.shape[0] for t in tensors])[:-1]
            for i, r, f in zip(members, np.split(rows, cuts), np.split(feats, cuts), strict=True):
                stats[i], features[i] = r, f
        kept = [s for s in stats if s is not None]
        sizes = [len(s) if s is not None else 0 for s in stats]
        have = [f for f in features if f is not None]
        # Features line up with the statistics only when every item has both (always, unless
        # a hook handed over statistics alone) and of one width: a flat layer narrower than
        # max_features whose width follows the request (a variable-length input without an
        # attention mask) has no fixed features to test; its statistics still count.
        widths = {f.shape[1] for f in have}
        joined = None
        if len(widths) > 1:
            self._no_fixed_width(layer, widths)
        elif have and len(have) == len(kept):
            joined = np.concatenate(have)
        return np.concatenate(kept) if len(kept) > 1 else kept[0], joined, sizes

    def _reduce_batch(
        self, layer: str, held: Sequence[Held], width: int
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Statistics and features of raw copies of one kind, sample shape and dtype, stacked."""
        first = held[0]
        if isinstance(first, np.ndarray):
            return self._reduce_array(
                layer, first if len(held) == 1 else np.concatenate(held), width
            )
        tensors = cast("list[torch.Tensor]", list(held))
        batch = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
        if batch.is_floating_point() and batch.dtype not in (torch.float32, torch.float64):
            batch = batch.float()  # half precision has no numpy twin on every build
        return self._reduce_array(layer, batch.cpu().numpy(), width)

    @staticmethod
    def _reduce_array(
        layer: str, x: np.ndarray[Any, Any], width: int
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        if x.dtype == np.float16:
            x = x.astype(np.float32)
        return reduce_rows(x), feature_rows(x, width, flatten=layer == INPUT_LAYER)

    def _process_layer(
        self,
        layer: str,
        count: int,
        records: IntArray,
        items: Sequence[PlainCapture],
        predicted: list[_Predictions],
        estimated: dict[str, _Rows] | None = None,
    ) -> None:
        stats, features, sizes = self._reduce(layer, items)
        if (
            estimated is not None
            and self.accuracy is not None
            and features is not None
            and layer in (OUTPUT_LAYER, self.accuracy.layer)
        ):
            estimated[layer] = _Rows(records, np.asarray(sizes, dtype=np.int64), features)
        nonfinite = (stats[:, NAN_COLUMN] != 0) | (stats[:, INF_COLUMN] != 0)
        finite = stats[~nonfinite] if nonfinite.any() else stats
        sums = finite[:, : len(SUMMARY_STATISTICS)].sum(axis=0, dtype=np.float64)
        if layer == OUTPUT_LAYER and self.classes is not None and features is not None:
            predicted.append(_Predictions.of(count, records, sizes, features, self.classes))
        units = self._units(layer, features, nonfinite)
        by_class = self._by_class(records, sizes, stats, nonfinite, predicted)
        with self._lock:
            tally = self._pending.layers[layer]
            tally.captures += len(stats)
            tally.nan += float(stats[:, NAN_COLUMN].sum())
            tally.inf += float(stats[:, INF_COLUMN].sum())
            tally.finite += len(finite)
            tally.sums += sums
            if units is not None:
                tally.add_units(*units)
            if by_class is not None:
                tally.add_classes(*by_class)
        if self.drift is not None and layer not in self._drift_off and features is not None:
            if self._pause is not None:
                self._pause()
            self._update_drift(layer, features)

    def _units(
        self,
        layer: str,
        features: np.ndarray[Any, Any] | None,
        nonfinite: np.ndarray[Any, np.dtype[np.bool_]],
    ) -> tuple[IntArray, IntArray | None] | None:
        """Per tracked unit of a hidden layer, its active and saturated finite samples."""
        count = self.units.get(layer, 0)
        if not count or features is None:
            return None
        x = features[~nonfinite] if nonfinite.any() else features
        # As many units as the layer has, up to max_units: the series follow the model.
        active = active_counts(x, count)
        reference = self._unit_refs.get(layer)
        if reference is None or reference.width != len(active):
            return active, None
        return active, reference.saturated_counts(x)

    def _by_class(
        self,
        records: IntArray,
        sizes: Sequence[int],
        stats: np.ndarray[Any, Any],
        nonfinite: np.ndarray[Any, np.dtype[np.bool_]],
        predicted: Sequence[_Predictions],
    ) -> tuple[np.ndarray[Any, np.dtype[np.float64]], IntArray] | None:
        """Sums of the per-class statistics and finite samples per class slot."""
        if self.classes is None or not predicted:
            return None
        slots = predicted[0].row_slots(records, np.asarray(sizes, dtype=np.int64), len(stats))
        keep = (slots >= 0) & ~nonfinite
        n = len(self.classes.labels)
        counts = np.bincount(slots[keep], minlength=n).astype(np.int64)
        sums: np.ndarray[Any, np.dtype[np.float64]] = np.stack(
            [np.bincount(slots[keep], weights=stats[keep, c], minlength=n) for c in CLASS_COLUMNS],
            axis=1,
        ).astype(np.float64)
        return sums, counts

    def _no_fixed_width(self, layer: str, widths: set[int]) -> None:
        """A layer's features changed width between samples: its drift tests end, visibly."""
        if self.drift is None or layer in self._drift_off:
            return
        self._drift_off.add(layer)
        error = ValueError(f"expected one feature width per sample, got {sorted(widths)}")
        self._fault("drift tests", layer, error, "drift for that layer is off, statistics continue")

    def _profile_width(self, layer: str) -> int | None:
        """Features per sample the profile's reference of ``layer`` was built from (a projected
        layer's input width), or None where that is not the captured width (a logits head's
        detectors are derived from it) or the profile has no reference of the layer."""
        assert self.drift is not None
        projection = self.drift.projections.get(layer)
        if projection is not None:
            return projection.input_width
        if layer == self.drift.output_layer and self.drift.head == "logits":
            return None
        ref = self.drift.references.get(layer)
        if ref is None or not ref.kept:
            return None
        return len(ref.kept) + len(ref.dropped)

    def _stale_profile(self, layer: str, width: int) -> bool:
        """A layer whose features are not as wide as its profile's reference (a profile built
        before sequence layers were read per hidden unit read a ``[B, T, H]`` layer's T steps):
        its drift tests end, visibly (a fault and one line), never scored on the wrong
        features."""
        expected = self._profile_width(layer)
        if expected is None or width == expected:
            return False
        self._drift_off.add(layer)
        error = ValueError(
            f"expected {expected} features per sample (the profile's), got {width} (as the "
            "hooks read the layer now; a profile built before sequence layers were read per "
            "hidden unit read them per step): a stale profile, rebuild the profile "
            "(`hookwatch archive` or `hookwatch profile`)"
        )
        self._fault("drift tests", layer, error, "drift for that layer is off, statistics continue")
        return True

    def _update_drift(self, layer: str, features: np.ndarray[Any, Any]) -> None:
        """Feed the layer's features to its drift windows; a failure ends drift for that layer."""
        assert self.drift is not None
        if self._stale_profile(layer, features.shape[1]):
            return
        try:
            # Non-finite samples are counted above; binning them would call them drift.
            if not np.isfinite(features).all():
                features = features[np.isfinite(features).all(axis=1)]
            if not len(features):
                return
            # While the drain defers (process), the verdicts come with DriftTracker.advance.
            self._tally_verdicts(self.drift.update(layer, features, self._pause))
        except Exception as error:
            self._drift_off.add(layer)
            self._fault(
                "drift tests", layer, error, "drift for that layer is off, statistics continue"
            )

    def _tally_verdicts(self, results: Sequence[DriftResult]) -> None:
        if not results:
            return
        assert self.drift is not None
        with self._lock:
            self._pending.first_alarms = self.drift.first_alarms
            drift = self._pending.drift
            for result in results:
                pending = drift.get(result.detector)
                if pending is None:
                    pending = drift[result.detector] = DriftTally(result)
                pending.latest = result
                pending.windows += 1
                pending.alarms += 1 if result.is_drift else 0

    def _update_accuracy(
        self, accuracy: AccuracyTracker, count: int, estimated: Mapping[str, _Rows]
    ) -> None:
        """Estimate the drain's samples that have both the harm layer's features and logits;
        a failure ends the estimate for this worker (counted on the harm layer, logged)."""
        try:
            hidden, output = estimated[accuracy.layer], estimated[OUTPUT_LAYER]
            rows, out_rows = _aligned(count, hidden, output)
            features = hidden.features[rows]
            logits = output.features[out_rows]
            # Non-finite rows are counted by the statistics; they have no estimate.
            finite = np.isfinite(features).all(axis=1) & np.isfinite(logits).all(axis=1)
            if not finite.all():
                features, logits = features[finite], logits[finite]
            if not len(features):
                return
            for alarm in accuracy.update(features, logits):
                self._log.warning(
                    "alarm:accuracy",
                    "hookwatch: accuracy-drop alarm on model %r: its estimated accuracy (%.3f "
                    "over the last %d sampled requests, reference %.3f) fell more than %.3f "
                    "below the reference's; evidence e^%.1f after %d sampled requests",
                    self.model_name,
                    accuracy.estimated_accuracy,
                    accuracy.window,
                    accuracy.reference_accuracy,
                    accuracy.max_drop,
                    alarm.log_evidence,
                    alarm.position,
                )
            tally = AccuracyTally(
                accuracy.estimated_accuracy,
                accuracy.correct_sum,
                accuracy.count,
                accuracy.outside_support,
                accuracy.alarms,
                accuracy.class_correct_sum,
                accuracy.class_count,
            )
            with self._lock:
                self._pending.accuracy = tally
        except Exception as error:
            self.accuracy = None
            with self._lock:
                self._pending.accuracy_off = True
            self._fault(
                "accuracy estimate",
                accuracy.layer,
                error,
                "the accuracy estimate is off in this worker, statistics and drift continue",
            )

    def _fault(self, what: str, layer: str, error: Exception, consequence: str) -> None:
        """Count a fault on ``layer`` and log it, rate-limited per kind."""
        with self._lock:
            self._faults[layer] += 1
        self._log.warning(
            f"{what}:{layer}",
            "hookwatch: %s on layer %r of model %r failed (%s: %s); %s, serving continues",
            what,
            layer,
            self.model_name,
            type(error).__name__,
            error,
            consequence,
        )


def _device_rows(
    items: Sequence[PlainCapture],
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[int]] | None:
    """A layer's reductions made on a device, moved to the host in one copy each for the
    statistics and the features (None: not all of them device tensors of one width).

    Item by item, each move is a copy and a wait for the device's stream: two per layer and
    record, where a GPU's hooks hand over a few dozen records a drain.
    """
    stats = [c[1] for c in items]
    features = [c[2] for c in items]
    if not all(type(t) is torch.Tensor for t in (*stats, *features)):
        return None
    tensors = cast("list[torch.Tensor]", stats)
    joined = cast("list[torch.Tensor]", features)
    device, width, dtype = tensors[0].device, joined[0].shape[1:], joined[0].dtype
    if device.type == "cpu" or not all(
        s.device == device and f.device == device and f.shape[1:] == width and f.dtype == dtype
        for s, f in zip(tensors, joined, strict=True)
    ):
        return None
    rows = torch.cat(tensors).cpu().numpy()
    feats = torch.cat(joined).cpu().numpy()
    return rows, feats, [t.shape[0] for t in tensors]


def _by_layer(records: Sequence[Record]) -> dict[str, tuple[IntArray, list[PlainCapture]]]:
    """Per layer, the indices of the records that captured it and their captures, in order.

    Every record of a drain usually holds the same layers in the same order: one list per
    layer then, instead of a tuple appended per record and layer.
    """
    if not records:
        return {}
    names = [tuple([c[0] for c in record]) for record in records]
    first = names[0]
    if all(n == first for n in names):
        everyone = np.arange(len(records), dtype=np.int64)
        return {
            layer: (everyone, [record[i] for record in records]) for i, layer in enumerate(first)
        }
    indices: dict[str, list[int]] = defaultdict(list)
    captures: dict[str, list[PlainCapture]] = defaultdict(list)
    for index, record in enumerate(records):
        for capture in record:
            indices[capture[0]].append(index)
            captures[capture[0]].append(capture)
    return {
        layer: (np.asarray(indices[layer], dtype=np.int64), captures[layer]) for layer in indices
    }


@dataclass(frozen=True)
class _Rows:
    """A layer's rows of a drain: the records they belong to, rows per record, features."""

    records: IntArray
    sizes: IntArray
    features: np.ndarray[Any, Any]


def _aligned(count: int, layer: _Rows, output: _Rows) -> tuple[IntArray, IntArray]:
    """Rows of ``layer`` and of ``output`` that belong to the same sample, in record order.

    A record whose output was not captured, or whose layer rows differ in number from its
    output rows (another leading dimension), contributes none.
    """
    if np.array_equal(layer.records, output.records) and np.array_equal(layer.sizes, output.sizes):
        everything: IntArray = np.arange(int(layer.sizes.sum()), dtype=np.int64)
        return everything, everything
    starts = np.zeros(count, dtype=np.int64)
    per_record = np.full(count, -1, dtype=np.int64)
    starts[output.records] = np.cumsum(output.sizes) - output.sizes
    per_record[output.records] = output.sizes
    match = per_record[layer.records] == layer.sizes
    m = layer.sizes[match]
    within = np.arange(int(m.sum()), dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
    layer_rows: IntArray = np.repeat((np.cumsum(layer.sizes) - layer.sizes)[match], m) + within
    output_rows: IntArray = np.repeat(starts[layer.records[match]], m) + within
    return layer_rows, output_rows


@dataclass(frozen=True)
class _Predictions:
    """The output's predicted class slot per row of a drain, and which rows are whose record.

    Computed once per drain over every output row at once; each layer then looks its rows'
    slots up with a few array operations instead of a Python step per record.
    """

    #: Per record of the drain, its first output row and its output rows (-1: no output).
    starts: IntArray
    sizes: IntArray
    #: Per output row, its class slot (-1: non-finite logits, no class).
    slots: IntArray

    @classmethod
    def of(
        cls,
        count: int,
        records: IntArray,
        sizes: Sequence[int],
        logits: np.ndarray[Any, Any],
        classes: ClassSlots,
    ) -> _Predictions:
        rows = np.asarray(sizes, dtype=np.int64)
        starts = np.zeros(count, dtype=np.int64)
        per_record = np.full(count, -1, dtype=np.int64)
        starts[records] = np.cumsum(rows) - rows
        per_record[records] = rows
        # A sample with non-finite logits has no predicted class (-1).
        # A binary classifier's one logit: class 1 where it is positive (class_logits).
        scores = class_logits(logits) if logits.shape[1] == 1 else logits
        predicted = np.where(np.isfinite(logits).all(axis=1), scores.argmax(axis=1), -1)
        slots: IntArray = np.where(predicted >= 0, classes.slots(predicted), -1)
        return cls(starts, per_record, slots)

    def row_slots(self, records: IntArray, sizes: IntArray, rows: int) -> IntArray:
        """Class slot of each of a layer's ``rows`` rows: ``sizes[i]`` rows of ``records[i]``.

        Rows of a record whose output was not captured, or whose batch differs from the
        output's (a layer with another leading dimension), have no class (-1).
        """
        if (
            len(records) == len(self.sizes)
            and rows == len(self.slots)
            and np.array_equal(sizes, self.sizes)
        ):
            # Every record of the drain, each with as many rows as its output (the usual
            # drain): the layer's rows are the output's, row for row. Read, not written.
            return self.slots
        slots = np.full(rows, -1, dtype=np.int64)
        match = self.sizes[records] == sizes
        if not match.any():
            return slots
        m = sizes[match]
        # Row j of the k-th matching record: its layer row and its output row.
        within = np.arange(int(m.sum()), dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
        layer_rows = np.repeat((np.cumsum(sizes) - sizes)[match], m) + within
        output_rows = np.repeat(self.starts[records[match]], m) + within
        slots[layer_rows] = self.slots[output_rows]
        return slots
