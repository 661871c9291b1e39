"""Choice studies on real runs, each decided at 10x by a matched decisive measurement, and scored.

    python experiments/studies.py --study arch                       # one study (STUDIES), resumable
    python experiments/studies.py --study all --out results/studies --max-concurrent 2
    python experiments/studies.py --study all --out results/studies --score-only    # score the store, train nothing
    python experiments/studies.py --study arch,wsd --simulate --smoke --out /tmp/s   # the protocol on simulated runs

The protocol (registered in docs/studies.md, "Registered studies", before the new studies' runs
trained):

1. Each study is one sweep under one store root (`--out`): the demo's IsoFLOP design
   (scalelab.sweeps.closed_loop.demo: budgets 2e11, 6.3e11, 2e12, 4 sizes each from N*/3 to 3 N*, its recipe)
   crossed with two arms, the demo's own config the baseline arm. Runs are deterministic, and a run
   is trained once per store root: the baseline's design and decisive runs are shared by every study.
2. The package's closed loop, as `sweep launch --rounds 4 --decide` runs it
   (scalelab.sweeps.closed_loop.rounds.run_rounds): the design; a remedy round while an arm's identification
   gates fail (at most MAX_REMEDY); then the matched decisive measurement at the target, 2e13 = 10x
   the largest budget: both arms at 3 sizes around the baseline's N* (a factor 2 apart) with 2 seeds
   each (scalelab.sweeps.studies.study_decisive). Every estimator's predicted gap (the paired gap model, the
   verdict's; its frontier gap; the shared-exponent law; each arm's own law, the old estimator) is in
   the ledger before the measurement trains. A rerun continues where it stopped.
3. Scoring, from the ledger's predictions as recorded: per study, each estimator's 95% interval
   width in nats, whether it covers the measured mean gap (its se from the 6 pairs), decided or not,
   right or wrong; the per-point scatter (the gap model's, in nats at the baseline's predicted loss);
   decision accuracy per study and pooled (scalelab.analysis.decision_accuracy, Wilson intervals).
4. The goals (issue 49), judged on the paired estimator: every interval at most GOAL_WIDTH nats wide;
   at least GOAL_COVERAGE of the measured gaps inside; a decision whenever the measured gap exceeds
   twice the per-point scatter, and never a wrong one; paired decision accuracy at the largest
   budget at least the single-scale ranking's there, over at least GOAL_STUDIES studies.

Writes <out>/summary.json (per study and pooled, with the machine's load and the wall times) and
prints the tables. `--simulate` trains nothing: the runs are simulated from known laws per arm
(scalelab.analysis.synthetic.synthetic_trainer) through the same loop; `--smoke` fits with 4
bootstrap replicates instead of 64 (tests/test_bench_studies.py runs both on two studies).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scalelab.analysis.decision_accuracy import METHODS, DecisionTable, decision_accuracy, format_decisions, pool
from scalelab.analysis.synthetic import SyntheticLaw, synthetic_trainer
from scalelab.errors import run_script
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.closed_loop.rounds import LaunchOptions, run_rounds
from scalelab.sweeps.specs.spec import expand_sweep
from scalelab.sweeps.studies.study_fit import fit_study
from scalelab.sweeps.studies.study_text import format_study

TARGET_FACTOR = 10.0  # the target: this x the design's largest budget
MAX_REMEDY = 2  # remedy rounds before a study stops short of its decisive measurement
GOAL_WIDTH = 0.15  # nats
GOAL_COVERAGE = 0.9
GOAL_STUDIES = 6
VIEWS = ("paired", "paired_frontier", "joint", "joint_frontier", "separate")

# name -> the study's question and its arms (the baseline first: the demo's config as it is).
# The first three ran before issue 49 (docs/studies.md, "Three studies"); the others were
# registered in docs/studies.md before any of their runs trained.
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
    "qknorm": {
        "description": "no QK-norm vs RMSNorm on queries and keys (OLMo-2 / Qwen-3 style)",
        "arms": {"plain": {}, "qk_norm": {"model.qk_norm": True}},
    },
    "wsd": {
        "description": "cosine decay vs warmup-stable-decay with a 20% linear cooldown",
        "arms": {"cosine": {}, "wsd": {"schedule.name": "wsd", "schedule.decay_fraction": 0.2}},
    },
    "zloss": {
        "description": "no z-loss vs a z-loss of 1e-4 on the output log-partition (PaLM, OLMo-2)",
        "arms": {"no_zloss": {}, "zloss": {"optim.z_loss": 1e-4}},
    },
    "wd": {
        "description": "AdamW weight decay 0.1 vs none",
        "arms": {"wd0.1": {}, "wd0": {"optim.weight_decay": 0.0}},
    },
}
# --simulate: the baseline's law (its optimum at 20 tokens per parameter, the demo design's centre;
# losses 1.95, 1.49, 1.23 at 2e11, 2e12, 2e13) and the other arm's, gaps of several sizes and drifts
SIMULATED_BASE = {"E": 0.9, "A": 106.0, "B": 474.0, "alpha": 0.5, "beta": 0.5}
SIMULATED = {
    "arch": SyntheticLaw(**SIMULATED_BASE, efficiency=0.7),
    "data": SyntheticLaw(**(SIMULATED_BASE | {"E": 1.0})),
    "hparam": SyntheticLaw(**SIMULATED_BASE, efficiency=0.97),
    "qknorm": SyntheticLaw(**SIMULATED_BASE),
    "wsd": SyntheticLaw(**(SIMULATED_BASE | {"alpha": 0.48})),
    "zloss": SyntheticLaw(**SIMULATED_BASE, efficiency=1.02),
    "wd": SyntheticLaw(**SIMULATED_BASE, efficiency=0.9),
}


def study_spec(study: str, *, smoke: bool = False, max_concurrent: int = 1) -> dict[str, Any]:
    """The study's sweep spec: the demo's design, its two arms, the matched decisive measurement."""
    spec = copy.deepcopy(demo_spec())
    info = STUDIES[study]
    largest = max(spec["isoflop"]["budgets"])
    spec["name"] = f"study-{study}"
    spec["description"] = info["description"]
    spec["execution"] = dict(spec["execution"], max_concurrent=max_concurrent)
    spec["fit"] = dict(spec["fit"], law="chinchilla", bootstrap=4 if smoke else 64)
    spec["study"] = {
        "arms": info["arms"],
        "baseline": next(iter(info["arms"])),
        "target_flops": float(f"{TARGET_FACTOR * largest:.3g}"),
        "estimator": "paired",
        "decisive": {"sizes": 3, "seeds": 2},
    }
    return spec


def train_study(study: str, root: Path, args, log=print) -> float:
    """Steps 1-2 of the protocol (module docstring) for one study; its wall time in seconds."""
    spec = study_spec(study, smoke=args.smoke, max_concurrent=args.max_concurrent)
    trainer = None
    if args.simulate:
        arms = list(STUDIES[study]["arms"])
        laws = {arms[0]: SyntheticLaw(**SIMULATED_BASE), arms[1]: SIMULATED[study]}
        trainer = synthetic_trainer(laws, noise_std=0.004)
    t0 = time.time()
    result = run_rounds(
        expand_sweep(spec, default_name=spec["name"]),
        root / spec["name"],
        spec_text=yaml.safe_dump(spec, sort_keys=False),
        spec_name=spec["name"],
        rounds=2 + MAX_REMEDY,
        decide=True,
        until_passed=True,
        reopen=True,
        options=LaunchOptions(max_concurrent=args.max_concurrent, num_cpus=args.cpus, trainer=trainer),
        log=log,
    )
    if result.stopped:
        log(f"study {study}: stopped: {result.stopped}")
    return time.time() - t0


def _entry(sweep_dir: Path) -> dict[str, Any] | None:
    """The study's latest scored decisive prediction (the one its measurement answers)."""
    scored = [e for e in ledger.read_ledger(sweep_dir)["studies"] if e.get("measured_gap") is not None]
    return scored[-1] if scored else None


def score_study(study: str, root: Path, log=print) -> tuple[dict[str, Any], DecisionTable | None]:
    """Step 3 of the protocol for one study: its row of the summary and its decision table."""
    sweep_dir = root / f"study-{study}"
    ledger.score(sweep_dir)
    log(format_study(fit_study(sweep_dir)))
    e = _entry(sweep_dir)
    if e is None:
        return {"study": study, "scored": False}, None
    baseline_loss = float(np.mean(e["predicted_losses"][e["baseline"]]))
    scatter = (e.get("gap_model") or {}).get("scatter_per_point", math.nan) * baseline_loss
    views = {}
    for name in VIEWS:
        v = e["views"].get(name)
        if v is not None:
            views[name] = dict(v, width=v["interval"][1] - v["interval"][0])
    table = decision_accuracy(sweep_dir)
    log(format_decisions(table))
    return {
        "study": study,
        "scored": True,
        "arm": e["arm"],
        "baseline": e["baseline"],
        "measured_gap": e["measured_gap"],
        "measured_se": e["measured_se"],
        "n_pairs": e["n_pairs"],
        "scatter_per_point_nats": scatter,
        "gap_model": e.get("gap_model", {}).get("model"),
        "views": views,
    }, table


def goals(rows: list[dict[str, Any]], pooled: DecisionTable | None) -> dict[str, Any]:
    """Step 4 of the protocol: each goal's figure, its threshold and whether it is met."""
    scored = [r for r in rows if r.get("scored")]
    paired = [r["views"]["paired"] for r in scored]
    widths = [v["width"] for v in paired]
    inside = sum(bool(v["covered"]) for v in paired)
    must = [r for r in scored if abs(r["measured_gap"]) > 2 * r["scatter_per_point_nats"]]
    out = {
        "studies": len(scored),
        "widest_interval_nats": max(widths, default=math.nan),
        "width_met": bool(widths) and max(widths) <= GOAL_WIDTH,
        "covered": f"{inside}/{len(paired)}",
        "coverage_met": bool(paired) and inside / len(paired) >= GOAL_COVERAGE,
        "decided_when_gap_over_2_scatter": f"{sum(r['views']['paired']['decided'] for r in must)}/{len(must)}",
        "wrong_decisions": sum(v["decision"] == "wrong" for v in paired),
    }
    out["decision_met"] = out["wrong_decisions"] == 0 and all(r["views"]["paired"]["decided"] for r in must)
    if pooled is not None and pooled.budgets:
        last = pooled.budgets[-1]  # every study's largest budget
        cells = {m: pooled.cell(last, m) for m in METHODS}
        out["accuracy_at_largest_budget"] = {m: c.to_dict() for m, c in cells.items()}
        single = max(cells["each size"].accuracy, cells["best run"].accuracy)
        out["accuracy_met"] = len(scored) >= GOAL_STUDIES and cells["paired"].accuracy >= single
    return out


def _print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'study':8} {'view':16} {'predicted':>9} {'interval':>19} {'width':>6} {'decided':>7} {'decision':>8} "
          f"{'covered':>7}   measured (se), scatter per point")  # fmt: skip
    for r in rows:
        if not r.get("scored"):
            print(f"{r['study']:8} not scored (no measured decisive measurement)")
            continue
        for name, v in r["views"].items():
            lo, hi = v["interval"]
            print(
                f"{r['study']:8} {name:16} {v['gap']:>+9.4f} [{lo:+.4f}, {hi:+.4f}] {v['width']:>6.3f} "
                f"{'yes' if v['decided'] else 'no':>7} {v['decision']:>8} {'yes' if v['covered'] else 'NO':>7}"
                + (
                    f"   {r['measured_gap']:+.4f} ({r['measured_se']:.4f}), {r['scatter_per_point_nats']:.4f}"
                    if name == "paired"
                    else ""
                )
            )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", required=True, help=f"'all' or a comma list of {', '.join(STUDIES)}")
    ap.add_argument("--out", default="results/studies", help="the store root the studies share")
    ap.add_argument("--max-concurrent", type=int, default=1, help="runs trained at once (one core each)")
    ap.add_argument("--cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    ap.add_argument("--score-only", action="store_true", help="score what the store holds; train nothing")
    ap.add_argument("--simulate", action="store_true", help="simulated runs from known laws (no training)")
    ap.add_argument("--smoke", action="store_true", help="4 bootstrap replicates instead of 64 (a quick check)")
    args = ap.parse_args(argv)
    names = list(STUDIES) if args.study == "all" else args.study.split(",")
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        ap.error(f"--study: unknown {unknown}; choose from {list(STUDIES)} or all")
    root = Path(args.out)
    times: dict[str, dict[str, float]] = {}
    for name in names:
        times[name] = {"train_s": 0.0 if args.score_only else train_study(name, root, args)}
    rows, tables = [], []
    for name in names:
        t0 = time.time()
        row, table = score_study(name, root)
        times[name]["score_s"] = time.time() - t0
        rows.append(dict(row, times=times[name]))
        tables += [table] if table is not None else []
    pooled = pool(tables) if tables else None
    if pooled is not None:
        print(format_decisions(pooled))
    _print_rows(rows)
    summary = {
        "studies": rows,
        "goals": goals(rows, pooled),
        "pooled_decisions": pooled.to_dict() if pooled is not None else None,
        "simulated": args.simulate,
        "smoke": args.smoke,
        "load_average": os.getloadavg(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary["goals"], indent=2, default=str))
    print(f"summary: {root / 'summary.json'}; wall times: " + json.dumps(times))


if __name__ == "__main__":
    run_script(main, __file__)
