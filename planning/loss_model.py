"""What a plan asks of a fit, behind one small interface: the loss at (N, D) and the optimum at C, with intervals.

    model = load_loss_model("results/iso")          # a sweep: its latest `sweep next` fit
    model = load_loss_model("fit.json")             # `scalelab fit DATA --out fit.json`
    model.predict(n, d, flops) # PredictionInterval: point, lo, hi, parts (log-space sds); flops: the budget
    model.point(n, d)          # the point alone (sensitivities, rounding costs)
    model.optimum(flops)       # Optimum: N*, D* with intervals, L*(C) with its interval

A plan never reads a fit's fields itself: the saved fit is read by scalelab.fitting.entry.saved_fit
(load_saved_fit) and turned into a loss model only in this module, so a new kind
of fit (an average of several laws with weights, whose interval has form/weight parts) is one more
class with these three methods. Each interval's `parts` are the fit's own (for the laws here:
bootstrap, run noise and the backtests' out-of-sample error at the target's distance in decades,
scalelab.fitting.uncertainty.predictive); the plan adds its own parts (learning rate, batch) beside them.

Two saved forms are read:
  - a sweep directory: its latest fits/round_K.json, the closed loop's fit (law, parameters,
    bootstrap draws, residual scale with the noise floor, extrapolation error per decade, the runs'
    FLOP budgets): the intervals are exactly those `sweep next` gave its proposals;
  - a fit report (`scalelab fit DATA --out FIT.json`, saved with its parameter samples): the same
    three parts from its samples, its residual scale and its backtests' folds: the error per decade
    of the held-out runs that lie at least MIN_DECADES beyond their fold's training runs (as the
    loop's folds do: its budgets are 0.5 decades apart).
    A table of checkpoints along loss curves holds out the last few checkpoints, a few hundredths
    of a decade beyond the rest: their miss is a level the fit gets wrong, not a drift per decade
    (2.5% at 0.05 decades would read as 50% per decade). Then the error per decade is unmeasured
    (no extrapolation part, said in the fit's warnings) and the hold-out's RMS relative error enters
    as a part of its own ("holdout"): the least a prediction out of sample misses by. The largest
    fitted budget is the largest training or held-out budget of its folds.
Both need a law of N and D with a compute-optimal allocation (chinchilla, kaplan): anything else
(Approaches 1/2, curve laws, a law of FLOPs alone) is refused with one line.

A stacked fit (law "auto": forms weighted by forward backtests, scalelab.fitting.selection.ensemble) saved in
either form is read as the loop reads it (ScalingFit with `stacked`): losses and their intervals
are the stacked law's (bootstrap, weights, noise, extrapolation), and the compute-optimal N*, D*
are the incumbent law's, the point `sweep next` proposes, with the stacked law's loss there.

A fit saved with its compute frontier (scalelab.fitting.allocation.frontier) plans from it, as `sweep next`
proposes its compute-optimal runs (scalelab.fitting.allocation.compute_optimal): N*(C), D*(C) and L*(C) are
the frontier's, the surface's L*(C) beside them; a planned run's loss is the frontier's L*(C) times
the surface's excess at its (N, D) over the surface's own optimum, with the frontier's interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.allocation.allocate import allocate, optimum_for_law
from scalelab.fitting.allocation.bracket import bracket_prediction, budget_minima
from scalelab.fitting.allocation.compute_optimal import Surface, anchored_interval, compute_optimal
from scalelab.fitting.allocation.frontier import FrontierFit
from scalelab.fitting.allocation.frontier_forms import FrontierForm, fit_power
from scalelab.fitting.entry.degeneracy import degenerate
from scalelab.fitting.entry.fit_options import LOOP_LAWS
from scalelab.fitting.entry.saved_fit import SavedFit, load_saved_fit
from scalelab.fitting.forms.laws import Law, get_law
from scalelab.fitting.selection.ensemble import StackedFit
from scalelab.fitting.uncertainty.predictive import (
    ExtrapolationError,
    PredictionInterval,
    decades_outside,
    extrapolation_error,
    interval_from_parts,
    prediction_interval,
)
from scalelab.store.paths import SweepLayout

MIN_DECADES = 0.3  # a fit report's held-out run this far beyond its training runs measures a drift per decade


@dataclass(kw_only=True, slots=True)
class Optimum:
    """The compute-optimal point at one budget."""

    flops: float
    n: float
    d: float
    loss: PredictionInterval
    n_interval: tuple[float, float] | None
    d_interval: tuple[float, float] | None
    beside: str = ""  # the frontier's L*(C) beside the surface's, when the plan reads a frontier


class LossModel(Protocol):
    """What a plan needs from a fit (module docstring)."""

    law: str  # what the fit is, in words ("chinchilla", or a description of an average)
    level: float
    max_flops: float  # the largest FLOP budget the fit saw: plans extrapolate from here
    source: str  # where the fit came from, for the page
    warnings: list[str]

    def point(self, n: float, d: float) -> float: ...

    def predict(self, n: float, d: float, flops: float | None = None) -> PredictionInterval: ...

    def optimum(self, flops: float) -> Optimum: ...


@dataclass(kw_only=True)
class DrawsLossModel:
    """A law of (N, D) with bootstrap (or delta-method) parameter draws: the loop's prediction intervals."""

    law_obj: Law
    params: dict[str, float]
    draws: list[dict[str, float]]
    residual_scale: float  # log-sd of a new run's noise
    extrapolation: ExtrapolationError
    max_flops: float
    min_flops: float
    level: float = 0.95
    source: str = ""
    n_runs: int = 0
    warnings: list[str] = field(default_factory=list)
    points: dict[str, list[float]] | None = None  # the fitted runs (params, tokens, loss, budgets) when saved
    minima: tuple[list[float], list[float]] | None = None  # each budget's best loss: (budgets, losses)
    holdout_floor: float = 0.0  # log-sd a fit report's short-range hold-out missed by (0: not used)

    @property
    def law(self) -> str:
        return self.law_obj.name

    def point(self, n: float, d: float, params: dict[str, float] | None = None) -> float:
        x = self.law_obj.predict(params or self.params, params=np.asarray(float(n)), tokens=np.asarray(float(d)))
        return float(x)

    def _interval(self, point: float, reps: list[float], flops: float) -> PredictionInterval:
        out = prediction_interval(
            point,
            np.asarray(reps, dtype=float),
            residual_scale=self.residual_scale,
            extrapolation=self.extrapolation,
            decades=decades_outside(flops, (self.min_flops, self.max_flops)),
            level=self.level,
        )
        if not self.holdout_floor:
            return out
        parts = {k: v for k, v in out.parts.items() if k != "decades"} | {"holdout": self.holdout_floor}
        more = interval_from_parts(point, parts, self.level)
        more.parts["decades"] = out.parts["decades"]
        return more

    def predict(self, n: float, d: float, flops: float | None = None) -> PredictionInterval:
        """The loss at (N, D); `flops` is the budget whose distance from the fit's budgets sets the
        extrapolation part (default 6ND; a planned run's budget label, as `sweep next` predicts)."""
        reps = [self.point(n, d, p) for p in self.draws]
        return self._interval(self.point(n, d), reps, flops if flops is not None else 6.0 * n * d)

    def optimum(self, flops: float) -> Optimum:
        opt = optimum_for_law(self.law_obj)
        alloc = allocate(opt, self.params, flops, samples=self.draws, level=self.level)
        reps = []
        for p in self.draws:
            try:
                reps.append(opt(p, flops)[2])
            except UsageError:
                continue
        return Optimum(
            flops=flops,
            n=alloc.n_opt,
            d=alloc.d_opt,
            loss=self._interval(alloc.loss_opt, reps, flops),
            n_interval=alloc.n_opt_interval,
            d_interval=alloc.d_opt_interval,
        )


class _Wrapping:
    """A loss model around another: the fit's bookkeeping (level, largest budget, source, warnings,
    fitted runs) answered by the model it wraps (`_wrapped`)."""

    @property
    def _wrapped(self):
        raise NotImplementedError

    @property
    def level(self) -> float:
        return self._wrapped.level

    @property
    def max_flops(self) -> float:
        return self._wrapped.max_flops

    @property
    def source(self) -> str:
        return self._wrapped.source

    @property
    def warnings(self) -> list[str]:
        return self._wrapped.warnings

    @property
    def points(self) -> dict[str, list[float]] | None:
        """The fitted runs (the same runs every wrapped form was fitted on), when saved."""
        return getattr(self._wrapped, "points", None)


@dataclass(kw_only=True)
class StackedLossModel(_Wrapping):
    """A stacked fit: the stacked law's losses and intervals at the incumbent's compute-optimal point."""

    incumbent: DrawsLossModel
    stacked: StackedFit

    @property
    def _wrapped(self) -> DrawsLossModel:
        return self.incumbent

    @property
    def law(self) -> str:
        weights = ", ".join(f"{k} {w:.2f}" for k, w in self.stacked.weights.items())
        return f"stacked ({weights}; N*, D* from {self.incumbent.law})"

    @property
    def level(self) -> float:
        return self.stacked.level

    def point(self, n: float, d: float) -> float:
        return float(self.stacked.predict(n, d))

    def predict(self, n: float, d: float, flops: float | None = None) -> PredictionInterval:
        return self.stacked.predict_interval(n, d, flops)

    def optimum(self, flops: float) -> Optimum:
        own = self.incumbent.optimum(flops)
        return replace(own, loss=self.stacked.predict_interval(own.n, own.d, flops))


@dataclass(kw_only=True)
class FrontierLossModel(_Wrapping):
    """A fit with its compute frontier: the frontier's optimum, runs at its level (module docstring)."""

    inner: DrawsLossModel | StackedLossModel  # the surface
    frontier: FrontierFit
    degenerate: bool = False

    @property
    def _wrapped(self) -> DrawsLossModel | StackedLossModel:
        return self.inner

    @property
    def law(self) -> str:
        return f"{self.inner.law}; N*, D*, L*(C) from the compute frontier"

    @property
    def min_flops(self) -> float:
        return getattr(self.inner, "min_flops", self.inner.max_flops)

    def _surface(self) -> Surface:
        inner = self.inner

        def own(c: float) -> PredictionInterval:
            return inner.optimum(c).loss

        if isinstance(inner, StackedLossModel):
            st = inner.stacked
            return Surface(point=lambda n, d: float(st.predict(n, d)), optimum=st.optimum, interval=own,
                           holds=not self.degenerate)  # fmt: skip
        opt = optimum_for_law(inner.law_obj)
        return Surface(point=inner.point, optimum=lambda c: opt(inner.params, c)[:3], interval=own,
                       holds=not self.degenerate)  # fmt: skip

    def point(self, n: float, d: float) -> float:
        return self.predict(n, d).point

    def predict(self, n: float, d: float, flops: float | None = None) -> PredictionInterval:
        return anchored_interval(self.frontier, self._surface(), n, d, flops if flops is not None else 6.0 * n * d)

    def optimum(self, flops: float) -> Optimum:
        co = compute_optimal(self.frontier, self._surface(), flops)
        n_iv = co.n_interval
        d_iv = None if n_iv is None else (flops / (6.0 * n_iv[1]), flops / (6.0 * n_iv[0]))
        return Optimum(flops=flops, n=co.n_opt, d=co.d_opt, loss=co.loss, n_interval=n_iv, d_interval=d_iv,
                       beside=co.line())  # fmt: skip


@dataclass(kw_only=True)
class BracketLossModel(_Wrapping):
    """A fit with no calibrated frontier (a first round): a run beyond the fitted budgets by the
    bracket, as `sweep next` predicts it (ScalingFit.run_interval, scalelab.fitting.allocation.bracket):
    the geometric mean of the surface's prediction and a power law through the budgets' best losses
    times the incumbent law's excess at (N, D); inside the budgets, and N*, D*, the wrapped model's."""

    inner: DrawsLossModel | StackedLossModel | FrontierLossModel  # what predicts inside, and N*, D*
    surface: DrawsLossModel | StackedLossModel  # the saturating side (the law's own interval)
    incumbent: DrawsLossModel  # the law whose excess over its optimum the power side carries
    power: FrontierForm  # the power law through each budget's best loss

    @property
    def _wrapped(self) -> DrawsLossModel | StackedLossModel | FrontierLossModel:
        return self.inner

    @property
    def law(self) -> str:
        return f"{self.inner.law}; beyond its budgets the bracket (surface and best-loss power law)"

    @property
    def min_flops(self) -> float:
        return self.incumbent.min_flops

    def brackets(self, flops: float) -> bool:
        """Whether a run of budget `flops` is predicted by the bracket: beyond the fitted budgets."""
        return decades_outside(flops, (self.incumbent.min_flops, self.max_flops)) > 0.0

    def _bracket(self, n: float, d: float, flops: float) -> PredictionInterval:
        inc = self.incumbent
        excess = inc.point(n, d) / optimum_for_law(inc.law_obj)(inc.params, flops)[2]
        return bracket_prediction(self.surface.predict(n, d, flops), math.exp(self.power.log_predict(flops)) * excess)

    def point(self, n: float, d: float) -> float:
        return self.predict(n, d).point

    def predict(self, n: float, d: float, flops: float | None = None) -> PredictionInterval:
        flops = flops if flops is not None else 6.0 * n * d
        return self._bracket(n, d, flops) if self.brackets(flops) else self.inner.predict(n, d, flops)

    def optimum(self, flops: float) -> Optimum:
        own = self.inner.optimum(flops)
        return replace(own, loss=self._bracket(own.n, own.d, flops)) if self.brackets(flops) else own


def _with_stack(model: DrawsLossModel, fit: SavedFit) -> LossModel:
    """The saved fit as the loop predicts from it: the law (or its stack), at the frontier's level
    where it has one, by the bracket beyond its budgets where no frontier is calibrated."""
    surface: DrawsLossModel | StackedLossModel = model
    if fit.stacked is not None:
        surface = StackedLossModel(incumbent=model, stacked=StackedFit.from_dict(fit.stacked))
    out: DrawsLossModel | StackedLossModel | FrontierLossModel = surface
    calibrated = False
    if fit.frontier is not None:
        frontier = FrontierFit.from_dict(fit.frontier)
        frontier.level = out.level
        out = FrontierLossModel(inner=surface, frontier=frontier, degenerate=degenerate(fit.degeneracy))
        calibrated = frontier.calibration.n_folds > 0
    minima = None if model.minima is None else budget_minima(*model.minima)
    if calibrated or minima is None or minima[0].size < 2:
        return out
    return BracketLossModel(inner=out, surface=surface, incumbent=model, power=fit_power(*minima))


def _plannable(law_name: str, where: str) -> Law:
    if law_name not in LOOP_LAWS:
        raise UsageError(
            f"{where}: the fit's law is {law_name!r}; plan-run needs a law of N and D with a compute-optimal "
            f"allocation ({' or '.join(LOOP_LAWS)}): refit with --law chinchilla"
        )
    return get_law(law_name)


def _from_round(fit: SavedFit) -> DrawsLossModel:
    """The closed loop's fit (fits/round_K.json "fit": scalelab.fitting.entry.scaling_fit.ScalingFit.to_record)."""
    law = _plannable(fit.law, fit.source)
    points = fit.record["points"]
    budgets = np.asarray(points["budgets"], dtype=float)
    return DrawsLossModel(
        law_obj=law,
        params={k: float(v) for k, v in fit.params.items()},
        draws=[{k: float(v) for k, v in d.items()} for d in fit.draws],
        residual_scale=float(fit.residual_scale or 0.0),
        extrapolation=ExtrapolationError(**fit.record["extrapolation"]),
        max_flops=float(budgets.max()),
        min_flops=float(budgets.min()),
        level=float(fit.level),
        source=fit.source,
        n_runs=int(budgets.size),
        warnings=list(fit.warnings),
        points={k: [float(x) for x in points[k]] for k in ("params", "tokens", "loss", "budgets")},
        minima=([float(x) for x in points["budgets"]], [float(x) for x in points["loss"]]),
    )


def _report_extrapolation(backtest: dict) -> tuple[ExtrapolationError, float | None, float]:
    """(error per decade, the largest budget the folds saw, the short-range floor) from a fit report's
    backtests (module docstring): each fold's runs with its training range."""
    none = ExtrapolationError(per_decade=None, n_runs=0, n_folds=0, max_decades=0.0)
    far, near, top = [], [], None
    for bt in backtest.values():
        if not isinstance(bt, dict) or "runs" not in bt:
            continue
        folds = bt.get("folds") or []
        if len(folds) != len(bt["runs"]):
            continue  # a report without each held-out run's training range
        for r, fold in zip(bt["runs"], folds):
            rng = fold["train_range"]
            top = max(top or 0.0, r["flops"], rng[1])
            if decades_outside(r["flops"], rng) >= MIN_DECADES:
                far.append({"runs": [r], "train_range": rng})
            elif r["flops"] > rng[1]:
                near.append(r["rel_error"])
    if far:
        return extrapolation_error(far), top, 0.0
    floor = math.sqrt(float(np.mean(np.square(near)))) if near else 0.0
    return none, top, floor


def _from_report(fit: SavedFit) -> DrawsLossModel:
    """A `scalelab fit --out` report (scalelab.fitting.entry.scaling_fit.ScalingFit.to_report with its samples)."""
    where = fit.source
    if fit.approach != 3:
        raise UsageError(
            f"{where}: an Approach {fit.approach} fit gives N*(C) only, no loss of N and D; "
            "plan-run needs a law of N and D: refit with --approach 3 --law chinchilla"
        )
    law = _plannable(fit.law, where)
    if not fit.draws:
        raise UsageError(
            f"{where}: the fit holds no parameter samples; save it with `scalelab fit DATA --out FIT.json`"
        )
    draws = [{k: float(v) for k, v in d.items()} for d in fit.draws]
    extrap, top, floor = _report_extrapolation(fit.backtest)
    if top is None:
        raise UsageError(
            f"{where}: the fit has no backtest with its folds' training ranges (its largest budget and out-of-sample "
            "error are unknown); refit with `scalelab fit` without --no-backtest"
        )
    warnings = list(fit.warnings)
    if floor:
        warnings.append(
            f"no backtest run lies {MIN_DECADES} decades or more beyond its fold's training runs: the error per decade "
            f"of extrapolation is unmeasured, so intervals carry no extrapolation part; the held-out runs' RMS miss "
            f"({100 * floor:.2f}%) enters as the part 'holdout'"
        )
    n = int(fit.record.get("n_points") or 0)
    sigma = float(fit.residual_scale or 0.0)  # the fit's: corrected for its parameters
    minima = fit.record.get("budget_minima")
    # the smallest budget fitted: from the budgets' minima where the report keeps them (older reports
    # do not: a budget below the largest then counts as outside the fitted range)
    bottom = float(min(minima["flops"])) if minima else float(top)
    return DrawsLossModel(
        law_obj=law,
        params={k: float(v) for k, v in fit.params.items()},
        draws=draws,
        residual_scale=sigma,
        extrapolation=extrap,
        max_flops=float(top),
        min_flops=min(bottom, float(top)),
        level=float(fit.level),
        source=where,
        n_runs=n,
        warnings=warnings,
        holdout_floor=floor,
        minima=(minima["flops"], minima["loss"]) if minima else None,
    )


def latest_round_fit(sweep_dir: Path) -> Path | None:
    rounds = SweepLayout(sweep_dir).round_fits()
    return rounds[-1] if rounds else None


def load_loss_model(source: str | Path | SavedFit) -> LossModel:
    """The fit of a sweep directory (its latest round), of a saved fit file (module docstring) or
    one already loaded (scalelab.fitting.entry.saved_fit)."""
    if isinstance(source, SavedFit):
        return _loss_model(source)
    path = Path(source)
    if path.is_dir():
        found = latest_round_fit(path)
        if found is None:
            raise UsageError(
                f"{path} has no fits/round_*.json; run `scalelab sweep next {path}` first (it fits the sweep)"
            )
        path = found
    if not path.is_file():
        raise UsageError(f"{path} does not exist; give a sweep directory or a FIT.json from `scalelab fit --out`")
    return _loss_model(load_saved_fit(path))


def _loss_model(fit: SavedFit) -> LossModel:
    """A report's model or a round's (or a fit record's), with its stacked law and frontier when saved."""
    try:
        return _with_stack(_from_report(fit) if fit.form == "report" else _from_round(fit), fit)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"{fit.source}: a fit with a missing or malformed field ({e})") from None
