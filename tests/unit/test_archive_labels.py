"""``hookwatch archive`` with reference labels: where they come from, the accuracy estimator
in the archived profile, a worker that loads it, and one line for every bad input (issue 29)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from hookwatch._errors import ConfigError
from hookwatch._profile import DriftProfile
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.fakes import archived_handler, handled
from tests.unit.test_variable_length import _model_class

MODEL = (
    "import torch\nfrom torch import nn\n\n"
    "class Tiny(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.fc = nn.Linear(6, 16)\n"
    "        self.act = nn.ReLU()\n"
    "        self.out = nn.Linear(16, 3)\n\n"
    "    def forward(self, x):\n"
    "        return self.out(self.act(self.fc(x)))\n"
)

Archive = Callable[..., tuple[Path, list[str]]]


@pytest.fixture
def archive(tmp_path: Path) -> Archive:
    """``archive(reference, labels=None, head="logits")``: the .mar and what it said."""
    (tmp_path / "tiny.py").write_text(MODEL)

    def run(
        reference: Path,
        labels: Path | None = None,
        head: str = "logits",
        **more: object,
    ) -> tuple[Path, list[str]]:
        config = tmp_path / f"model-config-{head}.yaml"
        monitoring = {"layers": ["act"], "output": {"head": head}, "drift": {"window": 50}}
        monitoring.update(more)
        config.write_text(
            yaml.safe_dump({"handler": {"input": {"shape": [6]}, "monitoring": monitoring}})
        )
        said: list[str] = []
        mar = archive_model(
            ModelRef.parse(f"{tmp_path / 'tiny.py'}:Tiny"),
            "tiny",
            config,
            reference,
            tmp_path / "store",
            tmp_path / "build",
            say=said.append,
            labels=labels,
        )
        return mar, said

    return run


def _inputs(n: int = 200) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, 6)).astype(np.float32)


def _labels(n: int = 200) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 3, size=n)


def _profile(mar: Path, into: Path) -> DriftProfile:
    with zipfile.ZipFile(mar) as archived:
        archived.extractall(into)
    return DriftProfile.load(into / "drift-profile.npz")


def test_labels_file_gives_the_archived_profile_an_estimator_a_worker_loads(
    archive: Archive, tmp_path: Path
) -> None:
    reference, labels = tmp_path / "ref.npy", tmp_path / "labels.npy"
    np.save(reference, _inputs())
    np.save(labels, _labels())
    mar, said = archive(reference, labels)
    assert any("accuracy estimate from" in line and "layer act" in line for line in said), said
    with archived_handler(mar, tmp_path / "extracted") as (handler, context):
        profile = DriftProfile.load(tmp_path / "extracted" / "drift-profile.npz")
        assert profile.accuracy is not None and profile.accuracy_layer == "act"
        handled(handler, [{"body": {"data": [0.5] * 6}}], context)
        drift = handler.service.monitor._drift
        assert drift is not None and drift.accuracy is not None


def test_labels_beside_the_inputs_in_the_npz_or_the_jsonl(archive: Archive, tmp_path: Path) -> None:
    npz = tmp_path / "ref.npz"
    np.savez(npz, y=_labels(), x=_inputs())  # `y` first: the inputs are still found
    mar, said = archive(npz)
    assert _profile(mar, tmp_path / "a").accuracy is not None
    assert any("the 'y' array of ref.npz" in line for line in said), said
    jsonl = tmp_path / "ref.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps({"data": row.tolist(), "label": int(y)}) + "\n"
            for row, y in zip(_inputs(), _labels(), strict=True)
        )
    )
    mar, _ = archive(jsonl)
    assert _profile(mar, tmp_path / "b").accuracy is not None


def test_without_labels_it_is_as_before_and_says_so(archive: Archive, tmp_path: Path) -> None:
    reference = tmp_path / "ref.npy"
    np.save(reference, _inputs())
    mar, said = archive(reference)
    assert _profile(mar, tmp_path / "a").accuracy is None
    assert sum("no reference labels" in line for line in said) == 1


def test_harm_disabled_leaves_the_labels_unused(archive: Archive, tmp_path: Path) -> None:
    # `monitoring.harm.enabled: false` ("no accuracy estimate even with a labelled
    # reference") was ignored by archive: it said the model pages on harm, and a model with no
    # hidden layer watched (a TorchScript file's) was refused for want of one (an outside
    # run, 2026-12-07).
    npz = tmp_path / "ref.npz"
    np.savez(npz, x=_inputs(), y=_labels())
    for layers in (["act"], []):
        mar, said = archive(npz, harm={"enabled": False}, layers=layers)
        assert _profile(mar, tmp_path / f"p{len(layers)}").accuracy is None
        assert any("left unused: monitoring.harm.enabled is false" in line for line in said)
        assert not any("pages on harm" in line for line in said), said


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (_labels(199), "expected 200 labels (one per reference sample), got 199"),
        (_labels().astype(np.float64), "expected integer class labels"),
        (_labels()[:, None], "expected a 1-D array of class labels [N], got shape [200, 1]"),
        (np.full(200, 5), "expected labels in [0, 3) (the logits' classes)"),
    ],
)
def test_bad_labels_are_one_line(
    archive: Archive, tmp_path: Path, labels: np.ndarray, expected: str
) -> None:
    reference, path = tmp_path / "ref.npy", tmp_path / "labels.npy"
    np.save(reference, _inputs())
    np.save(path, labels)
    with pytest.raises(ConfigError) as raised:
        archive(reference, path)
    message = str(raised.value)
    assert expected in message and "\n" not in message, message


def test_labels_for_a_head_that_is_not_logits_are_refused(archive: Archive, tmp_path: Path) -> None:
    reference, path = tmp_path / "ref.npy", tmp_path / "labels.npy"
    np.save(reference, _inputs())
    np.save(path, _labels())
    with pytest.raises(ConfigError, match=r"expected a model whose monitoring\.output\.head is"):
        archive(reference, path, head="values")


def test_a_labels_file_that_is_not_numpy_is_refused(archive: Archive, tmp_path: Path) -> None:
    reference, path = tmp_path / "ref.npy", tmp_path / "labels.csv"
    np.save(reference, _inputs())
    path.write_text("0,1,2\n")
    with pytest.raises(
        ConfigError, match=r"--reference-labels: expected a \.npy, \.npz or \.pt file"
    ):
        archive(reference, path)


def test_jsonl_labels_on_some_lines_only_are_refused(archive: Archive, tmp_path: Path) -> None:
    jsonl = tmp_path / "ref.jsonl"
    lines = [{"data": row.tolist()} for row in _inputs(10)]
    lines[0]["label"] = 1
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ConfigError, match=r"expected a label on every line \(or on none\), got 1"):
        archive(jsonl)


def test_the_command_line_takes_reference_labels_and_words_a_mistake(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookwatch.tools import cli

    monkeypatch.delenv("HOOKWATCH_DEBUG", raising=False)
    (tmp_path / "tiny.py").write_text(MODEL)
    config = tmp_path / "model-config.yaml"
    monitoring = {"layers": ["act"], "drift": {"window": 50}}
    config.write_text(
        yaml.safe_dump({"handler": {"input": {"shape": [6]}, "monitoring": monitoring}})
    )
    reference, labels = tmp_path / "ref.npy", tmp_path / "labels.npy"
    np.save(reference, _inputs())
    np.save(labels, _labels(150))
    base = [
        "archive", f"{tmp_path / 'tiny.py'}:Tiny", "--name", "tiny", "--config", str(config),
        "--reference", str(reference), "--out", str(tmp_path / "store"),
        "--build", str(tmp_path / "build"),
    ]  # fmt: skip

    def run(*extra: str) -> tuple[int, str]:
        capsys.readouterr()
        try:
            code = cli.main([*base, *extra])
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        return code, capsys.readouterr().err

    code, err = run("--reference-labels", str(tmp_path / "none.npy"))
    assert code == 2 and "expected the reference's class labels (.npy or .pt)" in err
    assert len(err.strip().splitlines()) == 1, err
    code, err = run("--reference-labels", str(labels))
    assert code == 2, err
    assert "expected 200 labels (one per reference sample), got 150" in err
    assert len(err.strip().splitlines()) == 1, err
    np.save(labels, _labels())
    code, err = run("--reference-labels", str(labels))
    assert code == 0, err


def test_the_command_line_leaves_only_the_mar_without_a_build_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookwatch.tools import cli

    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(MODEL)
    config = yaml.safe_dump(
        {"handler": {"input": {"shape": [6]}, "monitoring": {"layers": ["act"]}}}
    )
    (work / "model-config.yaml").write_text(config)
    np.save(work / "ref.npy", _inputs())
    before = sorted(p.name for p in work.iterdir())
    monkeypatch.chdir(work)
    code = cli.main(
        ["archive", "tiny.py:Tiny", "--name", "tiny", "--config", "model-config.yaml",
         "--reference", "ref.npy", "--out", "store"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    # The staging copy (weights, handler, profile) went with the temporary directory.
    assert sorted(p.name for p in work.iterdir()) == sorted([*before, "store"])
    assert [p.name for p in (work / "store").iterdir()] == ["tiny.mar"]


BLIND = (
    "import torch\nfrom torch import nn\n\n"
    "class Blind(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.seeing = nn.Sequential(nn.Linear(6, 16), nn.ReLU())\n"
    "        self.blind = nn.Sequential(nn.Linear(6, 16), nn.ReLU())\n"
    "        self.out = nn.Linear(16, 3)\n\n"
    "    def forward(self, x):\n"
    "        g = torch.Generator().manual_seed(7)\n"
    "        self.blind(torch.randn(x.shape[0], 6, generator=g))  # sees nothing of x\n"
    "        return self.out(self.seeing(x))\n"
)


def test_archive_warns_where_the_estimate_reads_far_from_the_accuracy(tmp_path: Path) -> None:
    """A layer that sees nothing of the answer: its estimate on the reference sits far from
    the accuracy measured there, and `archive` says so (chosen by the config; unset, the
    layer that sees is read and nothing is said)."""
    (tmp_path / "blind.py").write_text(BLIND)
    x = _inputs(400)
    import torch

    net = _model_class(BLIND, "Blind")().eval()
    with torch.inference_mode():
        y = net(torch.from_numpy(x)).argmax(1).numpy()
    np.savez(tmp_path / "ref.npz", x=x, y=y)
    said: dict[str, list[str]] = {}
    for case, harm in (("unset", {}), ("blind", {"harm": {"layer": "blind.1"}})):
        config = tmp_path / f"{case}.yaml"
        monitoring = {"layers": ["seeing.1", "blind.1"], **harm}
        config.write_text(
            yaml.safe_dump({"handler": {"input": {"shape": [6]}, "monitoring": monitoring}})
        )
        said[case] = []
        archive_model(
            ModelRef.parse(f"{tmp_path / 'blind.py'}:Blind"),
            case,
            config,
            tmp_path / "ref.npz",
            tmp_path / "store",
            tmp_path / f"build-{case}",
            say=said[case].append,
        )
    assert any("layer seeing.1, reference accuracy 100.0%" in line for line in said["unset"])
    assert not any("warning: the estimate" in line for line in said["unset"]), said["unset"]
    warned = [line for line in said["blind"] if "warning: the estimate" in line]
    assert warned and "far from the 100.0% measured" in warned[0], said["blind"]
    assert "a class over 3 classes" in warned[0]


def test_a_reference_saved_by_torch_save_is_read_as_numpy_s(
    archive: Archive, tmp_path: Path
) -> None:
    """PyTorch users hold tensors: a ``.pt`` of a tensor is the array, a ``.pt`` of a dict the
    ``.npz``'s arrays (``y`` its labels); the profile is the one the numpy files give. Anything
    else in it, or a table, is one line saying what to save."""
    import torch

    x, y = _inputs(), _labels()
    np.savez(tmp_path / "ref.npz", x=x, y=y)
    torch.save({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, tmp_path / "ref.pt")
    from_numpy, _ = archive(tmp_path / "ref.npz")
    expected = _profile(from_numpy, tmp_path / "a")
    from_torch, said = archive(tmp_path / "ref.pt")
    got = _profile(from_torch, tmp_path / "b")
    assert any("the 'y' array of ref.pt" in line for line in said), said
    assert got.accuracy is not None and expected.accuracy is not None
    assert got.accuracy.reference_accuracy == expected.accuracy.reference_accuracy
    assert got.n_seen == expected.n_seen == len(x)
    # A tensor alone, its labels from a tensor's .pt too.
    torch.save(torch.from_numpy(x), tmp_path / "inputs.pt")
    torch.save(torch.from_numpy(y), tmp_path / "labels.pt")
    mar, _ = archive(tmp_path / "inputs.pt", tmp_path / "labels.pt")
    assert _profile(mar, tmp_path / "c").accuracy is not None
    torch.save((torch.from_numpy(x), torch.from_numpy(y)), tmp_path / "pair.pt")
    with pytest.raises(ConfigError, match=r"got a tuple of 2: save the inputs as one tensor, or"):
        archive(tmp_path / "pair.pt")
    (tmp_path / "ref.csv").write_text("0,1,2,3,4,5\n")
    with pytest.raises(
        ConfigError, match=r"got ref\.csv \(a table: name its columns in input\.features"
    ):
        archive(tmp_path / "ref.csv")
