"""Plots of a run plan (`scalelab plan-run`): frontier with the planned point, the loss interval's parts,
sensitivities, and the scale what-ifs. Each takes the plan's dict (RunPlan.to_dict / plan.json).

    fig = plot_plan_frontier(plan)      fig = plot_loss_parts(plan)
    fig = plot_plan_sensitivity(plan)   fig = plot_what_if(plan)        # None without what-ifs
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # noqa: E402 - before pyplot; no display needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from scalelab.analysis.plots import readable_log_axis, short_number  # noqa: E402

PART_LABELS = {
    "bootstrap": "fit: bootstrap",
    "weights": "fit: stacked weights",
    "forms": "fit: forms disagree",
    "noise": "fit: run noise",
    "extrapolation": "fit: extrapolation",
    "holdout": "fit: hold-out miss",
    "frontier fit": "frontier: its fit",
    "frontier noise": "frontier: minima's noise",
    "surface": "bracket: the law's interval",
    "sides": "bracket: the sides' gap",
    "lr": "HP: LR at its edge",
    "batch": "HP: batch at its edge",
}


def _z(level: float) -> float:
    return float(stats.norm.ppf(0.5 + level / 2))


def plot_plan_frontier(plan: dict[str, Any]):
    """L*(C) with its interval from the fit, the fitted runs, the fit's largest budget and the planned run."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    f = plan["frontier"]
    ax.fill_between(
        f["flops"], f["lo"], f["hi"], color="C0", alpha=0.18, label=f"{round(100 * plan['level'])}% interval"
    )
    ax.plot(f["flops"], f["loss"], color="C0", lw=1.4, label=f"{plan['law']} frontier L*(C)")
    pts = plan.get("points")
    if pts:
        ax.scatter(pts["budgets"], pts["loss"], s=12, color="0.45", zorder=3, label="the fitted runs")
    ax.axvline(plan["fit_max_flops"], color="0.5", ls=":", lw=1)
    ax.annotate("largest fitted budget", (plan["fit_max_flops"], 0.02), xycoords=("data", "axes fraction"),
                rotation=90, fontsize=7, color="0.4", ha="right", va="bottom")  # fmt: skip
    loss, run = plan["loss"], plan["run"]
    ax.errorbar([run["flops_6n"]], [loss["point"]], yerr=[[loss["point"] - loss["lo"]], [loss["hi"] - loss["point"]]],
                fmt="o", color="C3", ms=6, capsize=4, zorder=4,
                label=f"plan: N={short_number(run['params'])}, D={short_number(run['tokens'])}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    readable_log_axis(ax, "x", sci=True)
    readable_log_axis(ax, "y", plain=True)
    ax.set_xlabel("training FLOPs C (6ND)")
    ax.set_ylabel("loss")
    ax.set_title("The frontier and the planned run")
    fig.legend(fontsize=7, loc="outside lower center", ncol=2)  # below the axes: the band widens into any corner
    return fig


def frontier_caption(plan: dict[str, Any]) -> str:
    """The caption of plot_plan_frontier, naming only what it draws."""
    runs = " the fitted runs," if plan.get("points") else ""
    return f"The compute frontier L*(C) with its interval,{runs} the largest fitted budget and the planned run"


def plot_loss_parts(plan: dict[str, Any]):
    """Each part of the loss interval as the 95% half-width it alone would give (%), the total, the shifts."""
    loss, level = plan["loss"], plan["level"]
    z = _z(level)
    rows = []
    for k, v in loss["parts"].items():
        if k == "decades":
            continue
        known = v is not None and math.isfinite(v)
        rows.append((PART_LABELS.get(k, k), 100 * math.expm1(z * v) if known else math.nan, "C0"))
    rows.append(("total (root sum of squares)", 100 * (loss["hi"] / loss["point"] - 1), "C3"))
    for k, v in plan["shifts"].items():
        rows.append((f"shift: {k}", 100 * math.expm1(v), "C2"))
    fig, ax = plt.subplots(figsize=(6.4, 0.42 * len(rows) + 1.2), layout="constrained")
    y = np.arange(len(rows))[::-1]
    vals = [r[1] for r in rows]
    ax.barh(y, [0 if math.isnan(v) else v for v in vals], color=[r[2] for r in rows], alpha=0.8)
    span = max([abs(v) for v in vals if not math.isnan(v)] + [1e-3])
    for yi, v in zip(y, vals):
        text = "unmeasured" if math.isnan(v) else f"{v:+.2f}%"
        ax.text(0 if math.isnan(v) else v, yi, f" {text}", va="center", fontsize=8)
    ax.set_yticks(y, [r[0] for r in rows], fontsize=8)
    ax.set_xlim(min(0, min(v for v in vals if not math.isnan(v))) * 1.3, span * 1.35)
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_xlabel(f"% of the predicted loss ({round(100 * level)}% half-width of each part alone)")
    ax.set_title("The loss interval, part by part")
    return fig


def plot_plan_sensitivity(plan: dict[str, Any]):
    """Loss cost of each departure from the plan, beside the interval's upper half-width."""
    rows = [(s["what"], 100 * s["change"]) for s in plan["sensitivity"] if s["change"] is not None]
    fig, ax = plt.subplots(figsize=(6.4, 0.42 * len(rows) + 1.2), layout="constrained")
    y = np.arange(len(rows))[::-1]
    ax.barh(y, [v for _, v in rows], color="C1", alpha=0.8)
    for yi, (_, v) in zip(y, rows):
        ax.text(v, yi, f" {v:+.2f}%", va="center", fontsize=8)
    half = 100 * (plan["loss"]["hi"] / plan["loss"]["point"] - 1)
    ax.axvline(half, color="C3", ls="--", lw=1, label=f"the loss interval's upper half-width ({half:.1f}%)")
    ax.set_yticks(y, [w for w, _ in rows], fontsize=8)
    ax.set_xlim(
        min(0, min((v for _, v in rows), default=0)) * 1.3, max(max((v for _, v in rows), default=0), half) * 1.3
    )
    ax.set_xlabel("loss change (%), the law at the planned N, D")
    ax.set_title("Which departure matters")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def plot_what_if(plan: dict[str, Any]):
    """Wall time and MFU / communication share against GPUs, the planned size, the knee and the ceiling."""
    w = plan.get("what_if")
    if not w:
        return None
    rows = [r for r in w["rows"] if r["wall_s"] is not None]
    if not rows:
        return None
    g = np.array([r["num_gpus"] for r in rows], dtype=float)
    days = np.array([r["wall_s"] for r in rows]) / 86400
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.6, 3.8), layout="constrained")
    a1.plot(g, days, "o-", color="C0", label="wall time")
    a1.plot(g, days[0] * g[0] / g, ":", color="0.5", label="perfect scaling")
    planned = plan["cluster"]["num_gpus"]
    a1.axvline(planned, color="C3", lw=1, ls="--", label=f"planned ({planned:,} GPUs)")
    if w.get("knee"):
        a1.axvline(w["knee"], color="C1", lw=1, label=f"stops paying past {w['knee']:,}")
    if w.get("ceiling"):
        a1.scatter([w["ceiling"]], [w["ceiling_wall_s"] / 86400], marker="*", s=120, color="C2", zorder=4,
                   label="ceiling (shortest run)")  # fmt: skip
    labels, last = [], -math.inf
    for x in g:  # a label within 0.6 octave of the last one shown would touch it: its tick stays unlabelled
        labels.append(f"{int(x):,}" if math.log2(x) - last >= 0.6 else "")
        last = math.log2(x) if labels[-1] else last
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(g, labels, fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("GPUs")
    a1.set_yscale("log")
    readable_log_axis(a1, "y", plain=True)
    a1.set_ylabel("wall time (days)")
    a1.set_title("Time to train")
    a1.legend(fontsize=7)
    a2.plot(g, [100 * r["mfu"] for r in rows], "o-", color="C0", label="MFU")
    a2.plot(g, [100 * r["comm_share"] for r in rows], "s-", color="C1", label="exposed communication")
    a2.plot(g, [100 * r["bubble_share"] for r in rows], "^-", color="C2", label="pipeline bubble")
    a2.set_ylabel("% (MFU; share of the step)")
    a2.set_title("Where the step goes")
    a2.legend(fontsize=7)
    return fig
