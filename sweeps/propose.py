"""The closed loop: fit the store, check that the law is identified, then write the next round.

    proposal = propose_next("results/iso", target_flops=1e13)
    proposal["gates"]["passed"]    # may the law be extrapolated?
    proposal["proposals"]          # the runs of the next round, each with its prediction
    proposal["spec_path"]          # <sweep>/rounds/round_K.yaml: launch it into the same sweep
    proposal["fit_path"]           # <sweep>/fits/round_K.json: the fit, gates, backtests, proposals

What it does, in order:

1. Score the ledger: proposed runs of earlier rounds that are now done get their measured loss
   beside their prediction (scalelab.store.ledger).
2. Fit the done runs (scalelab.fitting.loopfit: the spec's law, Huber on log loss, bootstrap over
   runs, hold-out and leave-one-budget-out backtests), and check the identification gates
   (scalelab.fitting.gates): minima bracketed, exponents plausible and off their bounds, starts
   agree, Approach 2 and Approach 3 agree.
3a. Gates pass: the compute-optimal run at C_next = min(step x the largest budget, C*) (N* from the
   fit, shaped by the shape rule, D = C_next / 6N), plus, within --budget-flops, the runs that most
   narrow the interval of L*(C*) (each candidate scored by refitting the bootstrap replicates with
   it added at its predicted loss times a residual drawn from the fit's own).
3b. A gate fails: no compute-optimal run. The round holds the runs that would pass the failed gate:
   sizes beyond the edge of a budget whose best run is its smallest or largest (`bracket`); a new
   IsoFLOP slice at C_next centred on the measured minima's trend when the exponents or the starts
   are not identified (`new_budget`); sizes at Approach 2's and Approach 3's N* where they disagree
   (`densify`).
4. Every proposed run is resolved exactly as it will be launched (the spec's recipe applied, its
   run id hashed) and predicted with its interval (bootstrap + run noise + the backtests'
   out-of-sample error at its extrapolation distance, scalelab.fitting.predictive). The fit,
   gates and predictions go to fits/round_K.json and to the ledger, before anything runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab import store
from scalelab.config_tree import from_dict
from scalelab.errors import ConfigError, UsageError
from scalelab.fitting.io import read_runs
from scalelab.fitting.loopfit import FIT_STARTS, LoopFit, fit_for_loop
from scalelab.fitting.select import select_law
from scalelab.store import ledger
from scalelab.sweeps.spec import (
    LOOP_LAWS,
    ExecutionConfig,
    FitSpec,
    _Context,
    dump_spec,
    expand_sweep,
    read_spec,
)

NUM_SIZES = 5  # sizes of a new IsoFLOP slice
SPAN = 3.0  # a new slice spans N*/SPAN .. SPAN N*
BRACKET_FACTOR = 1.7  # a bracketing run steps this far beyond the edge (at least; the slice's own step otherwise)
MAX_NARROWING = 3  # narrowing candidates added at most


def _completeness(df: pl.DataFrame) -> list[str]:
    warnings = []
    not_done = df.filter(pl.col("status") != "done")
    if not_done.height:
        warnings.append(
            f"partial grid: the fit uses {df.height - not_done.height} of {df.height} planned runs "
            f"({not_done.height} not done: {', '.join(sorted(set(not_done['status'].to_list())))})"
        )
        if "flops_budget" in df.columns:
            for budget in sorted({b for b in not_done["flops_budget"].to_list() if b is not None}):
                sub = df.filter(pl.col("flops_budget") == budget)
                ok = sub.filter(pl.col("status") == "done").height
                warnings.append(f"budget {budget:.3g}: {ok} of {sub.height} runs done")
    return warnings


def _budgets(done: pl.DataFrame, flops_col: str) -> np.ndarray:
    """Each run's FLOP budget: its IsoFLOP label when it has one, else its own FLOPs."""
    flops = done[flops_col].cast(pl.Float64).to_numpy()
    if "flops_budget" not in done.columns:
        return flops
    label = done["flops_budget"].cast(pl.Float64).to_numpy()
    return np.where(np.isfinite(label), label, flops)


def fit_sweep(
    sweep_dir: str | Path,
    *,
    target_flops: float | None = None,
    replicates: int | None = None,
    seed: int = 0,
    fit_starts: int = FIT_STARTS,
) -> tuple[LoopFit, dict[str, Any], FitSpec, list[str]]:
    """The loop's fit of a sweep's done runs: (LoopFit, raw spec, fit spec, warnings)."""
    sweep_dir = Path(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml)")
    raw = read_spec(sweep_dir / "sweep.yaml")
    fit_spec = from_dict(FitSpec, raw.get("fit") or {})
    df = store.load_runs(sweep_dir)
    warnings = _completeness(df)
    loss_col = fit_spec.loss
    flops_col = "flops" if fit_spec.flops == "6n" else "flops_exact"
    done = (
        df.filter((pl.col("status") == "done") & pl.col(loss_col).is_not_null())
        if loss_col in df.columns
        else df.clear()
    )
    if done.height < 6:
        raise UsageError(
            f"{sweep_dir}: {done.height} done run(s) with {loss_col}; a {fit_spec.law} fit needs at least 6"
        )
    budgets = _budgets(done, flops_col)
    law, selection = fit_spec.law, None
    if law == "auto":
        law, selection = _select(done, loss_col, budgets)
        warnings += [f"law selection: {selection['rule']}"]
    lf = fit_for_loop(
        params=done["params"].to_numpy(),
        tokens=done["tokens"].to_numpy(),
        loss=done[loss_col].to_numpy(),
        budgets=budgets,
        law=law,
        replicates=fit_spec.bootstrap if replicates is None else replicates,
        seed=seed,
        target_flops=target_flops or fit_spec.target_flops or None,
        starts=fit_starts,
        run_ids=done["run_id"].to_list(),
        noise_floor=fit_spec.noise_floor,
    )
    lf.selection = selection
    warnings += [f"fit: {w}" for w in lf.fit.warnings]
    return lf, raw, fit_spec, warnings


def _select(done: pl.DataFrame, loss_col: str, budgets: np.ndarray) -> tuple[str, dict[str, Any]]:
    """`fit.law: auto`: the (N, D) law the loop fits, by the held-out-largest-budget backtest.

    The loop extrapolates one law's optimum, so "average" (the geometric mean of the candidates,
    no closed optimum) cannot be the loop's law; when it wins, the best-scored single law is used
    and the rule says so.
    """
    table = read_runs(
        {
            "params": done["params"].to_numpy(),
            "tokens": done["tokens"].to_numpy(),
            "loss": done[loss_col].to_numpy(),
            "flops": budgets,
            "run_id": done["run_id"].to_numpy(),
        }
    )
    sel = select_law(table, candidates=(*LOOP_LAWS, "average"), refit=False)
    out = sel.to_dict()
    law = sel.chosen
    if law not in LOOP_LAWS:
        singles = [c.name for c in sel.ranking() if c.name in LOOP_LAWS]
        law = singles[0] if singles else "chinchilla"
        out["rule"] = f"{out['rule']}; {sel.chosen} has no closed optimum, so the loop fits {law}"
    out["loop_law"] = law
    return law, out


def propose_next(
    sweep_dir: str | Path,
    *,
    target_flops: float | None = None,
    budget_flops: float | None = None,
    step: float = 3.0,
    replicates: int | None = None,
    max_runs: int = 4,
    seed: int = 0,
    fit_starts: int = FIT_STARTS,
    log=print,
) -> dict[str, Any]:
    """Fit the sweep's done runs, gate the fit, and write the next round (module docstring)."""
    sweep_dir = Path(sweep_dir)
    ledger.score(sweep_dir)
    raw_probe = read_spec(sweep_dir / "sweep.yaml") if store.is_sweep_dir(sweep_dir) else {}
    target = target_flops or from_dict(FitSpec, raw_probe.get("fit") or {}).target_flops
    if not target:
        raise UsageError("sweep next needs --target-flops C* (or fit.target_flops in the spec)")
    lf, raw, fit_spec, warnings = fit_sweep(
        sweep_dir, target_flops=target, replicates=replicates, seed=seed, fit_starts=fit_starts
    )
    log(f"fitted {lf.law.name} to {lf.loss.size} runs ({len(lf.draws)} bootstrap replicates)")
    largest = float(lf.budgets.max())
    c_next = min(step * largest, target)
    budget = budget_flops or 2 * c_next
    ctx = _Context.from_base(
        raw.get("base") or {}, from_dict(ExecutionConfig, raw.get("execution") or {}), raw.get("recipe")
    )
    if lf.gates.passed:
        points = [_point(ctx, _size_for(lf, c_next), c_next, "compute_optimal")]
    else:
        log(f"gates failed: {', '.join(lf.gates.failed)}; proposing the runs that would pass them")
        points = _remedies(lf, ctx, c_next)
    k = _next_round(sweep_dir)
    gains: dict[int, float] = {}
    candidates_scored = 0
    if lf.gates.passed and max_runs > 1 and budget > _flops_of(points[0]):
        extra, gains, candidates_scored = _narrowing(lf, ctx, points[0], target, budget, max_runs, log)
        points += extra
    runs = _resolve_points(raw, points, k)
    proposals = [_prediction(lf, r, fit_spec) for r in runs]
    for i, gain in gains.items():
        proposals[i]["width_reduction"] = gain
    loss_at_target = lf.optimum_interval(target)
    n_t, d_t, _ = lf.optimum(target)
    info = dict(
        target_flops=target,
        budget_flops=budget,
        next_budget=c_next,
        largest_done_budget=largest,
        loss_at_target=loss_at_target.point,
        loss_at_target_interval=[loss_at_target.lo, loss_at_target.hi],
        loss_at_target_parts=loss_at_target.parts,
        n_opt_at_target=n_t,
        d_opt_at_target=d_t,
        backtest=lf.backtest,
        gates=lf.gates.to_dict(),
        warnings=warnings,
        proposals=proposals,
        candidates_scored=candidates_scored,
        run_ids=lf.run_ids,
        loss_column=fit_spec.loss,
        replicates=len(lf.draws),
    )
    return _write_round(sweep_dir, raw, lf, fit_spec, k, info, runs)


def _size_for(lf: LoopFit, flops: float) -> float:
    return lf.optimum(flops)[0]


def _point(ctx: _Context, n_target: float, flops: float, kind: str, exclude=frozenset()) -> dict[str, Any]:
    """A proposed run before resolution: shape for n_target, D = flops / 6N tokens."""
    from scalelab.models.accounting import num_params
    from scalelab.models.config import ModelConfig

    shape = ctx.shape(max(n_target, 1.0), "proposal", exclude=exclude)
    n = num_params(ModelConfig(**shape))
    tokens = ctx.round_tokens(flops / (6.0 * n))
    return {
        "overrides": {**{f"model.{k}": v for k, v in shape.items()}, "train.num_tokens": int(tokens)},
        "labels": {"proposal": kind, "flops_budget": float(flops)},
        "shape": (shape["num_layers"], shape["d_model"]),
    }


def _remedies(lf: LoopFit, ctx: _Context, c_next: float) -> list[dict[str, Any]]:
    """Runs that would pass the failed gates (module docstring, 3b)."""
    points: list[dict[str, Any]] = []
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
        points += _at_budget(ctx, lf, b.flops, targets, "bracket")
    all_bracketed = all(b.bracketed for b in brackets)
    if all_bracketed and failed & {"exponents", "starts_agree"}:
        center = _trend_size(brackets, c_next)
        targets = [center * SPAN**o for o in np.linspace(-1, 1, NUM_SIZES)]
        points += _at_budget(ctx, lf, c_next, targets, "new_budget")
    if all_bracketed and "approaches_agree" in failed:
        disagree = set(lf.gates.gates[-1].detail.get("disagree", []))
        for b in brackets:
            if b.flops in disagree:
                targets = [b.vertex, lf.optimum(b.flops)[0]]
                points += _at_budget(ctx, lf, b.flops, targets, "densify")
    if not points:  # every gate that failed is one no run of this kind fixes: widen the design
        center = _trend_size(brackets, c_next)
        points += _at_budget(ctx, lf, c_next, [center * SPAN**o for o in np.linspace(-1, 1, NUM_SIZES)], "new_budget")
    return points


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


def _at_budget(ctx: _Context, lf: LoopFit, flops: float, targets, kind: str) -> list[dict[str, Any]]:
    """Points at one budget for target sizes, skipping shapes the store already ran at that budget."""
    at_budget = np.isclose(lf.budgets, flops, rtol=0.05)
    have = set(np.round(lf.n[at_budget]).astype(int).tolist())
    out, used = [], set()
    for t in sorted(t for t in targets if t and t > 0):
        try:
            p = _point(ctx, t, flops, kind, exclude=frozenset(used))
        except ConfigError:
            continue  # below the smallest shape the rule can build
        n = _params_of(p)
        if n in have or p["shape"] in used:
            continue
        used.add(p["shape"])
        out.append(p)
    return out


def _params_of(point: dict[str, Any]) -> int:
    from scalelab.models.accounting import num_params
    from scalelab.models.config import ModelConfig

    shape = {k.split(".", 1)[1]: v for k, v in point["overrides"].items() if k.startswith("model.")}
    return int(num_params(ModelConfig(**shape)))


def _round_spec(raw: dict[str, Any], points: list[dict[str, Any]], k: int, predictions=None) -> dict[str, Any]:
    out = []
    for i, p in enumerate(points):
        labels = dict(p["labels"], round=k)
        if predictions is not None:
            labels |= {
                "predicted_loss": predictions[i]["predicted_loss"],
                "predicted_interval": predictions[i]["predicted_interval"],
            }
        out.append({**p["overrides"], "labels": labels})
    spec = {"name": f"{raw.get('name', 'sweep')}-round_{k}", "base": raw.get("base") or {}, "points": out}
    for key in ("execution", "fit", "recipe"):
        if key in raw:
            spec[key] = raw[key]
    return spec


def _resolve_points(raw: dict[str, Any], points: list[dict[str, Any]], k: int):
    """The RunSpecs the round will launch (recipe applied, ids hashed); duplicates kept once."""
    if not points:
        return []
    return expand_sweep(_round_spec(raw, points, k), default_name=f"round_{k}").runs


def _prediction(lf: LoopFit, run, fit_spec: FitSpec) -> dict[str, Any]:
    flops = run.flops_6n if fit_spec.flops == "6n" else run.flops_exact
    budget = float(run.labels.get("flops_budget", flops))
    pi = lf.predict_interval(run.params, run.num_tokens, flops=budget)
    return dict(
        kind=run.labels["proposal"],
        run_id=run.run_id,
        budget=budget,
        params=int(run.params),
        tokens=int(run.num_tokens),
        flops=float(flops),
        predicted_loss=pi.point,
        predicted_interval=[pi.lo, pi.hi],
        interval_parts=pi.parts,
    )


def _flops_of(point: dict[str, Any]) -> float:
    return 6.0 * _params_of(point) * point["overrides"]["train.num_tokens"]


def _narrowing(lf: LoopFit, ctx: _Context, first: dict[str, Any], target: float, budget: float, max_runs: int, log):
    """Runs within the budget that most narrow the interval of L*(target) (module docstring, 3a).

    Returns (points, {index in the round: width reduction}, candidates scored)."""
    first_nd = (_params_of(first), first["overrides"]["train.num_tokens"])
    spent = _flops_of(first)
    cands: list[dict[str, Any]] = []
    for c in np.geomspace(lf.budgets.max(), first["labels"]["flops_budget"], 3):
        n_opt = lf.optimum(c)[0]
        for mult in (0.4, 1.0, 2.5):
            try:
                p = _point(ctx, n_opt * mult, c, "narrow_interval")
            except ConfigError:
                continue
            if _flops_of(p) <= budget - spent and all(q["overrides"] != p["overrides"] for q in [first, *cands]):
                cands.append(p)
    if not cands:
        return [], {}, 0
    log(f"scoring {len(cands)} candidate run(s) by how much they narrow the interval at C*={target:.3g}")
    base_width = _width(lf, lf.replicates_with([first_nd]), target)
    scored = []
    for p in cands:
        nd = (_params_of(p), p["overrides"]["train.num_tokens"])
        scored.append((base_width - _width(lf, lf.replicates_with([first_nd, nd]), target), p))
    picked, gains = [], {}
    for gain, p in sorted(scored, key=lambda t: -t[0] / _flops_of(t[1])):
        if 1 + len(picked) >= max_runs or len(picked) >= MAX_NARROWING or not gain > 0:
            continue
        if spent + _flops_of(p) > budget:
            continue
        gains[1 + len(picked)] = float(gain)
        picked.append(p)
        spent += _flops_of(p)
    return picked, gains, len(cands)


def _width(lf: LoopFit, draws: list[dict[str, float]], target: float) -> float:
    vals = []
    for p in draws:
        try:
            vals.append(lf.optimum(target, p)[2])
        except UsageError:
            continue
    if len(vals) < 2:
        return float("nan")
    lo, hi = np.quantile(vals, [0.5 - lf.level / 2, 0.5 + lf.level / 2])
    return float(hi - lo)


def _next_round(sweep_dir: Path) -> int:
    rounds = sweep_dir / "rounds"
    return 1 + len(list(rounds.glob("round_*.yaml"))) if rounds.exists() else 1


def _write_round(sweep_dir: Path, raw: dict, lf: LoopFit, fit_spec: FitSpec, k: int, info: dict, runs) -> dict:
    from scalelab.fitting.pipeline import code_version
    from scalelab.store.atomic import atomic_write_bytes, atomic_write_json

    name = f"round_{k}"
    proposals = info["proposals"]
    points = [
        {
            "overrides": _overrides_of(r),
            "labels": {kk: v for kk, v in r.labels.items() if kk in ("proposal", "flops_budget")},
        }
        for r in runs
    ]
    spec = _round_spec(raw, points, k, proposals)
    spec_path = sweep_dir / "rounds" / f"{name}.yaml"
    atomic_write_bytes(spec_path, dump_spec(spec).encode())
    fit_path = sweep_dir / "fits" / f"{name}.json"
    fit_record = dict(
        lf.to_dict(),
        round=k,
        code_version=code_version(),
        options={"law": fit_spec.law, "loss": fit_spec.loss, "flops": fit_spec.flops, "replicates": len(lf.draws)},
        law=lf.law.name,
        selection=lf.selection,
    )
    report = dict(
        info,
        law=lf.law.name,
        params=lf.params,
        intervals=lf.intervals,
        fit=fit_record,
        objective=float(lf.fit.objective),
        n_points=int(lf.loss.size),
        flops_convention=fit_spec.flops,
        code_version=fit_record["code_version"],
        spec_path=str(spec_path),
        fit_path=str(fit_path),
        round=k,
        level=lf.level,
    )
    atomic_write_json(fit_path, report)
    ledger.record_round(
        sweep_dir,
        fit_record,
        [
            dict(
                round=k,
                run_id=p["run_id"],
                kind=p["kind"],
                params=p["params"],
                tokens=p["tokens"],
                flops=p["flops"],
                predicted=p["predicted_loss"],
                interval=p["predicted_interval"],
                interval_parts=p["interval_parts"],
                gates_passed=lf.gates.passed,
                loss_column=fit_spec.loss,
            )
            for p in proposals
        ],
    )
    return report


def _overrides_of(run) -> dict[str, Any]:
    model = run.config["model"]
    keys = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "vocab_size", "max_seq_len")
    out = {f"model.{k}": model[k] for k in keys}
    out["train.num_tokens"] = run.num_tokens
    return out
