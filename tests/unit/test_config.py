from __future__ import annotations

from pathlib import Path

import pytest

from hookwatch._config import InputSpec, MonitoringConfig, read_model_config
from hookwatch._errors import ConfigError


def test_defaults_and_watched_order() -> None:
    config = MonitoringConfig.from_mapping({"layers": ["a", "b.c"]})
    assert config.sample_rate == 0.1
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
            "sample_rate: expected a number in [0.0, 1.0], got 1.5",
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
