"""The plan as text: what `scalelab plan-run` prints (from RunPlan.to_dict, so a saved plan.json prints alike)."""

from __future__ import annotations

import math
from typing import Any


def si(x: float | None, digits: int = 3) -> str:
    """1.23M, 45.6B, 789k: counts with a unit a reader takes in at a glance."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g}{unit}"
    return f"{x:.{digits}g}"


def iv(pair, fmt=si) -> str:
    return "[n/a]" if not pair else f"[{fmt(pair[0])}, {fmt(pair[1])}]"


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def pct(x: float | None, sign: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{100 * x:+.2f}%" if sign else f"{100 * x:.2f}%"


def parts_text(parts: dict[str, float]) -> str:
    keys = [k for k in parts if k != "decades"]
    out = []
    for k in keys:
        extra = f" at {parts['decades']:.2f} decades" if k == "extrapolation" and "decades" in parts else ""
        value = parts[k]
        shown = "unmeasured" if value is None or not math.isfinite(value) else f"{value:.4f}"
        out.append(f"{k} {shown}{extra}")
    return ", ".join(out)


def _hp_line(name: str, h: dict[str, Any], fmt) -> list[str]:
    cost = h.get("edge_cost")
    cost_text = "n/a" if cost is None else f"{100 * math.expm1(cost):+.2f}%"
    return [
        f"  {name:<9}{fmt(h['value']):>10} {iv(h['interval'], fmt):<22} loss cost at the interval's edge {cost_text}",
        f"             value: {h['source']}",
        f"             cost: curvature {h['curvature']:.3g} per (log2 ratio)^2, {h['curvature_source']}"
        if h.get("curvature") is not None
        else f"             cost: {h['curvature_source']}",
    ]


def format_plan(p: dict[str, Any]) -> str:
    """The plan's text. One function: it reads top to bottom as the printed page does."""
    lvl = round(100 * p["level"])
    opt, run, loss, cost, lay = p["optimum"], p["run"], p["loss"], p["cost"], p["layout"]
    decades = math.log10(p["flops"] / p["fit_max_flops"])
    lines = [
        f"plan-run: C = {p['flops']:.3g} FLOPs ({p['flops_note']}), {decades:.2f} decades beyond the fit's largest "
        f"budget {p['fit_max_flops']:.3g}",
        f"  fit: {p['law']} from {p['fit_source']}",
    ]
    lines += [f"  fit warning: {w}" for w in p["fit_warnings"]]
    lines += [
        f"compute-optimal at C ({lvl}% intervals): N* = {si(opt['n'])} {iv(opt['n_interval'])}, "
        f"D* = {si(opt['d'])} {iv(opt['d_interval'])}, L*(C) = {opt['loss']['point']:.4f} "
        f"[{opt['loss']['lo']:.4f}, {opt['loss']['hi']:.4f}] (the planned run's loss and its interval are below)",
        *([f"  {opt['beside']}"] if opt.get("beside") else []),
        "the model: the shape rule's nearest shapes, each at D = C / 6N (law loss; cost over L*(C))",
        f"  {'':2}{'layers':>6} {'d_model':>7} {'params':>14} {'tokens':>16} {'loss':>8} {'cost':>8}",
    ]
    for s in p["shapes"]:
        mark = "*" if [s["num_layers"], s["d_model"]] == run["chosen_shape"] else " "
        lines.append(
            f"  {mark} {s['num_layers']:>6} {s['d_model']:>7} {s['params']:>14,} {s['tokens']:>16,.0f} "
            f"{s['loss']:>8.4f} {pct(s['cost']):>8}"
        )
    steps = cost["steps"]
    lines += [
        f"the run {run['run_id']}: {run['num_layers']} layers x {run['d_model']} ({run['num_heads']} heads, d_ff "
        f"{run['d_ff']}), N = {run['params']:,} ({run['params_nonembed']:,} without embeddings), D = "
        f"{run['tokens']:,} tokens = {steps:,} steps of {run['tokens_per_step']:,}, C = 6ND = {run['flops_6n']:.4g}",
        f"predicted loss of this run {loss['point']:.4f}  {lvl}% prediction interval [{loss['lo']:.4f}, "
        f"{loss['hi']:.4f}]  ({pct(loss['hi'] / loss['point'] - 1)} / {pct(loss['lo'] / loss['point'] - 1)})",
        f"  log-sd parts: {parts_text(loss['parts'])}",
        "  shifts of the point: " + ", ".join(f"{k} {pct(math.expm1(v))}" for k, v in p["shifts"].items()),
        "hyperparameters (value, where the best may lie, what training at that edge costs)",
    ]
    hp = p["hparams"]
    lines += _hp_line("peak LR", hp["lr"], lambda x: f"{x:.3g}")
    lines += _hp_line("batch", hp["batch_tokens"], lambda x: f"{x:,.0f}")
    sched = p["schedule"]
    warm = sched["warmup_tokens"] // run["tokens_per_step"] if sched.get("warmup_tokens") else None
    lines.append(
        f"  schedule {sched['name']}, warmup {warm if warm is not None else 'n/a'} steps "
        f"({sched.get('warmup_tokens', 0):,} tokens), decay to {sched.get('min_lr_ratio', 0):g} x peak"
    )
    lines += [f"  note: {n}" for n in p["notes"]]
    comm = ", ".join(f"{k} {v:.3g} s" for k, v in lay["time_parts"].items())
    band = cost["band"]
    clock = band.get("clock", "wall")  # plans written before the CPU clock have none
    mem = lay["memory_gib"]["total"]
    lines += [
        f"cluster: {p['cluster']['label']}",
        f"layout {lay['name']}: step {lay['step_time_s']:.4g} s ({comm}); "
        + (f"MFU {100 * lay['mfu']:.1f}%, " if lay["mfu"] is not None else "MFU n/a (the CPU's rate is fitted), ")
        + f"{lay['tokens_per_s_per_gpu']:,.0f} tokens/s per device, exposed communication "
        f"{pct(lay['comm_share'], False)}, bubble {pct(lay['bubble_share'], False)}, memory {mem:.3g} GiB per device",
        f"wall time {duration(cost['wall_s'])}  band [{duration(cost['wall_band_s'][0])}, "
        f"{duration(cost['wall_band_s'][1])}]; device-hours {cost['gpu_hours']:,.4g} "
        f"[{cost['gpu_hours_band'][0]:,.4g}, {cost['gpu_hours_band'][1]:,.4g}]",
        f"  band x{band['lo']:.2f}..x{band['hi']:.2f}: measured / planned {clock} time over {band['n']} cases of "
        f"{band['source']}; {band['within_15']} of {band['n']} within 15%",
        *_cpu_time_note(clock),
        f"sensitivity (the law's loss at the run's N, D; + is worse; the interval's upper half-width is "
        f"{pct(loss['hi'] / loss['point'] - 1)})",
    ]
    for s in p["sensitivity"]:
        lines.append(f"  {s['what']:<44} {pct(s['change']):>8}")
    if p.get("what_if"):
        lines += what_if_lines(p["what_if"])
    return "\n".join(lines)


def what_if_lines(w: dict[str, Any]) -> list[str]:
    lines = [
        "scale what-ifs: the same run on other cluster sizes (the planner's fastest layout that fits)",
        f"  {'GPUs':>6} {'layout':<36} {'step s':>8} {'MFU':>6} {'comm':>6} {'bubble':>6} {'wall':>10} "
        f"{'GPU-hours':>11}",
    ]
    for r in w["rows"]:
        if r["layout"] is None:
            lines.append(f"  {r['num_gpus']:>6} {'no layout fits':<36}")
            continue
        lines.append(
            f"  {r['num_gpus']:>6} {r['layout']:<36} {r['step_time_s']:>8.3g} {100 * r['mfu']:>5.1f}% "
            f"{100 * r['comm_share']:>5.1f}% {100 * r['bubble_share']:>5.1f}% {duration(r['wall_s']):>10} "
            f"{r['gpu_hours']:>11,.0f}"
        )
    if w["exponents"]:
        lines.append(
            "  scaling exponent per step (1 = twice the GPUs halve the time): "
            + ", ".join(f"{a}->{b} {e:.2f}" for a, b, e in w["exponents"])
        )
    if w["knee"] is not None:
        lines.append(f"  adding GPUs stops paying past {w['knee']:,} GPUs (exponent below 0.5 from there)")
    else:
        lines.append("  every step up to the largest size still pays (exponent >= 0.5)")
    if w["ceiling"] is not None:
        lines.append(f"  system ceiling: the shortest run is {duration(w['ceiling_wall_s'])} at {w['ceiling']:,} GPUs")
    lines += [f"  assumes: {a}" for a in w["assumptions"]]
    return lines


def _cpu_time_note(clock: str) -> list[str]:
    """A CPU plan fitted on CPU seconds times the run alone on one idle core; say what wall time is."""
    if clock != "CPU":
        return []
    return [
        "  the time is CPU time: the run alone on one idle core; on a shared machine its wall time is that "
        "over the share of a core the run gets"
    ]
