"""The options of the one fit entry (scalelab.fitting.fit_runs.fit_runs), as one typed object.

    FitOptions(law="chinchilla", bootstrap=64, starts=200, draw_starts=True)   # as `sweep next` by default
    FitOptions(law="auto", approach=3, bootstrap=0, backtest=False)  # delta-method intervals, no backtests

Every caller - `scalelab fit`, `sweep next`, `scalelab report`, the benches - builds one of these;
a sweep store's are built from its spec's `fit:` section (scalelab.sweeps.store_fit.fit_options),
so on one store the three commands fit with the same options and agree on every number.

`law` is the one field that chooses what is fitted: a law name (scalelab.fitting.laws); "auto", the
stacked law (the `candidates`' forms weighted by forward backtests, scalelab.fitting.ensemble: the
first candidate predicts alone unless the forward evidence moves weight off it); or "select" (the
best of `candidates` by the held-out-largest-budget backtest, scalelab.fitting.select, curve laws
included). It is read in one place, scalelab.fitting.fit_runs.fit_law_choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.errors import UsageError

LEVEL = 0.95


@dataclass(frozen=True, kw_only=True, slots=True)
class FitOptions:
    # what is fitted
    law: str = "chinchilla"  # a law name; "auto": the stacked law; "select": the best of `candidates` by backtest
    candidates: tuple[str, ...] | None = None  # auto: the stacked forms, incumbent first (None: chinchilla, kaplan);
    # select: the laws compared (None: every law the data allow)
    evidence: str = "growth"  # auto: what moves weight off the incumbent (scalelab.fitting.stacking.StackRule):
    # growth (its forward error grows with distance) | level (its forward error per decade is nonzero)
    stack_point: str = "bagged"  # auto: the weights that predict: bagged (the mean of the rule's bootstrap
    # draws that can test the evidence) | rule (the rule's own all-or-nothing decision)
    require_optimum: bool = False  # one law of N and D with a compute-optimal allocation (the loop proposes
    # from N*(C)): when "auto" picks a curve law or the average, the best-scored such law is fitted instead
    approach: int = 3  # 1 (envelope), 2 (IsoFLOP parabolas) or 3 (parametric law), Chinchilla's approaches
    isoflop_shape: str = "parabola"  # approach 2's slice fit: parabola in ln N | power (the curve's own
    # asymmetric shape, exponents shared: scalelab.fitting.isoflop_shape)
    # which runs and values (a sweep store's runs table: scalelab.sweeps.store_fit)
    loss: str = "loss"  # the loss column
    flops: str = "6n"  # 6n | exact: a run's FLOPs where it has no IsoFLOP budget label
    params: str = "total"  # total | nonembed: the N a law is fitted on (a store's params or params_nonembed)
    stopped: str = "exclude"  # runs stopped early: left out, or "include"d at their predicted loss and weight
    # how it is fitted: Huber on log loss (delta), L-BFGS from `starts` rows of the law's init grid
    objective: str = "huber"  # huber | squared
    delta: float = 1e-3  # Huber threshold on log-loss residuals
    starts: int | None = None  # None: the whole init grid; K: K evenly spaced rows of it (every axis value)
    draw_starts: bool = False  # the K rows drawn at random with the seed instead: a sweep store's rule
    # (scalelab.sweeps.store_fit), kept because the loop's recorded fits and proposals were made with it
    # intervals, backtests, gates
    bootstrap: int = 0  # replicates (runs resampled, each refitted); 0: delta-method intervals
    seed: int = 0  # the one generator behind the starts, the bootstrap and the backtests' starts
    level: float = LEVEL  # interval level
    backtest: bool = True  # hold out the largest budget; leave each budget out (3+ budgets)
    holdout_frac: float | None = None  # hold out this fraction of runs by FLOPs instead of the largest budget
    noise_floor: float = 0.0  # run-to-run log-sd from a seed study: the least noise a prediction carries
    gates: bool = False  # check the identification gates (laws of N and D; scalelab.fitting.gates)
    target_flops: float | None = None  # where the starts gate compares (default: 3x the largest budget)

    def __post_init__(self) -> None:
        if self.approach not in (1, 2, 3):
            raise UsageError(f"approach must be 1, 2 or 3, got {self.approach}")
        if self.bootstrap < 0:
            raise UsageError(f"bootstrap must be >= 0, got {self.bootstrap}")
        if self.starts is not None and self.starts < 1:
            raise UsageError(f"starts must be >= 1, got {self.starts}")
        if self.holdout_frac is not None and not 0.0 < self.holdout_frac < 1.0:
            raise UsageError(f"holdout fraction must be in (0, 1), got {self.holdout_frac}")
        if not 0.0 < self.level < 1.0:
            raise UsageError(f"level must be in (0, 1), got {self.level}")
        for name, value, allowed in (
            ("objective", self.objective, ("huber", "squared")),
            ("flops", self.flops, ("6n", "exact")),
            ("params", self.params, ("total", "nonembed")),
            ("stopped", self.stopped, ("include", "exclude")),
            ("evidence", self.evidence, ("growth", "level")),
            ("stack_point", self.stack_point, ("bagged", "rule")),
            ("isoflop_shape", self.isoflop_shape, ("parabola", "power")),
        ):
            if value not in allowed:
                raise UsageError(f"{name} {value!r} is not known; use {' or '.join(allowed)}")
