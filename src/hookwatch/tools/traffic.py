"""Demo traffic and the live table ``make run`` prints."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from typing import Any

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
        self.correct = 0

    @property
    def state(self) -> str:
        return self.shifted_name if self.drifting else self.clean_name

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def request(self, i: int, shifted: bool) -> tuple[Any, Any]:
        """The ``i``-th request's body and the answer it should get (None: not checked)."""
        raise NotImplementedError

    def right(self, reply: Any, expected: Any) -> bool:
        return False

    def _run(self) -> None:
        i = 0
        started = next_at = time.monotonic()
        while not self._stop.is_set():
            if self._drift_after and time.monotonic() - started >= self._drift_after:
                self.drifting = True
            body, expected = self.request(i, self.drifting)
            try:
                status, reply = self._stack.infer(body)
            except OSError:
                status, reply = 0, None
            self.status[status] += 1
            if status == 200 and expected is not None and self.right(reply, expected):
                self.correct += 1
            i += 1
            next_at += self._period
            self._stop.wait(max(0.0, next_at - time.monotonic()))


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

    def right(self, reply: Any, expected: Any) -> bool:
        return isinstance(reply, dict) and reply.get("class") == expected


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


class LiveView:
    """Reads a few hookwatch series back from Prometheus' HTTP API and formats them."""

    QUERIES = (
        ("requests/s", "sum(rate(hookwatch_requests_total{{model={model}}}[30s]))"),
        ("sampled/s", "sum(rate(hookwatch_requests_sampled_total{{model={model}}}[30s]))"),
        ("rejected", "sum(hookwatch_requests_rejected_total{{model={model}}})"),
        ("dropped", "sum(hookwatch_captures_dropped_total{{model={model}}})"),
        ("queue depth", "sum(hookwatch_capture_queue_depth{{model={model}}})"),
    )

    def __init__(self, stack: Stack, model: str | None = None) -> None:
        self._stack = stack
        self.model = model or stack.model_name
        # A PromQL string literal (JSON's escaping is PromQL's).
        self._label = json.dumps(self.model)

    def _scalar(self, promql: str) -> str:
        try:
            result = self._stack.query(promql)
        except (OSError, RuntimeError) as error:
            return f"({error.__class__.__name__})"
        return f"{float(result[0]['value'][1]):.3g}" if result else "-"

    STATISTICS = ("mean", "std", "min", "max", "zero_fraction")

    def layer_means(self, window: str = "1m") -> dict[str, dict[str, float]]:
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

    def pages(self, window: str = "1m") -> list[tuple[str, float]]:
        """(detector, alarms) for the detectors whose anytime-valid test alarmed in ``window``
        over every worker: what HookwatchDrift pages on."""
        rows = self._stack.query(
            f"sum by (detector) (increase(hookwatch_drift_sequential_alarms_total"
            f"{{model={self._label}}}[{window}])) > 0"
        )
        return sorted((r["metric"]["detector"], float(r["value"][1])) for r in rows)

    def render(self, traffic: Traffic | None = None) -> str:
        head = "  ".join(
            f"{name} {self._scalar(q.format(model=self._label))}" for name, q in self.QUERIES
        )
        client = (
            f"  | client: {dict(traffic.status)}"
            + (f" correct {traffic.correct}" if isinstance(traffic, TrafficLoop) else "")
            if traffic is not None
            else ""
        )
        lines = [time.strftime("%H:%M:%S") + "  " + head + client]
        table = self.layer_means()
        width = max([len(layer) for layer in table] + [8])
        lines.append(f"    {'layer':<{width}} " + " ".join(f"{s:>13}" for s in self.STATISTICS))
        for layer in sorted(table):
            cells = (table[layer].get(s, float("nan")) for s in self.STATISTICS)
            # NaN: no sampled request in the window (0/0), shown as no data.
            lines.append(
                f"    {layer:<{width}} "
                + " ".join(f"{c:13.3f}" if math.isfinite(c) else f"{'-':>13}" for c in cells)
            )
        drift = self.drift_rows()
        if drift:
            state = "" if traffic is None else f" ({traffic.state})"
            lines.append(f"    drift{state}: detector score / threshold")
            lines.append(
                "      "
                + "  ".join(
                    f"{detector} {score:.2f}/{limit:.2f}{' DRIFT' if hit else ''}"
                    for _, detector, score, limit, hit in drift
                )
            )
            pages = self.pages()
            lines.append(
                "      anytime-valid alarms in the last minute (the page): "
                + ("  ".join(f"{d} {n:.0f}" for d, n in pages) if pages else "none")
            )
        return "\n".join(lines)
