"""Exporter scrape time after many worker restarts: ``make bench-scrape``.

Simulated workers are real processes (forked from one that imported torch once) that attach a
real :class:`~hookwatch._monitor.Monitor` to the demo CNN with the demo's monitoring section,
serve a few requests, flush and exit, leaving prometheus-client's files behind exactly as a
TorchServe worker does. Three exporters then run side by side and are scraped in turns:

- baseline: ``live`` workers and no dead ones;
- ``dead`` dead workers plus the live ones, exporter without compaction;
- the same files (a copy), exporter with compaction (the default).

The table goes to ``docs/bench/scrape.md``; the totals of the last two scrapes must agree.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookwatch.tools.devstack import http_get

DEMO_CONFIG = Path("models/digits/model-config.yaml")


# -- simulated workers (run in a child process with PROMETHEUS_MULTIPROC_DIR set) --------------


def _worker(directory: str, config_path: str, requests: int, hold: Any) -> None:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    import torch
    import yaml

    from hookwatch._config import MonitoringConfig
    from hookwatch._hooks import plan_watch
    from hookwatch._metrics import MetricSet
    from hookwatch._monitor import Monitor
    from hookwatch._profile import load_tracker
    from hookwatch.tools.demo.digits_cnn import DigitsCNN

    torch.set_num_threads(1)
    section = dict(yaml.safe_load(Path(config_path).read_text())["handler"]["monitoring"])
    # Every request captured and a short tick, so each file holds every series and exits fast.
    section.update(sample_rate=1.0, flush_interval_s=0.05, seed=os.getpid())
    model = DigitsCNN().eval()
    config = MonitoringConfig.from_mapping(section)
    # The demo's real profile (make mar writes it beside the weights), so each worker also
    # writes the drift and per-bin series a TorchServe worker writes.
    profile_dir = Path(config_path).resolve().parents[2] / "build" / "digits"
    drift = load_tracker(config, profile_dir, "digits")
    if drift is None:
        raise FileNotFoundError(f"expected the demo drift profile in {profile_dir} (make mar)")
    monitor = Monitor(model, plan_watch(model, config, "digits"), metrics=MetricSet(), drift=drift)
    generator = torch.Generator().manual_seed(os.getpid())
    with torch.no_grad():
        for _ in range(requests):
            with monitor.request(1):
                model(torch.rand(1, 1, 8, 8, generator=generator) * 16)
    monitor.flush()
    if hold is not None:
        hold.send("ready")
        hold.recv()  # until the harness is done scraping
    monitor.close()


def simulate(directory: Path, config: Path, dead: int, live: int, requests: int) -> None:
    """Leave ``dead`` exited workers' files in ``directory``, keep ``live`` running until EOF."""
    import multiprocessing as mp

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)  # before prometheus-client loads
    import torch  # noqa: F401 - imported once here, shared copy-on-write by the forks

    ctx = mp.get_context("fork")
    for _ in range(dead):
        proc = ctx.Process(target=_worker, args=(str(directory), str(config), requests, None))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"expected a simulated worker to exit 0, got {proc.exitcode}")
    holders = []
    for _ in range(live):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(str(directory), str(config), requests, theirs))
        proc.start()
        if ours.recv() != "ready":
            raise RuntimeError("expected a live simulated worker to report ready")
        holders.append((proc, ours))
    print("ready", flush=True)
    sys.stdin.read()  # the harness closes our stdin when it is done
    for proc, conn in holders:
        conn.send("stop")
        proc.join(10)


# -- the harness --------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    directory: Path
    compact: bool
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    first_ms: float = 0.0
    files_before: int = 0
    files_after: int = 0
    times_ms: list[float] | None = None
    body: bytes = b""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _scrape_ms(port: int) -> tuple[float, bytes]:
    start = time.perf_counter()
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    elapsed = (time.perf_counter() - start) * 1000
    if status != 200:
        raise RuntimeError(f"expected 200 from the exporter on {port}, got {status}")
    return elapsed, body


def _start_exporter(scenario: Scenario) -> None:
    scenario.port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "hookwatch.tools.cli",
        "exporter",
        "--dir",
        str(scenario.directory),
    ]
    cmd += ["--port", str(scenario.port)] + ([] if scenario.compact else ["--no-compact"])
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    scenario.proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # A TCP connect, not an HTTP request: every path is a scrape, and the first scrape
        # (where compaction happens) is timed by the caller.
        try:
            socket.create_connection(("127.0.0.1", scenario.port), timeout=2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"exporter for {scenario.name} did not listen within 30 s")


def totals(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from hookwatch._metrics import parse_samples

    return parse_samples(body.decode())


def compare(plain: bytes, compacted: bytes) -> list[str]:
    """Differences between two scrapes: counters must match exactly, float sums to 1e-9."""
    a, b = totals(plain), totals(compacted)
    problems = [f"only in one scrape: {key}" for key in set(a) ^ set(b)]
    for key in set(a) & set(b):
        x, y = a[key], b[key]
        exact = not key[0].endswith("_sum")
        if (x != y) if exact else abs(x - y) > 1e-9 * max(1.0, abs(x)):
            problems.append(f"{key}: {x!r} != {y!r}")
    return problems


def _pct(values: Sequence[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def run(
    root: Path, dead: int, live: int, requests: int, scrapes: int, out: Path | None
) -> tuple[str, list[str]]:
    config = root / DEMO_CONFIG
    work = Path(tempfile.mkdtemp(prefix="hookwatch-bench-scrape-"))
    simulators: list[subprocess.Popen[bytes]] = []
    scenarios: list[Scenario] = []
    try:
        base, restarted = work / "baseline", work / "restarted"
        started = time.monotonic()
        for directory, n_dead in ((base, 0), (restarted, dead)):
            directory.mkdir()
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dev.bench.scrape", "simulate"),
                    *("--dir", str(directory), "--config", str(config)),
                    *("--dead", str(n_dead), "--live", str(live), "--requests", str(requests)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
                cwd=root,  # ``dev`` is a folder of the repository, not installed
            )
            simulators.append(proc)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"simulation for {directory.name} failed (rc={proc.wait()})")
        simulate_s = time.monotonic() - started
        compacted = work / "restarted-compacted"
        shutil.copytree(restarted, compacted)
        scenarios = [
            Scenario(f"{live} live workers (baseline)", base, compact=True),
            Scenario(f"{live} live + {dead} dead, no compaction", restarted, compact=False),
            Scenario(f"{live} live + {dead} dead, compaction", compacted, compact=True),
        ]
        for s in scenarios:
            s.files_before = len(list(s.directory.glob("*.db")))
            _start_exporter(s)
            # The first scrape is where the exporter reaps and compacts: timed on its own.
            s.first_ms, s.body = _scrape_ms(s.port)
            s.files_after = len(list(s.directory.glob("*.db")))
            s.times_ms = []
        for _ in range(3):  # warm-up
            for s in scenarios:
                _scrape_ms(s.port)
        for _ in range(scrapes):  # in turns, so load on the machine hits all three alike
            for s in scenarios:
                elapsed, s.body = _scrape_ms(s.port)
                assert s.times_ms is not None
                s.times_ms.append(elapsed)
        problems = compare(scenarios[1].body, scenarios[2].body)
        expected_requests = (dead + live) * requests
        got = sum(
            v
            for (name, _), v in totals(scenarios[2].body).items()
            if name == "hookwatch_requests_total"
        )
        if got != expected_requests:
            problems.append(f"hookwatch_requests_total: expected {expected_requests}, got {got}")
        text = _report(scenarios, dead, live, requests, scrapes, simulate_s, problems)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        return text, problems
    finally:
        for s in scenarios:
            if s.proc is not None:
                s.proc.send_signal(signal.SIGTERM)
                s.proc.wait(10)
        for proc in simulators:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def _report(
    scenarios: list[Scenario],
    dead: int,
    live: int,
    requests: int,
    scrapes: int,
    simulate_s: float,
    problems: list[str],
) -> str:
    from importlib.metadata import version

    base = statistics.median(scenarios[0].times_ms or [0.0])
    series = len([line for line in scenarios[0].body.splitlines() if not line.startswith(b"#")])
    lines = [
        "# Exporter scrape time after worker restarts",
        "",
        "<!-- Written by `make bench-scrape` (python -m dev.bench.scrape); do not edit. -->",
        "",
        f"Each simulated worker is a real process running the demo CNN under a hookwatch Monitor "
        f"with the demo's monitoring section ({requests} requests, all sampled), so its files "
        f"hold every series a TorchServe worker writes ({series} series on the scrape). "
        f"{dead} workers exited before the exporters started, standing for {dead} worker "
        f"restarts; {live} stay alive. The three exporters ran side by side and were scraped "
        f"over HTTP in turns, {scrapes} times each after 3 warm-up scrapes.",
        "",
        "| exporter | `*.db` files before → after first scrape | first scrape (ms) "
        "| median (ms) | p99 (ms) | median vs baseline |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in scenarios:
        times = s.times_ms or [0.0]
        median = statistics.median(times)
        lines.append(
            f"| {s.name} | {s.files_before} → {s.files_after} | {s.first_ms:.1f} "
            f"| {median:.1f} | {_pct(times, 99):.1f} | {median / base:.2f}x |"
        )
    verdict = (
        "identical (counters exact, float sums within 1e-9)"
        if not problems
        else "DIFFERENT: " + "; ".join(problems[:5])
    )
    lines += [
        "",
        f"Totals with and without compaction: {verdict}.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, prometheus-client {version('prometheus-client')} "
        f"(workers simulated in {simulate_s:.0f} s). Target: a scrape under 100 ms after "
        f"{dead} restarts.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.bench.scrape", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    sim = sub.add_parser("simulate", help="internal: write simulated workers' files")
    sim.add_argument("--dir", type=Path, required=True)
    sim.add_argument("--config", type=Path, required=True)
    sim.add_argument("--dead", type=int, required=True)
    sim.add_argument("--live", type=int, required=True)
    sim.add_argument("--requests", type=int, required=True)
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("--dead", type=int, default=100, help="exited workers (restarts)")
    parser.add_argument("--live", type=int, default=4)
    parser.add_argument("--requests", type=int, default=5, help="requests per worker")
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/scrape.md"))
    args = parser.parse_args(argv)
    if args.command == "simulate":
        simulate(args.dir, args.config, args.dead, args.live, args.requests)
        return 0
    text, problems = run(args.root, args.dead, args.live, args.requests, args.scrapes, args.out)
    print(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
