"""`hookwatch report` against a scripted Prometheus (tests/fake_prometheus.py): the panels come
from the dashboards, the onset of drift is found and marked, and what cannot be drawn says why.

The real stack and real Chromium: tests/integration/test_report.py.

These stay unit tests although the fake answers over HTTP: it is a test double, a thread of
this process on a loopback port, with no process, binary or network beyond 127.0.0.1, and it
answers at once (the slow tests spend their seconds drawing plots); the code under test is the
report's, and the HTTP client it uses is part of it. The tests that start processes are
tests/integration/test_report_stop.py.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hookwatch.tools import cli, dashboards
from hookwatch.tools.devstack import Ports, Stack
from hookwatch.tools.report import onset, panels, plot
from hookwatch.tools.report.build import ReportError, Window, Written, write_report
from hookwatch.tools.report.prometheus import PrometheusError, Series, parse_duration
from tests.fake_prometheus import FakePrometheus, Run, serving

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / dashboards.DASHBOARDS
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def report(tmp_path: Path, run: Run, **fake: Any) -> tuple[FakePrometheus, Written]:
    with serving(FakePrometheus(run, **fake)) as prometheus:
        written = write_report(prometheus.url, tmp_path / "report", DASHBOARDS)
    return prometheus, written


# -- the panels are the dashboards' ------------------------------------------------------------


def test_every_report_panel_comes_from_the_dashboards() -> None:
    boards = dashboards.load(DASHBOARDS)
    window = Window(0.0, 600.0, 5.0, 5.0)
    values = panels.variable_values(boards, "digits", window.intervals())
    refs = [ref for s in panels.SECTIONS for ref in s.panels]
    refs += [panels.PROFILE, panels.FIRST_ALARM, panels.SEQUENTIAL_ALARMS]
    for ref in refs:
        panel = panels.load_panel(boards, ref)
        for target in panel.targets:
            expr = dashboards.substitute(target.expr, values)
            assert '"digits"' in expr, (ref, expr)
            # Every label a panel is split by is one its queries group by.
            for label in ref.facet:
                assert re.search(rf"by \([^)]*\b{label}\b", expr), (ref, label, expr)


def test_a_renamed_panel_says_which_titles_there_are() -> None:
    boards = dashboards.load(DASHBOARDS)
    with pytest.raises(ValueError, match=r"expected one panel titled 'Nope' in drift\.json.*"):
        panels.load_panel(boards, panels.PanelRef("drift.json", "Nope"))


def test_references_and_thresholds_are_dashed_as_on_the_dashboard() -> None:
    panel = panels.load_panel(
        dashboards.load(DASHBOARDS), panels.PanelRef("activations.json", "Mean per layer")
    )
    assert panel.dashed("act1 reference")
    assert not panel.dashed("act1")
    assert panel.soft_limits() == (0.0, None)


def test_variables_show_the_whole_model() -> None:
    values = panels.variable_values(dashboards.load(DASHBOARDS), "digits", {})
    assert values["model"] == "digits"
    assert values["layer"] == values["level"] == ".*"


def test_legends_fill_grafana_templates_and_drop_the_facet() -> None:
    labels = {"layer": "act1"}
    assert panels.legend("{{layer}} reference", labels) == "act1 reference"
    assert panels.short_legend("act1 reference", ("act1",)) == "reference"
    assert panels.short_legend("act1", ("act1",)) == "live"
    assert panels.short_legend("confidence (prediction)", ("prediction", "confidence")) == "live"


# -- onset of drift ----------------------------------------------------------------------------


def series(detector: str, values: list[float], step: float = 5.0) -> Series:
    times = np.arange(len(values), dtype=np.float64) * step + 1000.0
    return Series({"detector": detector}, times, np.array(values, dtype=np.float64))


def test_onset_is_the_first_alarm_of_either_test_and_names_all_at_that_time() -> None:
    first = [series("input", [0, 0, 1, 1]), series("act1", [0, 0, 0, 1])]
    sequential = [series("act2", [0, 0, 0.7, 0]), series("act3", [np.nan, 0, 0, 2])]
    found = onset.find_onset(first, sequential)
    assert found == onset.Onset(1010.0, ("act2", "input"))
    # The anytime-valid test alone can be first.
    assert onset.find_onset([series("input", [0, 0, 0, 1])], [series("act2", [0, 1, 0, 0])]) == (
        onset.Onset(1005.0, ("act2",))
    )


def test_no_alarm_no_onset() -> None:
    quiet = [series("input", [0, 0, np.nan, 0])]
    assert onset.find_onset(quiet, quiet) is None
    assert onset.alarm_spans(quiet, 5.0) == ()


def test_alarm_spans_split_where_no_detector_alarms() -> None:
    first = [series("input", [1, 1, 0, 0, 0, 1]), series("act1", [0, 1, 1, 0, 0, 0])]
    assert onset.alarm_spans(first, 5.0) == ((1000.0, 1010.0), (1025.0, 1025.0))


# -- the report --------------------------------------------------------------------------------


def test_the_report_draws_every_section_and_marks_where_drift_started(tmp_path: Path) -> None:
    run = Run()
    prometheus, written = report(tmp_path, run)
    index = tmp_path / "report" / "index.html"
    assert written.index == index
    page = index.read_text()
    sources = re.findall(r'<img src="([^"]+)"', page)
    # Drift 3, traffic 2, activation statistics 5 (no accuracy estimate: left out).
    assert len(sources) == 10 and len(set(sources)) == 10
    for source in sources:
        assert "/" not in source  # beside index.html: the directory can move
        width, height = png_size(index.parent / source)
        assert width > 900 and height > 150, (source, width, height)
    found = written.onset
    assert found is not None and found.detectors == ("act2", "input")
    assert 0 <= found.time - run.onset < 5.0 + 1e-6  # on the 5 s grid
    assert "digits" in page and prometheus.url in page
    assert "first to alarm: act2, input" in page
    # The time range is the run's ten minutes (and a step or two), not the hour looked at.
    minutes = re.search(r"\((\d+\.\d) min, one point per 5 s\)", page)
    assert minutes is not None and 10.0 <= float(minutes[1]) <= 10.4, page[:2000]


def test_no_alarm_says_so(tmp_path: Path) -> None:
    _, written = report(tmp_path, Run(drifts=False))
    assert written.onset is None
    assert "no detector alarmed in this time range" in (tmp_path / "report/index.html").read_text()


def test_a_model_without_a_profile_gets_a_note_instead_of_drift_plots(tmp_path: Path) -> None:
    prometheus, written = report(tmp_path, Run(profile=False))
    page = (tmp_path / "report/index.html").read_text()
    assert "no drift profile loaded" in page
    assert "drift-scores" not in page
    assert len(written.images) == 7
    assert not any("first_alarm" in q for q in prometheus.queries)


def test_a_panel_without_data_says_so_and_stale_images_go(tmp_path: Path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "old-plot.png").write_bytes(PNG_MAGIC)
    missing = ("hookwatch_requests_sampled_total", "hookwatch_captures_dropped_total")
    _, written = report(tmp_path, Run(missing=missing))
    assert not (out / "old-plot.png").exists()
    assert not (out / "traffic-captures-sampled-and-dropped.png").exists()
    assert len(written.images) == 9
    page = (out / "index.html").read_text()
    assert (
        '<h3>Captures sampled and dropped</h3><p class="empty">no data in this time range' in page
    )


def test_no_samples_of_the_model_is_an_error(tmp_path: Path) -> None:
    run = Run(end=datetime(2020, 1, 1, tzinfo=UTC).timestamp())  # long before the last hour
    with pytest.raises(ReportError, match=r"expected samples of count\(hookwatch_requests_total"):
        report(tmp_path, run)
    assert not (tmp_path / "report").exists()


def test_a_model_prometheus_does_not_know_lists_the_ones_it_does(tmp_path: Path) -> None:
    with (
        serving(FakePrometheus(Run(), models=("digits", "other"))) as fake,
        pytest.raises(
            ReportError, match=r"expected samples of model 'nope'.*\['digits', 'other'\]"
        ),
    ):
        write_report(fake.url, tmp_path, DASHBOARDS, model="nope")


def test_several_models_need_one_picked(tmp_path: Path) -> None:
    with (
        serving(FakePrometheus(Run(), models=("digits", "other"))) as fake,
        pytest.raises(ReportError, match="pick one with --model"),
    ):
        write_report(fake.url, tmp_path, DASHBOARDS)


def test_a_refused_query_says_what_prometheus_said(tmp_path: Path) -> None:
    with pytest.raises(PrometheusError, match="HTTP 400: 1:1: parse error"):
        report(tmp_path, Run(), refuse=400)


def test_unreachable_prometheus_says_where_it_looked(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(PrometheusError, match=f"expected Prometheus at {url}, got no answer"):
        write_report(url, tmp_path, DASHBOARDS)


def test_no_dashboards_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="expected Grafana dashboards"):
        write_report("http://127.0.0.1:1", tmp_path, tmp_path)


def test_durations_and_ticks() -> None:
    assert parse_duration("5s") == 5 and parse_duration("1m30s") == 90
    with pytest.raises(ValueError, match="expected a Prometheus duration"):
        parse_duration("5 s")
    start = datetime(2024, 5, 1, 12, 0, 7, tzinfo=UTC).timestamp()
    ticks = plot.time_ticks(start, start + 170, UTC, 6)
    # Every 30 s on the clock, from the first one after the start.
    assert [datetime.fromtimestamp(t, UTC).strftime("%M:%S") for t in ticks] == [
        "00:30", "01:00", "01:30", "02:00", "02:30",
    ]  # fmt: skip


# -- `hookwatch run` / `serve` on stop -----------------------------------------------------------


def test_a_report_that_fails_on_stop_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = dataclasses.replace(Ports.free(), prometheus=closed_port())
    stack = Stack(root=ROOT, run_dir=tmp_path, ports=ports)
    cli._final_report(stack, tmp_path / "report", 5.0)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("report not written: expected Prometheus at")
    assert len(lines) == 2  # "writing the report ..." and why it was not


class LookbackPrometheus:
    """Range queries as Prometheus answers them: at the grid's points only, each seeing the
    last scrape at or before it within the 5-minute lookback."""

    url = "http://127.0.0.1:9"

    def __init__(self, scrapes: list[float]) -> None:
        self.scrapes = scrapes

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        grid = np.arange(start, end + 1e-9, step)
        seen = [t for t in grid if any(t - 300 <= s <= t for s in self.scrapes)]
        return [Series({}, np.array(seen), np.ones(len(seen)))] if seen else []


def test_a_run_stopped_seconds_after_its_first_scrape_is_reported() -> None:
    from hookwatch.tools.report.build import sample_window

    # The report is asked at 1000.0 for the last 78 s (a run of 18 s, a minute of margin);
    # the only scrape came at 998.0, after the last point of a 5 s grid counted from 922.
    client = LookbackPrometheus([998.0])
    window = sample_window(client, "digits", 922.0, 1000.0, 5.0, None, None)  # type: ignore[arg-type]
    assert window.start <= 998.0 <= window.end
    seen = client.query_range("x", window.start, window.end, window.step)
    assert seen and seen[0].times.size >= 1, "the drawn grid must see the run's one scrape"


# -- what happened: the summary at the top, alarms and scales on the plots ----------------------


def test_the_summary_says_what_happened_first(tmp_path: Path) -> None:
    from hookwatch.tools.report.story import Client

    run = Run(estimate=True, sequential=("act2", "input"))
    client = Client(run.onset - 5, "inverted digits", 0.97, 0.03)
    with serving(FakePrometheus(run)) as fake:
        written = write_report(fake.url, tmp_path / "report", DASHBOARDS, client=client)
    said = " ".join(written.summary)
    assert re.search(r"The traffic switched to inverted digits at \S+, 30\d s into the range", said)
    assert re.search(
        r"Drift started at \S+, \d+ s after the switch: first to alarm act2 and input", said
    )
    assert "In the same step act1 and confidence went past their thresholds." in said
    assert (
        "At their peak, scores over thresholds: act1 15x, act2 15x, confidence 15x and input 15x"
        in said
    )
    assert (
        "The per-worker anytime-valid test, which warns, alarmed 2 times: 1 for act2 and 1 "
        "for input." in said
    )
    assert "right 97 % of the time before the switch and 3 % after it" in said
    assert (
        "(the fleet's estimate, over 5 minutes: it lags), accuracy went from 95 % before to "
        "30 % at the end" in said
    )
    assert "(the reference's accuracy: 97 %)" in said
    # The alerts that reached a person (a critical one in an outside run was in no summary).
    assert re.search(r"Prometheus fired HookwatchAccuracyDrop \(critical: a page\) at \S+\.", said)
    page = written.index.read_text()
    # The paragraph comes straight after the title, before the details and every plot.
    assert re.search(r"<h1>hookwatch report: digits</h1>\n<p id=\"summary\">The traffic", page)
    assert page.index('id="summary"') < page.index("<dl>") < page.index("<img")
    # The estimate, present here, is drawn in the drift section.
    assert "drift-estimated-accuracy-against-the-reference.png" in page
    # Reader's captions, not the dashboards' PromQL notes.
    assert "never rate() it" not in page and "_sum" not in page


def test_without_a_client_the_summary_counts_from_the_start_of_the_range(tmp_path: Path) -> None:
    run = Run()
    _, written = report(tmp_path, run)
    said = " ".join(written.summary)
    assert re.search(r"Drift started at \S+, 3[01]\d s into the range: first to alarm", said), said
    quiet = report(tmp_path / "quiet", Run(drifts=False))[1]
    assert quiet.summary[0].startswith("No detector alarmed between")
    none = report(tmp_path / "none", Run(profile=False))[1]
    assert none.summary == (
        "No drift profile was loaded: the model served without drift detection.",
    )


def test_anytime_valid_alarms_are_counted_from_the_counters_resets_included() -> None:
    from hookwatch.tools.report.story import page_times

    counter = series("input", [0, 0, 1, 1, 3, np.nan, 1, 1])
    times, counts = page_times([counter, series("act1", [0, 0, 0, 0, 0, 0, 0, 0])])
    assert times == {"input": (1010.0, 1020.0, 1030.0)} and counts == {"input": 4}


def test_alarms_are_marked_where_the_plot_shows_their_detector() -> None:
    from matplotlib.figure import Figure

    marks = onset.Alarms(None, (), {"input": (1.0, 2.0), "act1": (2.0, 3.0)})
    drawn = {}
    for detector in ("input", "act2", None):
        ax = Figure().subplots()
        plot._mark_pages(ax, marks, detector, label=True)
        drawn[detector] = [list(line.get_xdata()) for line in ax.lines]
    assert drawn == {"input": [[1.0, 2.0]], "act2": [], None: [[1.0, 2.0, 3.0]]}


def test_log_scale_where_values_span_orders_of_magnitude() -> None:
    assert plot.log_scale(np.array([1.65, 1.0, 414.8, np.nan])) == ("log",)
    assert plot.log_scale(np.array([0.0, 0.5, 9.0, 120.0])) == ("symlog",)
    assert plot.log_scale(np.array([1.65, 0.9, 30.0])) is None
    assert plot.log_scale(np.array([-17.0, 0.01, 19.0])) is None  # logits: linear
    assert plot.log_scale(np.array([0.0, 0.0])) is None


def test_the_estimate_says_its_lowest_after_the_switch_where_it_recovered() -> None:
    # An outside run sent a few clean requests after the shifted ones: the summary said the
    # accuracy "went from 91 % before to 100 % at the end", as if nothing had happened.
    from types import SimpleNamespace

    import numpy as np

    from hookwatch.tools.report.story import _estimate

    series = SimpleNamespace(
        times=np.arange(10.0), values=np.array([0.9, 0.92, 0.91, 0.9, 0.5, 0.32, 0.4, 0.7, 1, 1])
    )
    story = SimpleNamespace(estimate=series, reference_accuracy=None)
    said = _estimate(story, 4.0, UTC)  # type: ignore[arg-type]
    assert "went from 90 % before, 32 % at its lowest after the switch, to 100 % at the end" in said
    series.values = np.array([0.9, 0.92, 0.91, 0.9, 0.5, 0.32, 0.3, 0.3, 0.3, 0.3])
    assert "before to 30 % at the end" in _estimate(story, 4.0, UTC)  # type: ignore[arg-type]
