"""Where a served worker's CPU goes: py-spy on the TorchServe workers under closed-loop load.

Builds the bench's variants of one model (:mod:`dev.bench.variants`: drift profile
in every monitored one), starts TorchServe, and for each variant drives a closed loop while
``py-spy record`` samples that variant's worker (``--nonblocking``: the worker is never
paused; ``--threads``; idle stacks left out). The report is per request, so variants compare
at their own rates:

* each thread's active samples per 1,000 requests (the request thread, the capture thread);
* the request thread's cost split into what hookwatch's own frames hold (inclusive) and the
  rest, and the frames that grew most against the plain handler;
* the worker's OS CPU per request over the same window, for scale.

``python -m dev.bench.profile --model digits --batch 1`` (``make bench-profile``);
``--out`` writes the report as markdown. The figures are samples, not times: at ``--rate``
samples per second of a thread's activity, 1 sample is 1/rate seconds on CPU.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dev.bench.runner import Settings, check_drift_loaded, worker_cpu_clock
from dev.bench.variants import MODELS, build_group
from hookwatch.tools.bench.loadgen import Segment, Target, closed_loop
from hookwatch.tools.bench.server import BenchServer
from hookwatch.tools.bench.stats import PLAIN, VARIANTS
from hookwatch.tools.devstack import Ports

#: Frames of hookwatch's own runtime (not its tools): what monitoring adds to a request.
OWN = "hookwatch/_"
#: Threads by name as py-spy reports them.
CAPTURE_THREAD = "hookwatch-capture"


@dataclass
class Profile:
    """One variant's samples: collapsed stacks per thread, and the requests served meanwhile."""

    variant: str
    requests: int
    seconds: float
    cpu_ms: float | None
    #: thread name -> stack ("frame;frame;...", root first) -> samples
    stacks: dict[str, collections.Counter[str]] = field(default_factory=dict)
    #: OS CPU seconds per thread over the recording: the main thread (TorchServe's request
    #: loop) and all others together.
    main_cpu_s: float = 0.0
    other_cpu_s: float = 0.0

    def per_k(self, samples: float) -> float:
        return samples / self.requests * 1000 if self.requests else float("nan")

    def thread_samples(self) -> dict[str, int]:
        return {name: sum(c.values()) for name, c in self.stacks.items()}

    def request_thread(self) -> str:
        """The thread that serves requests: the busiest one that is not the capture thread."""
        counts = self.thread_samples()
        others = {n: c for n, c in counts.items() if CAPTURE_THREAD not in n}
        return max(others, key=lambda n: others[n]) if others else ""

    def inclusive(self, thread: str, predicate: str) -> int:
        """Samples of ``thread`` with a frame containing ``predicate`` anywhere on the stack."""
        return sum(n for stack, n in self.stacks.get(thread, {}).items() if predicate in stack)

    def _by_frame(
        self, thread: str, pick: Callable[[list[str]], str | None]
    ) -> collections.Counter[str]:
        """Samples of ``thread`` by the frame ``pick`` chooses from each stack (root first);
        stacks it picks nothing from are left out."""
        out: collections.Counter[str] = collections.Counter()
        for stack, n in self.stacks.get(thread, {}).items():
            frame = pick(stack.split(";"))
            if frame is not None:
                out[_short(frame)] += n
        return out

    def own_frames(self, thread: str) -> collections.Counter[str]:
        """Samples by the outermost hookwatch frame on the stack (what hookwatch called in)."""
        return self._by_frame(thread, lambda frames: next((f for f in frames if OWN in f), None))

    def innermost_own(self, thread: str) -> collections.Counter[str]:
        """Samples by the innermost hookwatch frame (the hookwatch code the time is under)."""
        return self._by_frame(
            thread, lambda frames: next((f for f in reversed(frames) if OWN in f), "(outside)")
        )

    def leaf_frames(self, thread: str) -> collections.Counter[str]:
        return self._by_frame(thread, lambda frames: frames[-1])


def _short(frame: str) -> str:
    """``fn (path/to/file.py:12)`` -> ``fn (file.py)``: one name per function, not per line."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    tail = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({tail})"


def parse_raw(text: str) -> dict[str, collections.Counter[str]]:
    """py-spy's ``--format raw`` with ``--threads``: ``thread (id);frame;...;frame count``."""
    out: dict[str, collections.Counter[str]] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread, _, frames = stack.partition(";")
        # py-spy labels a thread by its name when it has one: "hookwatch-capture (0x7f..)".
        out.setdefault(thread.strip(), collections.Counter())[frames] += int(count)
    return out


def thread_cpu(pid: int) -> tuple[float, float]:
    """OS CPU seconds (user + system) of the process's main thread and of its other threads."""
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that just ended
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if int(task.name) == pid:
            main += seconds
        else:
            other += seconds
    return main, other


def record(spy: str, pid: int, seconds: float, rate: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--rate",
            str(rate),
            "--format",
            "raw",
            "--threads",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def profile_variant(
    target: Target,
    pid: int,
    variant: str,
    clients: int,
    seconds: float,
    rate: int,
    spy: str,
    workdir: Path,
) -> Profile:
    out = workdir / f"{variant}.txt"
    clock = worker_cpu_clock([pid])
    result: dict[str, Segment] = {}

    def drive() -> None:
        # A little longer than the recording, so py-spy never samples an idle worker.
        result["segment"] = closed_loop(target, clients, seconds + 1.0, cpu_clock=clock)

    driver = threading.Thread(target=drive)
    driver.start()
    time.sleep(0.5)
    before = thread_cpu(pid)
    spying = record(spy, pid, seconds, rate, out)
    _, err = spying.communicate()
    after = thread_cpu(pid)
    driver.join()
    if spying.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy on worker {pid} failed: {err.decode(errors='replace')[-500:]}")
    segment = result["segment"]
    return Profile(
        variant,
        requests=round(segment.throughput_rps * seconds),
        seconds=seconds,
        cpu_ms=segment.cpu_ms,
        stacks=parse_raw(out.read_text()),
        main_cpu_s=after[0] - before[0],
        other_cpu_s=after[1] - before[1],
    )


def report(model: str, batch: int, rate: int, profiles: Mapping[str, Profile]) -> str:
    lines = [
        f"# Worker profile: {model}, batch {batch}",
        "",
        f"py-spy samples per 1,000 requests at {rate} samples/s (1 sample = {1000 / rate:g} "
        "ms), stacks py-spy finds idle left out. Without pausing the worker it cannot tell "
        "every wait from work: frames that wait (the socket read `_retrieve_buffer`, a wait "
        "for the GIL after a torch call, `Monitor.pace`, the capture loop) count their waits. "
        "The CPU columns are the OS's, per thread.",
        "",
        "| variant | requests/s | worker CPU ms/request | main thread CPU ms/request | other "
        "threads' CPU ms/request | request thread samples | of it in hookwatch "
        "| capture thread samples | other threads' samples |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in profiles.items():
        counts = p.thread_samples()
        request = p.request_thread()
        capture = sum(c for n, c in counts.items() if CAPTURE_THREAD in n)
        other = sum(counts.values()) - counts.get(request, 0) - capture
        lines.append(
            f"| {name} | {p.requests / p.seconds:.1f} | "
            f"{p.cpu_ms if p.cpu_ms is not None else float('nan'):.3f} | "
            f"{p.per_k(p.main_cpu_s):.3f} | {p.per_k(p.other_cpu_s):.3f} | "
            f"{p.per_k(counts.get(request, 0)):.0f} | {p.per_k(p.inclusive(request, OWN)):.0f} | "
            f"{p.per_k(capture):.0f} | {p.per_k(other):.0f} |"
        )
    plain = profiles.get(PLAIN)
    for name, p in profiles.items():
        request = p.request_thread()
        lines += ["", f"## {name}: request thread, hookwatch's outermost frames", ""]
        lines += ["| frame | samples / 1,000 requests |", "|---|---|"]
        for frame, n in p.own_frames(request).most_common(12):
            lines.append(f"| `{frame}` | {p.per_k(n):.1f} |")
        if plain is not None and p is not plain:
            lines += ["", f"## {name}: leaf frames that grew most against {PLAIN}", ""]
            lines += [f"| frame | {PLAIN} | {name} |", "|---|---|---|"]
            mine = p.leaf_frames(request)
            theirs = plain.leaf_frames(plain.request_thread())
            grown = sorted(
                mine, key=lambda f: p.per_k(mine[f]) - plain.per_k(theirs.get(f, 0)), reverse=True
            )
            for frame in grown[:15]:
                lines.append(
                    f"| `{frame}` | {plain.per_k(theirs.get(frame, 0)):.1f} | "
                    f"{p.per_k(mine[frame]):.1f} |"
                )
        capture_thread = next((t for t in p.stacks if CAPTURE_THREAD in t), None)
        if capture_thread is not None:
            lines += ["", f"## {name}: capture thread, innermost hookwatch frame", ""]
            lines += ["| frame | samples / 1,000 requests |", "|---|---|"]
            for frame, count in p.innermost_own(capture_thread).most_common(15):
                lines.append(f"| `{frame}` | {p.per_k(count):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("--model", default="digits", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seconds", type=float, default=20.0, help="recorded per variant")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--work", type=Path, default=Path("build/bench-profile"))
    parser.add_argument("--out", type=Path, default=None, help="markdown report to write")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        print(
            "bench profile: expected py-spy (pip install py-spy), found none",
            file=sys.stderr,
        )
        return 2
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        print(
            f"bench profile: expected variants from {VARIANTS}, got {unknown}",
            file=sys.stderr,
        )
        return 2
    root = args.root.resolve()
    work = args.work.resolve()
    group = build_group(root, work / "model_store", work / "build", args.model, args.batch)
    bodies, content_type = MODELS[args.model].payloads()
    clients = Settings.full().clients(args.batch)
    server = BenchServer(
        root=root,
        run_dir=work / "run",
        ports=Ports.free(),
        workers=1,
        model_store=work / "model_store",
        models="",
    )
    profiles: dict[str, Profile] = {}
    try:
        server.start_torchserve()
        server.start_exporter()
        names = [group.names[v] for v in VARIANTS]
        server.register(names)
        check_drift_loaded(server, group)
        with tempfile.TemporaryDirectory() as tmp:
            for variant in variants:
                name = group.names[variant]
                target = Target(
                    "127.0.0.1",
                    server.ports.inference,
                    f"/predictions/{name}",
                    bodies,
                    content_type,
                )
                closed_loop(target, clients, 2.0)  # warm-up
                (pid,) = server.worker_pids(name)
                profiles[variant] = profile_variant(
                    target,
                    pid,
                    variant,
                    clients,
                    args.seconds,
                    args.rate,
                    spy,
                    Path(tmp),
                )
                print(
                    f"[profile] {variant}: {profiles[variant].requests} requests", file=sys.stderr
                )
    finally:
        server.stop()
    text = report(args.model, args.batch, args.rate, profiles)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
