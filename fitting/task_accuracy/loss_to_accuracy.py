"""Loss-to-accuracy sigmoid: the second step of two-step downstream prediction.

    acc(L) = a / (1 + exp(-k (L - L0))) + b

Step one predicts the loss L of a target run from a scaling law (fit.predict); step two maps that
loss to a downstream accuracy with this sigmoid, fitted on (loss, accuracy) pairs from smaller runs
or checkpoints. Because accuracy falls as loss rises, a fitted k is usually negative (with a > 0);
b is the floor (chance accuracy) and a + b the ceiling. The curve is symmetric under
(a, k, L0, b) -> (-a, -k, L0, a + b); fits are reported on the a > 0 branch.

    sig = fit_sigmoid(loss, acc)
    sig.predict(2.1)                          # accuracy at loss 2.1
    two_step_predict(loss_samples, sig)       # propagate bootstrap loss samples -> (acc, lo, hi)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from scalelab.errors import UsageError
from scalelab.fitting.estimate.intervals import percentile_interval

SIGMOID_PARAMS = ("a", "k", "L0", "b")


def sigmoid(loss: np.ndarray | float, a: float, k: float, L0: float, b: float) -> np.ndarray:  # noqa: N803
    """acc = a / (1 + exp(-k (L - L0))) + b, computed without overflow for large |k (L - L0)|."""
    z = -k * (np.asarray(loss, dtype=float) - L0)
    return a * np.exp(-np.logaddexp(0.0, z)) + b


@dataclass(kw_only=True, slots=True)
class SigmoidFit:
    """Fitted sigmoid parameters with their covariance (from the least-squares Jacobian)."""

    a: float
    k: float
    L0: float  # noqa: N815 - the formula's name
    b: float
    cov: np.ndarray  # 4x4, order SIGMOID_PARAMS; NaN where not identified
    rmse: float
    n_points: int

    @property
    def params(self) -> dict[str, float]:
        return {"a": self.a, "k": self.k, "L0": self.L0, "b": self.b}

    def predict(self, loss: np.ndarray | float) -> np.ndarray | float:
        out = sigmoid(loss, self.a, self.k, self.L0, self.b)
        return float(out) if np.ndim(loss) == 0 else out

    def intervals(self, level: float = 0.95) -> dict[str, tuple[float, float]]:
        """Wald intervals on a, k, L0, b from the Jacobian covariance (t quantile, n-4 dof)."""
        dof = max(self.n_points - 4, 1)
        q = float(stats.t.ppf(0.5 + level / 2.0, dof))
        se = np.sqrt(np.clip(np.diag(self.cov), 0.0, None))
        return {n: (float(v - q * s), float(v + q * s)) for n, v, s in zip(SIGMOID_PARAMS, self.params.values(), se)}

    def to_dict(self) -> dict:
        return {**self.params, "rmse": self.rmse, "n_points": self.n_points}


def fit_sigmoid(loss: np.ndarray, acc: np.ndarray, *, starts: int = 12, seed: int = 0) -> SigmoidFit:
    """Fit acc = a / (1 + exp(-k (L - L0))) + b by least squares from several starts.

    Starts: b at the lowest accuracy, a at the accuracy span, L0 spread over the loss range, k with
    both signs and several steepnesses scaled by the loss range; the lowest residual wins.

    Args:
        loss: per-point losses (nats).
        acc: per-point accuracies (any scale, e.g. 0-1 or percent).
        starts: number of random starts in addition to the deterministic grid.
        seed: RNG seed of the random starts.
    Returns:
        SigmoidFit.
    Raises:
        UsageError: fewer than 5 points, or non-finite inputs.
    """
    x = np.asarray(loss, dtype=float)
    y = np.asarray(acc, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise UsageError("loss and acc must be 1-D arrays of equal length")
    if x.size < 5:
        raise UsageError(f"a 4-parameter sigmoid needs at least 5 points, got {x.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise UsageError("loss and acc must be finite")
    span_l = float(np.ptp(x)) or 1.0
    span_a = float(np.ptp(y)) or 1.0

    def resid(p):
        return sigmoid(x, *p) - y

    rng = np.random.default_rng(seed)
    grid = [
        (span_a, sgn * s / span_l, l0, float(y.min()))
        for sgn in (-1.0, 1.0)
        for s in (2.0, 8.0)
        for l0 in np.quantile(x, [0.25, 0.5, 0.75])
    ]
    grid += [
        (
            span_a * rng.uniform(0.5, 3.0),
            rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 20.0) / span_l,
            rng.uniform(x.min() - span_l, x.max() + span_l),
            float(y.min()) - rng.uniform(0, 1) * span_a,
        )
        for _ in range(starts)
    ]
    best = None
    for p0 in grid:
        try:
            sol = optimize.least_squares(resid, np.asarray(p0, dtype=float), method="lm", max_nfev=4000)
        except (ValueError, FloatingPointError):
            continue
        if best is None or sol.cost < best.cost:
            best = sol
    if best is None:
        raise UsageError("the sigmoid fit failed from every start; check the (loss, accuracy) pairs")
    n = x.size
    sigma2 = 2.0 * best.cost / max(n - 4, 1)
    jtj = best.jac.T @ best.jac
    try:
        cov = np.linalg.inv(jtj) * sigma2
    except np.linalg.LinAlgError:
        cov = np.full((4, 4), np.nan)
    a, k, l0, b = (float(v) for v in best.x)
    if a < 0:
        # (a, k, L0, b) and (-a, -k, L0, a + b) are the same curve; report the a > 0 branch so
        # b is the floor. The Jacobian map is linear: flip a, k and add a to b.
        jac = np.array([[-1, 0, 0, 0], [0, -1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1]], dtype=float)
        a, k, b = -a, -k, a + b
        cov = jac @ cov @ jac.T
    return SigmoidFit(a=a, k=k, L0=l0, b=b, cov=cov, rmse=float(np.sqrt(2.0 * best.cost / n)), n_points=n)


def two_step_predict(
    loss_samples: np.ndarray | float, sig: SigmoidFit, *, level: float = 0.95
) -> tuple[float, float, float]:
    """Map predicted loss(es) to accuracy: (median, lo, hi) over loss samples (e.g. bootstrap).

    Only the uncertainty of step one is propagated here; the sigmoid's own parameter uncertainty is
    in `sig.intervals()`. A scalar loss gives no interval (nan, nan: percentile_interval).
    """
    acc = np.atleast_1d(sig.predict(np.asarray(loss_samples, dtype=float)))
    lo, hi = percentile_interval(acc, level)
    return float(np.quantile(acc, 0.5)), lo, hi
