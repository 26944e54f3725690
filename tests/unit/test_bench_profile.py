"""The worker-profile harness's reading of py-spy output (the recording itself needs TorchServe)."""

from __future__ import annotations

import os
import threading

from dev.bench.profile import Profile, parse_raw, report, thread_cpu

RAW = """\
MainThread (0x1);<module> (ts/model_service_worker.py:250);handle (ts/service.py:120);\
ModelService.infer (/x/hookwatch/_service.py:470);forward (/x/digits_cnn.py:21) 30
MainThread (0x1);<module> (ts/model_service_worker.py:250);\
_retrieve_buffer (ts/protocol/otf.py:9) 10
MainThread (0x1);<module> (ts/model_service_worker.py:250);handle (ts/service.py:120);\
ModelService.infer (/x/hookwatch/_service.py:470);LayerHook._capture (/x/hookwatch/_hooks.py:300) 5
hookwatch-capture (0x2);_run (/x/hookwatch/_capture.py:240);\
CaptureProcessor.process (/x/hookwatch/_monitor/processor.py:170);\
reduce_rows (/x/hookwatch/_stats.py:160);_sum (numpy/_core/_methods.py:47) 8
not a sample line
"""


def test_parse_raw_groups_stacks_by_thread_and_counts_samples() -> None:
    stacks = parse_raw(RAW)
    assert set(stacks) == {"MainThread (0x1)", "hookwatch-capture (0x2)"}
    assert sum(stacks["MainThread (0x1)"].values()) == 45
    assert sum(stacks["hookwatch-capture (0x2)"].values()) == 8


def test_profile_attributes_samples_to_threads_and_hookwatch_frames() -> None:
    profile = Profile("full", requests=500, seconds=1.0, cpu_ms=0.9, stacks=parse_raw(RAW))
    assert profile.request_thread() == "MainThread (0x1)"
    assert profile.inclusive("MainThread (0x1)", "hookwatch/_") == 35
    assert profile.per_k(35) == 70.0
    outer = profile.own_frames("MainThread (0x1)")
    assert outer == {"ModelService.infer (hookwatch/_service.py)": 35}
    inner = profile.innermost_own("hookwatch-capture (0x2)")
    assert inner == {"reduce_rows (hookwatch/_stats.py)": 8}
    leaves = profile.leaf_frames("MainThread (0x1)")
    assert leaves["LayerHook._capture (hookwatch/_hooks.py)"] == 5


def test_report_compares_each_variant_with_the_plain_handler() -> None:
    plain_raw = (
        "MainThread (0x1);handle (ts/service.py:1);forward (/x/digits_cnn.py:21) 30\n"
        "MainThread (0x1);_retrieve_buffer (ts/protocol/otf.py:9) 10\n"
    )
    profiles = {
        "plain": Profile("plain", 500, 1.0, 0.7, parse_raw(plain_raw), 0.35, 0.0),
        "full": Profile("full", 500, 1.0, 0.9, parse_raw(RAW), 0.4, 0.05),
    }
    text = report("digits", 1, 250, profiles)
    assert "| plain | 500.0 | 0.700 | 0.700 | 0.000 | 80 |" in text
    assert "| full | 500.0 | 0.900 | 0.800 | 0.100 | 90 | 70 | 16 | 0 |" in text
    # The hook frame is new against plain: it leads the grown leaves.
    grown = text.split("full: leaf frames that grew most against plain")[1]
    assert grown.index("LayerHook._capture") < grown.index("_retrieve_buffer")
    assert "reduce_rows (hookwatch/_stats.py)" in text


def test_thread_cpu_tells_the_main_thread_from_the_others() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin)
    main_before, other_before = thread_cpu(os.getpid())
    worker.start()
    stop.wait(0.3)
    # Read while the thread still runs: an ended thread leaves /proc/<pid>/task.
    main_after, other_after = thread_cpu(os.getpid())
    stop.set()
    worker.join()
    # The spinning thread's CPU lands on the other threads; the main thread only waited.
    assert other_after - other_before > 0.1
    assert main_after - main_before < other_after - other_before
