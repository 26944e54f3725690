"""Weights files: what load_state takes (any state_dict, an empty one too) and refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hookwatch._errors import ConfigError
from hookwatch._model import ModelSpec, build_model, load_state


class Echo(nn.Module):
    """No parameters at all: its state_dict is empty."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float64)


def test_a_parameter_free_model_s_empty_state_dict_loads(tmp_path: Path) -> None:
    torch.save(Echo().state_dict(), tmp_path / "weights.pt")  # an empty OrderedDict
    torch.save({"state_dict": {}}, tmp_path / "ckpt.pt")
    for name in ("weights.pt", "ckpt.pt"):
        assert load_state(tmp_path / name) == {}
    # As the served handler builds it: the model file beside its (empty) weights.
    (tmp_path / "model.py").write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Echo(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x.to(torch.float64)\n\n\n"
        "def build():\n"
        "    return Echo()\n"
    )
    spec = ModelSpec("factory", "model.py", "build", weights="weights.pt")
    model = build_model(spec, tmp_path)
    assert torch.equal(model(torch.ones(2, 3)), torch.ones(2, 3, dtype=torch.float64))


@pytest.mark.parametrize(
    "content", [[1, 2, 3], torch.zeros(3), {"epoch": 3, "lr": 0.1}, {1: torch.zeros(1)}]
)
def test_a_file_that_is_no_state_dict_is_still_refused(tmp_path: Path, content: object) -> None:
    torch.save(content, tmp_path / "weights.pt")
    with pytest.raises(ConfigError, match="expected a state_dict"):
        load_state(tmp_path / "weights.pt")


def test_a_factory_returning_a_compiled_model_loads_its_own_weights(tmp_path: Path) -> None:
    """`hookwatch archive` saves a compiled model's state_dict (`_orig_mod.` names); the
    served handler builds the same compiled model and must load them into the module inside."""
    (tmp_path / "model.py").write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.compile(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))\n"
    )
    spec = ModelSpec("factory", "model.py", "build", weights="weights.pt")
    torch.manual_seed(1)
    saved = torch.compile(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    torch.save(saved.state_dict(), tmp_path / "weights.pt")
    assert all(k.startswith("_orig_mod.") for k in saved.state_dict())
    model = build_model(spec, tmp_path)
    loaded = model.state_dict()
    assert loaded.keys() == saved.state_dict().keys()
    assert all(torch.equal(loaded[k], v) for k, v in saved.state_dict().items())
