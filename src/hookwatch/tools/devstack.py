"""Start and stop the native stack (TorchServe, exporter, Prometheus) as processes we own.

Every process starts in a session of its own, its pid and start time are written to
``<run_dir>/pids.json``, and stopping signals exactly those process groups: nothing is found by
name, and a pid the system has since given to another process is never signalled.

The process that runs a stack (``hookwatch run`` or ``serve``) holds ``<run_dir>/run.lock``
(an flock the kernel releases however that process ends) and names itself in ``run.json``:
a second run in the same directory is refused, ``hookwatch stop`` asks the holder to stop, and
files left by a holder that is gone are cleaned up.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from hookwatch._body import body_limit
from hookwatch._config import InputSpec
from hookwatch.tools.assets import PROMETHEUS, PROMETHEUS_CONFIG, TORCHSERVE_CONFIG

MODEL_NAME = "digits"

#: Where ``Ports.free`` looks: above the registered services people run on a workstation,
#: below Linux's default ephemeral range (the upper bound follows the kernel's setting).
_FREE_PORT_RANGE = (20000, 32767)


#: Environment variable that overrides each port, by Ports field name.
PORT_ENV: Mapping[str, str] = {
    "inference": "TS_INFERENCE_PORT",
    "management": "TS_MANAGEMENT_PORT",
    "metrics": "TS_METRICS_PORT",
    "exporter": "HOOKWATCH_EXPORTER_PORT",
    "prometheus": "PROMETHEUS_PORT",
    "grpc_inference": "TS_GRPC_INFERENCE_PORT",
    "grpc_management": "TS_GRPC_MANAGEMENT_PORT",
}


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers bind (all set SO_REUSEADDR): a port whose last server has just
        # stopped, with connections still in TIME_WAIT, is free for the next one.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class Ports:
    inference: int = 8080
    management: int = 8081
    metrics: int = 8082
    exporter: int = 9101
    prometheus: int = 9090
    # TorchServe also serves gRPC; stacks side by side must not share these either.
    grpc_inference: int = 7070
    grpc_management: int = 7071

    def busy(self) -> list[str]:
        """One line per port something already listens on, naming the variable that moves it."""
        lines = []
        for f in fields(self):
            port = getattr(self, f.name)
            if not _bindable(port):
                lines.append(f"port {port} ({f.name}) is in use: set {PORT_ENV[f.name]}")
        return lines

    @classmethod
    def free(cls, rng: random.Random | None = None) -> Ports:
        """Distinct loopback ports that nothing listens on, chosen outside the ephemeral range.

        A port the kernel hands out for ``bind(0)`` comes from the range it also uses for the
        source port of every outgoing connection, so between choosing it and TorchServe binding
        it, any client socket (the load generator's, a test's) may take it. Ports below that
        range are never handed out implicitly.
        """
        rng = rng or random.Random()
        low, high = _FREE_PORT_RANGE[0], min(_FREE_PORT_RANGE[1], _ephemeral_low() - 1)
        if high - low < 1000:  # a kernel tuned to an unusual range: best effort, whole span
            high = _FREE_PORT_RANGE[1]
        chosen: list[int] = []
        for _ in range(200 * len(fields(cls))):
            port = rng.randint(low, high)
            if port not in chosen and _bindable(port):
                chosen.append(port)
                if len(chosen) == len(fields(cls)):
                    return cls(*chosen)
        raise RuntimeError(f"expected {len(fields(cls))} free ports in {low}-{high}, got {chosen}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Ports:
        def pick(key: str, default: int) -> int:
            raw = env.get(key, "")
            if not raw:
                return default
            if not raw.isdigit() or not 0 < int(raw) < 65536:
                raise ValueError(f"{key}: expected a TCP port, got {raw!r}")
            return int(raw)

        return cls(
            **{f.name: pick(PORT_ENV[f.name], f.default) for f in fields(cls)}  # type: ignore[arg-type]
        )


def http_get(
    url: str, timeout: float = 5.0, headers: Mapping[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


def http_post(
    url: str,
    body: bytes,
    content_type: str = "application/json",
    timeout: float = 30.0,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type, **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


class Stopped(Exception):
    """A stop was requested while the stack was starting (see :attr:`Stack.stop_requested`)."""


class AlreadyRunning(Exception):
    """Another process holds the run directory's lock."""

    def __init__(self, pid: int | None, command: str) -> None:
        super().__init__(f"hookwatch {command} is already running (pid {pid})")
        self.pid = pid
        self.command = command


def _wait(
    what: str,
    ready: Any,
    timeout: float,
    proc: subprocess.Popen[bytes] | None,
    log: Path | None,
    stop: threading.Event | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # A stop leaves the wait here, between two polls: never inside a spawn, so every
        # process started so far is recorded and stop() finds it.
        if stop is not None and stop.is_set():
            raise Stopped(what)
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready\n{tail}")
        try:
            if ready():
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.25)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise TimeoutError(f"{what} was not ready after {timeout:.0f} s\n{tail}")


#: The programs a stack runs that ``pip install 'hookwatch[torchserve]'`` does not bring, and
#: what to install for each (Debian and Ubuntu package names).
SYSTEM_PARTS: Mapping[str, str] = {
    "java": "a Java runtime for TorchServe's frontend (apt-get install openjdk-17-jre-headless)",
    "prometheus": "Prometheus (apt-get install prometheus, or its release binary on PATH)",
}


def require_binary(name: str, hint: str | None = None) -> str:
    """The path of program ``name``; a missing one raises, naming what to install."""
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(
            f"expected {name!r} on PATH, found none: {hint or f'install {SYSTEM_PARTS[name]}'}"
        )
    return path


#: TorchServe's own line when a model's worker died loading it (torchserve.out).
_LOAD_FAILED = re.compile(r"Load model failed: ([^,\s]+)")
#: The last line of a Python traceback: ``package.Name: message``, or the bare name.
_EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::.*)?")


def worker_reason(model_log: Path, model: str) -> str | None:
    """The reason a worker of ``model`` wrote to TorchServe's model log for failing: its last
    exception line, else its last ``hookwatch`` line; None when it wrote neither."""
    if not model_log.exists():
        return None
    # The frontend prefixes each line a worker writes with its thread: W-PORT-MODEL_VERSION-
    # stdout (or stderr), so one model's lines are told from those of the others.
    mine = re.compile(rf"W-\d+-{re.escape(model)}_[^_\s]*-std(?:out|err) MODEL_LOG - (.*)")
    said = [
        m.group(1).strip()
        for m in map(mine.search, model_log.read_text(errors="replace").splitlines())
        if m
    ]
    for wanted in (_EXCEPTION_LINE, re.compile(r"hookwatch\b.*")):
        found = [line for line in said if wanted.fullmatch(line)]
        if found:
            return found[-1]
    return None


def load_failure(logs: Path, model: str, settle_s: float = 1.0) -> str | None:
    """None while TorchServe has not said a model failed to load; else one line: the model,
    the reason its worker gave (see :func:`worker_reason`) and where the full log is."""
    out = logs / "torchserve.out"
    text = out.read_text(errors="replace") if out.exists() else ""
    if "Load model failed" not in text:
        return None
    named = _LOAD_FAILED.search(text)
    model = named.group(1) if named else model
    model_log = logs / "model_log.log"
    reason = worker_reason(model_log, model)
    if reason is None:
        # The frontend logs a worker's last lines on another thread than its "Load model
        # failed": they can land a moment later.
        time.sleep(settle_s)
        reason = worker_reason(model_log, model) or "its worker gave no reason"
    return f"TorchServe could not load the model {model}: {reason} (the full log: {model_log})"


def torchserve_binary() -> str | None:
    """TorchServe's launcher: the one beside this Python first (a venv need not be active)."""
    return shutil.which("torchserve", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchserve"
    )


def missing_parts() -> list[str]:
    """One line per program a stack needs and this machine lacks, naming what to install."""
    lines = []
    if torchserve_binary() is None:
        lines.append("expected 'torchserve', found none: pip install 'hookwatch[torchserve]'")
    for name, what in SYSTEM_PARTS.items():
        if shutil.which(name) is None:
            lines.append(f"expected {name!r} on PATH, found none: install {what}")
    return lines


#: The most ``hookwatch stop`` waits, after the run let go of its directory, for the run's
#: process to exit.
EXIT_SETTLE_S = 10.0


@dataclass
class Stack:
    """One native stack rooted at ``run_dir``; several can run side by side on other ports."""

    root: Path
    run_dir: Path
    ports: Ports = field(default_factory=Ports)
    workers: int = 2
    #: TorchServe's model store; None: ``root/model_store``, or the run directory's own store
    #: when ``mar_files`` is set.
    model_store: Path | None = None
    #: ``.mar`` files from anywhere, linked into ``run_dir/model-store`` at start: a run needs
    #: nothing of the folder it was started in.
    mar_files: Sequence[Path] = ()
    scrape_interval: str = "5s"
    #: None: the rule files the package's prometheus.yml names, resolved against its directory
    #: (hookwatch's alerting and recording rules). A sequence replaces them (empty: no rules).
    rule_files: Sequence[Path] | None = None
    models: str = "digits.mar"
    #: The model the readiness checks and ``infer`` address.
    model_name: str = MODEL_NAME
    #: More targets per scrape job (``torchserve``, ``hookwatch``): one Prometheus over several
    #: stacks, as over the replicas of a fleet.
    extra_scrape_targets: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: TorchServe's token authorisation: it writes key_file.json into the run dir at start,
    #: and every inference and management call carries the matching key.
    token_auth: bool = False
    #: Where the workers write their metric files, used as it is (a tmpfs, say): never
    #: emptied or removed, so it must be empty when TorchServe starts. None: a directory in
    #: ``run_dir`` emptied at every start.
    metrics_dir: Path | None = None
    #: Set it (a signal handler may) to make a start in progress raise :class:`Stopped`.
    stop_requested: threading.Event = field(default_factory=threading.Event)
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The config files written into the run directory name these paths, and TorchServe
        # and Prometheus run with the run directory as their working directory: a relative
        # one (``--run-dir .run-x``) named a config file inside itself that it never found.
        self.root, self.run_dir = self.root.absolute(), self.run_dir.absolute()
        if self.model_store is not None:
            self.model_store = self.model_store.absolute()
        if self.metrics_dir is not None:
            self.metrics_dir = self.metrics_dir.absolute()
        self.mar_files = [Path(mar).absolute() for mar in self.mar_files]

    def api_key(self, api: str) -> dict[str, str]:
        """The ``Authorization`` header for TorchServe's ``inference`` or ``management`` API
        (none without token authorisation)."""
        if not self.token_auth:
            return {}
        keys = json.loads((self.run_dir / "key_file.json").read_text())
        return {"Authorization": f"Bearer {keys[api]['key']}"}

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "pids.json"

    @property
    def lock_file(self) -> Path:
        return self.run_dir / "run.lock"

    @property
    def owner_file(self) -> Path:
        return self.run_dir / "run.json"

    @property
    def multiproc_dir(self) -> Path:
        return self.metrics_dir or self.run_dir / "prometheus-multiproc"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def store(self) -> Path:
        """TorchServe's model store for this stack."""
        if self.model_store is not None:
            return self.model_store
        return self.run_dir / "model-store" if self.mar_files else self.root / "model_store"

    def _link_mar_files(self) -> None:
        if not self.mar_files:
            return
        shutil.rmtree(self.store, ignore_errors=True)
        self.store.mkdir(parents=True)
        for mar in self.mar_files:
            (self.store / mar.name).symlink_to(mar.resolve())

    # -- processes ----------------------------------------------------------------------------

    def _spawn(self, name: str, cmd: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        if self.stop_requested.is_set():
            raise Stopped(name)
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.out", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=self.run_dir,
            start_new_session=True,
        )
        log.close()
        self._procs[name] = proc
        recorded = {k: {"pid": pid, "start": start} for k, (pid, start) in self.recorded().items()}
        recorded[name] = {"pid": proc.pid, "start": process_start(proc.pid)}
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(recorded, indent=2))
        tmp.replace(self.pid_file)  # whole or not at all, whenever a stop reads it

    def recorded(self) -> dict[str, tuple[int, int | None]]:
        """Recorded processes: name → (pid, start time in clock ticks after boot, or None
        for a file written before start times were recorded)."""
        try:
            data = json.loads(self.pid_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        out: dict[str, tuple[int, int | None]] = {}
        for name, entry in data.items():
            if isinstance(entry, dict):
                start = entry.get("start")
                out[str(name)] = (int(entry["pid"]), None if start is None else int(start))
            else:
                out[str(name)] = (int(entry), None)
        return out

    def recorded_pids(self) -> dict[str, int]:
        return {name: pid for name, (pid, _) in self.recorded().items()}

    def live_recorded(self) -> dict[str, int]:
        """The recorded process groups that still run and are still ours (see _ours)."""
        return {name: pid for name, (pid, start) in self.recorded().items() if _ours(pid, start)}

    def _render_ts_config(self) -> Path:
        lines = []
        overrides = {
            "inference_address": f"http://127.0.0.1:{self.ports.inference}",
            "management_address": f"http://127.0.0.1:{self.ports.management}",
            "metrics_address": f"http://127.0.0.1:{self.ports.metrics}",
            "grpc_inference_port": str(self.ports.grpc_inference),
            "grpc_management_port": str(self.ports.grpc_management),
            "model_store": str(self.store),
            "default_workers_per_model": str(self.workers),
            "load_models": self.models,
            # Model extraction and worker sockets follow java.io.tmpdir, not TMPDIR: keep them
            # inside the run dir so stacks side by side never share a socket path.
            "vmargs": f"-Djava.io.tmpdir={self.run_dir / 'tmp'} -XX:+UseSerialGC -Xmx512m",
            "disable_token_authorization": "false" if self.token_auth else "true",
        }
        largest = max(map(_body_limit, self.mar_files), default=0)
        if largest > TORCHSERVE_MAX_REQUEST_SIZE:
            # TorchServe refuses a body past its own limit before hookwatch sees it: a model
            # whose one input needs more (input.max_body_bytes) gets it raised to match.
            overrides["max_request_size"] = str(largest)
        for line in TORCHSERVE_CONFIG.read_text().splitlines():
            key = line.split("=", 1)[0].strip()
            if key in overrides and not line.lstrip().startswith("#"):
                line = f"{key}={overrides.pop(key)}"
            lines.append(line)
        lines += [f"{k}={v}" for k, v in overrides.items()]
        path = self.run_dir / "config.properties"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start_torchserve(self, timeout: float = 180.0) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # prometheus-client's multiprocess mode needs an empty directory at start.
        for stale in (self.logs,) if self.metrics_dir else (self.multiproc_dir, self.logs):
            shutil.rmtree(stale, ignore_errors=True)
        self.multiproc_dir.mkdir(parents=True, exist_ok=self.metrics_dir is not None)
        tmp = self.run_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        self._link_mar_files()
        bindir = Path(sys.executable).parent
        torchserve = torchserve_binary() or require_binary(
            "torchserve", "pip install 'hookwatch[torchserve]'"
        )
        require_binary("java")
        env = dict(os.environ)
        env.update(
            PROMETHEUS_MULTIPROC_DIR=str(self.multiproc_dir),
            TMPDIR=str(tmp),
            LOG_LOCATION=str(self.logs),
            METRICS_LOCATION=str(self.logs),
            PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
        )
        config = self._render_ts_config()
        self._spawn(
            "torchserve",
            [torchserve, "--start", "--foreground", "--ncs", "--ts-config", str(config)],
            env,
        )
        _wait(
            "TorchServe",
            self._torchserve_ready,
            timeout,
            self._procs["torchserve"],
            self.logs / "torchserve.out",
            self.stop_requested,
        )

    def _torchserve_ready(self) -> bool:
        failed = load_failure(self.logs, self.model_name)
        if failed is not None:
            raise RuntimeError(failed)
        return self.ready_workers() >= self.workers

    def _describe(self, model: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.ports.management}/models/{model}"
        try:
            headers = self.api_key("management")
        except (OSError, ValueError, KeyError):
            return 0, b""  # the key file is written at start: not ready yet
        return http_get(url, headers=headers)

    def ready_workers(self, model: str | None = None) -> int:
        model = model or self.model_name
        status, body = self._describe(model)
        if status != 200:
            return 0
        info = json.loads(body)
        workers = info[0].get("workers", []) if info else []
        return sum(1 for w in workers if w.get("status") == "READY")

    def worker_pids(self, model: str | None = None) -> list[int]:
        model = model or self.model_name
        status, body = self._describe(model)
        if status != 200:
            return []
        info = json.loads(body)
        return [int(w["pid"]) for w in info[0].get("workers", []) if w.get("pid")]

    def start_exporter(self, timeout: float = 30.0) -> None:
        self.multiproc_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "hookwatch.tools.cli",
            "exporter",
            "--dir",
            str(self.multiproc_dir),
            "--port",
            str(self.ports.exporter),
        ]
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        self._spawn("exporter", cmd, env)
        _wait(
            "exporter",
            lambda: http_get(f"http://127.0.0.1:{self.ports.exporter}/metrics")[0] == 200,
            timeout,
            self._procs["exporter"],
            self.logs / "exporter.out",
            self.stop_requested,
        )

    def render_prometheus_config(self) -> Path:
        source = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
        source["global"]["scrape_interval"] = self.scrape_interval
        source["global"]["evaluation_interval"] = self.scrape_interval
        rules = self.rule_files
        if rules is None:
            # The package's rules, copied beside the rendered file: the run directory holds
            # all Prometheus reads, and a package upgraded mid-run changes nothing of it.
            copied = self.run_dir / "rules"
            shutil.rmtree(copied, ignore_errors=True)
            copied.mkdir(parents=True)
            from hookwatch.tools.export import default_runbook_base, set_runbook_base

            for pattern in source.get("rule_files") or ():
                for rule_file in sorted(PROMETHEUS.glob(pattern)):
                    # runbook_url: the installed runbook (the package's is relative to it).
                    text = set_runbook_base(rule_file.read_text(), default_runbook_base())
                    (copied / rule_file.name).write_text(text)
            rules = [copied / "*.yml"]
        source["rule_files"] = [str(p) for p in rules]
        targets = {
            "torchserve": [f"127.0.0.1:{self.ports.metrics}"],
            "hookwatch": [f"127.0.0.1:{self.ports.exporter}"],
        }
        unknown = sorted(set(self.extra_scrape_targets) - set(targets))
        if unknown:
            raise ValueError(f"expected scrape jobs among {sorted(targets)}, got {unknown}")
        for job, extra in self.extra_scrape_targets.items():
            targets[job].extend(extra)
        for job in source["scrape_configs"]:
            if job["job_name"] in targets:
                job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        path = self.run_dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(source, sort_keys=False))
        return path

    def start_prometheus(self, timeout: float = 60.0) -> None:
        binary = require_binary("prometheus")
        config = self.render_prometheus_config()
        data = self.run_dir / "prometheus-data"
        # Every start is a new run. An earlier run's series would stay visible for Prometheus'
        # 5-minute lookback and pass for this run's: its alarms at the start of this report.
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        self._spawn(
            "prometheus",
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.ports.prometheus}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
        )
        _wait(
            "Prometheus",
            lambda: http_get(f"http://127.0.0.1:{self.ports.prometheus}/-/ready")[0] == 200,
            timeout,
            self._procs["prometheus"],
            self.logs / "prometheus.out",
            self.stop_requested,
        )

    def stop(self, timeout: float = 30.0) -> list[str]:
        """Stop every recorded process group that is still ours; returns the names that
        needed SIGKILL. Removes the pid file."""
        pids = self.live_recorded()
        for pid in pids.values():
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        killed: list[str] = []
        for name, pid in pids.items():
            while _group_alive(pid) and time.monotonic() < deadline:
                self._reap(name)
                time.sleep(0.1)
            if _group_alive(pid):
                _signal_group(pid, signal.SIGKILL)
                killed.append(name)
            self._reap(name, wait=True)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        self._procs.clear()
        return killed

    # -- who runs this directory ---------------------------------------------------------------

    @contextlib.contextmanager
    def hold(self, command: str) -> Iterator[None]:
        """Own the run directory while the block runs; :class:`AlreadyRunning` if another
        process does. The lock goes with this process, however it ends."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise OSError(
                f"expected a writable run directory (--run-dir or HOOKWATCH_RUN_DIR), got "
                f"{self.run_dir}: {error.strerror or error}"
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = self.owner() or {}
                raise AlreadyRunning(owner.get("pid"), str(owner.get("command", "run"))) from None
            self.owner_file.write_text(json.dumps({"pid": os.getpid(), "command": command}))
            try:
                yield
            finally:
                with contextlib.suppress(FileNotFoundError):
                    self.owner_file.unlink()
        finally:
            os.close(fd)  # releases the lock

    def owner(self) -> dict[str, Any] | None:
        """What run.json says about the process holding the directory (None: nothing)."""
        try:
            data: dict[str, Any] = json.loads(self.owner_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return data

    def held(self) -> bool:
        """Whether a live process holds the run directory."""
        if not self.lock_file.exists():
            return False
        fd = os.open(self.lock_file, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def clear_stale(self) -> list[str]:
        """With the directory held: stop what a run that is gone left running (its processes
        that are still ours) and remove its files. Returns the names it stopped."""
        left = sorted(self.live_recorded())
        self.stop()
        return left

    def stop_holder(self, timeout: float = 120.0) -> tuple[int | None, str] | None:
        """Ask the process holding the run directory to stop (SIGTERM) and wait until it has
        (it stops its stack itself). Returns its (pid, command), or None if nothing held it."""
        deadline = time.monotonic() + timeout
        owner = self.owner()
        while self.held() and owner is None and time.monotonic() < deadline:
            time.sleep(0.05)  # locked a moment ago, run.json about to be written
            owner = self.owner()
        if not self.held():
            return None
        pid = owner.get("pid") if owner else None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
        while self.held() and time.monotonic() < deadline:
            time.sleep(0.1)
        command = str((owner or {}).get("command", "run"))
        if self.held():
            raise TimeoutError(
                f"hookwatch {command} (pid {pid}) did not stop within {timeout:.0f} s"
            )
        # The lock goes a moment before the process does (its interpreter still shutting
        # down): "stopped" is said once it has exited, or after a few seconds at most.
        settle = min(deadline, time.monotonic() + EXIT_SETTLE_S)
        while pid is not None and not _exited(int(pid)) and time.monotonic() < settle:
            time.sleep(0.05)
        return pid, command

    def _reap(self, name: str, wait: bool = False) -> None:
        proc = self._procs.get(name)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5 if wait else 0)

    # -- Prometheus queries -------------------------------------------------------------------

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.ports.prometheus}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        status, body = http_get(url)
        payload = json.loads(body)
        if status != 200 or payload.get("status") != "success":
            raise RuntimeError(f"query {promql!r}: expected success, got {status} {body[:300]!r}")
        result: list[dict[str, Any]] = payload["data"]["result"]
        return result

    def await_scrape(self, after: float, timeout: float) -> None:
        """Wait until Prometheus has scraped every target at or after ``after`` (Unix
        seconds); TimeoutError if it had not within ``timeout`` seconds. Returns at once when
        Prometheus does not answer at all: there is nothing to wait for.

        Counted against the targets this stack configured: a target not scraped yet has no
        ``up`` series at all (Prometheus' first scrapes come up to two intervals after its
        start), so a minimum over the series there are would pass without it.
        """
        targets = 2 + sum(len(extra) for extra in self.extra_scrape_targets.values())
        deadline = time.monotonic() + timeout
        while True:
            try:
                rows = self.query(f"count(timestamp(up) >= {after:.3f})")
            except OSError:
                return
            except (RuntimeError, ValueError):
                rows = []
            if rows and int(float(rows[0]["value"][1])) >= targets:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"Prometheus scraped not every target within {timeout:g} s of the stop"
                )
            time.sleep(0.25)

    def infer(self, body: Any, model: str | None = None) -> tuple[int, Any]:
        model = model or self.model_name
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, reply = http_post(
            f"http://127.0.0.1:{self.ports.inference}/predictions/{model}",
            raw,
            headers=self.api_key("inference"),
        )
        try:
            return status, json.loads(reply)
        except json.JSONDecodeError:
            return status, reply.decode(errors="replace")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 on), or None where it
    cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    return stat.rsplit(")", 1)[1].split()


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, /proc/<pid>/stat field 22), or None."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def _ours(pid: int, start: int | None) -> bool:
    """Whether the process group recorded as (``pid``, ``start``) is still the one we started.

    A live leader with another start time is a process that got the number after ours ended:
    not ours. A dead leader whose group still has members is ours: Linux hands out no number
    that is still some group's id.
    """
    if not _group_alive(pid):
        return False
    now = process_start(pid)
    return now is None or start is None or now == start


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited: gone, or a zombie waiting for its parent to reap it."""
    fields = _stat_fields(pid)
    if fields is not None:
        return fields[0] == "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: TorchServe's own default ``max_request_size``, in bytes.
TORCHSERVE_MAX_REQUEST_SIZE = 6_553_500


def _body_limit(mar: Path) -> int:
    """The request body limit of the model in ``mar`` (its archived model-config's input);
    0 when the archive holds no readable one (TorchServe's default then stands)."""
    try:
        with zipfile.ZipFile(mar) as archive:
            # The config under the name it was archived with (`--config mb.yaml` keeps it).
            manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))["model"]
            config = yaml.safe_load(archive.read(manifest.get("configFile", "model-config.yaml")))
        # A text model's input has no shape: its limit is the fixed 1 MiB, under TorchServe's.
        spec = InputSpec.from_mapping(config["handler"]["input"])
    except Exception:
        # Not hookwatch's archive, or one its worker will refuse with its own message: the
        # limit is a sizing hint, never a reason to fail the start here.
        return 0
    return body_limit(spec.numel, spec.max_body_bytes, image=spec.encoding == "image")
