"""`scalelab demo`: the closed loop end to end on a laptop CPU (local Ray), in under 10 minutes.

1. An IsoFLOP sweep of tiny Llama models (byte tokenizer, the default stdlib corpus): 3 FLOP budgets
   x 4 sizes, every run a Ray Tune trial.
2. The fit (Chinchilla, Approach 3) with backtest and bootstrap intervals, and the proposal of the
   next round: one compute-optimal run at 3x the largest budget (`sweep next`).
3. That run, launched into the same sweep.
4. Predicted vs measured loss of that run with the 95% interval, and a PNG of the IsoFLOP curves
   (points: runs; lines: the fitted law along each budget) and the frontier N*(C).

    run_demo("results/demo")      # prints as it goes; returns the numbers it printed

The sweep lives at <out>/isoflop (the store root is <out>), so running the demo again trains
nothing it has already trained. wandb is disabled in the demo (it costs seconds per run on a CPU).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from scalelab.sweeps import store


def demo_spec(quick: bool = False) -> dict[str, Any]:
    """The demo's IsoFLOP spec. Budgets in FLOPs (6ND); quick = 1/6 of the compute (smoke tests)."""
    scale = 1 / 6 if quick else 1.0
    return {
        "name": "demo-isoflop",
        "description": "scalelab demo: tiny IsoFLOP sweep on CPU",
        "base": {
            "data": {"seq_len": 64, "val_sequences": 64},
            "train": {"global_batch_tokens": 1024, "seed": 0},
            "optim": {"lr": 3e-3, "weight_decay": 0.1},
            "schedule": {"name": "cosine", "warmup_fraction": 0.05},
            "eval": {"interval_steps": 0, "val_batch_sequences": 32},
            "checkpoint": {"interval_steps": 0, "keep_last": 1},
            "logging": {"wandb": "disabled", "progress": "off"},
        },
        "isoflop": {
            "budgets": [float(f"{b * scale:.3g}") for b in (3e10, 1e11, 3e11)],
            "num_sizes": 4,
            "params": [3.4e4, 1.5e5],
            "tolerance": 0.05,
        },
        "execution": {"max_failures": 2, "cpus_per_run": 1},
        "fit": {"law": "chinchilla", "loss": "final_val_loss", "bootstrap": 48},
    }


def run_demo(
    out: str | Path = "results/demo",
    *,
    quick: bool = False,
    num_cpus: int | None = None,
    address: str | None = None,
    log=print,
) -> dict[str, Any]:
    from scalelab.sweeps.execute import launch
    from scalelab.sweeps.propose import format_proposal, propose_next
    from scalelab.sweeps.spec import expand_sweep, load_sweep

    t0 = time.time()
    sweep_dir = Path(out) / "isoflop"
    spec = demo_spec(quick)
    text = yaml.safe_dump(spec, sort_keys=False)
    sweep = expand_sweep(spec, default_name="demo")
    log(f"[1/4] IsoFLOP sweep: {len(sweep.runs)} runs at budgets {spec['isoflop']['budgets']} -> {sweep_dir}")
    result = launch(sweep, sweep_dir, spec_text=text, spec_name="demo", address=address, num_cpus=num_cpus, log=log)
    if any(s != "done" for s in result["states"].values()):
        log("some runs did not finish; see `scalelab sweep status " + str(sweep_dir) + "`")
        return {"ok": False}
    t_sweep = time.time() - t0

    largest = max(spec["isoflop"]["budgets"])
    next_budget = 3 * largest
    log(f"[2/4] fit + proposal: one compute-optimal run at {next_budget:.3g} FLOPs (3x the largest budget)")
    existing = _existing_round(sweep_dir)
    if existing is None:
        proposal = propose_next(sweep_dir, target_flops=next_budget, budget_flops=next_budget, step=3.0, log=log)
    else:  # a rerun of the demo: keep the proposal made the first time
        proposal = existing
    log(format_proposal(proposal))
    t_fit = time.time() - t0 - t_sweep

    log("[3/4] the proposed run")
    nxt = load_sweep(proposal["spec_path"])
    launch(
        nxt,
        sweep_dir,
        spec_text=Path(proposal["spec_path"]).read_text(),
        spec_name=Path(proposal["spec_path"]).stem,
        address=address,
        num_cpus=num_cpus,
        log=log,
    )
    run = nxt.runs[0]
    status = store.read_status(store.run_path(sweep_dir, run.run_id)) or {}
    measured = status.get("final_val_loss")
    predicted = proposal["proposals"][0]["predicted_loss"]
    lo, hi = proposal["proposals"][0]["predicted_interval"]
    png = sweep_dir / "demo_isoflop.png"
    _plot(sweep_dir, proposal, run.run_id, measured, png)
    wall = time.time() - t0
    inside = measured is not None and lo <= measured <= hi
    log("[4/4] predicted vs measured")
    log(f"  run {run.run_id}: N={run.params:,} params, D={run.num_tokens:,} tokens, C={run.flops_6n:.3g} FLOPs")
    log(f"  predicted val loss {predicted:.4f}  95% interval [{lo:.4f}, {hi:.4f}]")
    if measured is not None:
        log(
            f"  measured  val loss {measured:.4f}  ({(predicted - measured) / measured:+.2%} error; "
            f"{'inside' if inside else 'OUTSIDE'} the interval)"
        )
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
        inside=inside,
        wall_s=wall,
        png=str(png),
        run_id=run.run_id,
    )


def _existing_round(sweep_dir: Path) -> dict[str, Any] | None:
    import json

    fit = sweep_dir / "fits" / "round_1.json"
    return json.loads(fit.read_text()) if fit.exists() else None


def _plot(sweep_dir: Path, proposal: dict[str, Any], run_id: str, measured: float | None, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import polars as pl

    from scalelab.fitting.laws import get_law
    from scalelab.sweeps.propose import _optimum

    law, params = get_law(proposal["law"]), proposal["params"]
    df = store.load_runs(sweep_dir).filter((pl.col("status") == "done") & pl.col("flops_budget").is_not_null())
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    budgets = sorted(set(df["flops_budget"].to_list()))
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, len(budgets) + 1))
    best_n, best_c = [], []
    for color, c in zip(colors, budgets):
        sub = df.filter(pl.col("flops_budget") == c).sort("params")
        ax1.scatter(sub["params"], sub["final_val_loss"], color=color, label=f"C={c:.2g}")
        n = np.geomspace(sub["params"].min() / 1.5, sub["params"].max() * 1.5, 60)
        ax1.plot(n, law.predict(params, params=n, tokens=c / (6 * n)), color=color, lw=1)
        i = int(np.argmin(sub["final_val_loss"].to_numpy()))
        best_n.append(sub["params"][i])
        best_c.append(c)
    p = proposal["proposals"][0]
    c_next = p["budget"]
    n = np.geomspace(min(df["params"].min(), p["params"]) / 1.5, df["params"].max() * 1.5, 60)
    ax1.plot(
        n,
        law.predict(params, params=n, tokens=c_next / (6 * n)),
        color=colors[-1],
        lw=1,
        ls="--",
        label=f"C={c_next:.2g} (predicted)",
    )
    lo, hi = p["predicted_interval"]
    ax1.errorbar(
        [p["params"]],
        [p["predicted_loss"]],
        yerr=[[p["predicted_loss"] - lo], [hi - p["predicted_loss"]]],
        fmt="D",
        color="black",
        mfc="none",
        capsize=4,
        label="proposed: predicted 95%",
    )
    if measured is not None:
        ax1.scatter([p["params"]], [measured], marker="*", s=140, color="crimson", zorder=5, label="proposed: measured")
    ax1.set(xscale="log", xlabel="parameters N", ylabel="final val loss (nats/token)", title="IsoFLOP curves")
    ax1.legend(fontsize=7)
    cs = np.geomspace(min(best_c) / 2, c_next * 3, 50)
    ax2.plot(cs, [_optimum(law, params, c)[0] for c in cs], color="black", lw=1, label="fit: N*(C)")
    ax2.scatter(best_c, best_n, color=colors[: len(best_c)], label="best run per budget")
    ax2.scatter([c_next], [p["params"]], marker="*", s=140, color="crimson", label="proposed run")
    ax2.set(xscale="log", yscale="log", xlabel="FLOPs C (6ND)", ylabel="N", title="compute-optimal frontier")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(png)
    plt.close(fig)
