"""Run tables from elsewhere (CSV/Parquet exports of another framework) as the frames analysis takes.

    runs, evals = task_frames("olmo_ladder.csv", task="arc_easy")
    predict_task(runs, evals, task="arc_easy", params=1e9, tokens=2e10)

A table has one row per run, or one per checkpoint of each run, with columns:

    params, tokens                  N and D (D = tokens seen at that checkpoint)
    run_id (optional)               rows sharing it are checkpoints of one run (default: one run
                                    per distinct (params, final tokens) when `step` is absent)
    step (optional)                 checkpoint order (default: tokens)
    <task>/<metric> or eval/<task>/<metric>     e.g. arc_easy/bpb, arc_easy/acc (as `sweep export` writes)
    <task>/<metric>_stderr (optional)           the eval's standard error

`task_frames` returns the runs frame (run_id, params, tokens = final tokens, flops, and the grouping
keys the noise analysis reads: runs with the same N and D are treated as seeds of one config) and
the long per-checkpoint evals frame (run_id, step, tokens, flops, task, metric, value, stderr).
"""

from __future__ import annotations

import hashlib
import os

import polars as pl

from scalelab.errors import ConfigError, UsageError


def read_table(source) -> pl.DataFrame:
    """A polars frame from a CSV/Parquet path (or a frame as is)."""
    if isinstance(source, pl.DataFrame):
        return source
    path = os.fspath(source)
    if not os.path.exists(path):
        raise ConfigError("TABLE", f"{path} does not exist", "pass a CSV or Parquet file or a sweep directory")
    try:
        if path.lower().endswith((".parquet", ".pq")):
            return pl.read_parquet(path)
        return pl.read_csv(path, infer_schema_length=None)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise ConfigError("TABLE", f"cannot read {path}: {str(e).splitlines()[0]}") from None


def _metric_columns(frame: pl.DataFrame, task: str) -> dict[str, tuple[str, str | None]]:
    """metric -> (value column, stderr column or None) for `task`."""
    out = {}
    for prefix in (f"eval/{task}/", f"{task}/"):
        for col in frame.columns:
            if col.startswith(prefix) and not col.endswith("_stderr"):
                metric = col[len(prefix) :]
                err = f"{col}_stderr"
                out.setdefault(metric, (col, err if err in frame.columns else None))
    return out


def task_frames(source, *, task: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(runs, evals) frames of `task` from a run/checkpoint table (module docstring).

    Raises:
        ConfigError / UsageError: a missing params/tokens column, no column for the task (the message
            lists the tasks the table has), non-numeric values.
    """
    frame = read_table(source)
    for col in ("params", "tokens"):
        if col not in frame.columns:
            raise ConfigError(f"column '{col}'", f"missing (table has {sorted(frame.columns)})", "add or rename it")
    metrics = _metric_columns(frame, task)
    if not metrics:
        have = sorted({c.split("/")[-2] for c in frame.columns if c.count("/") >= 1 and not c.endswith("_stderr")})
        raise UsageError(f"no '{task}/<metric>' column; tasks in this table: {', '.join(have) or 'none'}")
    try:
        frame = frame.with_columns(pl.col("params").cast(pl.Float64), pl.col("tokens").cast(pl.Float64))
    except pl.exceptions.PolarsError:
        raise ConfigError("column 'params'", "params and tokens must be numeric") from None
    if "run_id" not in frame.columns:
        if "step" in frame.columns:
            raise UsageError("a checkpoint table (with a step column) needs a run_id column")
        frame = frame.with_columns(pl.format("N{}-D{}", pl.col("params"), pl.col("tokens")).alias("run_id"))
    if "step" not in frame.columns:
        frame = frame.with_columns(pl.col("tokens").alias("step"))
    frame = frame.with_columns(pl.col("run_id").cast(pl.Utf8), pl.col("step").cast(pl.Int64))
    longs = []
    for metric, (col, err) in metrics.items():
        longs.append(
            frame.select(
                "run_id",
                "step",
                "tokens",
                (6.0 * pl.col("params") * pl.col("tokens")).alias("flops"),
                pl.lit(task).alias("task"),
                pl.lit(metric).alias("metric"),
                pl.col(col).cast(pl.Float64).alias("value"),
                (pl.col(err).cast(pl.Float64) if err else pl.lit(None, dtype=pl.Float64)).alias("stderr"),
            ).drop_nulls("value")
        )
    evals = pl.concat(longs).sort("run_id", "step")
    runs = (
        frame.sort("step")
        .group_by("run_id", maintain_order=True)
        .agg(pl.col("params").last(), pl.col("tokens").last())
        .with_columns((6.0 * pl.col("params") * pl.col("tokens")).alias("flops"))
    )
    keys = [_key(p, d) for p, d in zip(runs["params"], runs["tokens"])]
    runs = runs.with_columns(
        pl.Series("seed_group", keys), pl.Series("scale", keys), pl.lit("table").alias("candidate")
    )
    return runs, evals


def _key(params: float, tokens: float) -> str:
    return hashlib.sha256(f"{params:.6g}/{tokens:.6g}".encode()).hexdigest()[:10]
