"""The memo of batched fits (fitting/estimate/batch_memo.py): a problem seen before in the process is not solved
again and gives the same bits; any change to the problem is a new problem."""

import dataclasses

import numpy as np
import pytest

from scalelab.fitting.estimate import batch_memo
from scalelab.fitting.estimate.batched_lbfgs import lbfgs_batched
from scalelab.fitting.estimate.objective import BatchObjective
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.simulate import simulate

LAW = get_law("chinchilla")
DATA = simulate("chinchilla", noise_sigma=0.01, seed=3, n_sizes=4, n_tokens=4)
X = {k: DATA[k] for k in LAW.inputs}
STARTS = LAW.init_grid()[::300]
LO, HI = (np.array(b, dtype=np.float64) for b in zip(*LAW.fit_bounds))
OPTIONS = {"max_iter": 30}


def _problem(**change):
    """(objective, starts, lower, upper, options) of the reference problem with `change` applied."""
    kw = {"loss": DATA["loss"].copy(), "weights": None, "delta": 1e-3, "reduction": "sum", "law": LAW}
    kw.update({k: v for k, v in change.items() if k in kw})
    obj = BatchObjective(kw["law"], {k: v.copy() for k, v in X.items()}, kw["loss"], weights=kw["weights"],
                         delta=kw["delta"], reduction=kw["reduction"])  # fmt: skip
    return obj, change.get("starts", STARTS), change.get("lower", LO), HI, {**OPTIONS, **change.get("options", {})}


def _same(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("x", "f", "grad_norm", "n_iter", "status"))


def test_a_problem_solved_before_is_not_solved_again_and_gives_the_same_bits():
    batch_memo.clear()
    obj, x0, lo, hi, opts = _problem()
    first = batch_memo.solve(obj, x0, lo, hi, **opts)
    assert obj.n_evals > 0 and first.n_fun_rows == obj.n_evals
    again, x0, lo, hi, opts = _problem()  # equal inputs in new arrays
    second = batch_memo.solve(again, x0, lo, hi, **opts)
    assert again.n_evals == 0 and second.n_fun_rows == 0  # nothing evaluated
    direct = lbfgs_batched(*_problem()[:4], **opts)
    assert _same(second, first) and _same(second, direct)
    second.x[:] = 0.0  # a caller editing its copy reaches neither the first caller nor the next one
    first.f[:] = 0.0
    third = batch_memo.solve(*_problem()[:4], **opts)
    assert _same(third, direct)


@pytest.mark.parametrize(
    "change",
    [
        {"loss": np.nextafter(DATA["loss"], 10.0)},  # every loss one ulp up
        {"weights": np.r_[np.ones(len(DATA["loss"]) - 1), 2.0]},
        {"delta": 2e-3},
        {"reduction": "mean"},
        {"law": dataclasses.replace(LAW, fit_bounds=((-4.0, 3.0), *LAW.fit_bounds[1:]))},
        {"starts": STARTS[1:]},
        {"lower": np.r_[-4.0, LO[1:]]},
        {"options": {"max_iter": 31}},
    ],
    ids=["loss", "weights", "delta", "reduction", "law", "starts", "bounds", "options"],
)
def test_any_change_to_the_problem_is_solved_as_a_new_problem(change):
    batch_memo.clear()
    batch_memo.solve(*_problem()[:4], **OPTIONS)
    obj, x0, lo, hi, opts = _problem(**change)
    got = batch_memo.solve(obj, x0, lo, hi, **opts)
    assert obj.n_evals > 0 and got.n_fun_rows == obj.n_evals
    assert _same(got, lbfgs_batched(*_problem(**change)[:4], **opts))
