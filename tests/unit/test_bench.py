"""The bench's own logic: ratios and verdicts, variants, the table. The load generators against a
real server: tests/integration/test_bench_loadgen.py."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from dev.bench import resnet
from dev.bench.micro import HookCost, RssTrace, ScrapeTime
from dev.bench.naive import NaiveCapture
from dev.bench.report import render
from dev.bench.runner import BenchResult, GroupResult, Settings
from dev.bench.variants import variant_config
from hookwatch._config import HandlerConfig, InputSpec, MonitoringConfig
from hookwatch._errors import BadInputError, ConfigError
from hookwatch._metrics import MetricSet
from hookwatch._service import ModelService, decode_payload
from hookwatch.tools.bench.loadgen import (
    Segment,
    cycle_rate,
)
from hookwatch.tools.bench.stats import (
    VARIANTS,
    Spread,
    median_interval,
    ratios,
    round_order,
    verdicts,
)
from hookwatch.tools.demo.digits_cnn import DigitsCNN

ROOT = Path(__file__).resolve().parents[2]


def seg(rps: float, p50: float = 1.0, p99: float = 2.0) -> Segment:
    return Segment(int(rps * 10), 0, 10.0, p50, p99, p50)


def test_ratios_are_taken_against_the_plain_run_of_the_same_round() -> None:
    rounds = [
        {"plain": seg(100, p99=2.0), "full": seg(95, p99=2.2)},
        {"plain": seg(50, p99=4.0), "full": seg(49, p99=4.0)},
    ]
    assert ratios(rounds, "full", "throughput") == pytest.approx([0.95, 0.98])
    assert ratios(rounds, "full", "p99") == pytest.approx([1.1, 1.0])
    assert Spread.of([3.0, 1.0, 2.0]) == Spread(1.0, 2.0, 3.0)


def test_rounds_alternate_direction_and_verdicts_use_the_median() -> None:
    assert round_order(0) == VARIANTS
    assert round_order(1) == tuple(reversed(VARIANTS))
    closed = [
        {"plain": seg(100), "default": seg(99)},
        {"plain": seg(100), "default": seg(90)},
        {"plain": seg(100), "default": seg(99.5)},
    ]
    got = {v.what: v for v in verdicts("default", closed, [])}
    loss = got["throughput loss (closed loop)"]
    assert loss.measured == pytest.approx(0.01)
    assert loss.holds
    slow = [{"plain": seg(100), "default": seg(90)}]
    miss = verdicts("default", slow, [])[0]
    assert not miss.holds
    assert miss.miss == pytest.approx(0.08)


def test_verdicts_say_when_the_rounds_cannot_tell() -> None:
    # Tight rounds around a 1 % loss resolve; rounds scattered from -15 % to +15 % around the
    # same median do not, whatever the median says.
    tight = [{"plain": seg(100), "default": seg(99 + d)} for d in (-0.2, 0.0, 0.1, 0.2, -0.1)]
    (loss, *_) = verdicts("default", tight, [])
    assert loss.low <= loss.measured <= loss.high
    assert loss.resolved and loss.holds and loss.text() == "holds"
    wide = [{"plain": seg(100), "default": seg(99 + d)} for d in (-16, -9, -3, 0, 0, 2, 8, 14, 15)]
    (loss, *_) = verdicts("default", wide, [])
    assert loss.measured == pytest.approx(0.01)
    assert not loss.resolved
    assert loss.text() == "not resolved (median holds)"
    far = [{"plain": seg(100), "default": seg(80 + d)} for d in (-1, 0, 1)]
    (loss, *_) = verdicts("default", far, [])
    assert loss.resolved and loss.text() == "**misses by 18.0 pp**"


def test_cycle_rate_follows_the_batch_period_not_the_window() -> None:
    # Eight clients answered together every 0.5 s: 2 cycles/s each, 16 requests/s in all.
    # Counting the 24 starts of a 1.2 s window would say 20/s; the cycle rate says 16.
    burst = [[0.0, 0.5, 1.0]] * 8
    assert cycle_rate(burst) == pytest.approx(16.0)
    # A slower batch period moves the rate continuously, with the same starts per window.
    assert cycle_rate([[0.0, 0.55, 1.1]] * 8) == pytest.approx(16.0 / 1.1)
    # Clients out of phase add up the same way.
    assert cycle_rate([[0.0, 1.0, 2.0], [0.5, 1.5, 2.5]]) == pytest.approx(2.0)
    # A client without a whole cycle leaves the caller to count.
    assert cycle_rate([[0.0, 1.0], [0.3]]) is None
    assert cycle_rate([]) is None


def test_float32_bodies_are_decoded_and_checked_against_the_spec() -> None:
    spec = InputSpec.from_mapping({"shape": [2, 3], "encoding": "float32", "max": 10})
    values = np.arange(6, dtype="<f4")
    got = decode_payload(values.tobytes(), spec)
    assert torch.equal(got, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(decode_payload({"data": values.tolist()}, spec), got)
    with pytest.raises(BadInputError, match="24 bytes of little-endian float32"):
        decode_payload(values[:5].tobytes(), spec)
    with pytest.raises(BadInputError, match="finite"):
        decode_payload(np.array([0, 0, 0, 0, 0, np.nan], dtype="<f4").tobytes(), spec)
    with pytest.raises(BadInputError, match="values in"):
        decode_payload((values * 10).tobytes(), spec)
    json_only = InputSpec.from_mapping({"shape": [2, 3]})
    with pytest.raises(BadInputError, match="not JSON"):
        decode_payload(values.tobytes(), json_only)
    with pytest.raises(
        ConfigError, match=r"input.encoding: expected one of \['json', 'float32', 'image'\]"
    ):
        InputSpec.from_mapping({"shape": [2], "encoding": "float16"})


def test_unmonitored_service_answers_like_the_monitored_one() -> None:
    torch.manual_seed(0)
    model = DigitsCNN().eval()
    section = HandlerConfig.from_mapping(
        {"input": {"shape": [1, 8, 8]}, "monitoring": {"layers": ["act1"]}}
    )
    body = {"data": [1.0] * 64}
    plain = ModelService.from_handler_config(model, section, "p", monitored=False)
    watched = ModelService.from_handler_config(model, section, "w", MetricSet())
    try:
        assert plain.monitor is None
        assert plain.handle([body, {"x": 1}]) == watched.handle([body, {"x": 1}])
    finally:
        plain.close()
        watched.close()


def test_naive_capture_exports_in_the_request_thread(metrics: MetricSet) -> None:
    model = DigitsCNN().eval()
    config = MonitoringConfig.from_mapping({"layers": ["act1", "act3"]})
    capture = NaiveCapture.attach(model, config, "digits", metrics)
    with torch.inference_mode():
        model(torch.rand(3, 1, 8, 8))
    samples = metrics.sample_values()
    for layer in ("input", "act1", "act3", "output"):
        key = ("hookwatch_captures_total", (("layer", layer), ("model", "digits")))
        assert samples[key] == 3.0
    capture.close()
    with torch.inference_mode():
        model(torch.rand(1, 1, 8, 8))
    key = ("hookwatch_captures_total", (("layer", "act1"), ("model", "digits")))
    assert metrics.sample_values()[key] == 3.0


def test_resnet_file_has_one_class_and_resnet18_shapes() -> None:
    classes = [
        c for _, c in inspect.getmembers(resnet, inspect.isclass) if c.__module__ == resnet.__name__
    ]
    assert classes == [resnet.ResNet18]  # TorchServe's BaseHandler needs exactly one
    model = resnet.ResNet18().eval()
    assert sum(p.numel() for p in model.parameters()) == 11_689_512  # torchvision resnet18
    with torch.inference_mode():
        assert model(torch.rand(1, 3, 64, 64)).shape == (1, 1000)
    names = dict(model.named_modules())
    for layer in ("blocks.1.act", "blocks.3.act", "blocks.5.act", "blocks.7.act"):
        assert layer in names


def test_variant_configs_differ_only_where_the_variant_does() -> None:
    import yaml

    base = yaml.safe_load((ROOT / "models/resnet18/model-config.yaml").read_text())
    full = variant_config(base, "full", 8)
    default = variant_config(base, "default", 1)
    assert full["batchSize"] == 8
    assert full["handler"]["monitoring"]["sample_rate"] == 1.0
    # default: hookwatch's own sampling, the rest of the handler section as committed.
    assert "sample_rate" not in default["handler"]["monitoring"]
    assert MonitoringConfig.from_mapping(default["handler"]["monitoring"]).sample_rate == (
        MonitoringConfig.from_mapping({"layers": []}).sample_rate
    )
    rest = {k: v for k, v in base["handler"]["monitoring"].items() if k != "sample_rate"}
    assert default["handler"]["monitoring"] == rest
    assert {k: v for k, v in default["handler"].items() if k != "monitoring"} == {
        k: v for k, v in base["handler"].items() if k != "monitoring"
    }
    assert base["batchSize"] == 1  # the base mapping is not changed
    assert base["handler"]["monitoring"]["sample_rate"] == 0.1
    MonitoringConfig.from_mapping(full["handler"]["monitoring"])
    InputSpec.from_mapping(full["handler"]["input"])


def test_worker_starts_widen_the_interval_where_they_differ() -> None:
    # Four starts whose rounds agree within each start but whose starts read 0.94, 0.97, 1.00
    # and 1.03: resampling the 24 rounds alone would treat them as 24 placements.
    values = [base + d for base in (0.94, 0.97, 1.00, 1.03) for d in (-0.002, 0, 0.002) * 2]
    starts = [s for s in range(4) for _ in range(6)]
    rounds_only = median_interval(values)
    by_start = median_interval(values, starts=starts)
    assert by_start[0] < rounds_only[0] and by_start[1] > rounds_only[1]
    assert by_start[0] <= 0.95 and by_start[1] >= 1.02
    # One start, or starts that agree: the same interval as the rounds alone give.
    assert median_interval(values, starts=[0] * 24) == rounds_only
    same = [1.0 + d for _ in range(4) for d in (-0.002, 0, 0.002) * 2]
    low, high = median_interval(same, starts=starts)
    assert 0.997 <= low <= high <= 1.003
    with pytest.raises(ValueError, match="expected one start per value"):
        median_interval(values, starts=[0, 1])
    # verdicts pass the starts on: the loss that the rounds alone resolve is not resolved.
    closed = [{"plain": seg(100), "default": seg(100 * v)} for v in values]
    (alone, *_) = verdicts("default", closed, [])
    (started, *_) = verdicts("default", closed, [], closed_starts=starts)
    assert alone.measured == started.measured
    assert started.high - started.low > alone.high - alone.low


def test_rounds_are_split_between_worker_starts() -> None:
    full = Settings.full()
    assert full.start_of("digits") == [r // 3 for r in range(24)]  # 8 starts of 3 rounds
    assert full.start_of("resnet18") == [0, 1, 2, 3, 4]
    assert full.start_of("minilm") == [0, 0, 1, 1, 2, 2, 3, 3]
    # More starts than rounds: a start per round; a model not named: one start.
    assert dataclasses.replace(full, starts={"digits": 99}).start_of("digits") == list(range(24))
    assert dataclasses.replace(full, starts={}).start_of("digits") == [0] * 24


def test_table_lists_every_variant_target_and_micro_figure() -> None:
    settings = Settings.quick()
    rounds = [
        {"plain": seg(100), "default": seg(99), "full": seg(90, p99=2.5), "naive": seg(50)}
        for _ in range(2)
    ]
    group = GroupResult("digits", 1, 4, 60.0, rounds, rounds)
    result = BenchResult(
        settings,
        {"cpu": "test cpu", "cores": "2"},
        groups=[group],
        hook_costs=[HookCost("digits", 5, 70.0, 2.0, 50.0, 60.0)],
        rss=[RssTrace(True, 1000, 300.0, 301.0, 301.5, [300.5, 301.0], 500)],
        scrape=ScrapeTime(5, 12, 4000, 3.0, 9.0),
    )
    text = render(result)
    for variant in ("| default |", "| full |", "| naive |"):
        assert variant in text
    assert "| digits, batch 1 | full | throughput loss (closed loop) | +10.0 %" in text
    assert "**misses by 5.0 pp**" in text
    assert "RSS growth over 1,000 requests | +1.0 MB | - | 20 MB | holds" in text
    assert "| digits | 5 | 70.0 µs | 2.00 µs | 50.0 µs | 60.0 µs |" in text
    assert "The GPU rows are measured in process" in text
    assert "closed: machine CPU" not in text  # segments without the machine's figures
    timed = [
        {
            v: dataclasses.replace(s, machine_cpu_ms=2.0 * (1 + i), machine_busy=0.97)
            for i, (v, s) in enumerate(r.items())
        }
        for r in rounds
    ]
    text = render(
        dataclasses.replace(result, groups=[GroupResult("digits", 1, 4, 60.0, timed, timed)])
    )
    assert "closed: machine CPU |" in text
    assert "with the cores 97% busy" in text
    assert "| full | 0.900 / **0.900** / 0.900 |" in text
    assert "| 3.000 / **3.000** / 3.000 | 900 / 900; 900 / 900 |" in text  # full's machine CPU


def test_naive_capture_takes_keyword_forwards_and_layer_patterns(metrics: MetricSet) -> None:
    from tests.tiny_text import TinyEncoder, encode, sentences

    model = TinyEncoder().eval()
    config = MonitoringConfig.from_mapping(
        {"layers": ["encoder.layer.*.output"], "output": {"select": "pooler_output"}}
    )
    capture = NaiveCapture.attach(model, config, "tiny", metrics)
    with torch.inference_mode():
        model(**encode(sentences(3)))
    capture.close()
    samples = metrics.sample_values()
    for layer in ("input", "encoder.layer.0.output", "encoder.layer.1.output", "output"):
        key = ("hookwatch_captures_total", (("layer", layer), ("model", "tiny")))
        assert samples[key] == 3.0, layer


def test_the_text_model_variants_carry_the_archive_directory_and_profile(tmp_path: Path) -> None:
    import json

    from dev.bench.variants import MODELS, build_group
    from hookwatch._model import MODEL_SPEC_FILE
    from tests.conftest import require

    require((ROOT / "model_store" / "minilm.mar").is_file(), "model_store/minilm.mar (make mar)")
    group = build_group(ROOT, tmp_path / "store", tmp_path / "build", "minilm", 8)
    for variant, name in group.names.items():
        directory = tmp_path / "store" / name
        spec = json.loads((directory / MODEL_SPEC_FILE).read_text())
        assert spec["directories"] == ["pretrained"], variant
        assert (directory / "pretrained" / "tokenizer.json").is_file()
        assert (directory / "drift-profile.npz").is_file()
        manifest = json.loads((directory / "MAR-INF" / "MANIFEST.json").read_text())
        assert manifest["model"]["modelFile"] == "model.py"
    bodies, content_type = MODELS["minilm"].payloads()
    assert content_type == "application/json" and isinstance(json.loads(bodies[0]), str)


def test_segments_are_long_enough_for_a_p99_and_a_cycle_rate() -> None:
    from dev.bench.runner import segment_seconds

    full = Settings.full()
    # Fast model: the least length rules. ResNet-18 at batch 8 (~8 requests/s, 16 clients):
    # 100 latencies, 10 % over, in closed loop; the open loop's schedule at 60 % of it.
    assert segment_seconds(full, 0.75, 600.0, 4) == 0.75
    assert segment_seconds(full, 3.0, 8.0, 16) == pytest.approx(13.75)
    assert segment_seconds(full, 3.0, 4.8, 0) == pytest.approx(21.25)
    # Many clients: each must complete its cycles, whatever the latencies need.
    assert segment_seconds(full, 0.0, 100.0, 40) == pytest.approx(1.76)
    assert segment_seconds(full, 3.0, 0.5, 16) == full.max_seconds
