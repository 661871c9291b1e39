"""`scalelab demo`: the closed loop end to end on a laptop CPU (local Ray), in under 10 minutes.

1. An IsoFLOP sweep of tiny Llama models (byte tokenizer, the default stdlib corpus): 3 FLOP budgets
   spanning 10x, 4 sizes each centred on a prior N*(C) (20 tokens per parameter) and spanning
   3x on each side, 2+ layers, every run built by the small-scale recipe (DEMO_RECIPE: a batch
   that grows with the run's tokens, at least 250 optimizer steps, short warmup, a per-size LR
   from the measured LR law). Every run is a Ray Tune trial.
2. The fit (Chinchilla, Approach 3) with bootstrap intervals, backtests and the identification
   gates (`sweep next`). If a gate fails (a minimum not bracketed, say), the round it writes holds
   the runs that would pass it; the demo launches them and fits again (at most MAX_ROUNDS).
3. Once every gate passes, the compute-optimal run at 3x the largest budget, launched into the
   same sweep; the ledger records its measured loss beside the prediction made before it ran.
4. Predicted vs measured with the interval, the ledger, and a PNG of the IsoFLOP curves (points:
   runs; lines: the fitted law along each budget) and the frontier N*(C).

    run_demo("results/demo", plot=plot_demo)   # prints as it goes; returns the numbers it printed

`plot` draws the PNG (`scalelab.analysis.plots.plot_demo`, which `scalelab demo` passes) and
`fit_images` a round's figures for its W&B fit run (scalelab.analysis.wandb_images): the analysis
side reads the store, so the sweep side does not import it.

The sweep lives at <out>/isoflop (the store root is <out>), so running the demo again trains
nothing it has already trained. W&B is disabled in the demo's spec (it costs seconds per run on a
CPU); `scalelab demo --wandb offline` (WANDB_MODE) turns it on without changing a run id.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from scalelab import store
from scalelab.fitting.forms.fit_terms import law_heading
from scalelab.fitting.selection.ensemble import format_parts, format_stacked
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.proposal import Proposal
from scalelab.sweeps.closed_loop.proposal_text import format_gates
from scalelab.sweeps.closed_loop.rounds import LaunchOptions, run_rounds
from scalelab.sweeps.specs.spec import expand_sweep

MAX_ROUNDS = 3  # fits (and remedial rounds) before the demo gives up on identification

# The small-scale recipe of the demo (scalelab.sweeps.recipes.recipe); constants from experiments/lr_sweep.py.
DEMO_RECIPE: dict[str, Any] = {
    "min_steps": 250,
    "shape": {"min_layers": 2, "width_per_layer": 16, "min_width": 16},
    "warmup": {"fraction": 0.05, "max_steps": 50},
    "batch": {"by": "tokens", "ref": 1.2e6, "ref_tokens": 512, "exponent": 0.5, "min_sequences": 4},
    "lr": {"ref_params": 5e4, "ref_lr": 5e-3, "exponent": -0.3},
}
DEMO_BUDGETS = (2e11, 6.3e11, 2e12)
# --quick: a quarter of the compute. The demo's budgets scaled down would ask for sizes under the
# smallest model the shape rule builds at vocab 320 (18.5k parameters), so the quick grid centres
# on 10 tokens per parameter instead of 20, which keeps its 4 sizes per budget buildable.
QUICK_BUDGETS, QUICK_TOKENS_PER_PARAM = (1e11, 2e11, 4e11), 10


def demo_spec(quick: bool = False) -> dict[str, Any]:
    """The demo's IsoFLOP spec. Budgets in FLOPs (6ND); quick = a quarter of the compute (QUICK_BUDGETS)."""
    return {
        "name": "demo-isoflop",
        "description": "scalelab demo: IsoFLOP sweep of tiny models on CPU",
        "base": {
            "data": {"seq_len": 64, "val_sequences": 2048, "val_fraction": 0.02},
            "train": {"seed": 0},
            "schedule": {"name": "cosine"},
            "eval": {"interval_steps": 0, "val_batch_sequences": 128},
            "checkpoint": {"interval_steps": 0, "keep_last": 1},
            "logging": {"wandb": "disabled", "progress": "off"},
        },
        "recipe": DEMO_RECIPE,
        "isoflop": {
            "budgets": list(QUICK_BUDGETS if quick else DEMO_BUDGETS),
            "num_sizes": 4,
            "center": {"tokens_per_param": QUICK_TOKENS_PER_PARAM if quick else 20},
            "span": 3.0,
            "tolerance": 0.05,
        },
        "execution": {"max_failures": 2, "cpus_per_run": 1},
        "fit": {"law": "auto", "loss": "final_val_loss", "bootstrap": 32, "noise_floor": 0.0056},
    }


def run_demo(
    out: str | Path = "results/demo",
    *,
    quick: bool = False,
    num_cpus: int | None = None,
    address: str | None = None,
    log=print,
    plot=None,
    fit_images=None,
) -> dict[str, Any]:
    """The demo (module docstring): the closed loop (scalelab.sweeps.closed_loop.rounds.run_rounds) with its steps
    printed. A fit whose gates fail gets its remedial round launched and is fitted again, at most
    MAX_ROUNDS times; the first round proposed from a passing fit is the compute-optimal run."""
    t0 = time.time()
    sweep_dir = Path(out) / "isoflop"
    spec = demo_spec(quick)
    sweep = expand_sweep(spec, default_name="demo")
    log(f"[1/4] IsoFLOP sweep: {len(sweep.runs)} runs at budgets {spec['isoflop']['budgets']} -> {sweep_dir}")
    _print_design(sweep, log)
    largest = max(spec["isoflop"]["budgets"])
    next_budget = 3 * largest
    times = {"sweep": 0.0, "fit": 0.0}
    before_fit, before_launch = _step_printers(t0, times, next_budget, log)
    result = run_rounds(
        sweep,
        sweep_dir,
        spec_text=yaml.safe_dump(spec, sort_keys=False),
        spec_name="demo",
        rounds=1 + MAX_ROUNDS,
        target_flops=next_budget,
        budget_flops=next_budget,
        step=3.0,
        until_passed=True,
        reopen=True,
        options=LaunchOptions(address=address, num_cpus=num_cpus),
        log=log,
        before_fit=before_fit,
        before_launch=before_launch,
        fit_images=fit_images,
    )
    if not result.proposals:
        log("some runs did not finish; see `scalelab sweep status " + str(sweep_dir) + "`")
        return {"ok": False}
    proposal = result.proposals[-1].to_dict()
    if not proposal["gates"]["passed"]:
        _print_fit(proposal, log)
        log(f"the gates still fail after {MAX_ROUNDS} rounds; no compute-optimal run is proposed")
        return {"ok": False, "gates": proposal["gates"], "fit": proposal["fit"]}
    return _predicted_vs_measured(sweep_dir, proposal, t0, times, plot, log)


def _step_printers(t0: float, times: dict[str, float], next_budget: float, log):
    """run_rounds' before_fit and before_launch for the demo: they print steps 2 and 3 (or a failed
    gate's remedial round) and record in `times` when the sweep and the fit ended."""

    def before_fit(i: int) -> None:
        if i == 1:
            times["sweep"] = time.time() - t0
            log(
                f"[2/4] fit, gates and proposal (the compute-optimal run at {next_budget:.3g} FLOPs = 3x the "
                "largest budget)"
            )

    def before_launch(i: int, proposal: Proposal) -> None:
        if not proposal.passed:
            log(format_gates(proposal.gates.to_dict()))
            log(f"  -> launching the {len(proposal.runs)} run(s) that would pass the failed gate(s)")
            return
        _print_fit(proposal.to_dict(), log)
        times["fit"] = time.time() - t0 - times["sweep"]
        log("[3/4] the proposed compute-optimal run")

    return before_fit, before_launch


def _predicted_vs_measured(sweep_dir: Path, proposal: dict[str, Any], t0: float, times, plot, log) -> dict[str, Any]:
    """Step 4: the proposed run's measured loss against its prediction, the ledger, the plot, and
    the numbers run_demo returns."""
    fit = proposal["fit"]
    t_sweep, t_fit = times["sweep"], times["fit"]
    p = proposal["proposals"][0]
    status = store.read_status(store.run_path(sweep_dir, p["run_id"])) or {}
    measured = status.get("final_val_loss")
    predicted, (lo, hi) = p["predicted_loss"], p["predicted_interval"]
    png = sweep_dir / "demo_isoflop.png"
    if plot is not None:
        plot(sweep_dir, proposal, measured, png)
    wall = time.time() - t0
    inside = measured is not None and lo <= measured <= hi
    log("[4/4] predicted vs measured")
    log(f"  run {p['run_id']}: N={p['params']:,} params, D={p['tokens']:,} tokens, C={p['flops']:.3g} FLOPs")
    parts = p["interval_parts"]
    log(
        f"  predicted val loss {predicted:.4f}  95% interval [{lo:.4f}, {hi:.4f}]  (log-sd parts: "
        f"{format_parts(parts)})"
    )
    if p.get("predicted_ends"):  # a first round's far run: the bracket (ScalingFit.run_interval)
        low, high = p["predicted_ends"]
        log(f"  the bracket: the geometric mean of the surface and the best-loss power law, {low:.4f} and {high:.4f}")
    error = None
    if measured is not None:
        error = (predicted - measured) / measured
        log(
            f"  measured  val loss {measured:.4f}  "
            f"({error:+.2%} error; {'inside' if inside else 'OUTSIDE'} the interval)"
        )
    log("ledger (scalelab sweep ledger " + str(sweep_dir) + "):")
    log(ledger.format_ledger(ledger.read_ledger(sweep_dir)))
    if plot is not None:
        log(f"  plot: {png}")
    log(
        f"  wall time {wall:.0f} s (sweep {t_sweep:.0f} s, fit {t_fit:.0f} s, "
        f"proposed run {wall - t_sweep - t_fit:.0f} s)"
    )
    return dict(
        ok=measured is not None,
        predicted=predicted,
        interval=[lo, hi],
        measured=measured,
        error=error,
        inside=inside,
        wall_s=wall,
        png=str(png) if plot is not None else None,
        run_id=p["run_id"],
        params=fit["params"],
        intervals=fit["intervals"],
        gates=proposal["gates"],
    )


def _print_design(sweep, log) -> None:
    """Per budget, each run's size, tokens per step and steps, as its resolved config (what is stored
    in its config.json and trained) has them: the recipe's batch grows with a run's tokens, so the
    runs of one budget differ."""
    by_budget: dict[float, list] = {}
    for r in sweep.runs:
        by_budget.setdefault(r.labels["flops_budget"], []).append(r)
    for c, runs in by_budget.items():
        batches = [r.config["train"]["global_batch_tokens"] for r in runs]
        log(
            f"  C={c:.3g}: sizes "
            + ", ".join(f"{r.params / 1e3:.0f}k" for r in runs)
            + "; tokens/step "
            + ", ".join(str(b) for b in batches)
            + "; steps "
            + ", ".join(str(r.num_tokens // b) for r, b in zip(runs, batches))
        )


def _print_fit(proposal: dict[str, Any], log) -> None:
    fit, iv = proposal["fit"], proposal["intervals"]
    p = fit["params"]
    log(
        f"  fit of {fit['n_points']} runs ({fit['replicates']} bootstrap replicates, 95% percentile intervals), "
        f"law {law_heading(fit)}:"
    )
    for name in ("alpha", "beta", "E", "A", "B"):
        log(f"    {name:5s} = {p[name]:.4g}  [{iv[name][0]:.4g}, {iv[name][1]:.4g}]")
    log(f"    a = beta/(alpha+beta) = {fit['a']:.3f}  [{iv['a'][0]:.3f}, {iv['a'][1]:.3f}]   (N* ~ C^a)")
    for name, bt in fit["backtest"].items():
        if "mare" in bt:
            log(f"    backtest {name}: MARE {bt['mare']:.2%}, bias {bt['bias']:+.2%} on {bt['n_test']} runs")
    ext = fit["extrapolation"]
    if ext["per_decade"] is not None:
        log(
            f"    out-of-sample error {ext['per_decade']:.2%} per decade of extrapolation "
            f"(from {ext['n_runs']} backtest runs)"
        )
    if fit.get("stacked"):
        log("  " + "\n  ".join(format_stacked(fit["stacked"], indent="    ")))
    log("  " + format_gates(proposal["gates"]).replace("\n", "\n  "))
