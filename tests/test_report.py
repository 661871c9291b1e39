"""HTML report and plots: self-contained (embedded PNGs, no network references), every section
present, and (when /usr/bin/chromium exists) rendered by headless Chromium with the images drawn."""

import base64
import io
import re
import shutil
import subprocess

import matplotlib.image as mpimg
import numpy as np
import pytest

from scalelab.analysis.synthetic import SyntheticLaw, isoflop_design, write_synthetic_sweep

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from scalelab.cli.main import main

    root = tmp_path_factory.mktemp("rep")
    store = root / "sweep"
    design = isoflop_design([1e13, 1e14, 1e15])
    write_synthetic_sweep(store, design, SyntheticLaw(), seeds=[0, 1], tags={"arch": "base"})
    write_synthetic_sweep(store, design, SyntheticLaw(efficiency=1.5), seeds=[0, 1], tags={"arch": "new"})
    out = root / "report.html"
    assert main(["report", str(store), "-o", str(out), "--bootstrap", "10", "--compare-by", "arch"]) == 0
    return store, out


def test_report_is_self_contained_with_every_section(report):
    _, out = report
    text = out.read_text()
    for heading in (
        "Sweep summary",
        "Fit: chinchilla",
        "Backtest",
        "Warnings",
        "Proposed next round",
        "Evaluation noise",
        "Comparisons",
        "Plots",
    ):
        assert f">{heading}<" in text, heading
    assert "C = 6·N·D" in text  # the report says which FLOP count it used
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched from a network
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) >= 8
    for b64 in images:
        img = mpimg.imread(io.BytesIO(base64.b64decode(b64)), format="png")
        assert img.shape[0] > 100 and img.shape[1] > 100
        assert (img[..., :3] < 0.9).mean() > 0.01  # something is drawn, not a blank canvas
    assert "new over base" in text and "decide with bpb" in text


def test_plot_cli_kinds(report, tmp_path):
    from scalelab.cli.main import main

    store, _ = report
    for kind in ("curves", "noise", "sensitivity"):  # the fitted kinds are drawn by the report fixture
        out = tmp_path / f"{kind}.png"
        assert main(["plot", str(store), "--kind", kind, "-o", str(out), "--bootstrap", "0"]) == 0
        assert mpimg.imread(out).shape[0] > 100
    assert main(["plot", str(store / "nope"), "--kind", "isoflop", "-o", str(tmp_path / "x.png")]) == 2
    from scalelab.analysis.plots import KINDS
    from scalelab.cli.analysis_cmd import PLOT_KINDS

    assert PLOT_KINDS == KINDS + ("comparison",)


@pytest.mark.chromium
@pytest.mark.skipif(not shutil.which(CHROMIUM), reason="headless Chromium (/usr/bin/chromium) not installed")
def test_report_renders_in_headless_chromium(report, tmp_path):
    _, out = report
    shot = tmp_path / "shot.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1280,2000", f"file://{out}"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    img = mpimg.imread(shot)
    assert img.shape[:2] == (2000, 1280)
    ink = img[..., :3].mean(axis=-1) < 0.95  # anything drawn: text, tables, plots
    colored = np.abs(img[..., 0] - img[..., 2]) > 0.15  # plot colours, not black-on-white text
    assert ink.mean() > 0.03 and colored.mean() > 0.0005
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", f"file://{out}"], check=True, capture_output=True, timeout=120, text=True
    ).stdout
    assert dom.count('src="data:image/png;base64,') >= 8
