"""The capture thread in a process of its own: a process that never stops its worker exits
cleanly, and the thread runs torch with the serving thread's thread count (moved from
tests/unit/test_worker.py: each test runs a Python process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


EXIT_SCRIPT = """
import torch
from hookwatch._capture import CaptureWorker
torch.set_num_threads(1)
xs = [torch.randn(1, 64) for _ in range(40)]
def process(batch):
    for _ in range(len(batch) * 50):
        torch.cat(xs).sum()
worker = CaptureWorker(10_000, process, lambda: None, poll_s=0.001)
worker.start()
for i in range(2000):
    worker.offer(i)
import time
time.sleep(0.05)
# exits with the capture thread inside torch operations, never calling stop()
"""


def test_a_process_that_never_stops_its_worker_still_exits_cleanly() -> None:
    # Without the exit hook this aborts every time: a daemon thread inside a torch operation at
    # interpreter finalisation gets "terminate called without an active exception" (status 134).
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr


# A matrix product large enough for MKL to split starts an OpenMP team on a thread that never
# set its own count, whatever the serving thread set: one more OS thread in the process.
THREADS_SCRIPT = """
import os
import torch
from torch import nn
import hookwatch
from hookwatch._monitor.processor import CaptureProcessor

torch.set_num_threads(1)
a, b = torch.randn(256, 2048), torch.randn(2048, 64)
a @ b  # the serving thread's own team (none at one thread) exists before counting
counts = []

def threads():
    return len(os.listdir("/proc/self/task"))

def process(processor, records):
    before = threads()
    a @ b
    counts.append((before, threads()))

# A drain's processing, on the capture thread, is this product.
CaptureProcessor.process = process
model = nn.Linear(4, 2)
monitor = hookwatch.watch(model, {"sample_rate": 1.0}, name="threads")
with torch.inference_mode(), monitor.request(1):
    model(torch.randn(1, 4))
assert monitor.flush(10)
monitor.close()
print(counts[0][0], counts[0][1])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: no OpenMP team to start")
def test_the_capture_thread_runs_torch_with_the_serving_threads_thread_count() -> None:
    done = subprocess.run(
        [sys.executable, "-c", THREADS_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = map(int, done.stdout.split())
    assert after == before, f"the capture thread's product started {after - before} threads"
