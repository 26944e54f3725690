"""``hookwatch`` command line: the exporter, the demo build, and the native stack."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT_HINT = "run from the repository root, or pass --root"


def _exporter(args: argparse.Namespace) -> int:
    from hookwatch.metrics import serve_multiprocess

    server, _ = serve_multiprocess(args.dir, args.port, args.addr, reap_dead_pids=not args.no_reap)
    print(
        f"hookwatch exporter on http://{args.addr}:{args.port}/metrics reading {args.dir}",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return 0


def _build_demo(args: argparse.Namespace) -> int:
    from hookwatch.demo.build import build

    build(args.root, args.root / "build" / "digits", args.model_store or args.root / "model_store")
    return 0


def _stack(args: argparse.Namespace) -> Any:
    from hookwatch.devstack import Ports, Stack

    return Stack(
        root=args.root, run_dir=args.root / ".run", ports=Ports.from_env(), workers=args.workers
    )


def _run(args: argparse.Namespace) -> int:
    from hookwatch.traffic import LiveView, TrafficLoop

    stack = _stack(args)
    if stack.recorded_pids():
        print(
            "a stack is already recorded in .run/pids.json; run `make stop` first", file=sys.stderr
        )
        return 1
    stopping = threading.Event()

    def on_signal(*_: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print(
            "starting TorchServe (2 workers), the hookwatch exporter and Prometheus ...", flush=True
        )
        stack.start_torchserve()
        stack.start_exporter()
        stack.start_prometheus()
        p = stack.ports
        print(
            f"\n  inference   http://127.0.0.1:{p.inference}/predictions/digits\n"
            f"  management  http://127.0.0.1:{p.management}/models/digits\n"
            f"  TorchServe metrics  http://127.0.0.1:{p.metrics}/metrics\n"
            f"  hookwatch exporter  http://127.0.0.1:{p.exporter}/metrics\n"
            f"  Prometheus  http://127.0.0.1:{p.prometheus}/graph\n",
            flush=True,
        )
        traffic = TrafficLoop(stack, rate_per_s=args.rate)
        traffic.start()
        view = LiveView(stack)
        deadline = time.monotonic() + args.seconds if args.seconds > 0 else None
        print(
            "sending held-out digits; live values from Prometheus every 5 s "
            "(Ctrl-C or `make stop` ends it)\n",
            flush=True,
        )
        while not stopping.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            stopping.wait(5.0)
            print(view.render(traffic), flush=True)
            if not stack.recorded_pids():
                break  # `make stop` from another shell
        traffic.stop()
    finally:
        killed = stack.stop()
        print(
            "stopped TorchServe, exporter and Prometheus"
            + (f" (needed SIGKILL: {', '.join(killed)})" if killed else ""),
            flush=True,
        )
    return 0


def _stop(args: argparse.Namespace) -> int:
    stack = _stack(args)
    names = list(stack.recorded_pids())
    if not names:
        print("nothing recorded in .run/pids.json; nothing to stop")
        return 0
    killed = stack.stop()
    print(f"stopped {', '.join(names)}" + (f" (SIGKILL: {', '.join(killed)})" if killed else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hookwatch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    exporter = sub.add_parser("exporter", help="serve merged multiprocess metrics over HTTP")
    exporter.add_argument(
        "--dir",
        default=os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
        required="PROMETHEUS_MULTIPROC_DIR" not in os.environ,
    )
    exporter.add_argument("--port", type=int, default=9101)
    exporter.add_argument("--addr", default="127.0.0.1")
    exporter.add_argument(
        "--no-reap",
        action="store_true",
        help="keep live-gauge files of dead pids (exporter in another pid namespace)",
    )
    exporter.set_defaults(func=_exporter)

    for name, func, text in (
        ("build-demo", _build_demo, "train the demo CNN and archive it into model_store/"),
        ("run", _run, "start the native stack, send traffic, print live metrics"),
        ("stop", _stop, "stop the native stack recorded in .run/pids.json"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--root", type=Path, default=Path.cwd(), help=REPO_ROOT_HINT)
        cmd.set_defaults(func=func)
        if name == "build-demo":
            cmd.add_argument("--model-store", type=Path, default=None)
        if name in ("run", "stop"):
            cmd.add_argument("--workers", type=int, default=2)
        if name == "run":
            cmd.add_argument("--rate", type=float, default=20.0, help="requests per second")
            cmd.add_argument(
                "--seconds",
                type=float,
                default=float(os.environ.get("RUN_SECONDS", "0")),
                help="stop after this long (0: until Ctrl-C)",
            )
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
