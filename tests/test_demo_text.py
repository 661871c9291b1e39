"""What the demo prints says what the records hold: each run's tokens per step as its resolved config
(the one stored in its config.json) has it, and the law that made the fit's numbers."""

import re

from scalelab.fitting.forms.fit_terms import law_heading, meaning
from scalelab.sweeps.closed_loop.demo import _print_design, demo_spec
from scalelab.sweeps.specs.spec import expand_sweep


def test_design_lines_give_each_runs_tokens_per_step_as_configured():
    sweep = expand_sweep(demo_spec(), default_name="demo")
    lines: list[str] = []
    _print_design(sweep, lines.append)
    by_budget: dict[float, list] = {}
    for r in sweep.runs:
        by_budget.setdefault(r.labels["flops_budget"], []).append(r)
    assert len(lines) == len(by_budget)
    for line, runs in zip(lines, by_budget.values()):
        shown = [int(x) for x in re.search(r"tokens/step ([\d, ]+);", line).group(1).split(", ")]
        assert shown == [r.config["train"]["global_batch_tokens"] for r in runs], line
        steps = [int(x) for x in re.search(r"steps ([\d, ]+)$", line).group(1).split(", ")]
        assert steps == [r.num_tokens // r.config["train"]["global_batch_tokens"] for r in runs]
    # the recipe's batch grows with a run's tokens: one budget holds runs of different batches
    assert any(len({r.config["train"]["global_batch_tokens"] for r in runs}) > 1 for runs in by_budget.values())


def test_a_stacked_fit_is_named_as_such_and_g_is_explained():
    record = {"law": "chinchilla", "stacked": {"weights": {"chinchilla": 0.85, "kaplan": 0.15}}}
    heading = law_heading(record)
    assert heading.startswith("auto: the stacked law (chinchilla 0.85, kaplan 0.15)") and "of chinchilla" in heading
    assert law_heading({"law": "kaplan"}) == "kaplan"
    assert "G (C/6)^a" in meaning("chinchilla", "G") and meaning("chinchilla", "E")


def test_the_quick_demo_expands_to_a_quarter_of_the_compute():
    """`scalelab demo --quick`: its grid builds (at 1/10 of the budgets it asked for sizes under the
    smallest model the shape rule makes, and exited 2), 4 sizes per budget, about a quarter of the FLOPs."""
    full, quick = expand_sweep(demo_spec()), expand_sweep(demo_spec(quick=True))
    assert len(quick.runs) == len(full.runs) == 12
    ratio = sum(r.flops_6n for r in quick.runs) / sum(r.flops_6n for r in full.runs)
    assert 0.2 < ratio < 0.3, ratio
