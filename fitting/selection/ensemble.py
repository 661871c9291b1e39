"""A stacked law: several law forms fitted to the same runs, combined in log space by forward evidence.

    sf = fit_stacked(params=N, tokens=D, loss=L, flops=C, groups=budgets, noise=0.0056, bootstrap=32)
    sf.weights                                  # {"chinchilla": 0.62, "kaplan": 0.38} (fitting.uncertainty.stacking)
    sf.predict(1.5e5, 6.8e6)                    # exp(sum_j w_j log L_j(N, D))
    sf.predict_interval(1.5e5, 6.8e6)           # PredictionInterval with parts (below)
    sf.optimum(6e12)                            # (N*, D*, L*) of the combined law along C = 6 N D

Components are fitted by the same robust fit as a single law (Huber on log loss, summed; multi-start
L-BFGS). A candidate name may carry an estimator suffix: "chinchilla@flops" is Chinchilla's form
with each run weighted by its compute (large runs resemble the target more than small ones, whose
loss is still in the steep early part of training).

The prediction interval adds in log space (as scalelab.fitting.uncertainty.predictive does for one law):
  bootstrap      the combined prediction's spread over run-resampling refits of every component
                 (paired: one resample refits all components), weights fixed;
  weights        its spread over the weight draws (forward groups resampled), parameters fixed:
                 how much the choice between forms is still open;
  noise          a new run's own noise;
  forms          max_j |ln L_j - ln L| / z: the interval holds every candidate form's own prediction.
                 Where the forms part ways the runs do not pin the law, whatever the backtests say:
                 a misfit that grows with distance can be invisible half a decade out (docs/extrapolation.md);
  extrapolation  c * t/z * k * decades, k the combination's forward error per decade over every
                 forward fold (scalelab.fitting.uncertainty.stacking, step 4; t: Student's t for as many folds).
                 k is measured half a decade out, where a fold's miss is mostly noise, then multiplied
                 by the target's distance; c = EXTRAPOLATION_SCALE is the smallest scale that kept
                 95% coverage on synthetic truths (experiments/extrapolation_scale.py, docs/extrapolation.md).
The optimum is the combined law's minimum along the IsoFLOP line (a 1-D minimisation in log N);
every candidate form has an optimum, so the combination does too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, stats

from scalelab.errors import UsageError
from scalelab.fitting.allocation.allocate import can_allocate, optimum_for_law
from scalelab.fitting.estimate import diagnostics
from scalelab.fitting.estimate.fit import FitResult, fit_law
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.uncertainty.bootstrap import refit_replicates
from scalelab.fitting.uncertainty.forward import forward_backtest
from scalelab.fitting.uncertainty.predictive import (
    ExtrapolationError,
    PredictionInterval,
    decades_outside,
    interval_from_parts,
    t_over_z,
)
from scalelab.fitting.uncertainty.stacking import Stack, StackRule, stack_weights

DEFAULT_CANDIDATES = ("chinchilla", "kaplan")
WEIGHTINGS = ("equal", "flops")
BOOT_EXTRA_STARTS = 8
# A forward group this close to its fold's training range measures the fit's misfit at the range's
# edge, not its drift: divided by a tiny distance, that misfit reads as a huge error per decade.
MIN_FORWARD_DECADES = 0.25
LEVEL = 0.95
# c of the extrapolation part (module docstring): calibrated with the forms part on synthetic truths
# (experiments/extrapolation_scale.py: pooled coverage >= 95% at 3x, 10x and 30x, each >= 92%)
EXTRAPOLATION_SCALE = 0.20


def parse_candidate(name: str) -> tuple[str, str]:
    """'chinchilla@flops' -> ('chinchilla', 'flops'); a bare law name weights runs equally."""
    law, _, weighting = name.partition("@")
    weighting = weighting or "equal"
    if weighting not in WEIGHTINGS:
        raise UsageError(f"candidate {name!r}: unknown run weighting {weighting!r}; use one of {WEIGHTINGS}")
    law_obj = get_law(law)
    if not can_allocate(law_obj):
        raise UsageError(f"candidate {name!r}: a stacked law combines laws of (N, D); {law} reads {law_obj.inputs}")
    return law, weighting


def run_weights(weighting: str, flops: np.ndarray) -> np.ndarray | None:
    """Per-run fit weights of an estimator: None (equal) or compute-proportional, mean 1."""
    if weighting == "equal":
        return None
    return flops / flops.mean()


@dataclass(kw_only=True)
class StackedFit:
    names: tuple[str, ...]
    components: dict[str, FitResult]
    stack: Stack
    replicates: list[dict[str, dict[str, float]]]  # per bootstrap replicate: candidate -> parameters
    noise: float  # log-sd of a new run
    train_range: tuple[float, float]  # smallest and largest training compute (group compute)
    level: float = LEVEL
    # the incumbent's own extrapolation error (a single law's backtests, scalelab.fitting.entry.fit_runs)
    incumbent_extrapolation: ExtrapolationError | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def weights(self) -> dict[str, float]:
        return dict(self.stack.weights)

    @property
    def extrapolation(self) -> ExtrapolationError:
        """k of the interval's extrapolation part. The combination's drift over the forward folds; but
        while the incumbent keeps all the weight the stacked law *is* the incumbent, and its own
        backtests measure the same error: the estimate resting on more folds is used (the larger on
        a tie), so that one forward fold's k is not stretched by Student's t for one degree of freedom."""
        forward = self._forward_extrapolation()
        own = self.incumbent_extrapolation
        if self.stack.adopted or own is None or own.per_decade is None:
            return forward
        if forward.per_decade is None or (own.n_folds, own.per_decade) > (forward.n_folds, forward.per_decade):
            return own
        return forward

    def _forward_extrapolation(self) -> ExtrapolationError:
        dmax = max((g.decades for g in self.stack.groups), default=0.0)
        return ExtrapolationError(
            per_decade=self.stack.drift,
            n_runs=sum(g.n_test for g in self.stack.groups),
            n_folds=self.stack.drift_folds,
            max_decades=dmax,
        )

    def _law(self, name: str):
        return get_law(parse_candidate(name)[0])

    def log_components(self, n, d, params: Mapping[str, Mapping[str, float]] | None = None) -> np.ndarray:
        """(K, ...) log-loss of every component at (n, d)."""
        n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
        params = params or self.component_params()
        return np.stack([np.log(self._law(k).predict(params[k], params=n, tokens=d)) for k in self.names])

    def log_predict(self, n, d, weights: np.ndarray | None = None, params=None) -> np.ndarray:
        w = self.stack.weight_vector() if weights is None else np.asarray(weights, dtype=float)
        return np.tensordot(w, self.log_components(n, d, params), axes=1)

    def predict(self, n, d) -> np.ndarray:
        return np.exp(self.log_predict(n, d))

    def decades(self, flops: float) -> float:
        return decades_outside(flops, self.train_range)

    def predict_interval(
        self,
        n: float,
        d: float,
        flops: float | None = None,
        *,
        extrapolation_scale: float = EXTRAPOLATION_SCALE,
        forms: bool = True,
    ) -> PredictionInterval:
        """The combined prediction at (N, D) with its interval parts (module docstring).
        `extrapolation_scale=1.0, forms=False` gives the uncalibrated parts the calibration starts from."""
        point = float(self.log_predict(n, d))
        boot = np.array([float(self.log_predict(n, d, params=p)) for p in self.replicates])
        comps = self.log_components(n, d)
        by_weights = self.stack.draws @ comps
        z = _z(self.level)
        ext = self.extrapolation
        dist = self.decades(flops if flops is not None else 6.0 * n * d)
        parts = {
            "bootstrap": _half_width(boot, self.level) / z,
            "weights": _half_width(by_weights, self.level) / z,
            "noise": float(self.noise),
        }
        if forms:
            parts["forms"] = float(np.max(np.abs(comps - point))) / z
        # last, so that the texts' "at D decades" (format_parts) follows the part it belongs to
        parts["extrapolation"] = (
            extrapolation_scale * t_over_z(ext.n_folds, self.level) * ext.per_decade * dist
            if ext.per_decade is not None
            else float("nan")
        )
        out = interval_from_parts(math.exp(point), parts, self.level)
        out.parts["decades"] = float(dist)
        return out

    def optimum(self, flops: float, weights: np.ndarray | None = None, params=None) -> tuple[float, float, float]:
        """(N*, D*, L*) of the combined law at compute C = 6 N D."""
        params = params or self.component_params()
        guesses = [optimum_for_law(self._law(k))(params[k], flops)[0] for k in self.names]
        lo = math.log(max(min(guesses) / 30.0, 1.0))
        hi = math.log(max(guesses) * 30.0)

        def objective(log_n: float) -> float:
            n = math.exp(log_n)
            return float(self.log_predict(n, flops / (6.0 * n), weights, params))

        res = optimize.minimize_scalar(objective, bounds=(lo, hi), method="bounded", options={"xatol": 1e-6})
        n_opt = math.exp(res.x)
        return n_opt, flops / (6.0 * n_opt), math.exp(res.fun)

    def optimum_interval(self, flops: float) -> PredictionInterval:
        """L*(C) with the interval of a prediction at the compute-optimal (N*, D*)."""
        n, d, _ = self.optimum(flops)
        return self.predict_interval(n, d, flops)

    def component_params(self) -> dict[str, dict[str, float]]:
        return {k: dict(f.params) for k, f in self.components.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "weights": self.weights,
            "components": {k: {"law": f.law, "params": dict(f.params)} for k, f in self.components.items()},
            "stack": self.stack.to_dict(),
            "replicates": self.replicates,
            "noise": self.noise,
            "train_range": list(self.train_range),
            "level": self.level,
            "incumbent_extrapolation": (
                None if self.incumbent_extrapolation is None else self.incumbent_extrapolation.to_dict()
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StackedFit:
        """A saved stacked fit (to_dict) back, for predictions and allocations from a fit file."""
        names = tuple(data["names"])
        components = {
            k: FitResult(law=v["law"], params=dict(v["params"]), objective=float("nan"), n_points=0, inputs={})
            for k, v in data["components"].items()
        }
        return cls(
            names=names,
            components=components,
            stack=Stack.from_dict(data["stack"]),
            replicates=[{k: dict(p) for k, p in rep.items()} for rep in data.get("replicates") or []],
            noise=float(data["noise"]),
            train_range=(float(data["train_range"][0]), float(data["train_range"][1])),
            level=float(data.get("level", LEVEL)),
            incumbent_extrapolation=(
                ExtrapolationError(**data["incumbent_extrapolation"]) if data.get("incumbent_extrapolation") else None
            ),
        )


def format_stacked(st: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """Text lines of a saved stacked fit (StackedFit.to_dict): weights, the rule's reason, drift, folds."""
    stack = st["stack"]
    wiv = stack.get("weight_intervals") or {}
    weights = ", ".join(
        f"{n} {w:.2f}" + (f" [{wiv[n][0]:.2f}, {wiv[n][1]:.2f}]" if n in wiv else "") for n, w in st["weights"].items()
    )
    lines = [f"stacked law (forward backtests): {weights}", f"{indent}{stack['reason']}"]
    if stack.get("drift_per_decade") is not None:
        lines.append(
            f"{indent}the combination drifts {100 * stack['drift_per_decade']:.2f}% per decade out of sample "
            f"({stack['drift_folds']} fold(s))"
        )
    used = StackedFit.from_dict(st).extrapolation
    if used.per_decade is not None and used.per_decade != stack.get("drift_per_decade"):
        lines.append(
            f"{indent}the interval's extrapolation part uses the incumbent's own backtests: "
            f"{100 * used.per_decade:.2f}% per decade ({used.n_folds} fold(s))"
        )
    for g in stack["groups"]:
        errs = "  ".join(f"{n} {100 * e:+.2f}%" for n, e in g["errors"].items())
        head = f"{indent}fold {g['fold']} ({g['n_train']} runs) -> C={g['flops']:.3g}"
        lines.append(f"{head} at {g['decades']:.2f} decades: {errs}")
    return lines


def format_parts(parts: Mapping[str, float]) -> str:
    """'bootstrap 0.0080, weights 0.0040, noise 0.0056, extrapolation 0.0348 at 0.48 decades' (log-sds)."""
    shown = ", ".join(f"{'run noise' if k == 'noise' else k} {v:.4f}" for k, v in parts.items() if k != "decades")
    return shown + (f" at {parts['decades']:.2f} decades" if "decades" in parts else "")


def _z(level: float) -> float:
    return float(stats.norm.ppf(0.5 + level / 2))


def _half_width(values: np.ndarray, level: float) -> float:
    values = values[np.isfinite(values)]
    if values.size < 2:
        return 0.0
    lo, hi = np.quantile(values, [0.5 - level / 2, 0.5 + level / 2])
    return float(hi - lo) / 2.0


def _candidate_weights(weighting: str, c, weights):
    """A candidate's run weights: its weighting's (run_weights) times `weights` (either may be None)."""
    w = run_weights(weighting, c)
    if weights is not None:
        w = weights if w is None else w * weights
    return w


def _fit_one(name: str, n, d, y, c, weights=None) -> FitResult:
    """One candidate's fit (its weighting times `weights`)."""
    law, weighting = parse_candidate(name)
    w = _candidate_weights(weighting, c, weights)
    return fit_law(law, {"params": n, "tokens": d, "loss": y}, weights=w, diagnose=False, n_polish=1)


def _bootstrap_components(
    components: dict, n, d, y, c, base, *, bootstrap: int, seed: int
) -> list[dict[str, dict[str, float]]]:
    """`bootstrap` run resamples, each refitting every component from its full fit's optimum and
    BOOT_EXTRA_STARTS grid points; a resample one component cannot fit is left out. Every resample
    is drawn first, in the order the draws were always made (a resample's draws stop at the first
    component that refuses its runs), then each component refits all resamples at once
    (bootstrap.refit_replicates)."""
    rng = np.random.default_rng(seed)
    names = tuple(components)
    laws = {k: get_law(parse_candidate(k)[0]) for k in names}
    grids = {k: laws[k].init_grid() for k in names}
    plan = []  # per resample every component can fit: its counts and each component's starts
    for _ in range(bootstrap):
        counts = np.bincount(rng.integers(0, y.size, y.size), minlength=y.size).astype(float)
        keep = counts > 0
        starts = {}
        for k in names:
            warm = laws[k].to_fit(components[k].params)[None, :]
            starts[k] = np.vstack([warm, grids[k][rng.choice(len(grids[k]), BOOT_EXTRA_STARTS)]])
            if not _can_fit(laws[k], n[keep], d[keep], y[keep]):
                break
        else:
            plan.append((counts, starts))
    if not plan:
        return []
    keep = np.stack([counts > 0 for counts, _ in plan])
    fitted = {}
    for k in names:
        weighting = parse_candidate(k)[1]
        weights = np.zeros(keep.shape)
        for i, (counts, _) in enumerate(plan):
            weights[i, keep[i]] = _candidate_weights(weighting, c[keep[i]], (counts * base)[keep[i]])
        fitted[k] = refit_replicates(
            laws[k],
            {"params": n, "tokens": d},
            np.broadcast_to(y, keep.shape),
            keep,
            weights,
            np.stack([starts[k] for _, starts in plan]),
        )
    return [{k: fitted[k][i] for k in names} for i in range(len(plan)) if all(fitted[k][i] is not None for k in names)]


def _can_fit(law, n, d, y) -> bool:
    """Whether fit_law would take these runs (enough distinct points for the law's parameters)."""
    try:
        diagnostics.validate_data(law, {"params": n, "tokens": d, "loss": y})
    except UsageError:
        return False
    return True


def fit_stacked(
    *,
    params,
    tokens,
    loss,
    flops,
    groups,
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    incumbent: str | None = None,
    noise: float,
    bootstrap: int = 32,
    seed: int = 0,
    scored=None,
    weights=None,
    min_train_runs: int | None = None,
    rule: StackRule | None = None,
    level: float = LEVEL,
) -> StackedFit:
    """Fit every candidate, weight them by forward backtests, bootstrap the components.

    Args:
        params, tokens, loss: per run; flops: per run compute (distances, and '@flops' weights);
        groups: per run group (budget label or model) ordering the forward folds by compute.
        candidates: law names, optionally with an estimator suffix ('chinchilla@flops').
        incumbent: the candidate that keeps all weight unless forward evidence moves it (default:
            the first).
        noise: a new run's log-sd (the larger of the fit's residual scale and a seed study's floor).
        bootstrap: run-resampling replicates (0: none).
        scored: per-run mask of the runs forward folds score (default all).
        weights: per-run fit weights every component's fit multiplies in (e.g. runs stopped early).
        min_train_runs: a forward fold's least training runs (default: the largest parameter count + 3).
    """
    names = tuple(candidates)
    for name in names:
        parse_candidate(name)
    n, d, y, c = (np.asarray(a, dtype=float) for a in (params, tokens, loss, flops))
    base = np.ones(y.size) if weights is None else np.asarray(weights, dtype=float)
    groups = np.asarray(groups)
    if min_train_runs is None:
        min_train_runs = max(get_law(parse_candidate(k)[0]).n_params for k in names) + 3
    components = {k: _fit_one(k, n, d, y, c, weights=base) for k in names}

    def fitter(name: str):
        def fit_on(mask: np.ndarray):
            f = _fit_one(name, n[mask], d[mask], y[mask], c[mask], weights=base[mask])
            law = get_law(parse_candidate(name)[0])
            return lambda nn, dd: law.predict(f.params, params=nn, tokens=dd)

        return fit_on

    fwd = forward_backtest(
        {k: fitter(k) for k in names},
        n,
        d,
        y,
        c,
        groups,
        scored=scored,
        min_train_runs=min_train_runs,
        min_decades=MIN_FORWARD_DECADES,
    )
    stack = stack_weights(fwd, names, noise=noise, incumbent=incumbent, rule=rule or StackRule())
    replicates = _bootstrap_components(components, n, d, y, c, base, bootstrap=bootstrap, seed=seed)
    order = np.argsort(c)
    return StackedFit(
        names=names,
        components=components,
        stack=stack,
        replicates=replicates,
        noise=float(noise),
        train_range=(float(c[order[0]]), float(c[order[-1]])),
        level=level,
    )
