"""Reading a sweep store for analysis: runs (via scalelab.store.load_runs), their per-checkpoint
evaluations and loss curves, and the keys that group runs.

    runs = load_store_runs("results/isoflop")          # load_runs + run_dir, seed_group, candidate, scale
    evals = load_evals(runs)                           # one row per (run, step, task, metric)
    curves = load_metrics(runs)                        # one row per (run, logged step)

Grouping keys are hashes of parts of each run's config.json:
  seed_group  the config without train.seed, train.data_seed and name: runs that differ only by seeds;
  scale       the model shape (layers, widths, heads) and train.num_tokens: "how big" a run is;
  candidate   the config without seed, name, model shape, token count and the design labels
              (flops_budget, ...): what a decision is about (a recipe, an architecture, an lr).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import polars as pl

from scalelab.errors import UsageError
from scalelab.store import load_runs, runs_dir

_DESIGN_TAGS = ("flops_budget", "tokens_per_param", "generator", "spec", "round", "proposal", "sample")


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


_SHAPE_FIELDS = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "vocab_size", "max_seq_len")


def _keys(config: dict) -> dict[str, str]:
    cfg = copy.deepcopy(config)
    cfg.pop("name", None)
    cfg.get("train", {}).pop("seed", None)
    cfg.get("train", {}).pop("data_seed", None)
    seed_group = _hash(cfg)
    model = cfg.get("model") or {}
    shape = {k: model.pop(k, None) for k in _SHAPE_FIELDS}
    scale = _hash([shape, cfg.get("train", {}).pop("num_tokens", None)])
    tags = cfg.get("tags") or {}
    for k in _DESIGN_TAGS:
        tags.pop(k, None)
    return {"seed_group": seed_group, "scale": scale, "candidate": _hash(cfg)}


def _run_dirs(path: Path) -> dict[str, Path]:
    """run_id -> run directory for a sweep dir or a store root holding sweep dirs."""
    out: dict[str, Path] = {}
    sweeps = [path] if runs_dir(path).is_dir() else sorted(p for p in path.iterdir() if runs_dir(p).is_dir())
    for sweep in sweeps:
        for run in sorted(runs_dir(sweep).iterdir()):
            if run.is_dir() and not run.name.startswith("."):
                out.setdefault(run.name, run)
    return out


def load_store_runs(path: str | Path, *, done_only: bool = True) -> pl.DataFrame:
    """load_runs(path) plus run_dir, seed_group, scale and candidate columns (see module docstring)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UsageError(f"{path} does not exist; pass a sweep directory (holding runs/) or a store root")
    df = load_runs(path)
    if done_only and "status" in df.columns:
        df = df.filter(pl.col("status") == "done")
    if df.is_empty():
        raise UsageError(f"{path} holds no finished runs")
    dirs = _run_dirs(path)
    extra = []
    for run_id in df["run_id"]:
        run_dir = dirs.get(run_id)
        cfg_file = run_dir / "config.json" if run_dir is not None else None
        config = json.loads(cfg_file.read_text()) if cfg_file is not None and cfg_file.exists() else {}
        extra.append({"run_dir": str(run_dir) if run_dir else None, **_keys(config)})
    return pl.concat([df, pl.DataFrame(extra)], how="horizontal")


def load_evals(runs: pl.DataFrame) -> pl.DataFrame:
    """Per-checkpoint eval rows of every run: run_id, step, tokens, flops, task, metric, value, stderr."""
    frames = []
    for run_id, run_dir in zip(runs["run_id"], runs["run_dir"]):
        path = Path(run_dir) / "evals.parquet" if run_dir else None
        if path is None or not path.exists():
            continue
        df = pl.read_parquet(path)
        if df.is_empty():
            continue
        frames.append(
            df.select(
                pl.lit(run_id).alias("run_id"),
                "step",
                "tokens",
                pl.col("flops").cast(pl.Float64),
                "task",
                "metric",
                pl.col("value").cast(pl.Float64),
                pl.col("stderr").cast(pl.Float64),
            )
        )
    if not frames:
        raise UsageError("no run of this store has an evals.parquet; run `scalelab eval` on its runs first")
    return pl.concat(frames)


def load_metrics(runs: pl.DataFrame) -> pl.DataFrame:
    """Per-step training records of every run: run_id, step, tokens, flops, loss."""
    frames = []
    for run_id, run_dir in zip(runs["run_id"], runs["run_dir"]):
        path = Path(run_dir) / "metrics.parquet" if run_dir else None
        if path is None or not path.exists():
            continue
        df = pl.read_parquet(path, columns=["step", "tokens", "flops", "loss"])
        frames.append(df.with_columns(pl.lit(run_id).alias("run_id"), pl.col("flops").cast(pl.Float64)))
    if not frames:
        raise UsageError("no run of this store has a metrics.parquet")
    return pl.concat(frames)


def lower_is_better(metric: str) -> bool:
    """acc-like metrics improve upwards; losses, bpb and perplexities downwards."""
    return not metric.startswith("acc") and metric not in ("exact_match", "f1", "pass@1")
