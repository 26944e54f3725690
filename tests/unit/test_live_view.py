"""The live view of `make run` / `hookwatch serve`, rendered from recorded samples: every line
fits 100 columns, the headline says when drift started and which detectors, cells past their
threshold are marked, and the run's summary states the delay after the switch.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hookwatch.tools import traffic as live
from hookwatch.tools.traffic import LiveView, Traffic, visible

#: The text demo's long layer names beside the digits demo's short ones.
DETECTORS = (
    ("activation", "act1"),
    ("activation", "act2"),
    ("activation", "encoder.encoder.layer.0.output.LayerNorm"),
    ("input", "input"),
    ("output", "output"),
    ("prediction", "class_mix"),
    ("prediction", "confidence"),
    ("prediction", "entropy"),
)
THRESHOLD = 1.65


class FakeStack:
    """Answers the view's instant queries from the values a test sets (Prometheus' shape)."""

    model_name = "digits"

    def __init__(self) -> None:
        self.scores = dict.fromkeys((d for _, d in DETECTORS), 0.95)
        self.pages: dict[str, float] = {}
        #: (alertname, severity) firing in Prometheus.
        self.alerts: list[tuple[str, str]] = []
        self.estimate: float | None = None
        self.sampled = 12.3

    def query(self, promql: str) -> list[dict[str, Any]]:
        def rows(values: dict[tuple[str, str], float]) -> list[dict[str, Any]]:
            return [
                {"metric": {"level": lv, "detector": d}, "value": [0, str(v)]}
                for (lv, d), v in values.items()
            ]

        if "ALERTS" in promql:
            return [
                {"metric": {"alertname": a, "severity": s}, "value": [0, "1"]}
                for a, s in self.alerts
            ]
        if "hookwatch_drift_score" in promql:
            return rows({(lv, d): self.scores[d] for lv, d in DETECTORS if d in self.scores})
        if "hookwatch_drift_threshold" in promql:
            return rows({key: THRESHOLD for key in DETECTORS})
        if "hookwatch_drift_detected" in promql:
            return rows(
                {
                    (lv, d): float(self.scores[d] > THRESHOLD)
                    for lv, d in DETECTORS
                    if d in self.scores
                }
            )
        if "sequential_alarms" in promql:
            return [
                {"metric": {"detector": d}, "value": [0, str(n)]} for d, n in self.pages.items()
            ]
        if "hookwatch_drift_window_samples" in promql:
            return [{"metric": {}, "value": [0, "100"]}]
        if "hookwatch_estimated_accuracy" in promql:
            return (
                [] if self.estimate is None else [{"metric": {}, "value": [0, str(self.estimate)]}]
            )
        if "hookwatch_reference_accuracy" in promql:
            return [] if self.estimate is None else [{"metric": {}, "value": [0, "0.97"]}]
        if "hookwatch_reference_activation_statistic" in promql:
            return [
                {"metric": {"layer": "act1", "statistic": s}, "value": [0, str(v)]}
                for s, v in (("mean", 4.7), ("std", 2.0), ("min", -17.0), ("max", 19.0))
            ]
        if "activation_statistic_sum" in promql:
            return [
                {"metric": {"layer": layer, "statistic": s}, "value": [0, str(v)]}
                for layer in ("act1", "input", "output", "encoder.encoder.layer.0.output.LayerNorm")
                for s, v in (("mean", 4.8), ("std", 1234567.0), ("min", -17.06), ("max", 19.1))
            ] + [{"metric": {"layer": "act1", "statistic": "zero_fraction"}, "value": [0, "NaN"]}]
        if "hookwatch_requests_sampled_total" in promql and "rate" not in promql:
            return [{"metric": {}, "value": [0, str(self.sampled)]}]
        if "hookwatch_requests_total" in promql and "rate" not in promql:
            return [{"metric": {}, "value": [0, "4000"]}]
        return [{"metric": {}, "value": [0, "12.3"]}]


class FakeTraffic(Traffic):
    clean_name = "clean digits"
    shifted_name = "inverted digits"

    def __init__(self) -> None:
        self.status = Counter[int]({200: 1000, 0: 2})
        self.checked = self.correct = 0
        self.checked_in = Counter[bool]()
        self.correct_in = Counter[bool]()
        self.switched_at: float | None = None
        self.drifting = False
        self.last_refusal: str | None = None

    def answer(self, n: int, right: int) -> None:
        self.checked += n
        self.correct += right
        self.checked_in[self.drifting] += n
        self.correct_in[self.drifting] += right


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def frames(colour: bool = False) -> tuple[list[str], str, Clock]:
    """A recorded run: clean, the switch, windows past threshold, pages; then its summary."""
    stack, clock, traffic = FakeStack(), Clock(), FakeTraffic()
    view = LiveView(stack, colour=colour, clock=clock)
    shots = []

    def tick(n: int = 100, right: int = 97) -> None:
        clock.t += 5
        traffic.answer(n, right)
        shots.append(view.render(traffic))

    tick()
    tick()
    traffic.drifting, traffic.switched_at = True, clock.t + 1
    tick(100, 40)  # shifted, nothing alarms yet
    stack.scores["input"] = 1.6512  # past a threshold that prints alike at 2 decimals
    tick(100, 3)
    stack.scores.update(act1=75.65, input=414.81, class_mix=18.0)
    stack.scores["encoder.encoder.layer.0.output.LayerNorm"] = 12.2
    stack.pages = {"input": 22.0, "act1": 8.0}
    stack.estimate = 0.43
    stack.alerts = [("HookwatchAccuracyDrop", "critical"), ("HookwatchDriftWarning", "warning")]
    tick(100, 0)
    summary = view.summary(traffic, Path("/tmp/run/build/report/index.html"))
    return shots, summary, clock


def test_every_line_fits_100_columns_in_colour_and_plain() -> None:
    for colour in (False, True):
        shots, summary, _ = frames(colour)
        for text in [*shots, summary]:
            for line in text.splitlines():
                assert len(visible(line)) <= 100, line


def test_the_headline_changes_when_drift_starts() -> None:
    shots, _, clock = frames()
    heads = [shot.splitlines()[1] for shot in shots]
    assert "no drift: every detector under its threshold" in heads[0]
    assert "no drift detected yet (inverted digits for 4 s)" in heads[2]
    start = clock.t - 5  # the frame that first saw input past its threshold
    expected = f"DRIFT since {live._clock(start)}, 9 s after the switch: input"
    assert heads[3].endswith(expected), heads[3]
    # Later alarms join in the order they were seen, the first still first; its start holds.
    assert f"DRIFT since {live._clock(start)}" in heads[4]
    assert heads[4].endswith(": input, act1, class_mix, encoder.en…LayerNorm"), heads[4]


def test_before_any_window_is_scored_the_headline_says_how_far_the_first_has_filled() -> None:
    # No worker has scored a window yet (no hookwatch_drift_score series): "no drift" would
    # claim a verdict no detector has given.
    stack, clock, traffic = FakeStack(), Clock(), FakeTraffic()
    stack.scores = {}
    view = LiveView(stack, colour=False, clock=clock)
    head = view.render(traffic).splitlines()[1]
    assert head.endswith("no drift verdict yet (first window: 12 of 100 sampled requests)"), head
    traffic.drifting, traffic.switched_at = True, clock.t - 30
    head = view.render(traffic).splitlines()[1]
    assert "no drift verdict yet (inverted digits for 30 s; first window: 12 of 100" in head
    assert "    detector " not in view.render(traffic)
    stack.sampled = 250.0  # filled, its score not published yet
    head = view.render(traffic).splitlines()[1]
    assert head.endswith("first window full (100), being scored)"), head


def drift_row(frame: str, detector: str) -> str:
    table = frame.split("    detector ", 1)[1]
    return next(line for line in table.splitlines() if line.strip().startswith(detector))


def test_scores_and_thresholds_are_told_apart_and_cells_past_it_marked() -> None:
    shots, _, _ = frames()
    row = drift_row(shots[3], "input")
    # 1.6512 against 1.65: never "1.65/1.65 DRIFT".
    assert re.search(r"input\s+1\.651 > +1\.650\s+1\.0x\s+PAST", row), row
    quiet = drift_row(shots[3], "act2")
    assert re.search(r"0\.95 < +1\.65 .* ok", quiet), quiet
    paged = drift_row(shots[4], "input")
    assert re.search(r"414\.81 > +1\.65 +251\.4x  PAST +22$", paged), paged
    text = shots[4]
    assert "score of the last 100 sampled requests per worker vs its threshold" in text
    assert "fleet average over the last 1m" in text


def test_accuracy_is_the_last_interval_s_and_the_estimate_shows_where_there_is_one() -> None:
    shots, _, _ = frames()
    assert "accuracy last 5 s: 97 % of 100 labelled answers" in shots[1]
    assert "accuracy last 5 s: 0 % of 100" in shots[4]
    assert "estimated" not in shots[3]
    assert "estimated 43 % (last window; reference 97 %)" in shots[4]


def test_the_summary_says_what_the_run_came_to() -> None:
    _, summary, clock = frames()
    lines = summary.splitlines()
    assert lines[0] == "run summary: 25 s, 1002 requests sent, 1000 answered"
    assert lines[1] == f"  inverted digits from {live._clock(clock.t - 14)}"
    assert lines[2].startswith(f"  first alarm {live._clock(clock.t - 5)}, 9 s after the switch")
    assert lines[3].startswith("  detectors in order: input, act1 +5 s, class_mix +5 s")
    assert "accuracy (labels known): clean digits 97 %, inverted digits 14 %" in summary
    assert lines[-1] == "  report: /tmp/run/build/report/index.html"


def test_colour_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert live.wants_colour(Tty()) and not live.wants_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not live.wants_colour(Tty())
    plain, _, _ = frames(colour=False)
    coloured, _, _ = frames(colour=True)
    assert "\x1b[" not in "".join(plain)
    assert "\x1b[1m\x1b[31m" in coloured[4].splitlines()[1]
    assert [visible(s) for s in coloured] == plain


def test_layer_cells_far_from_the_reference_are_marked() -> None:
    shots, _, _ = frames()
    text = shots[-1]
    assert "fleet average over the last 1m (a step shows here slowly); * far from the " in text
    table = text.split("  layers: ", 1)[1].split("    detector ", 1)[0].splitlines()
    (act1,) = (line for line in table if line.strip().startswith("act1 "))
    # mean 4.8 against 4.7 and min/max near theirs: unmarked; std 1234567 against 2.0: marked.
    cells = act1.split()[1:]
    assert cells[0] == "4.800" and cells[2] == "-17.060" and cells[3] == "19.100", cells
    assert cells[1].endswith("*"), cells
    # Layers the profile has no value for are never marked.
    (other,) = (line for line in table if line.strip().startswith("input "))
    assert "*" not in other
    assert live.far_from_reference(0.5, 0.1) and not live.far_from_reference(0.2, 0.1)
    assert not live.far_from_reference(float("nan"), 1.0)


def test_file_traffic_sends_each_line_in_turn_and_checks_labelled_answers(
    tmp_path: Path,
) -> None:
    """`serve --traffic CLEAN.jsonl:SHIFTED.jsonl`: request bodies as the reference holds them;
    a line's label is taken off the body (a preprocess function takes the whole body) and
    compared with the answer's class, by name where the model names its classes."""
    from hookwatch._errors import ConfigError
    from hookwatch.tools.traffic import FileTraffic, read_bodies

    clean, shifted = tmp_path / "clean.jsonl", tmp_path / "shifted.jsonl"
    clean.write_text('{"data": [1], "label": 1}\n\n{"data": [2], "label": 0}\n')
    shifted.write_text('{"data": [9]}\n')
    bodies, other = read_bodies(clean), read_bodies(shifted)
    loop = FileTraffic(FakeStack(), bodies, other, labels=["cat", "dog"])  # type: ignore[arg-type]
    assert loop.request(0, False) == ({"data": [1]}, "dog")
    assert loop.request(3, False) == ({"data": [2]}, "cat")
    assert loop.request(5, True) == ({"data": [9]}, None)
    assert loop.right({"class": "dog"}, "dog") and not loop.right({"class": "cat"}, "dog")
    assert (loop.clean_name, loop.shifted_name) == ("clean.jsonl", "shifted.jsonl")
    alone = FileTraffic(FakeStack(), bodies, None, drift_after_s=5)  # type: ignore[arg-type]
    assert alone.request(1, True) == ({"data": [2]}, 0)  # no shifted file: clean throughout
    (tmp_path / "bad.jsonl").write_text('{"data": [1]}\n{"data": \n')
    with pytest.raises(ConfigError, match=r"line 2 of bad\.jsonl: expected a JSON request body"):
        read_bodies(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match=r"expected a readable \.jsonl file"):
        read_bodies(tmp_path / "none.jsonl")


def test_the_alerts_firing_are_shown_and_summed_up() -> None:
    # A critical alert fired in an outside run and neither the frames nor the summary said
    # so; the table's column of the anytime-valid test's warnings was headed "pages"
    # (2026-12-07).
    shots, summary, clock = frames()
    assert not any("alerts firing" in line for shot in shots[:-1] for line in shot.splitlines())
    last = shots[-1].splitlines()
    assert (
        "  alerts firing: HookwatchAccuracyDrop (critical: a page), HookwatchDriftWarning "
        "(warning)" in last
    ), last
    assert not any(line.rstrip().endswith(" pages") for line in last), last
    fired = next(line for line in summary.splitlines() if "alerts that fired" in line)
    assert f"HookwatchAccuracyDrop (critical) at {live._clock(clock.t)}" in fired, fired
    # Every one, over more lines where they need them (it said "1 more").
    assert "HookwatchDriftWarning (warning)" in summary, summary


def test_why_requests_are_refused_is_shown_and_summed_up() -> None:
    # An outside run sent bodies of the wrong shape: the view showed only a count of 400s and
    # the summary "0 answered, no detector alarmed", as if nothing had been wrong (2026-12-07).
    from hookwatch.tools.traffic import _refusal

    stack, clock, traffic = FakeStack(), Clock(), FakeTraffic()
    traffic.status = Counter[int]({400: 30})
    reply = {"code": 400, "expected": "shape [64]", "got": "shape [32]"}
    traffic.last_refusal = _refusal(400, reply)
    view = LiveView(stack, colour=False, clock=clock)
    frame = view.render(traffic).splitlines()
    assert "  refused  400: expected shape [64], got shape [32]" in frame, frame
    summary = view.summary(traffic).splitlines()
    assert (
        "  every request was refused: 400: expected shape [64], got shape [32] (nothing was "
        "monitored)" in summary
    ), summary
