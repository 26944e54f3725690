"""A model that ends in a softmax or a sigmoid answers probabilities, not logits: read as
logits they went through a second softmax or sigmoid (a binary classifier's every answer class
1, a multi-label model's every label on, a classifier's probabilities flattened toward
uniform). ``output.probabilities`` reads them as the logits they stand for; ``init`` sets it
for a model ending in ``Softmax`` or ``Sigmoid``; ``archive`` refuses softmax rows under a
plain ``logits`` head."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from hookwatch._config import HandlerConfig, InputSpec, OutputSpec
from hookwatch._errors import ConfigError
from hookwatch._hooks import as_logits
from hookwatch._metrics import MetricSet
from hookwatch._profile import build_profile
from hookwatch._service import ModelService
from hookwatch.tools import own_model
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.unit.test_any_model import monitored, value


def test_probabilities_read_as_logits_give_the_same_probabilities_back() -> None:
    z = torch.randn(6, 4) * 3
    p = torch.softmax(z, dim=1)
    torch.testing.assert_close(torch.softmax(as_logits(p, "logits"), dim=1), p)
    q = torch.sigmoid(z)
    torch.testing.assert_close(torch.sigmoid(as_logits(q, "multilabel")), q, atol=1e-6, rtol=0)
    one = torch.sigmoid(z[:, :1])
    torch.testing.assert_close(as_logits(one, "logits"), z[:, :1], atol=1e-4, rtol=1e-4)
    # Saturated probabilities stay finite.
    assert torch.isfinite(as_logits(torch.tensor([[0.0, 1.0]]), "logits")).all()
    assert torch.isfinite(as_logits(torch.tensor([[0.0], [1.0]]), "logits")).all()


@pytest.mark.parametrize("head", ["values", "embedding", "none"])
def test_probabilities_are_for_class_heads_only(head: str) -> None:
    with pytest.raises(ConfigError, match="expected a logits or multilabel head"):
        OutputSpec(head=head, probabilities=True)


def test_a_sigmoid_ending_model_is_answered_as_its_probabilities_say() -> None:
    """Without the option a binary classifier's sigmoid answered class 1 for every input (its
    probability, read as a logit, is never negative), and a multi-label model turned every
    label on."""
    binary = nn.Sigmoid()  # the input is the logit: the answer's probability is known
    served = ModelService(
        binary, InputSpec(shape=(1,)), None, output=OutputSpec(probabilities=True)
    )
    answers = served.handle([{"data": [-2.0]}, {"data": [3.0]}])
    assert [a["class"] for a in answers] == [0, 1]
    assert answers[0]["probabilities"][1] == pytest.approx(float(torch.sigmoid(torch.tensor(-2.0))))
    unread = ModelService(binary, InputSpec(shape=(1,)), None, output=OutputSpec())
    assert [a["class"] for a in unread.handle([{"data": [-2.0]}, {"data": [3.0]}])] == [1, 1]
    multi = ModelService(
        nn.Sigmoid(),
        InputSpec(shape=(3,)),
        None,
        labels=["a", "b", "c"],
        output=OutputSpec(head="multilabel", probabilities=True),
    )
    (answer,) = multi.handle([{"data": [-3.0, 2.0, -0.5]}])
    assert answer["labels"] == ["b"]
    assert answer["probabilities"] == pytest.approx(
        torch.sigmoid(torch.tensor([-3, 2, -0.5])).tolist(), abs=1e-6
    )


def test_a_softmax_ending_model_is_watched_and_answered_on_its_probabilities(
    metrics: MetricSet,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.Softmax(dim=1)).eval()
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [4]},
            "monitoring": {
                "layers": ["1"],
                "sample_rate": 1.0,
                "output": {"probabilities": True},
                "drift": {"window": 20},
            },
        }
    )
    reference = [torch.randn(40, 4) for _ in range(3)]
    profile = build_profile(model, handler.monitoring, reference, "p")
    assert {"output", "confidence", "entropy", "class_mix"} <= set(profile.references)
    service, monitor = monitored(model, handler, profile, "p", metrics)
    x = torch.randn(45, 4)
    answers = service.handle([{"data": row.tolist()} for row in x])
    monitor.flush()
    monitor.close()
    with torch.inference_mode():
        expected = model(x)
    for answer, p in zip(answers, expected, strict=True):
        assert answer["probabilities"] == pytest.approx(p.tolist(), abs=1e-5)
        assert answer["class"] == int(p.argmax())
    assert value(metrics, "hookwatch_monitor_faults_total", model="p", layer="output") == 0
    windows = value(
        metrics,
        "hookwatch_drift_windows_total",
        model="p",
        detector="confidence",
        level="prediction",
    )
    assert windows >= 2


MODEL = (
    "import torch\nfrom torch import nn\n\n"
    "class Soft(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.fc = nn.Linear(4, 8)\n"
    "        self.act = nn.ReLU()\n"
    "        self.out = nn.Linear(8, 3)\n\n"
    "    def forward(self, x):\n"
    "        return torch.softmax(self.out(self.act(self.fc(x))), dim=1)  # no module to see\n"
)


def test_init_reads_the_last_module_and_archive_the_rows(tmp_path: Path) -> None:
    """`init` sees a final Softmax or Sigmoid module; a functional softmax it cannot see, so
    `archive` refuses softmax rows under a plain logits head, and takes them with the option."""
    ending = {
        "Softmax": (nn.Softmax(dim=1), 3, "logits"),
        "Sigmoid": (nn.Sigmoid(), 3, "multilabel"),
    }
    for name, (last, classes, head) in ending.items():
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, classes), last)
        rows = own_model.discover_layers(model, torch.rand(2, 4))
        assert own_model.final_activation(rows) == name
        written = own_model.init_config(rows, (4,), "float32", None, "m")
        assert f"output: {{head: {head}, probabilities: true}}" in written, written
        # The final activation is the output itself: not proposed as a hidden layer too.
        assert own_model.choose_layers(rows) == ["1"]
    binary = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())
    written = own_model.init_config(
        own_model.discover_layers(binary, torch.rand(2, 4)), (4,), "float32", None, "b"
    )
    assert "output: {head: logits, probabilities: true}" in written
    (tmp_path / "soft.py").write_text(MODEL)
    np.save(tmp_path / "ref.npy", np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32))
    for probabilities in (False, True):
        config = tmp_path / "model-config.yaml"
        output = {"head": "logits", "probabilities": probabilities}
        monitoring = {"layers": ["act"], "output": output}
        config.write_text(
            yaml.safe_dump({"handler": {"input": {"shape": [4]}, "monitoring": monitoring}})
        )

        def archive(config: Path = config) -> Path:
            return archive_model(
                ModelRef.parse(f"{tmp_path / 'soft.py'}:Soft"),
                "soft",
                config,
                tmp_path / "ref.npy",
                tmp_path / "store",
                tmp_path / "build",
                say=lambda _line: None,
            )

        if probabilities:
            assert archive().is_file()
        else:
            with pytest.raises(ConfigError, match=r"got probabilities .* set probabilities: true"):
                archive()
