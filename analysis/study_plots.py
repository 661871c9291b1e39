"""Plots of a study (matplotlib, Agg): each arm's frontier, and the multiplier of an arm over the baseline.

    fig = plot_study_frontiers(study_fit, runs)       # runs: the study's store runs (load_runs)
    fig = plot_study_multiplier(study_fit.comparisons[0])

`study_fit` is scalelab.sweeps.studies.study_fit.StudyFit. Bands are percentile bands over each arm's
bootstrap replicates; the target's runs, once measured, are drawn as squares.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from scalelab.analysis.plots import LEVEL, _axes
from scalelab.errors import UsageError
from scalelab.fitting.comparisons.multiplier import frontier_loss
from scalelab.fitting.estimate.intervals import percentile_interval


def _frontier(fit, params: dict[str, float], flops: np.ndarray) -> np.ndarray:
    law = fit.law_object
    out = []
    for c in flops:
        try:
            out.append(frontier_loss(law, params, float(c)))
        except UsageError:
            out.append(np.nan)
    return np.array(out)


def plot_study_frontiers(sf, runs: pl.DataFrame, *, ax=None, level: float = LEVEL):
    """Per arm: its runs (loss vs FLOP budget), its fitted frontier L*(C) to past the target with a
    bootstrap band, and its measured runs at the target."""
    fig, ax = _axes(ax)
    target = sf.study.target_flops
    lo_c = min(float(a.fit.budgets.min()) for a in sf.arms.values())
    cs = np.geomspace(lo_c / 1.5, target * 1.5, 50)
    column = sf.options.loss if sf.options.loss in runs.columns else "loss"
    for i, (name, arm) in enumerate(sf.arms.items()):
        color = f"C{i}"
        fit = arm.fit
        sub = runs.filter((pl.col("arm") == name) & (pl.col("status") == "done"))
        design = sub.filter(pl.col("flops_budget") < 0.95 * target)
        at_target = sub.filter(pl.col("flops_budget") >= 0.95 * target)
        ax.scatter(design["flops_budget"], design[column], s=12, color=color, alpha=0.6)
        ax.plot(cs, _frontier(fit, fit.params, cs), color=color, label=f"{name}: L*(C)")
        if fit.draws:
            lo, hi = percentile_interval(np.array([_frontier(fit, p, cs) for p in fit.draws]), level)
            ax.fill_between(cs, lo, hi, color=color, alpha=0.15)
        if at_target.height:
            ax.scatter(
                at_target["flops_budget"], at_target[column], s=50, marker="s", color=color, label=f"{name}: at target"
            )
    ax.axvline(target, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training FLOPs C (6ND)")
    ax.set_ylabel("loss")
    ax.set_title(f"Frontiers per arm (target {target:.3g}, {100 * level:.0f}% bands)", fontsize=10)
    ax.legend(fontsize=7)
    return fig


def plot_study_multiplier(cmp, *, ax=None):
    """m(C) of the arm over the baseline at the design's budgets with its band, and at the target."""
    fig, ax = _axes(ax)
    c = np.array(cmp.budgets)
    iv = np.array(cmp.intervals, dtype=float)
    ax.plot(c, cmp.multipliers, marker="o", color="C0", label=f"{cmp.arm} over {cmp.baseline}")
    ax.fill_between(c, iv[:, 0], np.minimum(iv[:, 1], 1e6), color="C0", alpha=0.2, label=f"{100 * cmp.level:.0f}%")
    m, (t_lo, t_hi) = cmp.multiplier_at_target, cmp.target_interval
    ax.errorbar(
        [cmp.target_flops],
        [m],
        yerr=[[max(m - t_lo, 0.0)], [max(min(t_hi, 1e6) - m, 0.0)]],
        fmt="s",
        color="C3",
        capsize=4,
        label="target (extrapolated)",
    )
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOPs C")
    ax.set_ylabel("compute multiplier m(C)")
    ax.set_title(f"{cmp.arm} over {cmp.baseline} (slope {cmp.slope:+.3f} per ln C)", fontsize=10)
    ax.legend(fontsize=7)
    return fig
