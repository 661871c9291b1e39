"""Identification gates: may a fitted law be extrapolated to propose a compute-optimal run?

A law fitted to IsoFLOP runs is only a basis for extrapolation when the runs identify it. The
gates (what a reviewer checks first; docs/architecture.md, "Method"):

  bracketed         every IsoFLOP slice's minimum is measured (a slice: a budget with 3+ sizes;
                    single proposed runs are points, not slices): the best run is not the smallest
                    or the largest size of its slice, and Approach 2's parabola in ln N has
                    significant upward curvature with its vertex inside the sampled sizes.
  exponents         alpha and beta lie in a plausible range (default [0.1, 1.0]: published
                    Chinchilla-form fits give 0.27-0.76) and no parameter sits on its fit bound.
  starts_agree      the fit's distinct end points within 0.1% of the best objective agree on the
                    compute-optimal size and loss at the target budget (N* within x1.25, L* within
                    0.5%); otherwise the data leave the optimum undetermined.
  approaches_agree  at every bracketed budget, Approach 3's N*(C) lies inside Approach 2's interval
                    for the parabola vertex (delta method); the two approaches disagreeing is a
                    signal (Hoffmann et al. 2022), not noise.
  law_holds         the law is not degenerate (scalelab.fitting.entry.degeneracy): E off the data's floor,
                    and its optimum along the measured slices on their located minima. A law that
                    fits its runs with a floor they never approach extrapolates badly.

Pure: arrays and fit objects in, `GateReport` out. `GateReport.failed` names the gates that failed
and `brackets` says, per budget, which edge holds the best run, so the proposer can ask for the runs
that would pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from scalelab.fitting.entry.degeneracy import Finding
from scalelab.fitting.estimate.approaches import budget_minimum, group_budgets
from scalelab.fitting.estimate.diagnostics import DISAGREE_REL_OBJECTIVE, bound_warnings
from scalelab.fitting.forms.laws import Law

PLAUSIBLE_EXPONENTS = (0.1, 1.0)
STARTS_N_RATIO = 1.25  # near-best end points may disagree on N* by at most this factor
STARTS_LOSS_REL = 0.005  # ... and on L* by at most this relative difference
MIN_SIZES = 3  # a budget needs this many distinct sizes to be judged

Optimum = Callable[[dict[str, float], float], tuple]  # (params, flops) -> (N*, D*, L*, ...)


@dataclass(kw_only=True, slots=True)
class Gate:
    name: str
    passed: bool
    value: str  # what was measured, one line
    threshold: str  # what passing means
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class BudgetBracket:
    """How one FLOP budget's sizes sit around its minimum."""

    flops: float
    sizes: list[float]  # distinct N, ascending
    best_size: float  # N of the lowest loss
    edge: str | None  # "low" / "high" when the best run is the smallest / largest size, else None
    vertex: float | None  # Approach 2's N* (parabola vertex), None when it has no vertex
    vertex_interval: tuple[float, float] | None
    flat: bool
    boundary: bool

    @property
    def bracketed(self) -> bool:
        return self.edge is None and not self.flat and not self.boundary and len(self.sizes) >= MIN_SIZES


@dataclass(kw_only=True, slots=True)
class GateReport:
    gates: list[Gate]
    brackets: list[BudgetBracket]

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @property
    def failed(self) -> list[str]:
        return [g.name for g in self.gates if not g.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failed": self.failed,
            "gates": [asdict(g) for g in self.gates],
            "brackets": [dict(asdict(b), bracketed=b.bracketed) for b in self.brackets],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateReport:
        """The report back from to_dict's JSON (a saved round's gates)."""
        brackets = []
        for b in d["brackets"]:
            fields = {k: v for k, v in b.items() if k != "bracketed"}
            iv = fields.get("vertex_interval")
            brackets.append(BudgetBracket(**dict(fields, vertex_interval=None if iv is None else tuple(iv))))
        return cls(gates=[Gate(**g) for g in d["gates"]], brackets=brackets)


def budget_brackets(
    params: np.ndarray, loss: np.ndarray, flops: np.ndarray, budget_labels: np.ndarray | None = None
) -> list[BudgetBracket]:
    """Per-budget bracketing facts: where the best run sits, and Approach 2's parabola vertex.

    Only IsoFLOP slices are judged: a budget with fewer than MIN_SIZES distinct sizes (a proposed
    compute-optimal run, a narrowing run) measures a point, not a minimum, and is left out."""
    params, loss, flops = (np.asarray(a, dtype=float) for a in (params, loss, flops))
    labels = group_budgets(flops) if budget_labels is None else np.asarray(budget_labels)
    out = []
    for lab in np.unique(labels):
        idx = np.flatnonzero(labels == lab)
        sizes = sorted(set(params[idx].tolist()))
        if len(sizes) < MIN_SIZES:
            continue
        best = float(params[idx][np.argmin(loss[idx])])
        edge = None
        if len(sizes) >= 2 and best == sizes[0]:
            edge = "low"
        elif len(sizes) >= 2 and best == sizes[-1]:
            edge = "high"
        m = budget_minimum(params[idx], loss[idx], flops[idx])
        out.append(
            BudgetBracket(
                flops=float(np.median(flops[idx])),  # the IsoFLOP label itself when runs share one
                sizes=sizes,
                best_size=best,
                edge=edge,
                vertex=None if m is None or m.flat else m.n_opt,
                vertex_interval=None if m is None else m.n_opt_interval,
                flat=True if m is None else m.flat,
                boundary=False if m is None else m.boundary,
            )
        )
    return out


def bracketing_gate(brackets: Sequence[BudgetBracket]) -> Gate:
    bad = [b for b in brackets if not b.bracketed]
    parts = []
    for b in brackets:
        why = (
            f"best at the {b.edge} edge"
            if b.edge
            else "too few sizes"
            if len(b.sizes) < MIN_SIZES
            else "flat"
            if b.flat
            else "vertex outside"
            if b.boundary
            else "ok"
        )
        parts.append(f"C={b.flops:.3g}: {why}")
    return Gate(
        name="bracketed",
        passed=not bad and len(brackets) >= 2,
        value=f"{len(brackets) - len(bad)} of {len(brackets)} budgets bracketed ({'; '.join(parts)})",
        threshold=f"2+ IsoFLOP slices (budgets with >= {MIN_SIZES} sizes), each with its best run interior and a "
        "curved parabola whose vertex lies inside its sizes",
        detail={"unbracketed": [b.flops for b in bad]},
    )


def exponents_gate(law: Law, params: dict[str, float], theta: Sequence[float], plausible=PLAUSIBLE_EXPONENTS) -> Gate:
    lo, hi = plausible
    exps = {n: float(params[n]) for n in law.exponent_names()}
    outside = {n: v for n, v in exps.items() if not lo <= v <= hi}
    bounds = bound_warnings(law, np.asarray(theta, dtype=float))
    at_bound = [w.split("bound of ")[1].split(" ")[0] for w in bounds]
    value = ", ".join(f"{n}={v:.3f}" for n, v in exps.items())
    if at_bound:
        value += f"; at a fit bound: {', '.join(at_bound)}"
    return Gate(
        name="exponents",
        passed=not outside and not at_bound,
        value=value,
        threshold=f"exponents in [{lo:g}, {hi:g}], no parameter on a fit bound",
        detail={"exponents": exps, "outside": outside, "at_bound": at_bound},
    )


def starts_gate(
    law: Law,
    thetas: Sequence[Sequence[float]],
    objectives: Sequence[float],
    optimum: Optimum,
    target_flops: float,
) -> Gate:
    thetas = np.atleast_2d(np.asarray(thetas, dtype=float))
    objectives = np.asarray(objectives, dtype=float)
    best = float(np.nanmin(objectives))
    near = np.flatnonzero(objectives <= best + DISAGREE_REL_OBJECTIVE * abs(best) + 1e-15)
    n_opt, l_opt = [], []
    for i in near:
        p = law.to_natural(thetas[i])
        try:
            n, _, loss = optimum(p, target_flops)[:3]
        except Exception:
            continue
        n_opt.append(float(n))
        l_opt.append(float(loss))
    if len(n_opt) < 2:
        return Gate(
            name="starts_agree",
            passed=True,
            value=f"one distinct end point within {DISAGREE_REL_OBJECTIVE:.1%} of the best objective",
            threshold=f"near-best end points: N* within x{STARTS_N_RATIO:g}, L* within {STARTS_LOSS_REL:.1%}",
            detail={"n_near": len(n_opt)},
        )
    n_ratio = max(n_opt) / min(n_opt)
    l_rel = (max(l_opt) - min(l_opt)) / min(l_opt)
    return Gate(
        name="starts_agree",
        passed=n_ratio <= STARTS_N_RATIO and l_rel <= STARTS_LOSS_REL,
        value=f"{len(n_opt)} near-best end points: N*({target_flops:.3g}) spans x{n_ratio:.3f}, L* spans {l_rel:.2%}",
        threshold=f"N* within x{STARTS_N_RATIO:g}, L* within {STARTS_LOSS_REL:.1%}",
        detail={"n_near": len(n_opt), "n_ratio": n_ratio, "loss_rel": l_rel},
    )


def approaches_gate(brackets: Sequence[BudgetBracket], params: dict[str, float], optimum: Optimum) -> Gate:
    rows, bad = [], []
    for b in brackets:
        if not b.bracketed or b.vertex_interval is None:
            continue
        n3 = float(optimum(params, b.flops)[0])
        lo, hi = b.vertex_interval
        ok = lo <= n3 <= hi
        rows.append({"flops": b.flops, "approach2": b.vertex, "interval": [lo, hi], "approach3": n3, "ok": ok})
        if not ok:
            bad.append(b.flops)
    value = "; ".join(
        f"C={r['flops']:.3g}: A3 {r['approach3']:.3g} vs A2 {r['approach2']:.3g} [{r['interval'][0]:.3g}, "
        f"{r['interval'][1]:.3g}]"
        for r in rows
    )
    return Gate(
        name="approaches_agree",
        passed=bool(rows) and not bad,
        value=value or "no bracketed budget with an Approach 2 interval",
        threshold="Approach 3's N*(C) inside Approach 2's vertex interval at every bracketed budget",
        detail={"budgets": rows, "disagree": bad},
    )


def law_holds_gate(findings: Sequence[Finding]) -> Gate:
    """Fails on the degeneracy findings no other gate judges (the floor, the slices' minima)."""
    bad = [f for f in findings if f.name in ("floor", "minima")]
    return Gate(
        name="law_holds",
        passed=not bad,
        value="; ".join(f.line for f in bad) or "E off the data's floor; the optimum follows the measured minima",
        threshold="E not within 3% of the lowest loss; the law's L*(C) on the slices' located minima",
        detail={"findings": [f.to_dict() for f in bad]},
    )


def check_gates(
    law: Law,
    params: dict[str, float],
    theta: Sequence[float],
    alt_thetas: Sequence[Sequence[float]],
    alt_objectives: Sequence[float],
    optimum: Optimum,
    *,
    n: np.ndarray,
    loss: np.ndarray,
    flops: np.ndarray,
    target_flops: float,
    budget_labels: np.ndarray | None = None,
    plausible=PLAUSIBLE_EXPONENTS,
    findings: Sequence[Finding] = (),
) -> GateReport:
    """Every gate for one fit (module docstring). n, loss, flops: the fitted runs (flops = their budgets);
    findings: the law's degeneracy findings (scalelab.fitting.entry.degeneracy)."""
    brackets = budget_brackets(n, loss, flops, budget_labels)
    gates = [
        bracketing_gate(brackets),
        exponents_gate(law, params, theta, plausible),
        starts_gate(law, alt_thetas, alt_objectives, optimum, target_flops),
        approaches_gate(brackets, params, optimum),
        law_holds_gate(findings),
    ]
    return GateReport(gates=gates, brackets=brackets)
