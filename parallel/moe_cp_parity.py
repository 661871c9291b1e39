"""`scalelab parity` for the MoE (expert parallel) and context-parallel layouts.

    rows = run_moe_cp_parity(["ep2", "fsdp4xep2", "cp2-ring"], seed=0, tolerance=1e-5)
    print(format_moe_cp_rows(rows))

EP layouts run in scalelab.parallel.ep_parity (MoE debug model, SGD steps), CP layouts in
scalelab.parallel.cp_parity (dense model, one forward+backward).
"""

from __future__ import annotations

from scalelab.parallel.cp_parity import CPSpec, cp_parity, is_cp_layout, parse_cp_layout
from scalelab.parallel.ep_parity import EPSpec, ep_parity, is_ep_layout, parse_ep_layout


def is_moe_cp_layout(name: str) -> bool:
    """True for the layouts this module checks (epN..., cpN...; see the two parity modules)."""
    return is_ep_layout(name) or is_cp_layout(name)


def check_moe_cp_layouts(names: list[str]) -> None:
    """UsageError for a malformed EP/CP layout name (before any process starts)."""
    for n in names:
        parse_ep_layout(n) if is_ep_layout(n) else parse_cp_layout(n)


def run_moe_cp_parity(names: list[str], *, seed: int = 0, tolerance: float = 1e-5, steps: int = 2) -> list[dict]:
    """EP layouts against the MoE debug model, CP layouts against the dense one (one group per world)."""
    ep = [n for n in names if is_ep_layout(n)]
    cp = [n for n in names if is_cp_layout(n)]
    for n in ep:
        parse_ep_layout(n)
    for n in cp:
        parse_cp_layout(n)
    rows = []
    if ep:
        rows += ep_parity(ep, EPSpec(seed=seed, tolerance=tolerance, steps=steps))
    if cp:
        rows += cp_parity(cp, CPSpec(seed=seed, tolerance=tolerance))
    return rows


def format_moe_cp_rows(rows: list[dict]) -> str:
    """A fixed-width table of EP/CP parity rows."""
    lines = [
        f"{'layout':<20} {'world':>5} {'max|Δloss|':>11} {'max|Δgrad|':>11} {'max|Δparam|':>12} {'router':>7} "
        f"{'memory':>7}  result",
        "-" * 86,
    ]
    for r in rows:
        ep = "router_counts_equal" in r
        grad = r["max_expert_grad_diff"] if ep else r["max_grad_diff"]
        param = f"{r['max_param_diff']:>12.2e}" if ep else f"{'logits ' + format(r['max_logit_diff'], '.1e'):>12}"
        router = ("ok" if r["router_counts_equal"] and r["max_aux_diff"] <= 1e-5 else "WRONG") if ep else "-"
        memory = ("ok" if r["memory_ok"] else "WRONG") if ep else "-"
        lines.append(
            f"{r['layout']:<20} {r['world_size']:>5} {r.get('max_loss_diff', r.get('loss_diff')):>11.2e} "
            f"{grad:>11.2e} {param} {router:>7} {memory:>7}  {'ok' if r['ok'] else 'FAIL'}"
        )
    lines.append("EP: MoE debug model, SGD steps vs one device (per-rank micro-batches); CP: one fwd+bwd, dense model")
    return "\n".join(lines)
