"""Systematic shifts of evaluation scores between setups, against the evaluation's noise.

    table = parity_table(per_example, reference="reference", noise=store_noise, compare=per_example_b)
    print(format_parity(table))

`per_example` has one row per (setup, task, example, metric) for one checkpoint, the reference
setup labelled `reference`. For each other setup, task and metric the examples are paired:
    shift      mean over examples of (setup value - reference value): the systematic part
    lo, hi     95% paired-bootstrap interval of the shift (examples resampled with replacement)
    eval_se    the reference score's own standard error (finite examples: sd / sqrt(n))
    store_noise seed and checkpoint noise of that (task, metric) from the store's noise analysis
               (sqrt(seed_std^2 + ckpt_std^2)), when given
    noise      store_noise when known, else eval_se
    ratio      |shift| / noise
    verdict    "flips ranking" when a second checkpoint is given and the sign of (this - other)
               differs between the reference and the setup; else "shifts" when ratio > `fraction`
               (default 0.25: a shift a quarter of the noise reorders close checkpoints); else
               "detected" when the interval excludes zero (systematic, but small against the noise)
               and the shift exceeds float rounding (1e-6 relative); else "ok"
The bootstrap is seeded: the same scores give the same table.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from scalelab.fitting.estimate.intervals import percentile_interval

REFERENCE = "reference"
FRACTION = 0.25
REPLICATES = 2000
ROUNDING = 1e-6  # relative shifts below this are float rounding (fp32 sums in another order), not setups


def paired_shift(ref: np.ndarray, var: np.ndarray, *, replicates: int = REPLICATES, seed: int = 0) -> tuple:
    """(mean of var - ref, 2.5% and 97.5% paired-bootstrap quantiles)."""
    d = np.asarray(var, float) - np.asarray(ref, float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(replicates, len(d)))
    means = d[idx].mean(axis=1)
    return float(d.mean()), *percentile_interval(means, 0.95)


def _pivot(frame: pl.DataFrame, setup: str, task: str, metric: str) -> np.ndarray:
    sel = frame.filter((pl.col("setup") == setup) & (pl.col("task") == task) & (pl.col("metric") == metric))
    return sel.sort("example")["value"].to_numpy()


def parity_table(
    per_example: pl.DataFrame,
    *,
    noise: dict[tuple[str, str], float] | None = None,
    compare: pl.DataFrame | None = None,
    fraction: float = FRACTION,
    replicates: int = REPLICATES,
) -> pl.DataFrame:
    """One row per (setup, task, metric) with the columns of the module docstring."""
    rows = []
    setups = [s for s in per_example["setup"].unique(maintain_order=True) if s != REFERENCE]
    keys = list(per_example.select("task", "metric").unique(maintain_order=True).iter_rows())
    for setup in setups:
        for task, metric in keys:
            ref, var = _pivot(per_example, REFERENCE, task, metric), _pivot(per_example, setup, task, metric)
            if len(ref) != len(var) or len(ref) < 2:
                raise ValueError(f"{setup} / {task} / {metric}: {len(var)} examples against {len(ref)}")
            shift, lo, hi = paired_shift(ref, var, replicates=replicates)
            eval_se = float(ref.std(ddof=1) / math.sqrt(len(ref)))
            store = (noise or {}).get((task, metric), math.nan)
            scale = store if not math.isnan(store) else eval_se
            ratio = abs(shift) / scale if scale > 0 else (math.inf if shift else 0.0)
            systematic = (lo > 0 or hi < 0) and abs(shift) > ROUNDING * max(1.0, abs(float(ref.mean())))
            verdict = "shifts" if ratio > fraction else ("detected" if systematic else "ok")
            flip = math.nan
            if compare is not None:
                other_ref, other_var = _pivot(compare, REFERENCE, task, metric), _pivot(compare, setup, task, metric)
                before, after = ref.mean() - other_ref.mean(), var.mean() - other_var.mean()
                flip = float(np.sign(before) != np.sign(after))
                if flip:
                    verdict = "flips ranking"
            rows.append(
                dict(
                    setup=setup,
                    task=task,
                    metric=metric,
                    n=len(ref),
                    reference=float(ref.mean()),
                    shift=shift,
                    lo=lo,
                    hi=hi,
                    eval_se=eval_se,
                    store_noise=store,
                    noise=scale,
                    ratio=ratio,
                    ranking_flips=flip,
                    verdict=verdict,
                )
            )
    return pl.DataFrame(rows)


def top_movers(per_example: pl.DataFrame, setup: str, task: str, metric: str = "logprob", k: int = 5) -> pl.DataFrame:
    """The k examples whose value moves most between the reference and `setup` (to trace a shift)."""
    ref = per_example.filter((pl.col("setup") == REFERENCE) & (pl.col("task") == task) & (pl.col("metric") == metric))
    var = per_example.filter((pl.col("setup") == setup) & (pl.col("task") == task) & (pl.col("metric") == metric))
    joined = ref.select("example", pl.col("value").alias("reference")).join(
        var.select("example", pl.col("value").alias("setup")), on="example"
    )
    return (
        joined.with_columns(delta=pl.col("setup") - pl.col("reference"))
        .sort(pl.col("delta").abs(), descending=True)
        .head(k)
    )


def format_parity(table: pl.DataFrame) -> str:
    """A fixed-width table: setup, task, metric, shift [interval], noise, ratio, verdict."""
    head = (
        f"{'setup':<18} {'task':<28} {'metric':<9} {'reference':>10} {'shift':>10} {'95% interval':>23} "
        f"{'noise':>9} {'|shift|/noise':>13}  verdict"
    )
    lines = [head, "-" * len(head)]
    for r in table.iter_rows(named=True):
        src = "" if math.isnan(r["store_noise"]) else "*"
        lines.append(
            f"{r['setup']:<18} {r['task'][:28]:<28} {r['metric']:<9} {r['reference']:>10.4f} {r['shift']:>+10.2e} "
            f"[{r['lo']:>+10.2e},{r['hi']:>+10.2e}] {r['noise']:>8.2e}{src or ' '} {r['ratio']:>13.2f}  {r['verdict']}"
        )
    lines.append("noise: the reference score's standard error over examples (* = the store's seed + checkpoint noise)")
    return "\n".join(lines)
