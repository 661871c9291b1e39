"""Degenerate laws: a surface that fits its runs but cannot be extrapolated, said in one line each.

    findings = diagnose(law, params, theta, loss=L, fit_warnings=fit.warnings, frontier=frontier, optimum=opt)
    [f.line for f in findings]          # what `scalelab fit` prints, one plain line each
    degenerate(findings)                # True: predictions fall back to the frontier, the loop's gate refuses

On 1-2 decades of small budgets a law of Chinchilla's form can reach its best objective with E at
the data's floor and exponents near or above 1 (docs/extrapolation.md): it fits the runs and
extrapolates badly, and a user saw only "starts disagree". The findings:

  floor      E within FLOOR_MARGIN of the lowest observed loss: the law explains the runs' curvature
             by a floor the runs never approach, and far out it is flat;
  exponents  an exponent above 1, or any parameter on its fit bound;
  minima     the surface's own optimum along each measured slice disagrees with the slice's located
             minimum (scalelab.fitting.allocation.frontier_points): its L*(C) off by more than the points'
             scatter allows (MINIMA_REL or 2 sds, whichever is larger, on average). Where the two
             place N* is the approaches_agree gate's (scalelab.fitting.entry.gates);
  starts     near-best starts end far apart (scalelab.fitting.estimate.diagnostics.disagreement_warning).

The first three make the law degenerate; disagreeing starts are reported (the loop's starts_agree
gate judges them at the target).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from scalelab.fitting.allocation.frontier import FrontierFit
from scalelab.fitting.allocation.frontier_forms import FLOOR_MARGIN
from scalelab.fitting.estimate.diagnostics import bound_warnings
from scalelab.fitting.forms.laws import Law

DEGENERATE = ("floor", "exponents", "minima")
MAX_EXPONENT = 1.0
MINIMA_REL = 0.01  # the least mean |ln(L*_surface / L*_slice)| read as disagreement


@dataclass(frozen=True, slots=True)
class Finding:
    name: str  # floor | exponents | minima | starts
    line: str  # one plain sentence

    def to_dict(self) -> dict:
        return asdict(self)


def degenerate(findings) -> bool:
    return any((f.name if isinstance(f, Finding) else f["name"]) in DEGENERATE for f in findings)


def _minima(frontier: FrontierFit, params: dict[str, float], optimum: Callable) -> Finding | None:
    slices = [p for p in frontier.points if p.located and p.bracketed]
    if not slices:
        return None
    rel = [float(np.log(optimum(params, p.flops)[2] / p.loss)) for p in slices]
    mean_abs = float(np.mean(np.abs(rel)))
    allowed = max(MINIMA_REL, 2.0 * frontier.core.noise)
    if mean_abs > allowed:
        return Finding(
            "minima",
            f"the surface's optimum loss along the {len(slices)} measured slices is off their located minima by "
            f"{100 * mean_abs:.1f}% on average (the points scatter {100 * frontier.core.noise:.1f}%): it does not "
            "follow the frontier it was fitted to",
        )
    return None


def diagnose(
    law: Law,
    params: dict[str, float],
    theta,
    *,
    loss: np.ndarray,
    fit_warnings: list[str],
    frontier: FrontierFit | None = None,
    optimum: Callable | None = None,
) -> list[Finding]:
    """Every finding of the module docstring for one fitted law (`optimum`: (params, C) -> (N*, D*,
    L*), for the minima check)."""
    out = []
    floor = float(np.min(loss))
    if "E" in params and params["E"] >= (1.0 - FLOOR_MARGIN) * floor:
        out.append(
            Finding(
                "floor",
                f"E {params['E']:.4g} sits at the data's floor (lowest loss {floor:.4g}): the law reads the runs' "
                "curvature as a floor they never approach, and flattens far out",
            )
        )
    high = {n: params[n] for n in law.exponent_names() if params[n] > MAX_EXPONENT}
    at_bound = [w.split("bound of ")[1].split(" ")[0] for w in bound_warnings(law, np.asarray(theta, dtype=float))]
    if high or at_bound:
        what = [f"{n} {v:.3g} above {MAX_EXPONENT:g}" for n, v in high.items()] + [
            f"{n} on its bound" for n in at_bound
        ]
        out.append(Finding("exponents", f"exponents not plausible: {', '.join(what)}"))
    if frontier is not None and optimum is not None:
        found = _minima(frontier, params, optimum)
        if found is not None:
            out.append(found)
    for w in fit_warnings:
        if w.startswith("starts disagree"):
            out.append(Finding("starts", w.split(";")[0]))
            break
    return out
