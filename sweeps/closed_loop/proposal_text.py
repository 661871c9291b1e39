"""Plain-text views of a proposal (`scalelab sweep next`, the demo): the fit, its gates, the next round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalelab.fitting.selection.ensemble import format_stacked
from scalelab.store import objects


def format_proposal(p: dict[str, Any]) -> str:
    fit = p["fit"]
    lines = [f"fit: {p['law']} on {p['n_points']} runs ({p['loss_column']}), {p['replicates']} bootstrap replicates"]
    iv = p["intervals"]
    lines.append(
        "  " + ", ".join(f"{k}={v:.4g} [{iv[k][0]:.4g}, {iv[k][1]:.4g}]" for k, v in p["params"].items() if k in iv)
    )
    if fit.get("a") is not None and "a" in iv:
        lines.append(f"  a = beta/(alpha+beta) = {fit['a']:.3f} [{iv['a'][0]:.3f}, {iv['a'][1]:.3f}]  (N* ~ C^a)")
    lo, hi = p["loss_at_target_interval"]
    lines.append(
        f"  loss at C*={p['target_flops']:.3g}: {p['loss_at_target']:.4f}  [{lo:.4f}, {hi:.4f}] ({p['level']:.0%})  "
        f"N*={p['n_opt_at_target']:.3g} D*={p['d_opt_at_target']:.3g}"
    )
    for name, bt in p["backtest"].items():
        lines.append(
            f"  backtest {name}: "
            + (
                f"MARE {bt['mare']:.2%}, bias {bt['bias']:+.2%} on {bt['n_test']} runs"
                if "mare" in bt
                else bt["skipped"]
            )
        )
    ext = fit["extrapolation"]
    if ext["per_decade"] is not None:
        lines.append(
            f"  out-of-sample error: {ext['per_decade']:.2%} per decade of extrapolation "
            f"({ext['n_runs']} backtest runs)"
        )
    if fit.get("stacked"):
        lines += ["  " + line for line in format_stacked(fit["stacked"], indent="    ")]
    sel = fit.get("selection")
    if sel and "candidates" in sel:
        scores = ", ".join(
            f"{c['name']} {c['mare']:.2%}" if "mare" in c else f"{c['name']} (skipped)" for c in sel["candidates"]
        )
        lines.append(f"  law selection ({sel['protocol']}): {scores} -> {sel['loop_law']}")
    lines.append(format_gates(p["gates"]))
    lines += [f"  warning: {w}" for w in p["warnings"]]
    lines.append(f"next round (budget {p['budget_flops']:.3g} FLOPs, next budget {p['next_budget']:.3g}):")
    for q in p["proposals"]:
        lo, hi = q["predicted_interval"]
        extra = f"  predicted {q['predicted_loss']:.4f} [{lo:.4f}, {hi:.4f}]"
        if q.get("predicted_ends"):
            extra += " (bracket of {:.4f} and {:.4f})".format(*q["predicted_ends"])
        if "width_reduction" in q:
            extra += f"  narrows the C* interval by {q['width_reduction']:.4f}"
        lines.append(f"  {q['kind']:16s} {q['run_id']} N={q['params']:,} D={q['tokens']:,} C={q['flops']:.3g}{extra}")
    lines.append(f"spec: {p['spec_path']}   fit: {p['fit_path']}")
    out = objects.parent(objects.parent(p["spec_path"])) if objects.is_url(p["spec_path"]) else None
    lines.append(f"launch it: scalelab sweep launch {p['spec_path']} --out {out or Path(p['spec_path']).parent.parent}")
    return "\n".join(lines)


def format_gates(gates: dict[str, Any]) -> str:
    lines = ["gates: " + ("all passed" if gates["passed"] else "FAILED " + ", ".join(gates["failed"]))]
    for g in gates["gates"]:
        lines.append(f"  [{'pass' if g['passed'] else 'FAIL'}] {g['name']:16s} {g['value']}")
    for b in gates["brackets"]:
        sizes = ", ".join(f"{s:,.0f}" for s in b["sizes"])
        mark = (
            "bracketed"
            if b["bracketed"]
            else f"NOT bracketed ({b['edge'] or ('flat' if b['flat'] else 'vertex outside')})"
        )
        vertex = f", A2 vertex {b['vertex']:,.0f}" if b["vertex"] else ""
        lines.append(f"    C={b['flops']:.3g}: sizes [{sizes}], best {b['best_size']:,.0f}{vertex}: {mark}")
    return "\n".join(lines)
