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
