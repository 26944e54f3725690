"""The Open Inference Protocol (KServe's v2; Triton's and MLServer's clients): a request of
``{"inputs": [{"name", "shape", "datatype", "data"}]}`` is served as the request's items (a row
of the first dimension each), answered as the protocol's response (an output tensor per key of
the answers); a malformed one is a 400 whose ``error`` says what was expected and what came.
It was a 400 "a list holding an object" before."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookwatch import _oip
from hookwatch._config import HandlerConfig
from hookwatch._errors import BadInputError
from hookwatch._metrics import MetricSet
from hookwatch._service import ModelService
from hookwatch.tools.demo import digits_cnn
from tests.fakes import FakeContext, handled, load_handler
from tests.tiny_text import TinyEncoder, save_tokenizer, words
from tests.unit.test_arguments import INPUT, MODEL
from tests.unit.test_handler import digit, make_config
from tests.unit.test_text import text_service


@pytest.fixture
def handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, FakeContext]]:
    """The digits CNN as a worker loads it, every request sampled."""
    monkeypatch.syspath_prepend(str(tmp_path))
    shutil.copy(digits_cnn.__file__, tmp_path / "digits_cnn.py")
    torch.manual_seed(0)
    torch.save(digits_cnn.DigitsCNN().state_dict(), tmp_path / "digits_cnn.pt")
    context = FakeContext(tmp_path, make_config(sample_rate=1.0))
    instance = load_handler("hookwatch_handler")()
    instance.initialize(context)
    yield instance, context
    instance.service.close()


def infer(*tensors: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"inputs": list(tensors), **extra}


def tensor(name: str, shape: list[int], data: Any, datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def flat(values: Any) -> list[float]:
    return torch.tensor(values, dtype=torch.float32).flatten().tolist()  # type: ignore[no-any-return]


def error_of(body: Any) -> BadInputError:
    with pytest.raises(BadInputError) as info:
        _oip.read_request(body)
    return info.value


def test_a_request_is_read_flat_or_nested_and_a_bad_one_says_where() -> None:
    nested = _oip.read_request(infer(tensor("x", [2, 3], [[1, 2, 3], [4, 5, 6]]), id="r1"))
    assert nested is not None and nested.id == "r1" and nested.outputs is None
    assert nested.only().data == (1, 2, 3, 4, 5, 6)
    assert nested.only().rows(1, "[3]") == [[1, 2, 3], [4, 5, 6]]
    # No batch dimension: one item.
    assert nested.only().rows(2, "[2, 3]") == [[[1, 2, 3], [4, 5, 6]]]
    with pytest.raises(BadInputError, match=r"x: shape \[N, 3, 2, 3\] \(N items of shape"):
        nested.only().rows(3, "[3, 2, 3]")
    raw = json.dumps(infer(tensor("x", [1, 2], [1, 2]), outputs=[{"name": "class"}])).encode()
    assert _oip.candidate(raw)
    parsed = _oip.read_request(raw)
    assert parsed is not None and parsed.outputs == ("class",)
    # Other bodies are no such request: read as they always were.
    for other in ({"inputs": [[1, 2]]}, {"inputs": [{"signal": [1]}]}, [1, 2], b"{bad"):
        assert _oip.read_request(other) is None
    assert not _oip.candidate({"data": [1]}) and not _oip.candidate(b"\x89PNG")
    e = error_of(infer(tensor("x", [1, 3], [1, 2])))
    assert "inputs[0] ('x').data: 3 values (shape [1, 3])" in e.expected and e.got == "2 values"
    # No rows: said as such ("0 values (shape [0]), at least one, got 0 values" before).
    e = error_of(infer(tensor("x", [0], [])))
    assert e.expected == "inputs[0] ('x').shape: a row or more of values" and e.got == "shape [0]"
    e = error_of(infer(tensor("x", [1], [1], datatype="FLOAT")))
    assert "datatype: one of" in e.expected and e.got == "'FLOAT'"
    e = error_of(infer(tensor("x", [1, 2], [[[1, 2]]])))
    assert e.reason == "too_deep"
    e = error_of(infer(tensor("t", [2], ["a", 3], datatype="BYTES")))
    assert e.expected.endswith("strings (BYTES)") and e.got == "int at [1]"
    e = error_of(infer(tensor("x", [1], ["a"])))
    assert e.got == "str 'a' at [0]"
    e = error_of(infer(tensor("x", [1], [1]), tensor("x", [1], [1])))
    assert "different names" in e.expected
    e = error_of(infer({"shape": [1], "datatype": "FP32", "data": [1]}))
    assert e.expected == "inputs[0].name: a string"


def binary(*inputs: tuple[str, list[int], str, bytes]) -> bytes:
    """A body as the binary tensor extension sends it (Triton's client by default): the JSON,
    then each input's bytes."""
    header = {
        "inputs": [
            {"name": n, "shape": s, "datatype": d, "parameters": {"binary_data_size": len(b)}}
            for n, s, d, b in inputs
        ],
        "parameters": {"binary_data_output": True},
    }
    return json.dumps(header).encode() + b"".join(b for *_, b in inputs)


def test_the_binary_tensor_extension_is_read() -> None:
    x = np.arange(6, dtype="<f4").reshape(2, 3)
    texts = b"".join(len(t).to_bytes(4, "little") + t for t in (b"ab", "cé".encode(), b"\xff"))
    body = binary(("x", [2, 3], "FP32", x.tobytes()), ("t", [3], "BYTES", texts))
    assert _oip.candidate(body)
    request = _oip.read_request(body)
    assert request is not None
    assert request.inputs[0].data == (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
    assert request.inputs[1].data == ("ab", "cé", b"\xff")  # not UTF-8: bytes (an image's)
    half = np.array([1.5, -2.0], dtype="<f4").view("<u4") >> 16  # bfloat16: the top half
    bf16 = _oip.read_request(binary(("x", [2], "BF16", half.astype("<u2").tobytes())))
    assert bf16 is not None and bf16.inputs[0].data == (1.5, -2.0)
    e = error_of(binary(("x", [2, 3], "FP32", x.tobytes()[:-4])))
    assert e.got == "5 values"
    e = error_of(binary(("x", [2], "FP32", x.tobytes()[:7])))
    assert "a whole number of FP32 values (4 bytes each)" in e.expected
    e = error_of(binary(("x", [2, 3], "FP32", x.tobytes())) + b"\0")
    assert e.got == "1 bytes left over"


def test_answers_are_output_tensors_a_row_per_sample() -> None:
    request = _oip.InferRequest((), id="7")
    answers = [
        {"class": 1, "probabilities": [0.25, 0.75], "labels": ["a"], "top": None},
        {"class": 0, "probabilities": [0.5, 0.5], "labels": ["a", "b"], "top": None},
    ]
    body = _oip.response(answers, request, "m")
    assert body["model_name"] == "m" and body["id"] == "7"
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["class"] == {"name": "class", "shape": [2], "datatype": "INT64", "data": [1, 0]}
    assert outputs["probabilities"]["shape"] == [2, 2]
    assert outputs["probabilities"]["datatype"] == "FP32"
    assert outputs["probabilities"]["data"] == [0.25, 0.75, 0.5, 0.5]
    # Ragged, or not numbers: a row of JSON each.
    assert outputs["labels"]["datatype"] == "BYTES"
    assert [json.loads(v) for v in outputs["labels"]["data"]] == [["a"], ["a", "b"]]
    assert outputs["top"]["data"] == ["null", "null"]
    names = _oip.response([{"class": "cat"}], _oip.InferRequest((), outputs=("class",)), "m")
    assert names["outputs"] == [
        {"name": "class", "shape": [1], "datatype": "BYTES", "data": ["cat"]}
    ]
    with pytest.raises(BadInputError, match=r"expected outputs among \[class\], got 'logits'"):
        _oip.response([{"class": 1}], _oip.InferRequest((), outputs=("logits",)), "m")


def test_a_protocol_request_is_served_as_its_items_and_answered_as_the_protocol(
    handler: tuple[Any, FakeContext],
) -> None:
    """The digits CNN (input ``[1, 8, 8]``): three items in one tensor ``[3, 1, 8, 8]``, their
    values flat, beside plain requests; answered with each item's own answer, as tensors."""
    instance, context = handler
    alone = handled(instance, [{"body": {"data": digit(i)}} for i in range(3)], context)
    three = infer(tensor("input-0", [3, 1, 8, 8], flat([digit(i) for i in range(3)])), id="a")
    raw = json.dumps(infer(tensor("x", [1, 1, 8, 8], digit(1)))).encode()  # not parsed, nested
    picked = infer(tensor("x", [1, 8, 8], digit(2)), outputs=[{"name": "class"}])
    packed = binary(("x", [1, 1, 8, 8], "FP32", np.array(digit(0), dtype="<f4").tobytes()))
    out = handled(
        instance,
        [
            {"body": three},
            {"body": {"data": digit(0)}},
            {"body": raw},
            {"body": picked},
            {"body": packed},
        ],
        context,
    )
    assert context.statuses == {}
    assert out[0]["model_name"] == context.model_name and out[0]["id"] == "a"
    outputs = {o["name"]: o for o in out[0]["outputs"]}
    assert outputs["class"]["data"] == [a["class"] for a in alone]
    assert outputs["class"]["datatype"] == "INT64" and outputs["probabilities"]["shape"] == [3, 10]
    got = torch.tensor(outputs["probabilities"]["data"]).reshape(3, 10)
    want = torch.tensor([a["probabilities"] for a in alone])
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    assert out[1] == alone[0]
    assert out[2]["outputs"][0]["data"] == [alone[1]["class"]]
    # The item without its batch dimension, and only the output asked for.
    assert out[3]["outputs"] == [
        {"name": "class", "shape": [1], "datatype": "INT64", "data": [alone[2]["class"]]}
    ]
    assert out[4]["outputs"][0]["data"] == [alone[0]["class"]]


def test_a_bad_protocol_request_is_a_400_its_client_can_read(
    handler: tuple[Any, FakeContext],
) -> None:
    instance, context = handler
    good = {"body": {"data": digit(0)}}
    short = infer(tensor("x", [1, 1, 8, 8], digit(0)[0][0]))
    wrong = infer(tensor("x", [1, 3], [1, 2, 3]))
    two = infer(tensor("x", [1, 1, 8, 8], digit(0)), tensor("y", [1], [1]))
    ask = infer(tensor("x", [1, 1, 8, 8], digit(0)), outputs=[{"name": "logits"}])
    many = infer(tensor("x", [65, 1, 8, 8], [0.0] * 65 * 64))
    narrow = infer(tensor("x", [2, 1, 8, 7], [0.0] * 2 * 56))
    bodies = [good, {"body": short}, {"body": wrong}, {"body": two}, {"body": ask}, {"body": many}]
    bodies.append({"body": narrow})
    out = handled(instance, bodies, context)
    assert context.statuses == {
        **{i: (400, "Bad Request") for i in range(1, 5)},
        5: (413, "Request Entity Too Large"),
        6: (400, "Bad Request"),
    }
    assert "class" in out[0]
    # The whole message under "error", as the protocol's clients raise it.
    assert out[1]["error"] == (
        "expected inputs[0] ('x').data: 64 values (shape [1, 1, 8, 8]), got 8 values"
    )
    assert out[2]["error"] == (
        "expected x: shape [N, 1, 8, 8] (N items of shape [1, 8, 8]), got shape [1, 3]"
    )
    assert (
        out[3]["error"]
        == "expected one input tensor (this model takes one input), got 2 tensors (x, y)"
    )
    assert out[4]["error"] == "expected outputs among [class, probabilities], got 'logits'"
    assert "at most 64 items" in out[5]["error"]
    assert out[6]["error"] == (
        "expected 2 items of shape [1, 8, 8] (shape [2, 1, 8, 8]), got shape [2, 1, 8, 7]"
    )
    monitor = instance.service.monitor
    monitor.flush()
    counts = monitor._counts()
    assert counts.requests == 7 and counts.rejected == 6, counts


def test_a_model_of_several_arguments_takes_a_tensor_per_argument(metrics: MetricSet) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(MODEL, "masked.py", "exec"), namespace)
    model = namespace["Masked"]().eval()
    config = HandlerConfig.from_mapping({"input": INPUT, "monitoring": {"layers": ["act"]}})
    service = ModelService.from_handler_config(model, config, "masked", metrics)
    signals = [[[0.5, 1, 2]] * 5, [[-1, 0, 1]] * 5]
    alone = [
        service.handle([{"signal": s, "lengths": [n]}])[0]
        for s, n in zip(signals, [3, 5], strict=True)
    ]
    body = infer(
        tensor("lengths", [2, 1], [3, 5], "INT64"), tensor("signal", [2, 5, 3], flat(signals))
    )
    missing = infer(tensor("signal", [2, 5, 3], flat(signals)))
    uneven = infer(
        tensor("lengths", [1, 1], [3], "INT64"), tensor("signal", [2, 5, 3], flat(signals))
    )
    out = service.handle([body, missing, uneven])
    service.close()
    outputs = {o["name"]: o for o in out[0]["outputs"]}
    assert outputs["class"]["data"] == [a["class"] for a in alone]
    assert out[0]["model_name"] == "masked"
    assert out[1]["error"] == "expected input tensors named [signal, lengths], got [signal]"
    assert (
        out[2]["error"] == "expected as many rows in each input tensor, got signal: 2, lengths: 1"
    )


def test_a_text_model_takes_its_texts_as_bytes(tmp_path: Path, metrics: MetricSet) -> None:
    tokenizer_dir = save_tokenizer(tmp_path / "tokenizer")
    service = text_service(TinyEncoder().eval(), "tiny", tokenizer_dir, metrics)
    texts = words(2, seed=3)
    alone = [service.handle([t])[0]["embedding"] for t in texts]
    out = service.handle(
        [
            infer(tensor("text", [2], texts, "BYTES")),
            infer(tensor("text", [1], [1.0])),
        ]
    )
    service.close()
    embedding = out[0]["outputs"][0]
    assert embedding["name"] == "embedding" and embedding["datatype"] == "FP32"
    assert embedding["shape"] == [2, len(alone[0])]
    torch.testing.assert_close(
        torch.tensor(embedding["data"]).reshape(2, -1), torch.tensor(alone), atol=1e-5, rtol=0
    )
    assert out[1]["error"] == "expected text: texts (BYTES), got FP32"


def test_an_image_model_takes_files_as_bytes_in_base64_or_binary(metrics: MetricSet) -> None:
    """Images as the protocol's clients send them: a BYTES tensor of files, base64 strings
    in JSON or the files' own bytes after it."""
    from tests.unit.test_image_input import RGB, _file

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(3)
    )
    model(torch.zeros(1, 3, 24, 40))
    model.eval()
    config = HandlerConfig.from_mapping(
        {"input": {"shape": [3, 24, 40], "encoding": "image"}, "monitoring": {"layers": ["1"]}}
    )
    service = ModelService.from_handler_config(model, config, "img", metrics)
    files = [_file(RGB), _file(RGB[::-1].copy())]
    alone = [service.handle([f])[0] for f in files]
    encoded = [base64.b64encode(f).decode() for f in files]
    elements = b"".join(len(f).to_bytes(4, "little") + f for f in files)
    out = service.handle(
        [
            infer(tensor("image", [2], encoded, "BYTES")),
            binary(("image", [2], "BYTES", elements)),
            infer(tensor("image", [1], ["**"], "BYTES")),
        ]
    )
    service.close()
    for answer in out[:2]:
        outputs = {o["name"]: o["data"] for o in answer["outputs"]}
        assert outputs["class"] == [a["class"] for a in alone]
        torch.testing.assert_close(
            torch.tensor(outputs["probabilities"]),
            torch.tensor([a["probabilities"] for a in alone]).flatten(),
            atol=2e-6,
            rtol=0,
        )
    assert "not base64" in out[2]["error"]
