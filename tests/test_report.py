"""HTML report and plots: self-contained (embedded PNGs, no network references), every section
present, and the whole page rendered by headless Chromium with every image drawn (/usr/bin/chromium:
scripts/install.sh dev installs it; without it the test skips, and fails under CI=true).

A closed-loop store as the demo leaves one (law auto, a `sweep next` round whose proposed run has
finished, its ledger, a plan under it): the report's numbers are the ledger's and the fit's, it names
the law that made them, and its sections and plots say what they show."""

import base64
import html
import io
import json
import os
import re
from html.parser import HTMLParser

import matplotlib.image as mpimg
import polars as pl
import pytest
from chromium_check import render_and_check

from scalelab.analysis.report_loop import proposal_section
from scalelab.analysis.synthetic import SyntheticLaw, isoflop_design, launch_synthetic, write_synthetic_sweep
from scalelab.cli.main import main
from scalelab.store.ledger import scored
from scalelab.sweeps.closed_loop.propose import propose_next


@pytest.fixture(scope="module")
def report(tmp_path_factory):
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
def test_report_renders_in_headless_chromium(report, tmp_path):
    """The whole page, at its full height, rendered: every embedded image decoded and drawn where the
    layout put it, text and tables throughout (chromium_check.render_and_check)."""
    _, out = report
    render_and_check(out, tmp_path, min_images=8)


def test_isoflop_size_axis_labels_do_not_collide():
    """The demo's IsoFLOP plot spans 19k..369k parameters with one decade tick inside: matplotlib then
    labels every minor tick (2x10^4, 3x10^4, 4x10^4, ...), and neighbours overlapped. Short labels on
    chosen ticks (plots.readable_log_axis) must not touch."""
    from scalelab.analysis.plots import plot_isoflop

    sizes = [18512, 29304, 60640, 114000, 29304, 47264, 114000, 201152, 47264, 86256, 197232, 369360]
    budgets = [2e11] * 4 + [6.3e11] * 4 + [2e12] * 4
    loss = [1.79, 1.74, 1.79, 1.94, 1.64, 1.57, 1.62, 1.73, 1.48, 1.46, 1.49, 1.56]
    fig = plot_isoflop(pl.DataFrame({"params": sizes, "flops": budgets, "loss": loss}))
    fig.canvas.draw()
    _assert_labels_apart(fig.axes[0])


def _assert_labels_apart(ax) -> None:
    """The tick labels shown on the x axis (major and minor) do not touch."""
    lo, hi = sorted(ax.get_xlim())
    shown = [t for t in ax.get_xticklabels(minor=False) + ax.get_xticklabels(minor=True)
             if t.get_text() and lo <= t.get_position()[0] <= hi]  # fmt: skip
    boxes = sorted((t.get_window_extent() for t in shown), key=lambda b: b.x0)
    assert len(boxes) >= 2
    for a, b in zip(boxes, boxes[1:]):
        assert a.x1 < b.x0, [t.get_text() for t in shown]


LOOP_SPEC = {
    "name": "loop",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "recipe": {"min_steps": 50, "shape": {"min_layers": 2, "width_per_layer": 16, "min_width": 16}},
    "isoflop": {"budgets": [1e11, 3e11, 1e12], "num_sizes": 4, "center": {"tokens_per_param": 5}, "span": 3},
    "fit": {"law": "auto", "bootstrap": 8},
}  # sizes 20k..550k: one decade tick (1e5) on the N axes, where matplotlib labels every minor tick


@pytest.fixture(scope="module")
def loop_report(tmp_path_factory):
    """The demo's kind of store, trained by the synthetic law: the sweep, `sweep next`'s round 1, its
    proposed run finished after the fit, a plan under plans/, and the report of it all."""
    root = tmp_path_factory.mktemp("loop")
    sd = root / "sweep"
    launch_synthetic(LOOP_SPEC, sd, SyntheticLaw(), noise_std=0.003)
    propose_next(sd, target_flops=3e12, budget_flops=3e12, replicates=8, log=lambda m: None)
    launch_synthetic(sd / "rounds" / "round_1.yaml", sd, SyntheticLaw(), noise_std=0.003)
    plan = ["plan-run", str(sd), "--flops", "1e13", "--gpu", "H100-SXM", "--gpus", "1", "--scale", "none"]
    assert main(plan) == 0
    out = root / "report.html"
    assert main(["report", str(sd), "-o", str(out)]) == 0
    return sd, out


class _Tables(HTMLParser):
    """Every table of a page as rows of cell texts, under the h2/h3 heading before it."""

    def __init__(self):
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.heading, self._in, self._text = "", None, ""

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "h3", "td", "th"):
            self._in, self._text = tag, ""
        elif tag == "table":
            self.tables.append((self.heading, []))
        elif tag == "tr":
            self.tables[-1][1].append([])

    def handle_endtag(self, tag):
        if tag in ("h2", "h3") and self._in == tag:
            self.heading = self._text.strip()
        elif tag in ("td", "th") and self._in == tag:
            self.tables[-1][1][-1].append(self._text.strip())
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in:
            self._text += data


def _tables(text: str) -> dict[str, list[list[list[str]]]]:
    parser = _Tables()
    parser.feed(text)
    out: dict[str, list] = {}
    for heading, rows in parser.tables:
        out.setdefault(heading, []).append(rows)
    return out


def _g4(x: float) -> str:
    return f"{x:.4g}"


def test_report_numbers_are_the_ledgers_and_the_fits(loop_report):
    """Every parameter, interval, backtest and ledger number in the page, against the files it was made from."""
    sd, out = loop_report
    text = out.read_text()
    tables = _tables(text)
    record = json.loads((sd / "fits" / "round_1.json").read_text())["fit"]
    heading = next(h for h in tables if h.startswith("Fit: "))
    assert heading.startswith("Fit: auto: the stacked law (chinchilla") and "the parameters of chinchilla" in heading
    params = {r[0]: r[1:] for r in tables[heading][0][1:]}
    for name, value in record["params"].items():
        lo, hi = record["intervals"][name]
        assert params[name][:3] == [_g4(value), _g4(lo), _g4(hi)], name
        assert params[name][3], f"{name}: no 'what it is'"
    assert params["a"][0] == _g4(record["a"]) and "beta / (alpha + beta)" in params["a"][3]
    backtests = {r[0]: r[1:] for r in tables["Backtest"][0][1:]}
    assert set(backtests) == {"holdout", "leave_one_budget_out"}  # every protocol, as the demo prints
    for protocol, bt in record["backtest"].items():
        assert backtests[protocol][:2] == [f"{100 * bt['mare']:.2f}%", f"{100 * bt['bias']:+.2f}%"]
    book = scored(sd)  # the report scores the ledger in memory (a report never writes the store)
    fits_table, preds_table = tables["Ledger: predictions against measured runs"]
    assert [r[0] for r in fits_table[1:]] == [str(f["round"]) for f in book["fits"]]
    rows = {r[1]: r for r in preds_table[1:]}
    assert len(rows) == len(book["predictions"]) >= 1
    for p in book["predictions"]:
        row = rows[p["run_id"]]
        assert row[6] == _g4(p["predicted"]) and row[7] == f"[{p['interval'][0]:.4f}, {p['interval'][1]:.4f}]"
        assert row[8] == _g4(p["measured"]) and row[9] == f"{100 * p['rel_error']:+.2f}%"
    summary = {r[0]: r[1] for r in tables["Sweep summary"][0]}
    assert summary["seeds (train.seed)"] == "1: 0"  # a count, then the values
    note = re.search(r"Fitted on (\d+) runs: ([^<]*)", html.unescape(text))
    assert int(note.group(1)) == len(record["run_ids"]) and "((" not in note.group(2) and "), " not in note.group(2)
    assert "1 run(s) finished after it" in note.group(2)


def test_report_plan_section_says_what_each_row_is(loop_report):
    sd, out = loop_report
    tables = _tables(out.read_text())
    parts = tables["The loss interval, part by part"][0]
    assert parts[0][-1] == "what it is" and all(r[-1] for r in parts[1:]), [r[0] for r in parts if not r[-1]]
    (cost,) = tables["Cost"]
    assert all(all(cell for cell in row) for row in cost)  # no empty header row
    plan = json.loads(next((sd / "plans").glob("*/plan.json")).read_text())
    assert plan["points"]["loss"]  # a stacked fit's plan keeps the fitted runs, which its frontier draws
    mode = os.stat(out).st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # as the PNGs and any file the user writes, not the temporary file's 0600


@pytest.mark.chromium
def test_loop_report_renders_in_headless_chromium(loop_report, tmp_path):
    _, out = loop_report
    render_and_check(out, tmp_path, min_images=9)


def test_frontier_draws_the_runs_measured_after_the_fit(loop_report):
    from scalelab.analysis.lawfit import store_fit_from_record
    from scalelab.analysis.plots import plot_frontier
    from scalelab.analysis.store_reader import load_store_runs

    sd, _ = loop_report
    fit = store_fit_from_record(json.loads((sd / "fits" / "round_1.json").read_text())["fit"])
    runs = load_store_runs(sd).filter(pl.col("status") == "done")
    later = runs.filter(~pl.col("run_id").is_in(fit.run_id))
    assert later.height == 1  # the round's proposed run
    ax = plot_frontier(runs, fit).axes[0]
    drawn = [tuple(xy) for c in ax.collections for xy in c.get_offsets()]
    assert (pytest.approx(later["flops"][0]), pytest.approx(later["loss"][0])) in drawn
    assert "measured after the fit (not in it)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_sensitivity_joins_only_runs_of_one_size_and_token_count():
    from scalelab.analysis.plots import plot_sensitivity

    one_each = pl.DataFrame({"params": [1e5, 2e5, 4e5], "tokens": [1e6, 2e6, 4e6], "lr": [3e-3, 2e-3, 1e-3],
                             "loss": [3.0, 2.8, 2.7]})  # fmt: skip
    ax = plot_sensitivity(one_each, "lr").axes[0]
    assert all(line.get_linestyle() == "None" for line in ax.get_lines())  # points, no line through sizes
    assert "no sensitivity" in ax.get_title()
    swept = pl.DataFrame({"params": [1e5] * 3, "tokens": [1e6] * 3, "lr": [1e-3, 2e-3, 4e-3], "loss": [3.0, 2.9, 3.1]})
    ax = plot_sensitivity(swept, "lr").axes[0]
    assert any(line.get_linestyle() == "-" and len(line.get_xdata()) == 3 for line in ax.get_lines())


def test_plan_frontier_legend_leaves_the_band_alone(loop_report):
    from scalelab.analysis.plan_plots import plot_plan_frontier

    sd, _ = loop_report
    fig = plot_plan_frontier(json.loads(next((sd / "plans").glob("*/plan.json")).read_text()))
    fig.canvas.draw()
    legend, axes = fig.legends[0].get_window_extent(), fig.axes[0].get_window_extent()
    assert legend.y1 <= axes.y0 or legend.x0 >= axes.x1  # outside the axes, so it covers nothing drawn


def test_demo_figure_size_axis_labels_do_not_collide(loop_report):
    """The demo's figure had matplotlib's minor labels on N (2x10^4 3x10^4 4x10^4 6x10^4) run together."""
    from scalelab.analysis.plots import demo_figure

    sd, _ = loop_report
    saved = json.loads((sd / "fits" / "round_1.json").read_text())
    fig = demo_figure(sd, saved, measured=None)
    fig.canvas.draw()
    for ax in fig.axes:
        _assert_labels_apart(ax)


def test_the_proposed_round_is_the_latest_by_number(tmp_path):
    """fits/round_10.json is the latest round after round_9 (a sort by file name put round_9 last)."""
    (tmp_path / "fits").mkdir()
    for k in (1, 9, 10):
        proposal = {"kind": f"kind-of-round-{k}", "params": 1, "tokens": 2, "flops": 12.0, "predicted_loss": 3.0}
        saved = {"round": k, "fit": {"law": "chinchilla", "params": {"E": 1.7}}, "proposals": [proposal]}
        (tmp_path / "fits" / f"round_{k}.json").write_text(json.dumps(saved))
    html = proposal_section(tmp_path, fit=None)
    assert "fits/round_10.json" in html and "kind-of-round-10" in html, html
