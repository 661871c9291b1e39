"""Compute-optimal predictions, one answer for every command: the frontier first, the surface beside it.

    co = compute_optimal(frontier, surface, 5.76e23)   # ComputeOptimal
    co.loss                      # PredictionInterval of L*(C): the frontier's (scalelab.fitting.frontier)
    co.n_opt, co.d_opt           # N*(C) on the frontier's line through the measured minima, D* = C / 6N*
    co.surface_loss, co.disagree # the surface's own L*(C) beside it, and whether the two disagree
    anchored_interval(frontier, surface, n, d, flops)   # a run at (N, D): the frontier's level there

`scalelab predict --flops`, `scalelab allocate`, `plan-run` and `sweep next`'s compute-optimal
proposals all read L*(C), N*(C) through here, from a live fit (scalelab.fitting.scaling_fit) or a
saved one (scalelab.fitting.from_report, scalelab.planning.loss_model). Without a frontier (fewer
than three measured minima) the surface answers, and says so (`source`).

A run at (N, D) near the optimum takes the frontier's L*(C) times the surface's excess there, its
own loss over its optimum along the same compute, L_s(N, D) / L_s*(C) >= 1: the frontier fixes the
level, which the surface extrapolates badly, and the surface the small cost of being off the optimum
(a shape's rounding, a size between two shapes), which it measures well. The interval is the
frontier's. A degenerate surface (scalelab.fitting.degeneracy) predicts every run this way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scalelab.fitting.frontier import FrontierFit, FrontierPrediction
from scalelab.fitting.predictive import PredictionInterval, interval_from_parts


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
    pred = frontier.predict(flops)
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
    excess = max(surface.point(n, d) / surface.optimum(flops)[2], 1.0)
    pred = frontier.predict(flops)
    return _from_frontier(pred, pred.point * excess)
