"""Orchestration: one TorchServe, every variant registered beside its baseline, A B A B rounds.

Per model and batch size the four variants are registered as separate models on the same
TorchServe (one worker each), warmed up, then measured in rounds: every round runs each variant
once, in reverse order on odd rounds, so slow drift of the shared machine cancels out and each
variant is compared with the plain run of its own round. Closed loop first, then open loop at a
fixed share of the plain handler's closed-loop throughput.

Segments are as long as the model's minimum or as long as it takes, at the plain handler's
warm-up rate, for every p99 to rest on ``min_latencies`` latencies and every closed-loop client
to complete ``min_cycles`` request cycles (so its rate is measured, not counted), whichever is
longer. The monitored variants must have loaded their drift profile, or the bench stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from dev.bench import micro
from dev.bench.variants import MODELS, Group, build_group
from hookwatch._config import MonitoringConfig
from hookwatch.tools.bench.loadgen import CpuClock, Segment, Target, closed_loop, open_loop
from hookwatch.tools.bench.server import BenchServer
from hookwatch.tools.bench.stats import MONITORED, PLAIN, VARIANTS, round_order
from hookwatch.tools.devstack import Ports, http_get

if TYPE_CHECKING:
    from hookwatch._metrics import SampleKey


@dataclass(frozen=True)
class Settings:
    mode: str
    models: tuple[str, ...]
    batches: tuple[int, ...]
    #: Rounds per model; every round runs each variant once, in alternating order.
    rounds: Mapping[str, int]
    #: Least measured seconds per segment, per model; longer where the latencies and cycles
    #: below need it (:func:`segment_seconds`).
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
    #: Latencies each p99 rests on, at least, at the plain handler's warm-up rate: with 100, a
    #: p99 is the 99th percentile and not the single slowest request.
    min_latencies: int = 100
    #: Request cycles every closed-loop client completes in a segment, at least: fewer and its
    #: cycle rate is unmeasured and the throughput falls back to a count (quantised by batches).
    min_cycles: int = 4
    #: Longest measured segment; a model slower than that gets fewer latencies (the table
    #: shows how many).
    max_seconds: float = 30.0
    #: Worker starts per model, for each of its batch sizes (1 where a model is not named):
    #: the rounds are split between them, each start registering every variant afresh. A
    #: worker's speed depends on where its process landed, and that placement holds for as
    #: long as the process does: with one start, a variant's worker could be 10 % quicker or
    #: slower than plain's in every round of a run (docs/bench/README.md, *Worker starts*).
    starts: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def full(cls) -> Settings:
        return cls(
            mode="full",
            models=("digits", "resnet18"),
            batches=(1, 8),
            # Many short rounds rather than a few long ones: this machine's speed wanders by
            # +-20 % over seconds, so variants measured close together in time, many times
            # over, are what makes a median ratio resolve a few percent. ResNet-18 serves 8-23
            # requests/s here, so its segments are 5-22 s long (min_latencies) and its rounds
            # fewer: 11-22 of the 25-35 minutes.
            rounds={"digits": 24, "resnet18": 5, "minilm": 8},
            seconds={"digits": 0.75, "resnet18": 3.0, "minilm": 3.0},
            warmup_s=0.25,
            starts={"digits": 8, "resnet18": 5, "minilm": 4},
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
            starts={"digits": 2, "resnet18": 2, "minilm": 2},
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

    def start_of(self, model: str) -> list[int]:
        """The worker start each of ``model``'s rounds runs on: consecutive rounds share one,
        as evenly as the counts allow."""
        rounds = self.rounds[model]
        starts = max(1, min(self.starts.get(model, 1), rounds))
        return [index * starts // rounds for index in range(rounds)]


@dataclass
class GroupResult:
    model: str
    batch: int
    clients: int
    open_rate_rps: float = 0.0
    closed: list[dict[str, Segment]] = field(default_factory=list)
    opened: list[dict[str, Segment]] = field(default_factory=list)
    #: Worker RSS (MB) after warm-up and at the end, per variant (of the last worker start).
    rss_start_mb: dict[str, float] = field(default_factory=dict)
    rss_end_mb: dict[str, float] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    #: Measured seconds of each closed-loop and open-loop segment (:func:`segment_seconds`).
    closed_s: float = 0.0
    open_s: float = 0.0
    #: Whether each monitored variant's worker reported its drift profile loaded (the bench
    #: stops before measuring when one did not); empty in results from before the check.
    drift_loaded: dict[str, bool] = field(default_factory=dict)
    #: The worker start each closed and open round ran on (Settings.starts); empty in results
    #: from before starts, which ran every round on one.
    closed_starts: list[int] = field(default_factory=list)
    opened_starts: list[int] = field(default_factory=list)


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
    #: What the ``default`` variant sampled: hookwatch's defaults when the run was made (a
    #: run from before the cap existed sampled a plain 10 %).
    default_sampling: str = "`sample_rate` unset: 0.1"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchResult:
        """The result :meth:`to_json` wrote, also from before fields were added (they take
        their defaults: a run before the drift check reads as one with drift unchecked)."""

        def known(kind: Any, values: Mapping[str, Any]) -> dict[str, Any]:
            names = {f.name for f in fields(kind)}
            return {k: v for k, v in values.items() if k in names}

        def rounds(items: Sequence[Mapping[str, Mapping[str, Any]]]) -> list[dict[str, Segment]]:
            return [{v: Segment(**known(Segment, seg)) for v, seg in r.items()} for r in items]

        groups = []
        for g in data["groups"]:
            group = GroupResult(**known(GroupResult, g))
            group.closed, group.opened = rounds(g["closed"]), rounds(g["opened"])
            groups.append(group)
        scrape = data.get("scrape")
        return cls(
            settings=Settings(**known(Settings, data["settings"])),
            machine=dict(data["machine"]),
            groups=groups,
            hook_costs=[micro.HookCost(**known(micro.HookCost, h)) for h in data["hook_costs"]],
            rss=[micro.RssTrace(**known(micro.RssTrace, t)) for t in data["rss"]],
            scrape=None if scrape is None else micro.ScrapeTime(**scrape),
            started=str(data.get("started", "")),
            duration_s=float(data.get("duration_s", 0.0)),
            load_before=tuple(data.get("load_before", (0.0, 0.0, 0.0))),
            load_after=tuple(data.get("load_after", (0.0, 0.0, 0.0))),
            **(
                {"default_sampling": data["default_sampling"]} if "default_sampling" in data else {}
            ),
        )


def default_sampling() -> str:
    """hookwatch's default sampling as the ``default`` variant runs it."""
    defaults = MonitoringConfig(layers=())
    return (
        f"`sample_rate` unset: {defaults.share:g} of the forwards, at most "
        f"{defaults.max_sampled_per_s:g} sampled requests a second per worker and "
        f"{defaults.max_overhead:g} of its time"
    )


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


def _rss_mb(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):  # a worker that just exited holds nothing
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def worker_cpu_clock(pids: Sequence[int]) -> CpuClock:
    processes = [psutil.Process(pid) for pid in pids]

    def clock() -> float:
        total = 0.0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    return clock


def segment_seconds(settings: Settings, least: float, rate_rps: float, clients: int) -> float:
    """Measured seconds of a segment at ``rate_rps`` (the plain handler's): at least ``least``,
    long enough for ``min_latencies`` latencies and, with closed-loop ``clients``, for each
    client's ``min_cycles`` cycles; at most ``max_seconds``.

    Closed loop (``clients`` > 0) asks 10 % more, for a variant slower than plain; an open
    loop's count is its schedule's, whatever the variant, and asks 2 % more."""
    if rate_rps <= 0:
        raise RuntimeError(f"expected a positive warm-up rate, got {rate_rps:.3f} requests/s")
    margin = 1.1 if clients else 1.02
    needed = max(settings.min_latencies, settings.min_cycles * clients) * margin / rate_rps
    return round(min(settings.max_seconds, max(least, needed)), 2)


def scraped(port: int, timeout: float = 30.0) -> tuple[int, dict[SampleKey, float]]:
    """``/metrics`` on 127.0.0.1:``port`` (the exporter, or TorchServe's metrics API) as
    (status, samples keyed by name and labels); no samples unless the status is 200."""
    from hookwatch._metrics import parse_samples

    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=timeout)
    return status, parse_samples(body.decode()) if status == 200 else {}


def check_drift_loaded(server: BenchServer, group: Group, timeout: float = 60.0) -> dict[str, bool]:
    """Each monitored variant's ``hookwatch_drift_profile_loaded`` from the exporter, which
    must read 1: a bench without drift detection measures less than users run.

    Polled until every series is there (the worker declares it when it builds its monitor;
    the exporter reads it from the worker's metric files); a 0 fails at once.
    """
    monitored = [v for v in VARIANTS if v in MONITORED and v in group.names]
    deadline = time.monotonic() + timeout
    while True:
        status, samples = scraped(server.ports.exporter)
        found = {
            v: samples.get(("hookwatch_drift_profile_loaded", (("model", group.names[v]),)))
            for v in monitored
        }
        for variant, value in found.items():
            if value is not None and value != 1:
                raise RuntimeError(
                    f"bench {group.names[variant]}: expected hookwatch_drift_profile_loaded 1, "
                    f"got {value:g} (the worker serves without drift; see its log in "
                    f"{server.logs})"
                )
        if all(value is not None for value in found.values()):
            return {v: True for v in monitored}
        if time.monotonic() > deadline:
            missing = ", ".join(group.names[v] for v, value in found.items() if value is None)
            raise RuntimeError(
                f"bench: expected hookwatch_drift_profile_loaded for {missing} on the exporter, "
                f"got no such series after {timeout:.0f} s (exporter status {status})"
            )
        time.sleep(0.5)


def run_group(server: BenchServer, group: Group, settings: Settings) -> GroupResult:
    """Every variant of ``group`` registered, measured and unregistered once per worker start
    (:meth:`Settings.start_of`): each start's closed rounds, then its open ones. Segment
    lengths and the open loop's rate come from the first start's plain handler."""
    bodies, content_type = MODELS[group.model].payloads()
    clients = settings.clients(group.batch)
    result = GroupResult(group.model, group.batch, clients)
    start_of = settings.start_of(group.model)

    def target(variant: str) -> Target:
        path = f"/predictions/{group.names[variant]}"
        return Target("127.0.0.1", server.ports.inference, path, bodies, content_type)

    for start in sorted(set(start_of)):
        rounds = [i for i, s in enumerate(start_of) if s == start]
        # Registered in a rotated order: which variant's worker starts first is not the same
        # variant every time.
        names = [group.names[v] for v in VARIANTS]
        names = names[start % len(names) :] + names[: start % len(names)]
        server.register(names)
        try:
            _measure_start(server, group, settings, result, start, rounds, target, clients)
        finally:
            server.unregister(names)
        progress(f"{group.model} b{group.batch}: worker start {start + 1} of {start_of[-1] + 1}")
    for variant in VARIANTS:
        result.served[variant] = sum(s[variant].requests for s in (*result.closed, *result.opened))
    return result


def _measure_start(
    server: BenchServer,
    group: Group,
    settings: Settings,
    result: GroupResult,
    start: int,
    rounds: Sequence[int],
    target: Callable[[str], Target],
    clients: int,
) -> None:
    """One worker start's warm-up and rounds, appended to ``result``."""
    seconds = settings.seconds[group.model]
    loaded = check_drift_loaded(server, group)
    if start == 0:
        result.drift_loaded = loaded
        progress(f"{group.model} b{group.batch}: drift profile loaded in {sorted(loaded)}")
    clocks = {v: worker_cpu_clock(server.worker_pids(group.names[v])) for v in VARIANTS}
    warm: dict[str, Segment] = {}
    for variant in VARIANTS:
        # As long as a segment's least: a ResNet-18 batch of 8 takes ~2 s, and a shorter
        # warm-up would give its rate from a handful of requests.
        warm[variant] = closed_loop(
            target(variant), clients, max(1.0, seconds), warmup_s=settings.warmup_s
        )
        # RSS from the warm-up to the end of the last start (a fresh process each start).
        result.rss_start_mb[variant] = _rss_mb(server.worker_pids(group.names[variant]))
    if start == 0:
        # The cycle rate where every client completed one, else the count.
        warm_rps = warm[PLAIN].throughput_rps
        result.closed_s = segment_seconds(settings, seconds, warm_rps, clients)
        result.open_s = segment_seconds(settings, seconds, settings.open_load * warm_rps, 0)
        progress(
            f"{group.model} b{group.batch}: plain warm-up {warm_rps:.1f}/s; segments "
            f"{result.closed_s:.1f} s closed, {result.open_s:.1f} s open"
        )
    for index in rounds:
        segments = {}
        for variant in round_order(index):
            segments[variant] = closed_loop(
                target(variant),
                clients,
                result.closed_s,
                warmup_s=settings.warmup_s,
                cpu_clock=clocks[variant],
            )
        result.closed.append(segments)
        result.closed_starts.append(start)
        progress(
            f"{group.model} b{group.batch} closed round {index + 1}: "
            + ", ".join(
                f"{v} {s.throughput_rps:.1f}/s ({s.cpu_ms or 0:.2f} ms CPU)"
                for v, s in segments.items()
            )
        )
    if start == 0:
        plain = statistics.median(r[PLAIN].throughput_rps for r in result.closed)
        result.open_rate_rps = settings.open_load * plain
    for index in rounds:
        segments = {}
        for variant in round_order(index):
            segments[variant] = open_loop(
                target(variant),
                result.open_rate_rps,
                result.open_s,
                warmup_s=settings.warmup_s,
                cpu_clock=clocks[variant],
            )
        result.opened.append(segments)
        result.opened_starts.append(start)
        progress(
            f"{group.model} b{group.batch} open round {index + 1} at "
            f"{result.open_rate_rps:.1f}/s: "
            + ", ".join(f"{v} p99 {s.p99_ms:.1f} ms" for v, s in segments.items())
        )
    for variant in VARIANTS:
        result.rss_end_mb[variant] = _rss_mb(server.worker_pids(group.names[variant]))


def run(root: Path, settings: Settings, work: Path, ports: Ports) -> BenchResult:
    started = time.monotonic()
    result = BenchResult(
        settings,
        describe_machine(),
        started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        load_before=os.getloadavg(),
        default_sampling=default_sampling(),
    )
    store, build = work / "model_store", work / "build"
    groups = [
        build_group(root, store, build, model, batch)
        for model in settings.models
        for batch in settings.batches
    ]
    progress(f"built {sum(len(g.names) for g in groups)} variant model directories in {store}")
    server = BenchServer(
        root=root, run_dir=work / "run", ports=ports, workers=1, model_store=store, models=""
    )
    try:
        server.start_torchserve()
        server.start_exporter()
        progress("TorchServe and the exporter are up")
        for group in groups:
            result.groups.append(run_group(server, group, settings))
        result.scrape = micro.scrape_time(
            server.ports.exporter, server.multiproc_dir, settings.scrapes
        )
    finally:
        server.stop()
    progress("TorchServe stopped; in-process micro-figures")
    for model in settings.models:
        # The in-process figures feed tensors of a declared shape: not the text model.
        if settings.hook_forwards[model]:
            result.hook_costs.append(
                micro.hook_cost(
                    root, build, model, settings.hook_forwards[model], settings.hook_repeats
                )
            )
    if "digits" in settings.models:
        # The monitored variant's own model directory: its drift profile makes the in-process
        # run detect drift as the served one does.
        model_dir = store / next(g for g in groups if g.model == "digits").names["full"]
        for monitored in (False, True):
            result.rss.append(
                micro.rss_in_child(root, build, settings.rss_requests, monitored, model_dir)
            )
    result.duration_s = time.monotonic() - started
    result.load_after = os.getloadavg()
    return result


def load_result(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def read_result(path: Path) -> BenchResult:
    """The :class:`BenchResult` a run wrote to ``path`` (results.json)."""
    return BenchResult.from_dict(load_result(path))
