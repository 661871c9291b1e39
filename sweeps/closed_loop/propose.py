"""The closed loop: fit the store, check that the law is identified, then write the next round.

    proposal = propose_round("results/iso", target_flops=1e13)   # a Proposal (scalelab.sweeps.closed_loop.proposal)
    proposal.gates.passed          # may the law be extrapolated?
    proposal.runs                  # the runs of the next round (ProposedRun), each with its prediction
    proposal.sweep                 # those runs as a Sweep, resolved once: launch it into the same sweep
    proposal.spec_path             # <sweep>/rounds/round_K.yaml: the round's spec
    proposal.fit_path              # <sweep>/fits/round_K.json: the fit, gates, backtests, proposals
    propose_next(...)              # the same, as the JSON of fits/round_K.json (`sweep next --json`)

What it does, in order:

1. Score the ledger: proposed runs of earlier rounds that are now done get their measured loss
   beside their prediction (scalelab.store.ledger).
2. Fit the done runs (scalelab.sweeps.closed_loop.store_fit, the one fit entry with the spec's `fit:` options:
   the spec's law, Huber on log loss, bootstrap over runs, hold-out and leave-one-budget-out
   backtests), and check the identification gates
   (scalelab.fitting.entry.gates): minima bracketed, exponents plausible and off their bounds, starts
   agree, Approach 2 and Approach 3 agree.
3a. Gates pass: the compute-optimal run at C_next = min(step x the largest budget, C*) (N* from the
   fit's compute frontier where it measures one, else from the law: scalelab.fitting.allocation.compute_optimal;
   shaped by the shape rule, D = C_next / 6N), plus, within --budget-flops, the runs that most
   narrow the interval of L*(C*) (each candidate scored by refitting the bootstrap replicates with
   it added at its predicted loss times a residual drawn from the fit's own).
   A holdout round (`holdout=Holdout(...)`, `sweep next --holdout 3,10,30`) holds runs at several
   multiples of the largest budget instead, each predicted by this one fit, whatever its gates say:
   what a first round's law is scored on far out.
3b. A gate fails: no compute-optimal run. The round holds the runs that would pass the failed gate:
   sizes beyond the edge of a budget whose best run is its smallest or largest (`bracket`); a new
   IsoFLOP slice at C_next centred on the measured minima's trend when the exponents or the starts
   are not identified (`new_budget`); sizes at Approach 2's and Approach 3's N* where they disagree
   (`densify`).
4. Every proposed run is resolved once, exactly as it will be launched (the spec's recipe applied,
   its run id hashed), and predicted with its interval: a compute-optimal run at the frontier's
   L*(C) times the law's excess at its (N, D), with the frontier's calibrated interval
   (ScalingFit.optimal_run_interval); any other run by the law (bootstrap + run noise + the backtests'
   out-of-sample error at its extrapolation distance, scalelab.fitting.uncertainty.predictive; a degenerate law
   at the frontier's level). A run beyond the fitted budgets of a fit with no calibrated frontier (a
   first round: three budgets leave the frontier nothing to calibrate on) is predicted by the bracket
   instead: the geometric mean of the surface and a power law through the budgets' best losses, with
   the two as its ends (ScalingFit.run_interval, scalelab.fitting.allocation.bracket; adopted by
   docs/first-round.md's step 3b rule, scored by its protocol 2). The fit,
   gates and predictions go to fits/round_K.json and to the ledger, before anything runs; the
   round's spec to rounds/round_K.yaml, which expands to the same runs.
   The round's number K is taken before the fit, and fits/round_K.json is created only if no other
   driver created it meanwhile (`If-None-Match: *` on object storage, a hard link locally): of
   two drivers proposing the same round one writes it, the other stops with one line. On an
   `s3://` sweep the fit reads a local copy of its records (objects.local_view) and the round's
   files are objects.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalelab import store
from scalelab.config_tree import from_dict
from scalelab.errors import ConfigError, UsageError
from scalelab.fitting.entry.fit_options import FitOptions, fit_options
from scalelab.fitting.entry.scaling_fit import ScalingFit, code_version
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.models.accounting import num_params, num_params_nonembedding
from scalelab.models.config import ModelConfig
from scalelab.store import ledger, objects
from scalelab.store.atomic import atomic_write_bytes, replace_if
from scalelab.sweeps.closed_loop.proposal import Proposal, ProposedRun, next_round, round_spec
from scalelab.sweeps.closed_loop.store_fit import MIN_LOOP_RUNS, fit_store, store_fit_spec
from scalelab.sweeps.specs.design_context import DesignContext
from scalelab.sweeps.specs.spec import ExecutionConfig, Sweep, dump_spec, expand_sweep, read_spec

NUM_SIZES = 5  # sizes of a new IsoFLOP slice
SPAN = 3.0  # a new slice spans N*/SPAN .. SPAN N*
BRACKET_FACTOR = 1.7  # a bracketing run steps this far beyond the edge (at least; the slice's own step otherwise)
MAX_NARROWING = 3  # narrowing candidates added at most


@dataclass(kw_only=True, slots=True)
class Candidate:
    """A run the proposer considers, before resolution: a shape by the shape rule and D = C / 6N tokens."""

    kind: str  # compute_optimal | narrow_interval | bracket | new_budget | densify
    budget: float  # the FLOP budget it is designed for
    shape: dict[str, Any]  # model fields (scalelab.sweeps.specs.design_context.DesignContext.shape)
    num_tokens: int
    params: int  # N of the shape (total: its FLOPs are 6 N D)
    params_fit: int  # N in the fit's accounting (total, or without the embedding table)

    @classmethod
    def at(
        cls, ctx: DesignContext, n_target: float, flops: float, kind: str, exclude=frozenset(), count: str = "total"
    ) -> Candidate:
        """The shape for n_target (counted as `count`: the fit's N) and D = C / 6N (total N)."""
        shape = ctx.shape(max(n_target, 1.0), "proposal", exclude=exclude, count=count)
        cfg = ModelConfig(**shape)
        n = num_params(cfg)
        n_fit = n if count == "total" else num_params_nonembedding(cfg)
        tokens = ctx.round_tokens(flops / (6.0 * n))
        return cls(
            kind=kind, budget=float(flops), shape=shape, num_tokens=int(tokens), params=int(n), params_fit=int(n_fit)
        )

    @property
    def layers_width(self) -> tuple[int, int]:
        return self.shape["num_layers"], self.shape["d_model"]

    @property
    def flops(self) -> float:
        return 6.0 * self.params * self.num_tokens

    def overrides(self) -> dict[str, Any]:
        return {**{f"model.{k}": v for k, v in self.shape.items()}, "train.num_tokens": self.num_tokens}


NEXT_FLAGS = {"bootstrap": "--replicates", "target_flops": "--target-flops"}  # `sweep next` spells them so


def loop_options(
    sweep_dir: str | Path,
    *,
    target_flops: float | None = None,
    replicates: int | None = None,
    seed: int = 0,
    fit_starts: int | None = None,
) -> FitOptions:
    """The loop's fit options, built and checked once: the sweep spec's `fit:` section with `sweep
    next`'s arguments over it (None: the spec's), errors spelled as `sweep next`'s flags."""
    return fit_options(
        store_fit_spec(sweep_dir),
        flags=NEXT_FLAGS,
        bootstrap=replicates,
        seed=seed,
        starts=fit_starts,
        target_flops=target_flops or None,
    )


def fit_sweep(sweep_dir: str | Path, options: FitOptions) -> tuple[ScalingFit, dict[str, Any], list[str]]:
    """The loop's fit of a sweep's done runs with `options` (loop_options): (ScalingFit, raw spec,
    warnings)."""
    sweep_dir = readable(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml)")
    raw = read_spec(store.SweepLayout(sweep_dir).spec)
    lf, warnings = fit_store(sweep_dir, options, min_runs=MIN_LOOP_RUNS)
    if lf.selection is not None:
        warnings += [f"law selection: {lf.selection['rule']}"]
    warnings += [f"fit: {w}" for w in lf.fit.warnings]
    warnings += [f"degenerate law: {f.line}" for f in lf.degeneracy if f.name != "starts"]
    if lf.frontier is not None:
        warnings += list(lf.frontier.warnings)
    return lf, raw, warnings


def propose_next(sweep_dir: str | Path, **kwargs: Any) -> dict[str, Any]:
    """propose_round, as the JSON of fits/round_K.json (what `sweep next --json` prints)."""
    return propose_round(sweep_dir, **kwargs).to_dict()


def propose_round(
    sweep_dir: str | Path,
    *,
    target_flops: float | None = None,
    budget_flops: float | None = None,
    step: float = 3.0,
    replicates: int | None = None,
    max_runs: int = 4,
    seeds: int = 1,
    seed: int = 0,
    fit_starts: int | None = None,
    holdout: Holdout | None = None,
    log=print,
) -> Proposal:
    """Fit the sweep's done runs, gate the fit, and write the next round (module docstring); with
    `holdout`, the round is that holdout's runs instead (Holdout), predicted by this fit.

    One piece: the round's steps in order (score the ledger, fit, gate, candidates, narrowing runs,
    resolve, write), each a call; a third of its length is the Proposal's fields."""
    if seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {seeds}")
    if holdout is not None and target_flops is None:
        target_flops = holdout.multiples[-1] * _largest_budget(sweep_dir)
    sweep_dir = sweep_dir if objects.is_url(sweep_dir) else Path(sweep_dir)
    if objects.is_url(sweep_dir):
        objects.check(sweep_dir, "sweep_dir")
    # built and checked before anything is written
    options = loop_options(
        sweep_dir, target_flops=target_flops, replicates=replicates, seed=seed, fit_starts=fit_starts
    )
    target = options.target_flops
    if not target:
        raise UsageError("sweep next needs --target-flops C* (or fit.target_flops in the spec)")
    ledger.score(sweep_dir)
    # Round k is taken before the fit (the store's rounds as they are now); its fit file is then
    # created only if no other driver created it meanwhile (_write_round).
    k = next_round(sweep_dir)
    lf, raw, warnings = fit_sweep(sweep_dir, options)
    log(f"fitted {lf.law} to {lf.loss.size} runs ({len(lf.draws)} bootstrap replicates)")
    largest = float(lf.budgets.max())
    c_next = min(step * largest, target)
    budget = budget_flops or 2 * c_next
    execution = from_dict(ExecutionConfig, raw.get("execution") or {})
    ctx = DesignContext.from_base(raw.get("base") or {}, cpus_per_run=execution.cpus_per_run, recipe=raw.get("recipe"))
    if holdout is not None:
        cands = holdout.candidates(lf, ctx, largest, count=_count(lf))
        c_next = max(c.budget for c in cands)
    elif lf.gates.passed:
        cands = [Candidate.at(ctx, lf.compute_optimal(c_next).n_opt, c_next, "compute_optimal", count=_count(lf))]
    else:
        log(f"gates failed: {', '.join(lf.gates.failed)}; proposing the runs that would pass them")
        cands = remedies(lf, ctx, c_next)
    gains: dict[int, float] = {}
    candidates_scored = 0
    if holdout is None and lf.gates.passed and max_runs > seeds and budget > seeds * cands[0].flops:
        extra, gains, candidates_scored = _narrowing(lf, ctx, cands[0], target, budget, max_runs, log, seeds=seeds)
        cands += extra
    sweep = _resolve(raw, cands, k, seeds=seeds)
    runs = [_predicted(lf, r, options) for r in sweep.runs]
    firsts = [r for r in runs if "seed_replicate" not in r.run.labels]  # one per candidate, in order
    for i, gain in gains.items():
        firsts[i].width_reduction = gain
    at_target = lf.compute_optimal(target)
    loss_at_target, n_t, d_t = at_target.loss, at_target.n_opt, at_target.d_opt
    log(f"compute-optimal at C*={target:.3g}: {at_target.line()}")
    proposal = Proposal(
        round=k,
        fit=dict(
            lf.to_record(),
            round=k,
            code_version=code_version(),
            options={"law": options.law, "loss": options.loss, "flops": options.flops, "replicates": len(lf.draws)},
            law=lf.law,
            selection=lf.selection,
        ),
        gates=lf.gates,
        runs=runs,
        target_flops=target,
        budget_flops=budget,
        next_budget=c_next,
        largest_done_budget=largest,
        loss_at_target=loss_at_target,
        n_opt_at_target=n_t,
        d_opt_at_target=d_t,
        loss_column=options.loss,
        flops_convention=options.flops,
        spec_path=store.SweepLayout(sweep_dir).round_spec(k),
        fit_path=store.SweepLayout(sweep_dir).round_fit(k),
        warnings=warnings,
        candidates_scored=candidates_scored,
    )
    _write_round(sweep_dir, raw, proposal, sweep)
    return proposal


@dataclass(frozen=True, kw_only=True, slots=True)
class Holdout:
    """A holdout round: runs far past the fitted budgets, every one predicted by the one fit before any
    trains, to score how far that fit extrapolates (what a first round's law is worth at 3x, 10x
    and 30x). At each multiple m of the largest done budget: `sizes` runs spread around the fit's
    N*(m C) by `spread` (N* spread^o, o evenly in [-1/2, 1/2]: N* itself for one size), D = C / 6N.
    Proposed whatever the gates say (the fit as it stands is what is scored; its gates are in
    fits/round_K.json); the loop's other rounds are not affected."""

    multiples: tuple[float, ...] = (3.0, 10.0, 30.0)
    sizes: int = 1
    spread: float = 1.5

    def __post_init__(self) -> None:
        if not self.multiples or any(m <= 1 for m in self.multiples) or list(self.multiples) != sorted(self.multiples):
            raise UsageError(f"holdout multiples {self.multiples}: ascending, each > 1 (of the largest budget)")
        if self.sizes < 1 or not self.spread > 1:
            raise UsageError(f"holdout: sizes {self.sizes} must be >= 1 and spread {self.spread} > 1")

    def candidates(self, lf: ScalingFit, ctx: DesignContext, largest: float, count: str) -> list[Candidate]:
        out: list[Candidate] = []
        offsets = np.linspace(-0.5, 0.5, self.sizes) if self.sizes > 1 else np.zeros(1)
        for m in self.multiples:
            c = m * largest
            n_opt = lf.optimum(c)[0]
            used: set[tuple[int, int]] = set()
            for o in offsets:
                cand = Candidate.at(ctx, n_opt * self.spread**o, c, "holdout", exclude=frozenset(used), count=count)
                used.add(cand.layers_width)
                out.append(cand)
        return out


def _largest_budget(sweep_dir: str | Path) -> float:
    runs = store.load_runs(readable(sweep_dir))
    done = runs.filter(runs["status"] == "done") if runs.height else runs
    if not done.height:
        raise UsageError(f"{sweep_dir}: no finished run to fit")
    col = "flops_budget" if "flops_budget" in done.columns and done["flops_budget"].drop_nulls().len() else "flops"
    return float(done[col].max())


def remedies(lf: ScalingFit, ctx: DesignContext, c_next: float) -> list[Candidate]:
    """Runs that would pass the failed gates (module docstring, 3b)."""
    cands: list[Candidate] = []
    failed = set(lf.gates.failed)
    brackets = lf.gates.brackets
    for b in brackets:
        if b.bracketed:
            continue
        sizes = np.array(b.sizes)
        f = max(BRACKET_FACTOR, float(np.exp(np.median(np.diff(np.log(sizes))))))
        if b.edge == "low":
            targets = [sizes[0] / f, sizes[0] / f**2]
        elif b.edge == "high":
            targets = [sizes[-1] * f, sizes[-1] * f**2]
        else:  # flat, or the vertex outside the sizes although the best run is interior
            targets = [sizes[0] / f, sizes[-1] * f]
        cands += _at_budget(ctx, lf, b.flops, targets, "bracket")
    all_bracketed = all(b.bracketed for b in brackets)
    if all_bracketed and failed & {"exponents", "starts_agree"}:
        center = _trend_size(brackets, c_next)
        targets = [center * SPAN**o for o in np.linspace(-1, 1, NUM_SIZES)]
        cands += _at_budget(ctx, lf, c_next, targets, "new_budget")
    if all_bracketed and "approaches_agree" in failed:
        disagree = set(next(g for g in lf.gates.gates if g.name == "approaches_agree").detail.get("disagree", []))
        for b in brackets:
            if b.flops in disagree:
                targets = [b.vertex, lf.optimum(b.flops)[0]]
                cands += _at_budget(ctx, lf, b.flops, targets, "densify")
    if not cands:  # every gate that failed is one no run of this kind fixes: widen the design
        center = _trend_size(brackets, c_next)
        cands += _at_budget(ctx, lf, c_next, [center * SPAN**o for o in np.linspace(-1, 1, NUM_SIZES)], "new_budget")
    return cands


def _trend_size(brackets, flops: float) -> float:
    """N at `flops` on the line through the budgets' measured minima (log-log), or the nearest one's."""
    pts = [(b.flops, b.vertex if b.bracketed and b.vertex else b.best_size) for b in brackets]
    c = np.log([p[0] for p in pts])
    n = np.log([p[1] for p in pts])
    if len(pts) >= 2 and np.ptp(c) > 0:
        slope, icpt = np.polyfit(c, n, 1)
        slope = min(max(slope, 0.3), 0.7)  # a sane allocation exponent while the fit is unidentified
        return float(np.exp(n.mean() + slope * (math.log(flops) - c.mean())))
    return float(np.exp(n[-1]) * (flops / pts[-1][0]) ** 0.5)


def _at_budget(ctx: DesignContext, lf: ScalingFit, flops: float, targets, kind: str) -> list[Candidate]:
    """Candidates at one budget for target sizes, skipping shapes the store already ran at that budget."""
    at_budget = np.isclose(lf.budgets, flops, rtol=0.05)
    have = set(np.round(lf.n[at_budget]).astype(int).tolist())
    out, used = [], set()
    for t in sorted(t for t in targets if t and t > 0):
        try:
            c = Candidate.at(ctx, t, flops, kind, exclude=frozenset(used), count=_count(lf))
        except ConfigError:
            continue  # below the smallest shape the rule can build
        if c.params_fit in have or c.layers_width in used:
            continue
        used.add(c.layers_width)
        out.append(c)
    return out


def _narrowing(
    lf: ScalingFit, ctx: DesignContext, first: Candidate, target: float, budget: float, max_runs: int, log, seeds=1
):
    """Runs within the budget that most narrow the interval of L*(target) (module docstring, 3a); the
    compute-optimal run's `seeds` copies are spent first.

    Returns (candidates, {index in the round: width reduction}, candidates scored)."""
    first_nd = (first.params_fit, first.num_tokens)
    spent = seeds * first.flops
    cands: list[Candidate] = []
    for c in np.geomspace(lf.budgets.max(), first.budget, 3):
        n_opt = lf.optimum(c)[0]
        for mult in (0.4, 1.0, 2.5):
            try:
                p = Candidate.at(ctx, n_opt * mult, c, "narrow_interval", count=_count(lf))
            except ConfigError:
                continue
            if p.flops <= budget - spent and all(q.overrides() != p.overrides() for q in [first, *cands]):
                cands.append(p)
    if not cands:
        return [], {}, 0
    log(f"scoring {len(cands)} candidate run(s) by how much they narrow the interval at C*={target:.3g}")
    base_width = _width(lf, lf.replicates_with([first_nd]), target)
    scored = []
    for p in cands:
        scored.append(
            (base_width - _width(lf, lf.replicates_with([first_nd, (p.params_fit, p.num_tokens)]), target), p)
        )
    picked, gains = [], {}
    for gain, p in sorted(scored, key=lambda t: -t[0] / t[1].flops):
        if seeds + len(picked) >= max_runs or len(picked) >= MAX_NARROWING or not gain > 0:
            continue
        if spent + p.flops > budget:
            continue
        gains[1 + len(picked)] = float(gain)
        picked.append(p)
        spent += p.flops
    return picked, gains, len(cands)


def _width(lf: ScalingFit, draws: list[dict[str, float]], target: float) -> float:
    vals = []
    for p in draws:
        try:
            vals.append(lf.optimum(target, p)[2])
        except UsageError:
            continue
    lo, hi = percentile_interval(vals, lf.level)
    return hi - lo


def _resolve(raw: dict[str, Any], cands: list[Candidate], k: int, seeds: int = 1) -> Sweep:
    """The round's runs, resolved once (recipe applied, ids hashed; a duplicate kept once). The
    compute-optimal run is repeated with `seeds` - 1 further training seeds (base seed + j): a
    prediction scored on one run is scored on that run's noise."""
    spec = round_spec(raw, [], k, [])
    if not cands:  # no buildable run: an empty round
        execution = from_dict(ExecutionConfig, raw.get("execution") or {})
        fit = fit_options(raw.get("fit") or {})
        return Sweep(name=spec["name"], raw=spec, generator="points", runs=[], execution=execution, fit=fit)
    base_seed = int(((raw.get("base") or {}).get("train") or {}).get("seed", 0))
    points = []
    for c in cands:
        labels = {"proposal": c.kind, "flops_budget": c.budget, "round": k}
        points.append({**c.overrides(), "labels": labels})
        for j in range(1, seeds if c.kind in ("compute_optimal", "holdout") else 1):
            points.append({**c.overrides(), "train.seed": base_seed + j, "labels": {**labels, "seed_replicate": j}})
    spec["points"] = points
    return expand_sweep(spec, default_name=f"round_{k}")


def _count(lf: ScalingFit) -> str:
    """The shape rule's count for the fit's N (fit.params: total | nonembed)."""
    return "nonembedding" if lf.options.params == "nonembed" else "total"


def _predicted(lf: ScalingFit, run, options: FitOptions) -> ProposedRun:
    flops = run.flops_6n if options.flops == "6n" else run.flops_exact
    budget = float(run.labels.get("flops_budget", flops))
    n_fit = run.params if options.params == "total" else run.params_nonembed
    kind = run.labels["proposal"]
    prediction = lf.run_interval(n_fit, run.num_tokens, budget, optimal=kind == "compute_optimal")
    return ProposedRun(kind=kind, run=run, budget=budget, flops=float(flops), prediction=prediction)


def readable(sweep_dir: str | Path) -> Path:
    """A sweep to read from: the directory itself, or a local copy of an s3:// sweep's records."""
    return objects.local_view(sweep_dir, "sweep_dir") if objects.is_url(sweep_dir) else Path(sweep_dir)


def _write_round(sweep_dir: str | Path, raw: dict[str, Any], proposal: Proposal, sweep: Sweep) -> None:
    """rounds/round_K.yaml, fits/round_K.json and the ledger's predictions; `proposal.sweep` becomes
    the round's runs with the labels its spec gives them (proposal, budget, round, prediction), so
    launching it is launching the spec, without resolving the runs again."""
    k = proposal.round
    labels = [
        {
            **{key: v for key, v in r.run.labels.items() if key in ("proposal", "flops_budget", "seed_replicate")},
            "round": k,
            "predicted_loss": r.prediction.point,
            "predicted_interval": [r.prediction.lo, r.prediction.hi],
        }
        for r in proposal.runs
    ]
    spec = round_spec(raw, [r.run for r in proposal.runs], k, labels)
    for r, lab in zip(proposal.runs, labels):
        r.run = dataclasses.replace(r.run, labels=dict(lab, generator="points"))
    proposal.sweep = dataclasses.replace(sweep, raw=spec, runs=[r.run for r in proposal.runs])
    body = (json.dumps(proposal.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    if not replace_if(proposal.fit_path, body, None):  # If-None-Match: * on object storage
        raise UsageError(
            f"{proposal.fit_path}: round {k} was proposed meanwhile by another driver of this sweep; "
            "`scalelab sweep ledger` shows it (run `sweep next` again for the round after it)"
        )
    ledger.record_round(sweep_dir, proposal.fit, proposal.ledger_entries())
    # the spec last: a round is launchable only once its predictions are in the ledger
    atomic_write_bytes(proposal.spec_path, dump_spec(spec).encode())
