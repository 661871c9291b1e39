"""Law selection by backtest: fit every candidate form, score each on the held-out largest runs, pick one.

    sel = select_law(table, curves=curves)      # table: RunTable of final losses; curves: RunCurve per run
    sel.chosen                                  # e.g. "lr_annealing"
    sel.candidates["kaplan"].backtest.mare      # every candidate's held-out score (or why it was skipped)
    sel.predict(table, curves)                  # final losses from the chosen law refitted on all runs
    sel.to_dict()                               # what `scalelab fit --law auto` prints and a ledger keeps

Candidates (`CANDIDATES`, those that apply):
  chinchilla, kaplan       Approach 3 on the runs' final losses;
  data_constrained         when the table has unique_tokens (runs that repeat data);
  lr_annealing, lr_area    the loss-curve laws (fitting/loss_curves/curves.py), when every run has a curve;
  average                  the geometric mean of the other candidates' predictions, equal weights:
                           nothing in it is fitted on the held-out runs, so its backtest is honest.

Protocol ("held-out largest", the same split for every candidate):
  score="final"  hold out the largest FLOP budget (fitting/backtest.holdout_mask); each candidate is
                 fitted on the other runs only and predicts the held-out runs' final losses. A curve
                 law fits the other runs' curves and predicts a held-out run at its last step, times
                 a calibration factor estimated on the training runs alone (the curve may be the
                 training loss while the table holds the final validation loss).
  score="tail"   checkpoint data (the public families): hold out the largest model size; each
                 candidate is fitted on the other runs' curves (the (N, D) laws on every checkpoint)
                 and scored on the last `tail` of the held-out run's curve (Choshen et al. 2025).
The choice is conservative: the incumbent (Chinchilla, Approach 3) is kept unless another candidate
lowers the held-out MARE by at least `margin` (10% of the incumbent's MARE by default), because one
held-out budget or model is a noisy judge (on OPT, Kaplan beat Chinchilla on the held-out 30B model
by 0.003 points and then extrapolated to 175B at 2.8% against Chinchilla's 1.6%). Without a scored
incumbent the lowest MARE wins (ties within 1e-6: fewer parameters). The chosen law is then refitted
on every run. When the chosen law is a curve fit, `sel.departures` lists the checkpoints where a
held-out run's residual shifts level (fitting/loss_curves/curve_departures.py): such a run changed mid-way in a
way its schedule does not show (OPT-175B's LR was lowered by hand at 81B tokens), and no candidate's
backtest on it measures the law alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.estimate.io import RunTable
from scalelab.fitting.forms.laws import CURVE_LAWS, get_law
from scalelab.fitting.loss_curves.curve_departures import Departure, departures
from scalelab.fitting.loss_curves.curves import CurveFit, RunCurve, fit_curves
from scalelab.fitting.uncertainty.backtest import BacktestResult, holdout_mask, relative_errors

TABLE_LAWS = ("chinchilla", "kaplan", "data_constrained")
# lr_annealing_sized is fitted on request (candidates=...), not by default: on the public families
# (experiments/fit_public.py) it extrapolates worse than lr_annealing (OPT 3.45% vs 1.61%, GPT-3 0.50% vs
# 0.30%), the nested backtest would not pick it, and its start grid is 11 times larger
CANDIDATES = (*TABLE_LAWS, "lr_annealing", "lr_area", "average")
TIE_MARE = 1e-6
INCUMBENT = "chinchilla"
MARGIN = 0.1  # a challenger must lower the incumbent's held-out MARE by this fraction


@dataclass(kw_only=True)
class Candidate:
    """One candidate's held-out backtest, or why it was not scored."""

    name: str
    n_params: int
    backtest: BacktestResult | None = None
    skipped: str | None = None
    calibration: float | None = None  # curve laws under score="final": curve -> table loss factor
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "n_params": self.n_params}
        if self.skipped:
            out["skipped"] = self.skipped
        if self.backtest is not None:
            bt = self.backtest
            out.update(mare=bt.mare, bias=bt.bias, n_train=bt.n_train, n_test=bt.n_test)
        if self.calibration is not None:
            out["calibration"] = self.calibration
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


@dataclass(kw_only=True)
class Selection:
    """The outcome of select_law: every candidate's backtest, the choice, and its full-data fit."""

    chosen: str
    score: str  # "final" or "tail"
    candidates: dict[str, Candidate]
    fits: dict[str, Any]  # full-data fits of the chosen law (all members when "average")
    calibration: dict[str, float] = field(default_factory=dict)  # curve laws: factor on all runs
    holdout: list[str] = field(default_factory=list)  # the held-out run ids
    rule: str = ""  # how the choice was made
    # level shifts of held-out runs against the chosen curve fit (fitting/loss_curves/curve_departures.py): a
    # held-out run that changed mid-way (an LR cut its schedule does not show) judges every law unfairly
    departures: list[Departure] = field(default_factory=list)

    def ranking(self) -> list[Candidate]:
        """Scored candidates, best first."""
        scored = [c for c in self.candidates.values() if c.backtest is not None]
        return sorted(scored, key=lambda c: (round(c.backtest.mare / TIE_MARE), c.n_params))

    def predict(self, table: RunTable | None = None, curves: Sequence[RunCurve] | None = None) -> np.ndarray:
        """The chosen law's final-loss predictions for runs (a table of N, D; curves for curve laws)."""
        members = [n for n in self.fits] if self.chosen == "average" else [self.chosen]
        preds = [_predict_final(n, self.fits[n], table, curves, self.calibration.get(n, 1.0)) for n in members]
        return np.exp(np.mean(np.log(np.stack(preds)), axis=0))

    def predict_steps(self, curve: RunCurve, steps: np.ndarray) -> np.ndarray:
        """The chosen law's loss of `curve` at `steps` (curve fits; score="tail" selections)."""
        members = [n for n in self.fits] if self.chosen == "average" else [self.chosen]
        preds = [self.fits[n].predict(curve, steps) * self.calibration.get(n, 1.0) for n in members]
        return np.exp(np.mean(np.log(np.stack(preds)), axis=0))

    def to_dict(self) -> dict[str, Any]:
        fits = {}
        for name, f in self.fits.items():
            fits[name] = (
                f.to_dict()
                if isinstance(f, CurveFit)
                else {"law": f.law, "params": dict(f.params), "law_config": f.law_config}
            )
        return {
            "chosen": self.chosen,
            "protocol": "held-out largest "
            + ("FLOP budget, final losses" if self.score == "final" else "model, last part of its curve"),
            "rule": self.rule,
            "holdout": list(self.holdout),
            "candidates": [c.to_dict() for c in self.candidates.values()],
            "fits": fits,
            "calibration": dict(self.calibration),
            "departures": [d.to_dict() for d in self.departures],
        }


# ---------------------------------------------------------------------------------------------
# Fitting one candidate and predicting with it
# ---------------------------------------------------------------------------------------------


def _table_data(law, table: RunTable) -> dict[str, np.ndarray]:
    x = table.law_inputs()
    return {**{k: x[k] for k in law.inputs}, "loss": table.loss}


def _fit_table_law(name: str, table: RunTable):
    law = get_law(name)
    if len(table) <= law.n_params:
        raise UsageError(f"{len(table)} runs for {law.n_params} parameters")
    # the law's whole init grid (Chinchilla: 4500 starts): a thinned grid can miss the optimum of a
    # training subset and make a candidate's backtest look worse than the law is
    return fit_law(law, _table_data(law, table), weights=table.weight)


def _by_id(curves: Sequence[RunCurve]) -> dict[str, RunCurve]:
    return {c.run_id: c for c in curves}


def _predict_final(name, fit, table, curves, factor: float) -> np.ndarray:
    if name in CURVE_LAWS:
        if curves is None or table is None:
            raise UsageError(f"{name} predicts runs from their curves (their LR schedules)")
        lookup = _by_id(curves)
        return np.array([factor * fit.predict_final(lookup[str(r)]) for r in table.run_id])
    law = fit.law_object()
    x = table.law_inputs()
    return np.asarray(fit.predict(**{k: x[k] for k in law.inputs}), dtype=float)


def calibration_factor(cf: CurveFit, table: RunTable, curves: Sequence[RunCurve]) -> float:
    """exp(mean log(table loss / curve law's final prediction)) over the runs of `table`."""
    lookup = _by_id(curves)
    pred = np.array([cf.predict_final(lookup[str(r)]) for r in table.run_id])
    return float(np.exp(np.mean(np.log(table.loss / pred))))


def _applicable(names, table: RunTable | None, curves, score: str) -> dict[str, str | None]:
    """name -> None if the candidate applies, else the reason it does not."""
    out: dict[str, str | None] = {}
    have_curves = curves is not None and len(curves) > 0
    if have_curves and table is not None:
        ids = set(_by_id(curves))
        missing = [str(r) for r in table.run_id if str(r) not in ids]
        have_curves = not missing
    for n in names:
        if n == "data_constrained":
            ok = score == "final" and table is not None and table.unique_tokens is not None
            out[n] = None if ok else "no unique_tokens column (no run repeats data)"
        elif n in CURVE_LAWS:
            out[n] = None if have_curves else "no loss curves with LR schedules for every run"
        elif n in TABLE_LAWS:
            out[n] = None if (table is not None or score == "tail") else "no run table"
        elif n != "average":
            raise UsageError(f"unknown candidate {n!r}; choose from {list(CANDIDATES)}")
    return out


# ---------------------------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class _Split:
    """The held-out-largest split shared by every candidate: training runs, held-out points."""

    train_t: RunTable | None = None  # score="final": the runs below the held-out budget ...
    test_t: RunTable | None = None  # ... and the held-out runs
    train_c: list[RunCurve]  # the training runs' curves
    test_c: list[RunCurve] = field(default_factory=list)  # score="tail": the largest model's curves ...
    tail_steps: list[np.ndarray] = field(default_factory=list)  # ... and the steps of their tails
    holdout: list[str]  # the held-out run ids
    observed: np.ndarray  # the held-out points' losses, their ids and FLOPs
    point_ids: list[str]
    point_flops: np.ndarray


def _check_inputs(table: RunTable | None, curves, score: str) -> None:
    if score not in ("final", "tail"):
        raise UsageError(f"score={score!r} unknown; use 'final' or 'tail'")
    if score == "final" and table is None:
        raise UsageError("score='final' needs a run table of final losses")
    if score == "tail" and not curves:
        raise UsageError("score='tail' needs loss curves")


def _split_final(table: RunTable, curves, holdout_frac: float | None) -> _Split:
    """Hold out the largest FLOP budget (or `holdout_frac` of the runs by FLOPs): final losses."""
    mask = holdout_mask(table.flops, holdout_frac)
    if int((~mask).sum()) < 3:
        raise UsageError(f"law selection: only {int((~mask).sum())} runs below the held-out budget (need 3)")
    train_t, test_t = table.subset(~mask), table.subset(mask)
    ids = set(str(r) for r in train_t.run_id)
    holdout = [str(r) for r in test_t.run_id]
    return _Split(
        train_t=train_t,
        test_t=test_t,
        train_c=[c for c in curves or [] if c.run_id in ids],
        holdout=holdout,
        observed=test_t.loss,
        point_ids=holdout,
        point_flops=test_t.flops.copy(),
    )


def _split_tail(curves, tail: float) -> _Split:
    """Hold out the largest model size: the last `tail` of its curves."""
    sizes = np.array([c.params for c in curves])
    big = sizes.max()
    train_c = [c for c in curves if c.params < big]
    test_c = [c for c in curves if c.params == big]
    if np.unique([c.params for c in train_c]).size < 2:
        raise UsageError("law selection: fewer than 2 model sizes below the held-out largest")
    tail_steps = [c.tail_steps(tail) for c in test_c]
    return _Split(
        train_c=train_c,
        test_c=test_c,
        tail_steps=tail_steps,
        holdout=[c.run_id for c in test_c],
        observed=np.concatenate([c.loss[np.isin(c.steps, s)] for c, s in zip(test_c, tail_steps)]),
        point_ids=[f"{c.run_id}@{st}" for c, s in zip(test_c, tail_steps) for st in s],
        point_flops=np.concatenate([c.inputs(s, 0.999)["flops"] for c, s in zip(test_c, tail_steps)]),
    )


def _fit_and_predict(name: str, cand: Candidate, split: _Split, score: str, curves, ckw: dict):
    """The candidate fitted on the training runs and its predictions of the held-out points."""
    if score == "final" and name in TABLE_LAWS:
        fit = _fit_table_law(name, split.train_t)
        return fit, _predict_final(name, fit, split.test_t, None, 1.0)
    if score == "final":
        cf = fit_curves(split.train_c, name, **ckw)
        cand.calibration = calibration_factor(cf, split.train_t, split.train_c)
        return cf, _predict_final(name, cf, split.test_t, curves, cand.calibration)
    fit = fit_curves(split.train_c, name, **ckw)
    return fit, np.concatenate([fit.predict(c, s) for c, s in zip(split.test_c, split.tail_steps)])


def _score_candidates(names, reasons, split: _Split, score: str, curves, ckw: dict):
    """Every candidate (skipped ones with their reason), and the held-out predictions and training
    fits of those that could be fitted, "average" last (the geometric mean of the others)."""
    preds: dict[str, np.ndarray] = {}
    trained: dict[str, Any] = {}  # each candidate's fit on the training runs
    results: dict[str, Candidate] = {}
    for name in names:
        n_params = get_law(name).n_params if name != "average" else 0
        cand = Candidate(name=name, n_params=n_params, skipped=reasons.get(name))
        results[name] = cand
        if name == "average" or cand.skipped:
            continue
        try:
            fit, p = _fit_and_predict(name, cand, split, score, curves, ckw)
        except UsageError as e:
            cand.skipped = f"fit failed: {e}"
            continue
        cand.warnings = list(fit.warnings)
        preds[name] = p
        trained[name] = fit
    if "average" in names:
        if len(preds) >= 2:
            preds["average"] = np.exp(np.mean(np.log(np.stack(list(preds.values()))), axis=0))
        else:
            results["average"].skipped = "fewer than 2 candidates scored"
    if not preds:
        why = "; ".join(f"{c.name}: {c.skipped}" for c in results.values())
        raise UsageError(f"law selection: no candidate could be scored ({why})")
    return results, preds, trained


def _attach_backtests(results: dict[str, Candidate], preds: dict[str, np.ndarray], split: _Split, score: str) -> None:
    n_train = len(split.train_t) if score == "final" else len(split.train_c)
    for name, p in preds.items():
        rel, mare, bias = relative_errors(p, split.observed)
        results[name].backtest = BacktestResult(
            protocol="holdout" if score == "final" else "holdout_tail",
            run_id=split.point_ids,
            flops=split.point_flops,
            observed=np.asarray(split.observed, dtype=float),
            predicted=np.asarray(p, dtype=float),
            rel_error=rel,
            mare=mare,
            bias=bias,
            n_train=n_train,
            n_test=len(split.observed),
        )


def _choose(sel: Selection, incumbent: str | None, margin: float) -> None:
    """The lowest held-out MARE, unless it does not beat a scored incumbent by `margin`."""
    results = sel.candidates
    best = sel.ranking()[0]
    inc = results.get(incumbent) if incumbent else None
    if inc is not None and inc.backtest is not None and best.backtest.mare > (1.0 - margin) * inc.backtest.mare:
        best = inc
    sel.chosen = best.name
    sel.rule = (
        f"lowest held-out MARE; {incumbent} kept unless beaten by {margin:.0%}"
        if inc is not None and inc.backtest is not None
        else "lowest held-out MARE"
    )


def select_law(
    table: RunTable | None = None,
    curves: Sequence[RunCurve] | None = None,
    *,
    candidates: Sequence[str] | None = None,
    score: str = "final",
    tail: float = 0.3,
    holdout_frac: float | None = None,
    curve_kwargs: dict[str, Any] | None = None,
    refit: bool = True,
    incumbent: str | None = INCUMBENT,
    margin: float = MARGIN,
) -> Selection:
    """Fit every applicable candidate on the smaller runs, score it on the held-out largest, pick one.

    Args:
        table: one row per run with its final loss (score="final"); optional for score="tail".
        curves: RunCurve per run (matched to table rows by run_id); enables the curve laws.
        candidates: names to consider (default CANDIDATES; the inapplicable ones are reported as
            skipped with the reason).
        score: "final" (held-out FLOP budget, final losses) or "tail" (held-out largest model,
            the last `tail` of its curve).
        holdout_frac: score="final": hold out this fraction of runs by FLOPs instead of the
            largest budget.
        curve_kwargs: extra keyword arguments of fit_curves (decays, drop_first, sigma_run, ...).
        refit: fit the chosen law (every member when "average") on all runs.
        incumbent, margin: keep `incumbent` unless a candidate's MARE is below (1 - margin) times
            its MARE (None or margin 0: plain lowest MARE).
    Returns:
        Selection.
    Raises:
        UsageError: nothing to select from, an unknown candidate, or no candidate could be scored.
    """
    _check_inputs(table, curves, score)
    names = list(CANDIDATES if candidates is None else candidates)
    reasons = _applicable(names, table, curves, score)
    ckw = dict(curve_kwargs or {})
    split = _split_final(table, curves, holdout_frac) if score == "final" else _split_tail(curves, tail)
    results, preds, trained = _score_candidates(names, reasons, split, score, curves, ckw)
    _attach_backtests(results, preds, split, score)
    sel = Selection(chosen="", score=score, candidates=results, fits={}, holdout=split.holdout)
    _choose(sel, incumbent, margin)
    if isinstance(trained.get(sel.chosen), CurveFit):
        held = [c for c in curves or [] if c.run_id in set(split.holdout)]
        sel.departures = [d for c in held for d in departures(trained[sel.chosen], c)]
    if refit:
        _refit(sel, table, curves, ckw, list(preds))
    return sel


def _refit(sel: Selection, table, curves, ckw, scored: list[str]) -> None:
    members = [n for n in scored if n != "average"] if sel.chosen == "average" else [sel.chosen]
    for name in members:
        if sel.score == "final" and name in TABLE_LAWS:
            sel.fits[name] = _fit_table_law(name, table)
        else:
            cf = fit_curves(curves, name, **ckw)
            sel.fits[name] = cf
            if sel.score == "final" and name in CURVE_LAWS:
                sel.calibration[name] = calibration_factor(cf, table, curves)


def format_selection(sel: Selection) -> str:
    """A small table: every candidate's held-out MARE and bias, the chosen one marked."""
    lines = [
        f"law selection ({sel.to_dict()['protocol']}; held out: {len(sel.holdout)} run(s))",
        f"  {'candidate':<18}{'MARE':>9}{'bias':>9}  note",
    ]
    for c in sel.candidates.values():
        mark = "  <- chosen" if c.name == sel.chosen else ""
        if c.backtest is None:
            lines.append(f"  {c.name:<18}{'-':>9}{'-':>9}  {c.skipped}")
        else:
            lines.append(f"  {c.name:<18}{100 * c.backtest.mare:>8.2f}%{100 * c.backtest.bias:>+8.2f}%{mark}")
    lines += [departure_line(d.to_dict()) for d in sel.departures]
    return "\n".join(lines)


def departure_line(d: dict) -> str:
    """One held-out departure (Departure.to_dict, as a selection's dict keeps it) as a line of text."""
    return (
        f"  held-out run {d['run_id']} leaves the chosen law between steps {d['step_before']} and "
        f"{d['step_after']}: {100 * d['jump']:+.2f}% ({d['z']:+.1f} robust sd); its backtest judges a run "
        "that changed mid-way"
    )
