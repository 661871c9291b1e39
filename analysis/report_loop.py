"""The closed loop's sections of the report: the law fit, the identification gates, the proposed round, the ledger.

The fit is the loop's (scalelab.sweeps.closed_loop.store_fit, the one fit entry with the spec's options): the
latest `sweep next` round's own fit when the store has rounds, else the same fit made on the
store's done runs.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import polars as pl

from scalelab.analysis.plots import _frontier, _optimum
from scalelab.analysis.report_html import html_table
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.saved_fit import load_saved_fit
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.forms.fit_terms import law_formula, law_heading, meaning, stacked_note
from scalelab.store.ledger import coverage, scored
from scalelab.store.paths import SweepLayout
from scalelab.sweeps.closed_loop.store_fit import MIN_LOOP_RUNS, fit_options, fit_store, store_fit_spec


def loop_fit(
    store: Path,
    runs: pl.DataFrame,
    note: str,
    *,
    law: str | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    latest_round: bool = True,
) -> tuple[dict, str, FitOptions]:
    """(loop-fit record, note, options): the latest `sweep next` round's own fit, or the same fit of
    `runs` (scalelab.sweeps.closed_loop.store_fit: the options `sweep next` fits with, unless `law` / `n_boot`)."""
    options = fit_options(store_fit_spec(store), law=law, bootstrap=n_boot, seed=seed)
    rounds = SweepLayout(store).round_fits() if store.is_dir() else []
    for path in rounds[-1:] if latest_round else []:
        saved = load_saved_fit(path)
        if saved.form != "round" or saved.points is None:
            break
        record = saved.record
        used = set(saved.run_ids)
        later = [r for r in runs["run_id"].to_list() if r not in used]
        note = f"the fit `sweep next` made in {path.stem.replace('_', ' ')} and proposed from"
        if later:
            note += (
                f". {len(later)} run(s) finished after it and are not in it (the round's own proposals among "
                "them); `scalelab sweep next` refits with them"
            )
        return record, note, options
    fit, _ = fit_store(store, options, runs=runs, min_runs=MIN_LOOP_RUNS)
    return fit.to_record(), note, options


def fit_section(fit, note: str, record: dict, level: float = 0.95) -> str:
    """The fit: which law made its numbers, its parameters (each with what it is), every backtest, the warnings."""
    law = fit.law_object()
    rows = []
    intervals = record.get("intervals") or {}
    for name in law.param_names:
        lo, hi = (intervals.get(name) or [math.nan, math.nan])[:2]
        rows.append([name, fit.params[name], float(lo), float(hi), meaning(law.name, name)])
    if record.get("a") is not None and "a" in intervals:
        rows.append(["a", record["a"], *intervals["a"], meaning(law.name, "a")])
    spread = (
        f"{len(fit.draws)} bootstrap refits over runs give the {100 * level:.0f}% percentile intervals."
        if len(fit.draws)
        else f"{100 * level:.0f}% delta-method intervals (no bootstrap replicates)."
    )
    out = [
        f"<h2>Fit: {html.escape(law_heading(record))}</h2>",
        f'<p class="muted">Fitted on {len(fit.loss)} runs: {html.escape(note)}. Huber loss on log loss '
        f"(scalelab.fitting); {spread}</p>",
    ]
    if stacked_note(record):
        out.append(f'<p class="muted">{html.escape(stacked_note(record))}</p>')
    if law_formula(law.name):
        out.append(f'<p class="muted">{html.escape(law.name)}: {html.escape(law_formula(law.name))}</p>')
    out.append(html_table(["parameter", "estimate", "lower", "upper", "what it is"], rows, left_cols=(4,)))
    if law.name == "chinchilla":
        a, b = fit.params["alpha"], fit.params["beta"]
        out.append(f'<p class="muted">compute-optimal N* ∝ C^{b / (a + b):.3f}, D* ∝ C^{a / (a + b):.3f}</p>')
    ext = record.get("extrapolation") or {}
    if ext.get("per_decade") is not None:
        out.append(
            f'<p class="muted">out-of-sample error {100 * ext["per_decade"]:.2f}% per decade of extrapolation '
            f"(RMS over {ext['n_runs']} backtest runs that extrapolate); prediction intervals add it, scaled to "
            "their distance, to the bootstrap spread and the run noise</p>"
        )
    out += backtest_section(record.get("backtest") or {})
    bt = fit.backtest
    warns = list(fit.warnings) + (bt.get("warnings", []) if bt else [])
    out.append("<h2>Warnings</h2>")
    out.extend(f'<div class="warn">{html.escape(w)}</div>' for w in warns)
    if not warns:
        out.append('<div class="ok">none</div>')
    return "\n".join(out)


BACKTEST_MEANING = {
    "holdout": "fit the smaller budgets, predict the largest",
    "leave_one_budget_out": "fit all budgets but one, predict it; once per budget",
}


def backtest_section(backtests: dict) -> list[str]:
    """Every backtest protocol of the fit (the holdout and leave-one-budget-out rows `sweep next` and the
    demo print), a skipped one with its reason."""
    if not backtests:
        return []
    rows = []
    for protocol, bt in backtests.items():
        what = BACKTEST_MEANING.get(protocol, "")
        if "mare" not in bt:
            rows.append([protocol, "skipped", "", "", "", "", bt.get("skipped", what)])
            continue
        rows.append(
            [
                protocol,
                f"{100 * bt['mare']:.2f}%",
                f"{100 * bt['bias']:+.2f}%",
                bt["n_train"],
                bt["n_test"],
                bt["extrapolation_decades"],
                what,
            ]
        )
    head = ["protocol", "MARE", "bias", "train runs", "test runs", "extrapolation (decades)", "what it is"]
    return ["<h2>Backtest</h2>", html_table(head, rows, left_cols=(6,))]


def proposal_section(store: Path, fit, level: float = 0.95) -> str:
    out = ["<h2>Proposed next round</h2>"]
    rounds = SweepLayout(store).round_fits() if store.is_dir() else []
    for path in rounds[-1:]:  # the latest round by its number (round_10 after round_9)
        props = (load_saved_fit(path).round or {}).get("proposals") or []
        if props:
            out.append(
                f'<p class="muted">from {html.escape(str(path.relative_to(store)))} '
                "(written by <code>scalelab sweep next</code>)</p>"
            )
            rows = [
                [
                    p.get("kind", ""),
                    p.get("params"),
                    p.get("tokens"),
                    p.get("flops"),
                    p.get("predicted_loss"),
                    str([round(x, 4) for x in p.get("predicted_interval") or []]),
                ]
                for p in props
            ]
            out.append(html_table(["kind", "N", "D", "C", "predicted loss", "interval"], rows))
            return "\n".join(out)

    c_next = float(fit.flops.max() * 3)
    n, d = _optimum(fit, fit.params, c_next)
    loss = float(_frontier(fit, fit.params, np.array([c_next]))[0])
    ls = [_frontier(fit, p, np.array([c_next]))[0] for p in fit.draw_dicts()]
    iv = percentile_interval(ls, level)
    out.append(
        '<p class="muted">No <code>scalelab sweep next</code> proposal in this store; the fit\'s '
        "compute-optimal run at 3x the largest budget:</p>"
    )
    out.append(
        html_table(
            ["C", "N*", "D*", "D*/N*", "predicted loss", f"{100 * level:.0f}% interval"],
            [[c_next, n, d, d / n, loss, f"[{iv[0]:.4g}, {iv[1]:.4g}]"]],
        )
    )
    return "\n".join(out)


def gates_section(record: dict) -> str:
    gates = record.get("gates")
    if not gates:
        return ""
    out = ["<h2>Identification gates</h2>"]
    verdict = (
        "every gate passes: the law may be extrapolated"
        if gates["passed"]
        else ("failed: " + ", ".join(gates["failed"]) + " — no compute-optimal run is proposed from this fit")
    )
    out.append(f'<div class="{"ok" if gates["passed"] else "warn"}">{html.escape(verdict)}</div>')
    rows = [[g["name"], "pass" if g["passed"] else "FAIL", g["value"], g["threshold"]] for g in gates["gates"]]
    out.append(html_table(["gate", "result", "value", "passes when"], rows, left=4))
    rows = []
    for b in gates["brackets"]:
        iv = b.get("vertex_interval")
        rows.append(
            [
                b["flops"],
                ", ".join(f"{s:,.0f}" for s in b["sizes"]),
                b["best_size"],
                b["vertex"] if b["vertex"] is not None else math.nan,
                f"[{iv[0]:.3g}, {iv[1]:.3g}]" if iv else "n/a",
                "yes" if b["bracketed"] else f"no ({b['edge'] or ('flat' if b['flat'] else 'vertex outside')})",
            ]
        )
    out.append(html_table(["budget C", "sizes N", "best N", "Approach 2 vertex", "vertex interval", "bracketed"], rows))
    return "\n".join(out)


def ledger_section(store: Path) -> str:
    if not SweepLayout(store).ledger.exists():
        return ""
    book = scored(store)  # a report reads the store, never writes it
    out = ["<h2>Ledger: predictions against measured runs</h2>"]
    rows = []
    for f in book["fits"]:
        g = f.get("gates") or {}
        drift = ", ".join(f"{k} moved outside the previous interval" for k in (f.get("drift") or {}))
        rows.append(
            [
                f["round"],
                len(f.get("run_ids", [])),
                "pass" if g.get("passed") else "FAIL " + ",".join(g.get("failed", [])),
                ", ".join(f"{k}={v:.4g}" for k, v in f["params"].items()),
                drift or "none",
            ]
        )
    out.append(html_table(["round", "runs", "gates", "parameters", "drift"], rows, left=5))
    rows = []
    for p in book["predictions"]:
        lo, hi = p["interval"]
        rows.append(
            [
                p["round"],
                p["run_id"],
                p["kind"],
                p["params"],
                p["tokens"],
                p["flops"],
                p["predicted"],
                f"[{lo:.4f}, {hi:.4f}]",
                p["measured"] if p.get("measured") is not None else "pending",
                f"{100 * p['rel_error']:+.2f}%" if p.get("rel_error") is not None else "",
                "" if p.get("covered") is None else ("yes" if p["covered"] else "NO"),
            ]
        )
    out.append(
        html_table(
            ["round", "run", "kind", "N", "D", "C", "predicted", "interval", "measured", "error", "covered"],
            rows,
            left=3,
        )
    )
    c = coverage(book["predictions"])
    if c["n_scored"]:
        out.append(
            f'<p class="muted">coverage: {c["n_covered"]} of {c["n_scored"]} scored predictions inside their '
            f"interval ({100 * c['rate']:.0f}%); mean |error| {100 * c['mare']:.2f}%</p>"
        )
    return "\n".join(out)
