"""``hookwatch`` command line: the exporter, profiles, the demo, the native stack and the bench.

Imports only the standard library at the top: ``hookwatch exporter`` runs on the core install,
and each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hookwatch._errors import ConfigError, HookwatchError

if TYPE_CHECKING:
    from hookwatch._catalogue import FleetBins

REPO_ROOT_HINT = (
    "the folder whose model_store/ and .run/ are meant (default: the current directory)"
)

#: What ``hookwatch --help`` says first (the module's docstring is for its readers).
DESCRIPTION = """\
Watch what a TorchServe model computes: forward hooks sample the activations of the layers
you choose, Prometheus gets their statistics and drift tests against reference data, and
Grafana or `hookwatch report` shows them."""
EPILOG = """\
your own model, in order:
  hookwatch layers model.py:build --input-shape 3,224,224    what can be watched
  hookwatch init model.py:build --input-shape 3,224,224      a starting model-config.yaml
  hookwatch archive model.py:build --name mymodel --config model-config.yaml \\
      --reference reference.npy --out model_store            model, config, reference: one .mar
  hookwatch serve model_store/mymodel.mar                    serve it and watch, until Ctrl-C
  hookwatch report                                           what happened, as one HTML page
the demo: `hookwatch build-demo`, then `hookwatch run` (or `make run` in the repository)

`hookwatch COMMAND --help` shows a command's options and an example."""

#: Commands in the order a user meets them: their own model from layers to serving, what to
#: read, stopping, measuring, deploying; then the exporter, the profile tool and the demo.
WORKFLOW = (
    "layers",
    "init",
    "archive",
    "serve",
    "units",
    "report",
    "stop",
    "bench",
    "export-monitoring",
    "export-kubernetes",
    "exporter",
    "profile",
    "build-demo",
    "run",
)

#: One example per command, shown under its --help (tests/unit/test_cli_errors.py parses each).
EXAMPLES = {
    "layers": "hookwatch layers model.py:build --input-shape 3,224,224 --depth 2",
    "init": "hookwatch init model.py:build --input-shape 3,224,224 --out model-config.yaml",
    "archive": "hookwatch archive model.py:build --weights weights.pt --name mymodel "
    "--config model-config.yaml --reference reference.npy --out model_store",
    "serve": "hookwatch serve model_store/mymodel.mar --seconds 600",
    "units": "hookwatch units --prometheus http://127.0.0.1:9090 --range 1h",
    "report": "hookwatch report --minutes 30 --out build/report",
    "stop": "hookwatch stop",
    "bench": "hookwatch bench model_store/mymodel.mar --rounds 6 --out bench.md",
    "export-monitoring": "hookwatch export-monitoring monitoring --exporter-target "
    "10.0.0.5:9101 --torchserve-target 10.0.0.5:8082",
    "export-kubernetes": "hookwatch export-kubernetes deploy --mar model_store/mymodel.mar "
    "--image registry.example.com/mymodel:1",
    "exporter": "hookwatch exporter --dir /var/run/hookwatch/metrics --port 9101",
    "profile": "hookwatch profile --mar model_store/digits.mar --data reference.npy "
    "--out drift-profile.npz",
    "build-demo": "hookwatch build-demo",
    "run": "hookwatch run --seconds 120 --drift-after 40",
}

#: argparse's own messages, in hookwatch's form: "expected X, got Y".
_ARGPARSE_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), form)
    for pattern, form in (
        (r"the following arguments are required: COMMAND", "expected a command, got none"),
        (r"the following arguments are required: (?P<names>.+)", "expected {names}, got none"),
        (
            r"argument (?P<opt>\S+): invalid int value: (?P<got>.+)",
            "{opt}: expected an integer, got {got}",
        ),
        (
            r"argument (?P<opt>\S+): invalid float value: (?P<got>.+)",
            "{opt}: expected a number, got {got}",
        ),
        (
            r"argument COMMAND: invalid choice: (?P<got>.+?) \(choose from (?P<choices>.+)\)",
            "expected a command, one of {choices}, got {got}",
        ),
        (
            r"argument (?P<opt>\S+): invalid choice: (?P<got>.+?) \(choose from (?P<choices>.+)\)",
            "{opt}: expected one of {choices}, got {got}",
        ),
        (r"argument (?P<opt>\S+): expected one argument", "{opt}: expected a value, got none"),
        (
            r"argument (?P<opt>\S+): not allowed with argument (?P<other>\S+)",
            "expected {opt} or {other}, got both",
        ),
        (r"one of the arguments (?P<names>.+) is required", "expected one of {names}, got none"),
        (r"unrecognized arguments: (?P<got>.+)", "expected known options, got {got}"),
        (r"argument (?P<opt>\S+): (?P<rest>.+)", "{opt}: {rest}"),
    )
)


def _argparse_message(message: str) -> str:
    for pattern, form in _ARGPARSE_MESSAGES:
        match = pattern.fullmatch(message)
        if match:
            found = match.groupdict()
            if "choices" in found:  # 'a', 'b' (Python 3.11) or a, b (3.12 and later)
                found["choices"] = found["choices"].replace("'", "")
            if "names" in found and " " in found["names"] and "," not in found["names"]:
                found["names"] = " or ".join(found["names"].split())
            return form.format(**found)
    return message


class _Parser(argparse.ArgumentParser):
    """argparse with hookwatch's errors: one line, "expected X, got Y", where to look next,
    exit status 2 (no usage block: ``--help`` has it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2, f"{self.prog}: error: {_argparse_message(message)} (see `{self.prog} --help`)\n"
        )


def _number(
    kind: str, cast: Callable[[str], Any], low: float, low_ok: bool
) -> Callable[[str], Any]:
    """An argparse type: ``cast`` of the text, at least (or above) ``low``."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or value != value or value < low or (value == low and not low_ok):
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}")
        return value

    parse.__name__ = kind
    return parse


_positive_int = _number("a positive integer", int, 1, True)
_count = _number("an integer of 0 or more", int, 0, True)
_positive_number = _number("a number above 0", float, 0, False)
_seconds = _number("seconds, 0 or more", float, 0, True)


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text!r}")
    return int(text)


def _file(what: str, next_step: str) -> Callable[[str], Path]:
    """An argparse type: the path of an existing file (``what`` it should hold)."""

    def parse(text: str) -> Path:
        path = Path(text)
        if not path.is_file():
            found = "a directory" if path.is_dir() else "no such file"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}, {found}: {next_step}")
        return path

    parse.__name__ = what
    return parse


#: The dry run's "dtype" for a model of several tensors (``input.arguments``).
ARGUMENTS_INPUT = "arguments"
_MODEL_CONFIG = _file("a model-config.yaml", "`hookwatch init` writes one")
_INPUTS = _file(
    "held-out inputs (.npy, .npz, .pt or .jsonl)",
    "numpy.save writes an array, or write request bodies one a line",
)


def _inputs_or_images(text: str) -> Path:
    """An argparse type: held-out inputs, or a directory of image files (an image input)."""
    path = Path(text)
    if path.is_dir():
        return path
    if not path.exists():
        raise argparse.ArgumentTypeError(
            f"expected held-out inputs (.npy, .npz, .pt or .jsonl, or a directory of images for "
            f"input.encoding: image), got {text}, no such file: numpy.save writes an array, or "
            "write request bodies one a line"
        )
    return _INPUTS(text)


_inputs_or_images.__name__ = "held-out inputs"
_LABELS = _file(
    "the reference's class labels (.npy or .pt)",
    "numpy.save writes one integer label per reference sample",
)


def _input_dtype(text: str) -> str:
    """An argparse type: a dtype a request can be converted to, as the config checks it (a
    dry run on another would write a config that `hookwatch archive` refuses)."""
    from hookwatch._config import INPUT_DTYPES

    if text not in INPUT_DTYPES:
        raise argparse.ArgumentTypeError(f"expected one of {list(INPUT_DTYPES)}, got {text!r}")
    return text


#: What ``serve --traffic`` takes.
_TRAFFIC_FORMS = (
    "none, CLEAN.jsonl, CLEAN.jsonl:SHIFTED.jsonl, fortunes, fortunes:CATEGORY or "
    "fortunes:CATEGORY:SHIFT"
)


def _traffic(text: str) -> str:
    files = text.split(":")
    if not (
        re.fullmatch(r"none|fortunes(:[\w-]+(:[\w-]+)?)?", text)
        or (len(files) <= 2 and all(f.endswith(".jsonl") and len(f) > 6 for f in files))
    ):
        raise argparse.ArgumentTypeError(f"expected {_TRAFFIC_FORMS}, got {text!r}")
    return text


def _duration(text: str) -> str:
    if not re.fullmatch(r"([0-9]+(ms|s|m|h|d|w|y))+", text):
        raise argparse.ArgumentTypeError(
            f"expected a PromQL duration such as 30m, 1h or 7d, got {text!r}"
        )
    return text


def _exporter(args: argparse.Namespace) -> int:
    from hookwatch import serve_metrics

    if not Path(args.dir).is_dir():
        raise ConfigError(
            f"--dir: expected the directory the workers write their metrics to "
            f"(PROMETHEUS_MULTIPROC_DIR), got {args.dir}, no such directory: create it, empty, "
            "before TorchServe starts"
        )

    server = serve_metrics(
        args.port,
        args.addr,
        multiprocess_dir=args.dir,
        reap_dead_pids=not args.no_reap,
        compact=not args.no_compact,
    )
    print(
        f"hookwatch exporter on http://{args.addr}:{args.port}/metrics reading {args.dir}",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.close()
    return 0


def _require_demo_data(command: str) -> None:
    """The demo's digits come from scikit-learn, an extra (`hookwatch[tools]`): a one-line
    error without it (a traceback before)."""
    import importlib.util

    if importlib.util.find_spec("sklearn") is None:
        raise ConfigError(
            f"{command}: expected scikit-learn (the demo's digits data), got none installed: "
            "pip install 'hookwatch[tools]'"
        )


def _build_demo(args: argparse.Namespace) -> int:
    _require_demo_data("build-demo")
    from hookwatch.tools.demo.build import build

    build(args.root, args.root / "build" / "digits", args.model_store or args.root / "model_store")
    return 0


def _stack(args: argparse.Namespace, **kwargs: Any) -> Any:
    from hookwatch.tools.devstack import Ports, Stack

    root = getattr(args, "root", None) or Path.cwd()
    return Stack(
        root=root,
        run_dir=args.run_dir or root / ".run",
        ports=Ports.from_env(),
        workers=args.workers,
        **kwargs,
    )


@contextlib.contextmanager
def _terminal_to_ourselves() -> Iterator[None]:
    """Take the terminal's Ctrl-C for this process alone while the block runs.

    Under ``make run`` this process shares its process group with make, and a terminal sends
    Ctrl-C to the whole foreground group: make would get it too and, whatever its child does,
    end itself by it (status 130). In a process group of its own made the terminal's
    foreground group (what a shell does for a job), Ctrl-C reaches this process only; it stops
    everything and exits 0, and make with it. The group is handed back at the end (and the
    shell takes the terminal back when make ends, however this process ends). Nothing
    changes without a terminal, or when this process leads its group already (a shell started
    it directly).
    """
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        fd = -1
    previous = _take_foreground(fd)
    try:
        yield
    finally:
        if previous is not None:
            ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            with contextlib.suppress(OSError):
                os.tcsetpgrp(fd, previous)
            signal.signal(signal.SIGTTOU, ttou)


def _final_report(stack: Any, out: Path, minutes: float, client: Any = None) -> Path | None:
    """Write the report while Prometheus still runs; a failure is one line, never the exit
    status of a clean stop (HOOKWATCH_DEBUG=1 adds the traceback). Returns its index.html."""
    from hookwatch.tools.dashboards import DASHBOARDS

    print(f"writing the report into {out}/ ...", flush=True)
    try:
        from hookwatch.tools.report.build import write_report
        from hookwatch.tools.report.prometheus import parse_duration

        # The run up to its stop, however short: one more scrape of every target first (a
        # run stopped seconds after it started may not have been scraped at all yet).
        try:
            stack.await_scrape(time.time(), 2 * parse_duration(stack.scrape_interval) + 5)
        except TimeoutError as late:
            print(f"{late}: the report ends at its last scrape", flush=True)
        written = write_report(
            f"http://127.0.0.1:{stack.ports.prometheus}",
            out,
            DASHBOARDS,
            model=stack.model_name,
            minutes=minutes,
            client=client,
        )
    except Exception as error:  # whatever went wrong, the stack still stops
        if os.environ.get("HOOKWATCH_DEBUG"):
            import traceback

            traceback.print_exc()
        first = (str(error).strip().splitlines() or [""])[0]
        # The errors hookwatch words for people say enough; anything else also needs its type.
        why = first if isinstance(error, USER_ERRORS) else f"{type(error).__name__}: {first}"
        print(f"report not written: {why}", flush=True)
        return None
    print(f"report: {written.index.resolve()} (open it in a browser)", flush=True)
    return written.index.resolve()


def _take_foreground(fd: int) -> int | None:
    """Move into a process group of our own, made the terminal's foreground group; returns
    the group to hand the terminal back to, or None where nothing was changed."""
    try:
        if (
            fd < 0
            or not os.isatty(fd)
            or os.getpgrp() == os.getpid()
            or os.tcgetpgrp(fd) != os.getpgrp()
        ):
            return None
    except OSError:
        return None
    previous = os.getpgrp()
    # A process outside the foreground group that sets the foreground group gets SIGTTOU.
    ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.setpgid(0, 0)
        try:
            os.tcsetpgrp(fd, os.getpgrp())
        except OSError:
            os.setpgid(0, previous)
            raise
    except OSError:
        return None
    finally:
        signal.signal(signal.SIGTTOU, ttou)
    return previous


def _on_stop_signals() -> threading.Event:
    """SIGINT (Ctrl-C) and SIGTERM set the returned event, and do nothing else: whatever runs
    (a spawn, a readiness wait, the stop itself) reaches a point where it looks at it."""
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    return stopping


def _run_stack_until_stopped(
    stack: Any,
    seconds: float,
    stopping: threading.Event,
    command: str,
    make_traffic: Any = None,
    report: Path | None = None,
) -> int:
    """Start ``stack``, print where everything is, show the live view every 5 s until
    Ctrl-C, SIGTERM, ``hookwatch stop`` or ``seconds``; write the report into ``report``
    (None: none) while Prometheus still runs, and stop everything it started.

    Stopped at any moment (starting, running, stopping) it exits 0 and prints one line.
    """
    from hookwatch.tools.devstack import AlreadyRunning

    stack.stop_requested = stopping
    try:
        with _terminal_to_ourselves(), stack.hold(command):
            return _start_stack_and_watch(stack, seconds, stopping, make_traffic, report)
    except AlreadyRunning as running:
        print(
            f"hookwatch {running.command} is already running in {stack.run_dir} (pid "
            f"{running.pid}): stop it with Ctrl-C there or `hookwatch stop --run-dir "
            f"{stack.run_dir}` (`make stop` in a checkout)",
            file=sys.stderr,
        )
        return 1


def _start_stack_and_watch(
    stack: Any,
    seconds: float,
    stopping: threading.Event,
    make_traffic: Any,
    report: Path | None,
) -> int:
    from hookwatch.tools.devstack import Stopped
    from hookwatch.tools.traffic import LiveView

    left = stack.clear_stale()
    if left:
        print(f"stopped what a run that is gone left running: {', '.join(left)}", flush=True)
    from hookwatch.tools.devstack import missing_parts

    cannot = missing_parts() + stack.ports.busy()
    if cannot:
        print("cannot start:\n  " + "\n  ".join(cannot), file=sys.stderr)
        return 1
    name = stack.model_name
    traffic = None
    began = time.monotonic()
    try:
        print(
            f"starting TorchServe ({stack.workers} workers) with {stack.models}, the hookwatch "
            "exporter and Prometheus ...",
            flush=True,
        )
        try:
            stack.start_torchserve()
            stack.start_exporter()
            stack.start_prometheus()
        except Stopped:
            return 0
        except (OSError, RuntimeError):
            if stopping.is_set():
                return 0  # a process we were waiting for was stopped with us
            raise
        p = stack.ports
        print(
            f"\n  inference   http://127.0.0.1:{p.inference}/predictions/{name}\n"
            f"  (KServe v2, Triton clients)  http://127.0.0.1:{p.inference}/v2/models/{name}/infer\n"
            f"  management  http://127.0.0.1:{p.management}/models/{name}\n"
            f"  TorchServe metrics  http://127.0.0.1:{p.metrics}/metrics\n"
            f"  hookwatch exporter  http://127.0.0.1:{p.exporter}/metrics\n"
            f"  Prometheus  http://127.0.0.1:{p.prometheus}/graph\n",
            flush=True,
        )
        view = LiveView(stack)
        if make_traffic is not None and not stopping.is_set():
            traffic = make_traffic(stack)
            traffic.start()
        deadline = time.monotonic() + seconds if seconds > 0 else None
        while not stopping.wait(5.0):
            if deadline is not None and time.monotonic() >= deadline:
                break
            try:
                table = view.render(traffic)
            except (OSError, RuntimeError) as error:
                table = f"(live view unavailable: {error})"
            if not stopping.is_set():  # stopped while rendering: the stop line comes alone
                print(table, flush=True)
        if traffic is not None:
            traffic.stop()
        written = None
        if report is not None and stack.recorded_pids():
            # The whole run, a minute of margin: the report starts at its first sample.
            facts = traffic.report_facts() if traffic is not None else None
            written = _final_report(stack, report, (time.monotonic() - began) / 60 + 1, facts)
        if stack.recorded_pids():
            try:
                print("\n" + view.summary(traffic, written), flush=True)
            except (OSError, RuntimeError) as error:
                print(f"(no run summary: {error})", flush=True)
    finally:
        killed = stack.stop()
        print(
            "stopped TorchServe, exporter and Prometheus"
            + (f" (needed SIGKILL: {', '.join(killed)})" if killed else ""),
            flush=True,
        )
    return 0


def _run(args: argparse.Namespace) -> int:
    _require_demo_data("run")
    root = getattr(args, "root", None) or Path.cwd()
    demo = root / "model_store" / "digits.mar"
    if not demo.is_file():
        # Else TorchServe exits ("exited with 1 before it was ready") and says why in its log.
        raise ConfigError(
            f"run: expected the demo's archive at {demo}, got no such file: build it with "
            "`hookwatch build-demo` first (in this folder)"
        )
    stopping = _on_stop_signals()
    from hookwatch.tools.traffic import TrafficLoop

    shift = (
        f", inverted digits after {args.drift_after:g} s (watch the drift rows)"
        if args.drift_after
        else ""
    )

    def traffic(stack: Any) -> Any:
        print(
            f"sending held-out digits{shift}; live values from Prometheus every 5 s "
            "(Ctrl-C or `hookwatch stop` ends it)\n",
            flush=True,
        )
        return TrafficLoop(stack, rate_per_s=args.rate, drift_after_s=args.drift_after)

    return _run_stack_until_stopped(
        _stack(args), args.seconds, stopping, "run", traffic, _report_dir(args)
    )


def _serve(args: argparse.Namespace) -> int:
    stopping = _on_stop_signals()
    from hookwatch.tools.mar import read_hookwatch_mar

    mar: Path = args.mar
    archive = read_hookwatch_mar(mar)
    name = archive.name
    files = None
    if args.traffic.endswith(".jsonl"):
        from hookwatch.tools.traffic import read_bodies

        # Read now: a missing or broken file fails here, before anything runs.
        files = [read_bodies(Path(part)) for part in args.traffic.split(":")]
    # Everything the stack needs is written into the run directory (the model store links
    # the archive there): serving needs no checkout and nothing of the current folder.
    stack = _stack(args, mar_files=[mar], models=mar.name, model_name=name)
    print(
        "serving; live values from Prometheus every 5 s (Ctrl-C, SIGTERM or `hookwatch stop` "
        "ends it)",
        flush=True,
    )
    if args.traffic == "none":
        return _run_stack_until_stopped(
            stack, args.seconds, stopping, "serve", report=_report_dir(args)
        )
    if files is not None:
        return _serve_files(args, stack, stopping, archive.config, files)
    from hookwatch.tools.text.fortunes import read_category
    from hookwatch.tools.traffic import TextTraffic

    kind, *parts = args.traffic.split(":")
    if kind != "fortunes" or len(parts) > 2:
        raise ConfigError(f"--traffic: expected {_TRAFFIC_FORMS}, got {args.traffic!r}")
    category = parts[0] if parts else "computers"
    shift = parts[1] if len(parts) > 1 else "literature"
    read_category(category)  # a missing category fails here, in one line
    if shift != "mix":
        read_category(shift)

    def traffic(stack: Any) -> Any:
        loop = TextTraffic(stack, category, shift, args.rate, args.drift_after)
        after = f", {loop.shifted_name} after {args.drift_after:g} s" if args.drift_after else ""
        print(f"sending {loop.clean_name} fortunes at {args.rate:g}/s{after}\n", flush=True)
        return loop

    return _run_stack_until_stopped(
        stack, args.seconds, stopping, "serve", traffic, _report_dir(args)
    )


def _serve_files(
    args: argparse.Namespace, stack: Any, stopping: threading.Event, config: Any, files: Any
) -> int:
    """``serve --traffic CLEAN.jsonl[:SHIFTED.jsonl]``: request bodies from the files (read
    already), the shifted ones after ``--drift-after`` seconds; labelled lines checked against
    the answers."""
    from hookwatch.tools.traffic import FileTraffic

    clean, *rest = files
    shifted = rest[0] if rest else None
    handler = (config or {}).get("handler") if isinstance(config, dict) else None
    names = handler.get("labels") if isinstance(handler, dict) else None
    labels = [str(n) for n in names] if isinstance(names, list) else None

    def traffic(stack: Any) -> Any:
        loop = FileTraffic(stack, clean, shifted, args.rate, args.drift_after, labels)
        after = (
            f", {shifted.name} after {args.drift_after:g} s"
            if shifted is not None and args.drift_after
            else ""
        )
        print(f"sending {clean.name} at {args.rate:g}/s{after}\n", flush=True)
        return loop

    return _run_stack_until_stopped(
        stack, args.seconds, stopping, "serve", traffic, _report_dir(args)
    )


def _drift_after(parser: argparse.ArgumentParser, shifted: str) -> None:
    parser.add_argument(
        "--drift-after",
        type=_seconds,
        default=os.environ.get("DRIFT_AFTER", "60"),
        help=f"seconds of clean traffic before {shifted} are sent (0: never; default "
        "$DRIFT_AFTER, else 60)",
    )


def _report_dir(args: argparse.Namespace) -> Path | None:
    if args.no_report:
        return None
    root = getattr(args, "root", None) or Path.cwd()
    return Path(args.report) if args.report is not None else Path(root) / "build" / "report"


def _report(args: argparse.Namespace) -> int:
    from hookwatch.tools.dashboards import DASHBOARDS
    from hookwatch.tools.report.build import write_report
    from hookwatch.tools.report.prometheus import PrometheusError

    try:
        written = write_report(
            args.prometheus,
            args.out,
            args.dashboards or DASHBOARDS,
            model=args.model,
            since=_moment("--since", args.since),
            until=_moment("--until", args.until),
            minutes=args.minutes,
        )
    except PrometheusError as error:
        if "got no answer" not in str(error):
            raise
        said = re.sub(r"\[Errno \d+\] ", "", str(error))
        raise ConfigError(
            f"{said}: is Prometheus running (`hookwatch serve` starts one)? else pass "
            "--prometheus URL"
        ) from None
    drift = (
        f"drift from {time.strftime('%H:%M:%S', time.localtime(written.onset.time))}, first "
        f"{', '.join(written.onset.detectors)}"
        if written.onset
        else "no drift alarm"
    )
    print(f"wrote {written.index} ({len(written.images)} plots) for {written.model}: {drift}")
    return 0


def _moment(option: str, text: str | None) -> float | None:
    """Unix seconds from ``text``: Unix seconds, or an ISO 8601 time (local without a zone)."""
    import datetime

    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ConfigError(
            f"{option}: expected Unix seconds or an ISO 8601 time (2024-05-01T12:00), got {text!r}"
        ) from None


def _model_args(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"--model-args: expected a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--model-args: expected a JSON object, got {text!r}")
    return value


def _dry_run_rows(args: argparse.Namespace) -> tuple[Any, tuple[int, ...], str, str | None]:
    """The model's layers from a dry run, and the input it was given."""
    rows, shape, dtype, argument, _ = _dry_run(args)
    return rows, shape, dtype, argument


def _dry_run(
    args: argparse.Namespace,
) -> tuple[Any, tuple[int, ...], str, str | None, list[str] | None]:
    """:func:`_dry_run_rows` and the class names the model carries (a HuggingFace model's
    ``config.id2label``), if any."""
    from hookwatch.tools.own_model import ModelRef, load_user_model

    model, _ = load_user_model(
        ModelRef.parse(args.model), _model_args(args.model_args), args.weights
    )
    return (*_model_dry_run(args, model), _class_names(model))


def _class_names(model: Any) -> list[str] | None:
    """The names a model's own config gives its classes (``config.id2label``, HuggingFace's),
    in class order; None where it gives none but the defaults (``LABEL_0``, ...)."""
    given = getattr(getattr(model, "config", None), "id2label", None)
    if not isinstance(given, dict) or not given:
        return None
    try:
        named = {int(k): str(v) for k, v in given.items()}
    except (TypeError, ValueError):
        return None
    names = [named.get(i) for i in range(len(named))]
    if None in names or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return None
    return [n for n in names if n is not None]


def _model_dry_run(
    args: argparse.Namespace, model: Any
) -> tuple[Any, tuple[int, ...], str, str | None]:
    """:func:`_dry_run_rows` of a model already built."""
    from hookwatch._config import read_model_config
    from hookwatch.tools.own_model import discover_layers, parameter_dtype, parse_shape

    model_args = _model_args(args.model_args)
    spec = read_model_config(args.config).handler.input if args.config else None
    if spec is not None and spec.text is not None:
        return _text_dry_run(model, spec, model_args)
    if spec is not None and spec.arguments:
        return _arguments_dry_run(model, spec)
    given = args.input_shape
    shape = parse_shape(given) if given is not None else spec.shape if spec else None
    # Unsaid, a half-precision or float64 model's own dtype: float32 would fail its first layer.
    dtype = args.input_dtype or (spec.dtype if spec else parameter_dtype(model) or "float32")
    argument = args.argument or (spec.argument if spec else None)
    tokenizer = _tokenizer_argument(model_args) if spec is None and shape is None else None
    if tokenizer is not None:
        # A directory with a tokenizer in it: a text model, tried on texts through it.
        from hookwatch._config import HandlerConfig

        argument = _dict_argument(model)
        raw: dict[str, Any] = {"text": {"tokenizer": tokenizer}}
        if argument is not None:
            raw["argument"] = argument
        text = HandlerConfig.from_mapping({"input": raw}).input
        print(
            f"input: texts, tokenised by the tokenizer in --model-args {tokenizer}"
            + (f", passed together as forward({argument})" if argument else ""),
            file=sys.stderr,
        )
        return _text_dry_run(model, text, model_args)
    if shape is None:
        return _guessed_dry_run(model, dtype, argument)
    x = _example_batch(shape, dtype, spec)
    return discover_layers(model, x, argument), shape, dtype, argument


def _guessed_dry_run(
    model: Any, dtype: str, argument: str | None
) -> tuple[Any, tuple[int, ...], str, str | None]:
    """A dry run without a given shape: where the model's first layer is a ``Linear`` (a
    tabular model, an MLP), one item of its ``in_features``, said on stderr; else the
    error says what the first layer takes."""
    from torch import nn

    from hookwatch.tools.own_model import discover_layers

    needed = "expected --input-shape (e.g. 3,224,224) or --config with input.shape, got neither"
    image = _config_image_shape(model)
    if image is not None:
        # A HuggingFace vision model says its input in its config.
        rows = discover_layers(model, _example_batch(image, dtype, None), argument)
        print(
            f"input shape [{', '.join(map(str, image))}]: the model's config (num_channels, "
            "image_size); --input-shape gives another",
            file=sys.stderr,
        )
        return rows, image, dtype, argument
    from hookwatch._hooks import hookable_root

    # Named as the layers are (a compiled model's under its original module's names).
    modules = hookable_root(model).named_modules() if isinstance(model, nn.Module) else ()
    first = next(
        (
            (name, module)
            for name, module in modules
            if next(module.parameters(recurse=False), None) is not None
        ),
        None,
    )
    if first is None:
        raise ConfigError(needed)
    name, module = first
    if isinstance(module, nn.Linear) and module.in_features > 0:
        shape = (int(module.in_features),)
        try:
            rows = discover_layers(model, _example_batch(shape, dtype, None), argument)
        except ConfigError as error:
            raise ConfigError(
                f"{needed} (tried [{shape[0]}], {name}'s in_features: {error})"
            ) from None
        print(
            f"input shape [{shape[0]}]: {name} (Linear) takes {shape[0]} features; "
            "--input-shape gives another",
            file=sys.stderr,
        )
        return rows, shape, dtype, argument
    hint = _shape_hint(module)
    if hint is None:
        raise ConfigError(needed)
    raise ConfigError(
        f"{needed} ({name}, {type(module).__name__}, comes first: --input-shape {hint})"
    )


def _dict_argument(model: Any) -> str | None:
    """The one parameter of a forward that takes the tokens as one dict (a
    sentence-transformers model's ``forward(input)``): a single required parameter not named
    as a tokenizer output; None otherwise."""
    import inspect

    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return None
    required = [
        p
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if len(required) == 1 and required[0].name not in ("input_ids", "inputs_embeds", "x"):
        return required[0].name
    return None


#: Files a saved tokenizer leaves in its directory (HuggingFace's ``save_pretrained``).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


def _tokenizer_argument(model_args: dict[str, Any]) -> str | None:
    """The model argument naming a directory that holds a saved tokenizer, if one does."""
    for key, value in model_args.items():
        if isinstance(value, str) and any((Path(value) / f).is_file() for f in TOKENIZER_FILES):
            return key
    return None


def _config_image_shape(model: Any) -> tuple[int, ...] | None:
    """``(channels, height, width)`` from a vision model's config (HuggingFace's
    ``num_channels`` and ``image_size``), None where it says neither."""
    config = getattr(model, "config", None)
    channels = getattr(config, "num_channels", None)
    size = getattr(config, "image_size", None)
    if isinstance(size, int):
        size = (size, size)
    if (
        type(channels) is int
        and channels > 0
        and isinstance(size, list | tuple)
        and len(size) == 2
        and all(type(d) is int and d > 0 for d in size)
    ):
        return (channels, *size)
    return None


def _shape_hint(module: Any) -> str | None:
    """The ``--input-shape`` a model whose first layer is ``module`` takes, its unknowns
    named; None where that layer says nothing of it."""
    from torch import nn

    if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
        spatial = {1: "<length>", 2: "<height>,<width>", 3: "<depth>,<height>,<width>"}
        return f"{module.in_channels},{spatial[len(module.kernel_size)]}"
    if isinstance(module, nn.Embedding | nn.EmbeddingBag):
        return "<tokens> --input-dtype int64"
    if isinstance(module, nn.RNNBase):
        return f"<steps>,{module.input_size}"
    return None


#: The longest input a dry run tries for a length each request chooses.
DRY_LENGTH = 256


def _example_items(shape: Sequence[int], dtype: str, spec: Any) -> Any:
    """Two random items of ``shape`` for a dry run, in ``spec``'s range (else [0, 1]), raw as
    requests send them: ``[2, *shape]``, or for a length each request chooses (``shape`` the
    config's own) two tensors, the longest and half of it. At most DRY_LENGTH: a max_length
    of 100,000 would make a dry run of attention need 40 GB."""
    from hookwatch.tools.own_model import example_input

    low = spec.min_value if spec and spec.min_value is not None else 0.0
    high = spec.max_value if spec and spec.max_value is not None else 1.0
    floating = dtype.startswith(("float", "bfloat"))
    x = example_input(shape, "float32" if floating else dtype, low, high)
    if spec is None or spec.length_dim is None or tuple(shape) != spec.shape:
        return x
    at = spec.length_dim
    longest = min(shape[at], DRY_LENGTH)
    return [x[0].narrow(at, 0, longest), x[1].narrow(at, 0, max(1, longest // 2))]


def _example_batch(shape: Sequence[int], dtype: str, spec: Any) -> Any:
    """:func:`_example_items` through ``spec``'s pipeline's batching (normalisation; two
    lengths padded as served), as ``dtype``."""
    import dataclasses

    import torch

    from hookwatch._service import InputPipeline, Padded

    items = _example_items(shape, dtype, spec)
    target = getattr(torch, dtype)
    if isinstance(items, list):
        padded = InputPipeline(spec).batch(items)
        assert isinstance(padded, Padded)
        return dataclasses.replace(padded, values=padded.values.to(target))
    x = InputPipeline(spec).stacked(items) if spec is not None else items
    # --input-dtype over the config's: the dtype the model is tried on is the one written.
    return x.to(target)


def _arguments_dry_run(model: Any, spec: Any) -> tuple[Any, tuple[int, ...], str, str | None]:
    """A several-tensor model's layers, on two random items of each ``input.arguments``
    entry (its declared shape, dtype and range) through the serving pipeline (one of a
    variable length padded as served, the others beside it)."""
    from hookwatch._service import ArgumentsPipeline
    from hookwatch.tools.own_model import discover_layers

    inputs = ArgumentsPipeline(spec).columns(
        {part.field: _example_items(part.shape or (), part.dtype, part) for part in spec.arguments}
    )
    return discover_layers(model, inputs, spec.argument), (), ARGUMENTS_INPUT, spec.argument


def _text_dry_run(
    model: Any, spec: Any, model_args: dict[str, Any]
) -> tuple[Any, tuple[int, ...], str, str | None]:
    """A text model's layers, on two example texts through its tokenizer (the directory its
    ``--model-args`` name for ``input.text.tokenizer``)."""
    import tempfile

    from hookwatch._service import batch_inputs, make_pipeline
    from hookwatch.tools.own_model import discover_layers

    directory = model_args.get(spec.text.tokenizer)
    if not (isinstance(directory, str) and Path(directory).is_dir()):
        raise ConfigError(
            f"input.text.tokenizer: expected --model-args to name a directory as "
            f"{spec.text.tokenizer!r}, got {directory!r}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / spec.text.tokenizer).symlink_to(Path(directory).resolve())
        pipeline = make_pipeline(spec, tmp)
        texts = ["A short text.", "A somewhat longer example text, tokenised as requests are."]
        inputs = batch_inputs(pipeline, [pipeline.decode(t) for t in texts])
    return discover_layers(model, inputs, spec.argument, tokens=True), (), "text", spec.argument


def _layers(args: argparse.Namespace) -> int:
    from hookwatch.tools.own_model import filter_layers, format_layers

    rows, _, _, _ = _dry_run_rows(args)
    rows = filter_layers(rows, args.depth, args.match, args.type)
    print(format_layers(rows, args.max_features))
    return 0


def _init(args: argparse.Namespace) -> int:
    from hookwatch.tools.own_model import NO_TENSOR_HINT, init_config

    out: Path = args.out
    if out.exists() and not args.force:
        raise ConfigError(f"expected a new file, got existing {out} (pass --force to replace it)")
    rows, shape, dtype, argument, names = _dry_run(args)
    from hookwatch._config import read_model_config

    config = read_model_config(args.config) if args.config else None
    spec = config.handler.input if config is not None else None
    arguments: tuple[Any, ...] = spec.arguments if spec is not None else ()
    # The config's own input of a variable length, when the shape is still its own.
    variable = spec if spec is not None and tuple(shape) == spec.shape else None
    answered = rows[-1]
    if answered.untensored:
        # No config can serve it as it is: said before a file is written that archive refuses.
        raise ConfigError(
            f"model output: expected a tensor, got {answered.untensored}: {NO_TENSOR_HINT}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    served = config.raw if config is not None else None
    normalisation = _preprocessor(_model_args(args.model_args)) if spec is None else None
    # A text model (--config with input.text): its text section as declared.
    text = served["handler"]["input"]["text"] if served is not None and dtype == "text" else None
    if dtype == "text" and text is None:
        text = {"tokenizer": _tokenizer_argument(_model_args(args.model_args))}
    out.write_text(
        init_config(
            rows,
            shape,
            dtype,
            argument,
            args.model,
            arguments,
            variable,
            served,
            text,
            names,
            normalisation,
        )
    )
    print(f"wrote {out}: review the layers, the input range and normalisation, and the head")
    return 0


def _preprocessor(model_args: dict[str, Any]) -> dict[str, Any] | None:
    """The image normalisation a HuggingFace model's directory (named in ``--model-args``)
    saves beside it (``preprocessor_config.json``: ``image_mean``, ``image_std``), with the
    file it came from; None where there is none."""
    import json

    for value in model_args.values():
        found = Path(value) / "preprocessor_config.json" if isinstance(value, str) else None
        if found is None or not found.is_file():
            continue
        try:
            saved = json.loads(found.read_text())
        except (OSError, ValueError):
            return None
        mean, std = saved.get("image_mean"), saved.get("image_std")
        numbers = (
            isinstance(mean, list)
            and isinstance(std, list)
            and len(mean) == len(std) > 0
            and all(isinstance(v, int | float) for v in (*mean, *std))
        )
        if numbers and saved.get("do_normalize", True):
            return {"mean": mean, "std": std, "from": str(found)}
    return None


def _archive(args: argparse.Namespace) -> int:
    import torch

    from hookwatch.tools.own_model import ModelRef, archive_model

    torch.set_num_threads(1)
    # The staging directory (a copy of the weights, the handler, the profile) is the
    # archiver's own: without --build it goes when the .mar is written, so an archive run
    # leaves nothing in the user's directory but NAME.mar.
    with contextlib.ExitStack() as stack:
        build = args.build or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="hookwatch-archive-"))
        )
        archive_model(
            ModelRef.parse(args.model),
            args.name,
            args.config,
            args.reference,
            args.out,
            build / args.name if args.build is None else build,
            args=_model_args(args.model_args),
            weights=args.weights,
            extra_files=[Path(f) for f in args.extra_files.split(",") if f]
            if args.extra_files
            else [],
            labels=args.reference_labels,
        )
    return 0


def _stop(args: argparse.Namespace) -> int:
    """Stop what runs in the run directory, in one line: the ``hookwatch run``/``serve`` that
    holds it (it stops its own stack and prints its own line), else what a run that is gone
    left running."""
    from hookwatch.tools.devstack import AlreadyRunning

    stack = _stack(args)
    holder = stack.stop_holder()
    if holder is not None:
        pid, command = holder
        print(f"stopped hookwatch {command} (pid {pid}) and everything it started")
        return 0
    try:
        with stack.hold("stop"):
            left = stack.clear_stale()
    except AlreadyRunning:
        print("a run started meanwhile; run `hookwatch stop` again to stop it", file=sys.stderr)
        return 1
    if left:
        print(f"stopped {', '.join(left)} (left running by a run that is gone)")
    else:
        print(f"nothing runs in {stack.run_dir}; nothing to stop")
    return 0


DEMO_MODEL_CONFIG = "models/digits/model-config.yaml"
#: Logits of the demo CNN (digits 0-9); tests/unit/test_catalogue.py checks it against the model.
DEMO_CLASSES = 10


def demo_watched_layers(model_config: Path) -> tuple[str, ...]:
    """Label values of ``layer`` that a model-config's ``handler.monitoring`` section yields."""
    from hookwatch._config import read_model_config

    return read_model_config(model_config).monitoring.watched


def demo_fleet_bins(model_config: Path) -> FleetBins:
    """What bounds the demo's per-bin drift series: its fleet detectors, bins and classes."""
    from hookwatch._catalogue import FleetBins
    from hookwatch._config import read_model_config

    config = read_model_config(model_config).monitoring
    return FleetBins(
        config.drift.fleet_detectors,
        DEMO_CLASSES,
        config.drift.bins,
        config.max_features,
        config.drift.fleet_features,
    )


def _stopped_bench(signum: int, frame: Any) -> None:
    # SIGTERM ends the bench as Ctrl-C does: unwinding, so the TorchServe it started is stopped.
    raise KeyboardInterrupt


def _bench(args: argparse.Namespace) -> int:
    from hookwatch.tools.bench import ab
    from hookwatch.tools.devstack import Ports

    settings = ab.Settings(
        seconds=args.seconds,
        rounds=args.rounds,
        clients=args.clients,
        workers=args.workers,
        starts=args.starts,
    )
    previous = signal.signal(signal.SIGTERM, _stopped_bench)
    try:
        result = ab.bench(args.mar, args.request, settings, args.out, args.work, Ports.free())
    except KeyboardInterrupt:
        # The bench's own cleanup (TorchServe, its workers) has run on the way out.
        print("hookwatch bench: stopped; nothing written", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print()
    sys.stdout.write(ab.render(result))
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


def _profile(args: argparse.Namespace) -> int:
    import tempfile
    import zipfile

    import numpy as np
    import torch

    from hookwatch import build_profile
    from hookwatch._service import InputPipeline, make_pipeline
    from hookwatch.tools.mar import load_mar_model
    from hookwatch.tools.own_model import forward_batches, load_reference

    torch.set_num_threads(1)
    model, model_config, name = load_mar_model(args.mar)
    config = model_config.monitoring
    spec = model_config.handler.input
    batches: list[Any]
    if spec.text is not None:
        if args.data is None:
            raise ConfigError("a text model: expected --data texts.jsonl (a JSON string a line)")
        # The tokenizer lives in the archive: read it where TorchServe would.
        with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(args.mar) as archive:
            archive.extractall(tmp)
            batches = list(load_reference(args.data, make_pipeline(spec, tmp), args.batch_size))
    elif args.data is None:
        from hookwatch.tools.demo.build import reference_split
        from hookwatch.tools.demo.data import load_split

        # The serving input pipeline: dtype and normalisation as requests get them.
        pipeline = InputPipeline(spec)
        _, data, _ = reference_split(load_split())
        print(f"no --data: using the demo's {len(data)} held-out reference images", flush=True)
        images = torch.from_numpy(np.asarray(data, dtype=np.float32))
        batches = [
            pipeline.batch(images[i : i + args.batch_size])
            for i in range(0, len(images), args.batch_size)
        ]
    else:
        batches = list(load_reference(args.data, make_pipeline(spec), args.batch_size))
    profile = build_profile(
        model,
        config,
        list(forward_batches(batches, spec.argument)),
        name,
        bins=args.bins or config.drift.bins,
        max_reference=args.max_reference,
        progress=True,
        total=len(batches),
    )
    out = args.out or Path(config.drift.profile)
    profile.save(out)
    print(
        f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): {len(profile.references)} "
        f"detectors over layers {', '.join(profile.layers)}, {profile.n_seen} reference samples"
    )
    for detector, reason in profile.left_out.items():
        print(f"  left out: detector {detector}: {reason} (it can never alarm)")
    for p in profile.projections.values():
        print(
            f"  {p.layer}: {p.input_width} features projected to {p.width} "
            f"({100 * p.explained:.1f} % of the reference variance in the components"
            f"{', plus the residual distance' if p.residual else ''})"
        )
    return 0


def _export_options(cmd: Any) -> None:
    """The options every export takes: where the alerts' runbook is, writing over files."""
    cmd.add_argument(
        "--runbook-base",
        default=None,
        metavar="URL",
        help="where each alert's runbook_url points, before #alert-name: your copy of the "
        "runbook (default: the runbook installed with hookwatch, a file:// URL)",
    )
    cmd.add_argument(
        "--force", action="store_true", help="write into a non-empty directory (replaces files)"
    )


def export_monitoring_parser(sub: Any) -> None:
    from hookwatch.tools.export import DEFAULT_EXPORTER_JOB, DEFAULT_TORCHSERVE_JOB

    cmd = sub.add_parser(
        "export-monitoring",
        help="write the alerting rules, a scrape config, dashboards and Grafana provisioning "
        "for your own Prometheus and Grafana (docs/deploy.md)",
    )
    cmd.add_argument("dir", type=Path, help="an empty or missing directory (--force: any)")
    cmd.add_argument(
        "--exporter-target",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="the hookwatch exporter (repeat for replicas; default 127.0.0.1:9101)",
    )
    cmd.add_argument(
        "--torchserve-target",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="TorchServe's metrics address (repeat for replicas; default 127.0.0.1:8082)",
    )
    cmd.add_argument(
        "--exporter-job",
        default=DEFAULT_EXPORTER_JOB,
        help="job name of the exporter's scrape job; the rules and dashboards follow it",
    )
    cmd.add_argument(
        "--torchserve-job",
        default=DEFAULT_TORCHSERVE_JOB,
        help="job name of TorchServe's scrape job; the rules and dashboards follow it",
    )
    cmd.add_argument(
        "--namespace",
        default=None,
        help="a `namespace` target label on both jobs, as kube-prometheus puts on its targets",
    )
    cmd.add_argument(
        "--datasource-url",
        default="http://127.0.0.1:9090",
        help="the Prometheus Grafana's datasource queries (default http://127.0.0.1:9090)",
    )
    cmd.add_argument(
        "--scrape-interval",
        default="15s",
        help="prometheus.yml's scrape and evaluation interval and Grafana's timeInterval",
    )
    _export_options(cmd)
    cmd.set_defaults(func=_export_monitoring)


def _export_monitoring(args: argparse.Namespace) -> int:
    from hookwatch.tools.export import ExportOptions, export

    options = ExportOptions(
        exporter_targets=tuple(args.exporter_target or ("127.0.0.1:9101",)),
        torchserve_targets=tuple(args.torchserve_target or ("127.0.0.1:8082",)),
        exporter_job=args.exporter_job,
        torchserve_job=args.torchserve_job,
        namespace=args.namespace,
        datasource_url=args.datasource_url,
        scrape_interval=args.scrape_interval,
        runbook_base=args.runbook_base,
    )
    written = export(args.dir, options, force=args.force)
    print(f"wrote {len(written)} files into {args.dir}/:")
    print(f"  {args.dir}/prometheus/scrape-configs.yml  paste under scrape_configs:")
    print(f"  {args.dir}/prometheus/rules/              load with rule_files:")
    print(f"  {args.dir}/prometheus/prometheus.yml      a complete config using both")
    print(f"  {args.dir}/grafana/dashboards/ and grafana/provisioning/  for Grafana")
    return 0


def export_kubernetes_parser(sub: Any) -> None:
    cmd = sub.add_parser(
        "export-kubernetes",
        help="write an image's Dockerfile and Kubernetes manifests (kustomize) serving your "
        ".mar with the exporter, alerting rules and dashboards (docs/kubernetes.md)",
    )
    cmd.add_argument("dir", type=Path, help="an empty or missing directory (--force: any)")
    cmd.add_argument(
        "--mar",
        type=_file("a .mar", "build one with `hookwatch archive`"),
        required=True,
        help="your model, built by `hookwatch archive` (copied into the image's model store)",
    )
    cmd.add_argument(
        "--image",
        default=None,
        metavar="NAME[:TAG]",
        help="the image the manifests run (default: the model's name, tag dev); build and "
        "push it from the Dockerfile written beside them",
    )
    cmd.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help="a hookwatch wheel for the image to install (default: hookwatch from the "
        "package index, this version)",
    )
    _export_options(cmd)
    cmd.set_defaults(func=_export_kubernetes)


def _export_kubernetes(args: argparse.Namespace) -> int:
    from hookwatch.tools.kubernetes import KubernetesExport, export_kubernetes

    options = KubernetesExport(args.mar, args.image, args.wheel, args.runbook_base)
    written = export_kubernetes(args.dir, options, force=args.force)
    out = args.dir
    print(f"wrote {len(written)} files into {out}/:")
    print(f"  {out}/Dockerfile                  the image: docker build -t IMAGE {out}")
    print(f"  {out}/model_store/, config.properties  your model, TorchServe's configuration")
    print(f"  {out}/kubernetes/base/            kubectl apply -k {out}/kubernetes/base")
    print(f"  {out}/kubernetes/overlays/        fleet (autoscaled 8 to 64), gpu")
    return 0


def _units(args: argparse.Namespace) -> int:
    from hookwatch.tools import units

    found = (
        units.from_exporter(args.exporter)
        if args.exporter
        else units.from_prometheus(args.prometheus, args.range, args.model)
    )
    print(units.table(found, args.model))
    return 0


def report_options(cmd: argparse.ArgumentParser) -> None:
    """Where `hookwatch run`/`serve` write their report when they stop."""
    cmd.add_argument(
        "--report",
        type=Path,
        default=None,
        help="directory of the report written on stop (default: build/report)",
    )
    cmd.add_argument("--no-report", action="store_true", help="write no report on stop")


def run_dir_option(cmd: argparse.ArgumentParser) -> None:
    env = os.environ.get("HOOKWATCH_RUN_DIR")
    cmd.add_argument(
        "--run-dir",
        type=Path,
        default=Path(env) if env else None,
        help="where the stack's config, pids, logs and data go (default: $HOOKWATCH_RUN_DIR, "
        "else .run in the current directory); one run at a time per directory",
    )


def build_parser() -> argparse.ArgumentParser:
    from hookwatch import __version__

    parser = _Parser(
        prog="hookwatch",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hookwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    exporter = sub.add_parser(
        "exporter", help="serve the workers' metrics to Prometheus, merged, over HTTP"
    )
    exporter.add_argument(
        "--dir",
        default=os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
        required="PROMETHEUS_MULTIPROC_DIR" not in os.environ,
        help="the workers' PROMETHEUS_MULTIPROC_DIR (default: $PROMETHEUS_MULTIPROC_DIR)",
    )
    exporter.add_argument(
        "--port", type=_port, default=9101, help="port of /metrics (default 9101)"
    )
    exporter.add_argument(
        "--addr", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    exporter.add_argument(
        "--no-reap",
        action="store_true",
        help="keep live-gauge files of dead pids (exporter in another pid namespace)",
    )
    exporter.add_argument(
        "--no-compact",
        action="store_true",
        help="leave dead workers' counter files as they are instead of folding them into one "
        "archive file (one exporter per directory may compact)",
    )
    exporter.set_defaults(func=_exporter)

    for name, func, text in (
        (
            "build-demo",
            _build_demo,
            "the demo: train a digits CNN and archive it into model_store/",
        ),
        ("run", _run, "the demo: serve it, send digits, then inverted ones, and watch it live"),
        ("stop", _stop, "stop what `hookwatch serve` or `run` started (as Ctrl-C there does)"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--root", type=Path, default=Path.cwd(), help=REPO_ROOT_HINT)
        cmd.set_defaults(func=func)
        if name in ("run", "stop"):
            run_dir_option(cmd)
        if name == "build-demo":
            cmd.add_argument(
                "--model-store",
                type=Path,
                default=None,
                help="where digits.mar goes (default: model_store under --root)",
            )
        if name in ("run", "stop"):
            # A stop signals the pids its run recorded, whatever their count: it takes
            # --workers only so that a run's command line can be reused for it.
            cmd.add_argument(
                "--workers",
                type=_positive_int,
                default=2,
                help="TorchServe workers (default 2)"
                if name == "run"
                else "ignored: a stop ends the processes its run recorded, however many",
            )
        if name == "run":
            cmd.add_argument(
                "--rate", type=_positive_number, default=20.0, help="requests per second"
            )
            _drift_after(cmd, "inverted digits")
            cmd.add_argument(
                "--seconds",
                type=_seconds,
                default=os.environ.get("RUN_SECONDS", "0"),
                help="stop after this long (0: until Ctrl-C; default $RUN_SECONDS, else 0)",
            )
            report_options(cmd)
    prof = sub.add_parser(
        "profile",
        help="write a drift profile file from a .mar's model and reference data (to rebuild "
        "a deployed reference, use `hookwatch archive`)",
    )
    prof.add_argument(
        "--mar",
        type=Path,
        default=Path("model_store/digits.mar"),
        help="an eager-mode .mar (default: the demo's, model_store/digits.mar)",
    )
    prof.add_argument(
        "--data",
        type=_inputs_or_images,
        default=None,
        help=".npy/.npz/.pt array of inputs [N, *shape], .jsonl request bodies or a directory of "
        "image files (input.encoding: image) (default: the demo's reference images)",
    )
    prof.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the profile file (default: monitoring.drift.profile's name); the .mar is not "
        "changed: `hookwatch archive` puts a profile into one",
    )
    prof.add_argument(
        "--bins", type=_count, default=0, help="bins per feature (0: monitoring.drift.bins)"
    )
    prof.add_argument(
        "--batch-size", type=_positive_int, default=256, help="inputs per forward pass"
    )
    prof.add_argument(
        "--max-reference",
        type=_positive_int,
        default=20_000,
        help="reservoir size: more reference data than this is sampled, keeping memory bounded",
    )
    prof.set_defaults(func=_profile)

    def model_options(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument(
            "model",
            help="path/file.py:Name (an nn.Module class or factory; Name may go through a "
            "class: Net.small), module.path:Name (an installed or local module's: "
            "transformers:AutoModel.from_pretrained), a TorchScript file or a torch.export "
            "program (.pt2)",
        )
        cmd.add_argument(
            "--model-args", default="{}", help="JSON object of constructor/factory arguments"
        )
        cmd.add_argument(
            "--weights",
            type=_file("a state_dict or checkpoint file", "check the path"),
            default=None,
            help="a state_dict or checkpoint (loaded to CPU)",
        )

    from hookwatch._config import INPUT_DTYPES

    def dry_run_options(cmd: argparse.ArgumentParser) -> None:
        model_options(cmd)
        cmd.add_argument(
            "--input-shape",
            default=None,
            help="one item's shape, e.g. 3,224,224 ('' for one number a sample: forward(x[batch]))",
        )
        cmd.add_argument(
            "--input-dtype",
            type=_input_dtype,
            default=None,  # not "": argparse would check a string default with the type
            help=f"one of {', '.join(INPUT_DTYPES)} (default: the config's, else float32)",
        )
        cmd.add_argument("--argument", default="", help="pass the input as this keyword")
        cmd.add_argument(
            "--config", type=_MODEL_CONFIG, default=None, help="take the input from a model-config"
        )

    layers = sub.add_parser(
        "layers", help="list a model's layers from a dry run: type, output shape, parameters"
    )
    dry_run_options(layers)
    layers.add_argument("--depth", type=_count, default=None, help="at most this many dots deep")
    layers.add_argument("--match", default=None, help="glob over the layer paths")
    layers.add_argument("--type", default=None, help="module class name, e.g. Conv2d")
    layers.add_argument(
        "--max-features",
        type=_positive_int,
        default=256,
        help="monitoring.max_features: wider layers are projected for drift",
    )
    layers.set_defaults(func=_layers)

    init = sub.add_parser("init", help="write a starting model-config.yaml from a dry run")
    dry_run_options(init)
    init.add_argument(
        "--out",
        type=Path,
        default=Path("model-config.yaml"),
        help="the file to write (default model-config.yaml)",
    )
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.set_defaults(func=_init)

    archive = sub.add_parser(
        "archive", help="build NAME.mar: model, handler, config and drift profile in one file"
    )
    model_options(archive)
    archive.add_argument("--name", required=True, help="the TorchServe model name")
    archive.add_argument("--config", type=_MODEL_CONFIG, required=True, help="model-config.yaml")
    archive.add_argument(
        "--reference",
        type=_inputs_or_images,
        required=True,
        help="held-out inputs: .npy/.npz/.pt array [N, *shape], .jsonl request bodies, or a "
        "directory of image files (input.encoding: image)",
    )
    archive.add_argument(
        "--reference-labels",
        type=_LABELS,
        default=None,
        metavar="FILE",
        help="the reference's true classes, one integer per sample (logits heads): the "
        "accuracy estimate without labels, and pages on harm instead of drift, are fitted on "
        "them. Also read from a 'y' array in a reference .npz (or key of a .pt dict), or a "
        "'label' field on every "
        "line of a reference .jsonl; without any, the model pages on drift",
    )
    archive.add_argument(
        "--out",
        type=Path,
        default=Path("model_store"),
        help="directory of NAME.mar (default model_store)",
    )
    archive.add_argument(
        "--build",
        type=Path,
        default=None,
        help="work directory, kept (default: a temporary one, removed after)",
    )
    archive.add_argument(
        "--extra-files",
        default="",
        help="comma-separated files and package directories the model file imports",
    )
    archive.set_defaults(func=_archive)

    serve = sub.add_parser(
        "serve",
        help="TorchServe (no token auth), exporter, Prometheus on loopback for a .mar; live view",
    )
    serve.add_argument("mar", type=Path, help="a .mar built by `hookwatch archive`")
    serve.add_argument(
        "--workers", type=_positive_int, default=1, help="TorchServe workers (default 1)"
    )
    run_dir_option(serve)
    serve.add_argument(
        "--seconds",
        type=_seconds,
        default=os.environ.get("RUN_SECONDS", "0"),
        help="stop after this long (0: until Ctrl-C; default $RUN_SECONDS, else 0)",
    )
    report_options(serve)
    serve.add_argument(
        "--traffic",
        type=_traffic,
        default="none",
        help="send traffic: 'CLEAN.jsonl' (request bodies, one a line, in turn; a line's "
        "'label', a class index, is checked against the answer) or 'CLEAN.jsonl:SHIFTED.jsonl' "
        "(SHIFTED's bodies after --drift-after); to a text model, 'fortunes' (held-out "
        "`computers` fortunes, then `literature`), 'fortunes:CATEGORY' or "
        "'fortunes:CATEGORY:SHIFT' (SHIFT a category or 'mix': half each; the reference must "
        "be the other half of CATEGORY, as models/minilm/make_data.py writes it)",
    )
    serve.add_argument(
        "--rate", type=_positive_number, default=10.0, help="requests per second of --traffic"
    )
    _drift_after(serve, "the shifted bodies or texts")
    serve.set_defaults(func=_serve)

    units = sub.add_parser(
        "units",
        help="list units that never fired or sat saturated, per layer (pruning candidates)",
    )
    source = units.add_mutually_exclusive_group(required=True)
    source.add_argument("--exporter", help="a hookwatch exporter's URL: counts since start")
    source.add_argument("--prometheus", help="Prometheus' URL: counts over --range, fleet-wide")
    units.add_argument(
        "--range", type=_duration, default="1h", help="PromQL duration (with --prometheus)"
    )
    units.add_argument("--model", default=None, help="one model only")
    units.set_defaults(func=_units)

    report = sub.add_parser(
        "report",
        help="what happened: one HTML page of the dashboards' panels and a summary, from "
        "Prometheus",
    )
    report.add_argument(
        "--prometheus",
        default=f"http://127.0.0.1:{os.environ.get('PROMETHEUS_PORT') or 9090}",
        help="Prometheus' URL (default: the native stack's, PROMETHEUS_PORT)",
    )
    report.add_argument("--out", type=Path, default=Path("build/report"), help="directory")
    report.add_argument("--model", default=None, help="TorchServe model name (default: the one)")
    report.add_argument("--since", default=None, help="start: ISO 8601 time or Unix seconds")
    report.add_argument("--until", default=None, help="end: ISO 8601 time or Unix seconds")
    report.add_argument(
        "--minutes",
        type=_positive_number,
        default=60.0,
        help="without --since: look this far back from the end, and start at the first sample",
    )
    report.add_argument("--root", type=Path, default=Path.cwd(), help=REPO_ROOT_HINT)
    report.add_argument(
        "--dashboards",
        type=Path,
        default=None,
        help="Grafana dashboards whose panels it draws (default: the package's)",
    )
    report.set_defaults(func=_report)

    export_monitoring_parser(sub)
    export_kubernetes_parser(sub)

    bench = sub.add_parser(
        "bench",
        help="your .mar served twice on one TorchServe, plain handler against hookwatch: "
        "interleaved rounds, the ratio table printed",
    )
    bench.add_argument("mar", type=Path, help="a .mar built by `hookwatch archive`")
    bench.add_argument(
        "--request",
        type=_file("request bodies (.json or .jsonl)", "write one JSON body, or one a line"),
        default=None,
        help="request bodies: one JSON body, .jsonl with one body a line, or an image file "
        "(input.encoding: image) (default: bodies synthesized from the archived handler.input: "
        "shape, dtype, min/max, image files of its size for an image input; text models need "
        "--request)",
    )
    bench.add_argument(
        "--seconds",
        type=_positive_number,
        default=10.0,
        help="measured seconds per variant per round",
    )
    bench.add_argument("--rounds", type=_positive_int, default=6, help="rounds, A B then B A, ...")
    bench.add_argument("--clients", type=_positive_int, default=4, help="closed-loop clients")
    bench.add_argument(
        "--workers", type=_positive_int, default=1, help="TorchServe workers per variant"
    )
    bench.add_argument(
        "--starts",
        type=_positive_int,
        default=3,
        help="times the workers are started afresh, the rounds split between them (default 3): "
        "a worker's speed follows where its process landed",
    )
    bench.add_argument(
        "--out", type=Path, default=None, help="also write the table (.md) or everything (.json)"
    )
    bench.add_argument(
        "--work",
        type=Path,
        default=None,
        help="TorchServe's run directory, kept (default: a temporary one, removed)",
    )
    bench.set_defaults(func=_bench)
    _in_workflow_order(sub)
    return parser


def _in_workflow_order(sub: Any) -> None:
    """List the commands in :data:`WORKFLOW`'s order, each ``--help`` with what the command
    does and an example."""
    import textwrap

    rank = {name: i for i, name in enumerate(WORKFLOW)}
    sub._choices_actions.sort(key=lambda action: rank.get(action.dest, len(rank)))
    parsers = sorted(sub.choices.items(), key=lambda item: rank.get(item[0], len(rank)))
    sub.choices.clear()
    sub.choices.update(parsers)
    helps = {action.dest: action.help for action in sub._choices_actions}
    for name, cmd in parsers:
        cmd.formatter_class = argparse.RawDescriptionHelpFormatter
        # Raw (the example keeps its lines), so the description is wrapped here.
        cmd.description = textwrap.fill(cmd.description or helps.get(name) or "", 88)
        if name in EXAMPLES:
            cmd.epilog = "example:\n  " + _wrapped(EXAMPLES[name])


def _wrapped(command: str, width: int = 88) -> str:
    """A command line broken before options to fit ``width``, continued with backslashes."""
    lines = [""]
    for word in re.split(r" (?=--)", command):
        if lines[-1] and len(lines[-1]) + len(word) + 1 > width:
            lines[-1] += " \\"
            lines.append("    " + word)
        else:
            lines[-1] = f"{lines[-1]} {word}" if lines[-1] else word
    return "\n  ".join(lines)


#: Errors a user's input causes: reported in one line, no traceback (HOOKWATCH_DEBUG=1 shows it).
USER_ERRORS = (HookwatchError, OSError, ValueError, RuntimeError)


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, "hookwatch")


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None, prog: str) -> int:
    """Parse ``argv`` and run its subcommand; a user's mistake is one line naming ``prog`` and
    the subcommand, exit status 2 (HOOKWATCH_DEBUG=1 raises instead)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            # As parse_args would, but from the command's parser: its name and its --help.
            commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            chosen = commands[0].choices.get(getattr(args, "command", "")) if commands else None
            (chosen or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exit_:  # --help, --version, or a mistake argparse found and said
        return exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 2
    try:
        result: int = args.func(args)
    except BrokenPipeError:
        # The reader went away (`hookwatch layers ... | head`): nothing to say, as a command
        # killed by SIGPIPE says nothing. Python's own flush of stdout at exit would raise
        # again: stdout goes to /dev/null first.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13  # SIGPIPE's status, as a shell reports it
    except USER_ERRORS as error:
        if os.environ.get("HOOKWATCH_DEBUG"):
            raise
        print(f"{prog} {args.command}: error: {_said(error)}", file=sys.stderr)
        return 2
    return result


def _said(error: BaseException) -> str:
    """An error's first line; Python's own errors of files and connections in hookwatch's
    form ("expected X, got Y" and what to check)."""
    import urllib.error

    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        reason = getattr(error.reason, "strerror", None) or error.reason
        return (
            f"expected an answer from the server, got {reason} (is it running, and is its URL "
            "right?)"
        )
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return (
            f"expected a usable {error.filename}, got {error.strerror.lower()} (check the path "
            "and its permissions)"
        )
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
