"""What an IsoFLOP design carries, for `scalelab sweep plan`: where its sizes sit around a reference
N*(C), the shape effect of its depths and widths, and the price of replicating it.

    report = design_report(sweep, reference=read_frontier("results/audit", "--reference"), audit=audit,
                           noise=0.0056, replication=True)
    print(format_design_report(report))

- **Centring.** Per budget, the design's sizes against a reference law's N*(C) (a pilot: a recipe
  audit's frontier, a sweep's latest fit; by default the one the design's `isoflop.center: {fit: ...}`
  names): where N* falls between the smallest and largest size (0 = at the smallest, 1 = at the
  largest; a design centred on the optimum puts it near 0.5, and outside [0, 1] the minimum is not
  bracketed).
- **Shape.** Depth and aspect ratio (d_model / layers) per budget, and, with a recipe audit that
  measured shape cells (scalelab.sweeps.recipes.recipe_audit), the loss each run's aspect costs against the
  best one: the shape effect the design carries. Without one, the aspects alone.
- **Replication.** Seeds per design point against more sizes per budget (seeds spread over
  neighbouring sizes), each priced in FLOPs (and time, at the plan's measured throughput) and by the
  standard deviation it leaves in the first round's prediction of ln L*(C) at 3x, 10x and 30x the
  largest budget: the delta method for a least-squares fit of the reference law (Chinchilla) on the
  design's runs, Cov = sigma^2 (J'J)^-1 with J = d ln L / d theta at each run, sd^2 = g' Cov g with g
  the same gradient at the compute-optimal point (the allocation's own movement is second order
  there). sigma is the run-to-run noise (the spec's `fit.noise_floor`, a seed study's figure, or the
  one given), independent between runs: true for replicates and for a design whose points each
  have their own seeds (`seeds: {distinct: true}`, scalelab.sweeps.specs.seeds), not for runs sharing one
  seed's data order. The choice with the largest drop in the 30x sd per FLOP added is marked.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scalelab.errors import ConfigError
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.fitting.forms.laws import get_law
from scalelab.sweeps.recipes.recipe_audit import AuditResult
from scalelab.sweeps.specs.spec import Sweep, expand_sweep

MULTIPLES = (3.0, 10.0, 30.0)  # of the design's largest budget: where the first round's prediction is priced


@dataclass(kw_only=True, slots=True)
class BudgetLine:
    flops: float
    sizes: list[int]
    depths: tuple[int, int]
    aspects: tuple[float, float]  # d_model / layers, min and max
    n_opt: float | None  # the reference's N*(C)
    position: float | None  # (ln N* - ln N_min) / (ln N_max - ln N_min)
    shape_cost: tuple[float, float] | None  # the audit's cost of the runs' aspects: mean, max


@dataclass(kw_only=True, slots=True)
class ReplicationRow:
    choice: str
    runs: int
    flops: float
    seconds: float | None
    sd: list[float]  # of ln L*(C) at each multiple
    gain: float | None = None  # drop of the 30x sd per 1e12 FLOPs added, against the design as given
    why: str = ""  # a choice that cannot be built: why


@dataclass(kw_only=True)
class DesignReport:
    budgets: list[BudgetLine]
    reference: str | None
    shape_source: str | None
    replication: list[ReplicationRow] = field(default_factory=list)
    noise: float | None = None
    notes: list[str] = field(default_factory=list)


def design_report(
    sweep: Sweep,
    *,
    reference: dict[str, Any] | None = None,
    audit: AuditResult | None = None,
    noise: float | None = None,
    replication: bool = False,
    seconds_per_flop: float | None = None,
) -> DesignReport:
    """The report of an IsoFLOP sweep (module docstring); `reference` a {"law", "params"} fit."""
    params = reference["params"] if reference and reference.get("law") == "chinchilla" else None
    lines = []
    for c in sorted({r.labels["flops_budget"] for r in sweep.runs if "flops_budget" in r.labels}):
        runs = [r for r in sweep.runs if r.labels.get("flops_budget") == c]
        sizes = sorted({r.params for r in runs})
        models = [r.config["model"] for r in runs]
        aspects = [m["d_model"] / m["num_layers"] for m in models]
        n_opt = position = None
        if params is not None:
            n_opt = chinchilla_optimum(params, c)[0]
            span = math.log(sizes[-1] / sizes[0])
            position = math.log(n_opt / sizes[0]) / span if span > 0 else None
        costs = [audit.shape_cost(a) for a in aspects] if audit is not None else []
        shape = (float(np.mean(costs)), float(max(costs))) if costs and None not in costs else None
        lines.append(BudgetLine(flops=c, sizes=sizes, depths=(min(m["num_layers"] for m in models),
                                max(m["num_layers"] for m in models)), aspects=(min(aspects), max(aspects)),
                                n_opt=n_opt, position=position, shape_cost=shape))  # fmt: skip
    report = DesignReport(
        budgets=lines,
        reference=reference.get("source") if reference else None,
        shape_source="the recipe audit's shape cells" if audit is not None and audit.shape_cells else None,
        noise=noise,
    )
    if replication:
        if params is None or not noise:
            report.notes.append(
                "replication: needs a Chinchilla reference (--reference, or isoflop.center: {fit: ...}) and the "
                "run noise (fit.noise_floor, or --noise)"
            )
        else:
            report.replication = _replication(sweep, params, noise, seconds_per_flop)
    return report


def _gradients(params: dict[str, float], n: np.ndarray, d: np.ndarray) -> np.ndarray:
    """d ln L / d theta at each (N, D), theta Chinchilla's fit parameters (ln E, ln A, ln B, alpha, beta)."""
    law = get_law("chinchilla")
    theta = [math.log(params["E"]), math.log(params["A"]), math.log(params["B"]), params["alpha"], params["beta"]]
    k = len(n)
    t = torch.tensor([theta] * k, dtype=torch.float64)
    x = {"params": torch.tensor(n, dtype=torch.float64), "tokens": torch.tensor(d, dtype=torch.float64)}
    _, vjp = law.log_predict_vjp(t, x)
    return vjp(torch.eye(k, dtype=torch.float64)).numpy()


def prediction_sd(params: dict[str, float], n, d, noise: float, targets) -> list[float]:
    """sd of ln L*(C) at each target C predicted by a least-squares fit on runs at (n, d) with
    independent log-noise `noise` (the delta method of the module docstring)."""
    jac = _gradients(params, np.asarray(n, dtype=float), np.asarray(d, dtype=float))
    cov = noise**2 * np.linalg.pinv(jac.T @ jac)
    out = []
    for c in targets:
        n_opt, d_opt, _ = chinchilla_optimum(params, c)
        g = _gradients(params, np.array([n_opt]), np.array([d_opt]))[0]
        out.append(float(math.sqrt(max(g @ cov @ g, 0.0))))
    return out


def _choices(sweep: Sweep) -> list[tuple[str, dict[str, Any]]]:
    raw = sweep.raw
    sizes = int(raw["isoflop"].get("num_sizes", 5))
    out = [("as given", raw)]
    for k in (2, 3):
        out.append((f"{k} seeds per point", dict(raw, seeds={"count": k, "distinct": True})))
    for more in (sizes // 2, sizes, 2 * sizes):
        spread = copy.deepcopy(raw)
        spread["isoflop"]["num_sizes"] = sizes + more
        spread["seeds"] = {"count": 1, "distinct": True}
        out.append((f"{sizes + more} sizes per budget (spread)", spread))
    return out


def _replication(sweep: Sweep, params: dict[str, float], noise: float, seconds_per_flop) -> list[ReplicationRow]:
    largest = max(r.labels["flops_budget"] for r in sweep.runs if "flops_budget" in r.labels)
    targets = [m * largest for m in MULTIPLES]
    rows = []
    for name, raw in _choices(sweep):
        try:
            runs = sweep.runs if raw is sweep.raw else expand_sweep(raw, default_name=sweep.name).runs
        except ConfigError as e:  # more sizes in the same span can run out of distinct small shapes
            rows.append(ReplicationRow(choice=name, runs=0, flops=math.nan, seconds=None, sd=[], why=str(e)))
            continue
        flops = float(sum(r.cost_flops for r in runs))
        sd = prediction_sd(params, [r.params for r in runs], [r.num_tokens for r in runs], noise, targets)
        seconds = flops * seconds_per_flop if seconds_per_flop else None
        rows.append(ReplicationRow(choice=name, runs=len(runs), flops=flops, seconds=seconds, sd=sd))
    base = rows[0]
    for r in rows[1:]:
        if r.why:
            continue
        added = r.flops - base.flops
        r.gain = (base.sd[-1] - r.sd[-1]) / (added / 1e12) if added > 0 else None
    return rows


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def format_design_report(report: DesignReport) -> str:
    lines = ["design: " + (f"reference N*(C) from {report.reference}" if report.reference else "no reference law")]
    for b in report.budgets:
        where = ""
        if b.position is not None:
            state = "outside the sizes: NOT bracketed" if not 0 <= b.position <= 1 else "inside"
            where = f"; N* {b.n_opt:,.0f} at {b.position:.2f} of the span ({state})"
        shape = f"; shape cost {b.shape_cost[0]:+.2%} mean, {b.shape_cost[1]:+.2%} worst" if b.shape_cost else ""
        lines.append(
            f"  C={b.flops:.3g}: sizes {b.sizes[0]:,}..{b.sizes[-1]:,} ({len(b.sizes)}), layers {b.depths[0]}-"
            f"{b.depths[1]}, d_model/layers {b.aspects[0]:.3g}-{b.aspects[1]:.3g}{where}{shape}"
        )
    if report.shape_source is None:
        lines.append("  shape effect: not measured (a recipe audit with audit.shape cells measures it: --audit DIR)")
    if report.replication:
        best = max((r for r in report.replication if r.gain is not None), key=lambda r: r.gain, default=None)
        lines += [
            f"replication: sd of the first round's ln L*(C) prediction (delta method, Chinchilla reference, run noise "
            f"{report.noise:.2%} independent between runs)",
            f"  {'choice':32} {'runs':>5} {'FLOPs':>9} {'time':>8} "
            + " ".join(f"{f'sd {m:g}x':>8}" for m in MULTIPLES)
            + f" {'30x sd drop per 1e12 FLOPs':>27}",
        ]
        for r in report.replication:
            if r.why:
                lines.append(f"  {r.choice:32} cannot be built: {r.why}")
                continue
            gain = f"{r.gain:.3%}" if r.gain is not None else "-"
            mark = "  <- most per FLOP" if r is best else ""
            lines.append(
                f"  {r.choice:32} {r.runs:>5} {r.flops:>9.3g} {_fmt_s(r.seconds):>8} "
                + " ".join(f"{s:>8.2%}" for s in r.sd)
                + f" {gain:>27}{mark}"
            )
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines)
