"""The study section of the report: a study's arms, its multiplier, its ledger and decision accuracy.

    parts, figs = study_sections(Path("results/studies/study-arch"), runs)

For a sweep whose spec has `study:` arms (scalelab.sweeps.studies.study_spec), `scalelab report` shows this
in place of the single-law sections (one law fitted over every arm would mix them): each arm's fit
(the loop's: parameters with intervals, gates, backtest), m(C) of each arm over the baseline at
every budget and at the target with the gap predicted there and the verdict
(scalelab.sweeps.studies.study_fit), the ledger of predicted against measured gaps at the target
(scalelab.store.ledger), the decision-accuracy table (scalelab.analysis.decision_accuracy), and
two figures: the frontiers per arm, and m(C) with its band and the target.
"""

from __future__ import annotations

import html
from pathlib import Path

import polars as pl

from scalelab.analysis.decision_accuracy import METHOD_TEXT, METHODS, decision_accuracy
from scalelab.analysis.report_html import html_table, img
from scalelab.analysis.study_plots import plot_study_frontiers, plot_study_multiplier
from scalelab.fitting.comparisons.comparison import ESTIMATOR_TEXT, PARTS
from scalelab.store import ledger
from scalelab.sweeps.studies.study_fit import fit_study
from scalelab.sweeps.studies.study_text import parts_text


def _iv(iv) -> str:
    return f"[{iv[0]:.4g}, {iv[1]:.4g}]"


def study_sections(store: Path, runs: pl.DataFrame, *, n_boot: int | None = None, seed: int = 0):
    """(HTML parts, figures) of the study section (module docstring)."""
    sf = fit_study(store, replicates=n_boot, seed=seed, runs=runs)
    level = sf.options.level
    pct = f"{100 * level:.0f}%"
    parts = [
        "<h2>Study</h2>",
        f'<p class="muted">arms {", ".join(html.escape(a) for a in sf.study.names)}; baseline '
        f"{html.escape(sf.study.baseline)}; target {sf.study.target_flops:.3g} FLOPs; each arm fitted the loop's "
        "way (scalelab.sweeps.studies.study_fit)</p>",
    ]
    rows = []
    for name, arm in sf.arms.items():
        f = arm.fit
        holdout = f.backtest.get("holdout", {})
        rows.append(
            [
                name,
                arm.n_runs,
                "pass" if arm.passed else "FAIL " + ",".join(f.gates.failed if f.gates else []),
                ", ".join(f"{k}={v:.4g} {_iv(f.intervals[k])}" for k, v in f.params.items() if k in f.intervals),
                f"{100 * holdout['mare']:.2f}%" if "mare" in holdout else "n/a",
            ]
        )
    parts.append(html_table(["arm", "runs", "gates", f"parameters ({pct} interval)", "holdout MARE"], rows, left=4))
    figs = [img(plot_study_frontiers(sf, runs), "Frontier L*(C) per arm, runs and the target's runs")]
    for c in sf.comparisons:
        parts.append(f"<h3>{html.escape(c.arm)} over {html.escape(c.baseline)}</h3>")
        rows = [[b, m, _iv(iv)] for b, m, iv in zip(c.budgets, c.multipliers, c.intervals)]
        rows.append([f"{c.target_flops:.3g} (target)", c.multiplier_at_target, _iv(c.target_interval)])
        parts.append(html_table(["budget C", "multiplier m(C)", f"{pct} interval"], rows))
        loss_rows = [
            [a, n, d, p.point, _iv((p.lo, p.hi))] for a, pts in c.runs.items() for (n, d), p in zip(pts, c.losses[a])
        ]
        parts.append(html_table(["at the target", "N", "D", "predicted loss", f"{pct} interval"], loss_rows, left=1))
        parts.append(_gaps_table(c, pct))
        parts.append(f'<div class="{"ok" if c.decided else "warn"}">{html.escape(c.verdict)}</div>')
        figs.append(img(plot_study_multiplier(c), f"Multiplier of {c.arm} over {c.baseline}"))
    parts.append(_ledger_table(store))
    parts.append(_decisions_table(store, runs))
    return parts, figs


def _gaps_table(c, pct: str) -> str:
    """Every estimator's gap at the decisive measurement (and between the frontiers), with its parts."""
    views = [("the verdict's", c.gap)]
    if c.paired is not None:
        views += [("between the frontiers", c.paired.frontier)]
        if c.paired.joint_matched is not None:
            views += [("joint law", c.paired.joint_matched), ("joint law, frontiers", c.paired.joint_frontier)]
    if c.estimator != "separate":
        views += [("each arm's own law", c.separate_gap)]
    rows = [[what, ESTIMATOR_TEXT[g.estimator], g.point, _iv((g.lo, g.hi)), parts_text(g)] for what, g in views]
    cols = [f"gap L_{c.arm} - L_{c.baseline}", "estimator", "point", f"{pct} interval", "sds (loss units)"]
    return html_table(cols, rows, left=2) + "".join(
        f'<p class="muted">{html.escape(name)}: {html.escape(text)}</p>' for name, text in PARTS[c.estimator].items()
    )


def _ledger_table(store: Path) -> str:
    entries = ledger.scored(store)["studies"]  # a report reads the store, never writes it
    if not entries:
        return '<p class="muted">No study prediction in the ledger yet (<code>scalelab sweep next</code>).</p>'
    rows = []
    for e in entries:
        rows.append(
            [
                e["round"],
                e["arm"],
                e["baseline"],
                e["target_flops"],
                e.get("estimator", "separate"),
                e["predicted_gap"],
                _iv(e["interval"]),
                "yes" if e["decided"] else "no",
                e["predicted_winner"],
                e["measured_gap"] if e.get("measured_gap") is not None else "pending",
                "" if e.get("measured_se") is None else e["measured_se"],
                e.get("measured_winner") or "",
                e.get("decision") or "",
                "" if e.get("covered") is None else ("yes" if e["covered"] else "NO"),
            ]
        )
    cols = ["round", "arm", "baseline", "C", "estimator", "predicted gap", "interval", "decided", "winner"]
    cols += ["measured gap (mean over pairs)", "its se", "measured winner", "decision", "covered"]
    return "<h3>Ledger: predicted against measured gaps at the target</h3>\n" + html_table(cols, rows, left=5)


def _decisions_table(store: Path, runs: pl.DataFrame) -> str:
    table = decision_accuracy(store, runs=runs)
    out = ["<h3>Decision accuracy</h3>"]
    if not table.truth:
        return out[0] + "".join(f'<p class="muted">{html.escape(n)}</p>' for n in table.notes)
    rows = [[b, *[table.cell(b, m).text(decisions=m in ("law", "paired")) for m in METHODS]] for b in table.budgets]
    out.append(
        '<p class="muted">how often the ranking at a smaller budget picks the arm that wins at the target, with '
        "Wilson 95% intervals: single-scale ranking (each shared design point; the best run of each arm) and "
        "the law-based predictions (each arm fitted on the budgets up to this one; the gap by each arm's law "
        "and by the paired gap model), with how many were decided and how many of those were wrong</p>"
    )
    out.append(html_table(["budget", *[METHOD_TEXT[m] for m in METHODS]], rows))
    for arm, gaps in table.truth.items():
        mean = sum(gaps.values()) / len(gaps)
        out.append(f'<p class="muted">truth: {html.escape(arm)} - baseline at the target = {mean:+.4f}</p>')
    return "\n".join(out)
