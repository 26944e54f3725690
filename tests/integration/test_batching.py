"""TorchServe's dynamic batching with monitoring, on the real stack: the image demo and the
MiniLM text model. Requests that arrive together are batched into one forward (counted from
TorchServe's own per-batch metric lines), yet each request is counted and answered on its own
(and sampled with the rest of its forward): a bad one gets its 4xx, the rest of its batch is
served, no worker restarts, and texts of different lengths answer exactly what they answer
alone."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import Stack, http_post
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.conftest import ROOT, require
from tests.integration.helpers import build_variant, demo_config, eventually, scrape, total
from tests.unit.test_variable_length import MODELS as SEQUENCE_MODELS

pytestmark = pytest.mark.integration

TEXT_MAR = ROOT / "model_store" / "minilm.mar"


def post_together(stack: Stack, bodies: Sequence[Any]) -> list[tuple[int, Any]]:
    """POST every body at the same moment, one thread each; the replies in body order."""
    url = f"http://127.0.0.1:{stack.ports.inference}/predictions/{stack.model_name}"
    return post_all(
        [
            (
                url,
                body if isinstance(body, bytes) else json.dumps(body).encode(),
                "application/json",
            )
            for body in bodies
        ]
    )


def post_all(sends: Sequence[tuple[str, bytes, str]]) -> list[tuple[int, Any]]:
    """POST each ``(url, body, content type)`` at the same moment, one thread each; the
    replies, parsed, in order."""
    start = threading.Barrier(len(sends))
    replies: list[tuple[int, Any]] = [(0, None)] * len(sends)

    def send(index: int) -> None:
        url, body, kind = sends[index]
        start.wait()
        status, reply = http_post(url, body, kind, timeout=120)
        replies[index] = (status, json.loads(reply))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(sends))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return replies


#: TorchServe's per-batch metric line: after the host name and a timestamp, the ids of the
#: batch's requests.
PREDICTION = re.compile(
    r"result=\[METRICS\]PredictionTime\.\S+#hostname:[^,]*,\d+,([^ ]*), pattern"
)


def batch_sizes(stack: Stack) -> list[int]:
    """Requests per forward TorchServe ran, from its log: one PredictionTime line per batch."""
    log = stack.logs / "ts_log.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    # TorchServe logs each line twice; a batch's ids are unique.
    batches = dict.fromkeys(m.group(1) for m in PREDICTION.finditer(text))
    return [len(ids.rstrip(",").split(",")) for ids in batches]


def batched(stack: Stack, before: int, sent: int) -> list[int]:
    """The batches of the last ``sent`` requests, once all of them have run."""
    sizes = batch_sizes(stack)[before:]
    assert sum(sizes) == sent, sizes
    return sizes


def test_image_demo_batched_requests_are_monitored_and_answered_one_by_one(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    config = demo_config(sample_rate=1.0)
    config.update(batchSize=8, maxBatchDelay=300)
    build_variant(store, config)
    stack = make_stack("batch", workers=1, model_store=store)
    stack.start_torchserve()
    stack.start_exporter()
    workers = stack.worker_pids()
    split = load_split()
    good = [{"data": split.x_test[i].tolist()} for i in range(21)]
    bad: list[Any] = [{"data": [[0] * 8] * 7}, b"{oops", {"data": [[99] * 8] * 8}]
    bodies = [*good[:7], bad[0], *good[7:14], bad[1], *good[14:], bad[2]]
    before = len(batch_sizes(stack))
    replies = post_together(stack, bodies)
    statuses = [status for status, _ in replies]
    assert statuses.count(200) == 21 and statuses.count(400) == 3, statuses
    for (status, reply), body in zip(replies, bodies, strict=True):
        if status == 400:
            assert reply["expected"] and reply["got"], reply
            assert body in bad
    answered = [reply["class"] for status, reply in replies if status == 200]
    assert sum(a == int(y) for a, y in zip(answered, split.y_test[:21], strict=True)) >= 19
    # TorchServe batched them, bad requests among good ones: batches of several requests.
    sizes = eventually(lambda: batched(stack, before, len(bodies)), timeout=20)
    assert max(sizes) > 1, sizes

    def counted() -> None:
        samples = scrape(stack.ports.exporter)
        # Every request counts, served or rejected.
        assert total(samples, "hookwatch_requests_total", model="digits") == 24
        assert total(samples, "hookwatch_requests_rejected_total", model="digits") == 3
        for layer in ("input", "act1", "act3", "output"):
            # Per request: each good request is one sample of each layer, the bad ones none.
            assert total(samples, "hookwatch_captures_total", layer=layer) == 21, layer
            assert total(samples, "hookwatch_monitor_faults_total", layer=layer) == 0, layer

    eventually(counted, timeout=30)
    assert stack.worker_pids() == workers  # a bad request never restarts a worker


def test_other_serving_protocols_reach_the_model_on_torchserves_own_paths(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """Clients of other servers, on the real TorchServe: the Open Inference Protocol (KServe
    v2, Triton's client) on ``/v2/models/<name>/infer``, JSON and binary; KServe v1's
    ``instances`` on ``/v1/models/<name>:predict``; an ``.npy`` and a CSV body on
    ``/predictions``. Each answers every item its own class, batched beside the others."""
    import io

    store = tmp_path / "store"
    config = demo_config(sample_rate=1.0)
    config.update(batchSize=8, maxBatchDelay=200)
    build_variant(store, config)
    stack = make_stack("protocols", workers=1, model_store=store)
    stack.start_torchserve()
    split = load_split()
    x = split.x_test[:4].astype(np.float32)
    base = f"http://127.0.0.1:{stack.ports.inference}"
    alone = [
        json.loads(
            http_post(f"{base}/predictions/digits", json.dumps({"data": v.tolist()}).encode())[1]
        )
        for v in x
    ]
    v2 = {
        "id": "r-1",
        "inputs": [
            {
                "name": "input-0",
                "shape": [4, 1, 8, 8],
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ],
    }
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [2, 1, 8, 8],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x[:2].nbytes},
                }
            ]
        }
    ).encode()
    npy = io.BytesIO()
    np.save(npy, x[2:])
    csv = "\n".join(",".join(repr(float(v)) for v in row.ravel()) for row in x[:2])
    sends = [
        (f"{base}/v2/models/digits/infer", json.dumps(v2).encode(), "application/json"),
        (f"{base}/v2/models/digits/infer", header + x[:2].tobytes(), "application/octet-stream"),
        (
            f"{base}/v1/models/digits:predict",
            json.dumps({"instances": x[1:3].tolist()}).encode(),
            "application/json",
        ),
        (f"{base}/predictions/digits", npy.getvalue(), "application/octet-stream"),
        (f"{base}/predictions/digits", csv.encode(), "text/csv"),
        (
            f"{base}/v2/models/digits/infer",
            b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2]}]}',
            "application/json",
        ),
    ]
    replies = post_all(sends)
    classes = [a["class"] for a in alone]
    (s0, r0), (s1, r1), (s2, r2), (s3, r3), (s4, r4), (s5, r5) = replies
    assert [s0, s1, s2, s3, s4] == [200] * 5, replies
    assert r0["model_name"] == "digits" and r0["id"] == "r-1"
    outputs = {o["name"]: o for o in r0["outputs"]}
    assert outputs["class"]["data"] == classes and outputs["probabilities"]["shape"] == [4, 10]
    assert r1["outputs"][0]["data"] == classes[:2]
    assert [a["class"] for a in r2["predictions"]] == classes[1:3]
    assert [a["class"] for a in r3] == classes[2:]
    assert [a["class"] for a in r4] == classes[:2]
    assert s5 == 400 and r5["error"].startswith("expected inputs[0] ('x').data: 3 values"), r5


TEXTS = [
    "The disk is full.",
    "Real programmers don't comment their code. If it was hard to write, it should be hard "
    "to understand and harder to modify.",
    "Print is dead.",
    "Never trust a computer you can't throw out a window.",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may "
    "be on his first entering a neighbourhood, this truth is so well fixed in the minds of the "
    "surrounding families.",
    "Call me Ishmael.",
    "There are 10 kinds of people: those who understand binary and those who don't.",
    "All happy families are alike; each unhappy family is unhappy in its own way.",
]


def test_text_model_batches_texts_of_any_length_and_fails_only_the_bad_one(
    make_stack: Callable[..., Stack],
) -> None:
    require(TEXT_MAR.is_file(), f"{TEXT_MAR} (make mar builds it)")
    stack = make_stack("text", workers=1, models="minilm.mar", model_name="minilm")
    stack.start_torchserve(timeout=300)
    stack.start_exporter()
    workers = stack.worker_pids()
    bad: list[Any] = ["x" * 2500, 42, [], b"\xff\xfe"]
    bodies: list[Any] = [*TEXTS[:3], bad[0], [TEXTS[3], TEXTS[4]], bad[1], *TEXTS[5:], bad[2]]
    bodies += [*TEXTS[:4], bad[3]]
    before = len(batch_sizes(stack))
    replies = post_together(stack, bodies)
    expected = {0: 413, 1: 400, 2: 400, 3: 400}
    for (status, reply), body in zip(replies, bodies, strict=True):
        if any(body is b for b in bad):
            index = next(i for i, b in enumerate(bad) if body is b)
            assert status == expected[index], (body, status, reply)
            assert reply["expected"] and reply["got"], reply
        else:
            assert status == 200, (status, reply)
    sizes = eventually(lambda: batched(stack, before, len(bodies)), timeout=20)
    assert max(sizes) > 1, sizes
    # Alone, one at a time: no padding from a longer neighbour. Same embeddings.
    alone = {text: post_together(stack, [text])[0][1]["embedding"] for text in TEXTS}
    for (status, reply), body in zip(replies, bodies, strict=True):
        if status != 200:
            continue
        answers = reply if isinstance(body, list) else [reply]
        texts = body if isinstance(body, list) else [body]
        for answer, text in zip(answers, texts, strict=True):
            torch.testing.assert_close(
                torch.tensor(answer["embedding"]), torch.tensor(alone[text]), atol=2e-5, rtol=1e-4
            )
    # JSON declared with a charset (TorchServe parses only `application/json` exactly, and
    # hands this one over as bytes) is read as JSON, not as its characters; JSON that does
    # not parse is a 400 (both were answered as a text before).
    url = f"http://127.0.0.1:{stack.ports.inference}/predictions/minilm"
    declared = json.dumps({"text": TEXTS[0]}).encode()
    (ok, same), (broken, said) = post_all(
        [
            (url, declared, "application/json; charset=utf-8"),
            (url, b'{"text": "abc', "application/json"),
        ]
    )
    assert ok == 200 and broken == 400 and "not JSON" in said["got"], (same, said)
    torch.testing.assert_close(
        torch.tensor(same["embedding"]), torch.tensor(alone[TEXTS[0]]), atol=2e-5, rtol=1e-4
    )
    # Every request counts, served or rejected: the batch's bodies and the texts sent alone.
    requests = len(bodies) + len(TEXTS) + 2

    def counted() -> None:
        samples = scrape(stack.ports.exporter)
        assert total(samples, "hookwatch_requests_total", model="minilm") == requests
        assert total(samples, "hookwatch_requests_rejected_total", model="minilm") == len(bad) + 1
        sampled = total(samples, "hookwatch_requests_sampled_total", model="minilm")
        captured = total(samples, "hookwatch_captures_total", layer="input")
        # Rows, not requests: a sampled request of two texts is two samples.
        assert 0 < sampled <= captured <= sampled + 1
        for layer in ("encoder.encoder.layer.0.output", "encoder.encoder.layer.5.output"):
            assert total(samples, "hookwatch_captures_total", layer=layer) == captured, layer
        for layer in ("all", "input", "encoder.encoder.layer.3.output", "output"):
            assert total(samples, "hookwatch_monitor_faults_total", layer=layer) == 0, layer

    eventually(counted, timeout=30)
    assert stack.worker_pids() == workers


def test_inputs_of_any_length_are_padded_per_batch_and_answered_as_alone(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """A model whose input has a length each request chooses (``shape: [null, 3]``), batched
    by TorchServe: each batch is padded to its longest, the model packs by the lengths it is
    given, and every request gets what it gets alone; a request past ``max_length`` gets its
    400 and the rest of its batch is served, the worker never restarts."""
    (tmp_path / "seq.py").write_text(SEQUENCE_MODELS)
    config = tmp_path / "model-config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "batchSize": 8,
                "maxBatchDelay": 300,
                "handler": {
                    "input": {"shape": [None, 3], "max_length": 20, "lengths": "lengths"},
                    "monitoring": {"layers": ["act", "lstm"], "sample_rate": 1.0},
                },
            }
        )
    )
    rng = np.random.default_rng(0)

    def series(count: int) -> list[list[list[float]]]:
        return [
            rng.standard_normal((int(rng.integers(2, 21)), 3)).round(4).tolist()
            for _ in range(count)
        ]

    lines = [json.dumps({"data": s}) for s in series(80)]
    (tmp_path / "ref.jsonl").write_text("\n".join(lines) + "\n")
    store = tmp_path / "store"
    archive_model(
        ModelRef.parse(f"{tmp_path / 'seq.py'}:Packed"),
        "seq",
        config,
        tmp_path / "ref.jsonl",
        store,
        tmp_path / "build",
        say=lambda _line: None,
    )
    stack = make_stack("seq", workers=1, model_store=store, models="seq.mar", model_name="seq")
    stack.start_torchserve(timeout=300)
    stack.start_exporter()
    workers = stack.worker_pids()
    sent = series(10)
    bodies: list[Any] = [{"data": s} for s in sent]
    bodies.insert(4, {"data": [[0.0, 0.0, 0.0]] * 21})
    before = len(batch_sizes(stack))
    replies = post_together(stack, bodies)
    assert replies[4][0] == 400 and replies[4][1]["expected"] == "shape [<=20, 3]", replies[4]
    sizes = eventually(lambda: batched(stack, before, len(bodies)), timeout=20)
    assert max(sizes) > 1, sizes
    for (status, reply), body in zip(replies[:4] + replies[5:], sent, strict=True):
        assert status == 200, (status, reply)
        alone_status, alone = post_together(stack, [{"data": body}])[0]
        assert alone_status == 200 and alone["class"] == reply["class"]
        torch.testing.assert_close(
            torch.tensor(reply["probabilities"]),
            torch.tensor(alone["probabilities"]),
            atol=2e-5,
            rtol=1e-4,
        )

    def watched() -> None:
        samples = scrape(stack.ports.exporter)
        captured = total(samples, "hookwatch_captures_total", model="seq", layer="input")
        assert captured == len(sent) * 2  # every request sampled, batched and alone
        for layer in ("all", "input", "act", "lstm", "output"):
            assert total(samples, "hookwatch_monitor_faults_total", layer=layer) == 0, layer

    eventually(watched, timeout=30)
    assert stack.worker_pids() == workers
