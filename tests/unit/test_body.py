"""The body limit: one value, held for bytes, text and JSON TorchServe already parsed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hookwatch._body import (
    JSON_BYTES_PER_NUMBER,
    MAX_BODY_BYTES,
    MAX_DERIVED_BODY_BYTES,
    NoPayload,
    body_limit,
    check_body_size,
    over_limit,
)
from hookwatch._config import read_model_config
from hookwatch._errors import BadInputError, ConfigError
from hookwatch._metrics import MetricSet
from hookwatch._service import ModelService
from hookwatch.tools.demo.data import load_split
from tests.unit.test_faults import demo_model

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "models/digits/model-config.yaml").read_text())
IMAGE = load_split().x_test[0].tolist()


def compact(value: Any) -> bytes:
    """``value`` as the smallest JSON body a client could send for it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


# Strings without characters JSON escapes, so their encoded length is their UTF-8 length.
_text = st.text(
    st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters='"\\'), max_size=30
)
_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**30), 10**30),
        st.floats(allow_nan=False, allow_infinity=False),
        _text,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=12), st.dictionaries(_text, inner, max_size=6)
    ),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(value=_values)
def test_a_parsed_value_is_measured_as_its_compact_json(value: Any) -> None:
    # A string alone is a text/* body, measured without the quotes JSON would add.
    size = len(compact(value)) - (2 if isinstance(value, str) else 0)
    # Exactly at the size it is within the limit, one byte less is over it: the walk's bounds
    # never decide wrongly, and the exact count is the encoding's.
    assert not over_limit(value, size)
    assert over_limit(value, size - 1)


def test_bytes_and_text_are_measured_by_their_bytes() -> None:
    assert not over_limit(b"x" * 10, 10) and over_limit(bytearray(11), 10)
    assert not over_limit("é" * 5, 10) and over_limit("é" * 6, 10)
    with pytest.raises(BadInputError) as info:
        check_body_size(b"x" * (MAX_BODY_BYTES + 1))
    error = info.value
    assert (error.status, error.reason) == (413, "too_large")
    assert error.got == f"{MAX_BODY_BYTES + 1} bytes"
    assert error.expected == f"a body of at most {MAX_BODY_BYTES} bytes"


def padded(size: int) -> dict[str, Any]:
    """A valid digits request padded with an extra key to exactly ``size`` bytes of JSON."""
    body = {"data": IMAGE, "pad": ""}
    body["pad"] = "x" * (size - len(compact(body)))
    assert len(compact(body)) == size
    return body


def rejected(metrics: MetricSet, model: str) -> dict[str, float]:
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in metrics.sample_values().items()
        if name == "hookwatch_requests_rejected_total" and dict(labels)["model"] == model and value
    }


def test_a_tensor_model_holds_the_limit_for_every_content_type(metrics: MetricSet) -> None:
    config = copy.deepcopy(CONFIG)
    config["handler"]["monitoring"]["sample_rate"] = 1.0
    handler = read_model_config(config).handler
    service = ModelService.from_handler_config(demo_model(), handler, "digits", metrics)
    at, over = padded(MAX_BODY_BYTES), padded(MAX_BODY_BYTES + 1)
    bodies: list[Any] = [
        at,  # application/json: TorchServe hands it over parsed
        compact(at),  # any other content type: bytes
        over,
        compact(over),
        compact(over).decode(),  # text/*: a string
        padded(3 << 19),  # the 1.5 MiB body served before this was fixed
        # Numbers only, each 18 characters: past the limit, however its shape looks.
        {"data": [0.1234567890123456] * 60_000},
    ]
    answers = service.handle(bodies)
    assert service.monitor is not None
    service.monitor.flush()
    service.close()
    assert "class" in answers[0] and answers[0] == answers[1]
    for answer in answers[2:]:
        assert answer["code"] == 413, answer
        expected = f"a body of at most {MAX_BODY_BYTES} bytes (input.max_body_bytes sets it)"
        assert answer["expected"] == expected, answer
    assert answers[3]["got"] == f"{MAX_BODY_BYTES + 1} bytes"
    assert answers[2]["got"] == f"more than {MAX_BODY_BYTES} bytes as compact JSON"
    assert rejected(metrics, "digits") == {"too_large": 5}


def test_a_form_post_gets_a_400_naming_its_fields_not_none(metrics: MetricSet) -> None:
    from hookwatch.torchserve import _body

    # TorchServe passes a body sent without Content-Type: application/json on as a form:
    # `curl -d 'a=1'` arrives as a field named "a" and no payload (`curl -d 'x'`, a field of
    # no value, as a form of no fields: TorchServe drops it).
    assert _body({"data": [1]}) == [1] and _body({"body": b"x"}) == b"x"
    assert _body({"data": None, "body": b"x"}) is None  # a field named data wins, as before
    form = _body({"not json": b""})
    assert isinstance(form, NoPayload) and form.fields == ("not json",)
    assert repr(_body({})).startswith("a form and no payload (a body sent without")
    # A file's bytes read as a form (`curl --data-binary @a.png`): no noise echoed, the way
    # to send it named instead.
    png = repr(_body({"\x89PNG\r\n\x1a\n\x00\x00": b"", "IHDR\ufffd\ufffd": b""}))
    assert png.startswith("a form whose fields are not text") and "curl -T" in png, png
    assert "PNG" not in png
    # Request text is cut short: at most five names of 40 characters.
    assert NoPayload(f"f{i}" + "x" * 99 for i in range(9)).fields == tuple(
        (f"f{i}" + "x" * 99)[:40] for i in range(5)
    )
    service = ModelService.from_handler_config(
        demo_model(), read_model_config(copy.deepcopy(CONFIG)).handler, "digits", metrics
    )
    answers = service.handle([form, NoPayload()])
    service.close()
    assert answers[0]["code"] == 400 and answers[0]["expected"].startswith("a JSON object")
    assert answers[0]["got"].startswith("form fields ['not json'] and no payload"), answers[0]
    assert "Content-Type: application/json" in answers[0]["got"]
    assert answers[1]["got"].startswith("a form and no payload")
    assert rejected(metrics, "digits") == {"missing_field": 2}


def test_the_limit_grows_with_the_input_a_request_must_carry() -> None:
    assert body_limit(64) == MAX_BODY_BYTES  # the demo's 8x8 digits
    big = 3 * 512 * 512
    assert body_limit(big) == JSON_BYTES_PER_NUMBER * big + 64 > 19 * 10**6
    assert body_limit(big, 2048) == 2048 and body_limit(64, 4 << 20) == 4 << 20
    # A huge input's JSON (a [3, 4096, 4096] image's is ~1.3 GB) is not a body to take whole.
    assert body_limit(3 * 4096 * 4096) == MAX_DERIVED_BODY_BYTES


class _Mean(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x.mean(dim=(1, 2, 3)), x.std(dim=(1, 2, 3))], dim=1)


def _service(input_spec: dict[str, Any], metrics: MetricSet) -> ModelService:
    raw = {"input": input_spec, "monitoring": {"layers": [], "output": {"head": "logits"}}}
    handler = read_model_config({"handler": raw}).handler
    return ModelService.from_handler_config(_Mean().eval(), handler, "big", metrics)


def test_an_image_of_the_declared_shape_sent_as_json_floats_is_served(metrics: MetricSet) -> None:
    # An outside user's [3, 256, 256] model: a float32 image's tolist() as JSON is ~3.5 MB, and
    # the fixed 1 MiB limit answered every such request 413, with no setting to raise it.
    image = torch.rand(3, 256, 256, generator=torch.Generator().manual_seed(0))
    body = {"data": image.tolist()}
    assert len(compact(body)) > 3 * MAX_BODY_BYTES
    service = _service({"shape": [3, 256, 256]}, metrics)
    try:
        parsed, raw = service.handle([body, compact(body)])
    finally:
        service.close()
    assert "class" in parsed and parsed == raw, parsed
    # Past one image's worth it is still a 413, and the answer names the setting.
    service = _service({"shape": [3, 256, 256], "max_body_bytes": 1 << 20}, metrics)
    try:
        (refused,) = service.handle([body])
    finally:
        service.close()
    assert refused["code"] == 413
    assert (
        refused["expected"] == f"a body of at most {1 << 20} bytes (input.max_body_bytes sets it)"
    )


@pytest.mark.parametrize("value", [0, 1023, -5, 1.5, True, "1MB", (1 << 30) + 1])
def test_a_max_body_bytes_that_is_no_size_is_refused(value: Any) -> None:
    raw = {"input": {"shape": [4], "max_body_bytes": value}, "monitoring": {"layers": []}}
    with pytest.raises(ConfigError, match=r"input\.max_body_bytes: expected an integer"):
        read_model_config({"handler": raw})
