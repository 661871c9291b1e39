"""scalelab.sweeps.closed_loop.far_runs: which runs of a closed-loop store score its first round."""

import polars as pl

from scalelab.sweeps.closed_loop.far_runs import far_runs


def test_compute_optimal_runs_and_new_budget_slices_past_the_design_score_it():
    runs = pl.DataFrame(
        {
            "run_id": ["design", "co", "co-failed", "slice-in", "slice-out", "bracket"],
            "status": ["done", "done", "failed", "done", "done", "done"],
            "proposal": [None, "compute_optimal", "compute_optimal", "new_budget", "new_budget", "bracket"],
            "flops_budget": [2e12, 6e12, 6e12, 2e12, 6.3e12, 8e12],
        }
    )
    assert far_runs(runs, largest=2e12)["run_id"].to_list() == ["co", "slice-out"]
    # a slice at the design's largest budget as written (rounded) is inside it
    assert far_runs(runs, largest=6.3e12 / 1.005)["run_id"].to_list() == ["co"]


def test_holdout_runs_past_the_design_score_it():
    """`sweep next --holdout` runs (the first-round protocol's 3x, 10x and 30x) were predicted before
    they trained: past the design they score it, inside it they do not."""
    runs = pl.DataFrame(
        {
            "run_id": ["design", "hold-3x", "hold-in", "hold-failed"],
            "status": ["done", "done", "done", "failed"],
            "proposal": [None, "holdout", "holdout", "holdout"],
            "flops_budget": [2e12, 6e12, 2e12, 2e13],
        }
    )
    assert far_runs(runs, largest=2e12)["run_id"].to_list() == ["hold-3x"]
