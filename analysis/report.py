"""One self-contained HTML report of a sweep store: `scalelab report DIR -o report.html`.

    path = write_report("results/iso", "report.html", compare_by="arch", n_boot=100)

Sections: the sweep summary (runs by status, sizes, budgets, the FLOP convention), the law fit with
bootstrap intervals, the hold-out-the-largest-budget backtest, warnings, the identification gates
with their values and each budget's bracketing, the proposed next round (from `scalelab sweep
next`'s fits/*.json when present, else the fit's compute-optimal run at 3x the largest budget), the
ledger of every round's predictions against the measured runs with the intervals' coverage, the
evaluation-noise table with its advice, comparisons (between tags of the
store, or against other stores), and the plots. Images are PNGs embedded as base64 data URIs and
the CSS is inline: the file opens offline, from anywhere, with no network access.

The fit is the closed loop's (scalelab.fitting.loopfit): in a sweep with `sweep next` rounds it is
the latest round's fit itself, read from fits/round_K.json (runs finished after it are named, not
silently refitted); otherwise the same fit made on the store's done runs.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import time
from pathlib import Path

import numpy as np
import polars as pl

from scalelab.errors import UsageError
from scalelab.train import storage

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;color:#222}
h1{font-size:24px;margin-bottom:4px} h2{font-size:19px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} .muted{color:#777;font-size:12px}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:6px 10px;margin:6px 0;font-size:13px}
.ok{background:#eaf7ea;border-left:4px solid #3a3;padding:6px 10px;margin:6px 0;font-size:13px}
.grid{display:flex;flex-wrap:wrap;gap:10px} figure{margin:0} img{max-width:100%;border:1px solid #eee}
figcaption{font-size:12px;color:#555}
"""


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _img(fig, caption: str, width: int = 560) -> str:
    return (
        f'<figure><img alt="{html.escape(caption)}" width="{width}" src="data:image/png;base64,{_png(fig)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _table(header: list[str], rows: list[list], left: int = 1) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{html.escape(str(h))}</th>' for i, h in enumerate(header))
    body = []
    for r in rows:
        tds = "".join(f'<td class="{"l" if i < left else ""}">{html.escape(_fmt(v))}</td>' for i, v in enumerate(r))
        body.append(f"<tr>{tds}</tr>")
    return f"<table><tr>{th}</tr>{''.join(body)}</table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if math.isinf(v):
            return "inf"
        return f"{v:.4g}"
    return str(v)


def _summary(runs_all: pl.DataFrame, runs: pl.DataFrame, store: str | Path) -> str:
    counts = runs_all.group_by("status").len().sort("status")
    status = ", ".join(f"{s}: {n}" for s, n in zip(counts["status"], counts["len"]))
    sizes = sorted(set(runs["params"].to_list()))
    from scalelab.fitting.approaches import group_budgets

    flops = runs["flops"].cast(pl.Float64).to_numpy()
    groups = group_budgets(flops)
    budgets = sorted(float(np.median(flops[groups == g])) for g in np.unique(groups))
    seeds = sorted(set(runs["seed"].to_list())) if "seed" in runs.columns else []
    rows = [
        ["store", str(store)],
        ["runs", f"{runs_all.height} ({status})"],
        ["model sizes N (total params)", ", ".join(f"{n:.3g}" for n in sizes)],
        ["compute budgets C", ", ".join(f"{c:.3g}" for c in budgets)],
        ["tokens D", f"{runs['tokens'].min():.3g} .. {runs['tokens'].max():.3g}"],
        ["seeds", ", ".join(map(str, seeds)) or "n/a"],
        ["FLOP convention", "C = 6·N·D with N = total parameters (flops_exact kept in the store)"],
        ["loss", "final validation loss (nats/token), else final train loss"],
    ]
    body = "".join(f'<tr><th class="l">{html.escape(k)}</th><td class="l">{html.escape(v)}</td></tr>' for k, v in rows)
    return f"<h2>Sweep summary</h2><table>{body}</table>"


def _loop_fit(store: Path, runs: pl.DataFrame, note: str, *, law: str, n_boot: int, seed: int, latest_round: bool):
    """(loop-fit record, note): the latest `sweep next` round's own fit, or the same fit of `runs`."""
    from scalelab.fitting.loopfit import fit_for_loop

    rounds = sorted(store.glob("fits/round_*.json"), key=lambda p: int(p.stem.split("_")[1])) if store.is_dir() else []
    for path in rounds[-1:] if latest_round else []:
        saved = json.loads(path.read_text())
        record = saved.get("fit")
        if not record or "points" not in record:
            break
        used = set(record.get("run_ids", []))
        later = [r for r in runs["run_id"].to_list() if r not in used]
        note = f"the fit of {path.stem} (what `sweep next` proposed from), {len(used)} runs"
        if later:
            note += (
                f"; {len(later)} run(s) finished after it and are not in it (the round's own proposals among "
                "them): `scalelab sweep next` refits with them"
            )
        return record, note
    df = runs.filter(pl.col("loss").is_not_null() & pl.col("params").is_not_null())
    if df.height < 6:
        raise UsageError(f"{df.height} runs with a loss; a law fit needs at least 6")
    flops = df["flops"].cast(pl.Float64).to_numpy()
    if "flops_budget" in df.columns and df["flops_budget"].dtype.is_numeric():
        label = df["flops_budget"].cast(pl.Float64).to_numpy()
        flops = np.where(np.isfinite(label), label, flops)
    lf = fit_for_loop(
        params=df["params"].to_numpy(),
        tokens=df["tokens"].to_numpy(),
        loss=df["loss"].to_numpy(),
        budgets=flops,
        law=law,
        replicates=n_boot,
        seed=seed,
        run_ids=df["run_id"].to_list(),
    )
    return lf.to_dict(), note


def _fit_section(fit, note: str, record: dict, level: float = 0.95) -> str:
    law = fit.law_object()
    rows = []
    intervals = record.get("intervals") or {}
    for name in law.param_names:
        lo, hi = (intervals.get(name) or [math.nan, math.nan])[:2]
        rows.append([name, fit.params[name], float(lo), float(hi)])
    if record.get("a") is not None and "a" in intervals:
        rows.append(["a = beta/(alpha+beta)", record["a"], *intervals["a"]])
    out = [
        f"<h2>Fit: {html.escape(fit.law)}</h2>",
        f'<p class="muted">{len(fit.loss)} runs ({html.escape(note)}); Huber on log loss (scalelab.fitting); '
        f"{len(fit.draws)} bootstrap refits over runs give the {100 * level:.0f}% percentile intervals.</p>",
        _table(["parameter", "estimate", "lower", "upper"], rows),
    ]
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
    bt = fit.backtest
    if bt:
        out.append("<h2>Backtest</h2>")
        out.append(
            _table(
                ["protocol", "MARE", "bias", "train runs", "test runs", "extrapolation (decades)"],
                [
                    [
                        bt["protocol"],
                        f"{100 * bt['mare']:.2f}%",
                        f"{100 * bt['bias']:+.2f}%",
                        bt["n_train"],
                        bt["n_test"],
                        bt["extrapolation_decades"],
                    ]
                ],
            )
        )
    warns = list(fit.warnings) + (bt.get("warnings", []) if bt else [])
    out.append("<h2>Warnings</h2>")
    out.extend(f'<div class="warn">{html.escape(w)}</div>' for w in warns)
    if not warns:
        out.append('<div class="ok">none</div>')
    return "\n".join(out)


def _proposal_section(store: Path, fit) -> str:
    out = ["<h2>Proposed next round</h2>"]
    fits = sorted(store.glob("fits/*.json")) if store.is_dir() else []
    for path in fits[-1:]:
        try:
            saved = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        props = saved.get("proposals") or []
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
            out.append(_table(["kind", "N", "D", "C", "predicted loss", "interval"], rows))
            return "\n".join(out)
    from scalelab.analysis.plots import _frontier, _optimum

    c_next = float(fit.flops.max() * 3)
    n, d = _optimum(fit, fit.params, c_next)
    loss = float(_frontier(fit, fit.params, np.array([c_next]))[0])
    if len(fit.draws):
        ls = np.array([_frontier(fit, p, np.array([c_next]))[0] for p in fit.draw_dicts()])
        iv = [float(x) for x in np.quantile(ls, [0.025, 0.975])]
    else:
        iv = [math.nan, math.nan]
    out.append(
        '<p class="muted">No <code>scalelab sweep next</code> proposal in this store; the fit\'s '
        "compute-optimal run at 3x the largest budget:</p>"
    )
    out.append(
        _table(
            ["C", "N*", "D*", "D*/N*", "predicted loss", "95% interval"],
            [[c_next, n, d, d / n, loss, f"[{iv[0]:.4g}, {iv[1]:.4g}]"]],
        )
    )
    return "\n".join(out)


def _gates_section(record: dict) -> str:
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
    out.append(_table(["gate", "result", "value", "passes when"], rows, left=4))
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
    out.append(_table(["budget C", "sizes N", "best N", "Approach 2 vertex", "vertex interval", "bracketed"], rows))
    return "\n".join(out)


def _ledger_section(store: Path) -> str:
    from scalelab.sweeps.ledger import coverage, read_ledger, score

    if not (store / "ledger.json").exists():
        return ""
    score(store)
    book = read_ledger(store)
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
    out.append(_table(["round", "runs", "gates", "parameters", "drift"], rows, left=5))
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
        _table(
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


def _noise_section(runs: pl.DataFrame) -> tuple[str, object | None]:
    from scalelab.analysis.noise import noise_table, recommendations
    from scalelab.analysis.store import load_evals

    try:
        table = noise_table(runs, load_evals(runs))
    except UsageError as e:
        return f'<h2>Evaluation noise</h2><div class="warn">{html.escape(str(e))}</div>', None
    cols = [
        "task",
        "metric",
        "n_runs",
        "mean",
        "signal",
        "seed_std",
        "ckpt_std",
        "eval_se",
        "noise_source",
        "snr",
        "tau",
        "decision_acc",
    ]
    rows = [[r[c] for c in cols] for r in table.iter_rows(named=True)]
    notes = recommendations(table)
    out = ["<h2>Evaluation noise</h2>", _table(cols, rows, left=2)]
    out.extend(f'<div class="{"warn" if "do not rank" in n else "ok"}">{html.escape(n)}</div>' for n in notes)
    return "\n".join(out), table


def _eval_invariance_section(runs: pl.DataFrame) -> str:
    """Eval-parity results found in the runs (RUN/eval_parity/step_N/summary.json), when any."""
    rows, flagged = [], 0
    for run_dir in runs["run_dir"].drop_nulls().to_list() if "run_dir" in runs.columns else []:
        for path in sorted(Path(run_dir).glob("eval_parity/*/summary.json")):
            summary = json.loads(path.read_text())
            for r in summary["rows"]:
                flagged += r["verdict"] in ("shifts", "flips ranking")
                iv = f"[{r['lo']:+.2e}, {r['hi']:+.2e}]"
                rows.append(
                    [Path(run_dir).name, path.parent.name, r["setup"], r["task"], r["metric"]]
                    + [r["shift"], iv, r["noise"], r["ratio"], r["verdict"]]
                )
    if not rows:
        return ""
    cols = [
        "run",
        "checkpoint",
        "setup",
        "task",
        "metric",
        "shift",
        "95% interval",
        "noise",
        "|shift|/noise",
        "verdict",
    ]
    note = (
        f"{flagged} setup(s) shift a score beyond the flagged fraction of its noise or flip a ranking"
        if flagged
        else "no setup shifts a score beyond the flagged fraction of its noise"
    )
    return "\n".join(
        [
            "<h2>Evaluation invariance</h2>",
            _table(cols, rows, left=5),
            f'<div class="{"warn" if flagged else "ok"}">{note}</div>',
        ]
    )


def _comparison_section(cmps: list) -> str:
    from scalelab.analysis.compare import _fmt_iv

    if not cmps:
        return ""
    out = ["<h2>Comparisons</h2>"]
    for cmp in cmps:
        rows = [[c, m, _fmt_iv(iv)] for c, m, iv in zip(cmp.budgets, cmp.multipliers, cmp.intervals)]
        rows.append([f"{cmp.target_flops:.3g} (target)", cmp.multiplier_at_target, _fmt_iv(cmp.target_interval)])
        out.append(f"<h3>{html.escape(cmp.b.name)} over {html.escape(cmp.a.name)}</h3>")
        out.append(_table(["budget C", "multiplier", f"{100 * cmp.level:.0f}% interval"], rows))
        out.append(f'<div class="{"ok" if cmp.target_interval[0] > 1 else "warn"}">{html.escape(cmp.verdict)}</div>')
    return "\n".join(out)


def build_report(
    store: str | Path,
    *,
    law: str = "chinchilla",
    n_boot: int = 100,
    compare_by: str | None = None,
    compare_with: list[str] | None = None,
    target_flops: float | None = None,
    seed: int = 0,
) -> str:
    """The report's HTML text (see module docstring)."""
    from scalelab.analysis import plots
    from scalelab.analysis.compare import compare_sweeps, split_by_tag
    from scalelab.analysis.lawfit import store_fit_from_record
    from scalelab.analysis.store import load_metrics, load_store_runs

    shown = store  # an s3:// store is read from a local copy of its records
    store = storage.local_view(store, "STORE") if storage.is_url(store) else Path(store)
    runs_all = load_store_runs(store, done_only=False)
    runs = runs_all.filter(pl.col("status") == "done")
    if runs.height == 0:
        raise UsageError(f"{store} holds no finished runs")
    groups = split_by_tag(runs, compare_by) if compare_by else {}
    fit_runs, fit_note = runs, "all done runs"
    if groups:  # one law per side: the headline fit is the first value's runs (the baseline)
        first = next(iter(groups))
        fit_runs, fit_note = groups[first], f"the runs with {compare_by}={first}"
    record, fit_note = _loop_fit(store, fit_runs, fit_note, law=law, n_boot=n_boot, seed=seed, latest_round=not groups)
    fit = store_fit_from_record(record)
    parts = [
        f"<h1>scalelab report: {html.escape(store.name)}</h1>",
        f'<p class="muted">generated {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}</p>',
        _summary(runs_all, runs, shown),
        _fit_section(fit, fit_note, record),
        _gates_section(record),
        _proposal_section(store, fit),
        _ledger_section(store),
    ]
    figs = [
        _img(plots.plot_isoflop(fit_runs, fit), "IsoFLOP curves with fitted parabolas and minima"),
        _img(plots.plot_frontier(fit_runs, fit), "Compute frontier, interval band and backtest points"),
        _img(plots.plot_allocation(fit), "Compute-optimal N*(C) and D*(C) with intervals", width=860),
        _img(plots.plot_residuals(fit), "Residuals of the fit"),
        _img(plots.plot_backtest(fit), "Backtest: predicted vs actual", width=440),
    ]
    try:
        metrics = load_metrics(runs)
        figs.append(_img(plots.plot_loss_curves(runs, metrics, x="flops"), "Loss curves vs FLOPs"))
    except UsageError:
        pass
    for hp in ("lr", "global_batch_tokens"):
        if hp in runs.columns and runs[hp].n_unique() > 1:
            figs.append(_img(plots.plot_sensitivity(runs, hp), f"Sensitivity to {hp} per size"))
    noise_html, table = _noise_section(runs)
    if table is not None and table.height:
        figs.append(_img(plots.plot_noise(table), "Signal-to-noise ratio per metric"))
    cmps = []
    if groups:
        names = list(groups)
        for other in names[1:]:
            cmps.append(
                compare_sweeps(
                    groups[names[0]],
                    groups[other],
                    names=(names[0], other),
                    law=law,
                    n_boot=n_boot,
                    target_flops=target_flops,
                    seed=seed,
                )
            )
    for other in compare_with or []:
        other_runs = load_store_runs(other)
        cmps.append(
            compare_sweeps(
                runs,
                other_runs,
                names=(store.name, Path(other).name),
                law=law,
                n_boot=n_boot,
                target_flops=target_flops,
                seed=seed,
            )
        )
    for cmp in cmps:
        figs.append(_img(plots.plot_comparison(cmp), f"Multiplier of {cmp.b.name} over {cmp.a.name}"))
    parts += [
        noise_html,
        _eval_invariance_section(runs),
        _comparison_section(cmps),
        "<h2>Plots</h2>",
        f'<div class="grid">{"".join(figs)}</div>',
    ]
    body = "\n".join(p for p in parts if p)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>scalelab report: '
        f"{html.escape(store.name)}</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def write_report(store: str | Path, out: str | Path, **kwargs) -> Path:
    from scalelab.train.records import atomic_write_bytes

    text = build_report(store, **kwargs)
    out = Path(out)
    atomic_write_bytes(out, text.encode("utf-8"))
    return out
