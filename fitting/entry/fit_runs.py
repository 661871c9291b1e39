"""The one fit entry: a table of runs and a FitOptions in, a ScalingFit out.

    fit = fit_runs(read_runs("runs.parquet"), FitOptions(law="chinchilla", bootstrap=64, starts=200))
    fit.params, fit.intervals["alpha"], fit.backtest["holdout"]["mare"]
    fit.to_report()                 # `scalelab fit --json`;  fit.to_record(): fits/round_K.json

`scalelab fit`, `sweep next`, `scalelab report` and the benches all fit through here (a sweep
store's runs table and options: scalelab.sweeps.closed_loop.store_fit), so one store gives one set of numbers.

A parametric law (approach 3), in this order from one generator seeded with `options.seed`:

1. Fit: Huber on log loss, summed (scalelab.fitting.estimate.fit.fit_law), from the law's init grid, or
   `options.starts` rows of it, evenly spaced or (options.draw_starts, a sweep store's rule) drawn
   at random (the full 4500-start Chinchilla grid finds the same optimum on sweep-sized tables and
   takes far longer).
2. Intervals: `options.bootstrap` replicates reweighting the runs, each refitted from the full fit
   and BOOT_EXTRA_STARTS of those grid rows (scalelab.fitting.uncertainty.bootstrap.refit_bootstrap); percentile
   intervals (scalelab.fitting.estimate.intervals.percentile_interval) for every parameter and derived
   quantity. With no replicates: delta-method intervals, and normal draws from their covariance
   (a generator of their own) so that a saved fit can still give intervals.
3. Backtests (scalelab.fitting.uncertainty.backtest) over the table's compute groups
   (scalelab.fitting.uncertainty.compute_groups: a group column, the models of loss curves, FLOP
   budgets, or FLOP bins when the budgets are more than MAX_GROUPS): hold out the largest group;
   leave each group out in turn when there are 3 or more; every fold refitted from the full fit
   and BACKTEST_STARTS grid rows, a protocol's folds in one batch
   (scalelab.fitting.uncertainty.backtest.BatchedLawFitter). Their extrapolating folds give the
   law's out-of-sample error per decade (scalelab.fitting.uncertainty.predictive).
4. A law of N and D: the compute frontier L*(C), N*(C) over the same groups (scalelab.fitting.allocation.frontier),
   which compute-optimal predictions come from, and the law's degeneracy findings against it
   (scalelab.fitting.entry.degeneracy).
5. Gates (scalelab.fitting.entry.gates), when asked, at options.target_flops (default 3x the largest budget).

Approaches 1 and 2, and the curve laws or their average chosen by law "auto", are fitted by
scalelab.fitting.entry.fit_approaches.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from scalelab.errors import UsageError
from scalelab.fitting.allocation.allocate import can_allocate
from scalelab.fitting.allocation.frontier import fit_frontier
from scalelab.fitting.entry.degeneracy import diagnose
from scalelab.fitting.entry.fit_approaches import fit_approach, fit_curve_choice
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.gates import check_gates
from scalelab.fitting.entry.scaling_fit import ScalingFit, optimum_fn
from scalelab.fitting.estimate.fit import fit_law, subsample_starts
from scalelab.fitting.estimate.intervals import delta_method_intervals, percentile_interval
from scalelab.fitting.estimate.io import RunTable
from scalelab.fitting.forms.laws import CURVE_LAWS, Law, get_law
from scalelab.fitting.loss_curves.curves import RunCurve
from scalelab.fitting.selection.ensemble import DEFAULT_CANDIDATES, fit_stacked, parse_candidate
from scalelab.fitting.selection.select import select_law
from scalelab.fitting.uncertainty.backtest import BatchedLawFitter, holdout_backtest, leave_one_budget_out
from scalelab.fitting.uncertainty.bootstrap import refit_bootstrap
from scalelab.fitting.uncertainty.compute_groups import MAX_GROUPS, ComputeGroups, compute_groups
from scalelab.fitting.uncertainty.predictive import extrapolation_error
from scalelab.fitting.uncertainty.stacking import StackRule

BACKTEST_STARTS = 16  # grid rows added to the full fit's optimum in each backtest refit
DELTA_SAMPLES = 1000  # normal draws from the delta-method covariance, saved for predict/allocate
DERIVED_FNS = {  # quantities derived from a Chinchilla-form law's parameters
    "n_opt_exponent": lambda p: p["beta"] / (p["alpha"] + p["beta"]),
    "d_opt_exponent": lambda p: p["alpha"] / (p["alpha"] + p["beta"]),
    "G": lambda p: (p["alpha"] * p["A"] / (p["beta"] * p["B"])) ** (1.0 / (p["alpha"] + p["beta"])),
}


@contextlib.contextmanager
def one_torch_thread():
    """Run the fits on one torch thread: their tensors are (starts x points), far too small for
    intra-op threads, and on shared machines two threads spin-wait against other processes."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def fit_runs(table: RunTable, options: FitOptions | None = None, *, curves: list[RunCurve] | None = None) -> ScalingFit:
    """Fit a table of runs as `options` say (module docstring).

    Args:
        table: the runs (scalelab.fitting.estimate.io.read_runs; a store's: scalelab.sweeps.closed_loop.store_fit).
            Its `flops` are the FLOP budgets the backtests and gates group by; `weight`, when
            present, weights every fit.
        options: FitOptions() when None.
        curves: the runs' loss curves (matched by run_id), for the curve laws and law "auto".
    Returns:
        ScalingFit.
    Raises:
        UsageError / ConfigError: bad input (too few runs for the law, a missing column, a curve
            law without curves, ...).
    """
    options = options or FitOptions()
    with one_torch_thread():
        if options.approach in (1, 2):
            return fit_approach(table, options)
        return fit_law_choice(table, options, curves)


def fit_law_choice(table: RunTable, options: FitOptions, curves: list[RunCurve] | None) -> ScalingFit:
    """Approach 3 for `options.law`: a named law, "auto" (stacked) or "select" - the one place that
    reads the choice."""
    law = options.law
    if law in CURVE_LAWS and not curves:
        raise UsageError(f"law {law} is fitted on loss curves: pass a sweep directory or a table of logged steps")
    if law == "auto":
        return fit_stacked_runs(table, options)
    if law != "select" and law not in CURVE_LAWS:
        return fit_law_runs(table, law, options)
    if law == "select":
        kwargs = {} if options.candidates is None else {"candidates": options.candidates}
    else:  # a curve law: its backtest comes from the selection protocol with it as the only candidate
        kwargs = {"candidates": [law], "incumbent": None}
    sel = select_law(table, curves, holdout_frac=options.holdout_frac, refit=False, **kwargs)
    chosen, selection = sel.chosen, sel.to_dict()
    if options.require_optimum:
        if not can_allocate(chosen):
            singles = [c.name for c in sel.ranking() if can_allocate(c.name)]
            chosen = singles[0] if singles else "chinchilla"
            selection["rule"] = f"{selection['rule']}; {sel.chosen} has no closed optimum, so the loop fits {chosen}"
        selection["loop_law"] = chosen
    if chosen in CURVE_LAWS or chosen == "average":
        return fit_curve_choice(table, curves, sel, options)
    fit = fit_law_runs(table, chosen, options)
    fit.selection = selection
    return fit


def fit_stacked_runs(table: RunTable, options: FitOptions) -> ScalingFit:
    """Law "auto": the incumbent (the first candidate) fitted as one law - its intervals, backtests,
    gates and compute-optimal allocation - and every candidate stacked by forward backtests for the
    loss predictions (scalelab.fitting.selection.ensemble)."""
    names = tuple(options.candidates or DEFAULT_CANDIDATES)
    incumbent, weighting = parse_candidate(names[0])
    if weighting != "equal":
        raise UsageError(f"candidates: the incumbent {names[0]!r} must weight runs equally (list it first plain)")
    for name in names:
        parse_candidate(name)
    fit = fit_law_runs(table, incumbent, options)
    groups = compute_groups(table)
    fit.stacked = fit_stacked(
        params=table.params,
        tokens=table.tokens,
        loss=table.loss,
        flops=table.flops,
        groups=groups.labels,
        scored=groups.scored,
        weights=table.weight,
        candidates=names,
        noise=fit.residual_scale,
        bootstrap=options.bootstrap,
        seed=options.seed,
        level=options.level,
        rule=StackRule(evidence=options.evidence, point=options.stack_point),
    )
    fit.stacked.incumbent_extrapolation = fit.extrapolation
    st = fit.stacked.stack
    fit.selection = {
        "protocol": "forward backtests (rolling origin over compute), stacked in log space",
        "rule": st.reason,
        "weights": dict(st.weights),
        "chosen": "stacked" if st.adopted else incumbent,
    }
    return fit


def law_data(law: Law, table: RunTable) -> dict[str, np.ndarray]:
    """The law's inputs and the loss, from the table."""
    inputs = table.law_inputs()
    missing = [k for k in law.inputs if k not in inputs]
    if missing:
        raise UsageError(f"law {law.name} needs column(s) {missing}; map them with --{missing[0]}-col")
    return {**{k: inputs[k] for k in law.inputs}, "loss": table.loss}


def fit_law_runs(table: RunTable, law_name: str, options: FitOptions) -> ScalingFit:
    """One parametric law: fit, intervals, backtests, gates (module docstring, 1-4)."""
    law = get_law(law_name)
    if len(table) <= law.n_params:
        raise UsageError(
            f"{len(table)} runs is too few to fit {law.n_params} parameters of {law.name}; need at least "
            f"{law.n_params + 1}"
        )
    data = law_data(law, table)
    fit_kwargs = {"objective": options.objective, "delta": options.delta}
    rng = np.random.default_rng(options.seed)
    pool = law.init_grid()
    if options.starts is not None and options.draw_starts:
        pool = pool[rng.choice(len(pool), min(options.starts, len(pool)), replace=False)]
    elif options.starts is not None and options.starts < len(pool):
        pool = subsample_starts(law, options.starts)
    fit = fit_law(law, data, starts=pool, weights=table.weight, n_polish=1, **fit_kwargs)
    params = {k: float(v) for k, v in fit.params.items()}
    derived_fns = DERIVED_FNS if {"alpha", "beta", "A", "B"} <= set(params) else {}
    warnings = list(fit.warnings)
    out = ScalingFit(
        options=options,
        table=table,
        law=law.name,
        approach=3,
        params=params,
        intervals={},
        objective=float(fit.objective),
        n_points=int(fit.n_points),
        derived={k: float(fn(params)) for k, fn in derived_fns.items()},
        warnings=warnings,
        fit=fit,
    )
    if options.bootstrap > 0:
        boot = refit_bootstrap(
            law, data, fit, replicates=options.bootstrap, rng=rng, start_pool=pool, weights=table.weight, **fit_kwargs
        )
        out.draws, out.boot_plan = boot.draws, boot.plan
        for name in law.param_names:
            out.intervals[name] = list(percentile_interval([p[name] for p in boot.draws], options.level))
        for name, fn in derived_fns.items():
            out.intervals[name] = list(percentile_interval([fn(p) for p in boot.draws], options.level))
        out.samples = {n: [float(p[n]) for p in boot.draws] for n in law.param_names}
        out.interval_method = f"bootstrap percentile (B={options.bootstrap})"
        if boot.n_failed:
            warnings.append(f"bootstrap: {boot.n_failed} of {options.bootstrap} resamples could not be fitted")
    else:
        out.intervals, out.samples = _delta_intervals(law, data, fit, derived_fns, options, warnings)
        out.interval_method = "delta method"
    groups = compute_groups(table)
    out.groups = groups.note
    if options.backtest:
        fitter = BatchedLawFitter(law, starts_of(law, fit, pool, rng), **fit_kwargs)
        out.backtest = run_backtests(table, groups, fitter, options, law.n_params + 1, warnings)
        out.extrapolation = extrapolation_error(bt for bt in out.backtest.values() if "runs" in bt)
    if can_allocate(law.name):
        folds = BatchedLawFitter(law, starts_of(law, fit, pool, rng), **fit_kwargs)
        _frontier_and_findings(out, law, groups, fit, warnings, _surface_folds(law, table, folds))
    if options.gates and can_allocate(law.name):
        out.target_flops = float(options.target_flops or 3.0 * table.flops.max())
        out.gates = check_gates(
            law,
            params,
            fit.theta,
            fit.alt_thetas,
            fit.alt_objectives,
            optimum_fn(law),
            n=table.params,
            loss=table.loss,
            flops=table.flops,
            target_flops=out.target_flops,
            findings=out.degeneracy,
        )
    return out


def starts_of(law: Law, fit, pool: np.ndarray, rng: np.random.Generator):
    """A refit's starts (a backtest fold, a frontier fold): the full fit's optimum and BACKTEST_STARTS
    rows of the start pool, drawn from the fit's one generator when called."""
    warm = law.to_fit(fit.params)[None, :]
    k = min(BACKTEST_STARTS, len(pool))
    return lambda: np.vstack([warm, pool[rng.choice(len(pool), k, replace=False)]])


def _surface_folds(law: Law, table: RunTable, fitter: BatchedLawFitter):
    """The frontier's forward folds' surfaces: the law refitted on the runs up to each compute cutoff,
    in one batch; (N, D) -> loss per cutoff, None where the runs cannot fit it."""

    def folds(cutoffs: list[float]):
        masks = [table.flops <= c * (1.0 + 1e-9) for c in cutoffs]
        usable = [m for m in masks if m.sum() > law.n_params]
        fitted = iter(fitter.fit_all(table, usable))
        out = []
        for m in masks:
            params = next(fitted) if m.sum() > law.n_params else None
            out.append(None if params is None else (lambda n, d, p=params: law.predict(p, params=n, tokens=d)))
        return out

    return folds


def _frontier_and_findings(out: ScalingFit, law: Law, groups: ComputeGroups, fit, warnings: list[str], folds) -> None:
    """The frontier of the runs (when they measure one) and the law's degeneracy findings: each said in
    the warnings, once."""
    t = out.table
    try:
        out.frontier = fit_frontier(
            t.params, t.tokens, t.loss, t.flops, groups, level=out.options.level, surface_folds=folds
        )
        warnings.extend(out.frontier.warnings)
    except UsageError as e:
        warnings.append(f"no frontier fit: {e}")
    out.degeneracy = diagnose(
        law,
        out.params,
        fit.theta,
        loss=t.loss,
        fit_warnings=fit.warnings,
        frontier=out.frontier,
        optimum=optimum_fn(law),
    )


def _delta_intervals(law, data, fit, derived_fns, options: FitOptions, warnings: list[str]):
    """Delta-method intervals, and DELTA_SAMPLES draws from N(theta, Cov) in fit space (a generator
    of their own, seeded with options.seed): symmetric-in-fit-space draws that let a saved fit give
    approximate intervals on predictions and allocations without a bootstrap."""
    try:
        dm = delta_method_intervals(law, data, fit, level=options.level, derived=derived_fns)
    except (UsageError, np.linalg.LinAlgError) as e:
        warnings.append(f"no delta-method intervals: {e}")
        return {}, {}
    intervals = {k: [float(v[0]), float(v[1])] for k, v in dm.intervals.items()}
    cov = np.asarray(dm.cov_fit, dtype=float)
    samples: dict[str, list[float]] = {}
    if np.all(np.isfinite(cov)):
        draws = np.random.default_rng(options.seed).multivariate_normal(
            np.asarray(fit.theta), cov, size=DELTA_SAMPLES, method="eigh"
        )
        nat = law.to_natural_array(draws)
        samples = {n: nat[:, i].tolist() for i, n in enumerate(law.param_names)}
    return intervals, samples


def run_backtests(
    table: RunTable, groups: ComputeGroups, fitter, options: FitOptions, min_train: int, warnings: list[str]
) -> dict:
    """Hold-out-the-largest group (or options.holdout_frac) and, with 3 to MAX_GROUPS groups,
    leave-one-group-out; each fold needs `min_train` runs in 2+ budgets. A protocol that cannot run
    is {"skipped": why}, with a warning."""
    out: dict = {}
    try:
        out["holdout"] = holdout_backtest(
            table, fitter, holdout_frac=options.holdout_frac, min_train=min_train, min_budgets=2, labels=groups.labels
        ).to_dict()
    except UsageError as e:
        out["holdout"] = {"skipped": str(e)}
        warnings.append(f"holdout backtest skipped: {e}")
    if 3 <= groups.num_groups <= MAX_GROUPS:
        try:
            out["leave_one_budget_out"] = leave_one_budget_out(
                table, fitter, min_train=min_train, min_budgets=2, labels=groups.labels
            ).to_dict()
        except UsageError as e:
            warnings.append(f"leave-one-budget-out skipped: {e}")
    elif groups.num_groups > MAX_GROUPS:
        warnings.append(
            f"leave-one-group-out skipped: {groups.num_groups} groups in the group column (> {MAX_GROUPS} refits)"
        )
    return out
