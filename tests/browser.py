"""A page as a person sees it: real headless Chromium (Debian package ``chromium``) loads it
from disk, says which images loaded, and takes a screenshot whose pixels the tests read.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.image import imread

#: Records every image's state into the DOM once the page's load event has fired (it fires
#: after every image has loaded or failed), for --dump-dom to print.
IMAGE_CHECK = """<script>
window.addEventListener("load", () => {
  const rows = Array.from(document.images, (img) => ({
    src: img.getAttribute("src"),
    loaded: img.complete && img.naturalWidth > 0,
    width: img.naturalWidth,
  }));
  const out = document.createElement("pre");
  out.id = "image-check";
  out.textContent = JSON.stringify(rows);
  document.body.appendChild(out);
});
</script>"""


def _chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            binary,
            "--headless",
            # Containers run tests as root, where Chromium's sandbox cannot start.
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def image_states(binary: str, page: Path, profile: Path) -> list[dict[str, Any]]:
    """Every ``<img>`` of ``page`` after load: src, whether it loaded, natural width. Loads a
    copy of the page beside it (same relative paths) with IMAGE_CHECK added."""
    text = page.read_text()
    assert "</body>" in text, page
    probe = page.with_name(f".{page.stem}.image-check.html")
    probe.write_text(text.replace("</body>", IMAGE_CHECK + "</body>"))
    try:
        done = _chromium(
            binary, profile, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()
        )
    finally:
        probe.unlink()
    match = re.search(r'<pre id="image-check">(.*?)</pre>', done.stdout, re.S)
    assert match, f"the page's load event never fired:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    rows: list[dict[str, Any]] = json.loads(html.unescape(match[1]))
    return rows


@dataclass(frozen=True)
class Pixels:
    """What a screenshot shows, in shares of its pixels."""

    #: Anything but (near) white: text, axes, lines.
    ink: float
    #: Clearly coloured (not grey): plotted lines, the onset mark; text and frames are grey.
    colour: float
    #: Standard deviation of the grey levels (0 for a blank page).
    spread: float


def screenshot(binary: str, page: Path, out: Path, profile: Path, size: str) -> Pixels:
    done = _chromium(binary, profile, f"--window-size={size}", f"--screenshot={out}", page.as_uri())
    assert out.is_file(), f"no screenshot:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    rgb = np.asarray(imread(out), dtype=np.float64)[..., :3]  # PNG: floats in [0, 1]
    low, high = rgb.min(axis=-1), rgb.max(axis=-1)
    return Pixels(
        ink=float((low < 0.9).mean()),
        colour=float((high - low > 0.3).mean()),
        spread=float(rgb.mean(axis=-1).std()),
    )


#: Records where each element named in ``SELECTORS`` lies (CSS pixels from the top of the page)
#: and the viewport's size, once the page has loaded, for --dump-dom to print.
LAYOUT_CHECK = """<script>
window.addEventListener("load", () => {
  const rows = {};
  for (const selector of SELECTORS) {
    const element = document.querySelector(selector);
    if (element) {
      const box = element.getBoundingClientRect();
      rows[selector] = {top: box.top + window.scrollY, bottom: box.bottom + window.scrollY,
                        text: element.textContent.slice(0, 200)};
    }
  }
  rows["viewport"] = {width: window.innerWidth, height: window.innerHeight};
  const out = document.createElement("pre");
  out.id = "layout-check";
  out.textContent = JSON.stringify(rows);
  document.body.appendChild(out);
});
</script>"""


def layout(
    binary: str, page: Path, profile: Path, size: str, selectors: list[str]
) -> dict[str, Any]:
    """Where ``selectors``' first elements lie on ``page`` in a window of ``size`` (e.g.
    "1280,800"), as Chromium lays it out: {selector: {top, bottom, text}, "viewport": ...}."""
    text = page.read_text()
    script = LAYOUT_CHECK.replace("SELECTORS", json.dumps(selectors))
    probe = page.with_name(f".{page.stem}.layout-check.html")
    probe.write_text(text.replace("</body>", script + "</body>"))
    try:
        done = _chromium(
            binary,
            profile,
            f"--window-size={size}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe.as_uri(),
        )
    finally:
        probe.unlink()
    match = re.search(r'<pre id="layout-check">(.*?)</pre>', done.stdout, re.S)
    assert match, f"the page's load event never fired:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    rows: dict[str, Any] = json.loads(html.unescape(match[1]))
    return rows
