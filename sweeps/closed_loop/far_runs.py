"""The runs of a closed-loop store that score its first round: those past the first design's budgets.

    far = far_runs(store.load_runs(sweep_dir), largest=max(first_round_budgets))

A store that `run_rounds` (or `sweep next`) grew from an IsoFLOP design holds, besides the design, the
compute-optimal runs each round proposed at its next budget, sometimes a gate-fixing round's
IsoFLOP slice at a budget past the design's (proposal `new_budget`), and the held-out runs
`sweep next --holdout` proposed past it (proposal `holdout`, experiments/first_round_store.py). All
were predicted before they trained, so all score an extrapolation; a slice or holdout inside the
design's budgets does not.
The closed-loop experiments (experiments/closed_loop.py, score_store.py, design_distance.py,
extrapolation_variants.py) score exactly these runs.
"""

from __future__ import annotations

import polars as pl

# A budget counts as past the design's largest beyond this factor (budgets are written rounded).
PAST = 1.01


def far_runs(runs: pl.DataFrame, largest: float) -> pl.DataFrame:
    """The finished runs of `runs` (store.load_runs' table) that score a first round whose largest
    budget is `largest`: every compute-optimal run, and the `new_budget` and `holdout` runs past `largest`."""
    past = pl.col("flops_budget") > PAST * largest
    beyond = (pl.col("proposal") == "compute_optimal") | (pl.col("proposal").is_in(["new_budget", "holdout"]) & past)
    return runs.filter((pl.col("status") == "done") & beyond)
