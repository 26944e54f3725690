"""Generated and mutated payloads through the handler in process: every one is answered with a
class or a 4xx that says what was expected and what came, with a reason from the vocabulary.

The real server gets the same payloads in tests/integration/test_fuzz.py; this one finds a
decoder gap in seconds and shrinks it to the smallest payload that shows it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from hookwatch._names import REJECT_REASONS
from hookwatch.tools.demo import digits_cnn
from hookwatch.tools.demo.data import load_split
from tests.fakes import FakeContext, handled, load_handler
from tests.payloads import EDGES, FORM_EDGES, as_delivered, oversized, payloads, valid_body
from tests.unit.test_handler import make_config

IMAGE = load_split().x_test[0].tolist()
VALID = valid_body(IMAGE)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, FakeContext]]:
    import sys

    model_dir = tmp_path_factory.mktemp("model")
    sys.path.insert(0, str(model_dir))
    (model_dir / "digits_cnn.py").write_text(Path(digits_cnn.__file__).read_text())
    torch.manual_seed(0)
    torch.save(digits_cnn.DigitsCNN().state_dict(), model_dir / "digits_cnn.pt")
    context = FakeContext(model_dir, make_config(sample_rate=1.0))
    instance = load_handler("hookwatch_handler")()
    instance.initialize(context)
    yield instance, context
    instance.service.close()
    sys.path.remove(str(model_dir))


def _check(instance: Any, context: FakeContext, content_type: str, body: bytes) -> None:
    context.statuses.clear()
    too_large = instance.service.monitor._counts().rejected_by.get("too_large", 0)
    good = {"body": as_delivered("application/json", VALID)}
    out = handled(instance, [good, {"body": as_delivered(content_type, body)}, good], context)
    assert len(out) == 3
    # The valid neighbours are always served, whatever their batch mate.
    assert "class" in out[0] and out[0] == out[2]
    answer = out[1]
    # A class, the class of each item sent as a list, or the Open Inference Protocol's answer.
    if "class" in answer or isinstance(answer, list) or "outputs" in answer:
        assert 1 not in context.statuses and not oversized(content_type, body), len(body)
        return
    status = context.statuses[1][0]
    assert status in (400, 413), (answer, context.statuses)
    assert answer["code"] == status and answer["expected"] and answer["got"], answer
    # A body over the limit is a 413 counted as too_large, however it arrived; only that is.
    big = oversized(content_type, body)
    assert (status == 413) == big, (big, answer, len(body))
    counted = instance.service.monitor._counts().rejected_by.get("too_large", 0) - too_large
    assert counted == int(big), (counted, answer)
    # Every refusal is one hookwatch can name: "unreadable" is the safety net for a decoder gap.
    assert "unreadable" not in instance.service.monitor._counts().rejected_by, answer


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=payloads(VALID))
def test_generated_payloads_get_a_class_or_a_clear_4xx(
    served: tuple[Any, FakeContext], payload: tuple[str, bytes]
) -> None:
    instance, context = served
    _check(instance, context, *payload)


@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream"])
def test_edge_payloads_get_a_class_or_a_clear_4xx(
    served: tuple[Any, FakeContext], content_type: str
) -> None:
    instance, context = served
    before = instance.service.monitor._counts()
    edges = (*EDGES, *FORM_EDGES)
    for body in edges:
        _check(instance, context, content_type, body)
    after = instance.service.monitor._counts()
    assert set(after.rejected_by) <= set(REJECT_REASONS)
    # Each edge case was either served or rejected with a reason, and counted as received.
    assert after.requests - before.requests == 3 * len(edges)
    assert after.rejected - before.rejected >= len(edges) - 3
