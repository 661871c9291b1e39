"""Reading run tables (CSV, Parquet, polars frames, dicts) into validated numpy arrays for fitting.

One row per run (or per checkpoint): total parameters N, training tokens D, loss, and optionally
FLOPs C, a run id, a group label and a fit weight. Column names are mapped, so any table works:

    table = read_runs("runs.parquet", params_col="N", tokens_col="D", loss_col="final_loss")
    table.params, table.tokens, table.loss, table.flops, table.flops_source   # "column" or "6ND"

When the table has FLOPs but no tokens, tokens are derived as D = C / (6 N). Every problem with
the input (missing column, NaN, non-positive value, too few rows) raises UsageError/ConfigError
naming the column, which the CLI prints as one line with exit code 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import polars as pl

from scalelab.errors import ConfigError, UsageError


@dataclass(kw_only=True, slots=True)
class ColumnMap:
    """Names of the table's columns for each role (run_id/group are optional)."""

    params: str = "params"
    tokens: str = "tokens"
    loss: str = "loss"
    flops: str = "flops"
    run_id: str = "run_id"
    group: str = "group"
    unique_tokens: str = "unique_tokens"  # optional: the data-constrained law's U_D
    weight: str = "weight"  # optional: per-run fit weights (e.g. runs stopped early, sweeps/tracking/early_stop.py)


@dataclass(kw_only=True, slots=True)
class RunTable:
    """Validated per-run arrays. flops_source says whether C came from a column or from 6·N·D."""

    params: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    flops: np.ndarray
    flops_source: str
    tokens_source: str  # "column" or "flops/(6N)"
    run_id: np.ndarray  # str; row numbers when the table has no run ids
    group: np.ndarray | None
    unique_tokens: np.ndarray | None = None
    weight: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.params.size)

    def subset(self, mask_or_idx: np.ndarray) -> RunTable:
        return RunTable(
            params=self.params[mask_or_idx],
            tokens=self.tokens[mask_or_idx],
            loss=self.loss[mask_or_idx],
            flops=self.flops[mask_or_idx],
            flops_source=self.flops_source,
            tokens_source=self.tokens_source,
            run_id=self.run_id[mask_or_idx],
            group=None if self.group is None else self.group[mask_or_idx],
            unique_tokens=None if self.unique_tokens is None else self.unique_tokens[mask_or_idx],
            weight=None if self.weight is None else self.weight[mask_or_idx],
        )

    def law_inputs(self) -> dict[str, np.ndarray]:
        """The arrays under the input names the laws use (params, tokens, flops, unique_tokens)."""
        out = {"params": self.params, "tokens": self.tokens, "flops": self.flops}
        if self.unique_tokens is not None:
            out["unique_tokens"] = self.unique_tokens
        return out


def _to_frame(source) -> pl.DataFrame:
    if isinstance(source, pl.DataFrame):
        return source
    if isinstance(source, dict):
        try:
            return pl.DataFrame({k: np.asarray(v) for k, v in source.items()})
        except (ValueError, TypeError, pl.exceptions.PolarsError) as e:
            raise UsageError(f"cannot build a table from the given columns: {e}") from None
    if hasattr(source, "columns") and hasattr(source, "to_dict"):  # a pandas frame
        return pl.from_pandas(source)
    path = os.fspath(source)
    if not os.path.exists(path):
        raise ConfigError("DATA", f"{path} does not exist", "pass a CSV or Parquet file")
    lower = path.lower()
    try:
        if lower.endswith((".parquet", ".pq")):
            return pl.read_parquet(path)
        if lower.endswith((".csv", ".tsv", ".txt")):
            return pl.read_csv(path, separator="\t" if lower.endswith(".tsv") else ",", infer_schema_length=None)
    except (pl.exceptions.PolarsError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError("DATA", f"cannot read {path}: {first}") from None
    raise ConfigError("DATA", f"{path}: unknown file type", "use .csv or .parquet")


def _numeric(frame: pl.DataFrame, col: str, role: str) -> np.ndarray:
    try:
        # a writable copy: polars hands out read-only views, which torch warns about downstream
        arr = np.array(frame[col].cast(pl.Float64, strict=True).to_numpy(), dtype=float)
    except (pl.exceptions.PolarsError, ValueError):
        raise ConfigError(f"column '{col}'", f"the {role} column is not numeric") from None
    bad = ~np.isfinite(arr)
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise ConfigError(
            f"column '{col}'",
            f"{int(bad.sum())} NaN/missing/infinite value(s) (rows {rows})",
            "drop or fix those runs",
        )
    if np.any(arr <= 0):
        rows = np.flatnonzero(arr <= 0)[:5].tolist()
        raise ConfigError(f"column '{col}'", f"non-positive {role} value(s) (rows {rows})", "values must be > 0")
    return arr


def read_runs(source, *, columns: ColumnMap | None = None, min_rows: int = 1) -> RunTable:
    """Read and validate a run table.

    Args:
        source: path to a .csv/.parquet file, a polars (or pandas) DataFrame, or a dict of arrays.
        columns: column-name mapping (default: params, tokens, loss, flops, run_id, group).
        min_rows: fewer rows than this is an error (the fitter needs more points than parameters).
    Returns:
        RunTable with float arrays; tokens derived from flops when only flops is given, flops
        from 6·N·D when only tokens is given.
    Raises:
        ConfigError: a required column is missing, non-numeric, NaN or non-positive.
        UsageError: fewer than `min_rows` rows.
    """
    cols = columns or ColumnMap()
    frame = _to_frame(source)
    have = set(frame.columns)
    for role in ("params", "loss"):
        name = getattr(cols, role)
        if name not in have:
            raise ConfigError(
                f"column '{name}'",
                f"missing (the {role} column; table has {sorted(have)})",
                f"map it with --{role}-col",
            )
    if cols.tokens not in have and cols.flops not in have:
        raise ConfigError(
            f"column '{cols.tokens}'",
            f"missing, and no '{cols.flops}' column to derive it from (table has {sorted(have)})",
            "map it with --tokens-col or --flops-col",
        )
    if frame.height < min_rows:
        raise UsageError(f"the table has {frame.height} rows; at least {min_rows} are needed for this fit")
    params = _numeric(frame, cols.params, "params")
    loss = _numeric(frame, cols.loss, "loss")
    if cols.tokens in have:
        tokens, tokens_source = _numeric(frame, cols.tokens, "tokens"), "column"
    else:
        tokens, tokens_source = None, "flops/(6N)"
    if cols.flops in have:
        flops, flops_source = _numeric(frame, cols.flops, "flops"), "column"
    else:
        flops, flops_source = 6.0 * params * tokens, "6ND"
    if tokens is None:
        tokens = flops / (6.0 * params)
    run_id = (
        frame[cols.run_id].cast(pl.Utf8).to_numpy().astype(str)
        if cols.run_id in have
        else np.array([str(i) for i in range(frame.height)])
    )
    group = frame[cols.group].cast(pl.Utf8).to_numpy().astype(str) if cols.group in have else None
    unique = _numeric(frame, cols.unique_tokens, "unique_tokens") if cols.unique_tokens in have else None
    weight = _numeric(frame, cols.weight, "weight") if cols.weight in have else None
    return RunTable(
        unique_tokens=unique,
        weight=weight,
        params=params,
        tokens=tokens,
        loss=loss,
        flops=flops,
        flops_source=flops_source,
        tokens_source=tokens_source,
        run_id=run_id,
        group=group,
    )
