"""A forward of several tensors (``input.arguments``): ``forward(self, signal, lengths)`` served
from one JSON object with a field per argument, each declared, decoded and checked as a single
input is; reference data as an ``.npz`` with an array per argument or as request bodies;
``hookwatch layers`` and ``init`` from the config; a bad request answered 400 naming the
argument."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from hookwatch._config import HandlerConfig, InputSpec
from hookwatch._errors import BadInputError, ConfigError
from hookwatch._metrics import MetricSet
from hookwatch._profile import DriftProfile, build_profile
from hookwatch._service import ArgumentsPipeline, make_pipeline
from hookwatch.tools import cli
from hookwatch.tools.bench.ab import synthesize
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.fakes import archived_handler, handled
from tests.unit.test_any_model import monitored, value

#: A two-input model: a signal and its valid length (a mask built from it), as sequence
#: models with padding take them; class scores out.
MODEL = """\
import torch
from torch import nn


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(3, 8)
        self.act = nn.ReLU()
        self.out = nn.Linear(8, 4)

    def forward(self, signal, lengths):
        steps = torch.arange(signal.shape[1])[None, :]
        mask = (steps < lengths).unsqueeze(-1)
        h = self.act(self.proj(signal)) * mask
        return self.out(h.sum(1) / lengths.clamp(min=1))
"""

INPUT = {
    "arguments": {
        "signal": {"shape": [5, 3], "min": -10, "max": 10},
        "lengths": {"shape": [1], "dtype": "int64", "min": 1, "max": 5},
    }
}


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "model-config.yaml"
    monitoring = {"layers": ["act"], "output": {"head": "logits"}, "drift": {"window": 50}}
    handler = {"input": INPUT, "monitoring": monitoring}
    # In the declared order: the input detector watches the first argument.
    config.write_text(yaml.safe_dump({"handler": handler}, sort_keys=False))
    return config


def _reference(n: int = 200) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "signal": rng.normal(size=(n, 5, 3)).astype(np.float32),
        "lengths": rng.integers(1, 6, size=(n, 1)),
    }


def _body(signal: Any, lengths: Any) -> dict[str, Any]:
    return {"signal": signal, "lengths": lengths}


def test_each_argument_is_decoded_and_checked_as_declared() -> None:
    pipeline = make_pipeline(InputSpec.from_mapping(INPUT))
    assert isinstance(pipeline, ArgumentsPipeline)
    item = pipeline.decode(_body([[0.5, 1, 2]] * 5, [3]))
    assert item["signal"].shape == (5, 3) and item["lengths"].tolist() == [3]
    batch = pipeline.batch([item, item])
    assert batch["signal"].shape == (2, 5, 3) and batch["lengths"].dtype.is_floating_point is False
    cases = [
        ({"signal": [[0.5, 1, 2]] * 5}, "missing_field", '"lengths": <1 numbers>'),
        (_body([[0.5, 1, 2]] * 4, [3]), "wrong_shape", "signal: shape [5, 3]"),
        (_body([[0.5, 1, 2]] * 5, [9]), "out_of_range", "lengths: values in [1, 5]"),
        (_body([[0.5, 1, 2]] * 5, [2.5]), "wrong_type", "lengths: whole numbers"),
        # No object at all: an empty batch reached the forward, a 503 (an outside run's `[]`,
        # 2026-12-07); an empty `instances` said only "an object with keys [instances]".
        ([], "wrong_shape", '"lengths": <1 numbers>'),
        ({"instances": []}, "wrong_shape", '"lengths": <1 numbers>'),
    ]
    for body, reason, expected in cases:
        with pytest.raises(BadInputError) as raised:
            pipeline.decode(body)
        assert raised.value.status == 400
        assert raised.value.reason == reason, raised.value
        assert expected in raised.value.expected, raised.value
        assert reason != "wrong_shape" or body != [] or raised.value.got == "an empty list"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"arguments": {}}, "input.arguments: expected a mapping of forward()'s keyword"),
        ({"arguments": {"x": {"shape": [2]}}, "shape": [2]}, "got also ['shape']"),
        ({"arguments": {"x": {"shape": [2], "argument": "y"}}}, "got also ['argument']"),
        ({"arguments": {"x": {"shape": [0]}}}, "input.arguments.x.shape: expected a list"),
        ({"arguments": {"x-1": {"shape": [2]}}}, "expected keyword argument names"),
    ],
)
def test_a_bad_declaration_is_one_line(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        InputSpec.from_mapping(raw)
    assert message in str(raised.value) and "\n" not in str(raised.value)


Archive = Callable[[Path], Path]


@pytest.fixture
def archive(tmp_path: Path) -> Archive:
    (tmp_path / "masked.py").write_text(MODEL)
    config = _config(tmp_path)

    def run(reference: Path) -> Path:
        return archive_model(
            ModelRef.parse(f"{tmp_path / 'masked.py'}:Masked"),
            "masked",
            config,
            reference,
            tmp_path / "store",
            tmp_path / "build",
            say=lambda _line: None,
        )

    return run


def test_archived_from_an_npz_and_served(archive: Archive, tmp_path: Path) -> None:
    np.savez(tmp_path / "ref.npz", **_reference())
    mar = archive(tmp_path / "ref.npz")
    with archived_handler(mar, tmp_path / "served") as (handler, context):
        profile = DriftProfile.load(tmp_path / "served" / "drift-profile.npz")
        # The input detector watches both arguments side by side: 15 values of the signal
        # and the length.
        assert {"input", "act", "output"} <= set(profile.references)
        watched = profile.references["input"]
        assert watched.n_features + len(watched.dropped) == 16
        good = _body([[0.5, 1, 2]] * 5, [2])
        bad = _body([[0.5, 1, 2]] * 5, [0])
        answers = handled(handler, [{"body": good}, {"body": bad}, {"body": good}], context)
        assert answers[0] == answers[2] and len(answers[0]["probabilities"]) == 4
        assert answers[1]["code"] == 400 and answers[1]["expected"].startswith("lengths: ")
        # The length reaches the forward: padding past it does not change the answer.
        padded = _body([[0.5, 1, 2]] * 2 + [[9, 9, 9]] * 3, [2])
        assert handled(handler, [{"body": padded}], context)[0] == answers[0]


def test_a_jsonl_reference_is_decoded_as_requests(archive: Archive, tmp_path: Path) -> None:
    ref = _reference(120)
    lines = [
        json.dumps(_body(s.tolist(), n.tolist()))
        for s, n in zip(ref["signal"], ref["lengths"], strict=True)
    ]
    (tmp_path / "ref.jsonl").write_text("\n".join(lines) + "\n")
    assert archive(tmp_path / "ref.jsonl").is_file()


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"signal": _reference()["signal"]}, "expected arrays named signal, lengths in ref.npz"),
        (
            {"signal": _reference()["signal"], "lengths": _reference(150)["lengths"]},
            "expected as many samples in every argument's array, got signal 200, lengths 150",
        ),
        (
            {"signal": _reference()["signal"], "lengths": _reference()["lengths"] + 10},
            "reference lengths: expected values in [1, 5] (input.arguments.lengths)",
        ),
    ],
)
def test_a_bad_reference_is_one_line(
    archive: Archive, tmp_path: Path, arrays: dict[str, np.ndarray], message: str
) -> None:
    np.savez(tmp_path / "ref.npz", **arrays)
    with pytest.raises(ConfigError) as raised:
        archive(tmp_path / "ref.npz")
    assert message in str(raised.value)


def test_one_array_for_several_arguments_is_refused(archive: Archive, tmp_path: Path) -> None:
    np.save(tmp_path / "ref.npy", _reference()["signal"])
    with pytest.raises(
        ConfigError,
        match=r"expected an \.npz \(or a \.pt of a dict of tensors\) with an array per argument",
    ):
        archive(tmp_path / "ref.npy")


def test_layers_and_init_take_the_arguments_from_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "masked.py").write_text(MODEL)
    config = _config(tmp_path)
    assert cli.main(["layers", "masked.py:Masked", "--config", str(config)]) == 0
    listed = capsys.readouterr().out
    assert "act" in listed and "proj" in listed
    # The input row is what the hooks read: both arguments, side by side.
    (input_row,) = [line for line in listed.splitlines() if line.startswith("input ")]
    assert "5x3, 1" in input_row and input_row.split()[-1] == "16", input_row
    out = tmp_path / "written.yaml"
    # TorchServe's keys of the config are kept (they were written over with init's own).
    given = yaml.safe_load(config.read_text())
    config.write_text(
        yaml.safe_dump({"batchSize": 8, "maxBatchDelay": 20, **given}, sort_keys=False)
    )
    assert cli.main(["init", "masked.py:Masked", "--config", str(config), "--out", str(out)]) == 0
    written = yaml.safe_load(out.read_text())
    assert InputSpec.from_mapping(written["handler"]["input"]) == InputSpec.from_mapping(INPUT)
    assert (written["batchSize"], written["maxBatchDelay"], written["responseTimeout"]) == (
        8,
        20,
        30,
    )


def test_the_bench_synthesizes_a_field_per_argument() -> None:
    bodies = [json.loads(b) for b in synthesize(InputSpec.from_mapping(INPUT), count=20)]
    pipeline = make_pipeline(InputSpec.from_mapping(INPUT))
    for body in bodies:
        pipeline.decode(body)  # every synthesized body is one the model takes
    assert {tuple(b["lengths"]) for b in bodies} <= {(1,), (2,), (3,), (4,), (5,)}


def test_every_sampled_request_is_captured_at_every_hook_point(metrics: MetricSet) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(MODEL, "masked.py", "exec"), namespace)
    model = namespace["Masked"]().eval()
    handler = HandlerConfig.from_mapping(
        {"input": INPUT, "monitoring": {"layers": ["act"], "sample_rate": 1.0}}
    )
    ref = _reference(64)
    reference = [{k: torch.from_numpy(v[i : i + 32]) for k, v in ref.items()} for i in (0, 32)]
    profile = build_profile(model, handler.monitoring, reference, "m")
    service, monitor = monitored(model, handler, profile, "m", metrics)
    body = _body([[0.5, 1, 2]] * 5, [3])
    answers = service.handle([body] * 12)
    monitor.flush()
    monitor.close()
    assert all("probabilities" in a for a in answers)
    for layer in ("input", "act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="m", layer=layer) == 12
        assert value(metrics, "hookwatch_monitor_faults_total", model="m", layer=layer) == 0


def test_an_argument_the_model_wants_as_integers_is_named(tmp_path: Path) -> None:
    (tmp_path / "emb.py").write_text(
        "from torch import nn\n\n"
        "class Emb(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(10, 4)\n"
        "        self.act = nn.ReLU()\n"
        "        self.fc = nn.Linear(4, 3)\n\n"
        "    def forward(self, ids, weight):\n"
        "        return self.fc(self.act(self.emb(ids).mean(1) * weight))\n"
    )
    declared = {"ids": {"shape": [3], "min": 0, "max": 9}, "weight": {"shape": [1]}}
    config = tmp_path / "model-config.yaml"
    handler = {"input": {"arguments": declared}, "monitoring": {"layers": ["act"]}}
    config.write_text(yaml.safe_dump({"handler": handler}, sort_keys=False))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ref.npz", ids=rng.integers(0, 10, (40, 3)), weight=rng.random((40, 1)))
    with pytest.raises(ConfigError, match=r"try dtype: int64 for ids in input\.arguments$"):
        archive_model(
            ModelRef.parse(f"{tmp_path / 'emb.py'}:Emb"),
            "emb",
            config,
            tmp_path / "ref.npz",
            tmp_path / "store",
            tmp_path / "build",
            say=lambda _line: None,
        )


def test_a_packed_sequence_is_watched_as_each_sequences_mean_over_its_steps() -> None:
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence

    from hookwatch._profile.builder import capture_features

    class Packed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.gru = nn.GRU(3, 6, batch_first=True)
            self.fc = nn.Linear(6, 2)

        def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            _, last = self.gru(packed)
            return self.fc(last[-1])

    model = Packed().eval()
    x, lengths = torch.randn(5, 7, 3), torch.tensor([7, 2, 5, 1, 3])
    config = HandlerConfig.from_mapping(
        {"input": {"shape": [7, 3]}, "monitoring": {"layers": ["gru"]}}
    ).monitoring
    (features,) = capture_features(model, config, [{"x": x, "lengths": lengths}])
    with torch.no_grad():
        expected = [model.gru(x[i : i + 1, : int(n)])[0][0].mean(0) for i, n in enumerate(lengths)]
    # One row per sample, in the batch's order, each its own steps' mean (no padding in it).
    np.testing.assert_allclose(features["gru"], torch.stack(expected).numpy(), atol=1e-5)


def test_a_shift_in_the_second_argument_alone_moves_the_input_detector(
    metrics: MetricSet,
) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(MODEL, "masked.py", "exec"), namespace)
    model = namespace["Masked"]().eval()
    handler = HandlerConfig.from_mapping(
        {
            "input": INPUT,
            "monitoring": {"layers": ["act"], "sample_rate": 1.0, "drift": {"window": 50}},
        }
    )
    ref = _reference(600)
    reference = [
        {k: torch.from_numpy(v[i : i + 100]) for k, v in ref.items()} for i in range(0, 600, 100)
    ]
    profile = build_profile(model, handler.monitoring, reference, "m")
    service, monitor = monitored(model, handler, profile, "m", metrics)
    # The signals as the reference's, every length 5 (the reference's run from 1 to 5).
    fresh = _reference(300)
    for i in range(0, 300, 10):
        service.handle([_body(s.tolist(), [5]) for s in fresh["signal"][i : i + 10]])
    monitor.flush()
    monitor.close()
    alarms = value(
        metrics, "hookwatch_drift_alarms_total", model="m", level="input", detector="input"
    )
    assert alarms > 0


def test_one_tensor_for_a_forward_of_two_says_how_to_declare_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "masked.py").write_text(MODEL)
    assert cli.main(["layers", "masked.py:Masked", "--input-shape", "5,3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "missing 1 required positional argument: 'lengths'" in err[0]
    assert (
        "a forward of several tensors (signal, lengths) takes each as declared under "
        "input.arguments in a model-config (--config), a JSON field each; "
    ) in err[0]
    # A lengths argument: the sequence model may take inputs of any length instead.
    assert err[0].endswith(
        "for inputs of any length given their lengths, input.shape with a null, max_length "
        "and lengths: lengths"
    )


def test_each_argument_is_read_as_a_lone_input_would_be_then_side_by_side() -> None:
    from hookwatch._hooks import joined_inputs

    image, meta = torch.rand(2, 3, 32, 32), torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    joined = joined_inputs({"image": image, "meta": meta}, max_features=256)
    assert joined is not None and joined.dtype == torch.float32
    # A large map by its channels' means (3), a small input whole (4).
    torch.testing.assert_close(joined[:, :3], image.mean(dim=(2, 3)))
    assert joined[:, 3:].tolist() == meta.float().tolist()
    small = torch.rand(2, 2, 3)
    assert joined_inputs({"a": small, "b": meta}).shape == (2, 6 + 4)
    # Two maps that each fit the width but not side by side: each by its channels' means
    # (joined whole, 6144 values under a width of 4096, the second image's most was cut off
    # and its drift never seen: an outside run's two-image model, 2026-12-07).
    pair = joined_inputs({"a": image, "b": image.flip(1)}, max_features=4096)
    assert pair is not None and pair.shape == (2, 6)
    torch.testing.assert_close(pair[:, 3:], image.flip(1).mean(dim=(2, 3)))
    assert joined_inputs({"a": image, "b": image}, max_features=8192).shape == (2, 6144)
    # One tensor is the input as it is; arguments without the batch first, the first one.
    assert joined_inputs({"image": image}) is image
    assert joined_inputs({"a": small, "b": torch.rand(3, 4)}) is small


#: The same model taking its tensors as one dict, as training code written around a data
#: loader's batch often does: forward(self, batch) reading batch["signal"].
PACKED_MODEL = MODEL.replace(
    "def forward(self, signal, lengths):",
    "def forward(self, batch):\n        signal, lengths = batch['signal'], batch['lengths']",
)


def test_the_arguments_go_together_as_one_dict_under_input_argument(tmp_path: Path) -> None:
    """``input.argument`` beside ``input.arguments``: the forward gets one dict under that
    keyword (a forward(batch) was refused: "unexpected keyword argument 'signal'", and
    `argument` beside `arguments` was a config error). The input detector reads the dict's
    tensors side by side as it reads separate arguments; answers are the unpacked model's."""
    # Apart: each archive checks that its model imports nothing else from its directory.
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "packed.py").write_text(PACKED_MODEL)
    (tmp_path / "masked.py").write_text(MODEL)
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"handler": {"input": {**INPUT, "argument": "batch"}}}))
    code = cli.main(["init", f"{tmp_path / 'p' / 'packed.py'}:Masked", "--config", str(base),
                     "--out", str(tmp_path / "packed-config.yaml")])  # fmt: skip
    assert code == 0
    written = (tmp_path / "packed-config.yaml").read_text()
    assert "argument: batch" in written
    handler = HandlerConfig.from_mapping(yaml.safe_load(written)["handler"])
    assert handler.input.argument == "batch" and len(handler.input.arguments) == 2
    np.savez(tmp_path / "ref.npz", **_reference())
    mars = {}
    models = {"packed": tmp_path / "p" / "packed.py", "masked": tmp_path / "masked.py"}
    configs = {"packed": tmp_path / "packed-config.yaml", "masked": _config(tmp_path)}
    for name, file in models.items():
        mars[name] = archive_model(
            ModelRef.parse(f"{file}:Masked"),
            name,
            configs[name],
            tmp_path / "ref.npz",
            tmp_path / f"store-{name}",
            tmp_path / f"build-{name}",
            say=lambda _line: None,
        )
    bodies = [{"body": _body([[0.5, 1, 2]] * 5, [n])} for n in (1, 3, 5)]
    answers = {}
    for name, mar in mars.items():
        with archived_handler(mar, tmp_path / f"served-{name}") as (served, context):
            profile = DriftProfile.load(tmp_path / f"served-{name}" / "drift-profile.npz")
            watched = profile.references["input"]
            assert watched.n_features + len(watched.dropped) == 16, name
            answers[name] = handled(served, bodies, context)
    assert answers["packed"] == answers["masked"]
