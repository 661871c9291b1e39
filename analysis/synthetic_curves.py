"""A stand-in launcher whose runs log whole loss curves from a curve law, and stop early as their spec says.

    train = curve_trainer(CurveTruth(noise_sigma=0.003))
    train(expand_sweep(spec), "results/iso", spec_text=yaml.safe_dump(spec))   # as execute.launch is called
    store_curves("results/iso", source="val")                                 # the curve readers see ordinary runs

What scalelab.analysis.synthetic.synthetic_trainer is to the fits of final losses, this is to the
readers of loss curves (scalelab.sweeps.tracking.run_curves, the curve laws, early stopping): each
run gets the training loop's records (config.json, metrics.parquet at every `logging.interval_steps`,
evals.parquet with the `val` loss at every `eval.interval_steps` and at the last step, status.json,
`start` and `end` lines in events.jsonl), with the loss at step s

    L(s) = factor(run) * L_law(N, S1(s), S2(s)) * exp(run_sigma u + noise_sigma z_s)

from scalelab.fitting.selection.simulate.simulate_curve under the run's own LR schedule (the one the
loop would follow, run_curves.planned_lr): with the default lr_annealing law a WSD, a cosine and a
constant run of one size differ as the law says. `factor` is an optional function of the run (its
RunSpec) for what the curve law does not model, such as an LR optimum. The runs train one after
another in the launcher's order (longest first; cooldown branches after their stable runs, each
logging from its branch point). A spec with `early_stop:` gets the real rule
(scalelab.sweeps.tracking.early_stop.callback) at every checkpoint, on the records written up to it:
a run it stops keeps those records and the status `stopped_early` with the rule's prediction, as a
trained run does (scalelab.train.loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from scalelab import store
from scalelab.analysis.synthetic import noise_seed, record_launch
from scalelab.fitting.loss_curves.curves import RunCurve
from scalelab.fitting.selection.simulate import simulate_curve
from scalelab.store import ledger
from scalelab.store.atomic import atomic_write_json, atomic_write_parquet
from scalelab.store.records import EVALS_SCHEMA, METRICS_SCHEMA, write_status
from scalelab.sweeps.tracking import early_stop
from scalelab.sweeps.tracking.run_curves import planned_lr
from scalelab.train.stop_run import StopRun

# lr_annealing's parameters with areas in peak-LR tokens (fitting/forms/laws.py LRAnnealing): at the
# CPU sweeps' sizes (3e4-2e5 parameters, 1e5-1e7 tokens) losses of 3-5 nats, a few % annealing bonus
CURVE_PARAMS = {"E": 1.0, "A": 60.0, "B": 80.0, "C": 0.25, "alpha": 0.3, "beta": 0.3}


@dataclass(kw_only=True, frozen=True)
class CurveTruth:
    """The curve law the runs follow and its noise (the module docstring's formula)."""

    params: Mapping[str, float] = field(default_factory=lambda: dict(CURVE_PARAMS))
    law: str = "lr_annealing"  # or lr_annealing_sized (simulate_curve)
    decay: float = 0.99  # the annealing area's momentum
    factor: Callable[[object], float] | None = None  # a multiplier of a run's whole curve, from its RunSpec
    noise_sigma: float = 0.003  # per logged point, in log loss
    run_sigma: float = 0.0  # per run (a seed's offset), in log loss
    noise_seed: int = 0

    def curve(self, run) -> RunCurve:
        """The loss of every step 1..T of a resolved run (a RunSpec); the noise is a pure function of
        (noise_seed, run id)."""
        lr, tps = planned_lr(run.config)
        noise = {
            "noise_sigma": self.noise_sigma,
            "run_sigma": self.run_sigma,
            "seed": noise_seed(self.noise_seed, run.run_id),
        }
        shape = {"lr": lr, "tokens_per_step": tps, "decay": self.decay, "law": self.law}
        curve = simulate_curve(self.params, run_id=run.run_id, params=run.params, **shape, **noise)
        if self.factor is not None:
            curve.loss = curve.loss * float(self.factor(run))
        return curve


def _logged(first: int, last: int, every: int, num_steps: int) -> np.ndarray:
    """Steps in (first, last] that are multiples of `every` (0: none), and the run's last step."""
    steps = list(range(every * (first // every + 1), last + 1, every)) if every > 0 else []
    return np.array(sorted(set(steps) | ({num_steps} if last == num_steps else set())), dtype=np.int64)


def _write_records(run_dir: Path, run, curve: RunCurve, upto: int, noise_sigma: float) -> tuple[pl.DataFrame, ...]:
    """metrics.parquet and evals.parquet of the steps the run has taken (<= upto); returns both frames."""
    cfg, n = run.config, curve.num_steps
    tps = run.num_tokens // n
    start = int(run.labels.get("branch_step") or 0)  # a cooldown branch logs from its branch point
    per_token = run.flops_6n / run.num_tokens

    def frame(steps: np.ndarray) -> dict:
        loss = curve.loss[steps - 1]
        return {"step": steps, "tokens": steps * tps, "flops": steps * tps * per_token, "loss": loss}

    m = frame(_logged(start, upto, int(cfg["logging"]["interval_steps"]), n))
    metrics = pl.DataFrame(
        {**m, "lr": curve.lr[m["step"] - 1], "grad_norm": 1.0, "tokens_per_s": 1e5}, schema=METRICS_SCHEMA
    )
    e = frame(_logged(start, upto, int(cfg["eval"]["interval_steps"]), n))
    where = {k: e[k] for k in ("step", "tokens", "flops")}
    stderr = e["loss"] * noise_sigma if noise_sigma > 0 else None
    evals = pl.DataFrame(
        {**where, "task": "val", "metric": "loss", "value": e["loss"], "stderr": stderr}, schema=EVALS_SCHEMA
    )
    atomic_write_parquet(run_dir / "metrics.parquet", metrics)
    atomic_write_parquet(run_dir / "evals.parquet", evals)
    return metrics, evals


def _train_one(sweep_dir: Path, run, curve: RunCurve, noise_sigma: float) -> str:
    """One run's records, status and events; early stopping at its checkpoints when its spec asks.
    Returns its final state."""
    run_dir = store.run_path(sweep_dir, run.run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "config.json", run.config)
    n, tps = curve.num_steps, run.num_tokens // curve.num_steps
    sizes = {"params": run.params, "params_nonembed": run.params_nonembed, "num_steps": n, "tokens_per_step": tps}
    flops = {
        "flops_per_token_6n": run.flops_6n / run.num_tokens,
        "flops_6n": run.flops_6n,
        "flops_exact": run.flops_exact,
    }
    write_status(
        run_dir, "running", run_id=run.run_id, num_tokens=run.num_tokens, **sizes, **flops, attempts=1, synthetic=True
    )
    store.append_event(sweep_dir, "start", run.run_id, attempt=1, node="synthetic")
    stop = early_stop.callback(sweep_dir, run.run_id, run.config, run_dir=run_dir)
    if stop is not None:
        start = int(run.labels.get("branch_step") or 0)
        told = start
        for step in _logged(start, n - 1, int(run.config["checkpoint"]["interval_steps"]), n):
            metrics, _ = _write_records(run_dir, run, curve, int(step), noise_sigma)
            for row in metrics.filter(pl.col("step") > told).iter_rows(named=True):
                stop("step", row)
            told = int(step)
            try:
                stop("checkpoint", {"step": int(step)})
            except StopRun as e:
                write_status(run_dir, e.status, **e.record)
                store.append_event(sweep_dir, "end", run.run_id, status=e.status)
                return e.status
    metrics, evals = _write_records(run_dir, run, curve, n, noise_sigma)
    val, train = evals["value"].to_numpy(), metrics["loss"].to_numpy()
    final = {"final_val_loss": float(val[-1]), "best_val_loss": float(val.min()), "final_val_bpb": val[-1] / np.log(2)}
    tail = train[-max(1, train.size // 20) :]  # the loop's final train loss: the mean of the last 5% of rows
    write_status(run_dir, "done", **final, final_train_loss=float(tail.mean()), best_train_loss=float(train.min()))
    store.append_event(sweep_dir, "end", run.run_id, status="done")
    return "done"


def curve_trainer(truth: CurveTruth | None = None):
    """A stand-in for scalelab.sweeps.execution.execute.launch (the module docstring), with the same
    call and summary (states, trained, skipped, wall_s); the runs follow `truth` (default CurveTruth())."""
    truth = truth or CurveTruth()

    def train(sweep, sweep_dir, *, spec_text: str, spec_name: str = "sweep", log=print, **_launch_options) -> dict:
        t0 = time.time()
        sweep_dir = Path(sweep_dir)
        todo, skipped = record_launch(sweep, sweep_dir, spec_text, spec_name)
        todo.sort(key=lambda r: (r.depends_on is not None, -r.cost_flops))  # the launcher's waves, longest first
        for run in todo:
            _train_one(sweep_dir, run, truth.curve(run), truth.noise_sigma)
        ledger.score(sweep_dir)
        log(f"simulated {len(todo)} run(s) of {len(sweep.runs)} with loss curves")
        states = {r.run_id: store.run_state(store.run_location(sweep_dir, r.run_id)) for r in sweep.runs}
        return {"states": states, "trained": [r.run_id for r in todo], "skipped": skipped, "wall_s": time.time() - t0}

    return train
