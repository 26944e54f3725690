"""Demo traffic and the live table ``make run`` prints."""

from __future__ import annotations

import threading
import time
from collections import Counter

from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import MODEL_NAME, Stack


class TrafficLoop:
    """Sends held-out digits at a fixed rate from one thread until stopped.

    After ``drift_after_s`` seconds (0: never) it sends the same digits inverted (16 - x), a
    shift the drift detectors should flag within a few windows.
    """

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

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        split = load_split()
        i = 0
        started = next_at = time.monotonic()
        while not self._stop.is_set():
            index = i % len(split.y_test)
            image = split.x_test[index]
            if self._drift_after and time.monotonic() - started >= self._drift_after:
                self.drifting = True
                image = 16.0 - image
            try:
                status, reply = self._stack.infer({"data": image.tolist()})
            except OSError:
                status, reply = 0, None
            self.status[status] += 1
            if (
                status == 200
                and isinstance(reply, dict)
                and reply.get("class") == int(split.y_test[index])
            ):
                self.correct += 1
            i += 1
            next_at += self._period
            self._stop.wait(max(0.0, next_at - time.monotonic()))


class LiveView:
    """Reads a few hookwatch series back from Prometheus' HTTP API and formats them."""

    QUERIES = (
        ("requests/s", f'sum(rate(hookwatch_requests_total{{model="{MODEL_NAME}"}}[30s]))'),
        ("sampled/s", f'sum(rate(hookwatch_requests_sampled_total{{model="{MODEL_NAME}"}}[30s]))'),
        ("dropped", f'sum(hookwatch_captures_dropped_total{{model="{MODEL_NAME}"}})'),
        ("queue depth", f'sum(hookwatch_capture_queue_depth{{model="{MODEL_NAME}"}})'),
    )

    def __init__(self, stack: Stack) -> None:
        self._stack = stack

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
            f"sum by (layer, statistic) (delta(hookwatch_activation_statistic_sum[{window}]))"
            f" / sum by (layer, statistic) (delta(hookwatch_activation_statistic_count[{window}]))"
        )
        table: dict[str, dict[str, float]] = {}
        for row in rows:
            labels = row["metric"]
            table.setdefault(labels["layer"], {})[labels["statistic"]] = float(row["value"][1])
        return table

    def drift_rows(self) -> list[tuple[str, str, float, float, int]]:
        """(level, detector, score, threshold, detected) per detector, worst worker first."""
        scores = self._stack.query("max by (level, detector) (hookwatch_drift_score)")
        limits = {
            (r["metric"]["level"], r["metric"]["detector"]): float(r["value"][1])
            for r in self._stack.query("max by (level, detector) (hookwatch_drift_threshold)")
        }
        detected = {
            (r["metric"]["level"], r["metric"]["detector"]): int(float(r["value"][1]))
            for r in self._stack.query("max by (level, detector) (hookwatch_drift_detected)")
        }
        rows = []
        for r in scores:
            key = (r["metric"]["level"], r["metric"]["detector"])
            rows.append(
                (*key, float(r["value"][1]), limits.get(key, float("nan")), detected.get(key, 0))
            )
        return sorted(rows)

    def render(self, traffic: TrafficLoop) -> str:
        head = "  ".join(f"{name} {self._scalar(q)}" for name, q in self.QUERIES)
        lines = [
            time.strftime("%H:%M:%S")
            + "  "
            + head
            + f"  | client: {dict(traffic.status)} correct {traffic.correct}"
        ]
        table = self.layer_means()
        lines.append("    layer    " + " ".join(f"{s:>13}" for s in self.STATISTICS))
        for layer in sorted(table):
            cells = (table[layer].get(s, float("nan")) for s in self.STATISTICS)
            lines.append(f"    {layer:<8} " + " ".join(f"{c:13.3f}" for c in cells))
        drift = self.drift_rows()
        if drift:
            state = "inverted digits" if traffic.drifting else "clean digits"
            lines.append(f"    drift ({state}): detector score / threshold")
            lines.append(
                "      "
                + "  ".join(
                    f"{detector} {score:.2f}/{limit:.2f}{' DRIFT' if hit else ''}"
                    for _, detector, score, limit, hit in drift
                )
            )
        return "\n".join(lines)
