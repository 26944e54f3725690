"""Generated and mutated payloads against the real TorchServe, interleaved with valid requests:
no 5xx, no worker restart, every valid request answered correctly, every reject counted with
its reason."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from hookwatch._names import REJECT_REASONS
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import Stack, http_post
from tests.integration.helpers import demo_model, eventually, scrape, total
from tests.payloads import (
    CONTENT_TYPES,
    EDGES,
    FORM_EDGES,
    oversized,
    payloads,
    valid_body,
)

pytestmark = pytest.mark.integration

#: Generated payloads per run (each followed by a valid request).
EXAMPLES = 2000
IMAGES = load_split().x_test[:50]


class Session:
    """The stack under fuzz and what it answered."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.url = f"http://127.0.0.1:{stack.ports.inference}/predictions/digits"
        self.statuses: Counter[int] = Counter()
        self.sent = 0
        self.valid = 0
        #: Bodies over the body limit as the handler gets them: each a 413, too_large.
        self.too_large = 0
        model = demo_model()
        with torch.inference_mode():
            self.expected = model(torch.from_numpy(IMAGES)).argmax(dim=1).tolist()

    def send(self, content_type: str, body: bytes) -> tuple[int, Any]:
        status, reply = http_post(self.url, body, content_type=content_type)
        self.sent += 1
        self.statuses[status] += 1
        try:
            return status, json.loads(reply)
        except ValueError:
            return status, reply

    def send_valid(self) -> None:
        i = self.valid % len(IMAGES)
        self.valid += 1
        status, answer = self.send("application/json", valid_body(IMAGES[i].tolist()))
        assert status == 200 and answer["class"] == self.expected[i], (status, answer)

    def send_bad(self, content_type: str, body: bytes) -> None:
        status, answer = self.send(content_type, body)
        assert status < 500, (status, answer, body[:200])
        big = oversized(content_type, body)
        self.too_large += big
        assert (status == 413) == big, (status, answer, content_type, len(body))
        if status >= 400:
            # What was expected and what came, from hookwatch (the frontend's own 413 for
            # bodies past its limit would say so too).
            assert "expected" in answer and "got" in answer, answer


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    from hookwatch.tools.devstack import Ports
    from tests.conftest import MAR, ROOT, require, require_binary

    require(MAR.exists(), f"{MAR} (make mar builds it)")
    require_binary("java")
    stack = Stack(root=ROOT, run_dir=tmp_path_factory.mktemp("fuzz"), ports=Ports.free(), workers=2)
    try:
        stack.start_torchserve()
        stack.start_exporter()
        yield Session(stack)
    finally:
        stack.stop()


def _send_edges(session: Session) -> None:
    for content_type in CONTENT_TYPES:
        for body in (*EDGES, *FORM_EDGES):
            session.send_bad(content_type, body)
            session.send_valid()


def test_edge_payloads_in_every_content_type(session: Session) -> None:
    _send_edges(session)


def test_generated_payloads_interleaved_with_valid_requests(session: Session) -> None:
    sent = session.sent

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(payload=payloads(valid_body(IMAGES[0].tolist())))
    def bad_then_valid(payload: tuple[str, bytes]) -> None:
        session.send_bad(*payload)
        session.send_valid()

    bad_then_valid()
    assert session.sent - sent >= 2 * EXAMPLES, session.sent - sent


def test_nothing_restarted_and_every_request_counted(session: Session) -> None:
    """Whatever else ran on this stack before, in any order: the edge payloads, sent here,
    then everything the stack was sent (this test's and any other's) counted, by reason."""
    _send_edges(session)
    stack = session.stack
    assert not [s for s in session.statuses if s >= 500], session.statuses
    # The workers that started are the ones serving: no crash, no restart.
    assert len(stack.worker_pids()) == 2 and stack.ready_workers() == 2
    rejected = sum(n for s, n in session.statuses.items() if s >= 400)

    def counted() -> dict[Any, float]:
        samples = scrape(stack.ports.exporter)
        assert total(samples, "hookwatch_requests_total", model="digits") == session.sent
        assert total(samples, "hookwatch_requests_rejected_total", model="digits") == rejected
        too_large = total(
            samples, "hookwatch_requests_rejected_total", model="digits", reason="too_large"
        )
        assert too_large == session.too_large, (too_large, session.too_large)
        return samples

    samples = eventually(counted, timeout=30)
    reasons = {
        dict(labels)["reason"]
        for (name, labels), value in samples.items()
        if name == "hookwatch_requests_rejected_total" and value > 0
    }
    assert reasons <= set(REJECT_REASONS) and "unreadable" not in reasons, reasons
    assert {"not_json", "too_deep", "wrong_shape", "too_large"} <= reasons, reasons
