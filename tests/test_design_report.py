"""`sweep plan`'s design report (scalelab.sweeps.preview.design_report): where an IsoFLOP design's sizes sit
around a reference N*(C), the shape cost of its aspects, and the price of replicating it, against a
reference law close to the demo's first-round fit."""

import json
import math

import numpy as np
import pytest
import yaml

from scalelab.cli.main import main
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.fitting.hp_laws.lr_law import CellOptimum
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.preview.design_report import design_report, prediction_sd
from scalelab.sweeps.recipes.recipe_audit import AuditResult
from scalelab.sweeps.specs.isoflop_grid import read_frontier
from scalelab.sweeps.specs.spec import expand_sweep

REF = {"E": 1.216, "A": 480.0, "B": 1055.0, "alpha": 0.765, "beta": 0.618}  # N* ~ 93k at 2e12 FLOPs


@pytest.fixture
def ref_file(tmp_path):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"law": "chinchilla", "params": REF}))
    return path


def test_sizes_against_the_reference_optimum(ref_file):
    reference = read_frontier(ref_file, "ref")
    demo = design_report(expand_sweep(demo_spec()), reference=reference)
    # the demo's 20-tokens-per-parameter centre puts this optimum at a third of its span
    assert [round(b.position, 2) for b in demo.budgets] == [0.32, 0.33, 0.33]
    centred = demo_spec()  # span 2: at 2e11 N*/3 (11k) is below the byte vocabulary's smallest model (18.5k)
    centred["isoflop"] |= {"center": {"fit": str(ref_file)}, "span": 2.0}
    report = design_report(expand_sweep(centred), reference=reference)
    assert all(abs(b.position - 0.5) < 0.12 for b in report.budgets)  # the shape rule's sizes are coarse


def _ln_loss(theta, n, d):
    e, a, b, al, be = theta
    return np.log(np.exp(e) + np.exp(a) * n**-al + np.exp(b) * d**-be)


def test_prediction_sd_is_the_delta_method():
    runs = expand_sweep(demo_spec()).runs
    n = np.array([r.params for r in runs], dtype=float)
    d = np.array([r.num_tokens for r in runs], dtype=float)
    one, two = prediction_sd(REF, n, d, 0.01, [6e13]), prediction_sd(REF, np.r_[n, n], np.r_[d, d], 0.01, [6e13])
    assert two[0] == pytest.approx(one[0] / math.sqrt(2), rel=1e-9)  # a replicate of every run halves the variance
    # the same figure from finite-difference gradients of ln L
    theta = np.array([math.log(REF["E"]), math.log(REF["A"]), math.log(REF["B"]), REF["alpha"], REF["beta"]])
    steps = np.eye(5) * 1e-6

    def grad(nn, dd):
        return np.stack([(_ln_loss(theta + h, nn, dd) - _ln_loss(theta - h, nn, dd)) / 2e-6 for h in steps], axis=-1)

    jac = grad(n, d)
    n_opt, d_opt, _ = chinchilla_optimum(REF, 6e13)
    g = grad(np.array([n_opt]), np.array([d_opt]))[0]
    assert one[0] == pytest.approx(0.01 * math.sqrt(g @ np.linalg.inv(jac.T @ jac) @ g), rel=1e-4)


def test_replication_choices_and_the_shape_cost(ref_file):
    best = dict(x_opt=24.0, interval=(20.0, 28.0), curvature=0.02, loss_opt=1.4, bracketed=True)
    shape = CellOptimum(params=1e5, tokens=3e6, grid=[8.0, 16.0, 32.0], mean_loss=[1.5, 1.42, 1.41], resid_sd=0.001,
                        **best)  # fmt: skip
    audit = AuditResult(recipe={}, loss="final_val_loss", lr_cells=[], recipe_lr=[], lr_law=None, lr_law_size=None,
                        shape_cells=[shape])  # fmt: skip
    report = design_report(expand_sweep(demo_spec()), reference=read_frontier(ref_file, "ref"), audit=audit,
                           noise=0.0056, replication=True)  # fmt: skip
    rows = {r.choice: r for r in report.replication}
    assert rows["as given"].runs == 12 and rows["2 seeds per point"].runs == 24
    assert rows["2 seeds per point"].flops == pytest.approx(2 * rows["as given"].flops)
    assert rows["2 seeds per point"].sd[-1] == pytest.approx(rows["as given"].sd[-1] / math.sqrt(2))
    assert rows["6 sizes per budget (spread)"].runs == 18 and rows["8 sizes per budget (spread)"].why
    # aspect 8 (the demo's narrowest) costs exp(0.02 ln(8/24)^2) - 1 against the best 24
    worst = max(b.shape_cost[1] for b in report.budgets)
    assert worst == pytest.approx(math.expm1(0.02 * math.log(8 / 24) ** 2), rel=1e-6)


def test_plan_prints_the_design_report(ref_file, tmp_path, capsys):
    spec = tmp_path / "demo.yaml"
    spec.write_text(yaml.safe_dump(demo_spec()))
    assert main(["sweep", "plan", str(spec), "--no-measure", "--reference", str(ref_file), "--replication"]) == 0
    out = capsys.readouterr().out
    assert "N* 93,060 at 0.33 of the span (inside)" in out and "shape effect: not measured" in out
    assert "2 seeds per point" in out and "<- most per FLOP" in out
