"""Three choice studies on real runs: architecture, data and hyperparameter, each checked at 10x.

    python bench/studies.py --study arch      # SwiGLU vs a GELU MLP at equal parameters and FLOPs
    python bench/studies.py --study data      # the whole corpus vs library code only (test suites out)
    python bench/studies.py --study hparam    # the recipe's per-size LR law vs one LR for every size
    python bench/studies.py --study all       # the three, one after another

Each study is one sweep in one store root (default results/studies): the demo's IsoFLOP design
(scalelab.sweeps.demo: budgets 2e11, 6.3e11, 2e12, 4 sizes each, its recipe) crossed with two arms,
the demo's own config as the baseline arm. Put the demo's finished store in the root first
(`cp -a <demo out> results/studies`, its sweep is `isoflop`) and the baseline's 12 runs are linked,
not trained. In order:

1. `sweep launch` of the study spec (max_concurrent 1: one core).
2. `sweep next --decide` on it: each arm fitted the loop's way (fit, bootstrap, backtests, gates),
   the compute multiplier m(C) of the other arm over the baseline at every budget and at the
   target (10x the largest budget, 2e13), the predicted loss gap between the arms' compute-optimal
   runs at the target with its 95% interval and a verdict, written to the ledger; the round holds
   those two runs (the decisive pair). The baseline's target run is the same run in every study
   (the same fit of the same runs), so it trains once.
3. `sweep launch` of that round; the ledger scores the measured gap against the prediction.
4. The study's report (`scalelab sweep study DIR`): frontiers per arm, m(C), the ledger of predicted
   vs measured gaps, and decision accuracy (single-scale ranking at each budget vs the law's).

Interrupted, it resumes: finished runs are found in the store and the latest round is reopened.
`--no-target` stops after step 2 (the design's runs, the fits, m(C), the predicted gap and verdict in
the ledger) and reports what is there; a later run without it trains the decisive pair.

Why these arms (all chosen to have an effect at this scale; the figures are in docs/studies.md):
- arch: a GELU MLP (2 matrices of 3/2 the SwiGLU width) against SwiGLU: the same N, shapes and
  FLOPs per token, so the only difference is the gated activation (Shazeer 2020).
- data: library code only (the stdlib's test suites, 66% of the tokens, left out of the train
  split) against the whole corpus, both validated on the same held-out documents. Near-duplicate
  removal was the first candidate and was dropped: the corpus has almost none (MinHash at
  Jaccard 0.7: 24 documents, 35 KB of 29 MB).
- hparam: one LR for every size (7e-3, the best LR of the design's smallest models in
  bench/lr_sweep.py) against the recipe's per-size law 5e-3 (N / 5e4)^-0.3. AdamW beta2 0.99 vs
  0.95 was the first candidate and was dropped after two runs: -0.10% and -0.02% at 2e12.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import yaml

from scalelab.analysis.decision_accuracy import DecisionTable, decision_accuracy, format_decisions, pool
from scalelab.analysis.report import write_report
from scalelab.store import ledger
from scalelab.store.ledger import format_studies
from scalelab.sweeps.demo import demo_spec
from scalelab.sweeps.execute import launch
from scalelab.sweeps.proposal import latest_round
from scalelab.sweeps.spec import expand_sweep, load_sweep
from scalelab.sweeps.study_fit import fit_study
from scalelab.sweeps.study_text import format_study
from scalelab.sweeps.study_propose import format_study_proposal, propose_study_round

TARGET_FLOPS = 2e13  # 10x the demo design's largest budget
MAX_REMEDY = 2  # remedy (or narrowing) rounds trained before the study stops short of the decisive one
STUDIES: dict[str, dict[str, Any]] = {
    "arch": {
        "description": "SwiGLU vs a GELU MLP at equal parameters and FLOPs per token",
        "arms": {"swiglu": {}, "gelu": {"model.mlp": "gelu"}},
    },
    "data": {
        "description": "the whole stdlib corpus vs library code only (test suites out of the train split)",
        "arms": {"full": {}, "lib_only": {"data.sources.0.train_exclude": ["*/test/*", "*/tests/*", "*/idle_test/*"]}},
    },
    "hparam": {
        "description": "the recipe's per-size LR law vs one LR (7e-3) for every size",
        "arms": {"lr_law": {}, "lr_const": {"optim.lr": 0.007}},
    },
}


def study_spec(study: str) -> dict[str, Any]:
    """The study's sweep spec: the demo's design, its two arms, one core, 64 bootstrap replicates."""
    spec = copy.deepcopy(demo_spec())
    info = STUDIES[study]
    spec["name"] = f"study-{study}"
    spec["description"] = info["description"]
    spec["execution"] = dict(spec["execution"], max_concurrent=1)
    spec["fit"] = dict(spec["fit"], bootstrap=64)
    spec["study"] = {"arms": info["arms"], "baseline": next(iter(info["arms"])), "target_flops": TARGET_FLOPS}
    return spec


def spec_text(study: str) -> str:
    return yaml.safe_dump(study_spec(study), sort_keys=False)


def _latest_round(sweep_dir: Path) -> tuple[Path | None, str | None]:
    """The spec and kind (remedy | narrow | decisive) of the study's latest round; (None, None): none."""
    k = latest_round(sweep_dir)
    if not k:
        return None, None
    record = json.loads((sweep_dir / "fits" / f"round_{k}.json").read_text())
    return sweep_dir / "rounds" / f"round_{k}.yaml", record.get("kind")


def _launch_round(spec_path: Path, sweep_dir: Path, log) -> None:
    launch(
        load_sweep(spec_path), sweep_dir, spec_text=spec_path.read_text(), spec_name=spec_path.stem, num_cpus=1, log=log
    )


def run_study(study: str, root: Path, log=print, target: bool = True) -> tuple[dict[str, float], DecisionTable]:
    """Steps 1-4 of the module docstring for one study (step 3 only with `target`); (wall times in s,
    its decision table)."""
    sweep_dir = root / f"study-{study}"
    times: dict[str, float] = {}
    t0 = time.time()
    sweep = expand_sweep(study_spec(study), default_name=f"study-{study}")
    launch(sweep, sweep_dir, spec_text=spec_text(study), spec_name=f"study-{study}", num_cpus=1, log=log)
    times["design runs"] = time.time() - t0
    t0 = time.time()
    # a round that is not the decisive one (an arm's gates failed: remedy runs) is trained and the arms
    # refitted, as `sweep launch --rounds` does, at most MAX_REMEDY times; a rerun relaunches the
    # latest round (its finished runs are skipped)
    spec_path, kind = _latest_round(sweep_dir)
    for _ in range(MAX_REMEDY + 1):
        if kind == "decisive":
            break
        if spec_path is not None:
            _launch_round(spec_path, sweep_dir, log)
        proposal = propose_study_round(sweep_dir, decide=True, log=log)
        log(format_study_proposal(proposal))
        spec_path, kind = proposal.spec_path, proposal.kind
    times["rounds before the target (fits, proposals, remedy runs)"] = time.time() - t0
    if target and kind == "decisive":
        t0 = time.time()
        _launch_round(spec_path, sweep_dir, log)
        times["target runs"] = time.time() - t0
    t0 = time.time()
    ledger.score(sweep_dir)
    log(format_study(fit_study(sweep_dir)))
    log(format_studies(ledger.read_ledger(sweep_dir)["studies"]))
    table = decision_accuracy(sweep_dir)
    log(format_decisions(table))
    report = write_report(sweep_dir, root / f"study-{study}.html")
    log(f"report: {report}")
    times["report"] = time.time() - t0
    return times, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", choices=[*STUDIES, "all"], required=True)
    ap.add_argument("--out", default="results/studies", help="the store root (holding the demo's sweep)")
    ap.add_argument("--no-target", action="store_true", help="stop before training the decisive pair at the target")
    args = ap.parse_args()
    tables = []
    for study in STUDIES if args.study == "all" else [args.study]:
        times, table = run_study(study, Path(args.out), target=not args.no_target)
        tables.append(table)
        print(f"study {study} wall times: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
    if len(tables) > 1:
        print(format_decisions(pool(tables)))


if __name__ == "__main__":
    main()
