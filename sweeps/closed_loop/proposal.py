"""A proposed round of the closed loop, typed: `Proposal` and its `ProposedRun`s; JSON at the edge.

    p = propose_round("results/iso", target_flops=1e13)     # scalelab.sweeps.closed_loop.propose
    p.gates.passed, [r.kind for r in p.runs], p.runs[0].prediction.lo
    p.sweep                     # the round's runs, resolved once, as launched (sweeps.execution.execute.launch)
    p.to_dict()                 # what fits/round_K.json holds and `sweep next --json` prints
    read_round(sweep_dir, k)    # a saved round back (its runs from rounds/round_K.yaml)

The files keep their format: fits/round_K.json is `to_dict()`, rounds/round_K.yaml the round's spec
(`round_spec`), and the ledger gets `ProposedRun.ledger_entry` per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError
from scalelab.fitting.entry.gates import GateReport
from scalelab.fitting.entry.saved_fit import SavedFit, load_saved_fit
from scalelab.fitting.uncertainty.predictive import PredictionInterval
from scalelab.store import files
from scalelab.store.paths import SweepLayout
from scalelab.sweeps.specs.runspec import RunSpec
from scalelab.sweeps.specs.spec import Sweep, load_sweep

SHAPE_FIELDS = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "vocab_size", "max_seq_len")


@dataclass(kw_only=True, slots=True)
class ProposedRun:
    """One run of a proposed round, resolved exactly as it is launched, with its prediction."""

    kind: str  # compute_optimal | narrow_interval | bracket | new_budget | densify
    run: RunSpec  # the resolved run (recipe applied, id hashed), labels as the round spec gives them
    budget: float  # the FLOP budget it was designed for
    flops: float  # its FLOPs by the fit's convention (6ND or exact)
    prediction: PredictionInterval  # predicted loss and interval (bootstrap + noise + extrapolation)
    width_reduction: float | None = None  # narrow_interval runs: how much they narrow L*(C*)'s interval

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def to_dict(self) -> dict[str, Any]:
        out = dict(
            kind=self.kind,
            run_id=self.run.run_id,
            budget=self.budget,
            params=int(self.run.params),
            tokens=int(self.run.num_tokens),
            flops=self.flops,
            predicted_loss=self.prediction.point,
            predicted_interval=[self.prediction.lo, self.prediction.hi],
            interval_parts=self.prediction.parts,
        )
        if self.prediction.ends is not None:
            out["predicted_ends"] = list(self.prediction.ends)
        if self.width_reduction is not None:
            out["width_reduction"] = self.width_reduction
        return out

    def ledger_entry(self, round_k: int, gates_passed: bool, loss_column: str) -> dict[str, Any]:
        """The ledger's record of this prediction (scalelab.store.ledger), before the run starts."""
        out = dict(
            round=round_k,
            run_id=self.run.run_id,
            kind=self.kind,
            params=int(self.run.params),
            tokens=int(self.run.num_tokens),
            flops=self.flops,
            predicted=self.prediction.point,
            interval=[self.prediction.lo, self.prediction.hi],
            interval_parts=self.prediction.parts,
            gates_passed=gates_passed,
            loss_column=loss_column,
        )
        if self.prediction.ends is not None:
            out["ends"] = list(self.prediction.ends)  # a bracket's two sides
        return out


@dataclass(kw_only=True)
class Proposal:
    """The next round `sweep next` proposes from one fit of the store, and where it was written."""

    round: int
    fit: dict[str, Any]  # the fit's record as fits/round_K.json and the ledger keep it (ScalingFit.to_record ...)
    gates: GateReport
    runs: list[ProposedRun]
    target_flops: float  # C*, where the interval of L* should be tight
    budget_flops: float  # FLOPs the round may spend
    next_budget: float  # the compute-optimal run's budget: min(step x the largest done budget, C*)
    largest_done_budget: float
    loss_at_target: PredictionInterval  # L*(C*) with its interval
    n_opt_at_target: float
    d_opt_at_target: float
    loss_column: str
    flops_convention: str  # 6n | exact
    spec_path: str | Path  # rounds/round_K.yaml (a URL on object storage)
    fit_path: str | Path  # fits/round_K.json
    warnings: list[str] = field(default_factory=list)
    candidates_scored: int = 0  # narrowing candidates whose effect on L*(C*) was measured
    sweep: Sweep | None = None  # the round's runs as launched; None until resolved (read_round resolves the spec)

    @property
    def passed(self) -> bool:
        return self.gates.passed

    @property
    def law(self) -> str:
        return self.fit["law"]

    @property
    def params(self) -> dict[str, float]:
        return self.fit["params"]

    @property
    def intervals(self) -> dict[str, list[float]]:
        return self.fit["intervals"]

    def to_dict(self) -> dict[str, Any]:
        """fits/round_K.json (and `sweep next --json`)."""
        fit = self.fit
        return dict(
            target_flops=self.target_flops,
            budget_flops=self.budget_flops,
            next_budget=self.next_budget,
            largest_done_budget=self.largest_done_budget,
            loss_at_target=self.loss_at_target.point,
            loss_at_target_interval=[self.loss_at_target.lo, self.loss_at_target.hi],
            loss_at_target_parts=self.loss_at_target.parts,
            n_opt_at_target=self.n_opt_at_target,
            d_opt_at_target=self.d_opt_at_target,
            backtest=fit["backtest"],
            gates=self.gates.to_dict(),
            warnings=self.warnings,
            proposals=[r.to_dict() for r in self.runs],
            candidates_scored=self.candidates_scored,
            run_ids=fit["run_ids"],
            loss_column=self.loss_column,
            replicates=fit["replicates"],
            law=fit["law"],
            params=fit["params"],
            intervals=fit["intervals"],
            fit=fit,
            objective=fit["objective"],
            n_points=fit["n_points"],
            flops_convention=self.flops_convention,
            code_version=fit["code_version"],
            spec_path=str(self.spec_path),
            fit_path=str(self.fit_path),
            round=self.round,
            level=fit["level"],
        )

    def ledger_entries(self) -> list[dict[str, Any]]:
        return [r.ledger_entry(self.round, self.passed, self.loss_column) for r in self.runs]


def round_spec(raw: dict[str, Any], runs: list[RunSpec], k: int, runs_labels: list[dict[str, Any]]) -> dict[str, Any]:
    """The round's spec (rounds/round_K.yaml): the sweep's base, execution, fit and recipe, and one
    `points` entry per run (its resolved shape and token count, its training seed where it is not the
    base's - a seed replicate - and `runs_labels`)."""
    base_seed = ((raw.get("base") or {}).get("train") or {}).get("seed", 0)
    points = []
    for run, labels in zip(runs, runs_labels):
        model = run.config["model"]
        over = {f"model.{f}": model[f] for f in SHAPE_FIELDS} | {"train.num_tokens": run.num_tokens}
        if run.config["train"]["seed"] != base_seed:
            over["train.seed"] = run.config["train"]["seed"]
        points.append({**over, "labels": labels})
    spec = {"name": f"{raw.get('name', 'sweep')}-round_{k}", "base": raw.get("base") or {}, "points": points}
    for key in ("execution", "fit", "recipe"):
        if key in raw:
            spec[key] = raw[key]
    return spec


def read_round(sweep_dir: str | Path, k: int) -> Proposal:
    """Round k of a sweep as saved (fits/round_K.json), its runs resolved from rounds/round_K.yaml."""
    layout = SweepLayout(sweep_dir)
    fit_path, spec_path = layout.round_fit(k), layout.round_spec(k)
    text = files.read_text(fit_path)
    if text is None:
        raise UsageError(f"{fit_path}: no such round; `scalelab sweep ledger` lists the sweep's rounds")
    fit = load_saved_fit(fit_path, text=text)
    if fit.round is None:
        raise UsageError(f"{fit_path}: not a round's fit file (no key 'fit'); `scalelab sweep next` writes them")
    sweep = load_sweep(spec_path)
    try:
        return _proposal(fit, sweep, fit_path, spec_path)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(
            f"{fit_path}: a missing or malformed key {e} (or a proposed run that {spec_path} lacks)"
        ) from None


def _proposal(fit: SavedFit, sweep: Sweep, fit_path: str | Path, spec_path: str | Path) -> Proposal:
    """The Proposal a saved round holds, its runs those of the round's resolved spec."""
    saved = fit.round
    by_id = {r.run_id: r for r in sweep.runs}
    level = saved["level"]
    runs = [
        ProposedRun(
            kind=p["kind"],
            run=by_id[p["run_id"]],
            budget=p["budget"],
            flops=p["flops"],
            prediction=PredictionInterval(
                point=p["predicted_loss"],
                lo=p["predicted_interval"][0],
                hi=p["predicted_interval"][1],
                level=level,
                parts=p["interval_parts"],
                ends=tuple(p["predicted_ends"]) if p.get("predicted_ends") else None,
            ),
            width_reduction=p.get("width_reduction"),
        )
        for p in saved["proposals"]
    ]
    lo, hi = saved["loss_at_target_interval"]
    return Proposal(
        round=saved["round"],
        fit=fit.record,
        gates=GateReport.from_dict(saved["gates"]),
        runs=runs,
        target_flops=saved["target_flops"],
        budget_flops=saved["budget_flops"],
        next_budget=saved["next_budget"],
        largest_done_budget=saved["largest_done_budget"],
        loss_at_target=PredictionInterval(
            point=saved["loss_at_target"], lo=lo, hi=hi, level=level, parts=saved["loss_at_target_parts"]
        ),
        n_opt_at_target=saved["n_opt_at_target"],
        d_opt_at_target=saved["d_opt_at_target"],
        loss_column=saved["loss_column"],
        flops_convention=saved["flops_convention"],
        spec_path=spec_path,
        fit_path=fit_path,
        warnings=saved["warnings"],
        candidates_scored=saved["candidates_scored"],
        sweep=sweep,
    )


def latest_round(sweep_dir: str | Path) -> int:
    """The number of the sweep's latest complete round, its fit and its spec both saved (0: none).
    A fit without its spec is a round whose proposer died before it was launchable."""
    layout = SweepLayout(sweep_dir)
    return max(layout.round_numbers("fits") & layout.round_numbers("rounds"), default=0)


def next_round(sweep_dir: str | Path) -> int:
    """The number a new round takes: one past every round begun (a fit or a spec saved)."""
    layout = SweepLayout(sweep_dir)
    return 1 + max(layout.round_numbers("fits") | layout.round_numbers("rounds"), default=0)
