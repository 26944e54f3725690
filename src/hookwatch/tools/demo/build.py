"""Train the demo CNN deterministically and archive it with torch-model-archiver."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from hookwatch.tools.assets import DEMO_MODEL_CONFIG
from hookwatch.tools.demo.data import DigitsSplit, load_split
from hookwatch.tools.demo.digits_cnn import DigitsCNN

MODEL_NAME = "digits"


#: Share of the training split held out of training to be the drift reference. A profile built
#: from training images describes an over-confident model (mean top probability 0.9995 on them
#: against 0.992 on held-out ones), so clean traffic would look drifted.
REFERENCE_FRACTION = 0.3


def reference_split(
    split: DigitsSplit, fraction: float = REFERENCE_FRACTION, seed: int = 0
) -> tuple[DigitsSplit, NDArray[np.float32], NDArray[np.int64]]:
    """The images the model is fitted on, and the held-out reference images and labels."""
    from sklearn.model_selection import train_test_split

    x_fit, x_ref, y_fit, y_ref = train_test_split(
        split.x_train, split.y_train, test_size=fraction, random_state=seed, stratify=split.y_train
    )
    return DigitsSplit(x_fit, y_fit, split.x_test, split.y_test), x_ref, y_ref


def train(split: DigitsSplit, epochs: int = 40, seed: int = 0) -> tuple[DigitsCNN, float]:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    model = DigitsCNN()
    x = torch.from_numpy(split.x_train)
    y = torch.from_numpy(split.y_train)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 64):
            index = order[start : start + 64]
            optimiser.zero_grad()
            loss_fn(model(x[index]), y[index]).backward()
            optimiser.step()
    model.eval()
    with torch.inference_mode():
        predicted = model(torch.from_numpy(split.x_test)).argmax(1).numpy()
    accuracy = float(np.mean(predicted == split.y_test))
    return model, accuracy


def archive(
    model: nn.Module,
    repo_root: Path,
    build_dir: Path,
    model_store: Path,
    extra_files: list[Path] | None = None,
    config: Path | None = None,
    model_name: str = MODEL_NAME,
) -> Path:
    build_dir.mkdir(parents=True, exist_ok=True)
    model_store.mkdir(parents=True, exist_ok=True)
    weights = build_dir / "digits_cnn.pt"
    torch.save(model.state_dict(), weights)
    config = config or DEMO_MODEL_CONFIG
    archiver = shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent))
    if archiver is None:
        raise FileNotFoundError("expected torch-model-archiver beside the Python interpreter")
    cmd = [
        archiver,
        "--model-name",
        model_name,
        "--version",
        "1.0",
        "--model-file",
        str(Path(__file__).with_name("digits_cnn.py")),
        "--serialized-file",
        str(weights),
        "--handler",
        str(_handler_file(build_dir)),
        "--config-file",
        str(config),
        "--export-path",
        str(model_store),
        "--force",
    ]
    if extra_files:
        cmd += ["--extra-files", ",".join(str(p) for p in extra_files)]
    subprocess.run(cmd, check=True)
    return model_store / f"{model_name}.mar"


def _handler_file(build_dir: Path) -> Path:
    """The handler file archived with the demo, as `hookwatch archive` writes one (the
    repository's handlers/hookwatch_handler.py is the same class; a wheel has no such file)."""
    from hookwatch.tools.own_model import HANDLER_SOURCE

    path = build_dir / "hookwatch_handler.py"
    path.write_text(HANDLER_SOURCE)
    return path


def build(repo_root: Path, build_dir: Path, model_store: Path) -> Path:
    started = time.perf_counter()
    split = load_split()
    fit, x_ref, y_ref = reference_split(split)
    model, accuracy = train(fit)
    print(
        f"digits CNN: held-out accuracy {accuracy:.2%} on {len(split.y_test)} images "
        f"(trained on {len(fit.y_train)} in {time.perf_counter() - started:.1f} s)"
    )
    if accuracy <= 0.97:
        raise RuntimeError(f"expected held-out accuracy > 97%, got {accuracy:.2%}")
    profile = build_reference_profile(model, DEMO_MODEL_CONFIG, x_ref, build_dir, y_ref)
    print(
        f"drift profile from {len(x_ref)} held-out reference images and their labels (the "
        f"accuracy estimate without labels): {profile}"
    )
    mar = archive(model, repo_root, build_dir, model_store, extra_files=[profile])
    print(f"archived {mar}")
    return mar


def build_reference_profile(
    model: nn.Module,
    config_path: Path,
    x_ref: NDArray[np.float32],
    build_dir: Path,
    y_ref: NDArray[np.int64] | None = None,
) -> Path:
    """Write the drift profile ``handler.monitoring`` of ``config_path`` asks for; with the
    reference's labels ``y_ref``, its accuracy estimator too."""
    from hookwatch import build_profile
    from hookwatch._config import read_model_config

    config = read_model_config(config_path).monitoring
    batches = [torch.from_numpy(x_ref[i : i + 256]) for i in range(0, len(x_ref), 256)]
    profile = build_profile(
        model, config, batches, MODEL_NAME, bins=config.drift.bins, labels=y_ref
    )
    return profile.save(build_dir / config.drift.profile)
