"""The drift reference profile: built from reference data with the serving hooks, saved bounded.

The file is a numpy ``.npz`` (no pickle) holding a JSON header and, per detector, bin edges
``[F, K-1]``, reference bin counts ``[F, K]`` and the bin codes ``[S, F]`` (uint8) of at most
``max_codes`` reference samples for calibration; per layer wider than ``max_features`` (with
``drift.projection: pca``), its projection: a mean ``[W]`` and principal directions ``[W, k]``.
Its size is bounded by the number of features, bins, ``max_codes`` and the projection widths,
whatever the amount of reference data: the builder keeps a uniform reservoir of at most
``max_reference`` samples and forgets everything else.
"""

from __future__ import annotations

import io
import json
import logging
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from hookwatch.config import INPUT_LAYER, OUTPUT_LAYER, MonitoringConfig
from hookwatch.drift import (
    OUTPUT_DETECTORS,
    BinnedReference,
    Calibration,
    DriftTracker,
    Projection,
    calibrate,
    derive,
)
from hookwatch.hooks import Capture, Gate, HookSet

log = logging.getLogger("hookwatch")

FORMAT = "hookwatch-drift-profile"
VERSION = 2
#: Versions this code reads: version 1 predates projections and has none.
READABLE = (1, 2)
_FIELDS = ("edges", "counts", "codes")


class ProfileError(ValueError):
    """A profile file that cannot be used: wrong format, version or layers."""


def level_of(detector: str) -> str:
    if detector == INPUT_LAYER:
        return "input"
    if detector == "output":
        return "output"
    if detector in OUTPUT_DETECTORS:
        return "prediction"
    return "activation"


@dataclass(frozen=True)
class DriftProfile:
    """Per-detector reference bins of one model, plus where they came from."""

    model: str
    references: Mapping[str, BinnedReference]
    layers: tuple[str, ...]
    n_seen: int
    bins: int
    max_features: int
    created: float
    #: Per projected layer, what its features go through before binning.
    projections: Mapping[str, Projection] = field(default_factory=dict)

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
            "detectors": [
                {
                    "name": r.name,
                    "level": r.level,
                    "aggregation": r.aggregation,
                    "kept": list(r.kept),
                    "dropped": list(r.dropped),
                    "n_reference": r.n_ref,
                }
                for r in self.references.values()
            ],
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

    def save(self, path: Path) -> Path:
        arrays: dict[str, NDArray[Any]] = {
            "header": np.frombuffer(json.dumps(self.header()).encode(), dtype=np.uint8)
        }
        for i, ref in enumerate(self.references.values()):
            arrays[f"d{i}.edges"] = ref.edges.astype(np.float32)
            arrays[f"d{i}.counts"] = ref.counts.astype(np.int64)
            arrays[f"d{i}.codes"] = ref.codes
        for i, projection in enumerate(self.projections.values()):
            arrays[f"p{i}.mean"] = projection.mean
            arrays[f"p{i}.components"] = projection.components
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            np.savez_compressed(handle, **arrays)  # type: ignore[arg-type]
        return path

    @classmethod
    def load(cls, path: Path) -> DriftProfile:
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
        return cls(
            model=header["model"],
            references=references,
            projections=projections,
            layers=tuple(header["layers"]),
            n_seen=int(header["n_seen"]),
            bins=int(header["bins"]),
            max_features=int(header["max_features"]),
            created=float(header["created"]),
        )

    def check(self, config: MonitoringConfig) -> None:
        """Fail fast when the profile was built for other layers or another feature width."""
        if tuple(config.watched) != self.layers:
            raise ProfileError(
                f"expected a profile for layers {list(config.watched)}, got {list(self.layers)}"
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
    ) -> DriftTracker:
        calibration = self.calibrate(window, false_alarm_rate, windows, seed)
        return DriftTracker(
            self.references, calibration, step, OUTPUT_LAYER, projections=self.projections
        )

    def size_bytes(self) -> int:
        buffer = io.BytesIO()
        arrays = {f"{r.name}.{f}": getattr(r, f) for r in self.references.values() for f in _FIELDS}
        for p in self.projections.values():
            arrays[f"{p.layer}.mean"] = p.mean
            arrays[f"{p.layer}.components"] = p.components
        np.savez_compressed(buffer, **arrays)
        return buffer.tell()


class _Collector:
    """A capture sink that keeps features in process (profile building only, never serving)."""

    def __init__(self) -> None:
        self.features: dict[str, list[NDArray[np.float32]]] = {}
        self.faults: list[tuple[str, BaseException]] = []

    def offer(self, capture: Capture) -> bool:
        if capture.features is not None:
            self.features.setdefault(capture.layer, []).append(capture.features.cpu().numpy())
        return True

    def on_fault(self, layer: str, error: BaseException) -> None:
        self.faults.append((layer, error))


class _Reservoir:
    """A uniform sample of at most ``size`` rows, aligned across layers (Vitter's algorithm R)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.rows: dict[str, NDArray[np.float32]] = {}
        self.seen = 0
        self._rng = np.random.default_rng(seed)

    def add(self, batch: Mapping[str, NDArray[np.float32]]) -> None:
        n = len(next(iter(batch.values())))
        for layer, x in batch.items():
            if len(x) != n:
                raise ValueError(f"expected {n} rows for layer {layer!r}, got {len(x)}")
            if layer not in self.rows:
                self.rows[layer] = np.empty((self.size, x.shape[1]), dtype=np.float32)
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


def capture_features(
    model: nn.Module,
    config: MonitoringConfig,
    batches: Iterable[torch.Tensor],
) -> Iterable[dict[str, NDArray[np.float32]]]:
    """Yield, per batch, the features the serving hooks capture for every watched layer.

    With ``drift.projection: pca`` every layer but the output is captured up to
    ``drift.projection_width`` features, so a wide one can be projected.
    """
    collector = _Collector()
    gate = Gate()
    hooks = HookSet(gate, collector, config.max_features)
    widths = (
        {layer: config.drift.projection_width for layer in config.watched if layer != OUTPUT_LAYER}
        if config.drift.projection == "pca"
        else None
    )
    model.eval()
    with hooks.attach(
        model, config.layers, config.capture_input, config.capture_output, widths=widths
    ):
        for batch in batches:
            gate.set(True)
            try:
                with torch.inference_mode():
                    model(batch)
            finally:
                gate.set(False)
            if collector.faults:
                layer, error = collector.faults[0]
                raise RuntimeError(f"capturing layer {layer!r} failed: {error!r}")
            yield {k: np.concatenate(v) for k, v in collector.features.items()}
            collector.features.clear()


def build_profile(
    model: nn.Module,
    config: MonitoringConfig,
    batches: Iterable[torch.Tensor],
    model_name: str,
    bins: int = 10,
    max_reference: int = 20_000,
    max_codes: int = 4096,
    aggregation: str = "mean",
    progress: bool = False,
    total: int | None = None,
    seed: int = 0,
) -> DriftProfile:
    """Run ``batches`` through ``model`` with the serving hooks and bin what they capture."""
    reservoir = _Reservoir(max_reference, seed)
    iterator: Iterable[torch.Tensor] = batches
    if progress:
        from tqdm import tqdm

        iterator = tqdm(batches, total=total, unit="batch", desc="profile")
    for features in capture_features(model, config, iterator):
        reservoir.add(features)
    sample = reservoir.take()
    references: dict[str, BinnedReference] = {}
    codes_rng = np.random.default_rng(seed + 1)
    n = min(reservoir.seen, max_reference)
    if n < 2:
        raise ValueError(f"expected at least 2 reference samples, got {n}")
    pick = np.sort(codes_rng.choice(n, size=min(n, max_codes), replace=False))
    projections: dict[str, Projection] = {}
    for layer in config.watched:
        values: NDArray[Any] = sample[layer]
        # The output stays per class: its softmax and the predictions need every logit.
        if layer != OUTPUT_LAYER and values.shape[1] > config.max_features:
            projection = projections[layer] = Projection.fit(layer, values, config.max_features)
            values = projection.apply(values)
            log.info(
                "hookwatch: layer %r has %d features; drift tests %d principal components "
                "(%.1f %% of the reference variance)%s",
                layer,
                projection.input_width,
                projection.components.shape[1],
                100 * projection.explained,
                " and the residual distance" if projection.residual else "",
            )
        for name, x in derive(layer, values, OUTPUT_LAYER).items():
            if name != layer and name in config.watched:
                raise ValueError(f"expected no watched layer named like detector {name!r}")
            if name == "class_mix":
                classes = sample[layer].shape[1]
                ref = BinnedReference.categorical(name, level_of(name), x[:, 0], classes, n)
            else:
                ref = BinnedReference.fit(
                    name, level_of(name), x, bins, max_codes=n, aggregation=aggregation
                )
            # Aligned calibration sample: the same reference rows for every detector.
            references[name] = BinnedReference(
                ref.name,
                ref.level,
                ref.edges,
                ref.counts,
                ref.codes[pick],
                ref.aggregation,
                ref.dropped,
                ref.kept,
            )
    return DriftProfile(
        model=model_name,
        references=references,
        layers=tuple(config.watched),
        n_seen=reservoir.seen,
        bins=bins,
        max_features=config.max_features,
        created=time.time(),
        projections=projections,
    )


def load_tracker(
    config: MonitoringConfig, model_dir: str | Path | None, model_name: str
) -> DriftTracker | None:
    """The drift tracker for a model directory, or None (and one log line) when there is none.

    A missing profile is not an error: the model serves without drift signals and
    ``hookwatch_drift_profile_loaded`` says so. A profile that does not fit the configuration
    is one, so a wrong file never produces silently meaningless scores.
    """
    drift = config.drift
    if not (config.enabled and drift.enabled):
        log.info("hookwatch: drift detection is off for model %r (configuration)", model_name)
        return None
    path = Path(model_dir) / drift.profile if model_dir is not None else None
    if path is None or not path.is_file():
        log.warning(
            "hookwatch: model %r has no drift profile (expected %s); serving without drift "
            "detection. Build one with `hookwatch profile` and add it to the .mar",
            model_name,
            path if path is not None else f"<model_dir>/{drift.profile}",
        )
        return None
    started = time.perf_counter()
    profile = DriftProfile.load(path)
    profile.check(config)
    tracker = profile.tracker(
        drift.window,
        drift.effective_step,
        drift.false_alarm_rate,
        drift.calibration_windows,
        seed=config.seed or 0,
    )
    log.info(
        "hookwatch: drift profile of model %r loaded (%d detectors, window %d, false alarm "
        "rate %g, calibrated in %.1f s)",
        model_name,
        len(profile.references),
        drift.window,
        drift.false_alarm_rate,
        time.perf_counter() - started,
    )
    return tracker


def load_mar_model(mar: Path) -> tuple[nn.Module, dict[str, Any], str]:
    """Model, parsed model-config and model name of an eager ``.mar`` (as TorchServe loads it)."""
    import importlib.util
    import inspect
    import tempfile

    import yaml

    with zipfile.ZipFile(mar) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))["model"]
        for key in ("modelFile", "serializedFile"):
            if key not in manifest:
                raise ProfileError(f"expected an eager-mode .mar with a {key}, got {manifest}")
        config_name = manifest.get("configFile")
        config = yaml.safe_load(archive.read(config_name)) if config_name else {}
        with tempfile.TemporaryDirectory() as tmp:
            archive.extract(manifest["modelFile"], tmp)
            spec = importlib.util.spec_from_file_location(
                "hookwatch_profile_model", Path(tmp) / manifest["modelFile"]
            )
            if spec is None or spec.loader is None:
                raise ProfileError(f"cannot import {manifest['modelFile']} from {mar}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        classes = [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, nn.Module) and c.__module__ == module.__name__
        ]
        if len(classes) != 1:
            raise ProfileError(
                f"expected exactly one nn.Module class in {manifest['modelFile']}, "
                f"got {[c.__name__ for c in classes]}"
            )
        model: nn.Module = classes[0]()
        state = torch.load(io.BytesIO(archive.read(manifest["serializedFile"])), weights_only=True)
        model.load_state_dict(state)
    model.eval()
    return model, config or {}, str(manifest.get("modelName", mar.stem))
