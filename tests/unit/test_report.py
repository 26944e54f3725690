"""`hookwatch report` against a scripted Prometheus (tests/fake_prometheus.py): the panels come
from the dashboards, the onset of drift is found and marked, and what cannot be drawn says why.

The real stack and real Chromium: tests/integration/test_report.py.
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
    # Traffic 2, drift 2, activation statistics 5.
    assert len(sources) == 9 and len(set(sources)) == 9
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
    assert len(written.images) == 8
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
