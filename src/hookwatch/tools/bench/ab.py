"""``hookwatch bench MAR``: a user's archive served without and with hookwatch, side by side.

One TorchServe on free loopback ports serves two models from the same ``.mar``: the archive as
``hookwatch archive`` wrote it, and a copy whose handler file is swapped for one that subclasses
:class:`hookwatch.torchserve.UnmonitoredHandler` (same decoding, batching and answers, no
monitor). Both are warmed up, then measured in interleaved rounds (A B, B A, ...) with a closed
loop of clients, so the machine's slow drift cancels out; each round's hookwatch numbers are
divided by the plain numbers of the same round. The ratio table is printed; ``--out`` writes it
as Markdown or JSON. Nothing is written anywhere else but the work directory.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import shutil
import statistics
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hookwatch._config import HandlerConfig, InputSpec
from hookwatch._errors import ConfigError
from hookwatch.tools.bench.loadgen import Segment, Target, closed_loop
from hookwatch.tools.bench.stats import CONFIDENCE, PLAIN, Spread, median_interval, ratios
from hookwatch.tools.images import IMAGE_SUFFIXES
from hookwatch.tools.mar import read_hookwatch_mar

MONITORED = "hookwatch"
#: In the order even rounds run them (odd rounds reverse it).
VARIANTS: tuple[str, str] = (PLAIN, MONITORED)

#: The plain variant's handler file: the archive's model, config and request decoding, served
#: without monitoring.
PLAIN_HANDLER_SOURCE = '''"""Written by `hookwatch bench`: served without monitoring."""

from hookwatch.torchserve import UnmonitoredHandler


class Handler(UnmonitoredHandler):
    """The one class TorchServe loads from this file."""
'''

#: Distinct request bodies synthesised from ``handler.input`` (cycled through by the clients).
SYNTHETIC_BODIES = 16

#: (label, stats metric, unit) of each row of the table.
ROWS: tuple[tuple[str, str, str], ...] = (
    ("throughput", "throughput", "req/s"),
    ("p50 latency", "p50", "ms"),
    ("p99 latency", "p99", "ms"),
)


@dataclass(frozen=True)
class Archive:
    """What the bench needs of a ``.mar`` built by ``hookwatch archive``."""

    path: Path
    name: str
    #: The handler file's name inside the archive (the manifest's ``handler``).
    handler_file: str
    handler: HandlerConfig


def read_archive(mar: Path) -> Archive:
    """The archive's model name, handler file and ``handler:`` config; a one-line
    :class:`ConfigError` for anything that is not a ``.mar`` with hookwatch's handler."""
    read = read_hookwatch_mar(mar)
    if not isinstance(read.config, Mapping) or "handler" not in read.config:
        raise ConfigError(
            f"expected a .mar built by `hookwatch archive` (a model-config with a handler: "
            f"section), got {mar.name} without one"
        )
    return Archive(
        mar, read.name, read.handler_file, HandlerConfig.from_mapping(read.config["handler"])
    )


def plain_archive(archive: Archive, out: Path) -> Path:
    """A copy of the archive at ``out`` whose handler file serves without monitoring."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive.path) as source, zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            if item.filename == archive.handler_file:
                target.writestr(item, PLAIN_HANDLER_SOURCE)
            else:
                # Stored as they are (compressed bytes copied would need zipfile internals).
                target.writestr(item, source.read(item))
    return out


def read_requests(path: Path) -> list[bytes]:
    """Request bodies from ``--request``: a ``.jsonl`` file holds one JSON body a line, an
    image file (``input.encoding: image``) is one body as it is, any other file is one JSON
    body."""
    if not path.is_file():
        raise ConfigError(f"--request: expected a JSON or .jsonl file at {path}, got no such file")
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return [path.read_bytes()]
    text = path.read_text()
    lines = (
        [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if path.suffix == ".jsonl"
        else [(1, text)]
    )
    bodies = []
    for number, line in lines:
        try:
            json.loads(line)
        except ValueError as error:
            where = f"{path}:{number}" if path.suffix == ".jsonl" else str(path)
            raise ConfigError(
                f"--request: expected a JSON body, got {where}: {str(error).splitlines()[0]}"
            ) from None
        bodies.append(line.strip().encode())
    if not bodies:
        raise ConfigError(f"--request: expected at least one JSON body, got an empty {path}")
    return bodies


def synthesize(spec: InputSpec, count: int = SYNTHETIC_BODIES, seed: int = 0) -> list[bytes]:
    """Request bodies for a tensor input: ``{field: values}`` of ``spec.shape``, drawn uniform
    in ``[min, max]`` (integers for integer and boolean dtypes). Without a declared range the
    values lie in [0, 1]; with one bound only, in a unit interval beside it."""
    if spec.text is not None:
        raise ConfigError(
            "expected --request FILE (a JSON body, or .jsonl: one body a line) for a text "
            "model, got none"
        )
    if spec.shape is None and not spec.arguments:
        raise ConfigError(
            f"expected --request FILE for a model whose input.preprocess ({spec.preprocess}) "
            "reads the requests, got none"
        )
    rng = np.random.default_rng(seed)
    if spec.encoding == "image":
        # Image files, as such a model's clients send them: the image path is what is measured.
        return [_image_file(spec, rng) for _ in range(count)]
    # Several tensors (input.arguments): a field each, each drawn as its declaration says.
    parts = spec.arguments or (spec,)
    return [
        json.dumps({part.field: _draw(part, rng).tolist() for part in parts}).encode()
        for _ in range(count)
    ]


def _image_file(spec: InputSpec, rng: np.random.Generator) -> bytes:
    """A JPEG (PNG for 4 channels) of the input's size: smooth random colours, as a photo is
    smooth, so that it decodes as a photo does."""
    from PIL import Image  # comes with TorchServe, as the image input does

    assert spec.shape is not None
    channels, height, width = spec.shape
    cells = rng.random((height // 8 + 1, width // 8 + 1, channels))
    smooth = cells.repeat(8, axis=0).repeat(8, axis=1)[:height, :width]
    pixels = (np.clip(smooth + 0.05 * rng.standard_normal(smooth.shape), 0, 1) * 255).round()
    array = pixels.astype(np.uint8)
    image = Image.fromarray(array[:, :, 0] if channels == 1 else array)
    out = io.BytesIO()
    image.save(out, "PNG" if channels == 4 else "JPEG", quality=90)
    return out.getvalue()


def content_type(bodies: Sequence[bytes]) -> str:
    """What the bodies are sent as: JSON, or (image files) raw bytes TorchServe hands over as
    they are."""
    try:
        json.loads(bodies[0])
    except ValueError:
        return "application/octet-stream"
    return "application/json"


def _draw(spec: InputSpec, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """One input of ``spec.shape``, uniform in its declared range; a length each request
    chooses (a null in the shape) drawn uniform from 1 to ``input.max_length``, as traffic's
    lengths vary (all at the longest, every batch would pad nothing)."""
    assert spec.shape is not None
    shape = list(spec.shape)
    if spec.length_dim is not None:
        shape[spec.length_dim] = int(rng.integers(1, shape[spec.length_dim] + 1))
    low = spec.min_value
    high = spec.max_value
    if low is None:
        low = high - 1.0 if high is not None else 0.0
    if high is None:
        high = low + 1.0
    if spec.dtype == "bool":
        return rng.integers(0, 2, size=shape)
    if spec.dtype.startswith(("int", "uint")):
        return rng.integers(math.ceil(low), math.floor(high) + 1, size=shape)
    return rng.uniform(low, high, size=shape).round(4)


def request_bodies(request: Path | None, spec: InputSpec) -> list[bytes]:
    return read_requests(request) if request is not None else synthesize(spec)


@dataclass(frozen=True)
class Settings:
    #: Measured seconds per variant per round.
    seconds: float = 10.0
    rounds: int = 6
    #: Closed-loop clients, each sending its next request when the last is answered.
    clients: int = 4
    #: TorchServe workers per variant.
    workers: int = 1
    warmup_s: float = 1.0
    #: Times both variants' workers are started (registered afresh), the rounds split between
    #: them: a worker's speed depends on where its process landed, for as long as it lives, so
    #: one start per variant can read several per cent either way in every round.
    starts: int = 3

    def check(self) -> None:
        for name, value, least in (
            ("--seconds", self.seconds, 0.1),
            ("--rounds", self.rounds, 1),
            ("--clients", self.clients, 1),
            ("--workers", self.workers, 1),
            ("--starts", self.starts, 1),
        ):
            if not value >= least:
                raise ConfigError(f"{name}: expected at least {least:g}, got {value:g}")


@dataclass
class Result:
    model: str
    mar: str
    settings: Settings
    #: Where the bodies came from: the --request file, or "synthesized from handler.input".
    requests: str
    rounds: list[dict[str, Segment]] = field(default_factory=list)
    #: The worker start (0, 1, ...) each round ran on, and each start's worker processes.
    round_starts: list[int] = field(default_factory=list)
    start_pids: list[dict[str, list[int]]] = field(default_factory=list)
    started: str = ""
    duration_s: float = 0.0

    def summary(self) -> list[dict[str, Any]]:
        """Per row: each variant's median over rounds and the ratio's min / median / max."""
        rows = []
        starts = self.round_starts if len(self.round_starts) == len(self.rounds) else None
        for label, metric, unit in ROWS:
            values = ratios(self.rounds, MONITORED, metric)
            spread = Spread.of(values)
            low, high = median_interval(values, starts=starts)
            medians = {
                v: statistics.median(_value(s[v], metric) for s in self.rounds) for v in VARIANTS
            }
            rows.append(
                {
                    "metric": label,
                    "unit": unit,
                    PLAIN: medians[PLAIN],
                    MONITORED: medians[MONITORED],
                    "ratio": spread.median,
                    "ratio_min": spread.low,
                    "ratio_max": spread.high,
                    "ratio_low": low,
                    "ratio_high": high,
                }
            )
        return rows

    def to_json(self) -> str:
        return json.dumps(
            {
                "model": self.model,
                "mar": self.mar,
                "settings": dataclasses.asdict(self.settings),
                "requests": self.requests,
                "started": self.started,
                "duration_s": self.duration_s,
                "summary": self.summary(),
                "rounds": [{v: dataclasses.asdict(s) for v, s in r.items()} for r in self.rounds],
                "round_starts": self.round_starts,
                "start_pids": self.start_pids,
            },
            indent=1,
        )


def _value(segment: Segment, metric: str) -> float:
    return {
        "throughput": segment.throughput_rps,
        "p50": segment.p50_ms,
        "p99": segment.p99_ms,
    }[metric]


def render(result: Result) -> str:
    """The ratio table, Markdown (readable as it is on a terminal)."""
    s = result.settings
    lines = [
        f"hookwatch bench: {result.model} ({result.mar}), plain handler against hookwatch as "
        f"archived",
        f"{s.rounds} rounds of {s.seconds:g} s per variant, interleaved, on "
        f"{len(set(result.round_starts)) or 1} start(s) of the workers; closed loop, "
        f"{s.clients} clients; {s.workers} worker(s) per variant; requests: {result.requests}",
        "",
        "| metric | plain | hookwatch | hookwatch / plain (median over rounds, min-max) "
        f"| {CONFIDENCE:.0%} interval of the median |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in result.summary():
        lines.append(
            f"| {row['metric']} ({row['unit']}) | {row[PLAIN]:.2f} | {row[MONITORED]:.2f} | "
            f"**{row['ratio']:.3f}** ({row['ratio_min']:.3f}-{row['ratio_max']:.3f}) | "
            f"{row['ratio_low']:.3f}-{row['ratio_high']:.3f} |"
        )
    errors = {v: sum(r[v].errors for r in result.rounds) for v in VARIANTS}
    served = {v: sum(r[v].requests for r in result.rounds) for v in VARIANTS}
    lines += [
        "",
        "Throughput ratio below 1 and latency ratios above 1 are what monitoring costs; each "
        "round's hookwatch numbers are divided by the plain numbers of the same round. The "
        "interval is a bootstrap one (the workers' starts resampled, then their rounds): where "
        "it holds 1.000, this run cannot tell what hookwatch costs from the machine's noise. "
        + ", ".join(f"{v}: {served[v]} requests, {errors[v]} errors" for v in VARIANTS)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def write(result: Result, out: Path) -> None:
    """``--out``: the table as Markdown (``.md``) or everything measured as JSON (``.json``)."""
    text = result.to_json() + "\n" if out.suffix == ".json" else render(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def check_out(out: Path | None) -> None:
    if out is not None and out.suffix not in (".md", ".json"):
        raise ConfigError(f"--out: expected a .md or .json file, got {out.name}")


def round_order(index: int) -> tuple[str, ...]:
    return VARIANTS if index % 2 == 0 else tuple(reversed(VARIANTS))


def _probe(server: Any, names: Mapping[str, str], bodies: Sequence[bytes]) -> None:
    """Every body once to each variant: a body the model refuses fails here, in one line."""
    from hookwatch.tools.devstack import http_post

    for variant, name in names.items():
        url = f"http://127.0.0.1:{server.ports.inference}/predictions/{name}"
        for index, body in enumerate(bodies):
            status, answer = http_post(url, body, timeout=60.0)
            if status != 200:
                detail = answer.decode(errors="replace").strip().replace("\n", " ")[:300]
                raise ConfigError(
                    f"expected 200 from the {variant} model for request body {index + 1}, got "
                    f"{status}: {detail}"
                )


def run(
    archive: Archive,
    bodies: Sequence[bytes],
    settings: Settings,
    work: Path,
    ports: Any,
    requests: str,
    say: Callable[[str], None] = print,
) -> Result:
    """Serve both variants on one TorchServe rooted at ``work`` and measure them."""
    from hookwatch.tools.bench.server import BenchServer

    started = time.monotonic()
    store = work / "model-store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    names = {PLAIN: f"{archive.name}-plain", MONITORED: f"{archive.name}-hookwatch"}
    plain_archive(archive, store / f"{names[PLAIN]}.mar")
    (store / f"{names[MONITORED]}.mar").symlink_to(archive.path.resolve())
    result = Result(
        archive.name,
        archive.path.name,
        settings,
        requests,
        started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
    server = BenchServer(
        root=work,
        run_dir=work / "run",
        ports=ports,
        workers=settings.workers,
        model_store=store,
        models="",
    )
    starts = min(settings.starts, settings.rounds)
    try:
        say(f"starting TorchServe (inference port {ports.inference}) in {work}")
        server.start_torchserve()

        def target(variant: str) -> Target:
            path = f"/predictions/{names[variant]}"
            return Target("127.0.0.1", ports.inference, path, bodies, sent_as)

        sent_as = content_type(bodies)

        for start in range(starts):
            # Consecutive rounds share a start; the variants register in turn first.
            rounds = [i for i in range(settings.rounds) if i * starts // settings.rounds == start]
            order = [names[v] for v in (VARIANTS if start % 2 == 0 else VARIANTS[::-1])]
            server.register(order, workers=settings.workers, suffix=".mar")
            try:
                result.start_pids.append({v: server.worker_pids(names[v]) for v in VARIANTS})
                if start == 0:
                    _probe(server, names, bodies)
                for variant in VARIANTS:
                    closed_loop(target(variant), settings.clients, max(1.0, settings.seconds / 2))
                for index in rounds:
                    segments = {
                        variant: closed_loop(
                            target(variant), settings.clients, settings.seconds, settings.warmup_s
                        )
                        for variant in round_order(index)
                    }
                    result.rounds.append(segments)
                    result.round_starts.append(start)
                    say(
                        f"round {index + 1}/{settings.rounds} (workers' start {start + 1}): "
                        + ", ".join(
                            f"{v} {segments[v].throughput_rps:.1f} req/s "
                            f"p99 {segments[v].p99_ms:.1f} ms"
                            for v in VARIANTS
                        )
                    )
            finally:
                if start < starts - 1:
                    server.unregister(order)
    finally:
        server.stop()
    result.duration_s = time.monotonic() - started
    return result


def bench(
    mar: Path,
    request: Path | None,
    settings: Settings,
    out: Path | None,
    work: Path | None,
    ports: Any,
    say: Callable[[str], None] = print,
) -> Result:
    """Everything ``hookwatch bench MAR`` does but printing the table: checks first (one line
    each), then the run; a temporary work directory goes when the run ends."""
    settings.check()
    check_out(out)
    archive = read_archive(mar)
    bodies = request_bodies(request, archive.handler.input)
    source = str(request) if request is not None else "synthesized from handler.input"
    directory = Path(tempfile.mkdtemp(prefix="hookwatch-bench-")) if work is None else work
    directory.mkdir(parents=True, exist_ok=True)
    try:
        result = run(archive, bodies, settings, directory.resolve(), ports, source, say)
    finally:
        if work is None:  # a temporary one; with --work the logs stay
            shutil.rmtree(directory, ignore_errors=True)
    if out is not None:
        write(result, out)
    return result
