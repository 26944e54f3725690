"""The TorchServe handler driven through BaseHandler.handle with a fake context (no Java)."""

from __future__ import annotations

import copy
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from hookwatch._errors import ConfigError
from hookwatch.tools.demo import digits_cnn
from hookwatch.tools.demo.data import load_split
from tests.fakes import FakeContext, archived_handler, handled, load_handler

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "models/digits/model-config.yaml").read_text())


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # TorchServe's worker imports the model file from the extracted model dir on sys.path.
    monkeypatch.syspath_prepend(str(tmp_path))
    shutil.copy(digits_cnn.__file__, tmp_path / "digits_cnn.py")
    torch.manual_seed(0)
    torch.save(digits_cnn.DigitsCNN().state_dict(), tmp_path / "digits_cnn.pt")
    return tmp_path


def make_config(**monitoring: Any) -> dict[str, Any]:
    config = copy.deepcopy(CONFIG)
    config["handler"]["monitoring"].update(monitoring)
    return config


@pytest.fixture
def handler(model_dir: Path) -> Iterator[tuple[Any, FakeContext]]:
    context = FakeContext(model_dir, make_config(sample_rate=1.0))
    instance = load_handler("hookwatch_handler")()
    instance.initialize(context)
    yield instance, context
    instance.service.close()


SPLIT = load_split()


def digit(i: int = 0) -> list[Any]:
    return SPLIT.x_test[i].tolist()  # type: ignore[no-any-return]


def test_valid_requests_get_class_and_probabilities(handler: tuple[Any, FakeContext]) -> None:
    instance, context = handler
    body = json.dumps({"data": digit()}).encode()
    out = handled(instance, [{"body": body}, {"body": {"data": digit(1)}}], context)
    assert len(out) == 2
    for answer in out:
        assert 0 <= answer["class"] <= 9
        assert abs(sum(answer["probabilities"]) - 1) < 1e-3
    assert context.statuses == {}


@pytest.mark.parametrize(
    ("payload", "expected", "got"),
    [
        (b"{not json", "a JSON object", "not JSON"),
        ({"pixels": [1, 2]}, '{"data"', "keys [pixels]"),
        ({"data": [1, 2, 3]}, "shape [1, 8, 8]", "shape [3]"),
        ({"data": [[1, 2], [3]]}, "rectangular array", "ragged"),
        ({"data": [99.0] * 64}, "values in [0, 16]", "[99, 99]"),
        ({"data": ["a"] * 64}, "rectangular array", "a list holding str 'a' at [0]"),
        (b'{"data": [NaN' + b", 0" * 63 + b"]}", "finite numbers", "NaN"),
        ([1, 2, 3], "shape [1, 8, 8]", "shape [3]"),  # a bare array is the payload
    ],
)
def test_bad_items_get_a_clear_4xx_and_the_rest_of_the_batch_is_served(
    handler: tuple[Any, FakeContext], payload: Any, expected: str, got: str
) -> None:
    instance, context = handler
    good = {"body": {"data": digit()}}
    out = handled(instance, [good, {"body": payload}, good], context)
    assert context.statuses == {1: (400, "Bad Request")}
    assert out[1]["code"] == 400
    assert expected in out[1]["expected"], out[1]
    assert got in out[1]["got"], out[1]
    assert out[0]["class"] == out[2]["class"]
    monitor = instance.service.monitor
    monitor.flush()
    counts = monitor._counts()
    # Received: three; the bad one is counted with its reason.
    assert counts.rejected == 1 and counts.requests == 3
    assert sum(counts.rejected_by.values()) == 1


def test_a_request_of_several_items_is_answered_a_list_in_order(
    handler: tuple[Any, FakeContext],
) -> None:
    """``{"instances": [x, y, z]}`` (a KServe or TF Serving client's batch) was a 400 "one item
    a request": each item is a sample of the forward beside the other requests', answered in
    order as it is alone, and watched as a sample (every request sampled here). Under
    ``instances`` the answer is their protocol's, ``{"predictions": [...]}``, for one item
    too; a list under ``data`` is answered a list."""
    instance, context = handler

    def captured() -> dict[str, float]:
        values = instance.service.monitor._metrics.sample_values()
        return {
            layer: sum(
                v
                for (n, labels), v in values.items()
                if n == "hookwatch_captures_total" and ("layer", layer) in labels
            )
            for layer in ("input", "output")
        }

    before = captured()  # the metric set is the process's: other tests count in it too
    alone = handled(instance, [{"body": {"data": digit(i)}} for i in range(4)], context)
    several = {"body": {"instances": [digit(1), digit(2), digit(3)]}}
    out = handled(instance, [{"body": {"data": digit(0)}}, several, {"body": b"{"}], context)
    assert out[0] == alone[0] and out[1] == {"predictions": alone[1:4]}
    assert out[2]["code"] == 400 and context.statuses == {2: (400, "Bad Request")}
    assert handled(instance, [{"body": {"data": [digit(1), digit(2)]}}], context) == [alone[1:3]]
    one = handled(instance, [{"body": {"instances": [digit(3)]}}], context)
    assert one == [{"predictions": [alone[3]]}]
    monitor = instance.service.monitor
    monitor.flush()
    # Requests are counted as requests; the sampled samples are the items.
    counts = monitor._counts()
    assert counts.requests == 4 + 3 + 1 + 1 and counts.rejected == 1
    assert counts.sampled == 4 + 2 + 1 + 1
    # Each item a sample of every watched layer: 4 + 1 + 3 + 2 + 1 rows.
    after = captured()
    assert {layer: after[layer] - before[layer] for layer in after} == {"input": 11, "output": 11}
    # The several items' rows were captured as samples, without a fault.
    assert monitor._gate.hook_faults() == {} and monitor._processor.faults == {}
    # Past input.max_items: a 413 saying the limit; a mixed list stays a 400.
    too_many = {"body": {"data": [digit(0)] * 65}}
    out = handled(instance, [too_many, {"body": {"data": [digit(0), [1, 2]]}}], context)
    assert out[0]["code"] == 413 and "at most 64 items" in out[0]["expected"], out[0]
    assert out[1]["code"] == 400


def test_a_csv_body_is_a_row_or_several(handler: tuple[Any, FakeContext]) -> None:
    """A batch-scoring client's ``text/csv`` body (TorchServe hands a text body over as a
    string): a line of numbers is the item, several lines several items, answered as JSON
    bodies are; a field that is not a number is a 400 naming it (it was "not JSON")."""
    instance, context = handler
    line = ",".join(repr(v) for v in torch.tensor(digit(2)).flatten().tolist())
    alone = handled(instance, [{"body": {"data": digit(2)}}], context)[0]
    out = handled(
        instance,
        [{"body": line}, {"body": (line + "\n" + line + "\n").encode()}, {"body": "1,x,3"}],
        context,
    )
    # As the JSON body is answered (a batch of three rows may round its last digit apart).
    for answer in (out[0], *out[1]):
        assert answer["class"] == alone["class"]
        assert answer["probabilities"] == pytest.approx(alone["probabilities"], abs=1e-5)
    assert len(out[1]) == 2
    assert out[2]["code"] == 400 and out[2]["got"] == "'x' in line 1", out[2]
    assert out[2]["expected"] == "CSV rows of numbers (or a JSON body)"
    # A line of column names first (pandas' to_csv, a spreadsheet's export) is skipped.
    names = ",".join(f"p{i}" for i in range(64))
    with_header = handled(instance, [{"body": f"{names}\r\n{line}\r\n{line}\r\n"}], context)
    assert [a["class"] for a in with_header[0]] == [alone["class"]] * 2
    # A spreadsheet's export opens with a byte-order mark: no header for it, no row lost.
    marked = [{"body": b"\xef\xbb\xbf" + f"{line}\n{line}\n".encode()}, {"body": f"\ufeff{line}"}]
    bom = handled(instance, marked, context)
    assert [a["class"] for a in bom[0]] == [alone["class"]] * 2
    assert bom[1]["class"] == alone["class"]
    # Semicolons (a spreadsheet of a comma-decimal locale) and tabs (TSV) separate fields too.
    other = [{"body": line.replace(",", sep) + "\n" + line.replace(",", sep)} for sep in ";\t"]
    for answers in handled(instance, other, context):
        assert [a["class"] for a in answers] == [alone["class"]] * 2
    # JSON sent as text with the mark: read as JSON.
    text = handled(instance, [{"body": "\ufeff" + json.dumps({"data": digit(2)})}], context)
    assert text[0]["class"] == alone["class"]


def npy(array: Any) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def test_an_npy_body_is_an_item_or_several(handler: tuple[Any, FakeContext]) -> None:
    """``numpy.save``'s bytes as the body (SageMaker's ``application/x-npy`` clients send an
    array so): the input's shape is the item, one dimension more the request's items, checked
    as JSON values are; it was a 400 "not JSON". Pickled objects are never loaded."""
    instance, context = handler
    alone = handled(instance, [{"body": {"data": digit(i)}} for i in range(3)], context)
    items = np.array([digit(1), digit(2)], dtype=np.float32)
    bodies = [
        npy(np.array(digit(0), dtype=np.float64)),
        npy(items),
        npy(items[:1]),
        npy(np.array(digit(0)) * 10),
        npy(np.array([{"a": 1}], dtype=object)),
        npy(np.zeros((3, 3))),
    ]
    out = handled(instance, [{"body": body} for body in bodies], context)
    assert out[0] == alone[0]
    assert [a["class"] for a in out[1]] == [alone[1]["class"], alone[2]["class"]]
    assert out[2] == alone[1]  # a batch of one is the item, answered as one
    assert context.statuses == {i: (400, "Bad Request") for i in (3, 4, 5)}
    assert "values in [0, 16]" in out[3]["expected"]
    assert out[4]["got"] == "an array of dtype object"
    assert out[5]["got"] == "an array of shape [3, 3]"


def test_a_batch_of_only_bad_items_runs_no_forward(handler: tuple[Any, FakeContext]) -> None:
    instance, context = handler
    out = handled(instance, [{"body": b""}, {"data": None}], context)
    assert [a["code"] for a in out] == [400, 400]
    counts = instance.service.monitor._counts()
    # Both received and rejected; no forward ran, so none was sampled.
    assert (counts.requests, counts.rejected, counts.sampled) == (2, 2, 0)


def test_an_unknown_layer_fails_the_load_with_close_matches(model_dir: Path) -> None:
    context = FakeContext(model_dir, make_config(layers=["act1", "fc_1"]))
    with pytest.raises(ConfigError, match=r"'fc_1'.*close matches: fc1, fc2"):
        load_handler("hookwatch_handler")().initialize(context)


def test_a_missing_input_section_fails_the_load(model_dir: Path) -> None:
    config = make_config()
    del config["handler"]["input"]
    with pytest.raises(ConfigError, match=r"handler\.input: expected a mapping"):
        load_handler("hookwatch_handler")().initialize(FakeContext(model_dir, config))


def test_an_archive_from_hookwatch_archive_is_built_by_the_handler(tmp_path: Path) -> None:
    """The adapter builds the model from hookwatch-model.json: a class with constructor
    arguments and a keyword-argument forward, which TorchServe's own loader cannot build."""
    import zipfile

    import numpy as np

    from hookwatch.tools.own_model import ModelRef, archive_model

    reference = tmp_path / "ref.npy"
    np.save(reference, np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32))
    mar = archive_model(
        ModelRef.parse(str(ROOT / "models/regression/model.py:RegressionMLP")),
        "regression",
        ROOT / "models/regression/model-config.yaml",
        reference,
        tmp_path / "store",
        tmp_path / "build",
        args={"inputs": 8},
        say=lambda *_: None,
    )
    model_dir = tmp_path / "extracted"
    with zipfile.ZipFile(mar) as archive:
        archive.extractall(model_dir)
        config = yaml.safe_load(archive.read("model-config.yaml"))
    context = FakeContext(model_dir, config, model_name="regression", serialized_file="weights.pt")
    handler = load_handler("hookwatch_handler")()
    handler.initialize(context)
    try:
        out = handled(handler, [{"body": {"data": [0.5] * 8}}, {"body": {"data": [1]}}], context)
        assert set(out[0]) == {"values"} and out[1]["code"] == 400
        monitor = handler.service.monitor
        assert monitor._drift is not None  # the archived profile loaded
        assert monitor.config.layers == ("body.1", "body.3")  # layer_types: [GELU]
    finally:
        handler.service.close()


def _config_and_reference(tmp_path: Path, width: int, layer: str) -> tuple[Path, Path]:
    """A model-config of a ``[width]`` input watching ``layer``, and 64 reference samples."""
    import numpy as np

    config = tmp_path / "model-config.yaml"
    monitoring = {"layers": [layer]}
    config.write_text(
        yaml.safe_dump({"handler": {"input": {"shape": [width]}, "monitoring": monitoring}})
    )
    reference = tmp_path / "ref.npy"
    rng = np.random.default_rng(0)
    np.save(reference, rng.normal(size=(64, width)).astype(np.float32))
    return config, reference


#: A module of a user's project: a block of a linear layer and a ReLU, 6 features.
BLOCK_SOURCE = (
    "from torch import nn\n\n"
    "class Block(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = nn.Linear(6, 6)\n"
    "        self.act = nn.ReLU()\n\n"
    "    def forward(self, x):\n"
    "        return self.act(self.fc(x))\n"
)


def test_an_archive_carries_the_modules_and_packages_its_model_file_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model file that imports a sibling module and a sibling package: archiving without
    them is refused (a worker would fail to import them), with them the handler builds it
    from the extracted archive alone."""
    import sys
    import zipfile

    from hookwatch.tools.own_model import ModelRef, archive_model

    source = tmp_path / "project"
    (source / "nets").mkdir(parents=True)
    (source / "nets" / "__init__.py").write_text("from nets.parts import Block\n")
    (source / "nets" / "parts.py").write_text(BLOCK_SOURCE)
    (source / "heads.py").write_text("from torch import nn\n\nHead = lambda: nn.Linear(6, 3)\n")
    (source / "split_model.py").write_text(
        "from torch import nn\nfrom heads import Head\nfrom nets import Block\n\n"
        "class Split(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.block = Block()\n"
        "        self.head = Head()\n\n"
        "    def forward(self, x):\n"
        "        return self.head(self.block(x))\n"
    )
    config, reference = _config_and_reference(tmp_path, 6, "block.act")
    ref = ModelRef.parse(f"{source / 'split_model.py'}:Split")

    def archive(extra: list[Path]) -> Path:
        return archive_model(
            ref,
            "split",
            config,
            reference,
            tmp_path / "store",
            tmp_path / "build",
            extra_files=extra,
            say=lambda *_: None,
        )

    monkeypatch.setattr(sys, "path", list(sys.path))  # the model's directory goes first
    with pytest.raises(ConfigError, match=r"got none for heads\.py, nets .*--extra-files"):
        archive([])
    mar = archive([source / "heads.py", source / "nets"])
    for name in ("heads", "nets", "nets.parts"):
        monkeypatch.delitem(sys.modules, name)  # a worker has only the archive
    model_dir = tmp_path / "extracted"
    with zipfile.ZipFile(mar) as archived:
        archived.extractall(model_dir)
    assert (model_dir / "heads.py").is_file() and (model_dir / "nets" / "parts.py").is_file()
    sys.path.remove(str(source))
    context = FakeContext(
        model_dir,
        yaml.safe_load(config.read_text()),
        model_name="split",
        serialized_file="weights.pt",
    )
    handler = load_handler("hookwatch_handler")()
    handler.initialize(context)
    try:
        out = handled(handler, [{"body": {"data": [0.5] * 6}}], context)
        assert set(out[0]) == {"class", "probabilities"}
        assert sys.modules["nets"].__file__ == str(model_dir / "nets" / "__init__.py")
    finally:
        handler.service.close()


@pytest.fixture
def forget_modules() -> Iterator[None]:
    """The modules a test imports from its own files, gone after it (another test's files
    may use the same names)."""
    import sys

    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("netpkg", "sizes", "acme_models")]:
        del sys.modules[name]


@pytest.mark.usefixtures("forget_modules")
def test_a_model_file_inside_a_package_imports_relatively_and_travels_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``project/netpkg/model.py`` doing ``from .blocks import Block`` was imported as a file
    of its own (ImportError: no known parent package, as a traceback). It is imported as
    ``netpkg.model``, its package archived whole, and the worker builds it from the archive;
    a module beside the package is still asked for. Its weights come from a training
    wrapper's checkpoint (``state_dict`` of ``model.``-prefixed names)."""
    import sys
    import zipfile

    from hookwatch.tools.own_model import ModelRef, archive_model, load_user_model

    project = tmp_path / "project"
    (project / "netpkg").mkdir(parents=True)
    (project / "netpkg" / "__init__.py").write_text("")
    (project / "netpkg" / "blocks.py").write_text(BLOCK_SOURCE)
    (project / "sizes.py").write_text("CLASSES = 3\n")
    (project / "netpkg" / "model.py").write_text(
        "from torch import nn\nfrom sizes import CLASSES\nfrom .blocks import Block\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.block = Block()\n"
        "        self.head = nn.Linear(6, CLASSES)\n\n"
        "    def forward(self, x):\n"
        "        return self.head(self.block(x))\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    ref = ModelRef.parse(f"{project / 'netpkg' / 'model.py'}:Net")
    model, spec = load_user_model(ref)
    assert type(model).__module__ == "netpkg.model" and spec.kind == "class"
    torch.manual_seed(3)
    trained = {f"model.{k}": torch.randn_like(v) for k, v in model.state_dict().items()}
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"state_dict": trained, "epoch": 4}, checkpoint)
    config, reference = _config_and_reference(tmp_path, 6, "block.act")

    said: list[str] = []
    (project / "netpkg" / ".cache").mkdir()
    (project / "netpkg" / ".cache" / "big.bin").write_bytes(b"x" * 1000)

    def archive(extra: list[Path]) -> Path:
        return archive_model(
            ref,
            "net",
            config,
            reference,
            tmp_path / "store",
            tmp_path / "build",
            weights=checkpoint,
            extra_files=extra,
            say=said.append,
        )

    # The package's own modules travel with it: only the module beside it is asked for.
    with pytest.raises(ConfigError, match=r"got none for sizes\.py\)? "):
        archive([])
    mar = archive([project / "sizes.py"])
    assert any(
        line.startswith("  model package netpkg (") and "netpkg/model.py imports from it" in line
        for line in said
    ), said
    with zipfile.ZipFile(mar) as archived:
        assert not [n for n in archived.namelist() if ".cache" in n]  # hidden: left out
    for name in ("sizes", "netpkg", "netpkg.blocks", "netpkg.model"):
        sys.modules.pop(name, None)  # a worker has only the archive
    sys.path.remove(str(project))
    model_dir = tmp_path / "extracted"
    x = [0.5, -1.0, 0.25, 2.0, 0.0, 1.5]
    with archived_handler(mar, model_dir) as (handler, context):
        out = handled(handler, [{"body": {"data": x}}], context)
    spec = json.loads((model_dir / "hookwatch-model.json").read_text())
    assert spec["file"] == "netpkg/model.py"
    served = sys.modules["netpkg.model"]
    assert served.__file__ == str(model_dir / "netpkg" / "model.py")
    expected = served.Net()
    expected.load_state_dict({k.removeprefix("model."): v for k, v in trained.items()})
    with torch.no_grad():
        probabilities = torch.softmax(expected(torch.tensor([x])), -1)[0]
    assert out[0]["probabilities"] == pytest.approx(probabilities.tolist(), abs=1e-5)


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (
            "import torch\nimport not_installed_here\n",
            r"^model: importing .*broken\.py raised ModuleNotFoundError at broken\.py:2: No "
            r"module named 'not_installed_here' \(install not_installed_here where",
        ),
        (
            "from .blocks import Block\n",
            r"ImportError at broken\.py:1: attempted relative import with no known parent "
            r"package \(a relative import outside a package: give its directory an __init__\.py",
        ),
        ("def Net(:\n", r"raised SyntaxError at broken\.py:1: "),
        (
            "from torch import nn\n\ndef Net():\n    raise FileNotFoundError('vocab.txt')\n",
            r"^model: Net\(\) raised FileNotFoundError at broken\.py:4: vocab\.txt$",
        ),
    ],
)
def test_a_model_file_that_fails_on_import_is_one_line_naming_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, said: str
) -> None:
    import sys

    from hookwatch.tools.own_model import ModelRef, load_user_model

    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "broken.py").write_text(source)
    with pytest.raises(ConfigError, match=said) as raised:
        load_user_model(ModelRef.parse(f"{tmp_path / 'broken.py'}:Net"))
    assert "\n" not in str(raised.value)


@pytest.mark.usefixtures("forget_modules")
def test_a_model_named_by_module_path_is_imported_by_name_where_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``acme_models.tabular:Net`` (uvicorn's form) of a package installed in site-packages,
    as the serving image installs it: the archive records the module and its distribution's
    version, carries none of its files, and a worker imports it by name (warning where its
    version differs). The same form for a module under the working directory is archived as
    its file is."""
    import sys
    import zipfile

    from hookwatch._model import ModelSpec, build_model
    from hookwatch.tools.own_model import ModelRef, archive_model

    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "acme_models").mkdir(parents=True)
    (site / "acme_models" / "__init__.py").write_text("")
    (site / "acme_models" / "tabular.py").write_text(
        "from torch import nn\n\n"
        "class Net(nn.Sequential):\n"
        "    def __init__(self):\n"
        "        super().__init__(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))\n"
    )
    info = site / "acme_models-0.3.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-models\nVersion: 0.3.1\n")
    (info / "top_level.txt").write_text("acme_models\n")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    work = tmp_path / "work"
    work.mkdir()
    (work / "local_net.py").write_text((site / "acme_models" / "tabular.py").read_text())
    monkeypatch.chdir(work)
    ref = ModelRef.parse("acme_models.tabular:Net")
    assert ref.module == "acme_models.tabular" and ref.name == "Net"
    # Named by its file in site-packages: the same module.
    by_file = ModelRef.parse(f"{site / 'acme_models' / 'tabular.py'}:Net")
    assert by_file.module == "acme_models.tabular"
    local = ModelRef.parse("local_net:Net")
    assert local.module == "" and local.path.resolve() == (work / "local_net.py").resolve()
    with pytest.raises(ConfigError, match=r"importable module\.path:Name, got 'acme_models\.no"):
        ModelRef.parse("acme_models.nope:Net")
    config, reference = _config_and_reference(tmp_path, 6, "1")
    said: list[str] = []
    mar = archive_model(
        ref, "acme", config, reference, tmp_path / "store", tmp_path / "build", say=said.append
    )
    assert any(
        "model module acme_models.tabular: a worker imports it by name from its own environment "
        "(install acme-models 0.3.1 in the serving image)" in s
        for s in said
    ), said
    with zipfile.ZipFile(mar) as archived:
        assert not [n for n in archived.namelist() if n.endswith(".py") and "acme" in n]
    for name in ("acme_models", "acme_models.tabular"):
        sys.modules.pop(name, None)
    model_dir = tmp_path / "extracted"
    with archived_handler(mar, model_dir) as (handler, context):
        out = handled(handler, [{"body": {"data": [0.5] * 6}}], context)
    assert set(out[0]) == {"class", "probabilities"}
    assert sys.modules["acme_models.tabular"].__file__ == str(site / "acme_models" / "tabular.py")
    spec = json.loads((model_dir / "hookwatch-model.json").read_text())
    assert spec["module"] == "acme_models.tabular" and spec["file"] == ""
    assert spec["distribution"] == "acme-models==0.3.1"
    assert "archived with" not in caplog.text
    # Another version where it is served: loaded, with a warning saying both versions.
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-models\nVersion: 0.4.0\n")
    with caplog.at_level("WARNING", logger="hookwatch"):
        build_model(ModelSpec.load(model_dir / "hookwatch-model.json"), model_dir)
    assert (
        "model module acme_models.tabular was archived with acme-models 0.3.1; this environment "
        "has acme-models 0.4.0 (install acme-models==0.3.1 where it is served" in caplog.text
    )
    # Not installed where the worker runs: one line, naming what to install.
    sys.path.remove(str(site))
    for name in ("acme_models", "acme_models.tabular"):
        sys.modules.pop(name, None)
    with pytest.raises(ConfigError, match=r"No module named 'acme_models' \(install its package"):
        build_model(ModelSpec.load(model_dir / "hookwatch-model.json"), model_dir)


def test_a_name_through_a_class_is_called_as_entry_points_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``zoo.py:Net.small`` and ``zoo:Net.small`` (a classmethod, as HuggingFace's
    ``transformers:AutoModel.from_pretrained`` builds a model) were refused as "expected
    path/file.py:Name": the name may go through classes, and is called as a factory."""
    import sys
    import zipfile

    from hookwatch.tools.own_model import ModelRef, archive_model, load_user_model

    (tmp_path / "zoo.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Net(nn.Sequential):\n"
        "    @classmethod\n"
        "    def small(cls, width=6):\n"
        "        torch.manual_seed(0)\n"
        "        return cls(nn.Linear(width, 4), nn.ReLU(), nn.Linear(4, 2))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for text in ("zoo.py:Net.small", "zoo:Net.small"):
        ref = ModelRef.parse(text)
        assert ref.name == "Net.small" and ref.path.name == "zoo.py", text
        model, spec = load_user_model(ref, {"width": 6})
        assert spec.kind == "factory" and isinstance(model, torch.nn.Sequential)
    with pytest.raises(ConfigError, match=r"expected 'Net\.large' in .*zoo\.py, got no such name"):
        load_user_model(ModelRef.parse("zoo.py:Net.large"))
    config, reference = _config_and_reference(tmp_path, 6, "1")
    mar = archive_model(
        ModelRef.parse("zoo.py:Net.small"),
        "zoo",
        config,
        reference,
        tmp_path / "store",
        tmp_path / "build",
        args={"width": 6},
        say=lambda _: None,
    )
    with zipfile.ZipFile(mar) as archived:
        assert json.loads(archived.read("hookwatch-model.json"))["name"] == "Net.small"
    sys.modules.pop("zoo", None)
    with archived_handler(mar, tmp_path / "extracted") as (handler, context):
        out = handled(handler, [{"body": {"data": [0.5] * 6}}], context)
    assert set(out[0]) == {"class", "probabilities"}


def test_a_file_a_model_argument_names_travels_in_the_archive(tmp_path: Path) -> None:
    """``--model-args '{"labels_file": "classes.json"}'``: the worker was given the build
    machine's path, which a container does not have. The file is archived, its name kept,
    and the worker's factory reads the archive's copy."""

    from hookwatch.tools.own_model import ModelRef, archive_model

    project = tmp_path / "project"
    project.mkdir()
    (project / "classes.json").write_text('{"width": 5}')
    (project / "sized.py").write_text(
        "import json\nfrom torch import nn\n\n"
        "def build(labels_file, hidden=8):\n"
        "    with open(labels_file) as f:\n"
        "        width = json.load(f)['width']\n"
        "    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, width))\n"
    )
    config, reference = _config_and_reference(tmp_path, 4, "1")
    said: list[str] = []
    mar = archive_model(
        ModelRef.parse(f"{project / 'sized.py'}:build"),
        "sized",
        config,
        reference,
        tmp_path / "store",
        tmp_path / "build",
        args={"labels_file": str(project / "classes.json"), "hidden": 8},
        say=said.append,
    )
    assert any("labels_file (classes.json)" in line for line in said), said
    (project / "classes.json").unlink()  # a worker elsewhere has only the archive
    model_dir = tmp_path / "extracted"
    with archived_handler(mar, model_dir) as (handler, context):
        out = handled(handler, [{"body": {"data": [0.5] * 4}}], context)
    assert len(out[0]["probabilities"]) == 5
    spec = json.loads((model_dir / "hookwatch-model.json").read_text())
    assert spec["files"] == {"labels_file": "classes.json"} and spec["args"] == {"hidden": 8}
