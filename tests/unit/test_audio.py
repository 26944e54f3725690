"""WAV bodies for a waveform input (``[samples]``, ``[channels, samples]``): a recording, as
speech clients send one, is decoded to its samples in [-1, 1] (it was a 400 "not JSON"); a
reference may be a directory of recordings, labelled by class folders as images are."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hookwatch._audio import decode_wav, wav_like
from hookwatch._config import HandlerConfig, InputSpec
from hookwatch._errors import BadInputError, ConfigError
from hookwatch._service import ModelService
from hookwatch.tools.own_model import ModelRef, archive_model
from tests.fakes import archived_handler, handled


def wav(samples: np.ndarray, rate: int = 8000, width: int = 2) -> bytes:
    """``samples`` ``[frames, channels]`` in [-1, 1] as a PCM WAV file of ``width`` bytes."""
    frames = np.atleast_2d(samples.T).T if samples.ndim == 1 else samples
    scale = float(1 << (8 * width - 1))
    if width == 1:
        raw = (np.round(frames * 127) + 128).astype(np.uint8).tobytes()
    elif width == 3:
        ints = np.round(frames * (scale - 1)).astype("<i4").reshape(-1)
        raw = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints)
    else:
        raw = np.round(frames * (scale - 1)).astype(f"<i{width}").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(frames.shape[1])
        file.setsampwidth(width)
        file.setframerate(rate)
        file.writeframes(raw)
    return out.getvalue()


def test_a_recording_is_its_samples_in_the_inputs_layout() -> None:
    t = np.linspace(0, 1, 100, dtype=np.float32)
    stereo = np.stack([np.sin(6 * t) * 0.5, -np.sin(6 * t) * 0.25], axis=1)
    body = wav(stereo)
    assert wav_like(body) and not wav_like(b"RIFF0000AVI ") and not wav_like({"data": 1})
    # [samples]: the channels averaged (mono).
    mono = decode_wav(body, (200,), 0, None)
    torch.testing.assert_close(mono, torch.from_numpy(stereo.mean(1)), atol=1e-4, rtol=0)
    # [channels, samples] and, a length first, [samples, channels].
    both = decode_wav(body, (2, 100), None, 8000)
    torch.testing.assert_close(both, torch.from_numpy(stereo.T.copy()), atol=1e-4, rtol=0)
    assert decode_wav(body, (300, 2), 0, None).shape == (100, 2)
    for width, tolerance in ((1, 1e-2), (3, 1e-6), (4, 1e-6)):
        got = decode_wav(wav(stereo[:, 0], width=width), (100,), None, None)
        torch.testing.assert_close(got, torch.from_numpy(stereo[:, 0]), atol=tolerance, rtol=0)
    for shape, at, rate, message in (
        ((100,), None, 16000, "expected audio at 16000 Hz (input.sample_rate"),
        ((120,), None, None, "expected 120 samples, got 100 samples"),
        ((50,), 0, None, "expected 1 to 50 samples, got 100 samples"),
        ((1, 100), None, None, "expected 1 channels (input.shape [channels, samples])"),
    ):
        with pytest.raises(BadInputError) as info:
            decode_wav(body, shape, at, rate)
        assert str(info.value).startswith(message), info.value
    # A float WAV (format 3), which wave does not read: refused by what was expected.
    floats = body[:20] + (3).to_bytes(2, "little") + body[22:]
    with pytest.raises(BadInputError, match="a PCM WAV file"):
        decode_wav(floats, (100,), None, None)
    # A file cut short says how many samples it holds.
    with pytest.raises(BadInputError, match="expected 100 samples, got 1 samples"):
        decode_wav(body[:48], (100,), None, None)


def test_a_waveform_model_answers_a_recording_as_its_samples_sent_as_json() -> None:
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [None], "max_length": 400, "sample_rate": 8000, "min": -1, "max": 1},
            "monitoring": {"layers": [], "output": {"head": "values"}},
        }
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, -1)), torch.nn.Conv1d(1, 2, 5), torch.nn.AdaptiveAvgPool1d(1)
    ).eval()
    service = ModelService(model, handler.input, None, output=handler.monitoring.output)
    samples = (np.sin(np.arange(300) / 7) * 0.8).astype(np.float32)
    body = wav(samples)
    from_wav, from_json, other_rate = service.handle(
        [body, {"data": np.round(samples * 32767).astype(int).tolist()}, wav(samples, 16000)]
    )
    assert other_rate["code"] == 400 and other_rate["got"] == "16000 Hz"
    assert from_json["code"] == 400  # JSON's numbers are checked against [-1, 1] as sent
    again = service.handle([{"data": (np.round(samples * 32767) / 32768).tolist()}])[0]
    torch.testing.assert_close(
        torch.tensor(from_wav["values"]), torch.tensor(again["values"]), atol=1e-6, rtol=0
    )
    with pytest.raises(ConfigError, match=r"input\.sample_rate: expected samples a second"):
        InputSpec.from_mapping({"shape": [3, 8, 8], "sample_rate": 8000})


def test_archived_from_a_directory_of_recordings_in_class_folders(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Speech(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        torch.manual_seed(0)\n"
        "        self.conv = nn.Conv1d(1, 4, 9, stride=4)\n"
        "        self.act = nn.ReLU()\n"
        "        self.out = nn.Linear(4, 2)\n\n"
        "    def forward(self, x):\n"
        "        return self.out(self.act(self.conv(x.unsqueeze(1))).mean(-1))\n"
    )
    config = tmp_path / "model-config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "batchSize": 1,
                "handler": {
                    "labels": ["noise", "tone"],
                    "input": {"shape": [None], "max_length": 800, "sample_rate": 8000},
                    "monitoring": {"layers": ["act"], "output": {"head": "logits"}},
                },
            }
        )
    )
    rng = np.random.default_rng(0)
    for label in ("noise", "tone"):
        (tmp_path / "ref" / label).mkdir(parents=True)
        for i in range(30):
            n = int(rng.integers(300, 800))
            signal = (
                rng.uniform(-0.5, 0.5, n)
                if label == "noise"
                else 0.5 * np.sin(np.arange(n) / (3 + i % 5))
            )
            (tmp_path / "ref" / label / f"{i}.wav").write_bytes(wav(signal.astype(np.float32)))
    said: list[str] = []
    mar = archive_model(
        ModelRef.parse(f"{tmp_path / 'model.py'}:Speech"),
        "speech",
        config,
        tmp_path / "ref",
        tmp_path / "store",
        tmp_path / "build",
        say=said.append,
    )
    assert any("drift profile from 60 reference samples" in s for s in said), said
    assert any("class folders of" in s for s in said), said
    with archived_handler(mar, tmp_path / "served") as (handler, context):
        out = handled(handler, [{"body": wav(np.zeros(500, np.float32))}], context)
    assert out[0]["class"] in ("noise", "tone"), out
    empty = tmp_path / "none"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"expected WAV recordings \(\.wav\) in"):
        archive_model(
            ModelRef.parse(f"{tmp_path / 'model.py'}:Speech"),
            "speech",
            config,
            empty,
            tmp_path / "store",
            tmp_path / "build2",
            say=lambda _: None,
        )
    assert json.loads(json.dumps(out))  # answers are JSON


def test_mutated_recordings_get_an_answer_or_a_clear_4xx() -> None:
    """WAV bodies with bytes flipped, cut or inserted: each answered, or refused with a 4xx
    whose reason hookwatch names (never the "unreadable" of a decoder gap)."""
    from hypothesis import HealthCheck, given, settings

    from hookwatch._metrics import MetricSet
    from tests.payloads import _mutated

    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [None], "max_length": 400, "sample_rate": 8000},
            "monitoring": {"layers": [], "output": {"head": "values"}},
        }
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 1)).eval()

    class Mean(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = model(x.mean(1, keepdim=True))
            return out

    service = ModelService.from_handler_config(Mean(), handler, "wave", MetricSet())
    valid = wav((np.sin(np.arange(200) / 5) * 0.5).astype(np.float32))
    for width in (1, 3, 4):
        assert "values" in service.handle([wav(np.zeros(50, np.float32), width=width)])[0]

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=_mutated(valid))
    def check(body: bytes) -> None:
        answer = service.handle([body])[0]
        if "values" not in answer:
            assert answer["code"] in (400, 413) and answer["expected"] and answer["got"], answer

    check()
    assert service.monitor is not None
    assert "unreadable" not in service.monitor._counts().rejected_by
    service.close()
