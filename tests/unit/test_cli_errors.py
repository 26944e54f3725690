"""A user's mistake on the command line: one line saying what was expected, what came and what
to do next, exit status 2, no traceback; and a ``--help`` that guides (workflow order, an
example per command, help for every option)."""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from hookwatch import __version__
from hookwatch.tools import cli

ROOT = Path(__file__).resolve().parents[2]
IMAGENET = "models/imagenet/model.py:build"
CONFIG = "models/imagenet/model-config.yaml"

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """``hookwatch ARGS`` in this process, from the repository root: (status, stdout, stderr)."""
    monkeypatch.delenv("HOOKWATCH_DEBUG", raising=False)
    monkeypatch.chdir(ROOT)

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = cli.main(list(args))
        except SystemExit as exit_:  # argparse: --help, --version and its own errors
            code = exit_.code if isinstance(exit_.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return call


def _free_port() -> int:
    with socket.socket() as sock:  # a loopback port nothing listens on once released
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def wrong_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ref") / "ref.npy"
    np.save(path, np.zeros((10, 3, 28, 28), dtype=np.float32))
    return path


def _one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.strip().splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"hookwatch {command}: error: ".replace("  ", " ")), err
    assert "Traceback" not in err
    return lines[0]


# {port}: a loopback port nothing listens on; {tmp}: a fresh directory; {text}: a file that is
# not a .mar.
MISTAKES = [
    # unreachable servers
    (
        ("units", "--prometheus", "http://127.0.0.1:{port}"),
        "expected Prometheus at http://127.0.0.1:{port}, got no answer",
        "hookwatch serve",
    ),
    (
        ("units", "--exporter", "http://127.0.0.1:{port}"),
        "expected a hookwatch exporter at http://127.0.0.1:{port}, got no answer",
        "exporter's URL",
    ),
    (
        ("report", "--prometheus", "http://127.0.0.1:{port}", "--out", "{tmp}/report"),
        "expected Prometheus at http://127.0.0.1:{port}, got no answer",
        "--prometheus URL",
    ),
    # missing files
    (
        ("profile", "--mar", "/nonexistent.mar"),
        "--mar: expected a .mar file at /nonexistent.mar, got no such file",
        "hookwatch archive",
    ),
    (("profile", "--mar", "{text}"), "--mar: expected a .mar (a zip archive)", "hookwatch archive"),
    (("profile", "--data", "{tmp}/none.npy"), "--data: expected held-out inputs", "numpy.save"),
    (("serve", "{tmp}/none.mar"), "expected a .mar file at", "hookwatch archive"),
    (("bench", "{tmp}/none.mar"), "expected a .mar file at", "hookwatch archive"),
    (
        ("bench", "{tmp}/none.mar", "--request", "{tmp}/none.jsonl"),
        "--request: expected request bodies",
        "one a line",
    ),
    (
        ("archive", IMAGENET, "--name", "x", "--config", "nope.yaml", "--reference", "r.npy"),
        "--config: expected a model-config.yaml, got nope.yaml, no such file",
        "hookwatch init",
    ),
    (
        ("archive", IMAGENET, "--name", "x", "--config", CONFIG, "--reference", "{tmp}/no"),
        "--reference: expected held-out inputs (.npy, .npz, .pt or .jsonl, or a directory of "
        "images",
        "no such file",
    ),
    (
        ("archive", IMAGENET, "--name", "x", "--config", CONFIG, "--reference", "{tmp}"),
        "reference: expected image files (.bmp, .gif, .jpeg, .jpg, .png, .tif, .tiff, .webp) in",
        "got none",
    ),
    (
        ("init", IMAGENET, "--config", "nope.yaml"),
        "--config: expected a model-config.yaml",
        "hookwatch init",
    ),
    (
        ("layers", IMAGENET, "--weights", "{tmp}/none.pt", "--input-shape", "3,32,32"),
        "--weights: expected a state_dict or checkpoint file",
        "--help",
    ),
    (("layers", "missing.py:Net", "--input-shape", "3"), "expected a file at missing.py", ""),
    (("exporter", "--dir", "{tmp}/none"), "--dir: expected the directory", "create it"),
    # wrong types and values
    (("units", "--prometheus", "localhost:9090"), "--prometheus: expected an http://", "9090"),
    (("units", "--prometheus", "http://x", "--range", "1"), "--range: expected a PromQL", "--help"),
    (("serve", "x.mar", "--workers", "0"), "--workers: expected a positive integer, got '0'", ""),
    (("serve", "x.mar", "--rate", "fast"), "--rate: expected a number above 0, got 'fast'", ""),
    (("serve", "x.mar", "--traffic", "tweets"), "--traffic: expected none, CLEAN.jsonl", ""),
    (("serve", "x.mar", "--traffic", "a.jsonl:b.npy"), "CLEAN.jsonl:SHIFTED.jsonl", ""),
    (("run", "--seconds", "-5"), "--seconds: expected seconds, 0 or more, got '-5'", "--help"),
    # The demo not built here: said before anything starts (TorchServe "exited with 1" before).
    (("run", "--root", "{tmp}"), "expected the demo's archive at {tmp}/model_store", "build-demo"),
    (("stop", "--workers", "two"), "--workers: expected a positive integer, got 'two'", ""),
    (("profile", "--bins", "-1"), "--bins: expected an integer of 0 or more, got '-1'", ""),
    (("bench", "x.mar", "--rounds", "0"), "--rounds: expected a positive integer", "--help"),
    (("exporter", "--dir", "{tmp}", "--port", "99999"), "--port: expected a port from 1", ""),
    (("report", "--since", "yesterday"), "--since: expected Unix seconds or an ISO 8601", ""),
    (("report", "--prometheus", "localhost:9090"), "expected an http:// or https://", ""),
    (("report", "--minutes", "0"), "--minutes: expected a number above 0, got '0'", ""),
    (
        ("layers", IMAGENET.replace("build", "biuld"), "--input-shape", "3,32,32"),
        "'biuld'",
        "",
    ),
    (("layers", "models/imagenet/model.py", "--input-shape", "3"), "without a name", ""),
    (("layers", IMAGENET, "--input-shape", "3,28"), "expected the model to accept", ""),
    (("layers", IMAGENET, "--input-shape", "a,b"), "expected positive integers", ""),
    (("layers", IMAGENET, "--model-args", "{nope", "--input-shape", "3"), "JSON object", ""),
    (("layers", IMAGENET, "--depth", "x"), "--depth: expected an integer of 0 or more", ""),
    (
        ("layers", IMAGENET),
        "expected --input-shape (e.g. 3,224,224) or --config",
        "(stem.0, Conv2d, comes first: --input-shape 3,<height>,<width>)",
    ),
    (("export-monitoring", "{tmp}/out", "--runbook-base", "a b"), "--runbook-base: expected", ""),
    # missing or unknown arguments
    (("units",), "expected one of --exporter or --prometheus, got none", "units --help"),
    (
        ("units", "--exporter", "http://a", "--prometheus", "http://b"),
        "expected --prometheus or --exporter, got both",
        "",
    ),
    (("archive", IMAGENET), "expected --name, --config, --reference, got none", "--help"),
    (("export-monitoring",), "expected dir, got none", "export-monitoring --help"),
    (("report", "--bogus"), "expected known options, got --bogus", "report --help"),
    (("build-demo", "--fast"), "expected known options, got --fast", "build-demo --help"),
]


@pytest.mark.parametrize(("args", "message", "next_step"), MISTAKES)
def test_a_mistake_is_one_line_with_what_was_expected(
    run: Run, tmp_path: Path, args: tuple[str, ...], message: str, next_step: str
) -> None:
    port = _free_port()
    text = tmp_path / "notes.txt"
    text.write_text("not a zip")
    values = {"port": str(port), "tmp": str(tmp_path), "text": str(text)}

    def fill(s: str) -> str:
        for key, value in values.items():
            s = s.replace("{" + key + "}", value)
        return s

    code, _, err = run(*map(fill, args))
    assert code == 2, err
    line = _one_error_line(err, args[0])
    assert fill(message) in line, line
    assert "expected" in line and ", got " in line, line
    assert next_step in line, line
    assert "[Errno" not in line and "<urlopen" not in line, line


def test_a_model_that_opens_with_a_linear_layer_needs_no_input_shape(
    run: Run, tmp_path: Path
) -> None:
    """A tabular model or an MLP says its input in its first layer: ``layers`` and ``init``
    take one item of its ``in_features`` (said on stderr) where they asked for
    ``--input-shape``; a first ``Linear`` that is not the first to run is one line saying
    what was tried."""
    model = tmp_path / "mlp.py"
    model.write_text(
        "from torch import nn\n"
        "class Tab(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)\n"
        "    def forward(self, x):\n"
        "        return self.fc2(self.act(self.fc1(x)))\n"
        "class Late(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.head, self.conv = nn.Linear(4, 2), nn.Conv2d(1, 4, 3)\n"
        "    def forward(self, x):\n"
        "        return self.head(self.conv(x).mean((2, 3)))\n"
    )
    code, out, err = run("layers", f"{model}:Tab")
    assert code == 0, err
    assert "fc1" in out and err.strip().splitlines()[-1] == (
        "input shape [8]: fc1 (Linear) takes 8 features; --input-shape gives another"
    )
    config = tmp_path / "model-config.yaml"
    code, _, err = run("init", f"{model}:Tab", "--out", str(config))
    assert code == 0, err
    written = yaml.safe_load(config.read_text())
    assert written["handler"]["input"]["shape"] == [8]
    code, _, err = run("layers", f"{model}:Late")
    assert code == 2
    line = _one_error_line(err, "layers")
    assert "got neither (tried [4], head's in_features: dry run: expected the model" in line, line


def test_init_names_the_classes_a_model_carries(run: Run, tmp_path: Path) -> None:
    """A HuggingFace classifier carries its class names (``config.id2label``): ``init``
    writes them as ``handler.labels``, so answers name the class; the defaults
    (``LABEL_0``, ...) and names of another count are left out."""
    model = tmp_path / "named.py"
    model.write_text(
        "from types import SimpleNamespace\n"
        "from torch import nn\n"
        "class Named(nn.Module):\n"
        "    def __init__(self, names):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(4, 2)\n"
        "        self.config = SimpleNamespace(id2label=dict(enumerate(names)))\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n"
    )
    for names, want in (
        (["cat", "dog"], ["cat", "dog"]),
        (["LABEL_0", "LABEL_1"], None),
        (["a", "b", "c"], None),
    ):
        out = tmp_path / f"{len(names)}-{names[0]}.yaml"
        args = ("--model-args", json.dumps({"names": names}), "--out", str(out))
        code, _, err = run("init", f"{model}:Named", *args)
        assert code == 0, err
        assert yaml.safe_load(out.read_text())["handler"].get("labels") == want, names


def test_init_reads_a_vision_models_input_from_its_config_and_preprocessor(
    run: Run, tmp_path: Path
) -> None:
    """A HuggingFace vision model says its input in its config (``num_channels``,
    ``image_size``) and its normalisation in the ``preprocessor_config.json`` saved beside it:
    ``init`` needs no ``--input-shape`` and writes image requests with that mean and std."""
    model = tmp_path / "vision.py"
    model.write_text(
        "from types import SimpleNamespace\n"
        "from torch import nn\n"
        "class Vision(nn.Module):\n"
        "    def __init__(self, directory):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Parameter(nn.init.zeros_(nn.Linear(1, 1).weight))\n"
        "        self.conv = nn.Conv2d(3, 4, 4, stride=4)\n"
        "        self.head = nn.Linear(4, 2)\n"
        "        self.config = SimpleNamespace(num_channels=3, image_size=[8, 12])\n"
        "    def forward(self, x):\n"
        "        return self.head(self.conv(x).mean((2, 3)))\n"
    )
    directory = tmp_path / "saved"
    directory.mkdir()
    (directory / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.2, 0.2]})
    )
    out = tmp_path / "vision.yaml"
    args = ("--model-args", json.dumps({"directory": str(directory)}), "--out", str(out))
    code, _, err = run("init", f"{model}:Vision", *args)
    assert code == 0, err
    assert "input shape [3, 8, 12]: the model's config (num_channels, image_size)" in err
    written = yaml.safe_load(out.read_text())["handler"]["input"]
    assert written == {
        "shape": [3, 8, 12],
        "dtype": "float32",
        "encoding": "image",
        "mean": [0.5, 0.4, 0.3],
        "std": [0.2, 0.2, 0.2],
        "min": 0,
        "max": 1,
    }


def test_init_answers_an_encoders_pooled_output(run: Run, tmp_path: Path) -> None:
    """An encoder answering every position's state and a pooled vector a sample (a
    HuggingFace ``AutoModel``'s ``last_hidden_state`` and ``pooler_output``): ``init`` selects
    the pooled one as the embedding (it proposed every position's states, a 14x384 answer)."""
    model = tmp_path / "encoder.py"
    model.write_text(
        "from torch import nn\n"
        "class Encoder(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = nn.Linear(3, 8)\n"
        "        self.norm = nn.LayerNorm(8)\n"
        "        self.pool = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        "        h = self.norm(self.layer(x))\n"
        "        return {'last_hidden_state': h, 'pooler_output': self.pool(h[:, 0]).tanh()}\n"
    )
    out = tmp_path / "encoder.yaml"
    code, _, err = run("init", f"{model}:Encoder", "--input-shape", "5,3", "--out", str(out))
    assert code == 0, err
    written = yaml.safe_load(out.read_text())["handler"]["monitoring"]["output"]
    assert written == {"head": "embedding", "select": "pooler_output"}


def test_init_selects_the_first_part_with_a_row_per_sample(run: Run, tmp_path: Path) -> None:
    """``return aux_loss, logits``: the first part has no row per sample; ``init`` proposed a
    head on it (``embedding``, the logits as ``also``), which no request can be answered
    with. It selects the logits and guesses the head from them."""
    model = tmp_path / "with_loss.py"
    model.write_text(
        "from torch import nn\n"
        "class WithLoss(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(6, 4)\n"
        "    def forward(self, x):\n"
        "        logits = self.fc(x)\n"
        "        return logits.pow(2).mean(), logits\n"
    )
    out = tmp_path / "with_loss.yaml"
    code, _, err = run("init", f"{model}:WithLoss", "--out", str(out))
    assert code == 0, err
    written = yaml.safe_load(out.read_text())["handler"]["monitoring"]["output"]
    assert written == {"head": "logits", "select": 1}


def test_a_command_that_does_not_exist(run: Run) -> None:
    code, _, err = run("serv", "x.mar")
    assert code == 2
    assert err.startswith("hookwatch: error: expected a command, one of layers, init, archive")
    assert "got 'serv'" in err and err.count("\n") == 1
    code, _, err = run()
    assert code == 2 and err.startswith("hookwatch: error: expected a command, got none")


def test_pythons_own_errors_are_worded_too() -> None:
    missing = FileNotFoundError(2, "No such file or directory", "weights.bin")
    assert cli._said(missing) == (
        "expected a usable weights.bin, got no such file or directory (check the path and its "
        "permissions)"
    )
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    assert cli._said(refused).startswith("expected an answer from the server, got Connection")
    assert cli._said(ValueError("expected x, got y\nmore")) == "expected x, got y"


def test_a_reference_of_the_wrong_shape_says_which_shape(
    wrong_reference: Path, tmp_path: Path, run: Run
) -> None:
    code, _, err = run(
        "archive", IMAGENET, "--name", "x", "--config", CONFIG,
        "--reference", str(wrong_reference), "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 2
    assert (
        "expected an array of shape [N, 3, 32, 32] (handler.input.shape), got [10, 3, 28, 28]"
        in _one_error_line(err, "archive")
    )


def test_init_refuses_to_overwrite(tmp_path: Path, run: Run) -> None:
    out = tmp_path / "model-config.yaml"
    out.write_text("mine")
    code, _, err = run("init", IMAGENET, "--input-shape", "3,32,32", "--out", str(out))
    assert code == 2 and "pass --force" in _one_error_line(err, "init")
    assert out.read_text() == "mine"


# --help


def _commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield "", parser
    yield from sub.choices.items()


def test_every_option_has_help_and_every_command_an_example() -> None:
    commands = dict(_commands())
    assert set(commands) - {""} == set(cli.WORKFLOW) == set(cli.EXAMPLES)
    for name, parser in commands.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            where = f"hookwatch {name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help != argparse.SUPPRESS, f"{where}: no help"
        if name:
            assert parser.description, f"hookwatch {name}: no description"
            assert parser.epilog and parser.epilog.startswith("example:\n  hookwatch " + name)
            assert name in parser.format_help()


def test_the_examples_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("model_store").mkdir()
    for name in ("weights.pt", "model-config.yaml", "reference.npy", "model_store/mymodel.mar"):
        Path(name).write_text("")
    parser = cli.build_parser()
    for name, example in cli.EXAMPLES.items():
        args = parser.parse_args(shlex.split(example)[1:])
        assert args.command == name


def test_help_follows_the_workflow(run: Run) -> None:
    code, out, _ = run("--help")
    assert code == 0
    assert "standard library" not in out and "Imports" not in out
    listed = [
        line.split()[0] for line in out.splitlines() if line.startswith("    ") and line[4] != " "
    ]
    listed = [word for word in listed if word in cli.WORKFLOW]
    assert listed == list(cli.WORKFLOW), out
    assert list(cli.WORKFLOW[:6]) == ["layers", "init", "archive", "serve", "units", "report"]
    assert "example" in out or "hookwatch archive" in out
    width = max(map(len, out.splitlines()))
    assert width <= 100, f"--help is {width} columns wide"


def test_each_command_help_shows_its_example(run: Run) -> None:
    for name in cli.WORKFLOW:
        code, out, _ = run(name, "--help")
        assert code == 0
        assert "example:\n  hookwatch " + name in out, out
        assert max(map(len, out.splitlines())) <= 100, out


def test_version(run: Run) -> None:
    code, out, _ = run("--version")
    assert code == 0 and out.strip() == f"hookwatch {__version__}"


def test_a_reader_that_stops_early_gets_no_error(tmp_path: Path) -> None:
    """`hookwatch layers ... | head`: the pipe closes while the table is written; the command
    ends as one killed by SIGPIPE would, saying nothing (it said "error: [Errno 32] Broken
    pipe")."""
    import subprocess
    import sys

    # 3,000 layers: a table far past a pipe's buffer, so the write meets the closed pipe.
    (tmp_path / "deep.py").write_text(
        "from torch import nn\n\n\ndef build():\n"
        "    return nn.Sequential(*[nn.Linear(2, 2) for _ in range(3000)])\n"
    )
    command = [sys.executable, "-m", "hookwatch.tools.cli"]
    layers = subprocess.Popen(
        [*command, "layers", f"{tmp_path / 'deep.py'}:build", "--input-shape", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert layers.stdout is not None and layers.stderr is not None
    assert layers.stdout.read(10)  # the reader takes the start, then goes away
    layers.stdout.close()
    err = layers.stderr.read().decode()
    assert layers.wait(timeout=120) == 141
    assert err == ""


def test_the_demo_without_scikit_learn_is_one_line(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `hookwatch[torchserve]` (the README's install) has no scikit-learn: build-demo and run
    # ended in a traceback (an outside run, 2026-12-07).
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sklearn" else find_spec(name, *a),
    )
    for command in ("build-demo", "run"):
        code, _, err = run(command)
        assert code == 2, err
        line = _one_error_line(err, command)
        assert "expected scikit-learn" in line and "hookwatch[tools]" in line, line
