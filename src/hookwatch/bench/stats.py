"""Ratios against the plain handler, round by round, and the issue's targets."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hookwatch.bench.loadgen import Segment

PLAIN = "plain"
#: In the order every round runs them (reversed on odd rounds, so drift cancels out).
VARIANTS: tuple[str, ...] = (PLAIN, "default", "full", "naive")
VARIANT_TEXT: Mapping[str, str] = {
    PLAIN: "plain BaseHandler (same decode/encode, no monitor)",
    "default": "hookwatch, default sampling",
    "full": "hookwatch, 100 % sampling",
    "naive": "naive capture (tutorial style, every request, in the request thread)",
}

Metric = Callable[[Segment], float]
METRICS: Mapping[str, Metric] = {
    "throughput": lambda s: s.throughput_rps,
    "p50": lambda s: s.p50_ms,
    "p99": lambda s: s.p99_ms,
}


@dataclass(frozen=True)
class Spread:
    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("expected at least one value, got none")
        return cls(min(values), statistics.median(values), max(values))


def round_order(round_index: int) -> tuple[str, ...]:
    return VARIANTS if round_index % 2 == 0 else tuple(reversed(VARIANTS))


def ratios(rounds: Sequence[Mapping[str, Segment]], variant: str, metric: str) -> list[float]:
    """``variant``'s metric over the plain handler's, each against the plain run of its round."""
    fn = METRICS[metric]
    out = []
    for segments in rounds:
        base = fn(segments[PLAIN])
        if base <= 0:
            raise ValueError(f"expected a positive plain {metric}, got {base}")
        out.append(fn(segments[variant]) / base)
    return out


@dataclass(frozen=True)
class TargetSpec:
    throughput_loss: float
    p99_increase: float


#: CPU targets of the issue, as fractions.
CPU_TARGETS: Mapping[str, TargetSpec] = {
    "default": TargetSpec(throughput_loss=0.02, p99_increase=0.03),
    "full": TargetSpec(throughput_loss=0.05, p99_increase=0.08),
}
#: RSS growth allowed over 100k requests.
RSS_TARGET_MB = 20.0


@dataclass(frozen=True)
class Verdict:
    what: str
    measured: float
    limit: float

    @property
    def holds(self) -> bool:
        return self.measured <= self.limit

    @property
    def miss(self) -> float:
        return max(0.0, self.measured - self.limit)


def verdicts(
    variant: str, closed: Sequence[Mapping[str, Segment]], opened: Sequence[Mapping[str, Segment]]
) -> list[Verdict]:
    """Judge the median over rounds (min and max are in the table beside it)."""
    target = CPU_TARGETS[variant]
    out = [
        Verdict(
            "throughput loss (closed loop)",
            1.0 - statistics.median(ratios(closed, variant, "throughput")),
            target.throughput_loss,
        ),
        Verdict(
            "p99 increase (closed loop)",
            statistics.median(ratios(closed, variant, "p99")) - 1.0,
            target.p99_increase,
        ),
    ]
    if opened:
        out.append(
            Verdict(
                "p99 increase (open loop)",
                statistics.median(ratios(opened, variant, "p99")) - 1.0,
                target.p99_increase,
            )
        )
    return out
