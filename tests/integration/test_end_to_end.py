"""Real TorchServe (2 workers) + exporter + Prometheus: the walking skeleton, end to end."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hookwatch.tools.demo.data import load_split
from hookwatch.tools.demo.digits_cnn import DigitsCNN
from hookwatch.tools.devstack import Stack
from hookwatch.tools.traffic import LiveView
from tests.conftest import require_binary
from tests.integration.helpers import build_variant, demo_config, eventually, scrape, total

pytestmark = pytest.mark.integration

LAYERS = ("input", "act1", "act2", "act3", "output")


def test_statistics_reach_prometheus_summed_over_both_workers(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    require_binary("prometheus")
    store = tmp_path / "store"
    build_variant(store, demo_config(sample_rate=1.0))
    stack = make_stack("e2e", workers=2, model_store=store, scrape_interval="1s")
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()
    workers_before = sorted(stack.worker_pids())
    assert len(workers_before) == 2
    # Traffic starts after Prometheus' first scrape, so its windows see the counters rise from 0.
    eventually(lambda: _assert_up(stack), timeout=30)

    split = load_split()
    sent = 60
    correct = 0
    for i in range(sent):
        status, reply = stack.infer({"data": split.x_test[i].tolist()})
        assert status == 200, reply
        correct += reply["class"] == int(split.y_test[i])
    assert correct >= 0.9 * sent

    bad = [b"{oops", b'{"data": [1, 2, 3]}', b'{"data": [' + b"99," * 63 + b"99]}"]
    for body in bad:
        status, reply = stack.infer(body)
        assert status == 400, reply
        assert reply["expected"] and reply["got"]

    def exported() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        samples = scrape(stack.ports.exporter)
        # Received: the served and the rejected.
        assert total(samples, "hookwatch_requests_total", model="digits") == sent + len(bad)
        assert total(samples, "hookwatch_requests_rejected_total", model="digits") == len(bad)
        for layer in LAYERS:
            assert total(samples, "hookwatch_captures_total", layer=layer) == sent, layer
            count = total(
                samples, "hookwatch_activation_statistic_count", layer=layer, statistic="mean"
            )
            assert count == sent, layer
        return samples

    samples = eventually(exported)
    assert total(samples, "hookwatch_captures_dropped_total") == 0
    mean_input = (
        total(samples, "hookwatch_activation_statistic_sum", layer="input", statistic="mean") / sent
    )
    expected_input = float(split.x_test[:sent].mean())
    assert abs(mean_input - expected_input) < 1e-3 * max(1.0, expected_input)

    # Both worker processes contributed: each wrote its own counter file and counts.
    pids = {
        int(m.group(1))
        for f in stack.multiproc_dir.iterdir()
        if (m := re.fullmatch(r"counter_(\d+)\.db", f.name))
    }
    assert set(workers_before) <= pids
    # Client mistakes cost no worker: same pids as before the bad requests.
    assert sorted(stack.worker_pids()) == workers_before

    def scraped() -> None:
        assert [r["value"][1] for r in stack.query('up{job="hookwatch"}')] == ["1"]
        assert [r["value"][1] for r in stack.query('up{job="torchserve"}')] == ["1"]
        result = stack.query('sum(hookwatch_captures_total{model="digits",layer="act3"})')
        assert result and float(result[0]["value"][1]) == sent
        per_layer = stack.query(
            'count by (layer) (hookwatch_activation_statistic_count{statistic="std"})'
        )
        assert {r["metric"]["layer"] for r in per_layer} == set(LAYERS)

    eventually(scraped, timeout=30)

    # The live view's fleet-wide means equal the offline ones, logits (negative sums) included.
    with torch.inference_mode():
        model = DigitsCNN()
        model.load_state_dict(torch.load(store / "build" / "digits_cnn.pt", weights_only=True))
        logits = model(torch.from_numpy(split.x_test[:sent]))
    offline = {"input": float(split.x_test[:sent].mean()), "output": float(logits.mean())}

    def live_means() -> None:
        table = LiveView(stack).layer_means("5m")
        for layer, expected in offline.items():
            assert abs(table[layer]["mean"] - expected) < 1e-3 * max(1.0, abs(expected)), layer

    eventually(live_means, timeout=30)


def _assert_up(stack: Stack) -> None:
    ups = stack.query("up")
    assert len(ups) == 2 and all(r["value"][1] == "1" for r in ups), ups


def test_stop_leaves_no_process_behind(make_stack: Callable[..., Stack]) -> None:
    require_binary("prometheus")
    stack = make_stack("stop", workers=2, scrape_interval="1s")
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()
    groups = list(stack.recorded_pids().values())
    workers = stack.worker_pids()
    assert len(groups) == 3 and len(workers) == 2
    assert stack.stop() == []  # all stopped on SIGTERM, none needed SIGKILL
    for pid in [*groups, *workers]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not stack.pid_file.exists()
