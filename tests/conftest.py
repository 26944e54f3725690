"""Shared fixtures. Real components only: a missing one skips locally and fails under CI=true."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hookwatch._metrics import MetricSet
from hookwatch.tools.devstack import Ports, Stack

ROOT = Path(__file__).resolve().parents[1]
MAR = ROOT / "model_store" / "digits.mar"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, what: str) -> None:
    """Skip when a real component is missing, except under CI=true where that is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a real component is missing: {what}")
    pytest.skip(f"missing real component: {what}")


def require_binary(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"{name} on PATH (make deps installs it)")
    assert path is not None
    return path


@pytest.fixture
def metrics() -> MetricSet:
    """A MetricSet on a fresh registry, so tests never see each other's samples."""
    return MetricSet(CollectorRegistry())


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """Factory for native stacks on free loopback ports; every one is stopped at teardown."""
    require(MAR.exists(), f"{MAR} (make mar builds it)")
    require_binary("java")
    stacks: list[Stack] = []

    def factory(name: str = "stack", **kwargs: object) -> Stack:
        ports = Ports.free()
        stack = Stack(root=ROOT, run_dir=tmp_path / name, ports=ports, **kwargs)  # type: ignore[arg-type]
        stacks.append(stack)
        return stack

    yield factory
    for stack in stacks:
        stack.stop()
