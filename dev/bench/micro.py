"""Micro-figures: hook cost per call, RSS over many requests, exporter scrape time.

RSS runs in a child process per variant (``python -m dev.bench.micro rss ...``) so one
variant's allocations never count against the other.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from dev.bench.naive import NaiveCapture
from dev.bench.variants import MODELS, torch_load_state
from hookwatch._config import HandlerConfig, MonitoringConfig, read_model_config
from hookwatch._hooks import plan_watch
from hookwatch._metrics import MetricSet
from hookwatch._monitor import Monitor
from hookwatch._service import ModelService
from hookwatch.tools.devstack import http_get


def _model(root: Path, name: str, build: Path) -> tuple[nn.Module, dict[str, Any]]:
    kind = MODELS[name]
    model: nn.Module
    if name == "digits":
        from hookwatch.tools.demo.digits_cnn import DigitsCNN

        model = DigitsCNN()
    else:
        from dev.bench.resnet import ResNet18

        model = ResNet18()
    model.load_state_dict(torch_load_state(kind.weights(root, build)))
    model.eval()
    return model, dict(read_model_config(root / kind.config).raw["handler"])


@dataclass(frozen=True)
class HookCost:
    model: str
    hook_points: int
    forward_us: float
    #: Extra µs per hook call over the unhooked forward, median of repeats.
    unsampled_us: float
    sampled_us: float
    naive_us: float


def hook_cost(root: Path, build: Path, name: str, forwards: int, repeats: int) -> HookCost:
    """Batch-1 forwards: no hooks vs hookwatch gate closed / open vs the naive hooks.

    The sampled figure includes the capture thread's share of the GIL while the forwards run,
    which is what the request thread pays in a worker process.
    """
    torch.set_num_threads(1)
    base, handler = _model(root, name, build)
    shape = handler["input"]["shape"]
    x = torch.rand(1, *shape) * float(handler["input"].get("max", 1.0))
    monitoring = dict(handler["monitoring"])
    registry_metrics = MetricSet()
    closed = MonitoringConfig.from_mapping({**monitoring, "sample_rate": 0.0})
    opened = MonitoringConfig.from_mapping({**monitoring, "sample_rate": 1.0})
    models = {key: copy.deepcopy(base) for key in ("none", "unsampled", "sampled", "naive")}
    monitors = {
        "unsampled": Monitor(
            models["unsampled"],
            plan_watch(models["unsampled"], closed, f"{name}-u"),
            metrics=registry_metrics,
        ),
        "sampled": Monitor(
            models["sampled"],
            plan_watch(models["sampled"], opened, f"{name}-s"),
            metrics=registry_metrics,
        ),
    }
    naive = NaiveCapture.attach(models["naive"], opened, f"{name}-n", registry_metrics)

    def runner(key: str) -> Callable[[], None]:
        model = models[key]
        monitor = monitors.get(key)

        def run() -> None:
            with torch.inference_mode():
                for _ in range(forwards):
                    if monitor is None:
                        model(x)
                    else:
                        with monitor.request(1):
                            model(x)

        return run

    runs = {key: runner(key) for key in models}
    for run in runs.values():
        run()  # warm-up
    times: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            started = time.perf_counter()
            run()
            times[key].append((time.perf_counter() - started) / forwards)
            if key in monitors:
                monitors[key].flush()
    for monitor in monitors.values():
        monitor.close()
    naive.close()
    points = len(opened.watched)
    t = {key: statistics.median(v) * 1e6 for key, v in times.items()}
    return HookCost(
        model=name,
        hook_points=points,
        forward_us=t["none"],
        unsampled_us=(t["unsampled"] - t["none"]) / points,
        sampled_us=(t["sampled"] - t["none"]) / points,
        naive_us=(t["naive"] - t["none"]) / points,
    )


@dataclass(frozen=True)
class RssTrace:
    monitored: bool
    requests: int
    start_mb: float
    end_mb: float
    peak_mb: float
    #: RSS in MB after every ``every`` requests.
    trace_mb: list[float]
    every: int
    #: Drift detection ran (a profile was loaded); False in results from before it did.
    drift: bool = False

    @property
    def growth_mb(self) -> float:
        return self.end_mb - self.start_mb


def rss_trace(
    root: Path, build: Path, requests: int, monitored: bool, model_dir: Path | None = None
) -> RssTrace:
    """Serve the demo model in process, 100 % sampling when monitored; RSS from the OS.

    ``model_dir`` holds the drift profile, as a worker's model directory does: monitored, the
    service then detects drift, and without a profile there it refuses to measure.
    """
    from hookwatch.tools.demo.data import load_split

    torch.set_num_threads(1)
    model, handler = _model(root, "digits", build)
    handler = copy.deepcopy(handler)
    handler["monitoring"]["sample_rate"] = 1.0
    service = ModelService.from_handler_config(
        model,
        HandlerConfig.from_mapping(handler),
        "digits-rss",
        MetricSet(),
        monitored=monitored,
        model_dir=None if model_dir is None else str(model_dir),
    )
    if (
        monitored
        and model_dir is not None
        and (service.monitor is None or not service.monitor._drift)
    ):
        raise RuntimeError(
            f"rss: expected the drift profile in {model_dir} loaded, got none (see the log above)"
        )
    bodies = [{"data": image.tolist()} for image in load_split().x_test[:256]]
    process = psutil.Process()
    for i in range(1000):
        service.handle([bodies[i % len(bodies)]])
    if service.monitor is not None:
        service.monitor.flush()
    gc.collect()
    every = max(1, requests // 20)
    start = process.memory_info().rss
    trace: list[float] = []
    for i in range(requests):
        service.handle([bodies[i % len(bodies)]])
        if (i + 1) % every == 0:
            trace.append(process.memory_info().rss / 2**20)
    if service.monitor is not None:
        service.monitor.flush()
    gc.collect()
    end = process.memory_info().rss
    service.close()
    return RssTrace(
        monitored=monitored,
        drift=service.monitor is not None and service.monitor._drift is not None,
        requests=requests,
        start_mb=start / 2**20,
        end_mb=end / 2**20,
        peak_mb=max([*trace, end / 2**20]),
        trace_mb=[round(v, 2) for v in trace],
        every=every,
    )


def rss_in_child(
    root: Path, build: Path, requests: int, monitored: bool, model_dir: Path | None = None
) -> RssTrace:
    cmd = [sys.executable, "-m", "dev.bench.micro", "rss", "--root", str(root)]
    cmd += ["--build", str(build), "--requests", str(requests)]
    if monitored:
        cmd.append("--monitored")
    if model_dir is not None:
        cmd += ["--model-dir", str(model_dir)]
    # From the repository root: ``dev`` is a folder of it, not an installed package.
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=root)
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return RssTrace(**data)


@dataclass(frozen=True)
class ScrapeTime:
    scrapes: int
    files: int
    body_bytes: int
    median_ms: float
    max_ms: float


def scrape_time(port: int, multiproc_dir: Path, scrapes: int) -> ScrapeTime:
    """GET /metrics on a running exporter; the directory is as the bench's workers left it."""
    times: list[float] = []
    size = 0
    for _ in range(scrapes):
        started = time.perf_counter()
        status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=30.0)
        times.append((time.perf_counter() - started) * 1e3)
        if status != 200:
            raise RuntimeError(f"exporter scrape: expected 200, got {status}")
        size = len(body)
    return ScrapeTime(
        scrapes=scrapes,
        files=len(list(multiproc_dir.glob("*.db"))),
        body_bytes=size,
        median_ms=statistics.median(times),
        max_ms=max(times),
    )


def as_dict(value: Any) -> Mapping[str, Any]:
    data: Mapping[str, Any] = asdict(value)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bench micro-figures (child processes)")
    sub = parser.add_subparsers(dest="what", required=True)
    rss = sub.add_parser("rss")
    rss.add_argument("--root", type=Path, required=True)
    rss.add_argument("--build", type=Path, required=True)
    rss.add_argument("--requests", type=int, required=True)
    rss.add_argument("--monitored", action="store_true")
    rss.add_argument("--model-dir", type=Path, default=None, help="holds the drift profile")
    args = parser.parse_args(argv)
    trace = rss_trace(args.root, args.build, args.requests, args.monitored, args.model_dir)
    print(json.dumps(asdict(trace)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
