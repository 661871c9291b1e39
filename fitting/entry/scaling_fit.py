"""ScalingFit: what the one fit entry (scalelab.fitting.entry.fit_runs.fit_runs) returns.

    fit = fit_runs(table, FitOptions(bootstrap=64, starts=200, gates=True))
    fit.params, fit.intervals["alpha"], fit.backtest["holdout"]["mare"], fit.gates.passed
    fit.predict_interval(n, d)        # PredictionInterval: point, lo, hi, parts
    fit.optimum(flops)                # (N*, D*, L*) of the point fit (the surface's)
    fit.compute_optimal(flops)        # ComputeOptimal: L*, N*, D* from the frontier, the surface beside
    fit.optimal_run_interval(n, d, flops)   # a compute-optimal run's prediction (the frontier's level)
    fit.to_report()                   # what `scalelab fit --json` prints (and --out saves)
    fit.to_record()                   # what fits/round_K.json and the ledger keep (a law of N and D)

Every fit has its law (or approach), parameters, intervals (parameters and derived quantities,
[nan, nan] where there is none), backtests and warnings. A parametric law (approach 3) also keeps
the fit itself, its bootstrap replicates and their plan, the backtests' out-of-sample error per
decade and, when asked, the identification gates: what the closed loop predicts, gates and
proposes from. A law of N and D also keeps the compute frontier its runs measure
(scalelab.fitting.allocation.frontier), which compute-optimal predictions come from
(scalelab.fitting.allocation.compute_optimal), and its degeneracy findings (scalelab.fitting.entry.degeneracy): a
degenerate surface predicts every run at the frontier's level, and says so in its warnings.
"""

from __future__ import annotations

import functools
import math
import pathlib
import subprocess
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import scalelab
from scalelab.errors import UsageError
from scalelab.fitting.allocation.allocate import optimum_for_law
from scalelab.fitting.allocation.bracket import Bracket, bracket, bracket_prediction, budget_minima
from scalelab.fitting.allocation.compute_optimal import ComputeOptimal, Surface, anchored_interval, compute_optimal
from scalelab.fitting.allocation.frontier import FrontierFit
from scalelab.fitting.allocation.frontier_forms import FrontierForm, fit_power
from scalelab.fitting.entry.degeneracy import Finding, degenerate
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.gates import GateReport
from scalelab.fitting.estimate.fit import FitResult
from scalelab.fitting.estimate.io import RunTable
from scalelab.fitting.forms.laws import Law, get_law
from scalelab.fitting.selection.ensemble import StackedFit
from scalelab.fitting.uncertainty.bootstrap import Replicate, refit_with_runs
from scalelab.fitting.uncertainty.predictive import (
    ExtrapolationError,
    PredictionInterval,
    decades_outside,
    prediction_interval,
    replicate_noise,
)

METHOD = (
    "Huber (delta 1e-3) on log loss, summed; L-BFGS from grid starts; bootstrap reweighting of runs with warm + "
    "grid starts; intervals on predictions add run noise and the backtests' out-of-sample error per decade of "
    "extrapolation"
)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """'scalelab <version>' plus the git commit of the source tree when it is a checkout."""
    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"scalelab {scalelab.__version__}" + (f" ({sha})" if sha else "")


def optimum_fn(law: Law):
    """(params, flops) -> (N*, D*, L*) under C = 6 N D for a law of params and tokens."""
    opt = optimum_for_law(law)
    return lambda p, c: opt(p, c)[:3]


def finite_or_none(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(kw_only=True)
class ScalingFit:
    options: FitOptions
    table: RunTable  # the runs fitted (flops: their FLOP budgets)
    law: str  # the law fitted (after "auto"), or "approach1" / "approach2"
    approach: int
    params: dict[str, float]
    intervals: dict[str, list[float]]  # parameters and derived quantities, at options.level
    objective: float
    n_points: int
    derived: dict[str, float] = field(default_factory=dict)
    backtest: dict[str, dict[str, Any]] = field(default_factory=dict)  # protocol -> result, or {"skipped": why}
    warnings: list[str] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)  # parameter draws a saved fit keeps
    interval_method: str = ""
    selection: dict[str, Any] | None = None  # law "auto": every candidate's backtest and the choice
    extra: dict[str, Any] = field(default_factory=dict)  # report-only: approach minima, curve-law members
    # a parametric law: the fit, its bootstrap, the backtests' error per decade, the gates
    fit: FitResult | None = None
    draws: list[dict[str, float]] = field(default_factory=list)  # bootstrap replicates
    boot_plan: list[Replicate] = field(default_factory=list, repr=False)
    extrapolation: ExtrapolationError | None = None
    gates: GateReport | None = None
    target_flops: float | None = None  # where the gates were checked
    stacked: StackedFit | None = None  # law "auto": the forms stacked by forward evidence; it predicts losses
    groups: str = ""  # how the runs were grouped by compute (scalelab.fitting.uncertainty.compute_groups)
    frontier: FrontierFit | None = None  # the measured compute frontier (a law of N and D)
    degeneracy: list[Finding] = field(default_factory=list)  # the law's degeneracy findings

    # --- the runs --------------------------------------------------------------------------------

    @property
    def n(self) -> np.ndarray:
        return self.table.params

    @property
    def d(self) -> np.ndarray:
        return self.table.tokens

    @property
    def loss(self) -> np.ndarray:
        return self.table.loss

    @property
    def budgets(self) -> np.ndarray:
        return self.table.flops

    @property
    def run_ids(self) -> list[str]:
        return [str(r) for r in self.table.run_id]

    @property
    def level(self) -> float:
        return self.options.level

    @property
    def noise_floor(self) -> float:
        return float(self.options.noise_floor)

    # --- a parametric law's predictions ----------------------------------------------------------

    @property
    def law_object(self) -> Law:
        if self.fit is None:
            raise UsageError(f"{self.law} is not one parametric law: it has no loss predictions")
        return get_law(self.law, **self.fit.law_config)

    @property
    def residual_scale(self) -> float:
        """The log-sd of a new run's loss around the law: the largest of the robust sd of the fit's
        log residuals scaled by sqrt(n / (n - p)) (a law of p parameters fitted to n runs sits
        closer to them than a new run will), the pooled sd of seed replicates in the table, and the
        stated noise floor (a seed study's figure: runs of one sweep share their data order, so
        their residuals understate the noise of a run that sees other data)."""
        if self.fit is None:
            return math.nan
        n, p = self.loss.size, self.law_object.n_params
        fitted = float(self.fit.residual_scale) * math.sqrt(n / max(n - p, 1))
        return max(fitted, replicate_noise(self.n, self.d, self.loss), self.noise_floor)

    def optimum(self, flops: float, params: dict[str, float] | None = None) -> tuple[float, float, float]:
        n, d, loss = optimum_fn(self.law_object)(params or self.params, flops)[:3]
        return float(n), float(d), float(loss)

    def predict(self, n, d, params: dict[str, float] | None = None) -> np.ndarray:
        return self.law_object.predict(params or self.params, params=np.asarray(n, float), tokens=np.asarray(d, float))

    def decades(self, flops: float) -> float:
        """How far `flops` lies outside the fitted budgets, in decades."""
        return decades_outside(flops, (float(self.budgets.min()), float(self.budgets.max())))

    def _extrapolation(self) -> ExtrapolationError:
        return self.extrapolation or ExtrapolationError(per_decade=None, n_runs=0, n_folds=0, max_decades=0.0)

    @property
    def surface_holds(self) -> bool:
        """The law is not degenerate (scalelab.fitting.entry.degeneracy)."""
        return not degenerate(self.degeneracy)

    def surface(self) -> Surface:
        """The law as the frontier reads it: its point, its own optimum and L*(C) interval."""
        if self.stacked is not None:
            st = self.stacked
            return Surface(point=lambda n, d: float(st.predict(n, d)), optimum=st.optimum,
                           interval=st.optimum_interval, holds=self.surface_holds)  # fmt: skip
        return Surface(point=lambda n, d: float(self.predict(n, d)), optimum=self.optimum,
                       interval=self.optimum_interval, holds=self.surface_holds)  # fmt: skip

    def compute_optimal(self, flops: float) -> ComputeOptimal:
        """L*(C), N*(C), D*(C) from the frontier, the surface's beside it
        (scalelab.fitting.allocation.compute_optimal)."""
        return compute_optimal(self.frontier, self.surface(), flops)

    def optimal_run_interval(self, n: float, d: float, flops: float) -> PredictionInterval:
        """A compute-optimal run of budget `flops` at (N, D): the frontier's L*(C) times the surface's
        excess there, with the frontier's interval; the surface's prediction without a frontier."""
        if self.frontier is None:
            return self.predict_interval(n, d, flops)
        return anchored_interval(self.frontier, self.surface(), n, d, flops)

    @functools.cached_property
    def _power_line(self) -> FrontierForm | None:
        """The bracket's power side: a power law through each budget's best loss (None under 2 budgets)."""
        minima = budget_minima(self.budgets, self.loss)
        return fit_power(*minima) if minima[0].size >= 2 else None

    def _power_side(self, n: float, d: float, flops: float) -> float:
        """The power law's L*(C) times the law's excess at (N, D) over its own optimum at C."""
        excess = float(self.predict(n, d)) / self.optimum(flops)[2]
        return float(np.exp(self._power_line.log_predict(flops))) * excess

    def bracket_interval(self, n: float, d: float, flops: float) -> Bracket:
        """The first round's bracket at (N, D) of budget `flops`: the surface's prediction and a power
        law through the budgets' best losses, their geometric mean (scalelab.fitting.allocation.bracket)."""
        surface = self.surface_interval(n, d, flops)
        return bracket((surface.point, surface.lo, surface.hi), self._power_side(n, d, flops))

    @property
    def frontier_calibrated(self) -> bool:
        """A compute frontier whose interval forward folds calibrated (4+ budgets' minima)."""
        return self.frontier is not None and self.frontier.calibration.n_folds > 0

    def brackets(self, flops: float) -> bool:
        """Whether the loop predicts a run of budget `flops` by the bracket: a parametric law of N and
        D, a run beyond the fitted budgets, and no calibrated frontier to set its level (a first
        round: docs/first-round.md, protocol 2)."""
        return (
            self.fit is not None
            and self.law_object.inputs == ("params", "tokens")
            and not self.frontier_calibrated
            and self._power_line is not None
            and self.decades(flops) > 0.0
        )

    def run_interval(self, n: float, d: float, flops: float, *, optimal: bool = False) -> PredictionInterval:
        """The loop's prediction of a run at (N, D) of budget `flops` (what the ledger records): the
        bracket where `brackets(flops)` (scalelab.fitting.allocation.bracket.bracket_prediction: its two
        sides as `ends`); else a compute-optimal run's (optimal_run_interval) or any run's
        (predict_interval)."""
        if self.brackets(flops):
            return bracket_prediction(self.surface_interval(n, d, flops), self._power_side(n, d, flops))
        if optimal:
            return self.optimal_run_interval(n, d, flops)
        return self.predict_interval(n, d, flops)

    def predict_interval(self, n: float, d: float, flops: float | None = None) -> PredictionInterval:
        """Point prediction at (N, D) and its interval: the surface's (surface_interval), or, for a
        degenerate law with a frontier, at the frontier's level (optimal_run_interval)."""
        if self.frontier is not None and not self.surface_holds:
            return anchored_interval(self.frontier, self.surface(), n, d, flops if flops is not None else 6.0 * n * d)
        return self.surface_interval(n, d, flops)

    def surface_interval(self, n: float, d: float, flops: float | None = None) -> PredictionInterval:
        """The law's own prediction at (N, D) and its interval: bootstrap + run noise + extrapolation
        error (law "auto": the stacked law's, with the weights' spread as a fourth part)."""
        if self.stacked is not None:
            return self.stacked.predict_interval(n, d, flops)
        reps = np.array([float(self.predict(n, d, p)) for p in self.draws])
        return prediction_interval(
            float(self.predict(n, d)),
            reps,
            residual_scale=self.residual_scale,
            extrapolation=self._extrapolation(),
            decades=self.decades(flops if flops is not None else 6.0 * n * d),
            level=self.level,
        )

    def optimum_interval(self, flops: float) -> PredictionInterval:
        """The compute-optimal loss L*(C) with the same three-part interval (law "auto": the stacked
        law's prediction at the incumbent's compute-optimal N*, D*, the run the loop proposes)."""
        if self.stacked is not None:
            n, d, _ = self.optimum(flops)
            return self.stacked.predict_interval(n, d, flops)
        point = self.optimum(flops)[2]
        reps = []
        for p in self.draws:
            try:
                reps.append(self.optimum(flops, p)[2])
            except UsageError:
                continue
        return prediction_interval(
            point,
            np.array(reps),
            residual_scale=self.residual_scale,
            extrapolation=self._extrapolation(),
            decades=self.decades(flops),
            level=self.level,
        )

    def replicates_with(self, extra: list[tuple[float, float]]) -> list[dict[str, float]]:
        """The bootstrap replicates refitted with extra (N, D) runs added, each at its predicted loss
        times a residual drawn from the fit's own log-residuals (common random numbers: every call
        sees the same resamples and draws, so two candidate sets are compared on equal terms)."""
        law = self.law_object
        preds = [float(self.predict(n, d)) for n, d in extra]
        data = {"params": self.n, "tokens": self.d, "loss": self.loss}
        added = {"params": [p[0] for p in extra], "tokens": [p[1] for p in extra]}
        return refit_with_runs(
            law,
            data,
            self.boot_plan,
            added,
            preds,
            weights=self.table.weight,
            objective=self.options.objective,
            delta=self.options.delta,
        )

    # --- JSON at the edges -----------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """The JSON a round's fit file and the ledger keep (a parametric law)."""
        law = self.law_object
        intervals = {name: self.intervals[name] for name in law.param_names}
        if "n_opt_exponent" in self.intervals and {"alpha", "beta"} <= set(self.params):
            intervals["a"] = self.intervals["n_opt_exponent"]
        return {
            "law": law.name,
            "params": dict(self.params),
            "intervals": intervals,
            "a": self.params["beta"] / (self.params["alpha"] + self.params["beta"])
            if {"alpha", "beta"} <= set(self.params)
            else None,
            "objective": float(self.fit.objective),
            "n_points": int(self.loss.size),
            "residual_scale": self.residual_scale,
            "noise_floor": self.noise_floor,
            "warnings": list(self.fit.warnings),
            "backtest": self.backtest,
            "extrapolation": self._extrapolation().to_dict(),
            "gates": self.gates.to_dict() if self.gates is not None else None,
            "target_flops": self.target_flops,
            "replicates": len(self.draws),
            "draws": [dict(p) for p in self.draws],
            "level": self.level,
            "run_ids": self.run_ids,
            "points": {
                "params": self.n.tolist(),
                "tokens": self.d.tolist(),
                "loss": self.loss.tolist(),
                "budgets": self.budgets.tolist(),
            },
            "method": METHOD,
            **({"stacked": self.stacked.to_dict()} if self.stacked is not None else {}),
            **self._frontier_fields(),
        }

    def _frontier_fields(self) -> dict[str, Any]:
        """The frontier, the grouping and the degeneracy findings, as a report and a record keep them."""
        out: dict[str, Any] = {"groups": self.groups, "degeneracy": [f.to_dict() for f in self.degeneracy]}
        if self.frontier is not None:
            out["frontier"] = self.frontier.to_dict()
        return out

    def to_report(self, *, keep_samples: bool = False) -> dict[str, Any]:
        """The object `scalelab fit --json` prints: law, approach, params, objective, n_points,
        intervals {name: [lo, hi]} (null where none), derived, backtest, warnings, level, inputs,
        code_version, interval_method; the gates when checked; with keep_samples (`--out`) also
        `samples` (parameter draws, so a saved fit gives intervals later) and `run_ids`."""
        report: dict[str, Any] = {
            "law": self.law,
            "approach": self.approach,
            "params": dict(self.params),
            "objective": self.objective,
            "n_points": self.n_points,
            "intervals": {k: [finite_or_none(v[0]), finite_or_none(v[1])] for k, v in self.intervals.items()},
            "derived": dict(self.derived),
            "backtest": self.backtest,
            "warnings": list(self.warnings),
            "interval_method": self.interval_method,
        }
        report.update(self.extra)
        if self.fit is not None:
            report["residual_scale"] = finite_or_none(self.residual_scale)
        if self.gates is not None:
            report["gates"] = self.gates.to_dict()
        if self.selection is not None:
            report["selection"] = self.selection
        if self.stacked is not None:
            report["stacked"] = self.stacked.to_dict()
            report["stacked"]["residual_scale"] = finite_or_none(self.residual_scale)
        if self.fit is not None:
            report.update(self._frontier_fields())
        report["level"] = self.level
        t = self.table
        report["inputs"] = {"flops": t.flops_source, "tokens": t.tokens_source, "n_rows": len(t)}
        report["code_version"] = code_version()
        if keep_samples:
            report["samples"] = self.samples
            report["run_ids"] = self.run_ids
            if self.fit is not None:  # the bracket's power side (plan-run from the report)
                budgets, best = budget_minima(self.budgets, self.loss)
                report["budget_minima"] = {"flops": budgets.tolist(), "loss": best.tolist()}
        return report
