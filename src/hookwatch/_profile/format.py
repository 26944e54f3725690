"""The drift profile file: a bounded, versioned numpy ``.npz`` (no pickle).

It holds a JSON header and, per detector, bin edges ``[F, K-1]``, reference bin counts
``[F, K]`` and the bin codes ``[S, F]`` (uint8) of at most ``max_codes`` reference samples for
calibration; per layer wider than ``max_features`` (with ``drift.projection: pca``), its
projection: a mean ``[W]`` and principal directions ``[W, k]``. Its size is bounded by the number
of features, bins, ``max_codes`` and the projection widths, whatever the amount of reference
data.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hookwatch._config import MonitoringConfig
from hookwatch._drift import (
    AccuracyEstimator,
    BinnedReference,
    Calibration,
    DriftTracker,
    Projection,
    SequentialTest,
    calibrate,
)
from hookwatch._errors import ProfileError
from hookwatch._names import OUTPUT_LAYER
from hookwatch._views import UnitReference

__all__ = ["FORMAT", "READABLE", "VERSION", "DriftProfile"]

FORMAT = "hookwatch-drift-profile"
VERSION = 4
#: Versions this code reads: version 1 predates projections; versions before 3 stored bin
#: edges as float32 (a confident softmax's edges at 0.99999... rounded to 1.0 and every sample
#: fell into one bin) and know no output head (logits) and no reference statistics; versions
#: before 4 know no reference units (the dead and saturated shares are then not exported).
READABLE = (1, 2, 3, 4)
_FIELDS = ("edges", "counts", "codes")
_UNIT_FIELDS = ("active", "low", "high")
#: Prefix of the accuracy estimator's arrays (``AccuracyEstimator.to_arrays``); profiles
#: without one, and readers that predate it, simply have none (same format version).
_ACCURACY = "a."


@dataclass(frozen=True)
class DriftProfile:
    """Per-detector reference bins of one model, plus where they came from.

    Built by :func:`hookwatch.build_profile`, written with :meth:`save`, read back with
    :meth:`load`, handed to :func:`hookwatch.watch` as ``profile``::

        profile = hookwatch.build_profile(model, config, held_out, "tabular")
        profile.save("drift-profile.npz")
        monitor = hookwatch.watch(model, config, "tabular", profile=DriftProfile.load(path))
    """

    model: str
    references: Mapping[str, BinnedReference]
    layers: tuple[str, ...]
    n_seen: int
    bins: int
    max_features: int
    created: float
    #: Per projected layer, what its features go through before binning.
    projections: Mapping[str, Projection] = field(default_factory=dict)
    #: What the output is (``monitoring.output.head``) when the profile was built.
    head: str = "logits"
    #: The output's logits were per position (``[B, T, C]``): its features are
    #: :func:`hookwatch._stats.position_summary`'s (see :func:`hookwatch._drift.derive`).
    positions: bool = False
    #: Per watched layer, the reference mean of each per-sample statistic (``STATISTICS``
    #: order): what alert thresholds compare production with.
    statistics: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    #: Detectors with nothing to test on the reference, and why (a layer constant on it).
    left_out: Mapping[str, str] = field(default_factory=dict)
    #: Per hidden layer, its units on the reference (activity and range).
    units: Mapping[str, UnitReference] = field(default_factory=dict)
    #: The label-free accuracy estimator fitted on a labelled reference (logits head only),
    #: and the hidden layer whose features it reads; None: built without labels.
    accuracy: AccuracyEstimator | None = None
    accuracy_layer: str | None = None

    def header(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "layers": list(self.layers),
            "n_seen": self.n_seen,
            "bins": self.bins,
            "max_features": self.max_features,
            "created": self.created,
            "head": self.head,
            "positions": self.positions,
            "statistics": {layer: list(values) for layer, values in self.statistics.items()},
            "left_out": dict(self.left_out),
            "detectors": [
                {
                    "name": r.name,
                    "level": r.level,
                    "aggregation": r.aggregation,
                    "kept": list(r.kept),
                    "dropped": list(r.dropped),
                    "categories": list(r.categories),
                    "n_reference": r.n_ref,
                }
                for r in self.references.values()
            ],
            "units": [{"layer": u.layer, "width": u.width} for u in self.units.values()],
            "accuracy": None if self.accuracy is None else {"layer": self.accuracy_layer},
            "projections": [
                {
                    "layer": p.layer,
                    "input_width": p.input_width,
                    "width": p.width,
                    "explained": p.explained,
                    "residual": p.residual,
                }
                for p in self.projections.values()
            ],
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile to ``path`` (an ``.npz`` file, no pickles) and return its path.

        Usage::

            profile.save("drift-profile.npz")
        """
        path = Path(path)
        arrays: dict[str, NDArray[Any]] = {
            "header": np.frombuffer(json.dumps(self.header()).encode(), dtype=np.uint8)
        }
        for i, ref in enumerate(self.references.values()):
            # At the precision they were fitted in: the codes, counts and calibration came
            # from these edges, and float32 rounding moves edges near 1 and near 0.
            arrays[f"d{i}.edges"] = ref.edges.astype(np.float64)
            arrays[f"d{i}.counts"] = ref.counts.astype(np.int64)
            arrays[f"d{i}.codes"] = ref.codes
        for i, projection in enumerate(self.projections.values()):
            arrays[f"p{i}.mean"] = projection.mean
            arrays[f"p{i}.components"] = projection.components
        for i, unit in enumerate(self.units.values()):
            for name in _UNIT_FIELDS:
                arrays[f"u{i}.{name}"] = getattr(unit, name).astype(np.float64)
        if self.accuracy is not None:
            for name, value in self.accuracy.to_arrays().items():
                arrays[f"{_ACCURACY}{name}"] = value
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            np.savez_compressed(handle, **arrays)  # type: ignore[arg-type]
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DriftProfile:
        """Read a profile that :meth:`save` wrote; a file of another format or version, or one
        that cannot be read, raises :class:`~hookwatch.ProfileError`::

            profile = hookwatch.DriftProfile.load("drift-profile.npz")
        """
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            raise ProfileError(f"expected a {FORMAT} .npz file at {path}, got {error}") from None
        if "header" not in arrays:
            raise ProfileError(f"expected a {FORMAT} file with a header, got keys {sorted(arrays)}")
        header = json.loads(arrays["header"].tobytes().decode())
        if header.get("format") != FORMAT:
            raise ProfileError(f"expected format {FORMAT!r}, got {header.get('format')!r}")
        if header.get("version") not in READABLE:
            raise ProfileError(
                f"expected profile version {' or '.join(map(str, READABLE))}, got "
                f"{header.get('version')!r} (rebuild it with `hookwatch profile`)"
            )
        references: dict[str, BinnedReference] = {}
        for i, meta in enumerate(header["detectors"]):
            edges, counts, codes = (arrays[f"d{i}.{f}"] for f in _FIELDS)
            references[meta["name"]] = BinnedReference(
                name=meta["name"],
                level=meta["level"],
                edges=edges.astype(np.float64),
                counts=counts.astype(np.int64),
                codes=codes.astype(np.uint8),
                aggregation=meta["aggregation"],
                dropped=tuple(meta["dropped"]),
                kept=tuple(meta["kept"]),
                categories=tuple(meta.get("categories", ())),
            )
        projections: dict[str, Projection] = {}
        for i, meta in enumerate(header.get("projections", [])):
            projections[meta["layer"]] = Projection(
                layer=meta["layer"],
                mean=arrays[f"p{i}.mean"].astype(np.float32),
                components=arrays[f"p{i}.components"].astype(np.float32),
                explained=float(meta["explained"]),
                residual=bool(meta["residual"]),
            )
        units = {
            meta["layer"]: UnitReference(
                meta["layer"], *(arrays[f"u{i}.{name}"].astype(np.float64) for name in _UNIT_FIELDS)
            )
            for i, meta in enumerate(header.get("units", []))
        }
        accuracy, accuracy_layer = None, None
        if header.get("accuracy") is not None:
            state = {
                k.removeprefix(_ACCURACY): v for k, v in arrays.items() if k.startswith(_ACCURACY)
            }
            try:
                accuracy = AccuracyEstimator.from_arrays(state)
            except ValueError as error:
                raise ProfileError(f"{path}: its accuracy estimator: {error}") from None
            accuracy_layer = str(header["accuracy"]["layer"])
        return cls(
            model=header["model"],
            references=references,
            units=units,
            projections=projections,
            layers=tuple(header["layers"]),
            n_seen=int(header["n_seen"]),
            bins=int(header["bins"]),
            max_features=int(header["max_features"]),
            created=float(header["created"]),
            head=str(header.get("head", "logits")),
            positions=bool(header.get("positions", False)),
            statistics={
                layer: tuple(float(v) for v in values)
                for layer, values in header.get("statistics", {}).items()
            },
            left_out={str(k): str(v) for k, v in header.get("left_out", {}).items()},
            accuracy=accuracy,
            accuracy_layer=accuracy_layer,
        )

    def check(self, config: MonitoringConfig) -> None:
        """Fail fast when the profile was built for other layers or another feature width."""
        if tuple(config.watched) != self.layers:
            raise ProfileError(
                f"expected a profile for layers {list(config.watched)}, got {list(self.layers)}"
            )
        if config.output.head != self.head:
            raise ProfileError(
                f"expected a profile built for output head {config.output.head!r}, got "
                f"{self.head!r} (rebuild it with the model's configuration)"
            )
        if config.max_features != self.max_features:
            raise ProfileError(
                f"expected a profile built with max_features={config.max_features}, "
                f"got {self.max_features}"
            )

    def calibrate(
        self, window: int, false_alarm_rate: float, windows: int = 4000, seed: int = 0
    ) -> Calibration:
        return calibrate(list(self.references.values()), window, false_alarm_rate, windows, seed)

    def tracker(
        self,
        window: int,
        step: int,
        false_alarm_rate: float,
        windows: int = 4000,
        seed: int = 0,
        run_length: int | None = None,
        reference_confidence: float = 0.99,
    ) -> DriftTracker:
        """A tracker for these references; with ``run_length``, anytime-valid tests too.

        ``run_length`` is the expected number of samples between false alarms of all
        detectors together; ``reference_confidence`` the probability that the reference
        bounds hold (see ``hookwatch._drift.sequential``).
        """
        calibration = self.calibrate(window, false_alarm_rate, windows, seed)
        return DriftTracker(
            self.references,
            calibration,
            step,
            OUTPUT_LAYER,
            head=self.head,
            positions=self.positions,
            projections=self.projections,
            statistics=self.statistics,
            left_out=self.left_out,
            units=self.units,
            sequential=(
                {}
                if run_length is None
                else self.sequential_tests(run_length, reference_confidence, window)
            ),
        )

    def sequential_tests(
        self, run_length: int, reference_confidence: float, memory: int
    ) -> dict[str, SequentialTest]:
        """One anytime-valid test per detector, splitting the false alarm budget evenly."""
        if not 0.0 < reference_confidence < 1.0:
            raise ProfileError(
                f"expected a reference confidence in (0, 1), got {reference_confidence!r}"
            )
        if run_length < 2:
            raise ProfileError(f"expected a run length of at least 2, got {run_length!r}")
        refs = list(self.references.values())
        features = sum(r.n_features for r in refs)
        log_threshold = math.log(run_length * len(refs))
        log_features_over_delta = math.log(features / (1.0 - reference_confidence))
        return {
            r.name: SequentialTest(r, log_threshold, log_features_over_delta, memory) for r in refs
        }

    def size_bytes(self) -> int:
        buffer = io.BytesIO()
        arrays = {f"{r.name}.{f}": getattr(r, f) for r in self.references.values() for f in _FIELDS}
        for p in self.projections.values():
            arrays[f"{p.layer}.mean"] = p.mean
            arrays[f"{p.layer}.components"] = p.components
        np.savez_compressed(buffer, **arrays)
        return buffer.tell()


DriftProfile.__module__ = "hookwatch"  # public as hookwatch.DriftProfile (reprs, tracebacks)
