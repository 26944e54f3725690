"""A binary classifier with one logit a sample (``[B, 1]``, or squeezed to ``[B]``: the form
``BCEWithLogitsLoss`` trains) under ``head: logits``: archived with reference labels, served
with an answer like any classifier's, and read as two classes by every detector and the
accuracy estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hookwatch._drift import AccuracyEstimator, class_logits, derive, softmax
from hookwatch._errors import ConfigError
from hookwatch._profile import DriftProfile
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.fakes import archived_handler, handled

MODEL = (
    "import torch\nfrom torch import nn\n\n"
    "class Fraud(nn.Module):\n"
    "    def __init__(self, squeeze=False):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.squeeze = squeeze\n"
    "        self.fc = nn.Linear(6, 16)\n"
    "        self.act = nn.ReLU()\n"
    "        self.out = nn.Linear(16, 1)\n"
    "        with torch.no_grad():\n"
    "            self.fc.weight.zero_(); self.fc.bias.zero_()\n"
    "            self.fc.weight[0, 0] = 1.0; self.fc.weight[1, 0] = -1.0\n"
    "            self.out.weight.zero_(); self.out.bias.zero_()\n"
    "            self.out.weight[0, 0] = 4.0; self.out.weight[0, 1] = -4.0\n\n"
    "    def forward(self, x):\n"
    "        z = self.out(self.act(self.fc(x)))\n"
    "        return z.squeeze(-1) if self.squeeze else z\n"
)


def _archive(tmp_path: Path, model: str, **options: Any) -> Path:
    """``hookwatch archive`` of ``model`` (``file.py:Class`` in ``tmp_path``) with the
    ``model-config.yaml`` and ``ref.npy`` there."""
    name = model.split(".")[0]
    return archive_model(
        ModelRef.parse(f"{tmp_path / model}"),
        name,
        tmp_path / "model-config.yaml",
        tmp_path / "ref.npy",
        tmp_path / "store",
        tmp_path / "build",
        **({"say": lambda _line: None} | options),
    )


def _inputs(n: int = 300, shift: float = 0.0) -> np.ndarray:
    x = np.random.default_rng(0).normal(size=(n, 6)).astype(np.float32)
    x[:, 0] += shift
    return x


def test_one_logit_reads_as_two_classes() -> None:
    z = np.array([[-2.0], [0.0], [3.0]])
    two = class_logits(z)
    assert two.shape == (3, 2)
    p = softmax(two)
    np.testing.assert_allclose(p[:, 1], 1 / (1 + np.exp(-z[:, 0])))
    derived = derive("output", z)
    assert derived["class_mix"][:, 0].tolist() == [0.0, 0.0, 1.0]
    np.testing.assert_allclose(derived["confidence"][:, 0], p.max(axis=1))
    # Wider logits are untouched.
    wide = np.array([[1.0, 2.0, 3.0]])
    assert class_logits(wide).tolist() == wide.tolist()


def test_the_accuracy_estimate_takes_one_logit() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 4))
    y = (x[:, 0] > 0).astype(np.int64)
    z = 3 * x[:, :1]  # the model: right wherever x0's sign decides
    est = AccuracyEstimator.fit(x, z, y, k=5)
    assert est.classes == 2 and est.reference_accuracy == 1.0
    wrong = est.estimate(x[:100], -z[:100])  # the same inputs, every prediction flipped
    right = est.estimate(x[:100], z[:100])
    assert right.estimated_accuracy > 0.8 > 0.2 > wrong.estimated_accuracy


@pytest.mark.parametrize("squeeze", [False, True], ids=["B,1", "B"])
def test_archived_served_and_estimated(tmp_path: Path, squeeze: bool) -> None:
    (tmp_path / "fraud.py").write_text(MODEL)
    config = tmp_path / "model-config.yaml"
    handler_config = {
        "input": {"shape": [6]},
        "labels": ["legit", "fraud"],
        "monitoring": {"layers": ["act"], "output": {"head": "logits"}, "drift": {"window": 50}},
    }
    config.write_text(yaml.safe_dump({"handler": handler_config}))
    x = _inputs()
    np.save(tmp_path / "ref.npy", x)
    np.save(tmp_path / "y.npy", (x[:, 0] > 0).astype(np.int64))
    said: list[str] = []
    mar = _archive(
        tmp_path,
        "fraud.py:Fraud",
        args={"squeeze": squeeze},
        say=said.append,
        labels=tmp_path / "y.npy",
    )
    with archived_handler(mar, tmp_path / "served") as (handler, context):
        profile = DriftProfile.load(tmp_path / "served" / "drift-profile.npz")
        assert profile.accuracy is not None and profile.accuracy.classes == 2
        assert profile.accuracy.reference_accuracy == 1.0
        assert {"confidence", "entropy", "class_mix"} <= set(profile.references)
        answers = handled(
            handler,
            [{"body": {"data": [2.0, 0, 0, 0, 0, 0]}}, {"body": {"data": [-2.0, 0, 0, 0, 0, 0]}}],
            context,
        )
        assert [a["class"] for a in answers] == ["fraud", "legit"]
        for answer in answers:
            assert len(answer["probabilities"]) == 2
            assert answer["probabilities"][0] + answer["probabilities"][1] == pytest.approx(1.0)
        assert answers[0]["probabilities"][1] == pytest.approx(1 / (1 + np.exp(-8.0)), abs=1e-6)


def test_one_logit_per_position_is_still_refused(tmp_path: Path) -> None:
    (tmp_path / "seq.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Seq(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.act = nn.ReLU()\n"
        "        self.out = nn.Linear(6, 1)\n\n"
        "    def forward(self, x):\n"
        "        return self.out(self.act(x))\n"
    )
    config = tmp_path / "model-config.yaml"
    monitoring = {"layers": ["act"], "output": {"head": "logits"}}
    config.write_text(
        yaml.safe_dump({"handler": {"input": {"shape": [5, 6]}, "monitoring": monitoring}})
    )
    np.save(tmp_path / "ref.npy", np.zeros((60, 5, 6), np.float32) + _inputs(60)[:, None, :])
    with pytest.raises(ConfigError, match="one binary logit a sample"):
        _archive(tmp_path, "seq.py:Seq")


@pytest.mark.parametrize(("names", "classes"), [(["legit"], 2), (["a", "b", "c"], 2)])
def test_class_names_that_do_not_match_the_classes_are_refused(
    tmp_path: Path, names: list[str], classes: int
) -> None:
    (tmp_path / "fraud.py").write_text(MODEL)
    config = tmp_path / "model-config.yaml"
    handler_config = {
        "input": {"shape": [6]},
        "labels": names,
        "monitoring": {"layers": ["act"], "output": {"head": "logits"}},
    }
    config.write_text(yaml.safe_dump({"handler": handler_config}))
    np.save(tmp_path / "ref.npy", _inputs())
    with pytest.raises(
        ConfigError, match=rf"^handler.labels: expected {classes} names .*, got {len(names)}$"
    ):
        _archive(tmp_path, "fraud.py:Fraud")


def test_per_class_statistics_go_to_the_class_the_logit_predicts() -> None:
    from hookwatch._monitor.processor import _Predictions
    from hookwatch._views import ClassSlots

    classes = ClassSlots.tracked([0, 1])
    logits = np.array([[-1.5], [2.0], [0.5], [np.nan]], dtype=np.float32)
    predicted = _Predictions.of(1, np.array([0]), [4], logits, classes)
    assert predicted.slots.tolist() == [*classes.slots(np.array([0, 1, 1])).tolist(), -1]


@pytest.mark.parametrize("squeeze", [False, True], ids=["B,1", "B"])
def test_init_proposes_values_and_names_logits_for_a_binary_classifier(
    tmp_path: Path, squeeze: bool
) -> None:
    import torch

    from hookwatch.tools.own_model import discover_layers, init_config

    namespace: dict[str, Any] = {}
    exec(compile(MODEL, "fraud.py", "exec"), namespace)
    model = namespace["Fraud"](squeeze=squeeze).eval()
    written = init_config(discover_layers(model, torch.zeros(2, 6)), [6], "float32", None, "f")
    assert "a binary classifier's\n    # logit (logits: class 1 where it is positive" in written
    assert yaml.safe_load(written)["handler"]["monitoring"]["output"] == {"head": "values"}
