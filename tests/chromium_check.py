"""Render an HTML page in headless Chromium and check it was drawn: every embedded image decoded and
drawn where the layout put it, ink throughout (tests of the report and of the planning page)."""

import base64
import html
import io
import json
import os
import re
import shutil
import subprocess

import matplotlib.image as mpimg
import numpy as np
import pytest

CHROMIUM = "/usr/bin/chromium"

# Appended to a copy of the report: once everything is loaded, the page's height and where each
# image was laid out (page coordinates, CSS px = screenshot px at scale factor 1), and whether it decoded.
_PROBE = """<script>window.addEventListener("load", () => {
  const images = [...document.images].map((i) => {
    const r = i.getBoundingClientRect();
    return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height, i.complete && i.naturalWidth > 0];
  });
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({height: document.documentElement.scrollHeight, images});
  document.body.appendChild(out);
});</script>"""


def _chromium_or_fail() -> str:
    """The browser, or a skip on a developer machine without it; under CI=true a failure (CI installs
    it: scripts/install.sh dev), so the browser test is never silently skipped there."""
    if shutil.which(CHROMIUM):
        return CHROMIUM
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{CHROMIUM} not installed under CI=true: run scripts/install.sh dev as root (apt-get chromium)")
    pytest.skip(f"headless Chromium ({CHROMIUM}) not installed")


def render_and_check(out, tmp_path, *, min_images: int):
    """The whole page, at its full height, rendered: every embedded image decoded and drawn where the
    layout put it, text and tables throughout. Returns the screenshot's path."""
    chromium = _chromium_or_fail()
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    probed = tmp_path / "probed.html"
    probed.write_text(out.read_text().replace("</body>", _PROBE + "</body>"))
    dom = subprocess.run(
        [chromium, *flags, "--window-size=1280,1000", "--dump-dom", f"file://{probed}"],
        check=True,
        capture_output=True,
        timeout=120,
        text=True,
    ).stdout
    probe = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    height, images = int(probe["height"]), probe["images"]
    assert dom.count('src="data:image/png;base64,') >= min_images and len(images) >= min_images
    assert all(decoded for *_, decoded in images), images

    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, *flags, f"--window-size=1280,{height}", f"--screenshot={shot}", f"file://{out}"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    img = mpimg.imread(shot)
    assert img.shape[:2] == (height, 1280)  # the whole page, not its top
    ink = img[..., :3].mean(axis=-1) < 0.95  # anything drawn: text, tables, plots
    colored = np.abs(img[..., 0] - img[..., 2]) > 0.15  # plot colours, not black-on-white text
    assert colored.mean() > 0.0005
    sources = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', out.read_text())
    assert len(sources) == len(images)
    for (x, y, w, h, _), b64 in zip(images, sources):  # each image drawn where it was laid out
        want = (mpimg.imread(io.BytesIO(base64.b64decode(b64)), format="png")[..., :3].mean(axis=-1) < 0.95).mean()
        got = ink[int(y) : int(y + h), int(x) : int(x + w)].mean()
        assert h > 100 and 0.5 < got / want < 2.0, ((x, y, w, h), got, want)  # scaled, so not pixel-equal
    assert max(y + h for _, y, _, h, _ in images) > 0.6 * height  # images reach the lower part of the page
    bands = np.array_split(ink, max(1, height // 500))  # no blank stretch: ink in every 500 px band
    assert all(band.mean() > 0.002 for band in bands), [round(float(b.mean()), 4) for b in bands]
    return shot
