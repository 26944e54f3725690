"""Child process of test_faults.py: a monitored service whose metrics directory fails.

Run as ``python -m tests.integration.metrics_dir_child SCENARIO MOUNT`` inside a mount namespace
where it may mount a tmpfs (``unshare --user --map-root-user --mount``), with
``PROMETHEUS_MULTIPROC_DIR=MOUNT/dir``. It breaks the directory as SCENARIO says, serves
through it, repairs it, and prints one JSON line of what it saw. A crash (SIGBUS on a full
tmpfs) shows as the exit status.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from hookwatch import _catalogue as cat
from hookwatch._config import read_model_config
from hookwatch._metrics import (
    default_metrics,
    dir_writable,
    exporter_registry,
    parse_samples,
    render,
)
from hookwatch._service import ModelService
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.demo.digits_cnn import DigitsCNN
from tests.filesystem import fill

ROOT = Path(__file__).resolve().parents[2]
SPLIT = load_split()
BAD = {"data": [1, 2, 3]}  # wrong shape: a 400, counted as rejected


class Counting(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def main(scenario: str, base: Path) -> dict[str, Any]:
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    log = Counting()
    logging.getLogger("hookwatch").addHandler(log)
    if scenario != "missing":
        mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(base))
        directory.mkdir()
    filler = None
    if scenario == "read-only":
        mount("-o", "remount,ro", str(base))
    elif scenario == "full":
        filler = fill(base)

    config = yaml.safe_load((ROOT / "models/digits/model-config.yaml").read_text())
    config["handler"]["monitoring"].update({"sample_rate": 1.0, "flush_interval_s": 0.05})
    handler = read_model_config(copy.deepcopy(config)).handler
    torch.manual_seed(0)
    model = DigitsCNN().eval()
    plain = ModelService.from_handler_config(
        copy.deepcopy(model), handler, "digits", monitored=False
    )
    service = ModelService.from_handler_config(model, handler, "digits")
    monitor = service.monitor
    assert monitor is not None
    sent = rejected = 0
    equal = True

    def send(count: int) -> None:
        nonlocal sent, rejected, equal
        for i in range(sent, sent + count):
            requests = [{"data": SPLIT.x_test[i].tolist()}, BAD]
            answers = service.handle(requests)
            equal = equal and answers[0] == plain.handle(requests)[0] and "class" in answers[0]
            sent += 2
            rejected += 1

    send(20)
    monitor.flush()
    growth_error = None
    if scenario == "fills-up":
        filler = fill(base)
        send(20)
        monitor.flush()
        try:
            # New series until the counter file must grow on a full disk.
            for i in range(5000):
                default_metrics().inc(cat.MONITOR_FAULTS, 1, model="growth", layer=f"l{i}")
        except OSError as error:
            growth_error = type(error).__name__
    writable_during = dir_writable(str(directory))
    send(20)

    # Repair, then let the next publish create the files and write what was counted meanwhile.
    if scenario == "missing":
        directory.mkdir()
    elif scenario == "read-only":
        mount("-o", "remount,rw", str(base))
    if filler is not None:
        filler.unlink()
    send(20)
    assert monitor.flush(10)
    samples = parse_samples(
        render(exporter_registry(str(directory), reap_dead_pids=False, compact=False)).decode()
    )

    def total(name: str, **labels: str) -> float:
        want = set({"model": "digits", **labels}.items())
        return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))

    service.close()
    return {
        "answers_equal": equal,
        "requests_sent": sent,
        "requests_counted": total(cat.REQUESTS.name),
        "rejected_sent": rejected,
        "rejected_counted": total(cat.REQUESTS_REJECTED.name),
        "faults_all": total(cat.MONITOR_FAULTS.name, layer="all"),
        "writable_during": int(writable_during),
        # As the exporter reports it.
        "writable_after": samples.get((cat.METRICS_DIR_WRITABLE.name, ()), -1.0),
        "warned": sum("cannot write the metric files" in m for m in log.messages),
        "growth_error": growth_error,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
