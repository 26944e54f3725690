"""Orchestration: one TorchServe, every variant registered beside its baseline, A B A B rounds.

Per model and batch size the four variants are registered as separate models on the same
TorchServe (one worker each), warmed up, then measured in rounds: every round runs each variant
once, in reverse order on odd rounds, so slow drift of the shared machine cancels out and each
variant is compared with the plain run of its own round. Closed loop first, then open loop at a
fixed share of the plain handler's closed-loop throughput.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from hookwatch.tools.bench import micro
from hookwatch.tools.bench.loadgen import CpuClock, Segment, Target, closed_loop, open_loop
from hookwatch.tools.bench.stats import PLAIN, VARIANTS, round_order
from hookwatch.tools.bench.variants import MODELS, Group, build_group
from hookwatch.tools.devstack import Ports, Stack, http_get, http_post


@dataclass(frozen=True)
class Settings:
    mode: str
    models: tuple[str, ...]
    batches: tuple[int, ...]
    #: Rounds per model; every round runs each variant once, in alternating order.
    rounds: Mapping[str, int]
    #: Measured seconds per segment, per model (a 40 ms model needs longer for a stable p99).
    seconds: Mapping[str, float]
    warmup_s: float
    #: Closed-loop clients per unit of batch size (batching at 8 needs >= 8 in flight).
    clients_per_batch: int
    min_clients: int
    #: Open-loop rate as a share of the plain handler's closed-loop throughput.
    open_load: float
    hook_forwards: Mapping[str, int]
    hook_repeats: int
    rss_requests: int
    scrapes: int

    @classmethod
    def full(cls) -> Settings:
        return cls(
            mode="full",
            models=("digits", "resnet18"),
            batches=(1, 8),
            # Many short rounds rather than a few long ones: this machine's speed wanders by
            # +-20 % over seconds, so variants measured close together in time, many times
            # over, are what makes a median ratio resolve a few percent.
            rounds={"digits": 24, "resnet18": 10, "minilm": 8},
            seconds={"digits": 0.75, "resnet18": 3.0, "minilm": 3.0},
            warmup_s=0.25,
            clients_per_batch=2,
            min_clients=4,
            open_load=0.6,
            hook_forwards={"digits": 400, "resnet18": 8, "minilm": 0},
            hook_repeats=7,
            rss_requests=100_000,
            scrapes=50,
        )

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            mode="quick",
            models=("digits",),
            batches=(1, 8),
            rounds={"digits": 2, "resnet18": 2, "minilm": 2},
            seconds={"digits": 1.5, "resnet18": 3.0, "minilm": 3.0},
            warmup_s=0.5,
            clients_per_batch=2,
            min_clients=4,
            open_load=0.6,
            hook_forwards={"digits": 100, "resnet18": 2, "minilm": 0},
            hook_repeats=3,
            rss_requests=3_000,
            scrapes=10,
        )

    def clients(self, batch: int) -> int:
        return max(self.min_clients, self.clients_per_batch * batch)


@dataclass
class GroupResult:
    model: str
    batch: int
    clients: int
    open_rate_rps: float = 0.0
    closed: list[dict[str, Segment]] = field(default_factory=list)
    opened: list[dict[str, Segment]] = field(default_factory=list)
    #: Worker RSS (MB) after warm-up and at the end, per variant.
    rss_start_mb: dict[str, float] = field(default_factory=dict)
    rss_end_mb: dict[str, float] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)


@dataclass
class BenchResult:
    settings: Settings
    machine: dict[str, str]
    groups: list[GroupResult] = field(default_factory=list)
    hook_costs: list[micro.HookCost] = field(default_factory=list)
    rss: list[micro.RssTrace] = field(default_factory=list)
    scrape: micro.ScrapeTime | None = None
    started: str = ""
    duration_s: float = 0.0
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)


def describe_machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "absent"

    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "torchserve": version("torchserve"),
        "prometheus-client": version("prometheus-client"),
        "gpu": _gpu(),
    }


def _gpu() -> str:
    import torch

    if not torch.cuda.is_available():
        return "none (CPU only)"
    return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


class BenchServer(Stack):
    """A Stack that starts with no model loaded; the bench registers its variants itself."""

    def _torchserve_ready(self) -> bool:
        status, _ = http_get(f"http://127.0.0.1:{self.ports.management}/models")
        return status == 200

    def register(self, names: Sequence[str], timeout: float = 300.0) -> None:
        base = f"http://127.0.0.1:{self.ports.management}/models"
        for name in names:
            query = urllib.parse.urlencode(
                {"url": name, "model_name": name, "initial_workers": 1, "synchronous": "false"}
            )
            status, body = http_post(f"{base}?{query}", b"", content_type="text/plain")
            if status not in (200, 202):
                raise RuntimeError(
                    f"register {name}: expected 200/202, got {status} {body[:300]!r}"
                )
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            pending = [n for n in pending if self.ready_workers(n) < 1]
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"workers of {pending} not ready after {timeout:.0f} s")
            time.sleep(0.5)

    def unregister(self, names: Sequence[str]) -> None:
        for name in names:
            request_url = f"http://127.0.0.1:{self.ports.management}/models/{name}"
            request = urllib.request.Request(request_url, method="DELETE")
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()


def _rss_mb(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):  # a worker that just exited holds nothing
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


def _progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _cpu_clock(pids: Sequence[int]) -> CpuClock:
    processes = [psutil.Process(pid) for pid in pids]

    def clock() -> float:
        total = 0.0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    return clock


def run_group(server: BenchServer, group: Group, settings: Settings) -> GroupResult:
    bodies, content_type = MODELS[group.model].payloads()
    seconds = settings.seconds[group.model]
    clients = settings.clients(group.batch)
    result = GroupResult(group.model, group.batch, clients)

    def target(variant: str) -> Target:
        path = f"/predictions/{group.names[variant]}"
        return Target("127.0.0.1", server.ports.inference, path, bodies, content_type)

    clocks = {v: _cpu_clock(server.worker_pids(group.names[v])) for v in VARIANTS}
    for variant in VARIANTS:
        closed_loop(target(variant), clients, max(1.0, seconds / 2), warmup_s=settings.warmup_s)
        result.rss_start_mb[variant] = _rss_mb(server.worker_pids(group.names[variant]))
    for index in range(settings.rounds[group.model]):
        segments = {}
        for variant in round_order(index):
            segments[variant] = closed_loop(
                target(variant),
                clients,
                seconds,
                warmup_s=settings.warmup_s,
                cpu_clock=clocks[variant],
            )
        result.closed.append(segments)
        _progress(
            f"{group.model} b{group.batch} closed round {index + 1}: "
            + ", ".join(
                f"{v} {s.throughput_rps:.1f}/s ({s.cpu_ms or 0:.2f} ms CPU)"
                for v, s in segments.items()
            )
        )
    plain = statistics.median(r[PLAIN].throughput_rps for r in result.closed)
    result.open_rate_rps = settings.open_load * plain
    for index in range(settings.rounds[group.model]):
        segments = {}
        for variant in round_order(index):
            segments[variant] = open_loop(
                target(variant),
                result.open_rate_rps,
                seconds,
                warmup_s=settings.warmup_s,
                cpu_clock=clocks[variant],
            )
        result.opened.append(segments)
        _progress(
            f"{group.model} b{group.batch} open round {index + 1} at "
            f"{result.open_rate_rps:.1f}/s: "
            + ", ".join(f"{v} p99 {s.p99_ms:.1f} ms" for v, s in segments.items())
        )
    for variant in VARIANTS:
        result.rss_end_mb[variant] = _rss_mb(server.worker_pids(group.names[variant]))
        result.served[variant] = sum(s[variant].requests for s in (*result.closed, *result.opened))
    return result


def run(root: Path, settings: Settings, work: Path, ports: Ports) -> BenchResult:
    started = time.monotonic()
    result = BenchResult(
        settings,
        describe_machine(),
        started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        load_before=os.getloadavg(),
    )
    store, build = work / "model_store", work / "build"
    groups = [
        build_group(root, store, build, model, batch)
        for model in settings.models
        for batch in settings.batches
    ]
    _progress(f"built {sum(len(g.names) for g in groups)} variant model directories in {store}")
    server = BenchServer(
        root=root, run_dir=work / "run", ports=ports, workers=1, model_store=store, models=""
    )
    try:
        server.start_torchserve()
        server.start_exporter()
        _progress("TorchServe and the exporter are up")
        for group in groups:
            names = [group.names[v] for v in VARIANTS]
            server.register(names)
            try:
                result.groups.append(run_group(server, group, settings))
            finally:
                server.unregister(names)
        result.scrape = micro.scrape_time(
            server.ports.exporter, server.multiproc_dir, settings.scrapes
        )
    finally:
        server.stop()
    _progress("TorchServe stopped; in-process micro-figures")
    for model in settings.models:
        # The in-process figures feed tensors of a declared shape: not the text model.
        if settings.hook_forwards[model]:
            result.hook_costs.append(
                micro.hook_cost(
                    root, build, model, settings.hook_forwards[model], settings.hook_repeats
                )
            )
    if "digits" in settings.models:
        for monitored in (False, True):
            result.rss.append(micro.rss_in_child(root, build, settings.rss_requests, monitored))
    result.duration_s = time.monotonic() - started
    result.load_after = os.getloadavg()
    return result


def load_result(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
