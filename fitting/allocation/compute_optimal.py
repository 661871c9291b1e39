"""Compute-optimal predictions, one answer for every command: the frontier first, the surface beside it.

    co = compute_optimal(frontier, surface, 5.76e23)   # ComputeOptimal
    co.loss                      # PredictionInterval of L*(C): the frontier's (scalelab.fitting.allocation.frontier)
    co.n_opt, co.d_opt           # N*(C) on the frontier's line through the measured minima, D* = C / 6N*
    co.surface_loss, co.disagree # the surface's own L*(C) beside it, and whether the two disagree
    anchored_interval(frontier, surface, n, d, flops)   # a run at (N, D): the frontier's level there

`scalelab predict --flops`, `scalelab allocate`, `plan-run` and `sweep next`'s compute-optimal
proposals all read L*(C), N*(C) through here, from a live fit (scalelab.fitting.entry.scaling_fit) or a
saved one (scalelab.fitting.entry.from_report, scalelab.planning.loss_model). Without a frontier (fewer
than three measured minima) the surface answers, and says so (`source`).

The surface is also the frontier's third candidate (scalelab.fitting.allocation.frontier_calibration), weighted
as its forward folds earn it: at C, L_s at the frontier's N*(C) (its own optimum where the frontier
has no N* line). A run at (N, D) takes the frontier's forms times the surface's excess there, its
loss over that reference along the same compute, x = L_s(N, D) / L_s(N*, C / 6N*), and the surface
candidate at (N, D) itself: the frontier fixes the level, which the surface extrapolates badly, and
the surface the cost of being elsewhere than N* along the IsoFLOP line (a shape's rounding, a size
between two shapes), which it measures well. The interval is the frontier's.

An envelope of loss curves (a few models, each along its own fixed schedule) is the best the family's
sizes achieved, not an optimum, and the curves pin the surface's dependence on D within each model:
there a run at (N, D) is the surface's own prediction, its interval's scale the frontier's with the
surface's distance from the frontier's point as its spread, calibrated on the surface's own forward
errors on the envelope (FrontierFit.run_interval). A degenerate surface is no candidate
(scalelab.fitting.entry.degeneracy): it predicts every run at the frontier's level (x = 1 for an envelope).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scalelab.fitting.allocation.frontier import FrontierFit, FrontierPrediction
from scalelab.fitting.uncertainty.predictive import PredictionInterval, interval_from_parts


@dataclass(frozen=True, kw_only=True)
class Surface:
    """What the frontier needs of a law of N and D (a single law or a stacked one)."""

    point: Callable[[float, float], float]  # L(N, D)
    optimum: Callable[[float], tuple[float, float, float]]  # C -> (N*, D*, L*)
    interval: Callable[[float], PredictionInterval] | None = None  # C -> its own L*(C) interval
    holds: bool = True  # not degenerate


@dataclass(kw_only=True)
class ComputeOptimal:
    flops: float
    source: str  # "frontier" or "surface"
    loss: PredictionInterval
    n_opt: float
    d_opt: float
    n_interval: tuple[float, float] | None
    forms: dict[str, float]  # the frontier's forms' L*(C) (empty from the surface)
    surface_loss: float
    surface_n: float
    surface_interval: tuple[float, float] | None
    disagree: bool  # each outside the other's interval, where there is one

    def to_dict(self) -> dict:
        return {
            "flops": self.flops,
            "source": self.source,
            "loss": self.loss.to_dict(),
            "n_opt": self.n_opt,
            "d_opt": self.d_opt,
            "n_opt_interval": None if self.n_interval is None else list(self.n_interval),
            "forms": dict(self.forms),
            "surface": {
                "loss": self.surface_loss,
                "n_opt": self.surface_n,
                "interval": None if self.surface_interval is None else list(self.surface_interval),
            },
            "disagree": self.disagree,
        }

    def line(self) -> str:
        """'L*(1e24) frontier 1.974 [1.90, 2.05] (saturating 2.01, power 1.94); surface 1.88 [...]: they disagree'."""
        lvl = int(round(100 * self.loss.level))
        lo, hi = self.loss.lo, self.loss.hi
        text = f"L*({self.flops:.3g}) {self.source} {self.loss.point:.4g} [{lo:.4g}, {hi:.4g}] ({lvl}%)"
        if self.forms:
            text += " (" + ", ".join(f"{k} {v:.4g}" for k, v in self.forms.items()) + ")"
        if self.source == "frontier":
            iv = self.surface_interval
            text += f"; surface {self.surface_loss:.4g}" + (f" [{iv[0]:.4g}, {iv[1]:.4g}]" if iv else "")
            text += ": they disagree" if self.disagree else ""
        return text


def _from_frontier(pred: FrontierPrediction, point: float) -> PredictionInterval:
    """The frontier's interval around `point`, its parts as the sds they add up to (tau applied)."""
    tau = pred.parts["tau"]
    parts = {"frontier fit": tau * pred.parts["fit"], "frontier noise": tau * pred.parts["noise"]}
    parts["forms"] = tau * pred.parts["forms"]
    out = interval_from_parts(point, parts, pred.level)
    out.parts["decades"] = pred.decades
    return out


def _reference_size(frontier: FrontierFit, surface: Surface, flops: float) -> float:
    """Where the frontier reads the surface at C: its own N*(C) line, else the surface's optimum."""
    n_opt = frontier.n_opt(flops)[0]
    return n_opt if n_opt is not None else surface.optimum(flops)[0]


def _surface_at(frontier: FrontierFit, surface: Surface):
    """The surface as the frontier's third candidate (C -> its loss at the reference size), or None
    for a degenerate surface."""
    if not surface.holds:
        return None

    def at(c: float) -> float:
        n_ref = _reference_size(frontier, surface, c)
        return surface.point(n_ref, c / (6.0 * n_ref))

    return at


def compute_optimal(frontier: FrontierFit | None, surface: Surface, flops: float) -> ComputeOptimal:
    """L*(C), N*(C), D*(C) at `flops` (module docstring)."""
    n_s, _, l_s = surface.optimum(flops)
    own = surface.interval(flops) if surface.interval is not None else None
    s_iv = None if own is None else (own.lo, own.hi)
    if frontier is None:
        loss = own or interval_from_parts(l_s, {}, 0.95)
        return ComputeOptimal(
            flops=flops, source="surface", loss=loss, n_opt=n_s, d_opt=flops / (6.0 * n_s), n_interval=None,
            forms={}, surface_loss=l_s, surface_n=n_s, surface_interval=s_iv, disagree=False,
        )  # fmt: skip
    pred = frontier.predict(flops, _surface_at(frontier, surface))
    n_opt = pred.n_opt if pred.n_opt is not None else n_s
    loss = _from_frontier(pred, pred.point)
    disagree = not loss.lo <= l_s <= loss.hi or (s_iv is not None and not s_iv[0] <= loss.point <= s_iv[1])
    return ComputeOptimal(
        flops=flops, source="frontier", loss=loss, n_opt=n_opt, d_opt=flops / (6.0 * n_opt),
        n_interval=pred.n_interval if pred.n_opt is not None else None, forms=pred.forms, surface_loss=l_s,
        surface_n=n_s, surface_interval=s_iv, disagree=bool(disagree),
    )  # fmt: skip


def anchored_interval(frontier: FrontierFit, surface: Surface, n: float, d: float, flops: float) -> PredictionInterval:
    """A run at (N, D) of budget `flops`: the frontier's L*(C) times the surface's excess (module docstring)."""
    at_n_d = surface.point(n, d)
    if frontier.kind == "envelope":
        if not surface.holds:
            pred = frontier.predict(flops)
            return _from_frontier(pred, pred.point)
        return _from_frontier(frontier.run_interval(flops, at_n_d, _surface_at(frontier, surface)), at_n_d)
    n_ref = _reference_size(frontier, surface, flops)
    excess = at_n_d / surface.point(n_ref, flops / (6.0 * n_ref))
    # the surface candidate at (N, D), scaled back by the excess the forms are multiplied by
    pred = frontier.predict(flops, (lambda _c: at_n_d / excess) if surface.holds else None)
    return _from_frontier(pred, pred.point * excess)
