from __future__ import annotations

import pytest

from hookwatch._config import InputSpec, MonitoringConfig
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
