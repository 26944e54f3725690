"""What the bench serves: two models, each at two batch sizes, each as four handler variants.

Every variant is a TorchServe model directory (``--archive-format no-archive``) built from the
model's committed model-config.yaml, changed only where the variant differs: the handler
file, ``monitoring.sample_rate`` (unset for ``default``, so hookwatch's default applies; 1.0
for ``full``) and ``batchSize``. Every model directory holds the model's drift profile, so the
monitored variants run drift detection as a deployment does; the runner checks that their
workers loaded it.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from hookwatch._model import MODEL_SPEC_FILE
from hookwatch.tools.bench.stats import VARIANTS

#: The profile's file name in every model directory: ``drift.profile``'s default, which the
#: committed model configs keep.
PROFILE_FILE = "drift-profile.npz"

HANDLERS: Mapping[str, str] = {
    "plain": "handlers/plain_handler.py",
    "default": "handlers/hookwatch_handler.py",
    "full": "handlers/hookwatch_handler.py",
    "naive": "handlers/naive_handler.py",
}
#: Files of the repository a variant's model directory carries beside its handler: the naive
#: handler imports its capture as a sibling module, since ``dev/`` is on no worker's path.
HANDLER_FILES: Mapping[str, tuple[str, ...]] = {"naive": ("dev/bench/naive.py",)}


@dataclass(frozen=True)
class ModelKind:
    name: str
    description: str
    #: The module whose file is archived as the model file, or a file of the repository.
    model_module: str
    config: str
    #: Writes the serialized weights into a directory and returns the file.
    weights: Callable[[Path, Path], Path]
    #: A few request bodies and their Content-Type.
    payloads: Callable[[], tuple[list[bytes], str]]
    #: Writes what else the model directory holds into a directory and returns it (its
    #: contents go into every variant's model directory): at least the drift profile.
    extra: Callable[[Path, Path], Path]

    def model_path(self, root: Path) -> str:
        if self.model_module.endswith(".py"):
            return str(root / self.model_module)
        spec = importlib.util.find_spec(self.model_module)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"expected module {self.model_module} to be installed")
        return spec.origin


def _digits_weights(root: Path, build: Path) -> Path:
    mar = root / "model_store" / "digits.mar"
    if not mar.exists():
        raise FileNotFoundError(f"expected {mar} (run `make mar` first), found none")
    build.mkdir(parents=True, exist_ok=True)
    out = build / "digits_cnn.pt"
    with zipfile.ZipFile(mar) as archive:
        out.write_bytes(archive.read("digits_cnn.pt"))
    return out


def _digits_extra(root: Path, build: Path) -> Path:
    """The drift profile ``make mar`` built for these weights from held-out reference images
    (``hookwatch build-demo``), taken from the archive as the weights are."""
    out = build / "digits-extra"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with zipfile.ZipFile(root / "model_store" / "digits.mar") as archive:
        if PROFILE_FILE not in archive.namelist():
            raise FileNotFoundError(
                f"expected {PROFILE_FILE} in model_store/digits.mar (run `make mar`), found none"
            )
        archive.extract(PROFILE_FILE, out)
    return out


def _digits_payloads() -> tuple[list[bytes], str]:
    from hookwatch.tools.demo.data import load_split

    images = load_split().x_test[:64]
    bodies = [json.dumps({"data": image.reshape(-1).tolist()}).encode() for image in images]
    return bodies, "application/json"


def _resnet_weights(root: Path, build: Path) -> Path:
    from dev.bench.resnet import ResNet18

    build.mkdir(parents=True, exist_ok=True)
    out = build / "resnet18.pt"
    if not out.exists():
        torch.manual_seed(0)
        torch.save(ResNet18().state_dict(), out)
    return out


#: Synthetic reference images the random-weight ResNet-18's drift profile is built from: the
#: same distribution as the bench's request bodies (standard normal), another seed. Built
#: locally, as the bench downloads nothing.
RESNET_REFERENCE_IMAGES = 320


def _resnet_extra(root: Path, build: Path) -> Path:
    """A drift profile for the random-weight ResNet-18, built as ``hookwatch profile`` builds
    one: reference inputs through the serving input pipeline and the serving hooks. Built once
    per work directory (a minute or so on one thread), as its weights are."""
    from dev.bench.resnet import ResNet18
    from hookwatch._config import read_model_config
    from hookwatch._profile import build_profile
    from hookwatch._service import InputPipeline
    from hookwatch.tools.own_model import forward_batches

    out = build / "resnet18-extra"
    if (out / PROFILE_FILE).exists():
        return out
    model_config = read_model_config(root / MODELS["resnet18"].config)
    spec = model_config.handler.input
    if model_config.monitoring.drift.profile != PROFILE_FILE:
        raise ValueError(
            f"expected drift.profile {PROFILE_FILE} in the ResNet-18 config, got "
            f"{model_config.monitoring.drift.profile}"
        )
    torch.set_num_threads(1)
    model = ResNet18()
    model.load_state_dict(torch_load_state(_resnet_weights(root, build)))
    model.eval()
    pipeline = InputPipeline(spec)
    rng = np.random.default_rng(1)

    def batches() -> Iterator[torch.Tensor]:
        for _ in range(0, RESNET_REFERENCE_IMAGES, 32):
            images = rng.standard_normal((32, 3, 224, 224), dtype=np.float32)
            yield pipeline.stacked(torch.from_numpy(images))

    profile = build_profile(
        model,
        model_config.monitoring,
        forward_batches(batches(), spec.argument),
        "resnet18",
        bins=model_config.monitoring.drift.bins,
    )
    out.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name first: an interrupted build leaves no profile to reuse.
    partial = profile.save(out / "partial.npz")
    partial.replace(out / PROFILE_FILE)
    return out


def _resnet_payloads() -> tuple[list[bytes], str]:
    rng = np.random.default_rng(0)
    bodies = [
        rng.standard_normal((3, 224, 224), dtype=np.float32).astype("<f4").tobytes()
        for _ in range(8)
    ]
    return bodies, "application/octet-stream"


def _text_archive(root: Path) -> zipfile.ZipFile:
    mar = root / "model_store" / "minilm.mar"
    if not mar.exists():
        raise FileNotFoundError(f"expected {mar} (run `make mar` first), found none")
    return zipfile.ZipFile(mar)


def _minilm_spec(root: Path, build: Path) -> Path:
    """The archive's model description: the worker builds the encoder from its archived
    pretrained directory, as it does when serving ``model_store/minilm.mar``."""
    build.mkdir(parents=True, exist_ok=True)
    out = build / MODEL_SPEC_FILE
    with _text_archive(root) as archive:
        out.write_bytes(archive.read(MODEL_SPEC_FILE))
    return out


def _minilm_extra(root: Path, build: Path) -> Path:
    """The pretrained directory and the drift profile, as ``model_store/minilm.mar`` has them."""
    out = build / "minilm-extra"
    if not out.exists():
        with _text_archive(root) as archive:
            for name in archive.namelist():
                if name.startswith("pretrained/") or name == "drift-profile.npz":
                    archive.extract(name, out)
    return out


def _minilm_payloads() -> tuple[list[bytes], str]:
    from hookwatch.tools.text.fortunes import read_category, split_texts

    texts = split_texts(read_category("computers")).held_out[:64]
    return [json.dumps(text).encode() for text in texts], "application/json"


MODELS: Mapping[str, ModelKind] = {
    "digits": ModelKind(
        "digits",
        "demo CNN, 8x8 input, JSON body (sub-millisecond forward)",
        "hookwatch.tools.demo.digits_cnn",
        "models/digits/model-config.yaml",
        _digits_weights,
        _digits_payloads,
        _digits_extra,
    ),
    "resnet18": ModelKind(
        "resnet18",
        "ResNet-18-class CNN, 3x224x224 input, float32 body (random weights)",
        "dev.bench.resnet",
        "models/resnet18/model-config.yaml",
        _resnet_weights,
        _resnet_payloads,
        _resnet_extra,
    ),
    "minilm": ModelKind(
        "minilm",
        "all-MiniLM-L6-v2 sentence encoder, held-out `computers` fortunes as JSON strings "
        "(token-aware hooks on its six blocks, drift profile loaded)",
        "models/minilm/model.py",
        "models/minilm/model-config.yaml",
        _minilm_spec,
        _minilm_payloads,
        _minilm_extra,
    ),
}


@dataclass(frozen=True)
class Group:
    """Variants of one model at one batch size (the bench's four): measured together, round by
    round."""

    model: str
    batch: int
    #: variant -> TorchServe model name (also its directory in the model store).
    names: Mapping[str, str]


def variant_config(
    base: Mapping[str, Any],
    variant: str,
    batch: int,
    default_caps: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """``base`` as ``variant`` at ``batch``; ``default_caps`` (``max_sampled_per_s``,
    ``max_overhead``) set in the ``default`` variant's monitoring, where a harness needs other
    caps than hookwatch's own."""
    config: dict[str, Any] = copy.deepcopy(dict(base))
    config["batchSize"] = batch
    monitoring = config.setdefault("handler", {}).setdefault("monitoring", {})
    if variant == "default":
        # hookwatch's own default, whatever the committed config tunes for its demo traffic.
        monitoring.pop("sample_rate", None)
        monitoring.update(default_caps or {})
    elif variant == "full":
        monitoring["sample_rate"] = 1.0
    return config


def build_group(
    root: Path,
    store: Path,
    build: Path,
    model: str,
    batch: int,
    variants: tuple[str, ...] = VARIANTS,
    handlers: Mapping[str, str] = HANDLERS,
    suffix: str = "",
    default_caps: Mapping[str, float] | None = None,
) -> Group:
    """Each of ``variants`` of ``model`` at ``batch`` as a model directory in ``store``, named
    ``<model>-b<batch>-<variant><suffix>``, its handler file (a path in the repository) from
    ``handlers``, its config from :func:`variant_config`."""
    kind = MODELS[model]
    archiver = shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent))
    if archiver is None:
        raise FileNotFoundError("expected torch-model-archiver beside the Python interpreter")
    build.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    weights = kind.weights(root, build)
    extra = kind.extra(root, build)
    if not (extra / PROFILE_FILE).is_file():
        raise FileNotFoundError(f"expected a drift profile {extra / PROFILE_FILE}, found none")
    base = yaml.safe_load((root / kind.config).read_text())
    names: dict[str, str] = {}
    for variant in variants:
        name = f"{model}-b{batch}-{variant}{suffix}"
        config_path = build / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(variant_config(base, variant, batch, default_caps)))
        shutil.rmtree(store / name, ignore_errors=True)
        subprocess.run(
            [
                archiver,
                "--model-name",
                name,
                "--version",
                "1.0",
                "--model-file",
                kind.model_path(root),
                "--serialized-file",
                str(weights),
                "--handler",
                str(root / handlers[variant]),
                "--config-file",
                str(config_path),
                "--export-path",
                str(store),
                "--archive-format",
                "no-archive",
                "--force",
                "--extra-files",
                ",".join([str(extra), *(str(root / f) for f in HANDLER_FILES.get(variant, ()))]),
            ],
            check=True,
        )
        names[variant] = name
    return Group(model, batch, names)


def torch_load_state(path: Path) -> Mapping[str, torch.Tensor]:
    state: Mapping[str, torch.Tensor] = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
    return state
