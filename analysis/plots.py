"""Plots of a sweep, its fits, comparisons and evaluation noise (matplotlib, Agg backend).

Every function draws into `ax` (or a new figure) and returns the Figure, so they compose into
reports and notebooks alike:

    fig = plot_isoflop(runs, fit)                  fig = plot_frontier(runs, fit)
    fig = plot_loss_curves(runs, metrics, x="flops")
    fig = plot_allocation(fit)                     fig = plot_residuals(fit)
    fig = plot_backtest(fit)                       fig = plot_sensitivity(runs, "lr")
    fig = plot_comparison(cmp)                     fig = plot_noise(noise_table)
    fig = plot_ledger(read_ledger(sweep_dir))

`runs` is `scalelab.analysis.store_reader.load_store_runs(...)`, `fit` a `lawfit.StoreFit`, `cmp` a
`scalelab.fitting.comparisons.comparison.Comparison`. Intervals are percentile bands over the fit's bootstrap draws.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # noqa: E402 - before pyplot; no display needed

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from scalelab import store
from scalelab.analysis.noise import SNR_DECIDE
from scalelab.fitting.allocation import allocate as alloc
from scalelab.fitting.estimate.intervals import percentile_interval  # noqa: E402
from scalelab.fitting.forms.laws import get_law

LEVEL = 0.95


def _axes(ax, figsize=(6.4, 4.2)):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, layout="constrained")
        return fig, ax
    return ax.figure, ax


def _band(values: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    return percentile_interval(values, level)


def short_number(value: float, plain: bool = False, sci: bool = False) -> str:
    """A tick label that stays narrow: 20k, 1.5M, 3B; 2e13 from 1e13 up (or always, sci); plain %g when asked."""
    if plain or value <= 0:
        return f"{value:g}"
    if value >= 1e13 or sci:
        return f"{value:.0e}".replace("e+", "e")
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:g}"


def readable_log_axis(ax, which: str = "x", *, plain: bool = False, sci: bool = False) -> None:
    """Labels on a log axis that do not collide: about 3-7 short labels whatever the span (decades and,
    on narrower axes, 3 x decade, or 2 and 5 x decade; linear steps under 0.7 decades), no minor labels.

    Call it after the data are drawn (it reads the axis limits)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = ax.get_xlim() if which == "x" else ax.get_ylim()
    span = math.log10(hi / lo) if lo > 0 and hi > lo else 0.0
    if span < 0.7:
        locator = matplotlib.ticker.MaxNLocator(nbins=5)
    elif span < 1.6:
        locator = matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0))
    elif span < 3.5:
        locator = matplotlib.ticker.LogLocator(base=10, subs=(1.0, 3.0))
    else:
        locator = matplotlib.ticker.LogLocator(base=10, numticks=8)
    axis.set_major_locator(locator)
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: short_number(v, plain, sci)))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _budget_groups(flops: np.ndarray) -> np.ndarray:
    # start-up time: fitting.estimate.approaches loads statsmodels (~1 s), kept off coordcheck's and plan-run's path
    from scalelab.fitting.estimate.approaches import group_budgets

    return group_budgets(np.asarray(flops, dtype=float))


def _cmap(n: int):
    return plt.get_cmap("viridis")(np.linspace(0.05, 0.9, max(n, 1)))


def plot_loss_curves(runs: pl.DataFrame, metrics: pl.DataFrame, *, x: str = "tokens", ax=None):
    """Training loss of every run against tokens or FLOPs, coloured by model size."""
    fig, ax = _axes(ax)
    sizes = sorted(set(runs["params"].to_list()))
    colors = dict(zip(sizes, _cmap(len(sizes))))
    for run_id, n in zip(runs["run_id"], runs["params"]):
        m = metrics.filter(pl.col("run_id") == run_id).sort("step")
        if m.height:
            ax.plot(m[x], m["loss"], color=colors[n], lw=0.9, alpha=0.8)
    for n in sizes:
        ax.plot([], [], color=colors[n], label=f"N={n:.3g}")
    ax.set_xscale("log")
    readable_log_axis(ax, "x", sci=True)
    ax.set_xlabel("training tokens" if x == "tokens" else "training FLOPs (6ND)")
    ax.set_ylabel("train loss (nats/token)")
    ax.set_title("Loss curves")
    ax.legend(fontsize=7, ncol=2)
    return fig


def plot_isoflop(runs: pl.DataFrame, fit=None, *, loss_col: str = "loss", ax=None):
    """Loss vs N at each compute budget with the fitted parabola in ln N and its minimum."""
    fig, ax = _axes(ax)
    df = runs.filter(pl.col(loss_col).is_not_null())
    n = df["params"].cast(pl.Float64).to_numpy()
    loss = df[loss_col].cast(pl.Float64).to_numpy()
    groups = _budget_groups(df["flops"].cast(pl.Float64).to_numpy())
    uniq = np.unique(groups)
    for color, g in zip(_cmap(len(uniq)), uniq):
        sel = groups == g
        c = float(np.median(df["flops"].cast(pl.Float64).to_numpy()[sel]))
        ax.scatter(n[sel], loss[sel], color=color, s=18, label=f"C={c:.2g}")
        if len(np.unique(n[sel])) >= 3:
            coef = np.polyfit(np.log(n[sel]), loss[sel], 2)
            xs = np.linspace(np.log(n[sel]).min() - 0.2, np.log(n[sel]).max() + 0.2, 60)
            ax.plot(np.exp(xs), np.polyval(coef, xs), color=color, lw=1)
            x0 = -coef[1] / (2 * coef[0]) if coef[0] > 0 else math.nan
            if np.log(n[sel]).min() <= x0 <= np.log(n[sel]).max():  # a minimum the sizes bracket
                ax.plot(math.exp(x0), np.polyval(coef, x0), marker="*", color=color, ms=11, mec="k")
        if fit is not None:
            ns = np.geomspace(n[sel].min() / 1.5, n[sel].max() * 1.5, 60)
            ax.plot(ns, fit.predict(params=ns, tokens=c / (6 * ns)), color=color, lw=0.8, ls=":")
    ax.set_xscale("log")
    readable_log_axis(ax, "x")
    ax.set_xlabel("parameters N")
    ax.set_ylabel(f"final {loss_col}")
    ax.set_title("IsoFLOP curves (parabola in ln N, * = bracketed minimum; dotted = law)", fontsize=10)
    ax.legend(fontsize=7)
    return fig


def _frontier(fit, params: dict[str, float], flops: np.ndarray) -> np.ndarray:
    # start-up time: analysis.compare loads statsmodels (~1 s), kept off coordcheck's and plan-run's path
    from scalelab.analysis.compare import frontier_loss

    law = fit.law_object()
    return np.array([frontier_loss(law, params, float(c)) for c in flops])


def plot_frontier(
    runs: pl.DataFrame, fit, *, extend: float = 30.0, ax=None, level: float = LEVEL, loss_col: str = "loss"
):
    """The compute frontier L*(C) of the fit with its band, the fitted runs, the backtest's held-out runs,
    and the done runs of `runs` the fit does not hold (finished after it: a round's proposed run)."""
    fig, ax = _axes(ax)
    later = runs_after_fit(runs, fit, loss_col)
    top = max([fit.flops.max(), *later["flops"].to_list()])
    cs = np.geomspace(fit.flops.min() / 2, max(fit.flops.max() * extend, top * 2), 60)
    ax.scatter(fit.flops, fit.loss, s=12, color="0.55", label="fitted runs")
    if later.height:
        ax.scatter(later["flops"], later[loss_col], s=90, marker="*", color="C1", edgecolor="k", lw=0.5, zorder=5,
                   label="measured after the fit (not in it)")  # fmt: skip
    ax.plot(cs, _frontier(fit, fit.params, cs), color="C0", label=f"{fit.law} frontier L*(C)")
    if len(fit.draws):
        draws = np.array([_frontier(fit, p, cs) for p in fit.draw_dicts()])
        lo, hi = _band(draws, level)
        ax.fill_between(cs, lo, hi, color="C0", alpha=0.2, label=f"{100 * level:.0f}% band (bootstrap)")
    if fit.backtest:
        held = fit.backtest["runs"]
        ax.scatter(
            [r["flops"] for r in held],
            [r["observed"] for r in held],
            s=36,
            facecolor="none",
            edgecolor="C3",
            label="held out (backtest)",
        )
        ax.scatter(
            [r["flops"] for r in held],
            [r["predicted"] for r in held],
            s=20,
            marker="x",
            color="C3",
            label=f"predicted, MARE {100 * fit.backtest['mare']:.2f}%",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    readable_log_axis(ax, "x", sci=True)
    readable_log_axis(ax, "y", plain=True)
    ax.set_xlabel("training FLOPs C (6ND)")
    ax.set_ylabel("loss")
    ax.set_title("Compute frontier")
    ax.legend(fontsize=7)
    return fig


def runs_after_fit(runs: pl.DataFrame, fit, loss_col: str = "loss") -> pl.DataFrame:
    """The runs with a loss that the fit does not hold (by run id): finished after it was made."""
    if "run_id" not in runs.columns or loss_col not in runs.columns or not fit.run_id:
        return runs.clear().select([c for c in ("flops", loss_col) if c in runs.columns])
    fitted = set(fit.run_id)
    later = runs.filter(~pl.col("run_id").is_in(list(fitted)) & pl.col(loss_col).is_not_null())
    return later.select(pl.col("flops").cast(pl.Float64), pl.col(loss_col).cast(pl.Float64))


def _optimum(fit, params: dict[str, float], flops: float) -> tuple[float, float]:
    law = fit.law_object()
    if law.name == "chinchilla":
        n, d, _ = alloc.chinchilla_optimum(params, flops)
    else:
        n, d, _, _ = alloc.numeric_optimum(lambda a, b: law.predict(params, params=a, tokens=b), flops)
    return n, d


def plot_allocation(fit, *, extend: float = 30.0, axes=None, level: float = LEVEL):
    """N*(C) and D*(C) from the fit with bootstrap bands (two panels)."""
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8), layout="constrained")
    else:
        fig = axes[0].figure
    cs = np.geomspace(fit.flops.min() / 2, fit.flops.max() * extend, 40)
    point = np.array([_optimum(fit, fit.params, c) for c in cs])
    draws = np.array([[_optimum(fit, p, c) for c in cs] for p in fit.draw_dicts()]) if len(fit.draws) else None
    for j, (ax, name) in enumerate(zip(axes, ("N*(C) parameters", "D*(C) tokens"))):
        ax.plot(cs, point[:, j], color=f"C{j}")
        if draws is not None:
            lo, hi = _band(draws[:, :, j], level)
            ax.fill_between(cs, lo, hi, color=f"C{j}", alpha=0.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        readable_log_axis(ax, "x", sci=True)
        readable_log_axis(ax, "y")
        ax.set_xlabel("FLOPs C")
        ax.set_title(name)
    return fig


def plot_residuals(fit, ax=None):
    """Relative residuals (observed / fitted - 1) of the fitted runs vs compute."""
    fig, ax = _axes(ax)
    pred = fit.predict(params=fit.n, tokens=fit.d)
    rel = fit.loss / pred - 1
    sc = ax.scatter(fit.flops, 100 * rel, c=np.log10(fit.n), cmap="viridis", s=18)
    fig.colorbar(sc, ax=ax, label="log10 N")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    readable_log_axis(ax, "x", sci=True)
    ax.set_xlabel("FLOPs C")
    ax.set_ylabel("residual (%)")
    ax.set_title(f"Residuals of the {fit.law} fit")
    return fig


def plot_backtest(fit, ax=None):
    """Predicted vs actual loss of the held-out runs (hold out the largest budget)."""
    fig, ax = _axes(ax, figsize=(4.8, 4.2))
    if not fit.backtest:
        ax.text(0.5, 0.5, "no backtest (too few runs below the largest budget)", ha="center", transform=ax.transAxes)
        return fig
    obs = np.array([r["observed"] for r in fit.backtest["runs"]])
    pred = np.array([r["predicted"] for r in fit.backtest["runs"]])
    lo, hi = min(obs.min(), pred.min()), max(obs.max(), pred.max())
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
    ax.scatter(obs, pred, color="C3", s=22)
    ax.set_xlabel("actual loss")
    ax.set_ylabel("predicted loss")
    bt = fit.backtest
    ax.set_title(
        f"Backtest: MARE {100 * bt['mare']:.2f}%, bias {100 * bt['bias']:+.2f}%, "
        f"{bt['n_train']} train / {bt['n_test']} test",
        fontsize=9,
    )
    return fig


def plot_sensitivity(runs: pl.DataFrame, param: str = "lr", *, loss_col: str = "loss", ax=None):
    """Final loss vs a hyperparameter (lr, global_batch_tokens, ...) among runs of the same size N and
    tokens D: a line where such a group tried several values, a point where it tried one (a point is no
    sensitivity: a recipe that sets the value per size gives one per group, and the title says so)."""
    fig, ax = _axes(ax)
    if param not in runs.columns:
        ax.text(0.5, 0.5, f"no '{param}' column", ha="center", transform=ax.transAxes)
        return fig
    df = runs.filter(pl.col(param).is_not_null() & pl.col(loss_col).is_not_null())
    keys = ["params", "tokens"] if "tokens" in df.columns else ["params"]
    groups = df.group_by(keys).agg(pl.col(param).n_unique().alias("values")).sort(keys)
    sizes = sorted(set(df["params"].to_list()))
    colors = dict(zip(sizes, _cmap(len(sizes))))
    swept = 0
    for g in groups.iter_rows(named=True):
        sub = df.filter(*(pl.col(k) == g[k] for k in keys)).group_by(param).agg(pl.col(loss_col).mean()).sort(param)
        swept += g["values"] > 1
        style = dict(marker="o", ls="-" if g["values"] > 1 else "none", color=colors[g["params"]])
        ax.plot(sub[param], sub[loss_col], **style)
    for n in sizes:
        ax.plot([], [], marker="o", ls="none", color=colors[n], label=f"N={n:.3g}")
    ax.set_xscale("log")
    readable_log_axis(ax, "x", plain=True)
    ax.set_xlabel(param)
    ax.set_ylabel(f"final {loss_col} (mean over seeds)")
    if swept:
        ax.set_title(f"Sensitivity to {param}: lines join runs of one size and token count")
    else:
        ax.set_title(f"One {param} per size and token count: points, no sensitivity to read", fontsize=10)
    ax.legend(fontsize=7)
    return fig


def sensitivity_swept(runs: pl.DataFrame, param: str) -> bool:
    """Whether some runs of one size and token count tried two or more values of `param`."""
    if param not in runs.columns:
        return False
    keys = ["params", "tokens"] if "tokens" in runs.columns else ["params"]
    counts = runs.filter(pl.col(param).is_not_null()).group_by(keys).agg(pl.col(param).n_unique().alias("k"))
    return bool(counts.height and counts["k"].max() > 1)


def plot_comparison(cmp, ax=None):
    """Compute-efficiency multiplier of B over A vs compute, with its interval and the target."""
    fig, ax = _axes(ax)
    c = np.array(cmp.budgets)
    m = np.array(cmp.multipliers)
    iv = np.array(cmp.intervals, dtype=float)
    ax.plot(c, m, marker="o", color="C0", label=f"{cmp.b.name} over {cmp.a.name}")
    ax.fill_between(
        c, iv[:, 0], np.minimum(iv[:, 1], 1e6), color="C0", alpha=0.2, label=f"{100 * cmp.level:.0f}% interval"
    )
    t_lo, t_hi = cmp.target_interval
    ax.errorbar(
        [cmp.target_flops],
        [cmp.multiplier_at_target],
        yerr=[[cmp.multiplier_at_target - t_lo], [min(t_hi, 1e6) - cmp.multiplier_at_target]],
        fmt="s",
        color="C3",
        capsize=4,
        label="target (extrapolated)",
    )
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    readable_log_axis(ax, "x", sci=True)
    readable_log_axis(ax, "y", plain=True)
    ax.set_xlabel("FLOPs C")
    ax.set_ylabel("compute multiplier m(C)")
    ax.set_title(f"Compute-efficiency multiplier (slope {cmp.slope:+.3f} per ln C)", fontsize=10)
    ax.legend(fontsize=7)
    return fig


def plot_noise(table: pl.DataFrame, ax=None):
    """SNR per (task, metric), log scale, with the decide-threshold line."""
    fig, ax = _axes(ax, figsize=(6.4, 0.45 * max(table.height, 3) + 1.2))
    labels = [f"{t} {m}" for t, m in zip(table["task"], table["metric"])]
    snr = table["snr"].fill_nan(None).fill_null(0.0).to_numpy()
    colors = ["C2" if s >= SNR_DECIDE else "C3" for s in snr]
    y = np.arange(len(labels))
    ax.barh(y, np.maximum(snr, 1e-3), color=colors)
    ax.set_yticks(y, labels, fontsize=8)
    ax.axvline(SNR_DECIDE, color="k", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # decade labels only
    ax.set_xlabel("SNR (spread across runs / noise)")
    ax.set_title("Evaluation noise")
    return fig


def plot_ledger(book: dict, ax=None):
    """The ledger (scalelab.store.ledger): every proposed run's predicted loss with its interval
    against its FLOPs, by round, and its measured loss once done (filled: inside the interval)."""
    fig, ax = _axes(ax)
    preds = book.get("predictions", [])
    rounds = sorted({p["round"] for p in preds})
    for color, k in zip(_cmap(len(rounds)), rounds):
        mine = [p for p in preds if p["round"] == k]
        c = np.array([p["flops"] for p in mine], dtype=float)
        y = np.array([p["predicted"] for p in mine], dtype=float)
        lo = np.array([p["interval"][0] for p in mine], dtype=float)
        hi = np.array([p["interval"][1] for p in mine], dtype=float)
        ax.errorbar(c, y, yerr=[y - lo, hi - y], fmt="D", mfc="none", color=color, capsize=3,
                    label=f"round {k}: predicted, {100 * LEVEL:.0f}% interval")  # fmt: skip
        done = [p for p in mine if p.get("measured") is not None]
        for p in done:
            face = color if p.get("covered") else "none"
            ax.scatter([p["flops"]], [p["measured"]], marker="*", s=120, color=color, facecolor=face, zorder=5)
    ax.scatter([], [], marker="*", s=120, color="0.3", label="measured (hollow: outside the interval)")
    scored = [p for p in preds if p.get("measured") is not None]
    covered = sum(bool(p.get("covered")) for p in scored)
    title = "Ledger: none measured yet"
    if scored:
        title = f"Ledger: {covered} of {len(scored)} measured inside their interval"
    ax.set(xscale="log", xlabel="training FLOPs C (6ND)", ylabel="final loss", title=title)
    ax.legend(fontsize=7)
    return fig


KINDS = ("curves", "isoflop", "frontier", "allocation", "residuals", "backtest", "sensitivity", "noise")


def save(fig, path) -> None:
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_demo(sweep_dir, proposal: dict, measured: float | None, png) -> None:
    """The demo's figure (demo_figure) written to `png` whole (a temporary name, then renamed)."""
    fig = demo_figure(sweep_dir, proposal, measured)
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(png)
    plt.close(fig)


def demo_figure(sweep_dir, proposal: dict, measured: float | None):
    """The demo's figure: IsoFLOP curves with the fitted law along each budget, the proposed run's
    prediction and interval against its measured loss, and the frontier N*(C) with the best runs."""
    law, params = get_law(proposal["law"]), proposal["params"]
    optimum = alloc.optimum_for_law(law)
    df = store.load_runs(sweep_dir).filter((pl.col("status") == "done") & pl.col("flops_budget").is_not_null())
    p = proposal["proposals"][0]
    df = df.filter(pl.col("run_id") != p["run_id"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    budgets = sorted(set(df["flops_budget"].to_list()))
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, len(budgets) + 1))
    best_n, best_c = [], []
    for color, c in zip(colors, budgets):
        sub = df.filter(pl.col("flops_budget") == c).sort("params")
        ax1.scatter(sub["params"], sub["final_val_loss"], color=color, label=f"C={c:.2g}")
        n = np.geomspace(sub["params"].min() / 1.5, sub["params"].max() * 1.5, 60)
        ax1.plot(n, law.predict(params, params=n, tokens=c / (6 * n)), color=color, lw=1)
        i = int(np.argmin(sub["final_val_loss"].to_numpy()))
        best_n.append(sub["params"][i])
        best_c.append(c)
    c_next = p["budget"]
    n = np.geomspace(min(df["params"].min(), p["params"]) / 1.5, max(df["params"].max(), p["params"]) * 1.5, 60)
    ax1.plot(n, law.predict(params, params=n, tokens=c_next / (6 * n)), color=colors[-1], lw=1, ls="--",
             label=f"C={c_next:.2g} (predicted)")  # fmt: skip
    lo, hi = p["predicted_interval"]
    yerr = [[p["predicted_loss"] - lo], [hi - p["predicted_loss"]]]
    ax1.errorbar([p["params"]], [p["predicted_loss"]], yerr=yerr, fmt="D", color="black", mfc="none", capsize=4,
                 label="proposed: predicted 95%")  # fmt: skip
    if measured is not None:
        ax1.scatter([p["params"]], [measured], marker="*", s=140, color="crimson", zorder=5, label="proposed: measured")
    ax1.set(xscale="log", xlabel="parameters N", ylabel="final val loss (nats/token)", title="IsoFLOP curves")
    readable_log_axis(ax1, "x")
    ax1.legend(fontsize=7)
    cs = np.geomspace(min(best_c) / 2, c_next * 3, 50)
    ax2.plot(cs, [optimum(params, c)[0] for c in cs], color="black", lw=1, label="fit: N*(C)")
    ax2.scatter(best_c, best_n, color=colors[: len(best_c)], label="best run per budget")
    ax2.scatter([c_next], [p["params"]], marker="*", s=140, color="crimson", label="proposed run")
    ax2.set(xscale="log", yscale="log", xlabel="FLOPs C (6ND)", ylabel="N", title="compute-optimal frontier")
    readable_log_axis(ax2, "x", sci=True)
    readable_log_axis(ax2, "y")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_coordcheck(check) -> plt.Figure:
    """Coordinate check (scalelab.train.coordcheck.CoordCheck): one row per (parametrization,
    depth), one column per step; RMS of each layer's output against width, log-log. Flat lines =
    the parametrization keeps activations width-independent (µP); rising lines = they blow up (SP).
    """
    rows = [(p, d) for p in check.parametrizations for d in check.depths]
    ncol = check.steps
    fig, axes = plt.subplots(
        len(rows), ncol, figsize=(2.6 * ncol + 1.6, 2.3 * len(rows)), squeeze=False, sharex=True, layout="constrained"
    )
    for i, (p, d) in enumerate(rows):
        layers = check.layers(d)
        colors = plt.cm.viridis(np.linspace(0, 0.95, len(layers)))
        for t in range(ncol):
            ax = axes[i][t]
            for color, layer in zip(colors, layers):
                ys = [check.rms[(p, d, w)][t][layer] for w in check.widths]
                style = dict(lw=2, color="crimson") if layer == "logits" else dict(lw=1, color=color)
                ax.plot(check.widths, ys, marker=".", label=layer, **style)
            ax.set(xscale="log", yscale="log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xticks(check.widths, [str(w) for w in check.widths], fontsize=7)
            ax.tick_params(labelsize=7)
            if i == 0:
                ax.set_title(f"after step {t + 1}", fontsize=9)
            if t == 0:
                ax.set_ylabel(f"{p}, {d} layers\nRMS", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("width (d_model)", fontsize=8)
        worst = max(abs(check.slopes[(p, d, layer)]) for layer in layers)
        axes[i][-1].text(
            0.98, 0.02, f"max |slope| {worst:.2f}", transform=axes[i][-1].transAxes, ha="right", fontsize=7
        )
    handles, labels = axes[-1][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=7)
    fig.suptitle(f"coordinate check (lr {check.lr:g}, geometric mean over {check.seeds} inits)", fontsize=10)
    return fig
