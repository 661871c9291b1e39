"""Stacking weights of candidate laws from forward backtests: a law that levels off and one that does not.

A Chinchilla-form law (L = E + A/N^alpha + B/D^beta) levels off at E; a Kaplan-form law does not.
Fitted to small runs, the two often bracket the truth far away: one pessimistic, one optimistic, and
their disagreement grows with distance. The forward backtests (scalelab.fitting.uncertainty.forward) measure each
law's error beyond its fitted range. If each law's log error grows about linearly with distance,

    log(pred_j / obs) ~= b_j * decades        (b_j: the law's bias per decade),

then the combination log L = sum_j w_j log L_j has bias sum_j w_j b_j per decade at *every* distance:
weights that cancel the bias at half a decade also cancel it at 1.5 decades. That is what makes
weights learned at short range usable far away.

The rule (`StackRule` holds its constants; `evidence` chooses step 2):

1. Per forward group g (one predicted budget of one fold) and candidate j, the log error e_jg at
   distance d_g decades. Groups count in proportion to their fold's training runs (a fold that saw
   more runs resembles the final fit more); only the `recent_folds` latest fold origins vote.
2. The incumbent (Chinchilla unless told otherwise) keeps all the weight unless the groups show that
   its error *grows with distance* ("growth", the default): the slope b of a weighted least-squares
   line e = a + b d is more than `z_adopt` standard errors from zero (the se from the groups' scatter
   about the line, floored by the run noise carried into a group's mean). The intercept a is what a
   law misses at the edge of its fitted range; it does not grow, so it is not a reason to move
   weight. With fewer than three groups, or all at one distance, there is no slope to test and the
   incumbent stays.
   "level" reads the weighted mean per-decade error e/d instead: an edge miss divided by a short
   distance reads as a large bias per decade, so it moves weight on evidence that does not
   extrapolate (docs/extrapolation.md has the tables that made growth the default).
3. Otherwise the weights minimise the combination's squared error over the simplex (weights >= 0,
   summing to 1): the squared slope sum_j w_j b_j ("growth"), or the weighted mean squared
   per-decade error ("level").
4. The combination's drift: k, its forward error per decade, from every fold's groups (not only the
   recent ones) as a regression through the origin of error on distance, k^2 = sum w_g e_g^2 /
   sum w_g d_g^2 (far groups, whose error is least diluted by the runs' noise, weigh most), each
   fold scored with the weights chosen without it; it rests on as many fits as there are folds. It is
   never below the groups' noise resolution (a run's noise / sqrt(runs) / decades, RMS over the
   groups): with one fold the in-sample weights cancel its error exactly, which measures nothing.
5. The rule is re-applied to `draws` bootstrap resamples of the groups, each group's error shifted by
   a draw of its runs' noise: the weights' uncertainty (which reaches the prediction interval as the
   spread of the combined prediction over the draws). With no forward group at all the draws are
   uniform on the simplex: nothing has said which form extrapolates.
6. The weights that predict ("bagged", the default `point`) move off the incumbent only on evidence
   that survives resampling: the rule adopts on the groups themselves, and in at least
   MIN_EVIDENCE_SHARE of the draws whose resample can test the evidence (for growth: at least three
   groups spread over a tenth of a decade; a resample of three groups often repeats one, and says
   nothing rather than "keep the incumbent"). Then they are the mean of those testable draws: steps
   2-3 decide all or nothing on a slope read from a handful of groups, and near the threshold a
   resample of the same groups flips the decision, so the mean moves weight in proportion to how
   often the evidence holds (bagging a pre-test decision). Otherwise the incumbent predicts alone:
   the mean of resamples that mostly found no evidence (chinchilla 0.55 / kaplan 0.45 where the rule
   found none) lost to the incumbent on held-out public runs (docs/extrapolation.md).
   `point="rule"` predicts with the rule's own decision. With no forward group, or none of the draws
   able to test, the incumbent predicts. The drift k (step 4) is the rule's, fold by fold.

With candidates whose errors grow with the same sign, step 3 gives all weight to the one that grows
least; with opposite signs it interpolates. A selection by one or two held-out runs is not this: the rule
reads every forward group and refuses to move off the incumbent on noise.

    st = stack_weights(groups, ("chinchilla", "kaplan"), noise=0.0056)
    st.weights                 # e.g. {"chinchilla": 0.66, "kaplan": 0.34}: the draws' mean
    st.draws                   # (B, 2) weight draws
    st.per_decade["chinchilla"]  # (mean, se) of its forward error per decade
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from scalelab.fitting.uncertainty.forward import ForwardGroup

MIN_SLOPE_GROUPS = 3  # forward groups the growth rule needs to test a slope
MIN_EVIDENCE_SHARE = 0.5  # bagged weights move only when the rule adopts in at least this share of testable draws


@dataclass(frozen=True, kw_only=True, slots=True)
class StackRule:
    z_adopt: float = 2.0  # standard errors of forward bias before the incumbent shares its weight
    recent_folds: int = 2  # only the latest fold origins count (0: all)
    evidence: str = "growth"  # growth: the incumbent's error must grow with distance; level: be nonzero per decade
    point: str = "bagged"  # bagged: the weights that predict are the testable draws' mean; rule: its own decision
    draws: int = 400  # bootstrap resamples of the forward groups
    seed: int = 0


@dataclass(kw_only=True)
class Stack:
    names: tuple[str, ...]
    weights: dict[str, float]
    draws: np.ndarray  # (B, K) weight draws, columns in `names` order
    per_decade: dict[str, tuple[float, float]]  # candidate -> (weighted mean, standard error)
    drift: float | None  # k: the combination's forward error per decade over every fold (None: no groups)
    drift_folds: int  # folds k rests on
    n_groups: int
    n_folds: int
    adopted: bool  # False: the rule kept the incumbent (bagged weights may still share some)
    reason: str
    incumbent: str
    groups: list[ForwardGroup] = field(default_factory=list)

    def weight_vector(self) -> np.ndarray:
        return np.array([self.weights[n] for n in self.names])

    def to_dict(self) -> dict:
        return {
            "names": list(self.names),
            "weights": dict(self.weights),
            "weight_intervals": {
                n: [float(np.quantile(self.draws[:, i], 0.025)), float(np.quantile(self.draws[:, i], 0.975))]
                for i, n in enumerate(self.names)
            }
            if self.draws.size
            else {},
            "per_decade": {n: list(v) for n, v in self.per_decade.items()},
            "drift_per_decade": self.drift,
            "drift_folds": self.drift_folds,
            "n_groups": self.n_groups,
            "n_folds": self.n_folds,
            "adopted": self.adopted,
            "reason": self.reason,
            "incumbent": self.incumbent,
            "groups": [g.to_dict() for g in self.groups],
            "draws": self.draws.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Stack:
        """A saved stack (to_dict) back: what a saved fit predicts with."""
        names = tuple(data["names"])
        return cls(
            names=names,
            weights={n: float(data["weights"][n]) for n in names},
            draws=np.asarray(data.get("draws") or np.zeros((0, len(names))), dtype=float).reshape(-1, len(names)),
            per_decade={n: tuple(v) for n, v in (data.get("per_decade") or {}).items()},
            drift=data.get("drift_per_decade"),
            drift_folds=int(data.get("drift_folds") or 0),
            n_groups=int(data.get("n_groups") or 0),
            n_folds=int(data.get("n_folds") or 0),
            adopted=bool(data.get("adopted")),
            reason=str(data.get("reason", "")),
            incumbent=str(data.get("incumbent", names[0])),
            groups=[ForwardGroup.from_dict(g) for g in data.get("groups") or []],
        )


def simplex_least_squares(r: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """argmin_w sum_g omega_g (r_g . w)^2 with w >= 0, sum w = 1 (r: (G, K))."""
    k = r.shape[1]
    if k == 1:
        return np.ones(1)
    r = r / max(float(np.abs(r).max()), 1e-300)  # errors of ~1e-2 would square below SLSQP's tolerance
    q = (r * omega[:, None]).T @ r / omega.sum()
    res = optimize.minimize(
        lambda w: float(w @ q @ w),
        np.full(k, 1.0 / k),
        jac=lambda w: 2.0 * q @ w,
        bounds=[(0.0, 1.0)] * k,
        constraints=[{"type": "eq", "fun": lambda w: float(np.sum(w) - 1.0), "jac": lambda w: np.ones(k)}],
        method="SLSQP",
    )
    w = np.clip(res.x, 0.0, None)
    return w / w.sum()


def _bias(r: np.ndarray, omega: np.ndarray, noise_se: np.ndarray) -> tuple[float, float]:
    """Weighted mean of r and its standard error (scatter-based, floored by the noise carried in)."""
    wsum = omega.sum()
    mean = float(np.sum(omega * r) / wsum)
    n_eff = wsum**2 / np.sum(omega**2)
    scatter = float(np.sqrt(np.sum(omega * (r - mean) ** 2) / wsum / max(n_eff - 1.0, 1.0))) if r.size > 1 else 0.0
    noise = float(np.sqrt(np.sum(omega**2 * noise_se**2)) / wsum)
    return mean, max(scatter, noise)


def _recent(groups: Sequence[ForwardGroup], folds: int) -> list[ForwardGroup]:
    if not folds or not groups:
        return list(groups)
    keep = sorted({g.fold for g in groups})[-folds:]
    return [g for g in groups if g.fold in keep]


@dataclass(frozen=True, slots=True)
class _Evidence:
    e: np.ndarray  # (G, K) log errors
    dec: np.ndarray  # (G,) distances in decades
    omega: np.ndarray  # (G,) group weights (training runs of the fold)
    noise_e: np.ndarray  # (G,) noise of a group's mean error (a run's noise / sqrt(runs))

    @property
    def r(self) -> np.ndarray:  # per-decade errors
        return self.e / self.dec[:, None]

    @property
    def noise_se(self) -> np.ndarray:  # ... and their noise
        return self.noise_e / self.dec

    def take(self, idx: np.ndarray, shift: np.ndarray | None = None) -> _Evidence:
        e = self.e[idx] + (0.0 if shift is None else shift[:, None])
        return _Evidence(e=e, dec=self.dec[idx], omega=self.omega[idx], noise_e=self.noise_e[idx])


def _arrays(groups: Sequence[ForwardGroup], names: Sequence[str], noise: float) -> _Evidence:
    return _Evidence(
        e=np.array([[g.errors[n] for n in names] for g in groups]),
        dec=np.array([g.decades for g in groups]),
        omega=np.array([float(g.n_train) for g in groups]),
        noise_e=np.array([noise / math.sqrt(g.n_test) for g in groups]),
    )


def _slopes(ev: _Evidence) -> tuple[np.ndarray, np.ndarray] | None:
    """Per candidate, the growth of the error with distance (weighted least squares e = a + b d) and
    the slope's standard error (groups' scatter, floored by their noise); None when there are fewer
    than MIN_SLOPE_GROUPS groups (a line through two groups has no scatter to judge it by: only the
    noise floor would, and misfit is not noise) or their distances do not spread (a tenth of a decade)."""
    d, w = ev.dec, ev.omega / ev.omega.mean()
    if d.size < MIN_SLOPE_GROUPS or d.max() - d.min() < 0.1:
        return None
    dbar = np.sum(w * d) / w.sum()
    sxx = np.sum(w * (d - dbar) ** 2)
    ebar = np.sum(w[:, None] * ev.e, axis=0) / w.sum()
    b = np.sum(w[:, None] * (d - dbar)[:, None] * (ev.e - ebar), axis=0) / sxx
    resid = ev.e - ebar - np.outer(d - dbar, b)
    scatter2 = np.sum(w[:, None] * resid**2, axis=0) / max(d.size - 2, 1) if d.size > 2 else np.zeros(b.size)
    noise2 = np.mean(ev.noise_e**2)
    se = np.sqrt(np.maximum(scatter2, noise2) * np.sum(w**2 * (d - dbar) ** 2) / sxx**2)
    return b, se


def _drift(groups, names, w, inc: int, noise: float, rule: StackRule) -> tuple[float, int]:
    """(k, folds): the combination's forward error per decade, regressed through the origin, never
    below the groups' noise resolution.

    Out of sample where it can be: each fold's groups are scored with the weights the rule gives
    without that fold (weights chosen on the groups they are scored on would hide their own error);
    with a single fold, the in-sample weights `w`."""
    folds = sorted({g.fold for g in groups})
    ev = _arrays(groups, names, noise)
    e = np.empty(len(groups))
    for f in folds:
        mine = np.array([g.fold == f for g in groups])
        rest = _recent([g for g in groups if g.fold != f], rule.recent_folds)
        w_f = w
        if rest:
            w_f = _rule(_arrays(rest, names, noise), inc, rule)[0]
        e[mine] = ev.e[mine] @ w_f
    k = float(math.sqrt(np.sum(ev.omega * e**2) / np.sum(ev.omega * ev.dec**2)))
    # a drift below what the groups' own noise can resolve is not measured, only bounded by it
    return max(k, float(np.sqrt(np.mean(ev.noise_se**2)))), len(folds)


def _rule(ev: _Evidence, inc: int, rule: StackRule) -> tuple[np.ndarray, bool, bool]:
    """(weights, adopted, tested): tested is False where the groups cannot test the evidence (growth:
    no slope, _slopes), and then the incumbent keeps the weight."""
    keep = np.zeros(ev.e.shape[1])
    keep[inc] = 1.0
    if rule.evidence == "level":
        mean, se = _bias(ev.r[:, inc], ev.omega, ev.noise_se)
        if not abs(mean) > rule.z_adopt * se:
            return keep, False, True
        return simplex_least_squares(ev.r, ev.omega), True, True
    slopes = _slopes(ev)
    if slopes is None:
        return keep, False, False
    if not abs(slopes[0][inc]) > rule.z_adopt * slopes[1][inc]:
        return keep, False, True
    return simplex_least_squares(slopes[0][None, :], np.ones(1)), True, True


def stack_weights(
    groups: Sequence[ForwardGroup],
    names: Sequence[str],
    *,
    noise: float,
    incumbent: str | None = None,
    rule: StackRule | None = None,
) -> Stack:
    """Weights of `names` from forward groups (module docstring). `noise`: a run's log-sd.

    Over 80 lines for the sentence that reports the choice: the rule, the resampling of the groups and
    the reason's branches (no groups, growth, adopted or not, bagged) read against each other here."""
    rule = rule or StackRule()
    names = tuple(names)
    incumbent = incumbent or names[0]
    inc = names.index(incumbent)
    every = [g for g in groups if all(n in g.errors for n in names) and g.decades > 0]
    groups = _recent(every, rule.recent_folds)
    if not groups:
        # Nothing says which form extrapolates: the incumbent predicts, and the weight draws are
        # uniform on the simplex, so the interval carries the whole disagreement between the forms.
        w = {n: float(n == incumbent) for n in names}
        draws = np.random.default_rng(rule.seed).dirichlet(np.ones(len(names)), size=rule.draws)
        return Stack(
            names=names, weights=w, draws=draws, per_decade={}, drift=None, drift_folds=0, n_groups=0, n_folds=0,
            adopted=False, incumbent=incumbent,
            reason="no forward backtest (too few groups): the incumbent predicts, every weighting is open",
        )  # fmt: skip
    ev = _arrays(groups, names, noise)
    w, adopted, _ = _rule(ev, inc, rule)
    rng = np.random.default_rng(rule.seed)
    draws = np.empty((rule.draws, len(names)))
    tested = np.zeros(rule.draws, dtype=bool)
    found = np.zeros(rule.draws, dtype=bool)
    for b in range(rule.draws):
        # groups resampled, and each group's observed runs redrawn: their noise shifts every
        # candidate's error in that group alike (one set of runs is scored against all of them)
        idx = rng.integers(0, len(groups), len(groups))
        shift = ev.noise_e[idx] * rng.standard_normal(len(groups))
        draws[b], found[b], tested[b] = _rule(ev.take(idx, shift), inc, rule)
    share = float(found[tested].mean()) if tested.any() else 0.0
    survives = adopted and share >= MIN_EVIDENCE_SHARE
    point = w
    if rule.point == "bagged":
        point = draws[tested].mean(axis=0) if survives else np.eye(len(names))[inc]
    per_decade = {n: _bias(ev.r[:, j], ev.omega, ev.noise_se) for j, n in enumerate(names)}
    slopes = _slopes(ev)
    drift, drift_folds = _drift(every, names, w, inc, noise, rule)
    m, se = per_decade[incumbent]
    if rule.evidence == "growth":
        if slopes is None:
            reason = (
                f"{len(groups)} forward group(s), too few or at one distance: no growth of the error to test; "
                f"{incumbent} alone"
            )
        else:
            b, b_se = slopes[0][inc], slopes[1][inc]
            growth = f"{incumbent}'s forward error grows {100 * b:+.2f}% per decade of distance (se {100 * b_se:.2f}%"
            growth += f", {len(groups)} groups)"
            reason = growth + (
                ": weights cancel the growth of the combination's error"
                if adopted
                else f", within {rule.z_adopt:g} se of none: {incumbent} alone"
            )
    elif adopted:
        reason = (
            f"{incumbent} is {100 * m:+.2f}% per decade forward (se {100 * se:.2f}%, {len(groups)} groups): "
            "weights minimise the combination's forward error"
        )
    else:
        reason = (
            f"{incumbent}'s forward error {100 * m:+.2f}% per decade is within {rule.z_adopt:g} se "
            f"({100 * se:.2f}%) of zero over {len(groups)} groups: {incumbent} alone"
        )
    if rule.point == "bagged" and tested.any() and (adopted or share > 0):
        over = f"; over the {int(tested.sum())} of {rule.draws} resamples of the groups that can test it, the rule "
        if survives:
            mix = ", ".join(f"{n} {x:.2f}" for n, x in zip(names, point))
            reason += over + f"finds the evidence in {share:.0%}: predicting with their mean weights ({mix})"
        elif adopted:
            reason += over + f"finds it in only {share:.0%}: it does not survive resampling, {incumbent} alone"
        else:
            reason += over + f"finds evidence in {share:.0%}, the groups themselves do not: {incumbent} alone"
    return Stack(
        names=names,
        weights={n: float(x) for n, x in zip(names, point)},
        draws=draws,
        per_decade=per_decade,
        drift=drift,
        drift_folds=drift_folds,
        n_groups=len(groups),
        n_folds=len({g.fold for g in groups}),
        adopted=adopted,
        reason=reason,
        incumbent=incumbent,
        groups=list(groups),
    )
