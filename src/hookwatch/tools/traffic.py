"""Demo traffic and the live table ``make run`` prints."""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hookwatch.tools.devstack import Stack


class Traffic:
    """Sends requests at a fixed rate from one thread until stopped; after ``drift_after_s``
    seconds (0: never) it sends shifted ones, which the drift detectors should flag."""

    #: What the live view calls the traffic before and after the shift.
    clean_name = "clean"
    shifted_name = "shifted"

    def __init__(self, stack: Stack, rate_per_s: float = 20.0, drift_after_s: float = 0.0) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"expected a positive rate, got {rate_per_s}")
        if drift_after_s < 0:
            raise ValueError(f"expected drift_after_s >= 0, got {drift_after_s}")
        self._stack = stack
        self._period = 1.0 / rate_per_s
        self._drift_after = drift_after_s
        self.drifting = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self.status = Counter[int]()
        #: Answers checked against a known label, and those right: in all, and per phase
        #: (False: before the switch, True: after it).
        self.checked = 0
        self.correct = 0
        self.checked_in = Counter[bool]()
        self.correct_in = Counter[bool]()
        #: Wall-clock time of the switch to shifted traffic; None before it (or never).
        self.switched_at: float | None = None
        #: The last refusal (a 4xx) as the model said it: ``400: expected ..., got ...``.
        self.last_refusal: str | None = None

    @property
    def state(self) -> str:
        return self.shifted_name if self.drifting else self.clean_name

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def report_facts(self) -> Any:
        """What the report's summary takes from the sender (a report.story.Client): when the
        traffic switched and the accuracy on labelled answers before and after."""
        from hookwatch.tools.report.story import Client

        def share(phase: bool) -> float | None:
            checked = self.checked_in[phase]
            return self.correct_in[phase] / checked if checked else None

        return Client(self.switched_at, self.shifted_name, share(False), share(True))

    def request(self, i: int, shifted: bool) -> tuple[Any, Any]:
        """The ``i``-th request's body and the answer it should get (None: not checked)."""
        raise NotImplementedError

    def right(self, reply: Any, expected: Any) -> bool:
        """A classifier's answer names ``expected`` (checked only where a request has one)."""
        return isinstance(reply, dict) and reply.get("class") == expected

    def _run(self) -> None:
        i = 0
        started = next_at = time.monotonic()
        while not self._stop.is_set():
            if (
                self._drift_after
                and not self.drifting
                and time.monotonic() - started >= self._drift_after
            ):
                self.switched_at = time.time()
                self.drifting = True
            body, expected = self.request(i, self.drifting)
            try:
                status, reply = self._stack.infer(body)
            except OSError:
                status, reply = 0, None
            self.status[status] += 1
            if 400 <= status < 500:
                self.last_refusal = _refusal(status, reply)
            if status == 200 and expected is not None:
                right = self.right(reply, expected)
                self.checked += 1
                self.checked_in[self.drifting] += 1
                self.correct += right
                self.correct_in[self.drifting] += right
            i += 1
            next_at += self._period
            self._stop.wait(max(0.0, next_at - time.monotonic()))


def _wrapped(line: str) -> list[str]:
    """A summary line that must be read whole, over several lines of at most ``WIDTH``."""
    import textwrap

    return textwrap.wrap(line, WIDTH, subsequent_indent="    ", break_on_hyphens=False)


def _refusal(status: int, reply: Any) -> str:
    """A 4xx answer in a line: hookwatch's own says what was expected and what came."""
    if isinstance(reply, dict) and "expected" in reply and "got" in reply:
        return f"{status}: expected {reply['expected']}, got {reply['got']}"
    return f"{status}: {str(reply)[:200]}"


class TrafficLoop(Traffic):
    """Held-out digits; shifted: the same digits inverted (16 - x)."""

    clean_name = "clean digits"
    shifted_name = "inverted digits"

    def __init__(self, stack: Stack, rate_per_s: float = 20.0, drift_after_s: float = 0.0) -> None:
        super().__init__(stack, rate_per_s, drift_after_s)
        # The demo's digits come from scikit-learn (the tools extra): imported here, so a
        # serve of a user's model needs none of it.
        from hookwatch.tools.demo.data import load_split

        self._split = load_split()

    def request(self, i: int, shifted: bool) -> tuple[Any, Any]:
        index = i % len(self._split.y_test)
        image = self._split.x_test[index]
        if shifted:
            image = 16.0 - image
        return {"data": image.tolist()}, int(self._split.y_test[index])


class TextTraffic(Traffic):
    """Texts: the held-out half of one fortunes category (the archive's reference is the
    other half); shifted: another category's texts, or ``mix``: half and half."""

    def __init__(
        self,
        stack: Stack,
        reference: str = "computers",
        shift: str = "literature",
        rate_per_s: float = 10.0,
        drift_after_s: float = 0.0,
    ) -> None:
        from hookwatch.tools.text.fortunes import read_category, split_texts

        super().__init__(stack, rate_per_s, drift_after_s)
        self._clean = split_texts(read_category(reference)).held_out
        self._shifted = read_category(shift if shift != "mix" else "literature")
        self._mix = shift == "mix"
        self.clean_name = f"held-out {reference}"
        self.shifted_name = f"{reference} and literature, half each" if self._mix else shift

    def request(self, i: int, shifted: bool) -> tuple[Any, Any]:
        if shifted and not (self._mix and i % 2):
            return self._shifted[i % len(self._shifted)], None
        return self._clean[i % len(self._clean)], None


@dataclass(frozen=True)
class Bodies:
    """A ``.jsonl`` file's request bodies, each with its ``label`` (None: unlabelled)."""

    name: str
    bodies: list[tuple[Any, int | None]]


class FileTraffic(Traffic):
    """Request bodies from a ``.jsonl`` file, one a line (a reference ``.jsonl`` is one), in
    turn; shifted: another file's. A line's ``label`` (a class index, as the reference's) is
    taken off the body and checked against the answer's class, named as the model names its
    classes (``labels``)."""

    def __init__(
        self,
        stack: Stack,
        clean: Bodies,
        shifted: Bodies | None = None,
        rate_per_s: float = 10.0,
        drift_after_s: float = 0.0,
        labels: list[str] | None = None,
    ) -> None:
        super().__init__(stack, rate_per_s, drift_after_s if shifted is not None else 0.0)
        self._labels = labels
        self._clean = clean.bodies
        self._shifted = shifted.bodies if shifted is not None else clean.bodies
        self.clean_name = clean.name
        self.shifted_name = shifted.name if shifted is not None else clean.name

    def request(self, i: int, shifted: bool) -> tuple[Any, Any]:
        bodies = self._shifted if shifted else self._clean
        body, label = bodies[i % len(bodies)]
        if label is not None and self._labels is not None and label < len(self._labels):
            return body, self._labels[label]
        return body, label


def read_bodies(path: Path) -> Bodies:
    """The request bodies of a ``.jsonl`` file and each one's ``label``, or a one-line
    :class:`~hookwatch.ConfigError` saying which line is not JSON."""
    from hookwatch._errors import ConfigError

    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--traffic: expected a readable .jsonl file, got {error}") from None
    bodies: list[tuple[Any, int | None]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except ValueError as error:
            raise ConfigError(
                f"--traffic: line {number} of {path.name}: expected a JSON request body, got "
                f"{error}"
            ) from None
        label = body.get("label") if isinstance(body, dict) else None
        if isinstance(label, int) and not isinstance(label, bool):
            # The reference's label: not the model's to see (a preprocess function takes the
            # whole body).
            del body["label"]
        else:
            label = None
        bodies.append((body, label))
    if not bodies:
        raise ConfigError(f"--traffic: expected request bodies in {path}, got none")
    return Bodies(path.name, bodies)


#: The live view's width: every line it prints fits a 100-column terminal.
WIDTH = 100
#: The window of the per-layer table and of the page counts (PromQL duration).
TABLE_WINDOW = "1m"

_RED, _GREEN, _BOLD, _RESET = "\x1b[31m", "\x1b[32m", "\x1b[1m", "\x1b[0m"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def wants_colour(stream: TextIO | None = None) -> bool:
    """Colour on a terminal, plain when piped or when ``NO_COLOR`` is set (no-color.org)."""
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def visible(line: str) -> str:
    """``line`` as a terminal shows it: without its colour codes."""
    return _ANSI.sub("", line)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _middle(name: str, width: int) -> str:
    """A long layer name shortened in the middle, where dotted paths repeat themselves."""
    if len(name) <= width:
        return name
    keep = width - 1
    return name[: keep - keep // 2] + "…" + name[len(name) - keep // 2 :]


def _number(value: float, width: int = 10) -> str:
    if not math.isfinite(value):
        return f"{'-':>{width}}"
    text = f"{value:.3f}"
    return f"{text if len(text) <= width else f'{value:.3g}':>{width}}"


#: A layer table cell is "far from the reference" when it differs from the profile's value by
#: more than this share of the reference's magnitude (or of 1, for values near 0 such as a zero
#: fraction): a coarse cue for the eye; the drift detectors are the test.
FAR_FROM_REFERENCE = 0.25


def far_from_reference(value: float, reference: float) -> bool:
    """Whether a live statistic is far enough from its reference value to mark its cell."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return False
    return abs(value - reference) > FAR_FROM_REFERENCE * max(abs(reference), 1.0)


def _pair(score: float, limit: float) -> tuple[str, str]:
    """Score and threshold with enough decimals that two different numbers never print alike."""
    for decimals in (2, 3, 4, 6):
        a, b = f"{score:.{decimals}f}", f"{limit:.{decimals}f}"
        if a != b or score == limit:
            return a, b
    return f"{score:.6g}", f"{limit:.6g}"


def _names(names: list[str], width: int) -> str:
    """As many of ``names`` as fit in ``width`` characters, then how many more."""
    shown: list[str] = []
    for i, name in enumerate(names):
        more = len(names) - i - 1
        tail = f", {more} more" if more else ""
        candidate = ", ".join([*shown, name])
        if len(candidate + tail) > width and shown:
            return ", ".join(shown) + f", {len(names) - i} more"
        shown.append(name)
    return ", ".join(shown)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    minutes, secs = divmod(seconds, 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


class LiveView:
    """Reads a few hookwatch series back from Prometheus' HTTP API every few seconds and
    formats them for a 100-column terminal: a headline that says whether drift is under way
    and since when, traffic, accuracy, the per-layer table and each detector against its
    threshold; :meth:`summary` sums the run up when it stops."""

    QUERIES = (
        ("requests/s", "sum(rate(hookwatch_requests_total{{model={model}}}[30s]))"),
        ("sampled/s", "sum(rate(hookwatch_requests_sampled_total{{model={model}}}[30s]))"),
        ("rejected", "sum(hookwatch_requests_rejected_total{{model={model}}})"),
        ("dropped", "sum(hookwatch_captures_dropped_total{{model={model}}})"),
        ("queue", "sum(hookwatch_capture_queue_depth{{model={model}}})"),
    )

    def __init__(
        self,
        stack: Any,
        model: str | None = None,
        colour: bool | None = None,
        clock: Any = time.time,
    ) -> None:
        self._stack = stack
        self.model = model or stack.model_name
        # A PromQL string literal (JSON's escaping is PromQL's).
        self._label = json.dumps(self.model)
        self.colour = wants_colour() if colour is None else colour
        self._clock = clock
        self.started = clock()
        #: When the view first saw each detector alarm (its window past threshold or its
        #: anytime-valid test), in that order: the run's story for the headline and summary.
        self.first_alarms: dict[str, float] = {}
        #: Each Prometheus alert seen firing (its severity, and when first seen).
        self.first_firing: dict[str, tuple[str, float]] = {}
        #: Since when drift has been under way without a break, None while it is not.
        self.since: float | None = None
        self._last: tuple[float, int, int] | None = None

    def _paint(self, text: str, *codes: str) -> str:
        return "".join(codes) + text + _RESET if self.colour and codes else text

    def _value(self, promql: str) -> float | None:
        try:
            result = self._stack.query(promql)
        except (OSError, RuntimeError):
            return None
        return float(result[0]["value"][1]) if result else None

    def _scalar(self, promql: str) -> str:
        try:
            result = self._stack.query(promql)
        except (OSError, RuntimeError) as error:
            return f"({error.__class__.__name__})"
        return f"{float(result[0]['value'][1]):.3g}" if result else "-"

    STATISTICS = ("mean", "std", "min", "max", "zero_fraction")

    def layer_means(self, window: str = TABLE_WINDOW) -> dict[str, dict[str, float]]:
        """Fleet-wide average of each per-sample statistic over ``window``, by layer."""
        rows = self._stack.query(
            # delta, not rate: the _sum of a statistic that can be negative (logits) goes down,
            # and rate() would read every decrease as a counter reset.
            f"sum by (layer, statistic) "
            f"(delta(hookwatch_activation_statistic_sum{{model={self._label}}}[{window}]))"
            f" / sum by (layer, statistic) "
            f"(delta(hookwatch_activation_statistic_count{{model={self._label}}}[{window}]))"
        )
        table: dict[str, dict[str, float]] = {}
        for row in rows:
            labels = row["metric"]
            table.setdefault(labels["layer"], {})[labels["statistic"]] = float(row["value"][1])
        return table

    def drift_rows(self) -> list[tuple[str, str, float, float, int]]:
        """(level, detector, score, threshold, detected) per detector, worst worker first."""
        scores = self._stack.query(
            f"max by (level, detector) (hookwatch_drift_score{{model={self._label}}})"
        )
        limits = {
            (r["metric"]["level"], r["metric"]["detector"]): float(r["value"][1])
            for r in self._stack.query(
                f"max by (level, detector) (hookwatch_drift_threshold{{model={self._label}}})"
            )
        }
        detected = {
            (r["metric"]["level"], r["metric"]["detector"]): int(float(r["value"][1]))
            for r in self._stack.query(
                f"max by (level, detector) (hookwatch_drift_detected{{model={self._label}}})"
            )
        }
        rows = []
        for r in scores:
            key = (r["metric"]["level"], r["metric"]["detector"])
            rows.append(
                (*key, float(r["value"][1]), limits.get(key, float("nan")), detected.get(key, 0))
            )
        return sorted(rows)

    def firing(self) -> list[tuple[str, str]]:
        """(alert, severity) of the alerting rules firing now for this model (or for no model
        in particular: the exporter's, TorchServe's), as Prometheus evaluates them."""
        rows = self._stack.query(
            f'max by (alertname, severity) (ALERTS{{alertstate="firing", '
            f"model={self._label}}}) or max by (alertname, severity) "
            '(ALERTS{alertstate="firing", model=""})'
        )
        return sorted(
            (r["metric"].get("alertname", "?"), r["metric"].get("severity", "")) for r in rows
        )

    def pages(self, window: str = TABLE_WINDOW) -> list[tuple[str, float]]:
        """(detector, alarms) for the detectors whose anytime-valid test alarmed in ``window``
        over every worker: what HookwatchDriftWarning warns on (the page is the fleet's test)."""
        rows = self._stack.query(
            f"sum by (detector) (increase(hookwatch_drift_sequential_alarms_total"
            f"{{model={self._label}}}[{window}])) > 0"
        )
        return sorted((r["metric"]["detector"], float(r["value"][1])) for r in rows)

    # -- the parts of one frame ------------------------------------------------------------

    def _filling(self) -> str | None:
        """Before any worker has scored a window: how far the first one has filled, as the
        most sampled requests of any worker against the window (each worker fills its own),
        so "no drift" is not claimed of detectors that have not judged anything yet."""
        window = self._value(f"max(hookwatch_drift_window_samples{{model={self._label}}})")
        if window is None:
            return None
        sampled = self._value(f"max(hookwatch_requests_sampled_total{{model={self._label}}})")
        if sampled is not None and sampled >= window:
            # Filled: its score comes with the worker's next publish and the next scrape.
            return f"first window full ({window:.0f}), being scored"
        return f"first window: {sampled or 0:.0f} of {window:.0f} sampled requests"

    def _headline(
        self, now: float, alarming: list[str], traffic: Traffic | None, scored: bool = True
    ) -> str:
        stamp = _clock(now)
        switched = traffic.switched_at if traffic is not None else None
        if not scored and not alarming:
            filling = self._filling()
            parts = [
                *(
                    [f"{traffic.state if traffic else 'shifted'} for {now - switched:.0f} s"]
                    if switched is not None
                    else []
                ),
                *([filling] if filling else []),
            ]
            text = f"{stamp}  no drift verdict yet" + (f" ({'; '.join(parts)})" if parts else "")
            return self._paint(clip(text, WIDTH), _BOLD)
        if alarming:
            assert self.since is not None
            after = (
                f", {self.since - switched:.0f} s after the switch"
                if switched is not None and self.since >= switched
                else ""
            )
            head = f"{stamp}  DRIFT since {_clock(self.since)}{after}: "
            text = head + _names([_middle(d, 20) for d in alarming], WIDTH - len(head))
            return self._paint(text, _BOLD, _RED)
        if switched is not None:
            text = (
                f"{stamp}  no drift detected yet ({traffic.state if traffic else 'shifted'} "
                f"for {now - switched:.0f} s)"
            )
            return self._paint(clip(text, WIDTH), _BOLD)
        text = (
            f"{stamp}  no drift: every detector under its threshold, "
            f"no page in the last {TABLE_WINDOW}"
        )
        return self._paint(clip(text, WIDTH), _GREEN)

    def _traffic(self, traffic: Traffic | None) -> list[str]:
        served = "  ".join(
            f"{name} {self._scalar(q.format(model=self._label))}" for name, q in self.QUERIES
        )
        lines = [clip(f"  served   {served}", WIDTH)]
        if traffic is not None:
            sent = sum(traffic.status.values())
            other = ", ".join(f"{k}: {v}" for k, v in sorted(traffic.status.items()) if k != 200)
            lines.append(
                clip(
                    f"  client   sending {traffic.state}; sent {sent}, "
                    f"answered {traffic.status.get(200, 0)}"
                    + (f" (other: {other})" if other else ""),
                    WIDTH,
                )
            )
            if traffic.last_refusal is not None:
                # Why requests are refused, as the model answers: without it a run of 400s
                # read as nothing more than a count.
                lines.append(clip(f"  refused  {traffic.last_refusal}", WIDTH))
        return lines

    def _accuracy(self, now: float, traffic: Traffic | None) -> str | None:
        parts = []
        if traffic is not None and traffic.checked:
            checked, correct = traffic.checked, traffic.correct
            last = self._last
            self._last = (now, checked, correct)
            if last is not None and checked > last[1]:
                n, right = checked - last[1], correct - last[2]
                share = self._paint(f"{100 * right / n:.0f} %", _BOLD)
                parts.append(f"last {now - last[0]:.0f} s: {share} of {n} labelled answers")
        estimate = self._value(f"min(hookwatch_estimated_accuracy{{model={self._label}}})")
        if estimate is not None:
            reference = self._value(f"max(hookwatch_reference_accuracy{{model={self._label}}})")
            parts.append(
                f"estimated {100 * estimate:.0f} % (last window"
                + (f"; reference {100 * reference:.0f} %)" if reference is not None else ")")
            )
        return "  accuracy " + "  |  ".join(parts) if parts else None

    def reference_means(self) -> dict[tuple[str, str], float]:
        """The drift profile's mean of each per-sample statistic, by (layer, statistic); empty
        for a model served without a profile."""
        rows = self._stack.query(
            "max by (layer, statistic) "
            f"(hookwatch_reference_activation_statistic{{model={self._label}}})"
        )
        return {
            (row["metric"]["layer"], row["metric"]["statistic"]): float(row["value"][1])
            for row in rows
            if "layer" in row["metric"] and "statistic" in row["metric"]
        }

    def _cell(self, value: float, reference: float | None) -> str:
        """A table cell, marked ``*`` (red on a terminal) when it is far from the reference."""
        if reference is None or not far_from_reference(value, reference):
            return _number(value, 9) + " "
        return self._paint(_number(value, 9) + "*", _BOLD, _RED)

    def _layers(self) -> list[str]:
        table = self.layer_means()
        if not table:
            return []
        reference = self.reference_means()
        width = min(30, max([len(layer) for layer in table] + [8]))
        names = ("mean", "std", "min", "max", "zero frac")
        lines = [
            f"  layers: fleet average over the last {TABLE_WINDOW} (a step shows here slowly)"
            + ("; * far from the reference" if reference else ""),
            f"    {'layer':<{width}} " + " ".join(f"{s:>9} " for s in names),
        ]
        for layer in sorted(table):
            # NaN: no sampled request in the window (0/0), shown as no data.
            cells = (
                self._cell(table[layer].get(s, float("nan")), reference.get((layer, s)))
                for s in self.STATISTICS
            )
            lines.append(f"    {_middle(layer, width):<{width}} " + " ".join(cells))
        return lines

    def _drift(
        self, rows: list[tuple[str, str, float, float, int]], pages: dict[str, float]
    ) -> list[str]:
        window = self._value(f"max(hookwatch_drift_window_samples{{model={self._label}}})")
        size = f"the last {window:.0f} sampled requests" if window else "the last window"
        width = min(30, max([len(d) for _, d, *_ in rows] + [8]))
        lines = [
            f"  drift: score of {size} per worker vs its threshold (x thr: how far);",
            f"  warns: the anytime-valid test's alarms in the last {TABLE_WINDOW} "
            "(HookwatchDriftWarning)",
            f"    {'detector':<{width}} {'score':>10}   {'threshold':>9} {'x thr':>7}  "
            f"{'state':<6} warns",
        ]
        for _, detector, score, limit, hit in rows:
            past = bool(hit) or (math.isfinite(limit) and score > limit)
            a, b = _pair(score, limit)
            sign = ">" if score > limit else "=" if score == limit else "<"
            times = f"{score / limit:6.1f}x" if math.isfinite(limit) and limit > 0 else "      -"
            state = self._paint(f"{'PAST':<6}", _BOLD, _RED) if past else f"{'ok':<6}"
            paged = pages.get(detector, 0.0)
            page = self._paint(f"{paged:.0f}", _BOLD, _RED) if paged else "-"
            lines.append(
                f"    {_middle(detector, width):<{width}} {a:>10} {sign} {b:>9} {times}  "
                f"{state} {page}"
            )
        return lines

    def render(self, traffic: Traffic | None = None) -> str:
        now = self._clock()
        rows = self.drift_rows()
        pages = dict(self.pages()) if rows else {}
        alarming = [
            d
            for _, d, score, limit, hit in rows
            if hit or (math.isfinite(limit) and score > limit) or pages.get(d)
        ]
        for detector in alarming:
            self.first_alarms.setdefault(detector, now)
        if alarming and self.since is None:
            self.since = now
        elif not alarming:
            self.since = None
        # In the order they first alarmed, the longest-standing first.
        alarming.sort(key=lambda d: (self.first_alarms[d], d))
        # A blank line first: one frame every few seconds, each starting at its clock time.
        lines = ["", self._headline(now, alarming, traffic, bool(rows)), *self._traffic(traffic)]
        firing = self.firing()
        for name, severity in firing:
            self.first_firing.setdefault(name, (severity, now))
        if firing:
            # What pages and warns a person on call (the rules' verdicts, not the table's).
            text = "  alerts firing: " + ", ".join(
                f"{name} ({severity}{': a page' if severity == 'critical' else ''})"
                for name, severity in firing
            )
            lines.append(self._paint(clip(text, WIDTH), _BOLD, _RED))
        accuracy = self._accuracy(now, traffic)
        if accuracy is not None:
            lines.append(accuracy)
        lines += self._layers()
        if rows:
            lines += self._drift(rows, pages)
        return "\n".join(lines)

    def _requests(self) -> str:
        """The summary's count of requests when someone else sent them: the handler counts
        every request it received, the rejected (4xx) among them, so the answered are the
        rest; "received" alone when the rejected are not known."""
        received = self._value(f"sum(hookwatch_requests_total{{model={self._label}}})")
        if received is None:
            return ""
        rejected = self._value(f"sum(hookwatch_requests_rejected_total{{model={self._label}}})")
        head = f", {received:.0f} request{'' if round(received) == 1 else 's'}"
        if rejected is None:
            return head + " received"
        answered = max(received - rejected, 0.0)  # two series: never below 0 between updates
        return f"{head} ({answered:.0f} answered, {rejected:.0f} rejected)"

    def summary(self, traffic: Traffic | None = None, report: Path | None = None) -> str:
        """What the run came to, for when it stops: duration, requests, the first alarm and
        its delay after the switch, the detectors in the order they alarmed, the report."""
        now = self._clock()
        head = f"run summary: {_duration(now - self.started)}"
        if traffic is not None:
            sent = sum(traffic.status.values())
            head += f", {sent} requests sent, {traffic.status.get(200, 0)} answered"
        else:
            head += self._requests()
        lines = [head]
        if traffic is not None and traffic.last_refusal is not None:
            refused = sum(n for code, n in traffic.status.items() if 400 <= code < 500)
            every = refused == sum(traffic.status.values())
            lines += _wrapped(
                f"  {'every request was refused' if every else f'{refused} refused'}: "
                f"{traffic.last_refusal}" + (" (nothing was monitored)" if every else "")
            )
        switched = traffic.switched_at if traffic is not None else None
        if switched is not None and traffic is not None:
            lines.append(f"  {traffic.shifted_name} from {_clock(switched)}")
        if self.first_alarms:
            order = sorted(self.first_alarms.items(), key=lambda item: (item[1], item[0]))
            first = order[0][1]
            delay = (
                f", {first - switched:.0f} s after the switch"
                if switched is not None and first >= switched
                else (" (before the switch: a false alarm)" if switched is not None else "")
            )
            lines.append(f"  first alarm {_clock(first)}{delay} (seen every 5 s)")
            steps = [f"{d} +{t - first:.0f} s" if t > first else d for d, t in order]
            head = "  detectors in order: "
            lines.append(head + _names(steps, WIDTH - len(head)))
        else:
            lines.append("  no detector alarmed")
        if self.first_firing:
            fired = sorted(self.first_firing.items(), key=lambda item: (item[1][1], item[0]))
            lines += _wrapped(
                "  alerts that fired: "
                + ", ".join(f"{name} ({severity}) at {_clock(t)}" for name, (severity, t) in fired)
            )
        if traffic is not None and traffic.checked:
            phases = [
                f"{name} {100 * traffic.correct_in[phase] / traffic.checked_in[phase]:.0f} %"
                for phase, name in ((False, traffic.clean_name), (True, traffic.shifted_name))
                if traffic.checked_in[phase]
            ]
            lines.append("  accuracy (labels known): " + ", ".join(phases))
        if report is not None:
            lines.append(f"  report: {report}")
        return "\n".join(clip(line, WIDTH) for line in lines)
