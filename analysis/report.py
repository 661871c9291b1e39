"""One self-contained HTML report of a sweep store: `scalelab report DIR -o report.html`.

    path = write_report("results/iso", "report.html", compare_by="arch", n_boot=100)

Sections: the sweep summary (runs by status, sizes, budgets, the FLOP convention), the law fit with
bootstrap intervals, the hold-out-the-largest-budget backtest, warnings, the identification gates
with their values and each budget's bracketing, the proposed next round (from `scalelab sweep
next`'s fits/*.json when present, else the fit's compute-optimal run at 3x the largest budget), the
ledger of every round's predictions against the measured runs with the intervals' coverage, the
evaluation-noise table with its advice, comparisons (between tags of the
store, or against other stores), the runs planned from the sweep (`scalelab plan-run`'s plans under
DIR/plans/: scalelab.analysis.plan_page), and the plots. Images are PNGs embedded as base64 data URIs and
the CSS is inline: the file opens offline, from anywhere, with no network access.

The fit is the closed loop's (scalelab.sweeps.closed_loop.store_fit: the one fit entry, with the options of the
spec's `fit:` section unless --law/--bootstrap say otherwise): in a sweep with `sweep next` rounds
it is the latest round's fit itself, read from fits/round_K.json (runs finished after it are
named, not silently refitted); otherwise the same fit made on the store's done runs. A study (a
spec with `study:` arms) gets its own section instead (scalelab.analysis.report_study): each arm's
fit, m(C) with its band and the target, the ledger of predicted vs measured gaps, decision accuracy.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

import numpy as np
import polars as pl

from scalelab.analysis import plots
from scalelab.analysis.compare import _fmt_iv, compare_sweeps, split_by_tag
from scalelab.analysis.lawfit import store_fit_from_record
from scalelab.analysis.noise import noise_table, recommendations
from scalelab.analysis.plan_page import plan_section
from scalelab.analysis.report_html import CSS, html_table, img, write_page
from scalelab.analysis.report_loop import fit_section, gates_section, ledger_section, loop_fit, proposal_section
from scalelab.analysis.report_study import study_sections
from scalelab.analysis.store_reader import load_evals, load_metrics, load_store_runs
from scalelab.errors import UsageError
from scalelab.fitting.estimate.approaches import group_budgets
from scalelab.planning.plan_files import read_plans
from scalelab.store import objects
from scalelab.sweeps.studies.study_propose import is_study


def _summary(runs_all: pl.DataFrame, runs: pl.DataFrame, store: str | Path) -> str:
    counts = runs_all.group_by("status").len().sort("status")
    status = ", ".join(f"{s}: {n}" for s, n in zip(counts["status"], counts["len"]))
    sizes = sorted(set(runs["params"].to_list()))

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
        ["seeds (train.seed)", f"{len(seeds)}: {', '.join(map(str, seeds))}" if seeds else "n/a"],
        ["FLOP convention", "C = 6·N·D with N = total parameters (flops_exact kept in the store)"],
        ["loss", "final validation loss (nats/token), else final train loss"],
    ]
    body = "".join(f'<tr><th class="l">{html.escape(k)}</th><td class="l">{html.escape(v)}</td></tr>' for k, v in rows)
    return f"<h2>Sweep summary</h2><table>{body}</table>"


def _noise_section(runs: pl.DataFrame) -> tuple[str, object | None]:
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
    out = ["<h2>Evaluation noise</h2>", html_table(cols, rows, left=2)]
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
            html_table(cols, rows, left=5),
            f'<div class="{"warn" if flagged else "ok"}">{note}</div>',
        ]
    )


def _comparison_section(cmps: list) -> str:
    if not cmps:
        return ""
    out = ["<h2>Comparisons</h2>"]
    for cmp in cmps:
        rows = [[c, m, _fmt_iv(iv)] for c, m, iv in zip(cmp.budgets, cmp.multipliers, cmp.intervals)]
        rows.append([f"{cmp.target_flops:.3g} (target)", cmp.multiplier_at_target, _fmt_iv(cmp.target_interval)])
        out.append(f"<h3>{html.escape(cmp.b.name)} over {html.escape(cmp.a.name)}</h3>")
        out.append(html_table(["budget C", "multiplier", f"{100 * cmp.level:.0f}% interval"], rows))
        out.append(f'<div class="{"ok" if cmp.target_interval[0] > 1 else "warn"}">{html.escape(cmp.verdict)}</div>')
    return "\n".join(out)


def _fit_figures(fit_runs: pl.DataFrame, fit, runs: pl.DataFrame) -> list[str]:
    """The fit's plots, the loss curves (when the runs have metrics) and the sensitivity to each
    hyperparameter the runs vary."""
    figs = [
        img(plots.plot_isoflop(fit_runs, fit), "IsoFLOP curves with fitted parabolas and minima"),
        img(plots.plot_frontier(fit_runs, fit), _frontier_caption(fit_runs, fit)),
        img(plots.plot_allocation(fit), "Compute-optimal N*(C) and D*(C) with intervals", width=860),
        img(plots.plot_residuals(fit), "Residuals of the fit"),
        img(plots.plot_backtest(fit), "Backtest: predicted vs actual", width=440),
    ]
    try:
        metrics = load_metrics(runs)
        figs.append(img(plots.plot_loss_curves(runs, metrics, x="flops"), "Loss curves vs FLOPs"))
    except UsageError:
        pass
    for hp in ("lr", "global_batch_tokens"):
        if hp in runs.columns and runs[hp].n_unique() > 1:
            caption = (
                f"Sensitivity to {hp}: loss against {hp} among runs of one size and token count"
                if plots.sensitivity_swept(runs, hp)
                else f"{hp}: one value per size and token count (set by the recipe): points, not a sensitivity"
            )
            figs.append(img(plots.plot_sensitivity(runs, hp), caption))
    return figs


def _frontier_caption(runs: pl.DataFrame, fit) -> str:
    later = plots.runs_after_fit(runs, fit).height
    after = f", and the {later} run(s) measured after the fit" if later else ""
    head = f"Compute frontier L*(C) of the {fit.law} fit with its band, the fitted runs"
    return f"{head}, the backtest's held-out runs{after}"


def _comparisons(store: Path, runs: pl.DataFrame, groups: dict, compare_with: list[str], **kw) -> list:
    """The first tag value's runs against every other value's, then this store against each other
    store (`kw`: compare_sweeps' law, n_boot, target_flops, seed)."""
    cmps = []
    if groups:
        names = list(groups)
        for other in names[1:]:
            cmps.append(compare_sweeps(groups[names[0]], groups[other], names=(names[0], other), **kw))
    for other in compare_with:
        other_runs = load_store_runs(other)
        cmps.append(compare_sweeps(runs, other_runs, names=(store.name, Path(other).name), **kw))
    return cmps


def build_report(
    store: str | Path,
    *,
    law: str | None = None,
    n_boot: int | None = None,
    compare_by: str | None = None,
    compare_with: list[str] | None = None,
    target_flops: float | None = None,
    seed: int = 0,
) -> str:
    """The report's HTML text (see module docstring). `law`, `n_boot`: the fit's, when not the spec's
    (scalelab.fitting.entry.fit_options.fit_options)."""
    shown = store  # an s3:// store is read from a local copy of its records
    store = objects.local_view(store, "STORE") if objects.is_url(store) else Path(store)
    runs_all = load_store_runs(store, done_only=False)
    runs = runs_all.filter(pl.col("status") == "done")
    if runs.height == 0:
        raise UsageError(f"{store} holds no finished runs")
    if is_study(store):  # one law over every arm would mix them: the study's own sections instead
        return _study_report(store, shown, runs_all, runs, n_boot=n_boot, seed=seed)
    groups = split_by_tag(runs, compare_by) if compare_by else {}
    fit_runs, fit_note = runs, "all done runs"
    if groups:  # one law per side: the headline fit is the first value's runs (the baseline)
        first = next(iter(groups))
        fit_runs, fit_note = groups[first], f"the runs with {compare_by}={first}"
    record, fit_note, options = loop_fit(
        store, fit_runs, fit_note, law=law, n_boot=n_boot, seed=seed, latest_round=not groups
    )
    fit = store_fit_from_record(record)
    law, n_boot = fit.law, options.bootstrap  # the comparisons fit the headline fit's law
    parts = [
        f"<h1>scalelab report: {html.escape(store.name)}</h1>",
        f'<p class="muted">generated {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}</p>',
        _summary(runs_all, runs, shown),
        fit_section(fit, fit_note, record, record.get("level", options.level)),
        gates_section(record),
        proposal_section(store, fit, record.get("level", options.level)),
        ledger_section(store),
        *(plan_section(p) for p in (read_plans(store) if store.is_dir() else [])),
    ]
    figs = _fit_figures(fit_runs, fit, runs)
    noise_html, table = _noise_section(runs)
    if table is not None and table.height:
        figs.append(img(plots.plot_noise(table), "Signal-to-noise ratio per metric"))
    kw = dict(law=law, n_boot=n_boot, target_flops=target_flops, seed=seed)
    cmps = _comparisons(store, runs, groups, compare_with or [], **kw)
    for cmp in cmps:
        figs.append(img(plots.plot_comparison(cmp), f"Multiplier of {cmp.b.name} over {cmp.a.name}"))
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


def _study_report(store: Path, shown, runs_all: pl.DataFrame, runs: pl.DataFrame, *, n_boot, seed) -> str:
    """A study's report: the summary, the study section (scalelab.analysis.report_study), the loss curves."""
    parts, figs = study_sections(store, runs_all, n_boot=n_boot, seed=seed)
    try:
        figs.append(img(plots.plot_loss_curves(runs, load_metrics(runs), x="flops"), "Loss curves vs FLOPs"))
    except UsageError:
        pass
    body = "\n".join(
        [
            f"<h1>scalelab report: {html.escape(store.name)} (study)</h1>",
            f'<p class="muted">generated {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}</p>',
            _summary(runs_all, runs, shown),
            *parts,
            "<h2>Plots</h2>",
            f'<div class="grid">{"".join(figs)}</div>',
        ]
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>scalelab report: '
        f"{html.escape(store.name)}</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def write_report(store: str | Path, out: str | Path, **kwargs) -> Path:
    return write_page(out, build_report(store, **kwargs))
