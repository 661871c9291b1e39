"""The planning page: a run plan as HTML (`scalelab plan-run --html`, and a section of `scalelab report`).

    html_text = plan_section(plan)          # plan: RunPlan.to_dict() or a saved plan.json
    write_plan_page(plan, "plan.html")      # one self-contained file (inline CSS, PNGs as data URIs)

What a lead reads before betting on the run: the headline table (the model, tokens, loss with its
interval, LR and batch with theirs, the layout, wall time and GPU-hours with the planner's band),
the loss interval part by part, the shapes the size was rounded among, which departure costs
what, the cost table, and the scale what-ifs with the knee, the ceiling and their assumptions.
"""

from __future__ import annotations

import html
import math
import time
from pathlib import Path
from typing import Any

from scipy import stats

from scalelab.analysis.plan_plots import (
    PART_LABELS,
    frontier_caption,
    plot_loss_parts,
    plot_plan_frontier,
    plot_plan_sensitivity,
    plot_what_if,
)
from scalelab.analysis.report_html import CSS, html_table, img, write_page
from scalelab.planning.plan_text import duration, pct, si

PART_MEANING = {
    "bootstrap": "the fit's parameters, resampling its runs",
    "weights": "the stacked law's weights, resampling its forward backtests",
    "forms": "how far the stacked law's forms disagree at this point",
    "noise": "a new run's own noise (seeds, data order)",
    "extrapolation": "the law's out-of-sample error per decade (backtests) at this distance",
    "holdout": "what the fit's hold-out missed by (too close to scale per decade)",
    "frontier fit": "the frontier L*(C)'s forms at C (delta method), scaled by its forward folds' calibration",
    "frontier noise": "the budgets' minima's scatter about the frontier, scaled as above",
    "surface": "the bracket's saturating side: the law's own interval (bootstrap, noise, extrapolation)",
    "sides": "half the gap between the bracket's two sides (the law and the best-loss power law)",
    "lr": "training at the edge of the LR's interval (curvature of loss in log LR)",
    "batch": "training at the edge of the batch's interval (curvature of loss in log batch)",
}


def _iv(pair, fmt=si) -> str:
    return "n/a" if not pair else f"[{fmt(pair[0])}, {fmt(pair[1])}]"


def _headline(p: dict[str, Any]) -> list[list[str]]:
    opt, run, loss, hp, lay, cost = p["optimum"], p["run"], p["loss"], p["hparams"], p["layout"], p["cost"]
    lvl = f"{round(100 * p['level'])}%"
    lr, batch = hp["lr"], hp["batch_tokens"]
    sched = p["schedule"]
    warm = sched.get("warmup_tokens", 0) // max(run["tokens_per_step"], 1)
    return [
        ["compute budget C", f"{p['flops']:.3g} FLOPs", "", p["flops_note"]],
        ["compute-optimal N*", si(opt["n"]), _iv(opt["n_interval"]), f"{p['law']} fit, {lvl} bootstrap percentiles"],
        ["compute-optimal D*", si(opt["d"]), _iv(opt["d_interval"]), ""],
        ["the model", f"{run['num_layers']} x {run['d_model']}, N = {run['params']:,}", "",
         "the shape rule's nearest shape with the lowest law loss"],
        ["tokens D", f"{run['tokens']:,}", "", f"{cost['steps']:,} steps of {run['tokens_per_step']:,} tokens"],
        ["predicted loss", f"{loss['point']:.4f}", f"[{loss['lo']:.4f}, {loss['hi']:.4f}]", "law + HP parts, below"],
        ["peak LR", f"{lr['value']:.3g}", _iv(lr["interval"], lambda x: f"{x:.3g}"), lr["source"]],
        ["global batch (tokens)", f"{batch['value']:,.0f}", _iv(batch["interval"], lambda x: f"{x:,.0f}"),
         batch["source"]],
        ["warmup, schedule", f"{warm:,} steps, {sched['name']}", "",
         f"decay to {sched.get('min_lr_ratio', 0):g} x peak"],
        ["layout", lay["name"], "", p["cluster"]["label"]],
        ["step time", f"{lay['step_time_s']:.4g} s",
         "", "MFU n/a (fitted rate)" if lay["mfu"] is None else f"MFU {100 * lay['mfu']:.1f}%"],
        ["wall time", duration(cost["wall_s"]),
         f"[{duration(cost['wall_band_s'][0])}, {duration(cost['wall_band_s'][1])}]",
         f"the planner's band x{cost['band']['lo']:.2f}..x{cost['band']['hi']:.2f}"],
        ["device-hours", f"{cost['gpu_hours']:,.4g}",
         f"[{cost['gpu_hours_band'][0]:,.4g}, {cost['gpu_hours_band'][1]:,.4g}]", ""],
    ]  # fmt: skip


def _parts_rows(p: dict[str, Any]) -> list[list[Any]]:
    z = float(stats.norm.ppf(0.5 + p["level"] / 2))
    rows = []
    for k, v in p["loss"]["parts"].items():
        if k == "decades":
            continue
        known = v is not None and math.isfinite(v)
        rows.append([PART_LABELS.get(k, k), f"{v:.4f}" if known else "unmeasured",
                     f"±{100 * math.expm1(z * v):.2f}%" if known else "n/a", PART_MEANING.get(k, "")])  # fmt: skip
    loss = p["loss"]
    rows.append(["total", "", f"{pct(loss['hi'] / loss['point'] - 1)} / {pct(loss['lo'] / loss['point'] - 1)}",
                 "root sum of squares of the parts, in log space"])  # fmt: skip
    for k, v in p["shifts"].items():
        rows.append([f"shift: {k}", "", pct(math.expm1(v)), "moves the point (in the prediction above)"])
    return rows


def _what_if_html(w: dict[str, Any], planned: int) -> str:
    rows = []
    for r in w["rows"]:
        if r["layout"] is None:
            rows.append([f"{r['num_gpus']:,}", "no layout fits", "", "", "", "", "", ""])
            continue
        mark = " (planned)" if r["num_gpus"] == planned else ""
        rows.append([f"{r['num_gpus']:,}{mark}", r["layout"], f"{r['step_time_s']:.3g}", f"{100 * r['mfu']:.1f}%",
                     f"{100 * r['comm_share']:.1f}%", f"{100 * r['bubble_share']:.1f}%", duration(r["wall_s"]),
                     f"{r['gpu_hours']:,.0f}"])  # fmt: skip
    head = ["GPUs", "layout", "step (s)", "MFU", "exposed comm", "bubble", "wall time", "GPU-hours"]
    out = ["<h3>Scale what-ifs</h3>", html_table(head, rows, left=2)]
    if w.get("knee") is not None:
        verdict = f"adding GPUs stops paying past {w['knee']:,} GPUs (a doubling buys less than x1.41 in time)"
    else:
        verdict = "every step up to the largest size still pays (a doubling buys x1.41 or more)"
    if w.get("ceiling") is not None:
        verdict += f"; the system ceiling: {duration(w['ceiling_wall_s'])} at {w['ceiling']:,} GPUs"
    out.append(f'<div class="ok">{html.escape(verdict)}</div>')
    out.append('<p class="muted">Assumptions: ' + html.escape("; ".join(w["assumptions"])) + ".</p>")
    return "\n".join(out)


def plan_section(p: dict[str, Any]) -> str:
    """The plan's HTML section (module docstring)."""
    decades = math.log10(p["flops"] / p["fit_max_flops"])
    title = f"Plan: C = {p['flops']:.3g} FLOPs on {p['cluster']['label']}"
    out = [
        f"<h2>{html.escape(title)}</h2>",
        f'<p class="muted">fit: {html.escape(p["law"])} from {html.escape(p["fit_source"])}; the budget lies '
        f"{decades:.2f} decades beyond its largest ({p['fit_max_flops']:.3g}); run id {html.escape(p['run']['run_id'])}"
        "</p>",
    ]
    out += [f'<div class="warn">{html.escape(w)}</div>' for w in p["fit_warnings"] + p["notes"]]
    out.append(
        html_table(
            ["quantity", "value", f"{round(100 * p['level'])}% interval", "from"], _headline(p), left=1, left_cols=(3,)
        )
    )
    out.append("<h3>The loss interval, part by part</h3>")
    out.append(html_table(["part", "log-sd", "95% half-width", "what it is"], _parts_rows(p), left=1, left_cols=(3,)))
    shapes = [[s["num_layers"], s["d_model"], f"{s['params']:,}", f"{s['tokens']:,.0f}", f"{s['loss']:.4f}",
               pct(s["cost"]), "chosen" if [s["num_layers"], s["d_model"]] == p["run"]["chosen_shape"] else ""]
              for s in p["shapes"]]  # fmt: skip
    out.append("<h3>Rounding to a concrete model</h3>")
    out.append(html_table(["layers", "d_model", "N", "D = C/6N", "law loss", "cost over L*(C)", ""], shapes, left=0))
    sens = [[s["what"], "n/a" if s["change"] is None else pct(s["change"])] for s in p["sensitivity"]]
    out.append("<h3>Sensitivity</h3>")
    out.append(html_table(["departure from the plan", "loss change"], sens))
    lay, cost = p["layout"], p["cost"]
    parts = ", ".join(f"{k} {v:.3g} s" for k, v in lay["time_parts"].items())
    cost_rows = [
        ["cluster", p["cluster"]["label"]],
        ["layout", f"{lay['name']} ({lay['micro_batch_sequences']} sequences per micro-batch)"],
        ["step", f"{lay['step_time_s']:.4g} s: {parts}"],
        ["throughput", f"{lay['tokens_per_s_per_gpu']:,.0f} tokens/s per device"],
        ["exposed communication, bubble", f"{pct(lay['comm_share'], False)}, {pct(lay['bubble_share'], False)}"],
        ["memory per device", f"{lay['memory_gib']['total']:.3g} GiB"],
        ["wall time", f"{duration(cost['wall_s'])} [{duration(cost['wall_band_s'][0])}, "
         f"{duration(cost['wall_band_s'][1])}]"],
        ["device-hours", f"{cost['gpu_hours']:,.4g}"],
        ["the planner's band", f"x{cost['band']['lo']:.2f}..x{cost['band']['hi']:.2f} measured / planned over "
         f"{cost['band']['n']} cases of {cost['band']['source']}; {cost['band']['within_15']} within 15%"],
    ]  # fmt: skip
    out.append("<h3>Cost</h3>")
    out.append(html_table([], cost_rows, left=2))
    if p.get("what_if"):
        out.append(_what_if_html(p["what_if"], p["cluster"]["num_gpus"]))
    figs = [
        img(plot_plan_frontier(p), frontier_caption(p)),
        img(plot_loss_parts(p), "The loss interval, part by part"),
        img(plot_plan_sensitivity(p), "Loss cost of each departure from the plan"),
    ]
    fig = plot_what_if(p)
    if fig is not None:
        figs.append(img(fig, "Scale what-ifs: wall time, MFU and where the step goes", width=860))
    out.append(f'<div class="grid">{"".join(figs)}</div>')
    return "\n".join(out)


def write_plan_page(plan: dict[str, Any], out: str | Path) -> Path:
    out = Path(out)
    body = (
        f'<h1>scalelab plan-run</h1><p class="muted">generated {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}'
        f"</p>{plan_section(plan)}"
    )
    text = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>scalelab plan: '
        f"{plan['flops']:.3g} FLOPs</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )
    return write_page(out, text)
