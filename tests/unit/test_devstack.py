from __future__ import annotations

import socket

import pytest

from hookwatch.devstack import PORT_ENV, Ports


def test_ports_from_env_override_each_default() -> None:
    assert Ports.from_env({}) == Ports()
    ports = Ports.from_env({"PROMETHEUS_PORT": "19090", "TS_GRPC_INFERENCE_PORT": "17070"})
    assert ports.prometheus == 19090 and ports.grpc_inference == 17070
    assert ports.inference == 8080
    with pytest.raises(ValueError, match=r"TS_METRICS_PORT: expected a TCP port, got 'x'"):
        Ports.from_env({"TS_METRICS_PORT": "x"})


def test_every_port_has_an_environment_variable() -> None:
    assert set(PORT_ENV) == set(Ports.__dataclass_fields__)


def test_free_ports_are_distinct_and_busy_names_the_variable() -> None:
    ports = Ports.free()
    values = list(ports.__dict__.values())
    assert len(set(values)) == len(values)
    assert ports.busy() == []
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports.exporter))
        holder.listen()
        assert ports.busy() == [
            f"port {ports.exporter} (exporter) is in use: set HOOKWATCH_EXPORTER_PORT"
        ]
