"""The in-worker bench: its switched handler binds and unbinds the monitored path as the
byte says, and its report judges what its pairs hold."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dev.bench import inworker
from dev.bench.switch_handler import SWITCH_FILE
from hookwatch.tools.bench.loadgen import Segment
from hookwatch.tools.demo import digits_cnn
from hookwatch.tools.demo.data import load_split
from tests.fakes import FakeContext, handled, load_handler

ROOT = Path(__file__).resolve().parents[2]


def test_the_byte_binds_and_unbinds_the_monitored_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    shutil.copy(digits_cnn.__file__, tmp_path / "digits_cnn.py")
    torch.save(digits_cnn.DigitsCNN().state_dict(), tmp_path / "digits_cnn.pt")
    switch = tmp_path / SWITCH_FILE
    switch.write_bytes(b"\x00")
    config = yaml.safe_load((ROOT / "models/digits/model-config.yaml").read_text())
    config["handler"]["monitoring"]["sample_rate"] = 1.0
    context = FakeContext(tmp_path, config)
    handler = load_handler("switched", ROOT / inworker.SWITCHED)()
    handler.initialize(context)
    tally = handler.service.monitor._tally
    rows = [{"body": {"data": x.tolist()}} for x in load_split().x_test[:3]]
    try:
        handled(handler, rows, context)
        assert tally.counts().requests == 0 and handler.service._path is None
        inworker._set(switch, True)
        answers = handled(handler, rows, context)
        assert len(answers) == 3 and all("class" in a for a in answers)
        assert tally.counts().requests == 3 and tally.counts().sampled == 3
        inworker._set(switch, False)
        handled(handler, rows, context)
        assert tally.counts().requests == 3
    finally:
        handler.service.close()


def _segment(rps: float, p99: float = 10.0, cpu: float = 1.0) -> Segment:
    return Segment(100, 0, 1.0, 5.0, p99, 5.0, cpu_ms=cpu, rate_rps=rps)


def test_rows_take_each_round_bound_over_unbound_and_judge_the_target() -> None:
    pairs = [
        inworker.Pair("digits", 1, "default", start, _segment(100.0), _segment(r))
        for start, r in [(0, 99.5), (0, 99.8), (1, 99.6), (1, 99.9), (2, 99.7), (2, 99.6)]
    ] + [
        inworker.Pair("digits", 1, "full", start, _segment(100.0), _segment(r, cpu=1.2))
        for start, r in [(0, 90.0), (0, 91.0), (1, 89.0), (1, 90.5), (2, 90.0), (2, 91.0)]
    ]
    result = inworker.Result("now", {}, [], "", pairs)
    (default, full) = inworker.rows(result)
    assert (default.variant, default.rounds, default.starts) == ("default", 6, 3)
    assert default.throughput == pytest.approx(0.9965)
    assert default.throughput_low <= default.throughput <= default.throughput_high
    assert default.verdicts[0].text() == "holds"  # every round within the 1 % target
    assert full.verdicts[0].text().startswith("**misses")  # every round 9-11 % down, target 5 %
    assert full.cpu_on_ms == pytest.approx(1.2) and full.cpu_off_ms == pytest.approx(1.0)


def test_the_committed_table_is_its_json() -> None:
    result = inworker.read(inworker.JSON_OUT)
    text = inworker.MD_OUT.read_text()
    assert inworker.rewrite(text, inworker.render(result)) == text, (
        "docs/bench/inworker.md is stale: `python -m dev.bench.inworker --render` rewrites it"
    )


def test_sliced_counts_each_answer_in_the_phase_it_was_served_in(tmp_path: Path) -> None:
    """A server that takes 20 ms a request while the byte is 1 and 1 ms while it is 0: the
    bound phase must read the slower, whichever phase leads (swapped phases would read
    ~20 times faster, answers counted in either at random about as fast)."""
    import http.server
    import threading

    from hookwatch.tools.bench.loadgen import Target

    switch = tmp_path / SWITCH_FILE
    switch.write_bytes(b"\x00")

    class Slow(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(0.02 if switch.read_bytes()[:1] == b"\x01" else 0.001)
            # One write: headers and body apart would wait on delayed ACKs.
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = Target("127.0.0.1", server.server_address[1], "/", [b"{}"], "application/json")
    plan = inworker.Plan("digits", (1,), 1, 1, slices=8, slice_s=0.2, guard_s=0.05)
    clock = inworker.BoundClock(switch)
    try:
        for first in (False, True):
            # Wall time as the request thread's clock: per request served, the slower bound
            # phase must read more of it, so each window's reading went to its own phase.
            got, request_ms = inworker.sliced(
                target, 1, clock, plan, first, lambda: 0.0, time.perf_counter
            )
            clock.set(False)
            ratio = got[True].throughput_rps / got[False].throughput_rps
            assert ratio < 0.5, (first, ratio)
            assert got[True].p50_ms > got[False].p50_ms
            assert request_ms[True] > 1.5 * request_ms[False] > 0, request_ms
            # Bound for half the slices (and the warm-up, where the bound phase leads).
            assert 0.8 - 0.05 < clock.take() < 0.8 + plan.warmup_s + 0.1
    finally:
        server.shutdown()
        server.server_close()


def test_the_bound_clock_counts_the_seconds_the_switch_read_bound(tmp_path: Path) -> None:
    switch = tmp_path / SWITCH_FILE
    switch.write_bytes(b"\x00")
    clock = inworker.BoundClock(switch)
    clock.set(True)
    assert switch.read_bytes() == b"\x01"
    time.sleep(0.05)
    clock.set(False)
    time.sleep(0.05)  # unbound: not counted
    clock.set(True)
    time.sleep(0.05)
    first = clock.take()  # the running stretch counts up to now
    assert 0.1 <= first < 0.15
    clock.set(False)
    assert clock.take() < 0.01 and switch.read_bytes() == b"\x00"


def test_the_switched_default_runs_at_half_of_each_cap() -> None:
    from hookwatch._config import MonitoringConfig

    defaults = MonitoringConfig(layers=())
    caps = inworker.switched_caps()
    assert caps == {
        "max_sampled_per_s": defaults.max_sampled_per_s / 2,
        "max_overhead": defaults.max_overhead / 2,
    }
    from dev.bench.variants import variant_config

    base = yaml.safe_load((ROOT / "models/digits/model-config.yaml").read_text())
    monitoring = variant_config(base, "default", 1, caps)["handler"]["monitoring"]
    assert "sample_rate" not in monitoring
    assert {k: monitoring[k] for k in caps} == caps
    assert "max_overhead" not in variant_config(base, "full", 1, caps)["handler"]["monitoring"]


def test_rows_give_what_the_bound_slices_sampled_a_second() -> None:
    pairs = [
        inworker.Pair("digits", 1, "default", start, _segment(100.0), _segment(99.5))
        for start in (0, 1)
    ]
    sampling = [
        inworker.Sampling("digits", 1, "default", 0, 190.0, 8_000.0, 10.0),
        inworker.Sampling("digits", 1, "default", 1, 210.0, 8_000.0, 10.0),
    ]
    machine = {"cpu": "x", "cores": "2", "python": "3", "torch": "2", "torchserve": "0"}
    result = inworker.Result("now", machine, [], "", pairs, sampling=sampling, caps={"x": 1.0})
    (row,) = inworker.rows(result)
    assert row.sampled_per_s == pytest.approx(20.0)
    assert row.sampled_share == pytest.approx(400 / 16_000)
    assert "| 20.0 (2.5 %) |" in inworker.render(result)
    # A run from before the column: a dash, not a zero.
    (old,) = inworker.rows(inworker.Result("now", {}, [], "", pairs))
    assert old.sampled_per_s is None


def test_keep_carries_the_models_not_run_and_names_their_run() -> None:
    digits = inworker.Plan("digits", (1,), 1, 1, slices=2, slice_s=0.25, guard_s=0.05)
    resnet = inworker.Plan("resnet18", (1,), 1, 1, slices=2, slice_s=1.0, guard_s=0.3)

    def pair(model: str, rps: float) -> inworker.Pair:
        return inworker.Pair(model, 1, "default", 0, _segment(100.0), _segment(rps))

    earlier = inworker.Result(
        "09:24", {}, [digits, resnet], "", [pair("digits", 99.0), pair("resnet18", 90.0)]
    )
    earlier.commit = "abc"
    earlier.sampling = [inworker.Sampling("digits", 1, "default", 0, 1.0, 2.0, 3.0)]
    now = inworker.Result("10:23", {}, [resnet], "", [pair("resnet18", 99.5)])
    inworker.keep(now, earlier)
    assert [p.model for p in now.plans] == ["resnet18", "digits"]
    assert sorted((p.model, p.on.throughput_rps) for p in now.pairs) == [
        ("digits", 99.0),
        ("resnet18", 99.5),  # the new run's, not the earlier one's
    ]
    assert [s.model for s in now.sampling] == ["digits"]
    assert now.kept == {"digits": "commit abc, started 09:24"}
    # Kept again from this run: still named with the run that measured it.
    later = inworker.Result("11:00", {}, [resnet], "", [pair("resnet18", 99.0)])
    inworker.keep(later, now)
    assert later.kept == {"digits": "commit abc, started 09:24"}


def test_keep_carries_a_model_of_two_plans_once() -> None:
    b1 = inworker.Plan("minilm", (1,), 1, 1, slices=2, slice_s=1.0, guard_s=0.3)
    b8 = inworker.Plan("minilm", (8,), 1, 1, slices=2, slice_s=2.0, guard_s=1.0, bodies=8)
    digits = inworker.Plan("digits", (1,), 1, 1, slices=2, slice_s=0.25, guard_s=0.05)
    pairs = [
        inworker.Pair("minilm", batch, "default", 0, _segment(100.0), _segment(99.0))
        for batch in (1, 8)
    ]
    earlier = inworker.Result("09:24", {}, [b1, b8], "", pairs)
    earlier.sampling = [inworker.Sampling("minilm", b, "default", 0, 1.0, 2.0, 3.0) for b in (1, 8)]
    now = inworker.Result("10:23", {}, [digits], "", [])
    inworker.keep(now, earlier)
    assert now.plans == [digits, b1, b8]
    assert [p.batch for p in now.pairs] == [1, 8]
    assert [s.batch for s in now.sampling] == [1, 8]


def test_a_plan_of_fixed_bodies_runs_a_client_each_and_says_so() -> None:
    plan = inworker.Plan("minilm", (8,), 1, 1, slices=2, slice_s=2.0, guard_s=1.0, bodies=8)
    assert plan.clients(8) == 8
    assert inworker.Plan("minilm", (8,), 1, 1, slices=2, slice_s=2.0, guard_s=1.0).clients(8) == 16
    machine = {"cpu": "cpu", "cores": 2, "python": "3.11", "torch": "2", "torchserve": "0.12"}
    result = inworker.Result("10:23", machine, [plan], "", [])
    text = inworker.render(result)
    assert "8 clients, each sending one of the model's first 8 payloads" in text
    assert "so every forward holds the same requests" in text
    # At batch 1 no two requests share a forward: what is fixed is each slice's mix.
    single = inworker.Plan("minilm", (1,), 1, 1, slices=2, slice_s=1.0, guard_s=0.3, bodies=8)
    assert single.clients(1) == 8
    text = inworker.render(inworker.Result("10:23", machine, [single], "", []))
    assert "so every slice holds the same mix" in text
    assert "forward holds" not in text


def test_window_requests_follow_the_batch_period_not_the_answers_in_the_window() -> None:
    """Eight clients answered together every 0.3 s (a batch of 8): a 1-second window holds
    three or four batches' answers depending on where it falls, its cycle rate 26.7 a second
    wherever it falls."""
    clients = [[(0.3 * k + 0.001 * i, 0.3 * (k + 1), True) for k in range(10)] for i in range(8)]
    for start in (0.05, 0.15, 0.25):
        got = inworker._window_requests(clients, start, start + 1.0)
        assert got == pytest.approx(8 / 0.3, rel=1e-6)
    # One start a client in the window: the answers in it are counted (the first batch's).
    assert inworker._window_requests(clients, 0.28, 0.5) == 8.0
    # A failed request's cycle is not a served one: half of them failed, half the requests.
    failing = [[(t0, t1, k % 2 == 0) for k, (t0, t1, _) in enumerate(c)] for c in clients]
    got = inworker._window_requests(failing, 0.25, 1.25)  # starts k = 1, 2, 3, 4 of each
    assert got == pytest.approx(8 / 0.3 / 2, rel=1e-6)
