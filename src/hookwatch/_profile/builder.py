"""Building a drift profile: reference data through the serving hooks, binned and bounded.

The builder keeps a uniform reservoir of at most ``max_reference`` samples per layer and
forgets everything else, so any amount of reference data fits in bounded memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from hookwatch._config import MonitoringConfig
from hookwatch._drift import BinnedReference, DegenerateReference, Projection, derive
from hookwatch._drift.projection import SAMPLES_PER_COMPONENT, component_count
from hookwatch._errors import ConfigError, ProfileError
from hookwatch._hooks import (
    Capture,
    Gate,
    HookSet,
    WatchPlan,
    as_array,
    plan_watch,
    read_padded,
    select_tensor,
)
from hookwatch._names import INPUT_LAYER, OUTPUT_LAYER, STATISTICS, level_of, unit_layers
from hookwatch._padding import Padded
from hookwatch._profile.format import DriftProfile
from hookwatch._stats import INF_COLUMN, NAN_COLUMN
from hookwatch._views import UnitReference

__all__ = [
    "PADDING_READ",
    "STEPS_WIDE",
    "build_profile",
    "capture_features",
    "padding_readers",
    "profile_for",
    "refuse_nonfinite",
]

log = logging.getLogger("hookwatch")

#: A batch of reference inputs: the model's input tensor, keyword arguments to call it with,
#: or a padded batch of a variable length.
Batch = torch.Tensor | Mapping[str, Any] | Padded


class _Collector:
    """A capture sink that keeps features in process (profile building only, never serving).

    It also sums every layer's per-sample statistics, for the reference values that alert
    thresholds compare production with.
    """

    def __init__(self) -> None:
        #: This forward's capture per layer: a module called twice keeps its last call, as
        #: serving does.
        self.current: dict[str, Capture] = {}
        self.faults: list[tuple[str, BaseException]] = []
        self.stat_sums: dict[str, NDArray[np.float64]] = {}
        self.stat_counts: dict[str, NDArray[np.float64]] = {}
        #: The model's output was per-position logits ``[B, T, C]`` (a ``logits`` head).
        self.positions = False

    def offer(self, capture: Capture) -> bool:
        self.current[capture.layer] = capture
        return True

    def commit(self) -> dict[str, NDArray[np.float32]]:
        """The forward's features per layer; its statistics are added to the sums."""
        features = {}
        for layer, capture in self.current.items():
            if capture.features is not None:
                features[layer] = as_array(capture.features)
            if capture.stats is not None:
                self._add_statistics(layer, as_array(capture.stats).astype(np.float64))
        self.current = {}
        return features

    def _add_statistics(self, layer: str, rows: NDArray[np.float64]) -> None:
        # The summaries average finite samples only, as serving exports them; the non-finite
        # counts average over every sample.
        finite: NDArray[np.bool_] = (rows[:, NAN_COLUMN] == 0) & (rows[:, INF_COLUMN] == 0)
        sums = np.where(finite[:, None], rows, 0.0).sum(axis=0)
        sums[NAN_COLUMN:] = rows[:, NAN_COLUMN:].sum(axis=0)
        counts = np.full(len(STATISTICS), float(finite.sum()))
        counts[NAN_COLUMN:] = len(rows)
        self.stat_sums[layer] = self.stat_sums.get(layer, 0.0) + sums
        self.stat_counts[layer] = self.stat_counts.get(layer, 0.0) + counts

    def statistics(self) -> dict[str, tuple[float, ...]]:
        return {
            layer: tuple(float(v) for v in sums / np.maximum(self.stat_counts[layer], 1.0))
            for layer, sums in self.stat_sums.items()
        }

    def on_fault(self, layer: str, error: BaseException) -> None:
        self.faults.append((layer, error))


_CONDITIONAL = (
    "the layer did not run on every reference batch (a module on a conditional path); its "
    "statistics are watched, its drift is not"
)
_ROUTED = (
    "the layer gave {rows} rows for a reference batch of {batch} samples (an expert given the "
    "rows routed to it, or a tensor not batch-first): its rows are not the samples', so its "
    "statistics are watched, its drift is not"
)


#: Why a layer's drift detector is left out when it has a value a step (``[batch, steps]``
#: of a length each request chooses): its features' count follows the batch's longest.
STEPS_WIDE = (
    "it has a value a step ([batch, steps]): its features' count follows the length of the "
    "batch's longest sample, so its statistics are watched, its drift is not"
)

#: Why a layer's drift detector is left out when its features of a sample depend on the
#: padding of the batch the sample came in (:func:`padding_readers`).
PADDING_READ = (
    "its features of a sample change when the sample is padded beside a longer one (it "
    "reads the padding, so they would depend on the batch a request comes in): its statistics "
    "are watched, its drift is not"
)


def padding_readers(model: nn.Module, plan: WatchPlan, batch: Padded) -> dict[str, str]:
    """The watched layers (and the output) whose features of a sample differ alone and padded
    beside a longer one (:meth:`Padded.probe`), each with :data:`PADDING_READ`.

    The hooks leave padding out where they can name it (a step activation ``[batch, steps,
    ...]`` of a sample's first dimension); a convolution's ``[batch, channels, time']`` or a
    layer after a pooling over the padded steps cannot be, and its features of a request
    would move with the length of the batch's longest: drift from batch composition."""
    probe = batch.probe()
    if probe is None:
        return {}
    try:
        alone, together = (
            next(iter(capture_features(model, plan, [part], _Collector()))) for part in probe
        )
    except Exception as error:
        # The probe's sample cut to half its length may be one the model refuses (too short
        # for its convolutions): the reference itself decides what is profiled, not the probe.
        log.warning(
            "hookwatch: model %r: could not try a sample alone and padded (%s: %s); every "
            "layer is profiled as if it left the padding out",
            plan.model_name,
            type(error).__name__,
            str(error).splitlines()[0][:200] if str(error) else "",
        )
        return {}
    readers: dict[str, str] = {}
    for layer, rows in alone.items():
        padded = together.get(layer)
        if padded is None or len(padded) != 2 or len(rows) != 1:
            continue  # not a row per sample: left out for that already
        if rows.shape[1:] != padded.shape[1:]:
            readers[layer] = STEPS_WIDE
            continue
        scale = max(1.0, float(np.nanmax(np.abs(rows[0]), initial=0.0)))
        if not np.allclose(rows[0], padded[0], rtol=1e-3, atol=1e-4 * scale, equal_nan=True):
            readers[layer] = PADDING_READ
    return readers


class _Reservoir:
    """A uniform sample of at most ``size`` rows, aligned across layers (Vitter's algorithm R)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.rows: dict[str, NDArray[np.float32]] = {}
        self.seen = 0
        #: Layers whose rows are not aligned with the others', and why: missing from some
        #: batch with rows (a module on a conditional path: some slots were never written), or
        #: with another row count than the batch (an expert given the rows routed to it).
        self.partial: dict[str, str] = {}
        self._rng = np.random.default_rng(seed)

    def add(self, batch: Mapping[str, NDArray[np.float32]]) -> None:
        sizes = {len(x) for x in batch.values()}
        if not sizes or sizes == {0}:
            return  # an empty reference batch: nothing to add
        # The batch's samples: the input's or the output's row count where one is watched,
        # else the layers' most common; a layer with another count ran on some samples
        # only, or is not batch-first.
        known = [batch[k] for k in (INPUT_LAYER, OUTPUT_LAYER) if k in batch]
        counts = [len(x) for x in batch.values()]
        n = len(known[0]) if known else max(set(counts), key=counts.count)
        batch = dict(batch)
        for layer, x in list(batch.items()):
            if len(x) != n:
                self.partial.setdefault(layer, _ROUTED.format(rows=len(x), batch=n))
                del batch[layer]
            elif layer not in self.rows:
                if self.seen:
                    self.partial.setdefault(layer, _CONDITIONAL)  # not on an earlier batch
                self.rows[layer] = np.empty((self.size, x.shape[1]), dtype=np.float32)
            elif x.shape[1:] != self.rows[layer].shape[1:]:
                # Another width than an earlier batch's: a value a step, padded to each
                # batch's longest.
                self.partial.setdefault(layer, STEPS_WIDE)
                del batch[layer]
        for layer in self.rows:
            if layer not in batch:
                self.partial.setdefault(layer, _CONDITIONAL)
        for i in range(n):
            t = self.seen + i
            slot = t if t < self.size else int(self._rng.integers(0, t + 1))
            if slot < self.size:
                for layer, x in batch.items():
                    self.rows[layer][slot] = x[i]
        self.seen += n

    def take(self) -> dict[str, NDArray[np.float32]]:
        kept = min(self.seen, self.size)
        return {layer: rows[:kept] for layer, rows in self.rows.items()}


def build_widths(config: MonitoringConfig) -> dict[str, int]:
    """Features per sample the builder captures of each layer that may need more than
    ``max_features``: with ``drift.projection: pca`` every layer (a wide one is projected),
    and always the logits (softmax, confidence and entropy need every class)."""
    pca = config.drift.projection == "pca"
    widths = {
        layer: config.drift.projection_width
        for layer in config.watched
        if pca and _projectable(config, layer)
    }
    if config.output.head == "logits":
        widths[OUTPUT_LAYER] = config.drift.projection_width
    return widths


def capture_features(
    model: nn.Module,
    config: MonitoringConfig | WatchPlan,
    batches: Iterable[Batch],
    collector: _Collector | None = None,
) -> Iterable[dict[str, NDArray[np.float32]]]:
    """Yield, per batch, the features the serving hooks capture for every watched layer.

    A batch is the model's input tensor, or a mapping of keyword arguments to call it with.
    ``config`` is a plan made for ``model`` (:func:`~hookwatch._hooks.plan_watch`) or a config,
    then planned here.
    """
    plan = config if isinstance(config, WatchPlan) else plan_watch(model, config)
    plan.check(model)
    collector = collector if collector is not None else _Collector()
    gate = Gate()
    hooks = HookSet(gate, collector, plan.config.max_features)
    # Profiled in eval mode, as served; each module's own mode is given back afterwards (a
    # model profiled between training steps keeps training, frozen parts stay frozen).
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    with contextlib.ExitStack() as restore:
        restore.callback(_set_modes, modes)
        yield from _captured(model, plan.config, batches, collector, gate, hooks)


def _set_modes(modes: list[tuple[nn.Module, bool]]) -> None:
    for module, mode in modes:
        module.training = mode  # this module only: each has its own entry


def _captured(
    model: nn.Module,
    config: MonitoringConfig,
    batches: Iterable[Batch],
    collector: _Collector,
    gate: Gate,
    hooks: HookSet,
) -> Iterable[dict[str, NDArray[np.float32]]]:
    with hooks.attach(
        model,
        config.layers,
        config.capture_input,
        config.capture_output,
        widths=build_widths(config),
        output_select=config.output.select,
        mask=config.mask,
        output_head=config.output.head,
        output_probabilities=config.output.probabilities,
        output_items=config.output.items,
        output_steps=config.output.steps,
    ):
        for batch in batches:
            # The batch's rows, as serving's gate has them: the hooks learn from them which
            # dimension of a layer is the batch's (a sequence-first layer's is the second).
            gate.set(True, None, _rows(batch))
            try:
                with torch.inference_mode():
                    if isinstance(batch, Padded):
                        # As served: the steps' mask leaves padding out (ModelService.infer).
                        read_padded(gate, batch)
                        output = batch.call(model)
                    else:
                        output = model(**batch) if isinstance(batch, Mapping) else model(batch)
                if config.capture_output and config.output.head == "logits":
                    logits = select_tensor(output, config.output.select)
                    if logits is not None and not logits.is_floating_point():
                        # Integers are answers already (class ids), not scores: one a sample
                        # would otherwise read as a binary classifier's logit.
                        raise ConfigError(
                            "monitoring.output.head: expected logits (floating point) for head "
                            f"'logits', got {str(logits.dtype).removeprefix('torch.')} values "
                            "(class ids?); set output.head to 'values' or 'none'"
                        )
                    # Per position: [B, T, C], or a class map [B, C, *spatial] (per pixel).
                    collector.positions = logits is not None and logits.dim() >= 3
            finally:
                gate.set(False)
            if collector.faults:
                layer, error = collector.faults[0]
                if isinstance(error, ConfigError):
                    raise error  # the config does not fit the model
                raise RuntimeError(f"capturing layer {layer!r} failed: {error!r}")
            yield collector.commit()


def _rows(batch: Batch) -> int:
    """The batch's size: its first dimension, or a keyword argument's (0: not known)."""
    values = _tensors(batch)
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim():
            return int(value.shape[0])
    return 0


def build_profile(
    model: nn.Module,
    config: MonitoringConfig | Mapping[str, Any] | None,
    batches: Iterable[Batch],
    model_name: str = "model",
    bins: int | None = None,
    max_reference: int = 20_000,
    max_codes: int = 4096,
    aggregation: str = "mean",
    progress: bool = False,
    total: int | None = None,
    seed: int = 0,
    labels: Any = None,
) -> DriftProfile:
    """Run reference ``batches`` through ``model`` with the serving hooks and bin what they
    capture: the profile :func:`hookwatch.watch` tests drift against.

    ``labels``, the reference's true classes (one integer per sample, in the batches' order;
    ``logits`` heads), add the accuracy estimate without labels: the served model then pages
    on harm rather than on drift (docs/drift.md, "Harm pages, drift warns"). The batches are
    then read twice.

    The reference should be data the model was not fitted on (held-out data, or a sample of
    known-good traffic): training data describes an over-confident model. At most
    ``max_reference`` samples are kept (a uniform reservoir), whatever the amount of data;
    ``bins`` defaults to ``config.drift.bins``. ``progress`` shows a bar where tqdm is installed::

        profile = hookwatch.build_profile(model, {"layers": ["act"]}, held_out, "tabular")
    """
    # 1. What is watched, resolved against the model once; then the steps of profile_for.
    plan = plan_watch(model, config, model_name)
    if labels is not None:
        batches = list(batches)  # once for the profile, once for the accuracy estimator
    profile = profile_for(
        model,
        plan,
        _with_progress(batches, progress, total),
        bins,
        max_reference,
        max_codes,
        aggregation,
        seed,
    )
    if labels is None:
        return profile
    from hookwatch._profile.accuracy import with_accuracy

    return with_accuracy(profile, model, plan.config, batches, labels, seed)


def profile_for(
    model: nn.Module,
    plan: WatchPlan,
    batches: Iterable[Batch],
    bins: int | None = None,
    max_reference: int = 20_000,
    max_codes: int = 4096,
    aggregation: str = "mean",
    seed: int = 0,
) -> DriftProfile:
    """:func:`build_profile` for a model planned already (``hookwatch archive`` checks the
    plan before it profiles): the same steps after the first, nothing resolved again."""
    plan.check(model)
    bins = plan.config.drift.bins if bins is None else bins
    # 2. The reference through the serving hooks: a uniform sample of its features per layer.
    reference = _collect_reference(model, plan, batches, max_reference, seed)
    # 3. Each detector fitted on it: projections of wide layers, bins, the calibration rows.
    fitted = _fit_detectors(plan, reference, bins, max_codes, aggregation, seed)
    # 4. The profile, refused unless it bins its own reference as built once stored.
    return _assemble_profile(plan, reference, fitted, bins)


@dataclasses.dataclass(frozen=True)
class _Reference:
    """The reference as the serving hooks captured it (:func:`_collect_reference`)."""

    #: Per layer that ran on every reference batch, its sampled rows, aligned across layers.
    rows: dict[str, NDArray[np.float32]]
    #: Reference samples seen, and kept (at most ``max_reference``).
    seen: int
    kept: int
    #: Every layer's reference statistics (the values alert thresholds compare with).
    statistics: dict[str, tuple[float, ...]]
    #: The output was per-position logits ``[B, T, C]``.
    positions: bool
    #: Watched layers without aligned rows, and why (see ``_Reservoir.partial``).
    partial: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Fitted:
    """The detectors fitted on the reference (:func:`_fit_detectors`)."""

    references: dict[str, BinnedReference]
    projections: dict[str, Projection]
    #: Detectors left out, and why.
    left_out: dict[str, str]
    #: The calibration sample: reference rows every detector keeps codes for.
    pick: NDArray[Any]


def _with_progress(batches: Iterable[Batch], progress: bool, total: int | None) -> Iterable[Batch]:
    if progress:
        try:
            from tqdm import tqdm
        except ImportError:  # a progress bar is a nicety of the tools extra
            pass
        else:
            shown: Iterable[Batch] = tqdm(batches, total=total, unit="batch", desc="profile")
            return shown
    return batches


def _collect_reference(
    model: nn.Module,
    plan: WatchPlan,
    batches: Iterable[Batch],
    max_reference: int,
    seed: int,
) -> _Reference:
    """Step 2: ``batches`` through the serving hooks into a reservoir of ``max_reference``."""
    collector = _Collector()
    reservoir = _Reservoir(max_reference, seed)
    finite = iter(_finite(batches))
    first = next(finite, None)
    if isinstance(first, Padded) and len(first.lengths) > 1:
        # Batches padded as a worker pads them: a layer reading the padding is left out.
        reservoir.partial.update(padding_readers(model, plan, first))
    ahead = [] if first is None else [first]
    for features in capture_features(model, plan, itertools.chain(ahead, finite), collector):
        reservoir.add(features)
    kept = min(reservoir.seen, max_reference)
    if kept < 2:
        raise ProfileError(f"expected at least 2 reference samples, got {kept}")
    return _Reference(
        # Only layers that ran on every reference batch: the others' rows are not aligned.
        rows={k: v for k, v in reservoir.take().items() if k not in reservoir.partial},
        seen=reservoir.seen,
        kept=kept,
        statistics=collector.statistics(),
        positions=collector.positions,
        partial=dict(reservoir.partial),
    )


def _finite(
    batches: Iterable[Batch],
) -> Iterable[Batch]:
    """``batches`` while every input value is finite; a NaN or Inf refuses the reference.

    Binned, a NaN sorts past every quantile edge and its features read as constant, so a
    poisoned reference would archive with its detectors left out for a false reason. From
    the first bad batch on, the rest are only counted (not run), for the one-line error.
    """
    bad = total = 0
    first = -1
    for batch in batches:
        rows, nonfinite = _nonfinite_rows(batch)
        if nonfinite.any() and first < 0:
            first = total + int(nonfinite.nonzero()[0, 0])
        if first < 0:
            yield batch
        bad += int(nonfinite.sum())
        total += rows
    if bad:
        raise _nonfinite(bad, total, first)


def refuse_nonfinite(batch: Batch) -> None:
    """Raise :class:`ProfileError` when a batch of reference inputs holds NaN or Infinity:
    the check :func:`build_profile` makes, for a caller that would cast them away first."""
    rows, nonfinite = _nonfinite_rows(batch)
    if nonfinite.any():
        raise _nonfinite(int(nonfinite.sum()), rows, int(nonfinite.nonzero()[0, 0]))


def _nonfinite(bad: int, total: int, first: int) -> ProfileError:
    return ProfileError(
        f"reference: expected finite values, got NaN or Infinity in {bad} of {total} "
        f"samples (the first: sample {first})"
    )


def _tensors(batch: Batch) -> list[Any]:
    """The values a batch gives the model (a padded batch's padding is ``pad_value``)."""
    if isinstance(batch, Padded):
        return list(batch.arguments().values()) if batch.field is not None else [batch.values]
    return list(batch.values()) if isinstance(batch, Mapping) else [batch]


def _nonfinite_rows(batch: Batch) -> tuple[int, torch.Tensor]:
    """A batch's samples, and per sample whether any of its input values is NaN or Inf."""
    values = _tensors(batch)
    sized = any(isinstance(value, torch.Tensor) and value.dim() for value in values)
    # A batch of no known size (a scalar input) is one sample; an empty batch, none.
    rows = _rows(batch) if sized else 1
    nonfinite = torch.zeros(rows, dtype=torch.bool)
    for value in values:
        if not (
            isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())
        ):
            continue  # integers and booleans are always finite
        finite = torch.isfinite(value.detach())
        if value.dim() and value.shape[0] == rows and rows:
            nonfinite |= ~finite.reshape(rows, -1).all(dim=1).cpu()
        elif not bool(finite.all()):
            nonfinite[:] = True  # not per sample: every sample of the batch sees it
    return rows, nonfinite


def _fit_detectors(
    plan: WatchPlan,
    reference: _Reference,
    bins: int,
    max_codes: int,
    aggregation: str,
    seed: int,
) -> _Fitted:
    """Step 3: per watched layer, its projection when wide, then its detectors' bins."""
    config, n = plan.config, reference.kept
    split = _projection_split(plan, reference, seed)
    # The calibration rows come from the held-out half when a layer is projected: its codes
    # there are the only ones that are not fitted to their own rows.
    pool = np.arange(n) if split is None else split[1]
    codes_rng = np.random.default_rng(seed + 1)
    pick = np.sort(codes_rng.choice(pool, size=min(len(pool), max_codes), replace=False))
    classes = _class_count(plan, reference)
    fitted = _Fitted({}, {}, {}, pick)
    for layer in config.watched:
        if layer not in reference.rows:
            # Its rows are not every reference sample's: bins and a calibration built from
            # them would describe other data than the detector would be tested on. (An
            # output under head none has no detector to leave out.)
            if layer != OUTPUT_LAYER or config.output.head != "none":
                _leave_out(fitted, plan, layer, reference.partial.get(layer, _CONDITIONAL))
            continue
        head, positions = config.output.head, reference.positions
        rows = reference.rows[layer]
        bad = int((~np.isfinite(rows).all(axis=1)).sum())
        if bad:
            # The model's own NaN or Inf, on a finite reference: bins (and a projection) fitted
            # on them would be meaningless, and binning alone would call them constant. Zeros
            # in their place give the detectors' names only.
            blank = np.zeros((1, rows.shape[1]))
            for name in derive(layer, blank, OUTPUT_LAYER, head, positions):
                _leave_out(
                    fitted,
                    plan,
                    name,
                    f"the model gave NaN or Infinity in its features on {bad} of the {n} "
                    "reference samples; its statistics are watched (nan_count, inf_count), its "
                    "drift is not",
                )
            continue
        values = _project(plan, layer, rows, split, fitted.projections)
        held = split[1] if split is not None and layer in fitted.projections else None
        for name, x in derive(layer, values, OUTPUT_LAYER, head, positions).items():
            if name != layer and name in config.watched:
                raise ValueError(f"expected no watched layer named like detector {name!r}")
            try:
                if held is None:
                    ref = _bin(name, x, config, classes, bins, n, aggregation)
                else:
                    # Binned on the rows its projection was not fitted on: what the layer's
                    # traffic will look like through it.
                    ref = _bin(name, x[held], config, classes, bins, len(held), aggregation)
                    ref = dataclasses.replace(ref, codes=ref.encode(x))
            except DegenerateReference as error:
                # A dead layer, or a softmax at exactly 1.0: nothing to test. Leave it out
                # and say so, rather than serve a detector that can never move (or crash).
                _leave_out(fitted, plan, name, str(error))
                continue
            # Aligned calibration sample: the same reference rows for every detector.
            fitted.references[name] = dataclasses.replace(ref, codes=ref.codes[pick])
    return fitted


def _projectable(config: MonitoringConfig, layer: str) -> bool:
    """Whether ``layer`` is projected when wide: not the logits (their softmax and the
    predictions need every logit)."""
    return layer != OUTPUT_LAYER or config.output.head in ("values", "multilabel", "embedding")


def _projected(plan: WatchPlan, layer: str, width: int) -> bool:
    """Whether a layer of ``width`` features is projected (:func:`_project`)."""
    return _projectable(plan.config, layer) and width > plan.config.max_features


def _projection_split(
    plan: WatchPlan, reference: _Reference, seed: int
) -> tuple[NDArray[np.intp], NDArray[np.intp]] | None:
    """The reference rows a projection is fitted on, and the rows it is binned and
    calibrated on; None when no layer is projected (every row does both, as before).

    A projection fitted on the rows it is then binned on describes those rows, not the data:
    they spread more along its components and lie closer to their subspace than any other
    rows of the same distribution will. Binned on them, clean traffic fills the middle bins of
    each component and the top bin of the distance, and alarms on every window (measured on
    800 features of noise from 400 reference samples: 11 of 11 clean windows). Fitted on one
    half and binned on the other, both halves' and the traffic's rows are new to it alike."""
    n = reference.kept
    wide = any(_projected(plan, layer, rows.shape[1]) for layer, rows in reference.rows.items())
    if not wide or n < 4:
        return None
    order = np.random.default_rng(seed + 2).permutation(n)
    fit, held = np.sort(order[: n // 2]), np.sort(order[n // 2 :])
    return fit, held


def _class_count(plan: WatchPlan, reference: _Reference) -> int:
    """The output's classes (0 without a captured output); a ``logits`` head needs two, or
    one logit a sample (a binary classifier's, read as two classes: ``class_logits``)."""
    logits = reference.rows.get(OUTPUT_LAYER)
    # Per-position logits' features are the C class shares and two means (position_summary).
    classes = 0 if logits is None else logits.shape[1] - (2 if reference.positions else 0)
    if plan.config.output.head != "logits" or logits is None:
        return classes
    if classes == 1 and not reference.positions:
        return 2
    if classes < 2:
        raise ConfigError(
            "monitoring.output.head: expected the model's output to be logits [batch, classes] "
            "with at least 2 classes, or one binary logit a sample, for head 'logits', got "
            f"{classes} value per position; set output.head to 'values' or 'none'"
        )
    return classes


def _leave_out(fitted: _Fitted, plan: WatchPlan, detector: str, reason: str) -> None:
    fitted.left_out[detector] = reason
    log.warning(
        "hookwatch: drift detector %r of model %r is left out: %s",
        detector,
        plan.model_name,
        reason,
    )


def _project(
    plan: WatchPlan,
    layer: str,
    values: NDArray[Any],
    split: tuple[NDArray[np.intp], NDArray[np.intp]] | None,
    projections: dict[str, Projection],
) -> NDArray[Any]:
    """A layer's features as its detector tests them: a layer wider than ``max_features``
    (not the logits: their softmax and the predictions need every logit) is projected on its
    principal components, fitted on the first half of ``split`` (:func:`_projection_split`;
    every row of a reference too small to split), their count sized from the whole
    reference."""
    config = plan.config
    if not _projected(plan, layer, values.shape[1]):
        return values
    fit = np.arange(values.shape[0]) if split is None else split[0]
    # Sized from the whole reference, as before the split: held-out bins keep the calibration
    # whatever the count, and on the evaluation's wide layers the count the half would give
    # (7 of 64 pixels, from 189 images) saw less than this one (docs/drift.md).
    n = values.shape[0]
    requested = config.drift.components
    components = component_count(n, config.max_features, requested)
    projection = projections[layer] = Projection.fit(layer, values[fit], components + 1)
    kept = projection.components.shape[1]
    log.info(
        "hookwatch: layer %r has %d features%s; drift tests %d principal components "
        "(%s; %.1f %% of the reference variance)%s, %s",
        layer,
        projection.input_width,
        # The hooks capture at most this many (a wider layer's first ones): the layer's own
        # width is not known here.
        " (drift.projection_width: a wider layer's first ones)"
        if projection.input_width == config.drift.projection_width
        else "",
        kept,
        f"drift.components: {requested}"
        if requested is not None
        else f"sized from the reference: one per {SAMPLES_PER_COMPONENT} of its {n} samples, "
        f"at most max_features - 1 = {config.max_features - 1}",
        100 * projection.explained,
        " and the residual distance" if projection.residual else "",
        f"fitted on {len(fit)} reference samples and binned on the other {len(split[1])}"
        if split is not None
        else f"fitted and binned on all {n} reference samples (too few to hold half out)",
    )
    if requested is not None and kept * SAMPLES_PER_COMPONENT > n:
        # Only an explicit count asks for more than the reference supports: a sized one
        # keeps SAMPLES_PER_COMPONENT samples per component (or keeps one component, of a
        # reference too small for any).
        log.warning(
            "hookwatch: layer %r is projected to %d components (drift.components) from %d "
            "reference samples; components fitted on fewer than %d samples each follow the "
            "reference's noise and see less of a shift: lower drift.components (null sizes "
            "it from the reference) or add reference data",
            layer,
            kept,
            n,
            SAMPLES_PER_COMPONENT,
        )
    return projection.apply(values)


def _bin(
    name: str,
    x: NDArray[Any],
    config: MonitoringConfig,
    classes: int,
    bins: int,
    n: int,
    aggregation: str,
) -> BinnedReference:
    """One detector's reference bins (raises :class:`DegenerateReference`)."""
    if name == "class_mix":
        return BinnedReference.categorical(name, level_of(name), x[:, 0], classes, n)
    if name == "output" and config.output.head == "logits" and x.shape[1] > config.max_features:
        return _top_classes(x, config.max_features, bins, n, aggregation)
    return BinnedReference.fit(name, level_of(name), x, bins, max_codes=n, aggregation=aggregation)


def _assemble_profile(
    plan: WatchPlan, reference: _Reference, fitted: _Fitted, bins: int
) -> DriftProfile:
    """Step 4: the profile of the fitted detectors, checked against its stored form."""
    config = plan.config
    profile = DriftProfile(
        model=plan.model_name,
        references=fitted.references,
        layers=tuple(config.watched),
        n_seen=reference.seen,
        bins=bins,
        max_features=config.max_features,
        created=time.time(),
        projections=fitted.projections,
        head=config.output.head,
        positions=reference.positions,
        statistics=reference.statistics,
        left_out=fitted.left_out,
        units={
            layer: UnitReference.fit(layer, reference.rows[layer], config.max_units)
            for layer in unit_layers(config.watched)
            if config.max_units and layer in reference.rows
        },
    )
    verify_stored(profile, reference.rows, fitted.pick)
    return profile


def verify_stored(
    profile: DriftProfile, rows: Mapping[str, NDArray[Any]], pick: NDArray[Any]
) -> None:
    """Refuse a profile that, once written and read back, bins its own reference differently.

    ``rows`` are the captured reference features per layer, ``pick`` the calibration samples
    among them. They go through what a worker applies, from the stored file (projection,
    derived detectors, bin edges), in the same batch as when the profile was built; the codes
    must be the ones the counts and the calibration were made from. Edges stored at a lower
    precision than they were fitted in failed exactly this way (profile format 2).
    """
    with tempfile.TemporaryDirectory() as tmp:
        stored = DriftProfile.load(profile.save(Path(tmp) / "profile.npz"))
    for layer in profile.layers:
        if layer not in rows:
            continue  # left out: its rows are not every reference sample's
        values: NDArray[Any] = rows[layer]
        projection = stored.projections.get(layer)
        if projection is not None:
            values = projection.apply(values)
        for name, x in derive(layer, values, OUTPUT_LAYER, stored.head, stored.positions).items():
            if name not in stored.references:
                continue
            codes = stored.references[name].encode(x)[pick]
            moved = float((codes != profile.references[name].codes).any(axis=1).mean())
            if moved > 0:
                raise ProfileError(
                    f"detector {name!r}: expected the stored profile to bin its reference as "
                    f"built, got {moved:.1%} of the reference samples in other bins; refusing "
                    "to write a profile whose scores would be wrong"
                )


def _top_classes(
    probabilities: NDArray[Any], budget: int, bins: int, n: int, aggregation: str
) -> BinnedReference:
    """The per-class softmax detector of a model with more classes than ``budget``: the
    ``budget`` classes with the most reference probability mass, binned like any features
    (the rest hold little mass each; confidence, entropy and the class mix still see them)."""
    top = np.sort(np.argsort(probabilities.mean(axis=0), kind="stable")[::-1][:budget])
    ref = BinnedReference.fit(
        "output",
        level_of("output"),
        probabilities[:, top],
        bins,
        max_codes=n,
        aggregation=aggregation,
    )
    return dataclasses.replace(
        ref,
        kept=tuple(int(top[k]) for k in ref.kept),
        dropped=tuple(int(top[k]) for k in ref.dropped),
    )
