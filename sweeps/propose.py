"""The closed loop: fit the store, then propose the next round of runs as a spec file.

    proposal = propose_next("results/iso", target_flops=1e13, budget_flops=3e12)
    proposal["spec_path"]        # <sweep>/rounds/round_1.yaml: launch it into the same sweep
    proposal["fit_path"]         # <sweep>/fits/round_1.json: the fit, its backtest and the proposals

What it does, in order:

1. Fit. The done runs' (N, D, loss) are fitted with the spec's law (`fit.law`, Chinchilla by
   default) by scalelab.fitting.fit.fit_law from a random subset of the law's start grid
   (`FIT_STARTS` starts; the full 4500-start grid takes minutes on a laptop and finds the same
   optimum on these tables). Incomplete budgets are named in the warnings: a fit from a partial
   grid says so.
2. Backtest. Hold out the largest budget, fit the rest, score the held-out losses
   (scalelab.fitting.backtest: MARE and bias), plus leave-one-budget-out when there are >= 3.
   Each backtest refit starts from the full fit and `BACKTEST_STARTS` grid points (the start
   carries a little information from the held-out runs; the optimum is the training runs' own).
3. Uncertainty. R bootstrap replicates: each reweights the runs by a multinomial resample
   (fit_law takes the counts as weights; duplicate rows are not allowed) and refits, warm-started
   from the full fit plus grid starts. The interval of the loss at C* is the 2.5-97.5
   percentile of the replicates' compute-optimal loss L*(C*). Each refit starts from the full fit
   and from `BOOT_EXTRA_STARTS` grid points of its own: warm starts alone keep every replicate in
   the full fit's basin and understate the uncertainty (see the constant's comment).
4. (a) The compute-optimal run at the next budget C_next = min(step x largest budget done, C*):
   N* from the fit's allocation, rounded to a shape by the shape rule, D = C_next / 6N.
5. (b) Runs within the budget that most narrow the interval at C*. Candidates: budgets between the
   largest done and C_next, sizes N*(c) x {0.4, 1, 2.5}. For each candidate the same R replicates
   are refitted with the compute-optimal run (a) and the candidate added, each at its predicted
   loss times a residual drawn from the fit's own log-residuals (so new points are as noisy as
   the old ones); the drop in the interval's width relative to (a) alone, per FLOP, ranks the
   candidates (common random numbers: every candidate sees the same resamples). They are taken
   greedily while the round's budget lasts (each scored beside (a) only, not beside the other
   picks: two candidates that constrain the same direction are not discounted against each other).

The new spec uses the sweep's base config and the `points` generator with explicit shapes, so the
proposed run is exactly the one that was evaluated; its labels carry the prediction and interval.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab.errors import ConfigError, UsageError
from scalelab.sweeps import store
from scalelab.sweeps.spec import FitSpec, _Context, dump_spec, read_spec

FIT_STARTS = 200  # starts drawn from the law's init grid for the full fit
# Grid starts added to the warm start in each bootstrap refit. With 0, every replicate stays in the
# full fit's basin and the interval comes out too narrow (demo store: [1.643, 1.757] vs [1.643, 1.843]
# with 8, which holds the measured 1.782); 8 finds the other basins a resample may prefer.
BOOT_EXTRA_STARTS = 8
BACKTEST_STARTS = 8  # grid starts added to the warm start in each backtest refit
LEVEL = 0.95
MAX_EXTRA_POINTS = 2  # the compute-optimal run plus one candidate at a time


def _fit(law, data: dict[str, np.ndarray], starts, weights=None):
    from scalelab.fitting.fit import fit_law

    return fit_law(law, data, starts=starts, weights=weights, diagnose=False, n_polish=1)


def _optimum(law, params: dict[str, float], flops: float) -> tuple[float, float, float]:
    from scalelab.fitting.pipeline import _optimum_fn

    out = _optimum_fn(law)(params, flops)
    return float(out[0]), float(out[1]), float(out[2])


class _Fitter:
    """The full fit, its bootstrap replicates, and refits with one extra (candidate) point."""

    def __init__(self, law_name: str, params, tokens, loss, replicates: int, seed: int, starts: int = FIT_STARTS):
        from scalelab.fitting.laws import get_law

        self.law = get_law(law_name)
        if set(self.law.inputs) != {"params", "tokens"}:
            raise UsageError(f"sweep next needs a law of params and tokens (chinchilla, kaplan); got {law_name}")
        self.rng = np.random.default_rng(seed)
        grid = self.law.init_grid()
        self.grid = grid[self.rng.choice(len(grid), min(starts, len(grid)), replace=False)]
        self.x = {"params": np.array(params, float), "tokens": np.array(tokens, float)}  # writable copies
        self.loss = np.array(loss, float)
        self.fit = _fit(self.law, {**self.x, "loss": self.loss}, self.grid)
        self.params = dict(self.fit.params)
        self.log_resid = np.log(self.loss) - np.log(self.predict(self.x["params"], self.x["tokens"]))
        n = len(self.loss)
        self.weights = [np.bincount(self.rng.integers(0, n, n), minlength=n) for _ in range(replicates)]
        self.noise = [self.rng.choice(self.log_resid, size=MAX_EXTRA_POINTS) for _ in range(replicates)]
        self.extra = [
            self.grid[self.rng.choice(len(self.grid), BOOT_EXTRA_STARTS, replace=False)] for _ in range(replicates)
        ]

    def predict(self, params, tokens, theta=None) -> np.ndarray:
        return self.law.predict(
            theta or self.params, params=np.asarray(params, float), tokens=np.asarray(tokens, float)
        )

    def replicates(self, extra_points: list[tuple[float, float]] = ()) -> list[dict[str, float]]:
        """Bootstrap parameter draws; each extra (N, D) run is added at its predicted loss x a residual."""
        out = []
        preds = [float(self.predict(n, d)) for n, d in extra_points]
        for w, eps, extra in zip(self.weights, self.noise, self.extra):
            keep = w > 0
            data = {k: v[keep] for k, v in self.x.items()}
            loss, weights = self.loss[keep], w[keep].astype(float)
            for j, ((n, d), pred) in enumerate(zip(extra_points, preds)):
                data = {"params": np.append(data["params"], n), "tokens": np.append(data["tokens"], d)}
                loss, weights = np.append(loss, pred * math.exp(eps[j])), np.append(weights, 1.0)
            starts = np.vstack([self.law.to_fit(self.params)[None, :], extra])
            try:
                out.append(dict(_fit(self.law, {**data, "loss": loss}, starts, weights).params))
            except UsageError:
                continue  # a degenerate resample (too few distinct points) is skipped
        return out

    def loss_at_target(self, draws: list[dict[str, float]], target_flops: float) -> np.ndarray:
        return np.array([_optimum(self.law, p, target_flops)[2] for p in draws])


def _interval(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size < 2:
        return (float("nan"), float("nan"))
    lo, hi = np.quantile(values, [0.5 - LEVEL / 2, 0.5 + LEVEL / 2])
    return float(lo), float(hi)


def _completeness(sweep_dir: Path, df: pl.DataFrame) -> list[str]:
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


def _budget_of(row: dict[str, Any]) -> float:
    return float(row.get("flops_budget") or row["flops"])


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
    """Fit the sweep's done runs and write the next round (spec + fit JSON); returns the proposal dict."""
    sweep_dir = Path(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml)")
    raw = read_spec(sweep_dir / "sweep.yaml")
    from scalelab.train.config_tree import from_dict

    fit_spec = from_dict(FitSpec, raw.get("fit") or {})
    target = target_flops or fit_spec.target_flops
    if not target:
        raise UsageError("sweep next needs --target-flops C* (or fit.target_flops in the spec)")
    df = store.load_runs(sweep_dir)
    warnings = _completeness(sweep_dir, df)
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
    reps = replicates or fit_spec.bootstrap
    log(f"fitting {fit_spec.law} to {done.height} runs ({reps} bootstrap replicates)")
    f = _Fitter(
        fit_spec.law,
        done["params"].to_numpy(),
        done["tokens"].to_numpy(),
        done[loss_col].to_numpy(),
        reps,
        seed,
        fit_starts,
    )
    warnings += [f"fit: {w}" for w in getattr(f.fit, "warnings", [])]
    backtest = _backtest(f, done, flops_col, loss_col)
    base_draws = f.replicates()
    base_interval = _interval(f.loss_at_target(base_draws, target))
    n_t, d_t, l_t = _optimum(f.law, f.params, target)
    rows = list(done.iter_rows(named=True))
    largest = max(_budget_of(r) for r in rows)
    c_next = min(step * largest, target)
    budget = budget_flops or 2 * c_next
    ctx = _Context.from_base(raw.get("base") or {}, _execution(raw))

    proposals = []
    first = _make_point(ctx, f, c_next, _optimum(f.law, f.params, c_next)[0], base_draws, "compute_optimal")
    proposals.append(first)
    spent = first["flops"]
    candidates = []
    if budget - spent > 0:
        for c in np.geomspace(largest, c_next, 3):
            n_opt = _optimum(f.law, f.params, c)[0]
            for mult in (0.4, 1.0, 2.5):
                try:
                    pt = _make_point(ctx, f, c, n_opt * mult, None, "narrow_interval")
                except ConfigError:
                    continue  # below the smallest shape the rule can build
                if pt["flops"] <= budget - spent and not any(
                    p["overrides"] == pt["overrides"] for p in proposals + candidates
                ):
                    candidates.append(pt)
        log(f"scoring {len(candidates)} candidate run(s) by how much they narrow the interval at C*={target:.3g}")
        # Candidates are scored on top of the compute-optimal run, which the round runs anyway.
        first_point = (first["params"], first["tokens"])
        with_first = _interval(f.loss_at_target(f.replicates([first_point]), target))
        for pt in candidates:
            draws = f.replicates([first_point, (pt["params"], pt["tokens"])])
            lo, hi = _interval(f.loss_at_target(draws, target))
            pt["interval_at_target_with_run"] = [lo, hi]
            pt["width_reduction"] = (with_first[1] - with_first[0]) - (hi - lo)
        for pt in sorted(candidates, key=lambda p: -p["width_reduction"] / p["flops"]):
            if len(proposals) >= max_runs or pt["width_reduction"] <= 0 or spent + pt["flops"] > budget:
                continue
            pt["predicted_loss"], pt["predicted_interval"] = _predict(f, pt, base_draws)
            proposals.append(pt)
            spent += pt["flops"]
    return _write_round(
        sweep_dir,
        raw,
        ctx,
        f,
        fit_spec,
        dict(
            target_flops=target,
            budget_flops=budget,
            next_budget=c_next,
            largest_done_budget=largest,
            loss_at_target=l_t,
            loss_at_target_interval=list(base_interval),
            n_opt_at_target=n_t,
            d_opt_at_target=d_t,
            backtest=backtest,
            warnings=warnings,
            proposals=proposals,
            candidates_scored=len(candidates),
            run_ids=done["run_id"].to_list(),
            loss_column=loss_col,
            replicates=len(base_draws),
        ),
    )


def _execution(raw: dict[str, Any]):
    from scalelab.sweeps.spec import ExecutionConfig
    from scalelab.train.config_tree import from_dict

    return from_dict(ExecutionConfig, raw.get("execution") or {})


def _predict(f: _Fitter, pt: dict[str, Any], draws: list[dict[str, float]]) -> tuple[float, list[float]]:
    point = float(f.predict(pt["params"], pt["tokens"]))
    vals = np.array([float(f.predict(pt["params"], pt["tokens"], theta=d)) for d in draws])
    return point, list(_interval(vals))


def _make_point(ctx: _Context, f: _Fitter, flops: float, n_target: float, draws, kind: str) -> dict[str, Any]:
    from scalelab.models.accounting import num_params
    from scalelab.models.config import ModelConfig

    shape = ctx.shape(max(n_target, 1.0), "proposal")
    n = num_params(ModelConfig(**shape))
    steps = max(1, round(flops / (6 * n) / ctx.tokens_per_step))
    tokens = steps * ctx.tokens_per_step
    pt = dict(
        kind=kind,
        budget=float(flops),
        params=int(n),
        tokens=int(tokens),
        flops=6.0 * n * tokens,
        overrides={**{f"model.{k}": v for k, v in shape.items()}, "train.num_tokens": int(tokens)},
    )
    if draws is not None:
        pt["predicted_loss"], pt["predicted_interval"] = _predict(f, pt, draws)
    return pt


def _backtest(f: _Fitter, done: pl.DataFrame, flops_col: str, loss_col: str) -> dict[str, Any]:
    from scalelab.fitting.backtest import holdout_backtest, leave_one_budget_out
    from scalelab.fitting.io import ColumnMap, read_runs

    frame = done.select(
        pl.col("run_id"),
        pl.col("params"),
        pl.col("tokens"),
        pl.col(loss_col).alias("loss"),
        pl.col(flops_col).alias("flops"),
    )
    table = read_runs(frame, columns=ColumnMap(), min_rows=2)

    starts = np.vstack([f.law.to_fit(f.params)[None, :], f.grid[:BACKTEST_STARTS]])

    def fitter(train):
        fit = _fit(f.law, {"params": train.params, "tokens": train.tokens, "loss": train.loss}, starts)
        return lambda test: f.law.predict(fit.params, params=test.params, tokens=test.tokens)

    out: dict[str, Any] = {}
    for name, fn in (("holdout", holdout_backtest), ("leave_one_budget_out", leave_one_budget_out)):
        try:
            res = fn(table, fitter, min_train=f.law.n_params + 1)
            out[name] = {
                "mare": float(res.mare),
                "bias": float(res.bias),
                "n_test": int(res.n_test),
                "n_train": int(res.n_train),
            }
        except UsageError as e:
            out[name] = {"skipped": str(e)}
        if name == "holdout" and len(set(np.round(np.log(table.flops), 1))) < 3:
            break  # leave-one-budget-out needs >= 3 budgets
    return out


def _write_round(sweep_dir: Path, raw: dict, ctx: _Context, f: _Fitter, fit_spec: FitSpec, info: dict) -> dict:
    from scalelab.fitting.pipeline import code_version
    from scalelab.train.records import atomic_write_bytes, atomic_write_json

    rounds = sweep_dir / "rounds"
    k = 1 + len(list(rounds.glob("round_*.yaml"))) if rounds.exists() else 1
    name = f"round_{k}"
    points = []
    for p in info["proposals"]:
        labels = {"proposal": p["kind"], "round": k}
        if "predicted_loss" in p:
            labels |= {"predicted_loss": p["predicted_loss"], "predicted_interval": p["predicted_interval"]}
        points.append({**p["overrides"], "labels": labels})
    spec = {"name": f"{raw.get('name', sweep_dir.name)}-{name}", "base": raw.get("base") or {}, "points": points}
    for key in ("execution", "fit"):
        if key in raw:
            spec[key] = raw[key]
    spec_path = rounds / f"{name}.yaml"
    atomic_write_bytes(spec_path, dump_spec(spec).encode())
    fit_path = sweep_dir / "fits" / f"{name}.json"
    report = dict(
        info,
        law=fit_spec.law,
        params=f.params,
        objective=float(f.fit.objective),
        n_points=len(f.loss),
        flops_convention=fit_spec.flops,
        code_version=code_version(),
        spec_path=str(spec_path),
        fit_path=str(fit_path),
        round=k,
        level=LEVEL,
        method="bootstrap reweighting, warm-started refits; candidates scored by refitting the same "
        "replicates with the candidate at its predicted loss x a resampled residual",
    )
    atomic_write_json(fit_path, report)
    return report


def format_proposal(p: dict[str, Any]) -> str:
    lo, hi = p["loss_at_target_interval"]
    lines = [
        f"fit: {p['law']} on {p['n_points']} runs ({p['loss_column']}), {p['replicates']} bootstrap replicates",
        "  " + ", ".join(f"{k}={v:.4g}" for k, v in p["params"].items()),
        f"  loss at C*={p['target_flops']:.3g}: {p['loss_at_target']:.4f}  [{lo:.4f}, {hi:.4f}] (95%)  "
        f"N*={p['n_opt_at_target']:.3g} D*={p['d_opt_at_target']:.3g}",
    ]
    for name, bt in p["backtest"].items():
        lines.append(
            f"  backtest {name}: "
            + (
                f"MARE {bt['mare']:.2%}, bias {bt['bias']:+.2%} on {bt['n_test']} runs"
                if "mare" in bt
                else bt["skipped"]
            )
        )
    lines += [f"  warning: {w}" for w in p["warnings"]]
    lines.append(f"next round (budget {p['budget_flops']:.3g} FLOPs, next budget {p['next_budget']:.3g}):")
    for q in p["proposals"]:
        extra = ""
        if "predicted_loss" in q:
            lo, hi = q["predicted_interval"]
            extra = f"  predicted {q['predicted_loss']:.4f} [{lo:.4f}, {hi:.4f}]"
        if "width_reduction" in q:
            extra += f"  narrows the C* interval by {q['width_reduction']:.4f}"
        lines.append(f"  {q['kind']:16s} N={q['params']:,} D={q['tokens']:,} C={q['flops']:.3g}{extra}")
    lines.append(f"spec: {p['spec_path']}   fit: {p['fit_path']}")
    lines.append(f"launch it: scalelab sweep launch {p['spec_path']} --out {Path(p['spec_path']).parent.parent}")
    return "\n".join(lines)


def load_fit(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
