"""The two forms of the compute frontier L*(C), fitted to its measured points in log space.

    sat = fit_saturating(flops, loss)      # L*(C) = E + A (C / c_ref)^-gamma
    pow_ = fit_power(flops, loss)          # L*(C) = A (C / c_ref)^-gamma
    sat.log_predict(1e24), sat.sd(1e24)    # ln L* and its delta-method sd
    sat.degenerate                         # why the form is not used, or None

On 1-2 decades of compute a saturating L*(C) leans pessimistic far out (its floor absorbs the small
budgets' curvature) and a pure power law optimistic; they bracket the truth from opposite sides on
more than one data set (docs/extrapolation.md), so the frontier reports both and predicts with their
geometric mean, their gap counted as uncertainty (scalelab.fitting.allocation.frontier).

Both are fitted by least squares on ln L* (the points' relative errors); c_ref, the points' geometric
mean compute, keeps A of order one. The saturating form's covariance is the delta method's
(Gauss-Newton), sigma^2 (J'J)^-1; the power form is an ordinary least-squares line.

A saturating fit is flagged degenerate when its E sits within FLOOR_MARGIN of the lowest point (the
floor explains the points' curvature, and far out the form is flat) or gamma stops at a bound (the
points do not pin it). It is still one side of the bracket: the frontier's forward folds decide how
much weight it gets (scalelab.fitting.allocation.frontier_calibration), and the flag is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from scalelab.errors import UsageError

FLOOR_MARGIN = 0.03  # E within 3% of the lowest measured loss: the data's floor, not a fitted one
GAMMA_BOUNDS = (1e-4, 3.0)
GAMMA_STARTS = (0.05, 0.2, 0.6)
FLOOR_STARTS = (0.0, 0.8)  # E as a fraction of the lowest point


@dataclass(frozen=True, kw_only=True)
class FrontierForm:
    name: str  # "saturating" or "power"
    theta: tuple[float, ...]  # saturating: (E, a, gamma); power: (a, gamma); a = ln A
    cov: list[list[float]]  # covariance of theta (empty: not estimable)
    c_ref: float
    rss: float  # residual sum of squares of ln L*
    n_points: int
    degenerate: str | None = None  # why the fit is suspect (reported; the form stays in the bracket)
    names: tuple[str, ...] = field(default=())

    @property
    def dof(self) -> int:
        return self.n_points - len(self.theta)

    @property
    def params(self) -> dict[str, float]:
        return dict(zip(self.names, self.theta))

    def _parts(self, flops) -> tuple[np.ndarray, np.ndarray]:
        x = np.log(np.asarray(flops, dtype=float) / self.c_ref)
        if self.name == "saturating":
            e, a, g = self.theta
            p = np.exp(a - g * x)
            total = e + p
            jac = np.stack([1.0 / total, p / total, -x * p / total], axis=-1)
            return np.log(total), jac
        a, g = self.theta
        return a - g * x, np.stack([np.ones_like(x), -x], axis=-1)

    def log_predict(self, flops) -> np.ndarray:
        return self._parts(flops)[0]

    def sd(self, flops) -> np.ndarray:
        """Delta-method sd of ln L*(C) from the parameters' covariance (inf where it is unknown)."""
        _, jac = self._parts(flops)
        if not self.cov:
            return np.full(jac.shape[:-1], np.inf)
        cov = np.asarray(self.cov, dtype=float)
        return np.sqrt(np.maximum(np.einsum("...i,ij,...j->...", jac, cov, jac), 0.0))

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "params": self.params,
            "cov": self.cov,
            "c_ref": self.c_ref,
            "rss": self.rss,
            "n_points": self.n_points,
            "degenerate": self.degenerate,
        }

    @classmethod
    def from_dict(cls, d: dict) -> FrontierForm:
        names = tuple(d["params"])
        return cls(
            name=d["name"],
            theta=tuple(float(d["params"][k]) for k in names),
            cov=d.get("cov") or [],
            c_ref=float(d["c_ref"]),
            rss=float(d["rss"]),
            n_points=int(d["n_points"]),
            degenerate=d.get("degenerate"),
            names=names,
        )


def _cov(jac: np.ndarray, rss: float, dof: int) -> list[list[float]]:
    """sigma^2 (J'J)^-1 with sigma^2 = rss / dof; empty without residual degrees of freedom."""
    if dof < 1:
        return []
    info = jac.T @ jac
    try:
        inv = np.linalg.inv(info)
    except np.linalg.LinAlgError:
        inv = np.linalg.pinv(info)
    cov = inv * rss / dof
    return cov.tolist() if np.all(np.isfinite(cov)) else []


def _check(flops, loss, k: int) -> tuple[np.ndarray, np.ndarray, float]:
    c, y = np.asarray(flops, dtype=float), np.asarray(loss, dtype=float)
    if c.size < k or np.unique(c).size < k:
        raise UsageError(f"the frontier needs {k} points at distinct compute for this form, got {np.unique(c).size}")
    return c, y, float(np.exp(np.mean(np.log(c))))


def fit_power(flops, loss) -> FrontierForm:
    """ln L* = a - gamma ln(C / c_ref) by least squares (2+ points)."""
    c, y, c_ref = _check(flops, loss, 2)
    x = np.log(c / c_ref)
    design = np.column_stack([np.ones_like(x), -x])
    theta, *_ = np.linalg.lstsq(design, np.log(y), rcond=None)
    rss = float(np.sum((np.log(y) - design @ theta) ** 2))
    return FrontierForm(
        name="power", theta=(float(theta[0]), float(theta[1])), cov=_cov(design, rss, c.size - 2), c_ref=c_ref,
        rss=rss, n_points=c.size, names=("a", "gamma"),
    )  # fmt: skip


def fit_saturating(flops, loss) -> FrontierForm:
    """ln L* = ln(E + exp(a - gamma ln(C / c_ref))) by bounded least squares from a few starts (3+
    points); degenerate as the module docstring says."""
    c, y, c_ref = _check(flops, loss, 3)
    x, ly = np.log(c / c_ref), np.log(y)
    lo_y = float(y.min())

    def resid(t):
        return np.log(t[0] + np.exp(t[1] - t[2] * x)) - ly

    def jac(t):
        p = np.exp(t[1] - t[2] * x)
        total = t[0] + p
        return np.column_stack([1.0 / total, p / total, -x * p / total])

    lower, upper = [0.0, -60.0, GAMMA_BOUNDS[0]], [0.999 * lo_y, 60.0, GAMMA_BOUNDS[1]]
    best = None
    for frac in FLOOR_STARTS:
        for g in GAMMA_STARTS:
            e = frac * lo_y
            a = float(np.log(max(np.exp(np.mean(ly)) - e, 1e-6 * lo_y)))
            t0 = np.clip([e, a, g], np.array(lower) + 1e-12, np.array(upper) - 1e-12)
            r = optimize.least_squares(resid, t0, jac=jac, bounds=(lower, upper), xtol=1e-12, ftol=1e-12, gtol=1e-12)
            if best is None or r.cost < best.cost:
                best = r
    theta = tuple(float(v) for v in best.x)
    rss = float(2.0 * best.cost)
    why = None
    if theta[0] >= (1.0 - FLOOR_MARGIN) * lo_y:
        why = f"E {theta[0]:.4g} sits within {FLOOR_MARGIN:.0%} of the lowest point {lo_y:.4g} (the data's floor)"
    elif not GAMMA_BOUNDS[0] * 1.01 < theta[2] < GAMMA_BOUNDS[1] / 1.01:
        why = f"gamma {theta[2]:.3g} stops at a bound of its range"
    return FrontierForm(
        name="saturating", theta=theta, cov=_cov(jac(best.x), rss, c.size - 3), c_ref=c_ref, rss=rss,
        n_points=c.size, degenerate=why, names=("E", "a", "gamma"),
    )  # fmt: skip


def natural(form: FrontierForm) -> dict[str, float]:
    """The form's parameters in natural units at C in FLOPs: E, A, gamma with L* = E + A C^-gamma."""
    p = form.params
    big_a = math.exp(p["a"]) * form.c_ref ** p["gamma"]
    return ({"E": p["E"]} if "E" in p else {}) | {"A": big_a, "gamma": p["gamma"]}
