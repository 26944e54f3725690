"""`hookwatch report` from the real Prometheus of a real stack driven into drift, opened in real
headless Chromium: every image loads and the screenshot shows plots, not a blank page.

Chromium is the Debian package `chromium` (`make deps` installs it); missing, these tests skip
locally and fail under CI=true. The second test shows the browser check failing on a page
whose images do not load, so a pass means something.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hookwatch.tools import dashboards
from hookwatch.tools.demo.data import load_split
from hookwatch.tools.devstack import PORT_ENV, Ports, Stack
from hookwatch.tools.report.build import write_report
from tests import browser
from tests.conftest import ROOT, require_binary
from tests.fake_prometheus import FakePrometheus, Run, serving
from tests.integration.helpers import build_variant, demo_config, eventually

pytestmark = pytest.mark.integration

MODEL = "digits"
#: Small windows, every request sampled: drift verdicts after tens of requests.
MONITORING = {"sample_rate": 1.0, "drift": {"window": 50, "step": 10}}
#: Tall enough for the header, the traffic and the drift plots.
WINDOW = "1100,3000"
#: What a screenshot of the report's top must show at least. A page whose images all fail to
#: load measured ink 0.020, colour 0.0008, spread 0.078 at this size; the report of a
#: `hookwatch run` with drift ink 0.064, colour 0.012, spread 0.14.
MIN_INK, MIN_COLOUR, MIN_SPREAD = 0.04, 0.004, 0.1


def check_in_browser(chromium: str, index: Path, work: Path) -> list[str]:
    """What is wrong with ``index`` as Chromium shows it; empty when nothing is."""
    problems = []
    states = browser.image_states(chromium, index, work / "profile")
    expected = re.findall(r'<img src="([^"]+)"', index.read_text())
    if [s["src"] for s in states] != expected:
        problems.append(f"expected images {expected}, the browser saw {states}")
    problems += [f"image did not load: {s['src']}" for s in states if not s["loaded"]]
    shot = browser.screenshot(chromium, index, work / "screenshot.png", work / "profile", WINDOW)
    if shot.ink < MIN_INK or shot.colour < MIN_COLOUR or shot.spread < MIN_SPREAD:
        problems.append(f"the screenshot looks blank: {shot}")
    return problems


def test_report_of_a_drifting_stack_shows_its_plots_in_chromium(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    chromium = require_binary("chromium")
    require_binary("prometheus")
    store = tmp_path / "store"
    build_variant(store, demo_config(**MONITORING), profile=True)
    stack = make_stack("report", workers=2, model_store=store, scrape_interval="1s")
    began = time.time()
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()
    split = load_split()

    def scraping() -> None:
        ups = stack.query("up")
        assert len(ups) == 2 and all(r["value"][1] == "1" for r in ups), ups

    def send(images: Any) -> None:
        # Paced like a client (20/s), so the 1 s scrapes see clean digits, then inverted ones.
        for image in images:
            status, reply = stack.infer({"data": image.tolist()})
            assert status == 200, reply
            time.sleep(0.05)

    # Prometheus scrapes its first a few seconds after it is ready: traffic before that would
    # never show in the report.
    eventually(scraping, timeout=30)
    send(split.x_test[:150])
    eventually(
        lambda: stack.query(f'sum(hookwatch_drift_windows_total{{model="{MODEL}"}}) > 0'),
        timeout=30,
    )
    send(16 - split.x_test[150:300])  # inverted digits: far from the reference
    eventually(
        lambda: _assert(stack.query(f'max(hookwatch_drift_first_alarm{{model="{MODEL}"}}) == 1')),
        timeout=60,
    )
    visible = time.time()
    time.sleep(3)  # a few more scrapes after the alarm

    out = tmp_path / "html"  # the stack's run directory is tmp_path / "report"
    done = subprocess.run(
        [
            sys.executable, "-m", "hookwatch.tools.cli", "report",
            "--prometheus", f"http://127.0.0.1:{stack.ports.prometheus}",
            "--out", str(out), "--root", str(ROOT),
        ],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = (out / "index.html").read_text()
    # Drift 3 (4 with an accuracy estimate), traffic 2, statistics 5, units and classes 3.
    plots = 13 + ("estimated-accuracy" in page)
    assert f"({plots} plots) for {MODEL}: drift from " in done.stdout, done.stdout
    match = re.search(r"drift from \S+ \((\d+) s after the start of the range\)", page)
    assert match, page[:3000]
    problems = check_in_browser(chromium, out / "index.html", tmp_path)
    assert not problems, "\n".join(problems)
    # The onset lies inside the run, before the test saw the alarm (the range starts at the
    # first sample, after the stack started).
    assert 0 <= int(match[1]) <= visible - began, (match[0], visible - began)


def test_hookwatch_run_writes_the_report_when_its_time_is_up(tmp_path: Path) -> None:
    """`make run` in short: the demo with drift after 20 s, stopped by --seconds (RUN_SECONDS);
    the report is written before the stack stops, and its path printed."""
    require_binary("java")
    require_binary("prometheus")
    for name in ("monitoring", "models"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "config.properties", tmp_path / "config.properties")
    (tmp_path / "model_store").mkdir()
    (tmp_path / "model_store" / "digits.mar").symlink_to(ROOT / "model_store" / "digits.mar")
    ports = Ports.free()
    env = {**os.environ, **{PORT_ENV[f]: str(getattr(ports, f)) for f in PORT_ENV}}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    done = subprocess.run(
        [
            sys.executable, "-m", "hookwatch.tools.cli", "run", "--root", str(tmp_path),
            "--seconds", "50", "--drift-after", "20",
        ],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    index = tmp_path / "build" / "report" / "index.html"
    assert f"report: {index} (open it in a browser)" in done.stdout, done.stdout[-3000:]
    # Written before the stack stopped.
    assert done.stdout.index("report: ") < done.stdout.index("stopped TorchServe")
    page = index.read_text()
    assert len(re.findall(r'<img src="', page)) == 13 + ("estimated-accuracy" in page)
    # The summary knows when the traffic switched, and what the labelled answers said.
    assert re.search(r'<p id="summary">The traffic switched to inverted digits at ', page)
    assert "On labelled answers the model was right " in page
    # The run's own summary, after the report and before the stack stops.
    summary = done.stdout[done.stdout.index("run summary: ") :]
    assert re.search(r"first alarm \S+, \d+ s after the switch", summary), summary
    assert f"report: {index}" in summary and summary.index("stopped TorchServe") > 0


def _assert(result: list[dict[str, Any]]) -> None:
    assert result, "no detector alarmed yet"


def test_the_browser_check_fails_when_images_do_not_load(tmp_path: Path) -> None:
    chromium = require_binary("chromium")
    with serving(FakePrometheus(Run())) as fake:
        written = write_report(fake.url, tmp_path / "good", ROOT / dashboards.DASHBOARDS)
    assert check_in_browser(chromium, written.index, tmp_path) == []

    one = tmp_path / "one-broken"
    shutil.copytree(tmp_path / "good", one)
    first = written.images[0].name
    (one / first).unlink()
    assert check_in_browser(chromium, one / "index.html", tmp_path) == [
        f"image did not load: {first}"
    ]

    none = tmp_path / "none-load"
    shutil.copytree(tmp_path / "good", none)
    index = none / "index.html"
    index.write_text(index.read_text().replace('<img src="', '<img src="gone/'))
    problems = check_in_browser(chromium, index, tmp_path)
    assert len(problems) == len(written.images) + 1, problems
    assert problems[-1].startswith("the screenshot looks blank")


#: The first screen of a laptop: the answer must be on it without scrolling.
FIRST_SCREEN = "1280,800"


def test_the_first_screen_holds_the_header_and_what_happened(tmp_path: Path) -> None:
    """In a 1280x800 window, Chromium lays out the title and the whole summary paragraph
    above the fold, and the screenshot of that screen is not blank."""
    from hookwatch.tools.report.story import Client

    chromium = require_binary("chromium")
    run = Run(estimate=True, sequential=("act2", "input"))
    client = Client(run.onset - 5, "inverted digits", 0.97, 0.03)
    with serving(FakePrometheus(run)) as fake:
        written = write_report(
            fake.url, tmp_path / "r", ROOT / dashboards.DASHBOARDS, client=client
        )
    found = browser.layout(
        chromium, written.index, tmp_path / "profile", FIRST_SCREEN, ["h1", "#summary", "img"]
    )
    # Headless Chromium's window keeps ~140 px for its own bars, as a desktop browser does:
    # what is left is the first screen the page gets.
    height = found["viewport"]["height"]
    assert 600 <= height <= 800, found["viewport"]
    assert found["h1"]["text"] == "hookwatch report: digits"
    summary = found["#summary"]
    assert summary["text"].startswith("The traffic switched to inverted digits"), summary
    assert 0 < found["h1"]["bottom"] <= summary["top"] < summary["bottom"] <= height, found
    # The first plot starts on the first screen too (the answer's picture begins there).
    assert found["img"]["top"] < height, found
    shot = browser.screenshot(
        chromium, written.index, tmp_path / "first.png", tmp_path / "profile", FIRST_SCREEN
    )
    assert shot.ink > 0.03 and shot.spread > 0.1, shot
