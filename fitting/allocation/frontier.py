"""The compute frontier, fitted where compute-optimal predictions are made: L*(C) and N*(C).

    frontier = fit_frontier(params=N, tokens=D, loss=L, flops=C, groups=compute_groups(table))
    pred = frontier.predict(5.76e23)    # FrontierPrediction: point, lo, hi, parts, both forms, N*, D*
    frontier.to_dict(); FrontierFit.from_dict(saved)

A law of N and D fitted to 1-2 decades of small budgets (Approach 3) has five parameters the runs do
not pin: its E can settle at the data's floor with exponents near 1 and extrapolate badly even where
it fits well (docs/extrapolation.md). A compute-optimal prediction is about the frontier, whose
points the runs measure directly, so it is fitted there (Porian et al. 2024):

1. the measured frontier: each compute group's minimum (scalelab.fitting.allocation.frontier_points: IsoFLOP
   slices by their own shape, or the envelope of loss curves);
2. L*(C) in two forms (scalelab.fitting.allocation.frontier_forms), a saturating E + A C^-gamma and a pure
   power A C^-gamma, which bracket the truth from opposite sides; the point is a weighted geometric
   mean of them and of the surface (the law of N and D) at the frontier's N*, the weights set by the
   frontier's own forward folds and shrunk to the two forms' midpoint
   (scalelab.fitting.allocation.frontier_calibration);
3. N*(C) = G C^a, a line through the bracketed located minima in log-log (Approach 2; an envelope of
   loss curves has its family's few sizes as winners, and no line);
4. the interval: point * exp(+-z tau(d) s(C)), s^2 = fit^2 + noise^2 + forms^2 (log-space sds: the
   forms' delta-method sd, the points' scatter about the fit, and half the forms' gap), tau(d) the
   multiplier the frontier's own forward errors at distance d call for
   (scalelab.fitting.allocation.frontier_calibration; 1 where no fold measured that far).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import stats

from scalelab.errors import UsageError
from scalelab.fitting.allocation.frontier_calibration import (
    Calibration,
    SurfaceFolds,
    calibrate,
    combine,
    forward_pairs,
)
from scalelab.fitting.allocation.frontier_forms import FrontierForm, fit_power, fit_saturating, natural
from scalelab.fitting.allocation.frontier_points import FrontierPoint, measure_frontier
from scalelab.fitting.estimate.approaches import fit_power_law
from scalelab.fitting.uncertainty.compute_groups import ComputeGroups
from scalelab.fitting.uncertainty.predictive import decades_outside

MIN_POINTS = 3  # measured frontier points a fit needs


@dataclass(frozen=True, kw_only=True)
class FormsFit:
    """Both forms of L*(C) on one set of points, and the points' scatter about them."""

    forms: dict[str, FrontierForm]
    noise: float  # log-sd of a measured point about the frontier

    def logs_and_fit(self, flops) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Per form ln L*(C), and the fit part: the forms' delta-method sd (their mean where both are
        finite; a form fitted without residual degrees of freedom has none)."""
        logs = {k: f.log_predict(flops) for k, f in self.forms.items()}
        sds = np.array([f.sd(flops) for f in self.forms.values()])
        finite = np.where(np.isfinite(sds), sds, np.nan)
        fit_sd = np.nan_to_num(np.nanmean(finite, axis=0)) if np.isfinite(sds).any() else np.zeros(sds.shape[1:])
        return logs, fit_sd

    def point_and_parts(
        self, flops: float, weights: dict[str, float], surface_log: float | None = None
    ) -> tuple[float, dict[str, float]]:
        """ln L*(C) at `weights` over the forms and, when given, the surface's ln L there
        (scalelab.fitting.allocation.frontier_calibration), and the scale's parts: fit (the forms' delta-method
        sds at their weights), noise, forms (the candidates' spread)."""
        logs, fit_sd = self.logs_and_fit(float(flops))
        logs = {k: float(v) for k, v in logs.items()}
        if surface_log is not None and weights.get("surface", 0.0) > 0:
            logs["surface"] = float(surface_log)
        point, spread = combine(logs, weights)
        total = sum(weights.get(k, 0.0) for k in logs) or 1.0
        form_share = sum(weights.get(k, 0.0) for k in self.forms) / total
        return point, {"fit": float(fit_sd) * form_share, "noise": self.noise, "forms": spread}

    def fold_predictor(self, flops) -> tuple[dict[str, np.ndarray], np.ndarray, float]:
        logs, fit_sd = self.logs_and_fit(flops)
        return logs, fit_sd, self.noise

    def to_dict(self) -> dict:
        return {"forms": {k: f.to_dict() for k, f in self.forms.items()}, "noise": self.noise}

    @classmethod
    def from_dict(cls, d: dict) -> FormsFit:
        return cls(forms={k: FrontierForm.from_dict(v) for k, v in d["forms"].items()}, noise=float(d["noise"]))


def fit_forms(flops, loss, noise: float | None = None) -> FormsFit:
    """Both forms on the points (the saturating one from MIN_POINTS). The noise is the scatter about
    the saturating form where it is not degenerate and has residual degrees of freedom, else the power form's;
    a forward fold takes the full fit's instead (`noise`): the scatter of a measured point is a
    property of the data, and one or two residual degrees of freedom would set it at random."""
    forms = {"power": fit_power(flops, loss)}
    if np.unique(flops).size >= MIN_POINTS:
        forms["saturating"] = fit_saturating(flops, loss)
    if noise is None:
        noise = 0.0
        for f in (forms.get("saturating"), forms["power"]):
            if f is not None and f.degenerate is None and f.dof >= 1:
                noise = math.sqrt(f.rss / f.dof)
                break
    return FormsFit(forms=forms, noise=float(noise))


@dataclass(kw_only=True, slots=True)
class FrontierPrediction:
    flops: float
    point: float
    lo: float
    hi: float
    level: float
    decades: float
    parts: dict[str, float]  # log-space sds fit, noise, forms; tau, the calibration's multiplier
    forms: dict[str, float]  # each candidate's L*(C): both forms (degenerate ones too), the surface's
    weights: dict[str, float]  # the point's weights over them
    n_opt: float | None  # N*(C) from the line, None without one
    n_interval: tuple[float, float] | None
    calibrated: bool  # forward folds set tau (else the parts alone)

    @property
    def d_opt(self) -> float | None:
        return None if self.n_opt is None else self.flops / (6.0 * self.n_opt)

    def to_dict(self) -> dict:
        return asdict(self) | {"d_opt": self.d_opt}


@dataclass(kw_only=True)
class FrontierFit:
    points: list[FrontierPoint]
    method: str  # how the minima were located
    groups: str  # how the runs were grouped by compute
    kind: str  # "slices" (each group's located minimum: an optimum) or "envelope" (the best of a family's curves)
    core: FormsFit
    calibration: Calibration
    n_line: dict | None  # {"coef", "exponent", "cov"}: N* = coef C^exponent
    run_calibration: Calibration | None = None  # an envelope's: the surface's own predictions of its points
    level: float = 0.95
    warnings: list[str] = field(default_factory=list)

    @property
    def used(self) -> list[FrontierPoint]:
        return [p for p in self.points if p.used]

    @property
    def train_range(self) -> tuple[float, float]:
        c = [p.flops for p in self.used]
        return min(c), max(c)

    def decades(self, flops: float) -> float:
        return decades_outside(float(flops), self.train_range)

    def n_opt(self, flops: float) -> tuple[float | None, tuple[float, float] | None]:
        """N*(C) on the line through the bracketed minima, and its interval (delta method, z)."""
        if self.n_line is None:
            return None, None
        lc = math.log(flops)
        ln_n = math.log(self.n_line["coef"]) + self.n_line["exponent"] * lc
        cov = self.n_line.get("cov")
        if not cov:
            return math.exp(ln_n), None
        g = np.array([1.0, lc])
        half = _z(self.level) * math.sqrt(max(float(g @ np.asarray(cov) @ g), 0.0))
        return math.exp(ln_n), (math.exp(ln_n - half), math.exp(ln_n + half))

    def predict(self, flops: float, surface_at=None) -> FrontierPrediction:
        """L*(C) with its calibrated interval (module docstring, 4), each candidate's value and N*(C).
        `surface_at`: C -> the surface's loss at the frontier's N*(C) (its own N* where there is no
        line), the third candidate; without it the forms' weights are renormalised."""
        c = float(flops)
        surface = None if surface_at is None else float(surface_at(c))
        weights = self.calibration.weights
        point, parts = self.core.point_and_parts(c, weights, None if surface is None else math.log(surface))
        dist = self.decades(c)
        tau = self.calibration.tau(dist)
        sd = tau * math.sqrt(sum(v**2 for v in parts.values()))
        z = _z(self.level)
        n_opt, n_iv = self.n_opt(c)
        return FrontierPrediction(
            flops=c,
            point=math.exp(point),
            lo=math.exp(point - z * sd),
            hi=math.exp(point + z * sd),
            level=self.level,
            decades=dist,
            parts=parts | {"tau": tau},
            forms={k: float(np.exp(f.log_predict(c))) for k, f in self.core.forms.items()}
            | ({} if surface is None else {"surface": surface}),
            weights=dict(weights),
            n_opt=n_opt,
            n_interval=n_iv,
            calibrated=self.calibration.n_folds > 0,
        )

    def run_interval(self, flops: float, surface_run: float, surface_at) -> FrontierPrediction:
        """An envelope's run at (N, D) (scalelab.fitting.allocation.compute_optimal): the surface's own prediction
        `surface_run`, its scale the weighted point's parts with its distance from that point as the
        forms part, tau from run_calibration (the surface's forward errors on the envelope)."""
        pred = self.predict(flops, surface_at)
        cal = self.run_calibration or self.calibration
        spread = abs(math.log(surface_run) - math.log(pred.point))
        parts = {"fit": pred.parts["fit"], "noise": pred.parts["noise"], "forms": spread}
        tau = cal.tau(pred.decades)
        half = _z(self.level) * tau * math.sqrt(sum(v**2 for v in parts.values()))
        pred.point, pred.lo, pred.hi = surface_run, surface_run * math.exp(-half), surface_run * math.exp(half)
        pred.parts = parts | {"tau": tau}
        return pred

    def to_dict(self) -> dict:
        return {
            "points": [p.to_dict() for p in self.points],
            "method": self.method,
            "groups": self.groups,
            "kind": self.kind,
            "core": self.core.to_dict(),
            "calibration": self.calibration.to_dict(),
            "run_calibration": None if self.run_calibration is None else self.run_calibration.to_dict(),
            "n_line": self.n_line,
            "level": self.level,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, d: dict) -> FrontierFit:
        return cls(
            points=[FrontierPoint.from_dict(p) for p in d["points"]],
            method=d["method"],
            groups=d["groups"],
            kind=d["kind"],
            core=FormsFit.from_dict(d["core"]),
            calibration=Calibration.from_dict(d["calibration"]),
            run_calibration=Calibration.from_dict(d["run_calibration"]) if d.get("run_calibration") else None,
            n_line=d.get("n_line"),
            level=float(d.get("level", 0.95)),
            warnings=list(d.get("warnings") or []),
        )


def _z(level: float) -> float:
    return float(stats.norm.ppf(0.5 + level / 2))


def _n_line(points: list[FrontierPoint], level: float) -> dict | None:
    """N*(C) through the bracketed located minima (an envelope's winners are a family's few sizes: no line)."""
    good = [p for p in points if p.located and p.bracketed and np.isfinite(p.n_opt)]
    if len({p.flops for p in good}) < 2:
        return None
    law = fit_power_law(np.array([p.flops for p in good]), np.array([p.n_opt for p in good]), level=level)
    cov = None if law.cov is None else np.asarray(law.cov).tolist()
    return {"coef": law.coef, "exponent": law.exponent, "cov": cov, "n_points": law.n_points}


def fit_frontier(
    params,
    tokens,
    loss,
    flops,
    groups: ComputeGroups,
    *,
    level: float = 0.95,
    surface_folds: SurfaceFolds | None = None,
) -> FrontierFit:
    """The frontier of a table's runs (module docstring). `surface_folds`: the law of N and D refitted
    on the runs up to each forward fold's compute (scalelab.fitting.allocation.frontier_calibration), so that its
    weight among the candidates is measured as the forms' are.

    Raises:
        UsageError: fewer than MIN_POINTS measured frontier points (the message says how many).
    """
    measured = measure_frontier(params, tokens, loss, flops, groups, level=level)
    used = measured.used
    if len({p.flops for p in used}) < MIN_POINTS:
        raise UsageError(
            f"frontier: {len(used)} measured point(s) ({measured.method}); it needs {MIN_POINTS} at distinct compute"
        )
    c = np.array([p.flops for p in used])
    y = np.array([p.loss for p in used])
    core = fit_forms(c, y)
    pairs = forward_pairs(
        c, y, [p.n_opt for p in used], lambda cc, yy: fit_forms(cc, yy, noise=core.noise).fold_predictor,
        surface_folds, cutoffs=[p.flops_max for p in used],
    )  # fmt: skip
    warnings = list(measured.warnings)
    kind = "envelope" if groups.kind == "models" else "slices"
    run_calibration = calibrate(pairs, len(used), level, lead="surface") if kind == "envelope" else None
    sat = core.forms.get("saturating")
    if sat is not None and sat.degenerate:
        warnings.append(
            f"frontier: the saturating form is degenerate ({sat.degenerate}); it stays one side of the bracket"
        )
    return FrontierFit(
        points=measured.points,
        method=measured.method,
        groups=groups.note,
        kind=kind,
        core=core,
        calibration=calibrate(pairs, len(used), level),
        run_calibration=run_calibration,
        n_line=_n_line(measured.points, level),
        level=level,
        warnings=warnings,
    )


def format_frontier(frontier: FrontierFit, indent: str = "  ") -> list[str]:
    """Text lines of a frontier: how it was measured, both forms, N*(C), the calibration."""
    used = frontier.used
    lo, hi = frontier.train_range
    lines = [
        f"frontier (compute-optimal predictions): {len(used)} points from C={lo:.3g} to {hi:.3g}; {frontier.groups}",
        f"{indent}minima: {frontier.method}",
    ]
    for name, form in frontier.core.forms.items():
        p = natural(form)
        shown = ", ".join(f"{k}={v:.4g}" for k, v in p.items())
        shape = "E + A C^-gamma" if name == "saturating" else "A C^-gamma"
        tail = f"  (degenerate: {form.degenerate})" if form.degenerate else ""
        lines.append(f"{indent}L*(C) {name} {shape}: {shown}{tail}")
    if frontier.n_line is not None:
        lines.append(
            f"{indent}N*(C) = G C^a: G={frontier.n_line['coef']:.4g}, a={frontier.n_line['exponent']:.4f} "
            f"({frontier.n_line['n_points']} bracketed minima)"
        )
    cal = frontier.calibration
    source = f"from {cal.weight_folds} forward fold(s)" if cal.weight_folds else "the prior: no forward fold"
    lines.append(
        f"{indent}L*(C) weights: " + ", ".join(f"{k} {v:.2f}" for k, v in cal.weights.items()) + f" ({source})"
    )
    if cal.n_folds:
        reach = max(cal.fold_reach)
        lines.append(
            f"{indent}interval calibrated on {cal.n_folds} forward fold(s) of the frontier ({cal.n_pairs} predictions "
            f"up to {reach:.2f} decades out)"
        )
    else:
        lines.append(f"{indent}interval not calibrated: too few points for a forward fold (its parts are taken as sds)")
    return lines
