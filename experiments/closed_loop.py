"""The closed loop from a cold store to 3x, 10x and 30x the first round's largest budget, every run
predicted before it was trained, each distance scored on two training seeds.

Protocol (local Ray, one sweep; the method is the code at the commit that runs it, fixed before the
scored runs exist: `fit.law: auto`, the stacked law of scalelab.fitting.selection.ensemble):
1. Round 0: the demo's IsoFLOP design (3 budgets spanning 10x, 4 sizes each, the demo recipe) at
   training seed `--seed` (default 1: the method was developed on seed-0 runs).
2. Rounds until the gates pass, then the compute-optimal run at 3x the largest budget (`sweep next
   --step 3 --seeds 2`: two seeds of it, both predicted and scored).
3. The next round at 10x the first round's largest budget (the compute-optimal run and its second
   seed), predicted by the fit of every run so far; then the round at 30x, the same way. When a
   fit's gates fail, its round holds the runs that would pass them, as `run_rounds` launches them:
   they are launched and the distance proposed again; a gate-fixing round that trains runs at or
   past a distance (an IsoFLOP slice at the new budget) stands for it, and its runs are scored.
4. Every round's fit is kept (fits/round_K.json, with the stacked law's draws), so each later run is
   also predicted by *every earlier* round's fit: the 30x runs as the first round's fit saw them
   (30x away), as the 3x round's fit did (10x away) and as the 10x round's (3x away).

    python experiments/closed_loop.py --out results/bench/closed_loop           # ~1-2 h on 2 idle cores
    python experiments/closed_loop.py --out results/bench/closed_loop --resume  # a stopped store: its latest
                                                                                # round, then on
    python experiments/closed_loop.py --out DIR --seed S --first-round   # round 0 alone (a recorded store's
                                                     # first round again, for experiments/score_store.py --far)
    python experiments/closed_loop.py --out DIR --multiples 3,10 --bootstrap 2   # a smoke run: two distances,
                                                     # 2 bootstrap replicates per fit (the spec's: 32)

Prints the fits per round (weights, the interval of L*(T) at T = 30x), the ledger (each run as
predicted by the round that proposed it) and the matrix of every round's prediction of every
scored run, with coverage and widths per distance.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import polars as pl
import yaml

from scalelab import store
from scalelab.errors import UsageError, run_script
from scalelab.fitting.allocation.allocate import optimum_for_law
from scalelab.fitting.entry.saved_fit import load_saved_fit
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.ensemble import StackedFit
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.closed_loop.far_runs import far_runs
from scalelab.sweeps.closed_loop.proposal import latest_round, read_round
from scalelab.sweeps.closed_loop.proposal_text import format_gates
from scalelab.sweeps.closed_loop.rounds import LaunchOptions, run_rounds
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.specs.spec import expand_sweep

MAX_ROUNDS = 4  # rounds that may fix failed gates before the 3x round
MULTIPLES = (3.0, 10.0, 30.0)  # of the first round's largest budget
SEEDS = 2  # training seeds of each scored compute-optimal run


def round_fits(sweep_dir: Path) -> dict[int, dict]:
    """Round -> the fit that round proposed from (fits/round_K.json's `fit`)."""
    files = store.SweepLayout(sweep_dir).round_fits()
    return {int(p.stem.split("_")[1]): load_saved_fit(p).record for p in files}


def predict(fit: dict, n: float, d: float, flops: float):
    """A saved round fit's prediction interval at (N, D): the stacked law's when it has one."""
    if fit.get("stacked"):
        return StackedFit.from_dict(fit["stacked"]).predict_interval(n, d, flops)
    raise SystemExit("a round fit without a stacked law: this bench scores fit.law auto")


def parse_multiples(text: str) -> tuple[float, ...]:
    """--multiples: increasing distances, the first 3 (the gate rounds' step: `sweep next --step 3`)."""
    try:
        mults = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--multiples {text}: give comma-separated numbers, e.g. 3,10,30") from None
    if mults[0] != MULTIPLES[0] or any(b <= a for a, b in zip(mults, mults[1:])):
        raise UsageError(f"--multiples {text}: give increasing distances from {MULTIPLES[0]:g}, e.g. 3,10,30")
    return mults


def main(argv: list[str] | None = None, trainer=None) -> None:
    """The protocol (module docstring); `trainer` stands in for Ray's launcher (LaunchOptions.trainer:
    a test's simulator, scalelab.analysis.synthetic.synthetic_trainer)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/closed_loop", help="store root; the sweep is <out>/loop")
    ap.add_argument("--seed", type=int, default=1, help="training seed of round 0 (the 2nd seed of a scored run: +1)")
    ap.add_argument("--num-cpus", type=int, default=None)
    ap.add_argument("--report-only", action="store_true", help="print the tables of a finished store")
    ap.add_argument("--first-round", action="store_true", help="train round 0 alone and stop")
    ap.add_argument(
        "--resume", action="store_true", help="continue a stopped store: launch its latest round, then the distances"
    )
    ap.add_argument(
        "--multiples",
        default=",".join(f"{m:g}" for m in MULTIPLES),
        help="the scored distances, multiples of the first round's largest budget (default 3,10,30)",
    )
    ap.add_argument("--bootstrap", type=int, default=None, help="fit.bootstrap of the spec (default: the demo's)")
    args = ap.parse_args(argv)
    multiples = parse_multiples(args.multiples)
    t0 = time.time()
    sweep_dir = Path(args.out) / "loop"
    spec = demo_spec()
    spec["name"] = "closed-loop-bench"
    spec["base"]["train"]["seed"] = args.seed
    if args.bootstrap is not None:
        spec["fit"]["bootstrap"] = args.bootstrap
    largest = max(spec["isoflop"]["budgets"])
    target = multiples[-1] * largest
    if args.first_round:
        launch(expand_sweep(spec), sweep_dir, spec_text=yaml.safe_dump(spec, sort_keys=False), spec_name="loop",
               num_cpus=args.num_cpus)  # fmt: skip
        return
    if not args.report_only:
        options = LaunchOptions(num_cpus=args.num_cpus, trainer=trainer)
        _run(spec, sweep_dir, Distances(largest, multiples), target, options, args.resume)
    ledger.score(sweep_dir)
    print(f"\nclosed loop: {time.time() - t0:.0f} s; target T = {target:.3g} FLOPs")
    _print_rounds(sweep_dir, target)
    print()
    print(ledger.format_ledger(ledger.read_ledger(sweep_dir)))
    _print_matrix(sweep_dir, largest)


def _run(
    spec: dict, sweep_dir: Path, distances: Distances, target: float, options: LaunchOptions, resume: bool
) -> None:
    def announce(k, p) -> None:
        gates = format_gates(p.gates.to_dict()).splitlines()[0]
        print(f"round {p.round}: {len(p.fit['run_ids'])} runs fitted; {gates}")

    sweep, text = expand_sweep(spec), yaml.safe_dump(spec, sort_keys=False)
    if resume:  # the latest round as it was proposed (its predictions are in the ledger), then the distances
        p = read_round(sweep_dir, latest_round(sweep_dir))
        (options.trainer or launch)(p.sweep, sweep_dir, spec_text=p.spec_path.read_text(),
                                    spec_name=p.spec_path.stem, num_cpus=options.num_cpus)  # fmt: skip
        runs = store.load_runs(sweep_dir).filter(pl.col("status") == "done")
        distances.done_budget = float(runs["flops_budget"].max())
    else:
        result = run_rounds(sweep, sweep_dir, spec_text=text, spec_name="loop", rounds=1 + MAX_ROUNDS,
                            target_flops=target, step=3.0, until_passed=True, options=options,
                            before_launch=announce, seeds=SEEDS)  # fmt: skip
        if not result.proposals or not result.proposals[-1].passed:
            raise SystemExit(f"the gates did not pass in {MAX_ROUNDS} rounds: {result.stopped}")
        distances.done_budget = result.proposals[-1].next_budget
    # The rounds at 10x and 30x, continuing the store: Distances sets each round's budget and step.
    run_rounds(sweep, sweep_dir, spec_text=text, spec_name="loop", rounds=1 + len(distances.multiples) * MAX_ROUNDS,
               target_flops=target, seeds=SEEDS, options=options, before_launch=announce,
               next_round=distances, launch_design=False)  # fmt: skip


class Distances:
    """The rounds at 10x and 30x (`multiples` after the first) the first round's largest budget, as
    run_rounds' `next_round`. A round proposed from a fit whose gates fail holds the runs that would
    pass them (as in run_rounds): it is launched and the distance proposed again, its step from the
    largest budget trained so far; runs it trains at or past the distance are that distance's.
    MAX_ROUNDS tries per distance. `done_budget`: the largest budget trained when they start."""

    def __init__(self, largest: float, multiples: tuple[float, ...] = MULTIPLES):
        self.largest, self.multiples, self.done_budget = largest, multiples, largest
        self.distance, self.tries = 1, 0  # multiples[1] (10x) first; the 3x round is run_rounds' first call

    def __call__(self, i: int, last) -> dict | None:
        if last is not None:  # the round launched before this one
            if last.passed:  # its compute-optimal run is the distance's
                self.done_budget, self.distance, self.tries = last.next_budget, self.distance + 1, 0
            else:
                self.done_budget = max(self.done_budget, max(r.budget for r in last.runs))
                self.tries += 1
        while self.distance < len(self.multiples):
            mult = self.multiples[self.distance]
            if self.tries >= MAX_ROUNDS:
                raise SystemExit(f"the gates did not pass in {MAX_ROUNDS} rounds before {mult:g}x")
            if self.done_budget < 0.99 * mult * self.largest:
                return {"budget_flops": SEEDS * mult * self.largest, "step": mult * self.largest / self.done_budget}
            self.distance, self.tries = self.distance + 1, 0  # a gate-fixing round already trained runs here
        return None


def _print_rounds(sweep_dir: Path, target: float) -> None:
    print(
        f"{'round':>5} {'runs':>4} {'weights (chinchilla, kaplan)':>30} {'drift/dec':>9} {'L*(T)':>8} "
        f"{'interval':>20} {'width':>7}"
    )
    for k, fit in round_fits(sweep_dir).items():
        st = fit["stacked"]
        n_t, d_t = _optimum(fit, target)  # L*(T): the prediction at the incumbent's N*(T), as the loop makes it
        pi = predict(fit, n_t, d_t, target)
        w = ", ".join(f"{v:.2f}" for v in st["weights"].values())
        drift = st["stack"].get("drift_per_decade")
        print(
            f"{k:>5} {fit['n_points']:>4} {w:>30} {100 * drift if drift is not None else float('nan'):>8.2f}% "
            f"{pi.point:>8.4f} [{pi.lo:.4f}, {pi.hi:.4f}] {(pi.hi - pi.lo) / pi.point:>7.2%}"
        )


def _optimum(fit: dict, flops: float) -> tuple[float, float]:
    n, d = optimum_for_law(get_law(fit["law"]))(fit["params"], flops)[:2]
    return float(n), float(d)


def _print_matrix(sweep_dir: Path, largest: float) -> None:
    """Every round's prediction of every scored run (far_runs; the ledger holds the proposer's)."""
    fits = round_fits(sweep_dir)
    runs = store.load_runs(sweep_dir)
    scored = list(far_runs(runs, largest).iter_rows(named=True))
    print("\nevery round's fit against every scored run (error = predicted/measured - 1):")
    print(f"{'run':>13} {'x':>4} {'seed':>4} {'measured':>8}  " + "  ".join(f"{'round ' + str(k):>27}" for k in fits))
    by_distance: dict[tuple[int, float], list[tuple[float, bool, float]]] = {}
    for r in sorted(scored, key=lambda r: (r["flops_budget"], r.get("seed", 0))):
        mult = r["flops_budget"] / largest
        cells = []
        for k, fit in fits.items():
            if r["run_id"] in fit["run_ids"]:
                cells.append(f"{'(fitted)':>27}")
                continue
            if max(fit["points"]["budgets"]) >= r["flops_budget"] * 0.99:
                cells.append(f"{'-':>27}")
                continue
            pi = predict(fit, r["params"], r["tokens"], r["flops_budget"])
            err = pi.point / r["final_val_loss"] - 1
            inside = pi.lo <= r["final_val_loss"] <= pi.hi
            width = (pi.hi - pi.lo) / pi.point
            dist = round(r["flops_budget"] / max(fit["points"]["budgets"]), 1)
            by_distance.setdefault((k, round(mult)), []).append((err, inside, width))
            cells.append(f"{100 * err:+6.2f}% w{100 * width:5.1f}% {'in ' if inside else 'OUT'} ({dist:g}x)")
        print(
            f"{r['run_id']:>13} {round(mult):>4} {r.get('seed', 0):>4} {r['final_val_loss']:>8.4f}  " + "  ".join(cells)
        )
    print("\nby round and distance: mean |error|, coverage, mean width")
    for (k, mult), rows in sorted(by_distance.items()):
        mae = sum(abs(e) for e, _, _ in rows) / len(rows)
        cov = sum(i for _, i, _ in rows)
        wid = sum(w for _, _, w in rows) / len(rows)
        print(
            f"  round {k} fit -> {mult:>3}x runs: |error| {100 * mae:.2f}%, {cov}/{len(rows)} inside, "
            f"width {100 * wid:.1f}%"
        )


if __name__ == "__main__":
    run_script(main, __file__)
