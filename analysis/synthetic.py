"""Synthetic sweep stores from a known law: how the analysis code (noise, comparison, plots, report)
is tested without training anything.

    law = SyntheticLaw(efficiency=1.5)                  # B: 1.5x more compute-efficient than law A
    write_synthetic_sweep("store/B", isoflop_design([1e13, 1e14, 1e15]), law, seeds=[0, 1, 2])
    load_runs("store/B")                                # the sweeps reader sees ordinary runs

Each run directory holds what scalelab.train writes (config.json from a real RunConfig, status.json,
metrics.parquet, evals.parquet with columns step, tokens, flops, task, metric, value, stderr), so
every reader is exercised on the real format. The losses come from

    L(N, D) = E + A / (s N)^alpha + B / (s D)^beta,   s = sqrt(efficiency)

so the compute-optimal frontier of a law with efficiency k is L*_1(k C): the model reaches with C
FLOPs the loss the reference law needs k C for. Noise model (all in loss units, natural log):
  - a per-run offset ~ N(0, seed_std) drawn from (seed, size, tokens): what changes between seeds;
  - a per-checkpoint term ~ N(0, checkpoint_std): evaluation/checkpoint-to-checkpoint noise;
  - task "synthetic/mc": bpb = task_bpb_slope * loss + task_bpb_offset (+ the same noise scaled),
    and acc = the fraction correct of `task_examples` Bernoulli draws with p = sigmoid(loss)
    (binomial sampling noise, the way a real benchmark's accuracy is noisy).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from scalelab import store
from scalelab.models.accounting import num_params, num_params_nonembedding
from scalelab.models.shapes import shape_for_width
from scalelab.store import files, ledger
from scalelab.store.atomic import atomic_write_bytes, atomic_write_json
from scalelab.store.paths import run_path
from scalelab.store.records import EVALS_SCHEMA, METRICS_SCHEMA
from scalelab.sweeps.specs.spec import expand_sweep, read_spec
from scalelab.train.config import build_run_config, to_dict
from scalelab.train.identity import config_hash

# CPU-sized shapes (num_layers, d_model) of the shape rule, total params with vocab 320 in comments
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = (
    (2, 64),  # 0.15M
    (3, 96),  # 0.39M
    (4, 128),  # 0.89M
    (5, 160),  # 1.7M
    (6, 192),  # 2.8M
    (8, 256),  # 6.6M
)


@dataclass(kw_only=True, slots=True)
class SyntheticLaw:
    """Chinchilla-form ground truth plus the noise model (module docstring)."""

    E: float = 1.7  # noqa: N815 - the law's own names
    A: float = 60.0  # noqa: N815
    B: float = 80.0  # noqa: N815
    alpha: float = 0.30
    beta: float = 0.28
    efficiency: float = 1.0  # compute multiplier relative to the same law with efficiency 1
    seed_std: float = 0.01  # per-run loss offset between seeds (nats)
    checkpoint_std: float = 0.005  # per-evaluation noise (nats)
    task_bpb_slope: float = 1.3  # task bpb per nat of loss
    task_bpb_offset: float = 0.2
    task_examples: int = 200  # examples behind the synthetic accuracy (binomial noise)
    acc_floor: float = 0.25  # chance accuracy of the synthetic 4-way task
    acc_mid_loss: float = 3.2  # loss at which accuracy is halfway between floor and 1
    acc_steepness: float = 3.0  # per nat

    def loss(self, params: np.ndarray | float, tokens: np.ndarray | float) -> np.ndarray:
        s = math.sqrt(self.efficiency)
        n = s * np.asarray(params, dtype=float)
        d = s * np.asarray(tokens, dtype=float)
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    def accuracy(self, loss: np.ndarray | float) -> np.ndarray:
        z = self.acc_steepness * (np.asarray(loss, dtype=float) - self.acc_mid_loss)
        return self.acc_floor + (1.0 - self.acc_floor) / (1.0 + np.exp(z))

    def params_dict(self) -> dict[str, float]:
        """The law's parameters as scalelab.fitting's chinchilla names them (efficiency folded in)."""
        s = math.sqrt(self.efficiency)
        return {
            "E": self.E,
            "A": self.A / s**self.alpha,
            "B": self.B / s**self.beta,
            "alpha": self.alpha,
            "beta": self.beta,
        }


@dataclass(kw_only=True, slots=True)
class DesignPoint:
    num_layers: int
    d_model: int
    num_tokens: int
    tags: dict[str, str] = field(default_factory=dict)


def isoflop_design(
    flops_budgets: Sequence[float],
    shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
    min_tokens_per_param: float = 1.0,
    max_tokens_per_param: float = 400.0,
) -> list[DesignPoint]:
    """Every shape at every budget (D = C / 6N), keeping tokens/param within the given band."""
    out = []
    for c in flops_budgets:
        for layers, width in shapes:
            n = num_params(shape_for_width(layers, width, 320))
            d = int(c / (6 * n))
            if min_tokens_per_param <= d / n <= max_tokens_per_param:
                out.append(
                    DesignPoint(num_layers=layers, d_model=width, num_tokens=d, tags={"flops_budget": f"{c:.3g}"})
                )
    return out


def noise_seed(*key) -> int:
    """A 64-bit seed that is a pure function of `key` (e.g. (noise_seed, run id)): a run's synthetic
    noise does not depend on which other runs are simulated, or in what order."""
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little")


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(noise_seed(*key))


def _run_config(point: DesignPoint, seed: int, tags: dict[str, str], name: str):
    model = to_dict(shape_for_width(point.num_layers, point.d_model, 320, max_seq_len=256))
    tokens_per_step = 64 * 256
    cfg = build_run_config(
        {
            "name": name,
            "model": model,
            "data": {"seq_len": 256},
            "train": {
                "num_tokens": max(point.num_tokens, 2 * tokens_per_step),
                "global_batch_tokens": tokens_per_step,
                "seed": seed,
            },
            "logging": {"wandb": "disabled", "progress": "off"},
            "tags": {**point.tags, **tags},
        }
    )
    return cfg, to_dict(cfg)


def _train_metrics(law: SyntheticLaw, n: int, steps: int, tps: int, lr: float, offset: float, rng):
    """metrics.parquet's rows (at most 40 steps) and their training losses: the law, the seed's
    offset and checkpoint noise."""
    flops_per_token = 6.0 * n
    metric_steps = np.unique(np.linspace(1, steps, num=min(steps, 40)).astype(int))
    train_loss = law.loss(n, metric_steps * tps) + offset + rng.normal(0, law.checkpoint_std, metric_steps.size)
    metrics = pl.DataFrame(
        {
            "step": metric_steps,
            "tokens": metric_steps * tps,
            "flops": metric_steps * tps * flops_per_token,
            "loss": train_loss,
            "lr": np.full(metric_steps.size, lr),
            "grad_norm": np.ones(metric_steps.size),
            "tokens_per_s": np.full(metric_steps.size, 1e5),
        },
        schema=METRICS_SCHEMA,
    )
    return metrics, train_loss


def _eval_rows(law: SyntheticLaw, n: int, tokens: int, step: int, offset: float, rng) -> list[dict]:
    """One checkpoint's four evaluation rows: validation loss and bpb, the task's bpb and accuracy."""
    flops_per_token = 6.0 * n
    true = float(law.loss(n, tokens)) + offset
    val = true + float(rng.normal(0.0, law.checkpoint_std))
    bpb_scale = 1.0 / math.log(2)
    common = dict(step=step, tokens=tokens, flops=tokens * flops_per_token)
    task_bpb = law.task_bpb_slope * val + law.task_bpb_offset
    p = float(law.accuracy(val))
    acc = rng.binomial(law.task_examples, p) / law.task_examples
    return [
        dict(common, task="val", metric="loss", value=val, stderr=law.checkpoint_std),
        dict(common, task="val", metric="bpb", value=val * bpb_scale, stderr=law.checkpoint_std * bpb_scale),
        dict(common, task="synthetic/mc", metric="bpb", value=task_bpb, stderr=law.task_bpb_slope * law.checkpoint_std),
        dict(
            common,
            task="synthetic/mc",
            metric="acc",
            value=float(acc),
            stderr=math.sqrt(max(p * (1 - p), 1e-12) / law.task_examples),
        ),
    ]


def _done_status(run_id: str, cfg, n: int, train_loss: np.ndarray, rows: list[dict]) -> dict:
    """status.json of a finished run, as the training loop writes it."""
    flops_per_token = 6.0 * n
    d_total = cfg.num_steps * cfg.tokens_per_step
    final_val = rows[-4]["value"]
    tail = train_loss[-max(1, train_loss.size // 20) :]
    return dict(
        status="done",
        run_id=run_id,
        params=n,
        params_nonembed=num_params_nonembedding(cfg.model),
        num_steps=cfg.num_steps,
        tokens_per_step=cfg.tokens_per_step,
        num_tokens=d_total,
        flops_per_token_6n=flops_per_token,
        flops_6n=flops_per_token * d_total,
        flops_exact=flops_per_token * d_total,
        final_train_loss=float(tail.mean()),
        best_train_loss=float(train_loss.min()),
        final_val_loss=final_val,
        best_val_loss=min(r["value"] for r in rows[::4]),
        final_val_bpb=final_val / math.log(2),
        synthetic=True,
    )


def write_synthetic_sweep(
    sweep_dir: str | Path,
    design: Sequence[DesignPoint],
    law: SyntheticLaw,
    *,
    seeds: Sequence[int] = (0,),
    tags: dict[str, str] | None = None,
    num_evals: int = 10,
    noise_seed: int = 0,
) -> list[str]:
    """Write a sweep store (sweep.yaml + runs/<run_id>/...) of design x seeds; returns the run ids.

    `noise_seed` changes every noise draw (use different values for two stores that must be
    independent); the draws are otherwise a pure function of (seed, shape, tokens).
    """
    sweep_dir = Path(sweep_dir)
    tags = {str(k): str(v) for k, v in (tags or {}).items()}
    atomic_write_bytes(store.SweepLayout(sweep_dir).spec, f"# synthetic sweep from {law}\n".encode())
    run_ids = []
    for point in design:
        for seed in seeds:
            cfg, cfg_dict = _run_config(point, seed, tags, name=f"L{point.num_layers}d{point.d_model}")
            run_id = config_hash(cfg)
            run_ids.append(run_id)
            n = num_params(cfg.model)
            steps = cfg.num_steps
            tps = cfg.tokens_per_step
            rng_seed = _rng(noise_seed, "seed", seed, point.num_layers, point.d_model, point.num_tokens, tags)
            offset = float(rng_seed.normal(0.0, law.seed_std))
            rng = _rng(noise_seed, "ckpt", seed, point.num_layers, point.d_model, point.num_tokens, tags)
            metrics, train_loss = _train_metrics(law, n, steps, tps, cfg.optim.lr, offset, rng)
            eval_steps = np.unique(np.linspace(steps / num_evals, steps, num=num_evals).round().astype(int))
            rows = [row for step in eval_steps for row in _eval_rows(law, n, int(step * tps), int(step), offset, rng)]
            run_dir = run_path(sweep_dir, run_id)
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(run_dir / "config.json", cfg_dict)
            metrics.write_parquet(run_dir / "metrics.parquet")
            pl.DataFrame(rows, schema=EVALS_SCHEMA).write_parquet(run_dir / "evals.parquet")
            atomic_write_json(run_dir / "status.json", _done_status(run_id, cfg, n, train_loss, rows))
    return run_ids


# A truth of the whole run: its loss from its resolved RunSpec (config, params, tokens), for what a
# law of N and D alone cannot say (the LR, the parametrization: the LR experiments' smoke tests).
RunTruth = Callable[[object], float]


def _true_loss(run, law: SyntheticLaw | dict[str, SyntheticLaw] | RunTruth) -> float:
    if isinstance(law, dict):  # a study's arms: a run takes the law of its `arm` label
        law = law[run.labels["arm"]]
    if isinstance(law, SyntheticLaw):
        return float(law.loss(run.params, run.num_tokens))
    return float(law(run))


def simulate_runs(
    sweep_dir: str | Path,
    runs,
    law: SyntheticLaw | dict[str, SyntheticLaw] | RunTruth,
    *,
    noise_std: float = 0.005,
    noise_seed: int = 0,
) -> None:
    """Finish resolved runs (scalelab.sweeps.specs.runspec.RunSpec) of a sweep as if trained: each gets its
    config.json and a done status.json whose final_val_loss is law.loss(N, D) times exp(noise),
    the noise a pure function of (noise_seed, run id). What `sweep next`, the ledger and the gates
    are tested and benchmarked on, with the truth known. `law` may map a study's arms to their
    laws (a run takes the law of its `arm` label), or be a RunTruth: a function of the run."""
    for run in runs:
        run_dir = run_path(sweep_dir, run.run_id)  # a Path, or an s3:// URL (objects written whole)
        rng = _rng(noise_seed, "sim", run.run_id)
        loss = _true_loss(run, law) * math.exp(float(rng.normal(0.0, noise_std)))
        atomic_write_json(files.join(run_dir, "config.json"), run.config)
        atomic_write_json(
            files.join(run_dir, "status.json"),
            dict(
                status="done",
                run_id=run.run_id,
                params=run.params,
                params_nonembed=run.params_nonembed,
                num_tokens=run.num_tokens,
                flops_6n=run.flops_6n,
                flops_exact=run.flops_exact,
                final_val_loss=loss,
                final_train_loss=loss,
                synthetic=True,
            ),
        )


def launch_synthetic(
    spec: dict | str | Path, sweep_dir: str | Path, law: SyntheticLaw | dict[str, SyntheticLaw], **noise
) -> list[str]:
    """`sweep launch` with the training replaced by `simulate_runs`: the spec (a mapping, or a spec
    file such as a round written by `sweep next`) is expanded and recorded in the store exactly as
    a real launch records it. Returns the run ids."""
    if isinstance(spec, dict):
        text, name = yaml.safe_dump(spec, sort_keys=False), str(spec.get("name", "sweep"))
    else:
        text, name, spec = files.read_text(spec), files.stem(spec), read_spec(spec)
    sweep = expand_sweep(spec, default_name=name)
    entries = [r.to_dict() for r in sweep.runs]
    store.init_sweep(sweep_dir, text, name, entries, sweep.name)
    todo = [r for r in sweep.runs if store.run_state(store.run_path(sweep_dir, r.run_id)) != "done"]
    simulate_runs(sweep_dir, todo, law, **noise)
    return [r.run_id for r in sweep.runs]


def record_launch(sweep, sweep_dir: str | Path, spec_text: str, spec_name: str) -> tuple[list, list[str]]:
    """What scalelab.sweeps.execution.execute.launch does before it trains, for a stand-in launcher:
    record the sweep (sweep.yaml, sweep.resolved.json) and link the runs a sibling sweep of the
    store root finished (store.attach_runs). Returns (the runs left to train, the ids already finished)."""
    entries = [r.to_dict() for r in sweep.runs]
    store.init_sweep(sweep_dir, spec_text, spec_name, entries, sweep.name)
    states = store.attach_runs(sweep_dir, [r.run_id for r in sweep.runs], current_id=None)
    todo = [r for r in sweep.runs if states[r.run_id] not in store.TERMINAL]
    return todo, [r.run_id for r in sweep.runs if states[r.run_id] in store.TERMINAL]


def synthetic_trainer(law: SyntheticLaw | dict[str, SyntheticLaw] | RunTruth, **noise):
    """A stand-in for scalelab.sweeps.execution.execute.launch
    (scalelab.sweeps.closed_loop.rounds.LaunchOptions.trainer): records the sweep as a launch does,
    links the runs a sibling sweep of the store root finished (`record_launch`) and finishes the
    others with `simulate_runs`, so the closed loop, studies included, runs through its own code
    with the truth known. Returns launch's summary (states, trained, skipped)."""

    def train(sweep, sweep_dir, *, spec_text: str, spec_name: str = "sweep", log=print, **_launch_options) -> dict:
        todo, skipped = record_launch(sweep, sweep_dir, spec_text, spec_name)
        simulate_runs(sweep_dir, todo, law, **noise)
        ledger.score(sweep_dir)
        log(f"simulated {len(todo)} run(s) of {len(sweep.runs)}")
        states = {r.run_id: store.run_state(store.run_location(sweep_dir, r.run_id)) for r in sweep.runs}
        return {"states": states, "trained": [r.run_id for r in todo], "skipped": skipped}

    return train
