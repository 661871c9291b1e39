"""A holdout round (`sweep next --holdout`, scalelab.sweeps.closed_loop.propose.Holdout): runs at several multiples
of the largest budget, every one predicted by the one fit before any trains, scored by the ledger.
On a synthetic store from a known law (no training)."""

import math

import pytest

from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.errors import UsageError
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.propose import Holdout, propose_round

LAW = SyntheticLaw()
SPEC = {
    "name": "sim",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5}, "span": 3},
    "fit": {"bootstrap": 8},
}


@pytest.fixture(scope="module")
def holdout(tmp_path_factory):
    sd = tmp_path_factory.mktemp("store") / "sim"
    launch_synthetic(SPEC, sd, LAW, noise_std=0.003)
    p = propose_round(sd, holdout=Holdout(multiples=(3.0, 10.0, 30.0), sizes=2, spread=1.5), seeds=2,
                      replicates=8, log=lambda m: None)  # fmt: skip
    return sd, p


def test_every_multiple_gets_its_sizes_around_the_fits_optimum(holdout):
    _, p = holdout
    assert {r.kind for r in p.runs} == {"holdout"} and len(p.runs) == 3 * 2 * 2  # multiples x sizes x seeds
    for m in (3.0, 10.0, 30.0):
        c = m * 3e12
        runs = [r for r in p.runs if r.budget == pytest.approx(c)]
        n_opt = chinchilla_optimum(p.fit["params"], c)[0]
        sizes = sorted({r.run.params for r in runs})
        assert len(sizes) == 2 and all(abs(r.flops / c - 1) < 0.06 for r in runs)
        assert sizes[1] / sizes[0] < 2.2  # neighbours of one optimum (the shape rule's steps are coarse)
        assert sizes[0] < n_opt < sizes[1]
    assert p.target_flops == pytest.approx(9e13)


def test_the_ledger_holds_every_prediction_before_the_runs_and_scores_them_after(holdout, tmp_path):
    sd, p = holdout
    book = ledger.read_ledger(sd)
    entries = [e for e in book["predictions"] if e["kind"] == "holdout"]
    assert len(entries) == len(p.runs) and all(e.get("measured") is None for e in entries)
    launch_synthetic(p.spec_path, sd, LAW, noise_std=0.003)  # the round "trains"
    ledger.score(sd)
    scored = [e for e in ledger.read_ledger(sd)["predictions"] if e["kind"] == "holdout"]
    assert all(e["measured"] is not None for e in scored)
    # a well-specified law with 0.3% noise: the far predictions (three budgets: the bracket, which
    # leans half the sides' gap towards the power law when the surface is right) are close and covered
    assert all(e["ends"] for e in scored)
    assert max(abs(e["rel_error"]) for e in scored) < 0.04 and all(e["covered"] for e in scored)
    assert math.isfinite(sum(e["rel_error"] for e in scored))


@pytest.mark.parametrize("kw", [{"multiples": (10.0, 3.0)}, {"multiples": (0.5,)}, {"sizes": 0}, {"spread": 1.0}])
def test_bad_holdouts_are_refused(kw):
    with pytest.raises(UsageError, match="holdout"):
        Holdout(**kw)
