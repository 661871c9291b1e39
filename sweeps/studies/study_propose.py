"""The closed loop for a study: fit every arm, then write the round that decides the study.

    p = propose_study_round("results/studies/study-arch")      # a StudyProposal
    p.kind                  # remedy | narrow | decisive
    p.runs                  # the round's runs (ProposedRun, each labelled with its arm), predicted
    p.sweep                 # those runs resolved once: launch them into the same sweep
    p.entries               # the ledger's study entries: predicted winner, gap and interval per arm

`sweep next DIR` on a study (its sweep.yaml has a `study:` section) runs this. In order:

1. Score the ledger: runs and study entries of earlier rounds that are now done get their measured
   loss and gap (scalelab.store.ledger).
2. Fit every arm the loop's way and compare each with the baseline at the study's target
   (scalelab.sweeps.studies.study_fit: m(C) with paired-bootstrap intervals, the gap with its interval).
3. Choose the round:
   - `remedy`: an arm's identification gates fail: the runs that would pass them, for that arm
     (scalelab.sweeps.closed_loop.propose.remedies, sized in the arm's own design context);
   - `decisive`: every arm is told apart from the baseline (the gap's interval at the target
     excludes 0), or `decide` is asked: the matched decisive measurement (scalelab.sweeps
     .study_decisive): every arm at the same sizes around the baseline's N* at the target, each with
     the same seeds (`study.decisive`, `seeds` here). Its gaps are predicted at the runs as resolved,
     and each arm's entry (the pairs' run ids, the predicted gap and interval with its parts by the
     study's estimator and by the others, the predicted winner, the multiplier, the verdict) goes to
     the ledger before the runs start; it is scored when they finish (the measured mean gap with its
     standard error, covered or not, the decision right, wrong or none: scalelab.store.ledger);
   - `narrow`: otherwise, the runs that most narrow the multiplier's interval at the target per
     FLOP: candidates per arm at the largest budget done and at min(step x it, target), sizes
     0.4, 1 and 2.5 x the arm's N*(C); each scored by refitting that arm's bootstrap replicates
     with the run added at its predicted loss times a residual drawn from the fit's own (common
     random numbers, scalelab.fitting.entry.scaling_fit.ScalingFit.replicates_with), pairing them with the
     other arm's replicates and taking the width of m(target)'s percentile interval; picked by
     width reduction per FLOP within `budget_flops`. When no candidate narrows it, the decisive
     pair instead.
4. Every run is resolved once, exactly as it will be launched (the arm's overrides and the spec's
   recipe applied), predicted with its arm's three-part interval, and written as the round's spec
   (rounds/round_K.yaml, a `points` spec whose points carry their arm's overrides and label),
   the round's record (fits/round_K.json) and the ledger.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab import store
from scalelab.config_tree import from_dict
from scalelab.errors import ConfigError, UsageError
from scalelab.fitting.comparisons.comparison import target_interval
from scalelab.fitting.entry.scaling_fit import code_version
from scalelab.store import files, ledger
from scalelab.store.atomic import atomic_write_bytes, atomic_write_json
from scalelab.store.paths import SweepLayout
from scalelab.sweeps.closed_loop.proposal import ProposedRun, latest_round, round_spec
from scalelab.sweeps.closed_loop.propose import Candidate, next_round, remedies
from scalelab.sweeps.specs.design_context import DesignContext
from scalelab.sweeps.specs.spec import (
    ExecutionConfig,
    Sweep,
    dump_spec,
    expand_sweep,
    load_sweep,
    read_spec,
    with_overrides,
)
from scalelab.sweeps.studies.study_decisive import DecisivePoint, decisive_candidates, decisive_points
from scalelab.sweeps.studies.study_fit import ArmFit, StudyFit, compare_arms, design_budgets, fit_study
from scalelab.sweeps.studies.study_text import format_study

NARROW_MULTS = (0.4, 1.0, 2.5)  # candidate sizes around an arm's N*(C)
MAX_NARROWING = 3  # narrowing runs per round at most
ROUND_LABELS = ("arm", "proposal", "flops_budget", "size_index", "target_params")  # kept in the round's spec


@dataclass(kw_only=True)
class StudyProposal:
    """A study's next round (module docstring) and where it was written."""

    round: int
    kind: str  # remedy | narrow | decisive
    study_fit: StudyFit
    runs: list[ProposedRun]
    entries: list[dict[str, Any]]  # the ledger's study entries (decisive rounds)
    budget_flops: float
    spec_path: Path
    fit_path: Path
    warnings: list[str] = field(default_factory=list)
    width_reductions: dict[str, float] = field(default_factory=dict)  # run id -> narrowing of m(target)
    sweep: Sweep | None = None

    @property
    def passed(self) -> bool:
        """The round decides the study (`sweep launch --rounds --until-passed` stops after it)."""
        return self.kind == "decisive"

    def to_dict(self) -> dict[str, Any]:
        """fits/round_K.json (and `sweep next --json` on a study)."""
        return dict(
            study=True,
            round=self.round,
            kind=self.kind,
            target_flops=self.study_fit.study.target_flops,
            budget_flops=self.budget_flops,
            fit=self.study_fit.to_dict(),
            proposals=[
                dict(r.to_dict(), arm=r.run.labels.get("arm"), width_reduction=self.width_reductions.get(r.run_id))
                for r in self.runs
            ],
            entries=self.entries,
            warnings=self.warnings,
            code_version=code_version(),
            spec_path=str(self.spec_path),
            fit_path=str(self.fit_path),
        )


def is_study(sweep_dir: str | Path) -> bool:
    """The sweep's spec has a `study:` section."""
    path = SweepLayout(sweep_dir).spec
    return files.exists(path) and read_spec(path).get("study") is not None


def propose_study_round(
    sweep_dir: str | Path,
    *,
    budget_flops: float | None = None,
    step: float = 3.0,
    decide: bool = False,
    replicates: int | None = None,
    seed: int = 0,
    seeds: int | None = None,
    estimator: str | None = None,
    log=print,
) -> StudyProposal:
    """Fit the study's arms and write its next round (module docstring); `seeds` overrides the
    decisive measurement's seeds per size (study.decisive.seeds)."""
    sweep_dir = Path(sweep_dir)
    ledger.score(sweep_dir)
    sf = fit_study(sweep_dir, replicates=replicates, seed=seed, estimator=estimator)
    if seeds is not None:
        if seeds < 1:
            raise UsageError(f"--seeds must be >= 1, got {seeds}")
        sf.study = dataclasses.replace(sf.study, decisive_seeds=seeds)
    study = sf.study
    raw = read_spec(SweepLayout(sweep_dir).spec)
    execution = from_dict(ExecutionConfig, raw.get("execution") or {})
    ctxs = {
        arm: DesignContext.from_base(
            with_overrides(raw.get("base") or {}, over), cpus_per_run=execution.cpus_per_run, recipe=raw.get("recipe")
        )
        for arm, over in study.arms.items()
    }
    for name, a in sf.arms.items():
        log(f"arm {name}: fitted {a.fit.law} to {a.n_runs} runs ({len(a.fit.draws)} bootstrap replicates)")
    target = study.target_flops
    largest = max(max(design_budgets(a.fit)) for a in sf.arms.values())
    c_next = min(step * largest, target)
    budget = budget_flops or 2 * c_next
    failed = [a for a in sf.arms.values() if not a.passed]
    gains: dict[int, float] = {}
    warnings = list(sf.warnings)
    if failed:
        kind = "remedy"
        log("gates failed: " + "; ".join(f"{a.name}: {', '.join(a.fit.gates.failed)}" for a in failed))
        cands = [(a.name, c, None) for a in failed for c in remedies(a.fit, ctxs[a.name], c_next)]
    elif decide or all(c.decided for c in sf.comparisons):
        kind, cands = "decisive", _decisive(sf, ctxs, raw)
    else:
        kind = "narrow"
        cands, gains = _narrowing(sf, ctxs, largest, c_next, budget, log)
        if not cands:
            warnings.append("no candidate run narrows the multiplier's interval: proposing the decisive measurement")
            kind, cands = "decisive", _decisive(sf, ctxs, raw)
    k = next_round(sweep_dir)
    sweep = _resolve(raw, study.arms, cands, k)
    by_arm: dict[str, list] = {}
    for r in sweep.runs:
        by_arm.setdefault(r.labels["arm"], []).append(r)
    if kind == "decisive":  # the gaps at the runs as resolved (the shape rule moves N a little)
        at = {arm: [(float(r.params), float(r.num_tokens)) for r in rs] for arm, rs in by_arm.items()}
        base = sf.arms[study.baseline]
        sf.comparisons = [compare_arms(base, sf.arms[c.arm], target, at=at, setting=sf.setting) for c in sf.comparisons]
    runs = [_predicted(sf.arms[r.labels["arm"]], r, sf.options.flops) for r in sweep.runs]
    proposal = StudyProposal(
        round=k,
        kind=kind,
        study_fit=sf,
        runs=runs,
        entries=_entries(sf, by_arm, k) if kind == "decisive" else [],
        budget_flops=budget,
        spec_path=SweepLayout(sweep_dir).round_spec(k),
        fit_path=SweepLayout(sweep_dir).round_fit(k),
        warnings=warnings,
        width_reductions={sweep.runs[i].run_id: g for i, g in gains.items() if i < len(sweep.runs)},
    )
    _write_round(sweep_dir, raw, proposal, sweep)
    return proposal


Planned = tuple[str, Candidate, DecisivePoint | None]  # (arm, its run, the decisive point it measures)


def _decisive(sf: StudyFit, ctxs: dict[str, DesignContext], raw: dict[str, Any]) -> list[Planned]:
    """The matched decisive measurement: every arm at the same sizes around the baseline's N* and the
    same seeds (scalelab.sweeps.studies.study_decisive)."""
    target = sf.study.target_flops
    points = decisive_points(sf.arms[sf.study.baseline].fit.optimum(target)[0], sf.study, raw)
    return decisive_candidates(points, ctxs, target)


def _m_width(sf: StudyFit, draws: dict[str, list[dict[str, float]]], arm: str) -> float:
    """Width of the percentile interval of m(target) of `arm` over the baseline, from these draws."""
    base = sf.study.baseline
    law_a, law_b = sf.arms[base].fit.law_object, sf.arms[arm].fit.law_object
    lo, hi = target_interval(law_a, draws[base], law_b, draws[arm], sf.study.target_flops, sf.options.level)
    return hi - lo if math.isfinite(hi - lo) else math.inf


def _narrowing(sf: StudyFit, ctxs, largest: float, c_next: float, budget: float, log):
    """Runs within `budget` that most narrow m(target)'s interval per FLOP (module docstring, narrow).

    Returns ([(arm, candidate)], {index in the round: width reduction summed over the arms' m})."""
    arms = sf.study.names
    base_draws = {a: sf.arms[a].fit.replicates_with([]) for a in arms}
    base_width = {b: _m_width(sf, base_draws, b) for b in sf.study.others}
    cands: list[tuple[str, Candidate]] = []
    for arm in arms:
        fit = sf.arms[arm].fit
        for c in sorted({largest, c_next}):
            for mult in NARROW_MULTS:
                try:
                    cand = Candidate.at(ctxs[arm], fit.optimum(c)[0] * mult, c, "narrow_multiplier")
                except ConfigError:
                    continue  # below the smallest shape the rule can build
                if cand.flops <= budget and all((a, q.overrides()) != (arm, cand.overrides()) for a, q in cands):
                    cands.append((arm, cand))
    if not cands:
        return [], {}
    log(f"scoring {len(cands)} candidate run(s) by how much they narrow m's interval at C*={sf.study.target_flops:.3g}")
    scored = []
    for arm, cand in cands:
        draws = dict(base_draws, **{arm: sf.arms[arm].fit.replicates_with([(cand.params, cand.num_tokens)])})
        others = sf.study.others if arm == sf.study.baseline else [arm]
        gain = sum(base_width[b] - _m_width(sf, draws, b) for b in others)
        scored.append((gain, arm, cand))
    picked, gains, spent = [], {}, 0.0
    for gain, arm, cand in sorted(scored, key=lambda t: -t[0] / t[2].flops):
        if len(picked) >= MAX_NARROWING or not gain > 0 or spent + cand.flops > budget:
            continue
        gains[len(picked)] = float(gain)
        picked.append((arm, cand, None))
        spent += cand.flops
    return picked, gains


def _resolve(raw: dict[str, Any], arms: dict[str, dict[str, Any]], cands: list[Planned], k: int) -> Sweep:
    """The round's runs, resolved once: one point per candidate carrying its arm's overrides (and a
    decisive point's seed and design size)."""
    spec = round_spec(raw, [], k, [])
    spec["points"] = []
    for arm, c, point in cands:
        labels = {"arm": arm, "proposal": c.kind, "flops_budget": c.budget, "round": k}
        seed = {}
        if point is not None:
            labels.update(size_index=point.size_index, target_params=round(point.target_params))
            seed = {"train.seed": point.seed}
        spec["points"].append({**c.overrides(), **seed, **arms[arm], "labels": labels})
    if not cands:
        raise UsageError("the study's round has no buildable run (every candidate is below the smallest shape)")
    return expand_sweep(spec, default_name=f"round_{k}")


def _predicted(arm: ArmFit, run, flops_convention: str) -> ProposedRun:
    flops = run.flops_6n if flops_convention == "6n" else run.flops_exact
    budget = float(run.labels.get("flops_budget", flops))
    return ProposedRun(
        kind=run.labels["proposal"],
        run=run,
        budget=budget,
        flops=float(flops),
        prediction=arm.fit.predict_interval(run.params, run.num_tokens, flops=budget),
    )


def _views(c) -> dict[str, Any]:
    """Every estimator's gap at the decisive measurement (and between the frontiers), for the ledger."""
    views = {"separate": c.separate_gap}
    if c.paired is not None:
        views |= {"paired": c.paired.matched, "paired_frontier": c.paired.frontier}
        if c.paired.joint_matched is not None:
            views |= {"joint": c.paired.joint_matched, "joint_frontier": c.paired.joint_frontier}
    return {
        name: {"gap": g.point, "interval": [g.lo, g.hi], "parts": g.parts, "decided": g.decided}
        for name, g in views.items()
    }


def _entries(sf: StudyFit, by_arm: dict[str, list], k: int) -> list[dict[str, Any]]:
    """The ledger's study entries of a decisive round: one per arm compared with the baseline, its
    runs aligned pair by pair with the baseline's (the same size and seed)."""
    out = []
    for c in sf.comparisons:
        base, other = by_arm[c.baseline], by_arm[c.arm]
        out.append(
            dict(
                round=k,
                arm=c.arm,
                baseline=c.baseline,
                estimator=c.estimator,
                run_ids={c.baseline: [r.run_id for r in base], c.arm: [r.run_id for r in other]},
                pairs=[
                    {
                        "size_index": ra.labels.get("size_index"),
                        "seed": ra.config["train"]["seed"],
                        "params": [ra.params, rb.params],
                        "tokens": [ra.num_tokens, rb.num_tokens],
                    }
                    for ra, rb in zip(base, other)
                ],  # fmt: skip
                target_flops=c.target_flops,
                predicted_losses={a: [p.point for p in ps] for a, ps in c.losses.items()},
                predicted_gap=c.gap.point,
                interval=[c.gap.lo, c.gap.hi],
                interval_parts=c.gap.parts,
                views=_views(c),
                gap_model=None if c.paired is None else c.paired.estimate.to_dict(),
                predicted_winner=c.winner,
                decided=c.decided,
                multiplier=c.multiplier_at_target,
                multiplier_interval=list(c.target_interval),
                slope=c.slope,
                slope_interval=list(c.slope_interval),
                verdict=c.verdict,
                loss_column=sf.options.loss,
                level=c.level,
            )
        )
    return out


def _write_round(sweep_dir: Path, raw: dict[str, Any], proposal: StudyProposal, sweep: Sweep) -> None:
    """fits/round_K.json, the ledger, then rounds/round_K.yaml, before anything runs; `proposal.sweep`
    becomes the round's runs with the labels its spec gives them."""
    k = proposal.round
    labels = [
        {
            **{key: v for key, v in r.run.labels.items() if key in ROUND_LABELS},
            "round": k,
            "predicted_loss": r.prediction.point,
            "predicted_interval": [r.prediction.lo, r.prediction.hi],
        }
        for r in proposal.runs
    ]
    spec = round_spec(raw, [r.run for r in proposal.runs], k, labels)
    arms = proposal.study_fit.study.arms
    for point, lab in zip(spec["points"], labels):
        point.update(arms[lab["arm"]])  # the arm's overrides travel with its point
        point["labels"] = point.pop("labels")  # kept last, for the reader
    for r, lab in zip(proposal.runs, labels):
        r.run = dataclasses.replace(r.run, labels=dict(lab, generator="points"))
    proposal.sweep = dataclasses.replace(sweep, raw=spec, runs=[r.run for r in proposal.runs])
    atomic_write_json(proposal.fit_path, proposal.to_dict())
    loss_column = proposal.study_fit.options.loss
    predictions = [r.ledger_entry(k, proposal.passed, loss_column) for r in proposal.runs]
    ledger.record_study(sweep_dir, proposal.entries, predictions)
    atomic_write_bytes(proposal.spec_path, dump_spec(spec).encode())  # after the ledger: launchable last


@dataclass(kw_only=True)
class OpenRound:
    """A study's latest round as written, to launch again (its runs not all done)."""

    round: int
    kind: str
    spec_path: Path
    sweep: Sweep
    runs: list  # the round's RunSpecs

    @property
    def passed(self) -> bool:
        return self.kind == "decisive"


def open_study_round(sweep_dir: str | Path) -> OpenRound | None:
    """The study's latest round when a run of it is not done (a loop stopped while it trained), else None."""
    k = latest_round(sweep_dir)
    if not k:
        return None
    layout = SweepLayout(sweep_dir)
    record = json.loads(files.read_text(layout.round_fit(k)) or "{}")
    spec_path = Path(layout.round_spec(k))
    if not record.get("study") or not spec_path.exists():
        return None
    sweep = load_sweep(spec_path)
    if all(store.run_state(store.run_location(sweep_dir, r.run_id)) == "done" for r in sweep.runs):
        return None
    return OpenRound(round=k, kind=record.get("kind", ""), spec_path=spec_path, sweep=sweep, runs=sweep.runs)


def format_study_proposal(p: StudyProposal) -> str:
    """What `sweep next` prints for a study: the arms' fits and comparisons, then the round."""
    lines = [format_study(p.study_fit)]
    what = {
        "remedy": "runs that would pass the failed gates",
        "narrow": "the runs that most narrow m's interval at the target per FLOP",
        "decisive": "the matched decisive measurement: every arm at the same sizes around N* and seeds",
    }[p.kind]
    lines.append(f"round {p.round} ({p.kind}): {what}")
    for r in p.runs:
        pr = r.prediction
        gain = p.width_reductions.get(r.run_id)
        extra = f"  narrows m's interval by {gain:.3g}" if gain is not None else ""
        lines.append(
            f"  {r.run.labels.get('arm', ''):12} {r.run_id}  N={r.run.params:,}  D={r.run.num_tokens:,}  "
            f"C={r.flops:.3g}  predicted {pr.point:.4f} [{pr.lo:.4f}, {pr.hi:.4f}]{extra}"
        )
    for e in p.entries:
        lo, hi = e["interval"]
        lines.append(
            f"  ledger: {e['arm']} vs {e['baseline']}: predicted gap {e['predicted_gap']:+.4f} [{lo:+.4f}, {hi:+.4f}] "
            f"({e['estimator']}, mean over {len(e['pairs'])} matched pairs), winner {e['predicted_winner']} "
            f"({'decided' if e['decided'] else 'not decided: the interval contains 0'})"
        )
    lines += [f"warning: {w}" for w in p.warnings]
    lines.append(
        f"spec: {p.spec_path}  (launch it: scalelab sweep launch {p.spec_path} --out {p.spec_path.parent.parent})"
    )
    return "\n".join(lines)
