"""``python -m dev``: the repository's harnesses, run from its root by the ``make`` targets.

``bench`` (``make bench``, ``make bench-quick``) measures the handler variants and rewrites
docs/bench/ (its README's bench blocks) and README.md's overhead verdict; ``soak``
(``make soak``) writes docs/soak/;
``bench-request`` (``make bench-request``) and ``bench-instructions`` (``make
bench-instructions``, under valgrind) rewrite their blocks of docs/bench/request.md; ``bench-gpu``
prepares, runs on a GPU machine and adds the runs of docs/bench/gpu.md;
``catalogue`` (``make docs``) prints docs/metrics.md; ``config-docs`` (``make docs``) rewrites
docs/configuration.md's option tables. None of them is installed with hookwatch:
a user measures their own model with ``hookwatch bench MAR``, which prints and writes nothing
into the repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from hookwatch.tools.cli import (
    DEMO_MODEL_CONFIG,
    REPO_ROOT_HINT,
    demo_fleet_bins,
    demo_watched_layers,
    run_command,
)


def _catalogue(args: argparse.Namespace) -> int:
    from dev.catalogue_docs import markdown

    config = args.root / DEMO_MODEL_CONFIG
    sys.stdout.write(
        markdown(demo_watched_layers(config), DEMO_MODEL_CONFIG, demo_fleet_bins(config))
    )
    return 0


def _config_docs(args: argparse.Namespace) -> int:
    from dev.config_docs import render

    path = args.root / "docs" / "configuration.md"
    text = path.read_text()
    current = render(text)
    if args.check:
        if current != text:
            print(f"{path} is stale: run `make docs`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        path.write_text(current)
        print(f"rewrote the option tables of {path}")
    return 0


def _stopped_bench(signum: int, frame: Any) -> None:
    # SIGTERM ends the bench as Ctrl-C does: unwinding, so the TorchServe it started is stopped.
    raise KeyboardInterrupt


def _bench(args: argparse.Namespace) -> int:
    from dev.bench import report, runner
    from hookwatch.tools.devstack import Ports

    readme = args.root / "README.md"
    blocks = args.root / report.BLOCKS_FILE

    def committed_verdicts() -> None:
        # README.md's one line per model, from every committed result as it now stands.
        results = [runner.read_result(args.root / source) for source in report.README_RESULTS]
        report.rewrite_verdicts(readme, results)

    if args.render:
        for source in report.README_RESULTS:
            result = runner.read_result(args.root / source)
            (args.root / source).with_suffix(".md").write_text(report.render(result))
            report.rewrite_readme(blocks, result, source)
        committed_verdicts()
        print(
            f"rendered {', '.join(report.README_RESULTS)} into their tables, {blocks}'s "
            f"bench blocks and {readme}'s overhead verdict"
        )
        return 0
    settings = runner.Settings.quick() if args.quick else runner.Settings.full()
    if args.models:
        settings = dataclasses.replace(settings, models=tuple(args.models.split(",")))
    work = args.work or args.root / "build" / ("bench-quick" if args.quick else "bench")
    out = args.out or (
        work / "results-quick.md" if args.quick else args.root / report.README_RESULTS[0]
    ).with_suffix(".md")
    previous = signal.signal(signal.SIGTERM, _stopped_bench)
    try:
        result = runner.run(args.root.resolve(), settings, work.resolve(), Ports.free())
    except KeyboardInterrupt:
        # The runner's own cleanup (TorchServe, its workers) has run on the way out.
        print("python -m dev bench: stopped; nothing written", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    report.write(result, out)
    print(f"wrote {out} and {out.with_suffix('.json')} in {result.duration_s / 60:.1f} min")
    for source in report.README_RESULTS:
        if out.with_suffix(".json").resolve() == (args.root / source).resolve():
            # The docs state the committed runs' verdicts: rendered from them, never by hand.
            report.rewrite_readme(blocks, result, source)
            committed_verdicts()
            print(f"rewrote the bench block of {blocks} for {source} and {readme}'s verdict")
    return 0


def _soak(args: argparse.Namespace) -> int:
    from dev.soak import report, runner
    from hookwatch.tools.devstack import Ports

    settings = (
        runner.Settings.quick(args.seconds or 60.0)
        if args.quick
        else runner.Settings.full(args.seconds or 600.0)
    )
    work = (args.work or args.root / "build" / "soak").resolve()
    out = args.out or (work / "report" if args.quick else args.root / "docs" / "soak")
    if args.render:
        problems = report.rewrite(out)
    else:
        result = runner.run(args.root.resolve(), settings, work, Ports.free())
        problems = report.write(result, out)
    print(
        f"wrote {out}/README.md, soak.json and plots: " + ("passed" if not problems else "failed")
    )
    for problem in problems:
        print(f"  {problem}")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dev", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    catalogue = sub.add_parser(
        "catalogue", help="print docs/metrics.md (every metric, its labels and series count)"
    )
    catalogue.add_argument("--root", type=Path, default=Path.cwd(), help=REPO_ROOT_HINT)
    catalogue.set_defaults(func=_catalogue)

    config_docs = sub.add_parser(
        "config-docs",
        help="rewrite docs/configuration.md's option tables from the config fields' defaults, "
        "bounds and meanings (src/hookwatch/_config.py)",
    )
    config_docs.add_argument("--root", type=Path, default=Path.cwd(), help=REPO_ROOT_HINT)
    config_docs.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a table is stale"
    )
    config_docs.set_defaults(func=_config_docs)

    soak = sub.add_parser(
        "soak",
        help="the stack at 70 %% of its capacity with bad requests and a worker killed: "
        "memory, descriptors, files, series and counts over time",
    )
    soak.add_argument("--root", type=Path, default=Path.cwd(), help=REPO_ROOT_HINT)
    soak.add_argument(
        "--seconds",
        type=float,
        default=float(os.environ.get("SOAK_SECONDS", "0")),
        help="soak length (default 600, --quick 60; $SOAK_SECONDS)",
    )
    soak.add_argument(
        "--quick", action="store_true", help="the 1-minute form: shorter samples and windows"
    )
    soak.add_argument("--out", type=Path, default=None, help="report directory (default docs/soak)")
    soak.add_argument("--work", type=Path, default=None, help="run directory (build/soak)")
    soak.add_argument(
        "--render",
        action="store_true",
        help="run nothing: redraw README.md and the plots from the report directory's soak.json",
    )
    soak.set_defaults(func=_soak)

    bench = sub.add_parser(
        "bench", help="the overhead bench: four handler variants of the repository's models"
    )
    bench.add_argument("--root", type=Path, default=Path.cwd(), help=REPO_ROOT_HINT)
    bench.add_argument("--quick", action="store_true", help="short CI run (demo model only)")
    bench.add_argument("--models", default="", help="comma-separated subset: digits,resnet18")
    bench.add_argument("--out", type=Path, default=None, help="markdown table to write")
    bench.add_argument("--work", type=Path, default=None, help="build and run directory")
    bench.add_argument(
        "--render",
        action="store_true",
        help="no run: re-render docs/bench/results*.md, docs/bench/README.md's bench blocks and "
        "README.md's overhead verdict from the committed results*.json",
    )
    bench.set_defaults(func=_bench)

    # The in-process harnesses: each module has its own options and its own run().
    for name, module, summary in (
        (
            "bench-request",
            "request",
            "per-request cost in process: the plain and the monitored handler's handle() "
            "interleaved, split by phase; rewrites docs/bench/request.md and request.json",
        ),
        (
            "bench-instructions",
            "instructions",
            "per-request instructions, mispredictions and cache misses under valgrind's "
            "cachegrind, plain vs monitored; rewrites its block of docs/bench/request.md",
        ),
        (
            "bench-gpu",
            "gpu",
            "the bench's GPU rows: --prepare a folder for a GPU machine, run there, --add the "
            "run here to rewrite docs/bench/gpu.md and gpu.json",
        ),
    ):
        harness = importlib.import_module(f"dev.bench.{module}")
        command = sub.add_parser(name, help=summary)
        harness.add_arguments(command)
        command.set_defaults(func=harness.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, "python -m dev")
