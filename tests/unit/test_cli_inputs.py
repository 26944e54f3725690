"""What `hookwatch layers / init / serve` make of a user's inputs and of what went wrong: an
unsupported --input-dtype or a malformed --input-shape refused at once, a model that wants
integers told which option to change, a worker's load failure given its reason, and a stop
summary that counts the rejected requests apart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from hookwatch import ConfigError
from hookwatch._config import INPUT_DTYPES, read_model_config
from hookwatch.tools import cli, devstack, own_model
from hookwatch.tools.devstack import Stack
from hookwatch.tools.traffic import LiveView

Run = Callable[..., tuple[int, str, str]]

#: A model whose first layer is an nn.Embedding: it takes token ids, never floats.
TOKENS_MODEL = """\
from torch import nn


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.emb(x).mean(1))


def build():
    return Tokens()
"""


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Run:
    """``hookwatch ARGS`` in this process, in ``tmp_path``: (status, stdout, stderr)."""
    monkeypatch.delenv("HOOKWATCH_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(TOKENS_MODEL)

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = cli.main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return call


def _one_error_line(err: str, command: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hookwatch {command}: error: "), err
    return lines[0]


# --input-dtype


@pytest.mark.parametrize("command", ["layers", "init"])
def test_an_unsupported_dtype_is_refused_at_once_as_the_config_refuses_it(
    run: Run, tmp_path: Path, command: str
) -> None:
    (tmp_path / "cfg.yaml").write_text("handler:\n  input: {shape: [3], dtype: complex64}\n")
    with pytest.raises(ConfigError) as config_said:
        read_model_config(tmp_path / "cfg.yaml")
    out = tmp_path / "out.yaml"
    extra = ("--out", str(out)) if command == "init" else ()
    code, _, err = run(
        command, "model.py:build", "--input-shape", "3", "--input-dtype", "complex64", *extra
    )
    assert code == 2
    line = _one_error_line(err, command)
    # The config's own words after the option's name: one list of dtypes, one message.
    expected = str(config_said.value).removeprefix("input.dtype: ")
    assert f"--input-dtype: {expected}" in line, line
    assert not out.exists()


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_every_dtype_the_config_takes_is_taken(dtype: str) -> None:
    args = cli.build_parser().parse_args(["layers", "m.py:build", "--input-dtype", dtype])
    assert args.input_dtype == dtype


def test_init_writes_a_dtype_archive_accepts(run: Run, tmp_path: Path) -> None:
    out = tmp_path / "cfg.yaml"
    code, _, err = run(
        "init", "model.py:build", "--input-shape", "5", "--input-dtype", "int64", "--out", str(out)
    )
    assert code == 0, err
    assert read_model_config(out).handler.input.dtype == "int64"


# --input-shape


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("3,32,32", (3, 32, 32)),
        ("3x32x32", (3, 32, 32)),
        ("3, 32, 32", (3, 32, 32)),
        ("3", (3,)),
        ("20,4", (20, 4)),
        ("", ()),  # one number a sample: forward(x[batch])
    ],
)
def test_documented_shapes_parse(text: str, shape: tuple[int, ...]) -> None:
    assert own_model.parse_shape(text) == shape


@pytest.mark.parametrize(
    "text", ["20,4,x", "20,,4", ",3", "3,", "3x", "x3", "0,3", "3,-1", "a,b", "3.5", " ", "3;4"]
)
def test_a_malformed_shape_is_refused_not_shortened(text: str) -> None:
    with pytest.raises(ConfigError, match="expected positive integers like 1,28,28"):
        own_model.parse_shape(text)


@pytest.mark.parametrize("text", ["20,4,x", "20,,4"])
def test_layers_refuses_a_malformed_shape_in_one_line(run: Run, text: str) -> None:
    code, _, err = run("layers", "model.py:build", "--input-shape", text)
    assert code == 2
    line = _one_error_line(err, "layers")
    assert f"--input-shape: expected positive integers like 1,28,28, got {text!r}" in line


# a model that wants integers


def test_a_model_that_wants_integers_is_told_to_try_int64(run: Run, tmp_path: Path) -> None:
    code, _, err = run("layers", "model.py:build", "--input-shape", "5")
    assert code == 2
    line = _one_error_line(err, "layers")
    assert "'indices'" in line and line.endswith("try --input-dtype int64"), line
    code, out, err = run("layers", "model.py:build", "--input-shape", "5", "--input-dtype", "int64")
    assert code == 0, err
    assert "emb" in out


def test_input_dtype_overrides_the_configs(run: Run, tmp_path: Path) -> None:
    (tmp_path / "cfg.yaml").write_text("handler:\n  input: {shape: [5], dtype: float32}\n")
    code, _, err = run("layers", "model.py:build", "--config", "cfg.yaml")
    assert code == 2 and "try --input-dtype int64" in _one_error_line(err, "layers")
    code, _, err = run("layers", "model.py:build", "--config", "cfg.yaml", "--input-dtype", "int64")
    assert code == 0, err


def _error_of(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except Exception as error:
        return error
    raise AssertionError("expected an error")


@pytest.mark.parametrize(
    "call",
    [
        lambda x: nn.Embedding(10, 4)(x),
        lambda x: nn.functional.one_hot(x, 10),
        lambda x: torch.zeros(10).index_select(0, x[0]),
        lambda x: torch.zeros(2, 10).gather(1, x),
        lambda x: torch.zeros(10)[x],
    ],
)
def test_torchs_words_for_wanting_indices_get_the_hint(call: Callable[[Any], Any]) -> None:
    floats = torch.rand(2, 3)
    error = _error_of(lambda: call(floats))
    assert own_model.integer_hint(error, floats, "X") == "; the model wants integer inputs: try X"
    # Integers given already, or another complaint: no hint.
    assert own_model.integer_hint(error, floats.long(), "X") == ""
    assert (
        own_model.integer_hint(
            RuntimeError("mat1 and mat2 shapes cannot be multiplied"), floats, "X"
        )
        == ""
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize(
    "layer",
    [nn.Linear(3, 4), nn.Conv1d(2, 4, 1), nn.LSTM(3, 4, batch_first=True), nn.LayerNorm(3)],
    ids=["linear", "conv", "lstm", "layernorm"],
)
def test_torchs_words_for_a_dtype_mismatch_name_the_models_dtype(
    layer: nn.Module, dtype: torch.dtype
) -> None:
    model = layer.to(dtype)
    floats = torch.rand(2, 2, 3)
    error = _error_of(lambda: model(floats))
    name = str(dtype).removeprefix("torch.")
    hint = own_model.dtype_hint(error, model, floats, "X={}")
    assert hint == f"; the model's parameters are {name}: try X={name}", (error, hint)
    # Given its dtype already, integers, a float32 model, or another complaint: no hint.
    assert own_model.dtype_hint(error, model, floats.to(dtype), "X={}") == ""
    assert own_model.dtype_hint(error, model, floats.long(), "X={}") == ""
    assert own_model.dtype_hint(error, layer.float(), floats, "X={}") == ""
    other = RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    assert own_model.dtype_hint(other, model.to(dtype), floats, "X={}") == ""


def test_a_half_precision_model_is_tried_on_its_own_dtype(run: Run, tmp_path: Path) -> None:
    """Unsaid, the input dtype of `layers` and `init` is the model's own (float32 failed a
    bfloat16 model's first layer); a config's or --input-dtype's stands, with the hint."""
    (tmp_path / "half.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef build():\n"
        "    return nn.Sequential(nn.Linear(5, 4), nn.ReLU()).to(torch.bfloat16)\n"
    )
    code, _, err = run("init", "half.py:build", "--input-shape", "5", "--out", "h.yaml")
    assert code == 0, err
    assert read_model_config(tmp_path / "h.yaml").handler.input.dtype == "bfloat16"
    code, _, err = run("layers", "half.py:build", "--input-shape", "5", "--input-dtype", "float32")
    assert code == 2
    assert _one_error_line(err, "layers").endswith("try --input-dtype bfloat16")


# a worker that cannot load the model

WORKER = "2026-11-26T18:14:17,581 [INFO ] W-9000-{model}_1.0-stdout MODEL_LOG - {text}"
REASON = (
    "hookwatch.ConfigError: weights: expected a state_dict (parameter names to tensors) in "
    "/run/tmp/models/0f/weights.pt, got list"
)


def _logs(run_dir: Path, model_lines: list[tuple[str, str]], failed: str = "echo_int64") -> Path:
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    (logs / "torchserve.out").write_text(
        "2026-11-26T18:14:17,612 [WARN ] W-9000-echo_int64_1.0 "
        f"org.pytorch.serve.wlm.BatchAggregator - Load model failed: {failed}, error: "
        "Worker died.\n"
    )
    (logs / "model_log.log").write_text(
        "\n".join(WORKER.format(model=m, text=t) for m, t in model_lines) + "\n"
    )
    return logs


FAILED_LOAD = [
    ("echo_int64", "hookwatch: drift profile of model 'echo_int64' loaded"),
    ("echo_int64", "Backend worker process died."),
    ("echo_int64", "Traceback (most recent call last):"),
    ("echo_int64", '  File "/site-packages/hookwatch/_model.py", line 145, in load_state'),
    ("echo_int64", "    raise ConfigError("),
    ("echo_int64", REASON),
    # Another model of the same TorchServe, its name a prefix of the failed one's.
    ("echo", "RuntimeError: not this one"),
]


def test_serve_says_why_the_worker_could_not_load_the_model(tmp_path: Path) -> None:
    logs = _logs(tmp_path / ".run", FAILED_LOAD)
    stack = Stack(root=tmp_path, run_dir=tmp_path / ".run", model_name="echo_int64")
    with pytest.raises(RuntimeError) as raised:
        stack._torchserve_ready()
    said = cli._said(raised.value)  # what `hookwatch serve: error: ` is followed by
    assert said == (
        f"TorchServe could not load the model echo_int64: {REASON} (the full log: "
        f"{logs / 'model_log.log'})"
    )


def test_without_an_exception_the_last_hookwatch_line_is_the_reason(tmp_path: Path) -> None:
    logs = _logs(
        tmp_path,
        [
            ("echo_int64", "hookwatch: model 'echo_int64' failed its self-check"),
            ("echo_int64", "Backend worker process died."),
        ],
    )
    failed = devstack.load_failure(logs, "echo_int64", settle_s=0)
    assert (
        failed is not None and ": hookwatch: model 'echo_int64' failed its self-check (" in failed
    )


def test_a_worker_that_said_nothing_is_said_so(tmp_path: Path) -> None:
    logs = _logs(tmp_path, [("echo_int64", "Backend worker process died.")])
    failed = devstack.load_failure(logs, "echo_int64", settle_s=0)
    assert failed is not None and "its worker gave no reason" in failed
    assert "\n" not in failed


def test_no_failure_no_message(tmp_path: Path) -> None:
    logs = _logs(tmp_path, FAILED_LOAD)
    (logs / "torchserve.out").write_text("Model echo_int64 loaded.\n")
    assert devstack.load_failure(logs, "echo_int64", settle_s=0) is None
    assert devstack.load_failure(tmp_path / "none", "echo_int64", settle_s=0) is None


# the stop summary


class CountingStack:
    """Answers the summary's two counters, as Prometheus would (or not at all)."""

    model_name = "gru"

    def __init__(self, received: float | None, rejected: float | None) -> None:
        self.values = {
            "hookwatch_requests_total": received,
            "hookwatch_requests_rejected_total": rejected,
        }

    def query(self, promql: str) -> list[dict[str, Any]]:
        name = promql.removeprefix("sum(").split("{")[0]
        value = self.values.get(name)
        return [] if value is None else [{"metric": {}, "value": [0, str(value)]}]


@pytest.mark.parametrize(
    ("received", "rejected", "said"),
    [
        (85.0, 23.0, ", 85 requests (62 answered, 23 rejected)"),
        (1.0, 0.0, ", 1 request (1 answered, 0 rejected)"),
        (85.0, None, ", 85 requests received"),
        (None, None, ""),
    ],
)
def test_the_summary_counts_the_rejected_apart(
    received: float | None, rejected: float | None, said: str
) -> None:
    view = LiveView(CountingStack(received, rejected), colour=False, clock=lambda: 100.0)
    head = view.summary().splitlines()[0]
    assert head == "run summary: 0 s" + said
    assert "served" not in head


def test_units_says_when_the_exporter_url_is_another_program_s_metrics() -> None:
    """Prometheus' own /metrics answers 200 too: without hookwatch_ series it is refused,
    never read as "no unit counts yet"."""
    from hookwatch._errors import ConfigError
    from hookwatch.tools.units import from_exporter
    from tests.fakes import text_server

    other = {"text": "# TYPE go_goroutines gauge\ngo_goroutines 42\n"}
    refused = pytest.raises(ConfigError, match=r"expected a hookwatch exporter at .*hookwatch_")
    with text_server(other) as port, refused:
        from_exporter(f"http://127.0.0.1:{port}")


def test_a_select_that_picks_nothing_is_told_what_it_can_pick() -> None:
    # An outside user's `select: nope` on a dict output, and `select: 5` on a pair, were told
    # neither the keys nor the length.
    import torch

    from hookwatch.tools.own_model import _select_choices

    pair = (torch.zeros(1, 8), torch.zeros(1, 5))
    assert _select_choices(pair) == " (of 2 items, tensors at indices 0, 1)"
    named = {"logits": torch.zeros(1, 5), "embedding": torch.zeros(1, 8), "n": 3}
    assert _select_choices(named) == " (its tensors' keys: 'logits', 'embedding')"
    assert _select_choices(torch.zeros(1, 5)) == ""


def test_layers_counts_a_wide_input_as_the_projection_will_test_it() -> None:
    # An outside user's [2, 400] input: `layers` said 2 features, archive tested 800 projected;
    # a layer past projection_width says that only its first units are projected.
    import torch
    from torch import nn

    from hookwatch.tools.own_model import discover_layers, format_layers

    model = nn.Sequential(nn.Flatten(), nn.Linear(800, 8192))
    rows = discover_layers(model, torch.zeros(2, 2, 400))
    by_name = {row.name: row for row in rows}
    assert by_name["input"].features == 800
    table = format_layers(rows, 256)
    line = next(line for line in table.splitlines() if line.startswith("input "))
    assert "projected to at most 255 components" in line
    wide = next(line for line in table.splitlines() if line.startswith("1 "))
    assert "its first 4096 projected" in wide


def test_init_bounds_ids_that_go_straight_into_an_embedding(run: Run, tmp_path: Path) -> None:
    # An outside user's language model: an id past its vocabulary reached the forward and was
    # a 422 naming an IndexError; init now writes the range, and such an id is a 400.
    (tmp_path / "tokens.py").write_text(TOKENS_MODEL)
    out = tmp_path / "model-config.yaml"
    model = f"{tmp_path / 'tokens.py'}:build"
    code, said, err = run("layers", model, "--input-shape", "5", "--input-dtype", "int64")
    assert code == 0 and "ids into an embedding of 10 rows" in said, err
    code, _, err = run(
        "init", model, "--input-shape", "5", "--input-dtype", "int64", "--out", str(out)
    )
    assert code == 0, err
    spec = read_model_config(out).handler.input
    assert (spec.min_value, spec.max_value) == (0.0, 9.0)
    from hookwatch._errors import BadInputError
    from hookwatch._service import decode_payload

    with pytest.raises(BadInputError, match=r"values in \[0, 9\]"):
        decode_payload({"data": [1, 2, 3, 4, 10]}, spec)
    # Ids the model derives itself (a float input, embedded after a cast) are not bounded.
    rows = own_model.discover_layers(Derived().eval(), torch.zeros(2, 5))
    assert rows[0].vocabulary == 0
    # Ids of any length (`init --config` of `shape: [null]`): bounded too, as the docs say
    # (they were not: found by two outside runs, 2026-12-07).
    given = tmp_path / "given.yaml"
    given.write_text(
        yaml.safe_dump({"handler": {"input": {"shape": [None], "max_length": 5, "dtype": "int64"}}})
    )
    code, said, err = run("layers", model, "--config", str(given))
    assert code == 0 and "ids into an embedding of 10 rows" in said, err
    code, _, err = run("init", model, "--config", str(given), "--out", str(out), "--force")
    assert code == 0, err
    spec = read_model_config(out).handler.input
    assert spec.length_dim == 0 and (spec.min_value, spec.max_value) == (0.0, 9.0)


class Derived(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.emb(x.long()).mean(1)
        return out


def test_layers_says_a_scripted_submodule_takes_no_hooks_not_that_it_did_not_run() -> None:
    # An outside user's eager model with a torch.jit.script'ed encoder inside: `layers` said
    # its modules "did not run" (they ran; hooks cannot see them), and `archive` refuses them.
    from hookwatch.tools.own_model import discover_layers, format_layers

    torch.manual_seed(0)
    model = nn.Sequential(torch.jit.script(nn.Sequential(nn.Linear(6, 4))), nn.ReLU())
    table = format_layers(discover_layers(model.eval(), torch.zeros(2, 6)), 256)
    lines = {line.split()[0]: line for line in table.splitlines()[1:]}
    for name in ("0", "0.0"):
        assert "(TorchScript)" in lines[name] and "takes no hooks" in lines[name], lines[name]
    assert "(did not run)" not in table and "TorchScript" not in lines["1"]


def test_init_says_which_tensor_of_a_tuple_output_the_head_reads() -> None:
    # An outside user's (embedding [B, 8], logits [B, 5]): init proposed `head: logits` with no
    # word that the head reads the first tensor, the 8-wide embedding.
    import torch
    from torch import nn

    from hookwatch.tools.own_model import discover_layers, init_config

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.cls = nn.Linear(16, 8), nn.Linear(8, 5)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            embedding = self.body(x)
            return embedding, self.cls(embedding)

    rows = discover_layers(Pair().eval(), torch.zeros(2, 16))
    written = init_config(rows, [16], "float32", None, "pair.py:Pair")
    assert "The output holds 2 tensors (0: 8; 1: 5): the head reads 0," in written
    assert "select: 1" in written
    import yaml

    # The other tensor, small and a row per sample, is answered beside (output.also).
    output = yaml.safe_load(written)["handler"]["monitoring"]["output"]
    assert output == {"head": "logits", "also": [1]}


def test_init_quotes_layer_paths_yaml_would_read_as_numbers(tmp_path: Path) -> None:
    # An outside run of the wheel: `init` on an nn.Sequential wrote `layers: [1, 4]`, which
    # YAML reads as integers, and `archive` refused the config init had just written.
    import torch
    from torch import nn

    from hookwatch._config import read_model_config
    from hookwatch.tools.own_model import _flow_scalar, discover_layers, init_config

    model = nn.Sequential(
        nn.Linear(10, 64), nn.GELU(), nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 4)
    )
    rows = discover_layers(model.eval(), torch.zeros(2, 10))
    written = init_config(rows, [10], "float32", None, "model.py:build")
    path = tmp_path / "model-config.yaml"
    path.write_text(written)
    layers = read_model_config(path).handler.monitoring.layers
    assert layers and all(isinstance(name, str) and name.isdigit() for name in layers), layers
    # Each name reads back as itself; plain paths stay unquoted.
    import yaml

    for name in ("0", "blocks.0.act", "*.relu", "true", "null", "1e3", "a: b", "x, y", "~"):
        assert yaml.safe_load(f"[{_flow_scalar(name)}]") == [name], name
    assert _flow_scalar("blocks.0.act") == "blocks.0.act"


#: A model that maps its logits to class names itself: it answers strings, no tensor.
NAMES_MODEL = """\
import torch
import yaml
from torch import nn


class Named(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return [["cat", "dog", "bird"][i] for i in self.fc(x).argmax(-1).tolist()]
"""


def test_a_model_answering_no_tensor_is_told_to_return_its_logits(run: Run, tmp_path: Path) -> None:
    """Its output read "(did not run)" in `layers`, `init` wrote a config with head none and
    `archive` said `output.select` found tensors at "indices none"."""
    import numpy as np
    import yaml

    (tmp_path / "named.py").write_text(NAMES_MODEL)
    code, out, _ = run("layers", "named.py:Named", "--input-shape", "4")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("output"))
    assert "(no tensor)" in row and "a list of str, no tensor" in row
    assert "name the classes in handler.labels" in row
    code, _, err = run("init", "named.py:Named", "--input-shape", "4", "--out", "c.yaml")
    line = _one_error_line(err, "init")
    assert code == 2 and "model output: expected a tensor, got a list of str" in line
    assert not (tmp_path / "c.yaml").exists()
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"handler": {"input": {"shape": [4]}}}))
    np.save(tmp_path / "ref.npy", np.zeros((8, 4), dtype=np.float32))
    code, _, err = run(
        "archive", "named.py:Named", "--name", "n", "--config", "c.yaml", "--reference", "ref.npy"
    )
    assert code == 2 and "expected a tensor, got a list of str" in _one_error_line(err, "archive")


def test_init_reads_an_output_of_the_inputs_shape_as_a_reconstruction() -> None:
    """An autoencoder's `[B, 64]` reconstruction of a `[64]` input was proposed as 64
    classes' logits, or out of a Sigmoid as 64 labels (multilabel); it is values now, with a
    note naming the other reading. A classifier of a few classes is proposed as before."""
    from hookwatch.tools.own_model import discover_layers, example_input, guess_head, init_config

    torch.manual_seed(0)
    for ending in (nn.Sigmoid(), nn.Identity()):
        autoencoder = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64), ending)
        rows = discover_layers(autoencoder, example_input((64,)))
        assert guess_head(rows) == "values"
        text = init_config(rows, (64,), "float32", None, "ae.py:build")
        assert "reconstruction (an" in text and "output: {head: values}" in text
    classifier = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    assert guess_head(discover_layers(classifier, example_input((64,)))) == "logits"
    small = nn.Sequential(nn.Linear(8, 8))  # 8 values: too few to tell from 8 classes
    assert guess_head(discover_layers(small, example_input((8,)))) == "logits"
