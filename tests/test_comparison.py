"""Is B better than A has one owner (fitting/comparisons/comparison.py): one result, one computation of the
multiplier's intervals, one verdict writer, for `scalelab compare` and the studies alike. Hand-made
laws and draws, no fit: well under a second."""

import math

import numpy as np
import pytest

from scalelab.fitting.comparisons.comparison import Comparison, SideFit, compare_laws_at, target_interval, verdict
from scalelab.fitting.comparisons.gap import GapInterval
from scalelab.fitting.forms.laws import get_law

LAW = get_law("chinchilla")
A = {"E": 1.7, "A": 400.0, "B": 410.0, "alpha": 0.34, "beta": 0.28}
B = dict(A, A=300.0)  # B's parameter term is smaller: B reaches A's loss with less compute


def _draws(params, seed, n=40, sd=0.002):
    rng = np.random.default_rng(seed)
    return [{k: v * math.exp(sd * rng.standard_normal()) for k, v in params.items()} for _ in range(n)]


def _compare(**evidence):
    return compare_laws_at(
        "a",
        LAW,
        A,
        _draws(A, 0),
        "b",
        LAW,
        B,
        _draws(B, 1),
        budgets=[1e18, 1e19, 1e20],
        target=1e22,
        slope_grid=np.geomspace(1e18, 1e20, 5),
        largest=1e20,
        level=0.9,
        **evidence,
    )


def test_a_compare_and_a_study_get_the_same_multiplier_from_the_same_laws():
    side = SideFit(name="a", law="chinchilla", params=A, draws=np.zeros((0, 5)), n_runs=9, flops_range=(1e18, 1e20))
    plain = _compare(sides=(side, side))
    gap = GapInterval(point=-0.02, lo=-0.03, hi=-0.01, level=0.9, parts={"bootstrap": 0.005}, estimator="separate")
    study = _compare(gap=gap, separate_gap=gap, estimator="separate", losses={"a": [gap], "b": [gap]})
    assert type(plain) is type(study) is Comparison
    for key in ("multipliers", "intervals", "multiplier_at_target", "target_interval", "slope", "slope_interval"):
        assert getattr(plain, key) == getattr(study, key), key
    assert plain.multiplier_at_target > 1 and plain.target_interval[0] > 1  # B needs less compute
    # the study's design scoring narrows the same interval its verdict reads
    lo, hi = target_interval(LAW, _draws(A, 0), LAW, _draws(B, 1), 1e22, 0.9)
    assert (lo, hi) == plain.target_interval
    # compare --json keeps its keys; a study's comparison carries its gap, winner and parts
    assert list(plain.to_dict()) == ["a", "b", "level", "budgets", "target", "slope", "verdict"]
    assert {"gap", "gap_parts", "separate_gap", "paired", "winner", "decided", "notes"} <= set(study.to_dict())


def test_one_verdict_writer_reads_the_gap_when_there_is_one_else_the_multiplier():
    plain = _compare()
    text = verdict(plain)
    assert text.startswith("The data support 'b is better' at C = 1e+22 FLOPs (100x the largest shared budget)")
    assert plain.winner == "b" and plain.decided
    # a study: the gap decides, even where the multiplier alone would say B
    gap = GapInterval(point=0.001, lo=-0.004, hi=0.006, level=0.9, parts={}, estimator="separate")
    study = _compare(gap=gap, separate_gap=gap, estimator="separate", losses={"a": [gap], "b": [gap]})
    text = verdict(study)
    assert text.startswith("The data cannot tell a and b apart at C = 1e+22 FLOPs (100x the largest budget)")
    assert "by the each arm's own law" in text and "leaning a" in text and "(excludes 1;" in text
    assert study.winner == "a" and not study.decided
    # no draws: no interval, and the verdict says it cannot decide
    none = compare_laws_at(
        "a", LAW, A, [], "b", LAW, B, [], budgets=[1e19], target=1e21, slope_grid=[1e19], largest=1e19, level=0.9
    )
    assert all(math.isnan(x) for x in none.target_interval) and "cannot decide" in verdict(none)


@pytest.mark.parametrize("swap", [False, True])
def test_the_multiplier_turns_over_when_the_sides_swap(swap):
    a, b = (B, A) if swap else (A, B)
    cmp = compare_laws_at(
        "x", LAW, a, [], "y", LAW, b, [], budgets=[1e19], target=1e21, slope_grid=[1e19], largest=1e19, level=0.9
    )
    assert (cmp.multiplier_at_target < 1) == swap and cmp.winner == ("x" if swap else "y")
