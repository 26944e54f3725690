from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hookwatch._config import (
    DriftConfig,
    InputSpec,
    MonitoringConfig,
    OutputSpec,
    TextSpec,
    read_model_config,
)
from hookwatch._errors import ConfigError


def test_defaults_and_watched_order() -> None:
    config = MonitoringConfig.from_mapping({"layers": ["a", "b.c"]})
    # Unset: hookwatch's default share, capped per second; a set rate is taken exactly.
    assert config.sample_rate is None and config.share == 0.1 and config.sample_cap == 20.0
    exact = MonitoringConfig.from_mapping({"layers": [], "sample_rate": 0.1})
    assert exact.share == 0.1 and exact.sample_cap is None
    assert config.watched == ("input", "a", "b.c", "output")
    no_io = MonitoringConfig.from_mapping(
        {"layers": ["a"], "capture_input": False, "capture_output": False}
    )
    assert no_io.watched == ("a",)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"layers": "conv1"}, "monitoring.layers: expected a list"),
        ({"layers": ["a", "a"]}, "no duplicates"),
        ({"layers": ["output"]}, "no layer named 'output'"),
        (
            {"layers": [], "sample_rate": 1.5},
            "sample_rate: expected a number in [0.0, 1.0] or null, got 1.5",
        ),
        ({"layers": [], "sample_rate": True}, "sample_rate"),
        ({"layers": [], "queue_size": 0}, "queue_size: expected an integer"),
        ({"layers": [], "capture_input": "yes"}, "capture_input: expected true or false"),
        ({"layers": [], "sampel_rate": 0.5}, "got ['sampel_rate']"),
    ],
)
def test_invalid_values_fail_with_expected_and_got(raw: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        MonitoringConfig.from_mapping(raw)
    assert fragment in str(info.value)


def test_config_is_frozen() -> None:
    config = MonitoringConfig.from_mapping({"layers": []})
    with pytest.raises(AttributeError):
        config.sample_rate = 1.0  # type: ignore[misc]


def test_input_spec() -> None:
    spec = InputSpec.from_mapping({"shape": [1, 8, 8], "min": 0, "max": 16})
    assert spec.numel == 64 and spec.field == "data"
    with pytest.raises(ConfigError, match="positive integers"):
        InputSpec.from_mapping({"shape": [1, 0]})
    with pytest.raises(ConfigError, match="min <= max"):
        InputSpec.from_mapping({"shape": [2], "min": 3, "max": 1})
    with pytest.raises(ConfigError, match="expected a mapping"):
        InputSpec.from_mapping(None)


def test_top_level_errors_name_the_section_without_a_dangling_dot() -> None:
    with pytest.raises(ConfigError, match=r"^monitoring: expected a mapping, got \['act1'\]$"):
        MonitoringConfig.from_mapping(["act1"])  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"^monitoring: expected only the keys \[.*got \['layer'\]"
    ):
        MonitoringConfig.from_mapping({"layer": ["act1"]})


def test_one_reader_parses_a_whole_model_config(tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text(
        "batchSize: 4\nhandler:\n  torch_threads: 2\n  labels: [a, b]\n"
        "  input: {shape: [3]}\n  monitoring: {layers: [fc]}\n"
    )
    config = read_model_config(path)
    assert config.raw["batchSize"] == 4
    assert config.handler.torch_threads == 2 and config.handler.labels == ("a", "b")
    assert config.monitoring.watched == ("input", "fc", "output")
    assert read_model_config(dict(config.raw)) == config
    path.write_text("handler: [1, 2\n")
    with pytest.raises(ConfigError, match="expected YAML"):
        read_model_config(path)
    with pytest.raises(ConfigError, match="expected a readable model-config file"):
        read_model_config(tmp_path / "missing.yaml")


def test_from_mapping_defaults_are_the_field_defaults() -> None:
    parsed = MonitoringConfig.from_mapping({})
    assert parsed == MonitoringConfig(layers=())
    assert parsed.sample_rate is MonitoringConfig.sample_rate is None
    assert parsed.drift.window == DriftConfig.window


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: MonitoringConfig(layers=(), sample_rate=2.0),
            "monitoring.sample_rate: expected a number in [0.0, 1.0] or null, got 2.0",
        ),
        (
            lambda: MonitoringConfig(layers=("a", "a")),
            "monitoring.layers: expected no duplicates, got ('a', 'a')",
        ),
        (
            lambda: DriftConfig(window=100, step=101),
            "monitoring.drift.step: expected an integer in [0, 100], got 101",
        ),
        (
            lambda: DriftConfig(false_alarm_rate=0.0),
            "monitoring.drift.false_alarm_rate: expected a number in (0, 0.5], got 0.0",
        ),
        (
            lambda: MonitoringConfig(
                layers=(), max_features=512, drift=DriftConfig(projection_width=256)
            ),
            "monitoring.drift.projection_width: expected at least max_features (512) with "
            "projection 'pca', got 256",
        ),
        (
            lambda: DriftConfig(components=0),
            "monitoring.drift.components: expected an integer >= 1 or null, got 0",
        ),
        (
            lambda: MonitoringConfig(layers=(), max_features=16, drift=DriftConfig(components=16)),
            "monitoring.drift.components: expected at most max_features - 1 (15): the distance "
            "from the components is one more feature, got 16",
        ),
        (
            lambda: MonitoringConfig(layers=(), drift={"window": 50}),  # type: ignore[arg-type]
            "monitoring.drift: expected a DriftConfig (DriftConfig.from_mapping parses a mapping)",
        ),
        (
            lambda: OutputSpec(head="scores"),
            "monitoring.output.head: expected one of "
            "['logits', 'multilabel', 'values', 'embedding', 'none']",
        ),
        (
            lambda: TextSpec(tokenizer="tok", max_texts=0),
            "input.text.max_texts: expected an integer in [1, 4096], got 0",
        ),
    ],
)
def test_construction_validates_like_from_mapping(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert message in str(info.value)


def test_construction_keeps_numbers_and_lists_as_from_mapping_does() -> None:
    config = MonitoringConfig(layers=["a"], sample_rate=1, layer_types=["ReLU"])  # type: ignore[arg-type]
    assert config.layers == ("a",) and config.layer_types == ("ReLU",)
    assert isinstance(config.sample_rate, float) and config.sample_rate == 1.0
    assert hash(config) == hash(
        MonitoringConfig.from_mapping({"layers": ["a"], "sample_rate": 1, "layer_types": ["ReLU"]})
    )


def test_a_key_under_handler_it_does_not_know_is_named_with_the_nearest() -> None:
    # `monitorng:` was accepted and every monitoring setting dropped (an outside run's
    # archive watched nothing, silently, 2026-12-07): configuration.md says unknown keys fail.
    from hookwatch._config import HandlerConfig

    for typo, meant in (("monitorng", "monitoring"), ("torch_thread", "torch_threads")):
        with pytest.raises(ConfigError, match=rf"got \['{typo}'\] \({typo}: did you mean {meant}"):
            HandlerConfig.from_mapping({"input": {"shape": [2]}, typo: {}})
    # Deeper too, and the section itself.
    from hookwatch._config import read_model_config

    for raw, said in (
        ({"input": {"shape": [2], "dtyp": "int64"}}, "(dtyp: did you mean dtype?)"),
        ({"input": {"shape": [2]}, "monitoring": {"drfit": {}}}, "(drfit: did you mean drift?)"),
        (
            {"input": {"shape": [2]}, "monitoring": {"drift": {"windw": 3}}},
            "(windw: did you mean window?)",
        ),
    ):
        with pytest.raises(ConfigError) as raised:
            HandlerConfig.from_mapping(raw)
        assert str(raised.value).endswith(said), raised.value
    with pytest.raises(ConfigError, match=r"got 'handlr' \(did you mean handler\?\)"):
        read_model_config({"handlr": {"input": {"shape": [2]}}})
