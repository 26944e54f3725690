"""``hookwatch bench MAR``'s parts that need no TorchServe: the archive it reads and the plain
copy it writes, the request bodies, the table, and the one-line errors."""

from __future__ import annotations

import ast
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from hookwatch._config import InputSpec
from hookwatch._errors import ConfigError
from hookwatch._service import decode_payload
from hookwatch.tools.bench import ab
from hookwatch.tools.bench.loadgen import Segment
from hookwatch.tools.cli import main
from hookwatch.tools.own_model import HANDLER_SOURCE

CONFIG: dict[str, Any] = {
    "batchSize": 1,
    "handler": {
        "input": {"shape": [2, 3], "min": -1.0, "max": 2.0},
        "monitoring": {"layers": ["fc"]},
    },
}
TEXT_CONFIG: dict[str, Any] = {
    "handler": {"input": {"text": {"tokenizer": "pretrained"}}, "monitoring": {"layers": ["x"]}}
}


def make_mar(
    path: Path, config: dict[str, Any] | None = None, handler_source: str = HANDLER_SOURCE
) -> Path:
    """An archive laid out as `hookwatch archive` writes one (manifest, handler, config)."""
    manifest = {
        "model": {
            "modelName": "tiny",
            "handler": "hookwatch_handler.py",
            "serializedFile": "weights.pt",
            "configFile": "model-config.yaml",
        }
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("hookwatch_handler.py", handler_source)
        archive.writestr("model-config.yaml", yaml.safe_dump(config or CONFIG))
        archive.writestr("weights.pt", b"\x00weights")
    return path


def test_reads_a_hookwatch_archive(tmp_path: Path) -> None:
    archive = ab.read_archive(make_mar(tmp_path / "tiny.mar"))
    assert archive.name == "tiny"
    assert archive.handler_file == "hookwatch_handler.py"
    assert archive.handler.input.shape == (2, 3)


def test_the_plain_copy_swaps_only_the_handler_for_unmonitored(tmp_path: Path) -> None:
    archive = ab.read_archive(make_mar(tmp_path / "tiny.mar"))
    plain = ab.plain_archive(archive, tmp_path / "store" / "tiny-plain.mar")
    with zipfile.ZipFile(archive.path) as a, zipfile.ZipFile(plain) as b:
        assert a.namelist() == b.namelist()
        for name in a.namelist():
            if name != "hookwatch_handler.py":
                assert a.read(name) == b.read(name), name
        source = b.read("hookwatch_handler.py").decode()
    tree = ast.parse(source)
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert [(n.module, [a.name for a in n.names]) for n in imports] == [
        ("hookwatch.torchserve", ["UnmonitoredHandler"])
    ]
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert len(classes) == 1
    assert [ast.unparse(base) for base in classes[0].bases] == ["UnmonitoredHandler"]
    # And the copy is no longer an archive the bench (or `hookwatch serve`) takes as hookwatch's.
    with pytest.raises(ConfigError, match=r"expected a \.mar built by `hookwatch archive`"):
        ab.read_archive(plain)


def test_the_plain_handler_serves_unmonitored() -> None:
    pytest.importorskip("ts")
    from hookwatch.torchserve import UnmonitoredHandler

    namespace: dict[str, Any] = {}
    exec(compile(ab.PLAIN_HANDLER_SOURCE, "hookwatch_handler.py", "exec"), namespace)
    assert issubclass(namespace["Handler"], UnmonitoredHandler)
    assert namespace["Handler"].monitored is False


def test_synthesized_bodies_decode_as_requests_within_the_declared_range() -> None:
    spec = InputSpec.from_mapping(CONFIG["handler"]["input"])
    bodies = ab.synthesize(spec, count=5)
    assert len(bodies) == 5 and len(set(bodies)) == 5
    for body in bodies:
        tensor = decode_payload(body, spec)  # the serving decoder takes it
        assert tuple(tensor.shape) == (2, 3)
        assert float(tensor.min()) >= -1.0 and float(tensor.max()) <= 2.0


@pytest.mark.parametrize(
    ("raw", "check"),
    [
        ({"shape": [4]}, lambda v: all(0.0 <= x <= 1.0 for x in v)),
        ({"shape": [4], "min": 5}, lambda v: all(5.0 <= x <= 6.0 for x in v)),
        (
            {"shape": [4], "dtype": "int64", "min": 0, "max": 9},
            lambda v: all(isinstance(x, int) and 0 <= x <= 9 for x in v),
        ),
        ({"shape": [4], "dtype": "bool"}, lambda v: all(x in (0, 1) for x in v)),
        ({"shape": [4], "field": "inputs"}, None),
    ],
)
def test_synthesized_bodies_follow_dtype_and_range(raw: dict[str, Any], check: Any) -> None:
    spec = InputSpec.from_mapping(raw)
    for body in ab.synthesize(spec, count=3):
        values = json.loads(body)[spec.field]
        assert len(values) == 4
        if check is not None:
            assert check(values), values


def test_synthesized_bodies_of_a_variable_length_vary_in_it() -> None:
    """Every synthesized request was at input.max_length, so no benched batch padded
    anything: lengths are drawn from 1 to it, each a request the serving decoder takes."""
    spec = InputSpec.from_mapping({"shape": [None, 3], "max_length": 12})
    bodies = ab.synthesize(spec, count=40)
    lengths = {len(json.loads(body)["data"]) for body in bodies}
    assert min(lengths) >= 1 and max(lengths) <= 12 and len(lengths) > 5, lengths
    for body in bodies:
        assert tuple(decode_payload(body, spec).shape)[1:] == (3,)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_an_image_model_is_benched_on_image_files(channels: int, tmp_path: Path) -> None:
    spec = InputSpec.from_mapping({"shape": [channels, 20, 30], "encoding": "image"})
    bodies = ab.synthesize(spec, count=3)
    assert len(set(bodies)) == 3 and ab.content_type(bodies) == "application/octet-stream"
    for body in bodies:  # image files, which the serving decoder reads as such
        assert tuple(decode_payload(body, spec).shape) == (channels, 20, 30)
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(bodies[0])
    assert ab.read_requests(photo) == [bodies[0]]
    assert ab.content_type([b'{"data": [1]}']) == "application/json"


def test_a_text_model_needs_request_bodies() -> None:
    spec = InputSpec.from_mapping(TEXT_CONFIG["handler"]["input"])
    with pytest.raises(ConfigError, match=r"expected --request FILE .* text model, got none"):
        ab.synthesize(spec)


def test_request_files_one_body_or_one_a_line(tmp_path: Path) -> None:
    one = tmp_path / "request.json"
    one.write_text(json.dumps({"data": [1, 2]}, indent=2))
    assert [json.loads(b) for b in ab.read_requests(one)] == [{"data": [1, 2]}]
    many = tmp_path / "requests.jsonl"
    many.write_text('{"data": [1]}\n\n{"data": [2]}\n')
    assert ab.read_requests(many) == [b'{"data": [1]}', b'{"data": [2]}']
    many.write_text('{"data": [1]}\n{"data": \n')
    with pytest.raises(ConfigError, match=r"requests.jsonl:2"):
        ab.read_requests(many)


def seg(rps: float, p50: float, p99: float) -> Segment:
    return Segment(
        requests=int(rps * 2), errors=0, duration_s=2.0, p50_ms=p50, p99_ms=p99, mean_ms=p50
    )


def test_the_table_shows_both_variants_and_the_ratios() -> None:
    result = ab.Result("tiny", "tiny.mar", ab.Settings(seconds=2, rounds=3), "synthesized")
    result.rounds = [
        {"plain": seg(100, 2.0, 4.0), "hookwatch": seg(95, 2.2, 4.4)},
        {"hookwatch": seg(90, 2.2, 5.0), "plain": seg(100, 2.0, 4.0)},
        {"plain": seg(200, 1.0, 2.0), "hookwatch": seg(196, 1.1, 2.4)},
    ]
    text = ab.render(result)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("|")}
    assert "| plain | hookwatch |" in text.splitlines()[3]
    # medians over rounds of each variant, and the median ratio with its min-max
    assert "| 100.00 | 95.00 | **0.950** (0.900-0.980) |" in rows["throughput (req/s)"]
    assert "| 2.00 | 2.20 | **1.100** (1.100-1.100) |" in rows["p50 latency (ms)"]
    assert "**1.200** (1.100-1.250)" in rows["p99 latency (ms)"]
    # The interval of the median, beside it: within the rounds' min-max.
    low, high = (float(v) for v in rows["throughput (req/s)"].split("|")[5].split("-"))
    assert 0.900 <= low <= 0.950 <= high <= 0.980
    # With the rounds' starts, the starts are resampled first: two rounds that agree on one
    # start and a third on another widen the interval to the rounds' min-max.
    result.round_starts = [0, 0, 1]
    started = ab.render(result)
    assert "on 2 start(s) of the workers" in started
    row = next(line for line in started.splitlines() if line.startswith("| throughput"))
    assert row.split("|")[5].strip() == "0.900-0.980"
    summary = json.loads(result.to_json())["summary"]
    assert [row["metric"] for row in summary] == ["throughput", "p50 latency", "p99 latency"]


def test_out_writes_markdown_or_json(tmp_path: Path) -> None:
    result = ab.Result("tiny", "tiny.mar", ab.Settings(rounds=1), "synthesized")
    result.rounds = [{"plain": seg(100, 2.0, 4.0), "hookwatch": seg(95, 2.2, 4.4)}]
    ab.write(result, tmp_path / "r.md")
    assert (tmp_path / "r.md").read_text() == ab.render(result)
    ab.write(result, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["rounds"][0]["plain"]["p99_ms"] == 4.0


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("hookwatch bench: error: ") and "expected" in err, err
    return err


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "got no such file" in one_line_error(capsys, str(tmp_path / "missing.mar"))
    (tmp_path / "notes.txt").write_text("x")
    assert "got notes.txt" in one_line_error(capsys, str(tmp_path / "notes.txt"))
    (tmp_path / "broken.mar").write_text("not a zip")
    assert "got BadZipFile" in one_line_error(capsys, str(tmp_path / "broken.mar"))
    foreign = make_mar(tmp_path / "foreign.mar", handler_source="from ts import BaseHandler\n")
    assert "built by `hookwatch archive`" in one_line_error(capsys, str(foreign))
    text = make_mar(tmp_path / "text.mar", TEXT_CONFIG)
    assert "--request FILE" in one_line_error(capsys, str(text))
    tiny = make_mar(tmp_path / "tiny.mar")
    missing = str(tmp_path / "none.jsonl")
    assert "--request" in one_line_error(capsys, str(tiny), "--request", missing)
    assert "--out" in one_line_error(capsys, str(tiny), "--out", "table.txt")
    assert "--rounds" in one_line_error(capsys, str(tiny), "--rounds", "0")
