"""Streaming drift tests: sliding windows of bin codes and a verdict every ``step`` samples."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hookwatch._drift.accuracy import AccuracyTracker
from hookwatch._drift.bins import (
    BinnedReference,
    ChiSquare,
    CodeArray,
    FloatArray,
    IntArray,
    aggregate,
    bin_counts,
    expect,
)
from hookwatch._drift.calibration import Calibration
from hookwatch._drift.features import derive
from hookwatch._drift.projection import Projection
from hookwatch._drift.sequential import SequentialAlarm, SequentialGroup, SequentialTest
from hookwatch._names import OUTPUT_LAYER
from hookwatch._views import UnitReference

__all__ = [
    "COMPACT_LEVELS",
    "MAX_PENDING_ALARMS",
    "DriftResult",
    "DriftTracker",
    "SlidingWindow",
    "compact_features",
]

#: Sequential alarms a tracker holds until they are taken; later ones are still counted by
#: their test (``sequential_state``), just not listed.
MAX_PENDING_ALARMS = 256
#: Levels whose detectors join the fleet's per-bin counts on a compact feature set (see
#: :func:`compact_features`); the output's detectors keep every feature.
COMPACT_LEVELS = ("input", "activation")


def compact_features(n_features: int, budget: int) -> NDArray[np.intp]:
    """The features of a detector counted for the fleet: all of them when there are at most
    ``budget``, else the first ``budget - 1`` and the last. For a projected layer these are its
    leading principal components and the distance from them (the residual, always last)."""
    expect(budget >= 1, "a fleet feature budget of at least 1", budget)
    if n_features <= budget:
        return np.arange(n_features, dtype=np.intp)
    return np.concatenate(
        [np.arange(budget - 1, dtype=np.intp), np.asarray([n_features - 1], dtype=np.intp)]
    )


@dataclass(frozen=True)
class DriftResult:
    """One detector's verdict on one window; ``as_dict`` mirrors alibi-detect's ``predict``."""

    detector: str
    level: str
    is_drift: bool
    score: float
    threshold: float
    window: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "meta": {"name": self.detector, "detector_type": "drift", "level": self.level},
            "data": {
                "is_drift": int(self.is_drift),
                "distance": self.score,
                "threshold": self.threshold,
                "window": self.window,
            },
        }


class SlidingWindow:
    """The last ``size`` samples' bin codes: O(size * F) bytes, no raw values.

    Pushing only writes codes into a ring; :attr:`counts` bins the ring when a verdict asks for
    it, which happens once per ``step`` samples, not once per push.
    """

    def __init__(self, size: int, features: int, bins: int) -> None:
        expect(size >= 1, "a window of at least 1", size)
        self.size = size
        self.bins = bins
        self._codes = np.zeros((size, features), dtype=np.uint8)
        # Index arithmetic built once: the capture thread pushes many small chunks.
        self._offsets = np.arange(features, dtype=np.int64) * bins
        self._positions = np.arange(size, dtype=np.int64)
        self._next = 0
        self.filled = 0
        self.seen = 0

    def push(self, codes: CodeArray) -> None:
        seen = len(codes)
        codes = codes[-self.size :]
        n = len(codes)
        end = self._next + n
        if end <= self.size:
            self._codes[self._next : end] = codes
        else:
            self._codes[(self._next + self._positions[:n]) % self.size] = codes
        self._next = end % self.size
        self.filled = min(self.size, self.filled + n)
        self.seen += seen

    def ordered(self) -> CodeArray:
        """The codes in the window, oldest first ``[filled, F]``."""
        if not self.full:
            # Until the ring wraps, it is filled from the start in arrival order.
            return self._codes[: self.filled]
        return np.concatenate([self._codes[self._next :], self._codes[: self._next]])

    def push_counting(self, codes: CodeArray, ends: NDArray[np.int64]) -> IntArray:
        """Push ``codes`` and return ``[len(ends), F, K]``: the window's counts as they were
        right after ``codes[:end]`` for each end, each taken once the window was full.

        One gather and one bincount for every verdict of a batch, instead of a push and a
        recount per verdict: the counts are the same integers.
        """
        counts = self.counting(codes, ends)
        self.push(codes)
        return counts

    def counting(self, codes: CodeArray, ends: NDArray[np.int64]) -> IntArray:
        """:meth:`push_counting` without the push."""
        history = np.concatenate([self.ordered(), codes])
        # Each end's window is the last `size` codes before it, in the history.
        rows = (ends + self.filled - self.size)[:, None] + self._positions[None, :]
        return bin_counts(history[rows], self.bins)

    @property
    def counts(self) -> IntArray:
        """``[F, K]`` bin counts of the samples in the window."""
        codes = self._codes if self.full else self._codes[: self.filled]
        flat = (codes.astype(np.int64) + self._offsets).ravel()
        size = len(self._offsets) * self.bins
        counts: IntArray = np.bincount(flat, minlength=size).reshape(-1, self.bins)
        return counts

    @property
    def full(self) -> bool:
        return self.filled == self.size

    def state_bytes(self) -> int:
        return self._codes.nbytes + self._offsets.nbytes + self._positions.nbytes


@dataclass
class DriftTracker:
    """Sliding-window drift tests for every detector of a profile, fed from the capture thread.

    ``update(layer, features)`` bins the layer's features, pushes them into each of its
    detectors' windows and returns a verdict for every detector whose window is full and has
    taken ``step`` new samples since its last verdict.
    """

    references: Mapping[str, BinnedReference]
    calibration: Calibration
    step: int
    output_layer: str = OUTPUT_LAYER
    #: What the output is (``monitoring.output.head``): which detectors it feeds.
    head: str = "logits"
    #: The output's logits are per position (``[B, T, C]``; see :func:`derive`).
    positions: bool = False
    #: Detectors whose bin counts are also tallied for :meth:`take_counts` (the fleet-wide
    #: counters); the others pay nothing for it.
    tallied: frozenset[str] = frozenset()
    #: Per tallied detector, the features (indices into its reference's) whose counts are
    #: tallied; a detector not here tallies every feature. Set by :meth:`choose_fleet`.
    fleet_index: Mapping[str, NDArray[np.intp]] = field(default_factory=dict)
    #: ``drift.false_page_days`` in seconds, exported for the fleet's drift page.
    page_budget_s: float = 30 * 86400.0
    #: Per layer, the projection its features go through before binning (wide layers only).
    projections: Mapping[str, Projection] = field(default_factory=dict)
    #: Per layer, the reference mean of each per-sample statistic (``STATISTICS`` order),
    #: exported so alert thresholds compare production with the model's own reference.
    statistics: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    #: Detectors the profile left out (nothing to test on the reference), and why.
    left_out: Mapping[str, str] = field(default_factory=dict)
    #: Per hidden layer, its units on the reference (carried to the units view, like
    #: ``statistics``: the profile is the one source of reference values).
    units: Mapping[str, UnitReference] = field(default_factory=dict)
    #: Per detector, its anytime-valid test (fed the same codes as its window); empty: off.
    sequential: Mapping[str, SequentialTest] = field(default_factory=dict)
    #: The accuracy estimate without labels (a profile with a labelled reference and a logits
    #: head), fed the harm layer's features and the logits; None: no estimate.
    accuracy: AccuracyTracker | None = None
    _windows: dict[str, SlidingWindow] = field(default_factory=dict)
    _tally: dict[str, IntArray] = field(default_factory=dict)
    #: Sequential alarms not yet taken, oldest first (at most MAX_PENDING_ALARMS).
    _alarms: list[SequentialAlarm] = field(default_factory=list)
    _since: dict[str, int] = field(default_factory=dict)
    #: Detectors whose latest verdict alarmed.
    _alarming: set[str] = field(default_factory=set)
    #: The detectors that alarmed first in the current alarm episode (an episode starts when
    #: a detector alarms while none is alarming, and ends when none is); empty between.
    first_alarms: frozenset[str] = frozenset()
    _round: int = 0
    _episode_round: int = -1
    #: Codes held between :meth:`defer` and :meth:`advance`, as (layer, detector, codes) in
    #: arrival order; None: not deferring (each update scores its detectors at once).
    _deferred: list[tuple[str, str, CodeArray]] | None = None
    #: The sequential tests, and the windows, last advanced together (see :meth:`advance`),
    #: kept while in step.
    _group: SequentialGroup | None = None
    _window_group: _WindowGroup | None = None

    def __post_init__(self) -> None:
        expect(self.step >= 1, "a step of at least 1", self.step)
        for name, ref in self.references.items():
            self._windows[name] = SlidingWindow(self.calibration.window, ref.n_features, ref.n_bins)
            self._since[name] = 0

    @property
    def window(self) -> int:
        return self.calibration.window

    def update(
        self, layer: str, features: NDArray[Any], pause: Callable[[], None] | None = None
    ) -> list[DriftResult]:
        """Feed a layer's features ``[B, F]``; the verdicts they brought, detector by detector
        (none while deferring: then :meth:`advance` returns them).

        ``pause`` is called before every detector after the first (the capture thread lets
        the GIL go there).
        """
        results: list[DriftResult] = []
        projection = self.projections.get(layer)
        if projection is not None:
            features = projection.apply(features)
        first = True
        for name, x in derive(
            layer, features, self.output_layer, self.head, self.positions
        ).items():
            ref = self.references.get(name)
            if ref is None:
                continue
            if pause is not None and not first:
                pause()
            first = False
            codes = ref.encode(x)
            if name in self.tallied:
                index = self.fleet_index.get(name)
                tallied = codes if index is None else codes[:, index]
                counts = bin_counts(tallied[None], ref.n_bins)[0]
                pending = self._tally.get(name)
                self._tally[name] = counts if pending is None else pending + counts
            if self._deferred is not None:
                self._deferred.append((layer, name, codes))
                continue
            test = self.sequential.get(name)
            if test is not None:
                self._hold_alarms(test.update(codes))
            results.extend(self._window_verdicts(name, codes))
        return results

    def _window_verdicts(self, name: str, codes: CodeArray) -> list[DriftResult]:
        """Push a detector's codes into its window; the verdicts that fell on the way."""
        window = self._windows[name]
        ends = self._verdict_ends(name, len(codes))
        if not ends:
            window.push(codes)
            return []
        # Every verdict of the batch scored in one call; the scores are those of the
        # window as it stood at each step boundary.
        scores = self.references[name].score(
            window.push_counting(codes, np.asarray(ends, dtype=np.int64))
        )
        return [self._verdict(name, float(score)) for score in scores]

    def choose_fleet(self, patterns: Sequence[str], features: int) -> None:
        """Tally the detectors whose names match one of ``patterns`` (``fnmatch`` globs) for the
        fleet's per-bin counters; input and hidden-layer detectors on their
        :func:`compact_features` only, the output's on every feature."""
        chosen = {
            name
            for name in self.references
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
        }
        self.tallied = frozenset(chosen)
        self.fleet_index = {
            name: compact_features(self.references[name].n_features, features)
            for name in sorted(chosen)
            if self.references[name].level in COMPACT_LEVELS
        }

    def fleet_features(self, name: str) -> NDArray[np.intp]:
        """Indices into ``name``'s reference features of those tallied for the fleet."""
        index = self.fleet_index.get(name)
        if index is None:
            return np.arange(self.references[name].n_features, dtype=np.intp)
        return index

    def fleet_score(self, name: str, counts: IntArray) -> float:
        """The fleet recording rules' score of ``name`` on tallied counts ``[len(index), K]``
        (summed over workers and replicas): the mean over its fleet features of the chi-square
        per degree of freedom, as :class:`ChiSquare` scores a window."""
        ref = self.references[name]
        index = self.fleet_features(name)
        chi_square = ChiSquare(ref.counts[index], ref.valid[index], ref.n_ref)
        return float(np.mean(chi_square(np.asarray(counts))))

    def state_bytes(self) -> int:
        """Memory of the streaming state (windows, their counts' inputs, sequential tests):
        bounded by the window, features and bins, whatever the traffic."""
        windows = sum(w.state_bytes() for w in self._windows.values())
        group = self._group.state_bytes() if self._group is not None else 0
        return windows + group + sum(t.state_bytes() for t in self.sequential.values())

    def feature_widths(self) -> dict[str, int]:
        """Features each projected layer must capture: its projection's input width."""
        return {layer: p.input_width for layer, p in self.projections.items()}

    def new_round(self) -> None:
        """Verdicts until the next call count as simultaneous (the capture thread calls it once
        per drain), so detectors that alarm on the same samples share "first"."""
        self._round += 1

    def _track_episode(self, result: DriftResult) -> None:
        if not result.is_drift:
            self._alarming.discard(result.detector)
            if not self._alarming:
                self.first_alarms = frozenset()
            return
        if not self._alarming:
            self._episode_round = self._round
            self.first_alarms = frozenset()
        if self._episode_round == self._round:
            self.first_alarms = self.first_alarms | {result.detector}
        self._alarming.add(result.detector)

    def defer(self) -> None:
        """Hold the detectors' codes from here until :meth:`advance`, which advances the
        detectors fed in between together (the capture thread, once a drain)."""
        if self._deferred is None:
            self._deferred = []

    def advance(
        self, pause: Callable[[], None] | None = None
    ) -> tuple[list[DriftResult], dict[str, Exception]]:
        """Feed the codes held since :meth:`defer` to the sequential tests and the windows,
        and stop holding: the verdicts they brought, detector by detector in the order they
        were fed, and the layers whose detectors failed, with the error (their codes are lost).
        ``pause`` is called between the tests and the windows (the capture thread's GIL
        pause: each is a step of its own).

        Detectors fed the same number of samples, each once, in step with each other (the
        usual drain: every layer of every record), advance together: one
        :class:`SequentialGroup` for their tests, one window over all their features. Any
        other mix, each on its own. Either way the same verdicts, alarms and state.
        """
        deferred, self._deferred = self._deferred, None
        if not deferred:
            return [], {}
        failed: dict[str, Exception] = {}
        self._advance_tests([e for e in deferred if e[1] in self.sequential], failed)
        if pause is not None:
            pause()
        results = self._advance_windows([e for e in deferred if e[0] not in failed], failed)
        return results, failed

    def _advance_tests(
        self, deferred: list[tuple[str, str, CodeArray]], failed: dict[str, Exception]
    ) -> None:
        names = tuple(name for _, name, _ in deferred)
        tests = [self.sequential[name] for name in names]
        if (
            _together(names, [codes for _, _, codes in deferred])
            and len({test.seen for test in tests}) == 1
            and len({test._shape[1] for test in tests}) == 1
        ):
            try:
                group = self._group
                if group is None or group.tests != tuple(tests) or not group.usable:
                    group = self._group = SequentialGroup(tests)
                self._hold_alarms(group.update([codes for _, _, codes in deferred]))
                return
            except Exception:
                # The group writes nothing back until it has finished: each test on its own
                # below, so a failure is charged to its layer.
                self._group = None
        for layer, name, codes in deferred:
            if layer in failed:
                continue
            try:
                self._hold_alarms(self.sequential[name].update(codes))
            except Exception as error:
                failed[layer] = error

    def _advance_windows(
        self, deferred: list[tuple[str, str, CodeArray]], failed: dict[str, Exception]
    ) -> list[DriftResult]:
        names = tuple(name for _, name, _ in deferred)
        codes = [c for _, _, c in deferred]
        windows = [self._windows[name] for name in names]
        if (
            _together(names, codes)
            and len({(w._next, w.filled, w.seen, w.bins) for w in windows}) == 1
            and len({self._since[name] for name in names}) == 1
        ):
            since = self._since[names[0]]
            try:
                group = self._window_group
                if group is None or group.names != names or not group.usable:
                    group = self._window_group = _WindowGroup(
                        names, windows, [self.references[name] for name in names]
                    )
                ends = self._verdict_ends(names[0], len(codes[0]))
                if not ends:
                    group.push(codes)
                    for name in names:
                        self._since[name] = self._since[names[0]]
                    return []
                scores = group.scores(codes, np.asarray(ends, dtype=np.int64))
            except Exception:
                # Nothing was pushed (the group pushes last): each window on its own
                # below, so a failure is charged to its layer.
                self._window_group = None
                self._since[names[0]] = since
            else:
                for name in names:
                    self._since[name] = self._since[names[0]]
                return [
                    self._verdict(name, float(score))
                    for name, per_name in zip(names, scores, strict=True)
                    for score in per_name
                ]
        results: list[DriftResult] = []
        for layer, name, c in deferred:
            if layer in failed:
                continue
            try:
                results.extend(self._window_verdicts(name, c))
            except Exception as error:
                failed[layer] = error
        return results

    def _hold_alarms(self, raised: list[SequentialAlarm]) -> None:
        if raised and len(self._alarms) < MAX_PENDING_ALARMS:
            self._alarms.extend(raised[: MAX_PENDING_ALARMS - len(self._alarms)])

    def sequential_state(self) -> dict[str, tuple[int, float]]:
        """Per detector with a sequential test: its alarms so far and its current log evidence."""
        return {name: (t.alarms, t.log_evidence) for name, t in self.sequential.items()}

    def take_alarms(self) -> list[SequentialAlarm]:
        """The sequential tests' alarms since the last call, oldest first, then forget them.

        Kept only until taken and at most ``MAX_PENDING_ALARMS`` of them (a shift alarms again
        after every restart), so a caller that never takes them holds a bounded list.
        """
        taken, self._alarms = self._alarms, []
        return taken

    def take_counts(self) -> dict[str, IntArray]:
        """Bin counts ``[F, K]`` per tallied detector since the last call, then forget them."""
        taken, self._tally = self._tally, {}
        return taken

    def _verdict_ends(self, name: str, n: int) -> list[int]:
        """How many of ``n`` new samples precede each verdict they bring, in order.

        A verdict falls once the window is full and has taken ``step`` samples since the
        previous one, so verdicts fall every ``step`` samples however the capture thread
        batches them. Arithmetic on counters only, no pass over the samples.
        """
        window = self._windows[name]
        since, filled = self._since[name], window.filled
        ends: list[int] = []
        done = 0
        # Filling: at most one verdict on the way (when the window fills), then the full case.
        while done < n and filled < window.size:
            take = self.step - since if since < self.step else window.size - filled
            chunk = min(max(1, take), n - done)
            done += chunk
            since += chunk
            filled = min(window.size, filled + chunk)
            if filled == window.size and since >= self.step:
                since = 0
                ends.append(done)
        if done < n:
            # Full: the next verdict once `step` samples since the last, then every `step`.
            rest = range(done + max(1, self.step - since), n + 1, self.step)
            since = n - rest[-1] if rest else since + n - done
            ends.extend(rest)
        self._since[name] = since
        return ends

    def _verdict(self, name: str, score: float) -> DriftResult:
        ref = self.references[name]
        threshold = self.calibration.thresholds[name]
        result = DriftResult(name, ref.level, score > threshold, score, threshold, self.window)
        self._track_episode(result)
        return result


def _together(names: Sequence[str], codes: Sequence[CodeArray]) -> bool:
    """Several detectors, each fed once, the same number of samples each: a drain's usual mix,
    the one :meth:`DriftTracker.advance` advances in one pass."""
    return len(names) > 1 and len(set(names)) == len(names) and len({len(c) for c in codes}) == 1


class _WindowGroup:
    """Several detectors' windows as one window over all their features, in step.

    The members' code rings become column views of the group's ring, so a push of the group
    is a push of each member; the group then sets each member's position. Scoring takes every
    verdict's counts of every member in one gather and one bincount, and the chi-square per
    feature over all of them; each member's score aggregates its own features, the same
    arithmetic as :meth:`BinnedReference.score` on its own counts. Usable while every member
    stands where the group does (none was pushed alone).
    """

    def __init__(
        self,
        names: tuple[str, ...],
        windows: Sequence[SlidingWindow],
        references: Sequence[BinnedReference],
    ) -> None:
        first = windows[0]
        self.names = names
        self.windows = tuple(windows)
        widths = [w._codes.shape[1] for w in windows]
        self._bounds = np.cumsum([0, *widths])
        self.window = SlidingWindow(first.size, int(self._bounds[-1]), first.bins)
        self.window._codes[:] = np.concatenate([w._codes for w in windows], axis=1)
        self.window._next, self.window.filled, self.window.seen = (
            first._next,
            first.filled,
            first.seen,
        )
        for i, member in enumerate(windows):
            member._codes = self.window._codes[:, self._bounds[i] : self._bounds[i + 1]]
        self._aggregations = [ref.aggregation for ref in references]
        n_ref = np.concatenate([np.full(ref.n_features, ref.n_ref) for ref in references])
        self._chi_square = ChiSquare(
            np.concatenate([ref.counts for ref in references]),
            np.concatenate([ref.valid for ref in references]),
            n_ref,
        )

    @property
    def usable(self) -> bool:
        group = self.window
        return all(
            (w._next, w.filled, w.seen) == (group._next, group.filled, group.seen)
            for w in self.windows
        )

    def push(self, codes: Sequence[CodeArray]) -> None:
        self.window.push(np.concatenate(codes, axis=1))
        self._place()

    def scores(self, codes: Sequence[CodeArray], ends: NDArray[np.int64]) -> list[FloatArray]:
        """Per member, its scores at each end (as its reference scores them), then push the
        codes: a failure before the push leaves every window as it was."""
        joined = np.concatenate(codes, axis=1)
        per_feature = self._chi_square(self.window.counting(joined, ends))
        out = [
            aggregate(per_feature[:, self._bounds[i] : self._bounds[i + 1]], aggregation)
            for i, aggregation in enumerate(self._aggregations)
        ]
        self.window.push(joined)
        self._place()
        return out

    def _place(self) -> None:
        group = self.window
        for member in self.windows:
            member._next, member.filled, member.seen = group._next, group.filled, group.seen
