"""Choice studies on synthetic stores (no training): the study spec and its checks, per-arm fits and
the multiplier, the gap at the target, the study loop's rounds and ledger, decision accuracy."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from scalelab.analysis.decision_accuracy import decision_accuracy, format_decisions, pool
from scalelab.analysis.report import build_report
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.cli.main import main
from scalelab.errors import ConfigError
from scalelab.fitting.gap import gap_interval, paired_extrapolation
from scalelab.fitting.predictive import ExtrapolationError
from scalelab.store import ledger
from scalelab.sweeps.dry_run import format_plan, plan_sweep
from scalelab.sweeps.spec import expand_sweep, load_sweep
from scalelab.sweeps.study_fit import format_study
from scalelab.sweeps.study_propose import propose_study_round
from scalelab.sweeps.wandb_runs import run_tags

BASE = {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}}
BUDGETS = [3e11, 1e12, 3e12]
LAWS = {"a": SyntheticLaw(), "b": SyntheticLaw(efficiency=2.0)}  # b reaches a's loss with half the compute


def _spec(arms=None, **study) -> dict:
    return {
        "name": "sim-study",
        "base": BASE,
        "isoflop": {"budgets": BUDGETS, "num_sizes": 5, "center": {"tokens_per_param": 5.0}, "span": 3},
        "fit": {"bootstrap": 8},
        "study": {"arms": arms or {"a": {}, "b": {"optim.beta2": 0.99}}, "target_flops": 3e13, **study},
    }


def _quiet(_msg):
    pass


# --- the spec -----------------------------------------------------------------------------------


def test_study_crosses_arms_with_the_design_and_links_the_plain_runs():
    plain = expand_sweep({k: v for k, v in _spec().items() if k != "study"})
    sweep = expand_sweep(_spec(arms={"a": {}, "b": {"optim.beta2": 0.99}, "c": {"optim.lr": 7e-3}}))
    assert sweep.study.names == ["a", "b", "c"] and sweep.study.baseline == "a"
    by_arm = {arm: [r for r in sweep.runs if r.labels["arm"] == arm] for arm in "abc"}
    # the arm is a label, not config: the baseline arm is the plain sweep's runs, same ids
    assert [r.run_id for r in by_arm["a"]] == [r.run_id for r in plain.runs]
    assert [(r.params, r.num_tokens) for r in by_arm["b"]] == [(r.params, r.num_tokens) for r in plain.runs]
    assert {r.config["optim"]["beta2"] for r in by_arm["b"]} == {0.99}
    assert {r.config["optim"]["lr"] for r in by_arm["c"]} == {7e-3}  # an arm's LR replaces a per-size rule
    assert "arm:b" in run_tags(by_arm["b"][0].to_dict(), [r.to_dict() for r in sweep.runs])  # W&B shows the arm
    rows, totals = plan_sweep(sweep, measure=False)
    assert {a: t["num_runs"] for a, t in totals["arms"].items()} == {"a": 15, "b": 15, "c": 15}
    assert "  arm b: 15 runs" in format_plan(rows, totals)


def test_an_arm_that_shapes_its_runs_gets_its_own_shapes():
    sweep = expand_sweep(_spec(arms={"swiglu": {}, "gelu": {"model.mlp": "gelu"}}))
    a = [r for r in sweep.runs if r.labels["arm"] == "swiglu"]
    b = [r for r in sweep.runs if r.labels["arm"] == "gelu"]
    assert [r.params for r in a] == [r.params for r in b]  # equal N at every design point
    assert all(rb.config["model"]["d_ff"] == 3 * ra.config["model"]["d_ff"] // 2 for ra, rb in zip(a, b))


BAD_STUDIES = [
    ({"arms": {"a": {}}}, r"study\.arms: a study compares 2 or more named arms"),
    ({"arms": {"a": {}, "b": {}}}, r"study\.arms\.b: resolves to the same runs as arm 'a'"),
    ({"arms": {"a": {}, "b": {"logging.wandb": "offline"}}}, r"study\.arms\.b\.logging\.wandb: not a dotted key"),
    ({"arms": {"a": {}, "b": {"optim.beta2": 0.95}}}, r"study\.arms\.b: resolves to the same runs"),  # the default
    ({"arms": {"a": {}, "b": {"model.d_model": 64}}}, r"study\.arms\.b\.model\.d_model: the design sets"),
    ({"arms": {"a": {}, "b": {"train.num_tokens": 10}}}, r"study\.arms\.b\.train\.num_tokens: the design sets"),
    ({"arms": {"a": {}, "b": {"recipe.min_steps": 10}}}, r"study\.arms\.b\.recipe\.min_steps: an arm is a config"),
    ({"target_flops": 3e12}, r"study\.target_flops: 3e\+12 is not beyond the largest budget 3e\+12"),
    ({"baseline": "z"}, r"study\.baseline: 'z' is not an arm"),
]


@pytest.mark.parametrize("study, message", BAD_STUDIES, ids=[m.split(":")[0].strip("\\r") for _, m in BAD_STUDIES])
def test_bad_study_spec_exits_2_with_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, study, message):
    monkeypatch.chdir(tmp_path)
    spec = _spec()
    spec["study"] = {**spec["study"], **study}
    if "arms" in study:
        spec["study"]["arms"] = study["arms"]
    Path("study.yaml").write_text(yaml.safe_dump(spec))
    for argv in (["sweep", "plan", "study.yaml", "--no-measure"], ["sweep", "launch", "study.yaml", "--out", "o"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]  # nothing written, no Ray


def test_a_design_axis_is_not_an_arm():
    spec = {**_spec(arms={"a": {}, "b": {"optim.lr": 1e-3}}), "axes": {"optim.lr": [1e-3, 2e-3]}}
    with pytest.raises(ConfigError, match=r"study\.arms\.b\.optim\.lr: the design sets optim\.lr"):
        expand_sweep(spec)


# --- the gap's interval -----------------------------------------------------------------------------


def test_gap_interval_adds_its_three_parts():
    reps_a = np.array([2.00, 2.01, 1.99, 2.02, 1.98])
    reps_b = reps_a - 0.05
    k = ExtrapolationError(per_decade=0.01, n_folds=8, n_runs=8, max_decades=0.5)
    g = gap_interval(2.0, 1.95, reps_a, reps_b, noise_a=0.0, noise_b=0.0, extrapolation=k, decades=1.0)
    # paired replicates that move together carry no bootstrap spread in the gap
    assert g.point == pytest.approx(-0.05) and g.parts["bootstrap"] == pytest.approx(0.0, abs=1e-12)
    assert g.parts["extrapolation"] > 0.0 and g.decided
    noisy = gap_interval(2.0, 1.95, reps_a, reps_b, noise_a=0.02, noise_b=0.02, extrapolation=k, decades=1.0)
    assert noisy.parts["noise"] == pytest.approx(math.hypot(0.04, 0.039)) and not noisy.decided
    assert noisy.hi - noisy.lo > g.hi - g.lo


def test_paired_extrapolation_cancels_a_miss_both_arms_share():
    def bt(miss_small, miss_large):
        runs = [
            {"run_id": f"{p}{i}", "flops": 1e13, "observed": 2.0, "predicted": 2.0 + m, "rel_error": m / 2.0}
            for i, m in enumerate((miss_small, miss_large))
            for p in ("x",)
        ]
        return {"holdout": {"runs": runs, "folds": [{"flops": 1e13, "train_range": [1e11, 1e12]}] * 2}}

    sizes = {"x0": 1e5, "x1": 2e5}
    same = paired_extrapolation(bt(0.04, 0.02), bt(0.04, 0.02), sizes, sizes)
    assert same.per_decade == pytest.approx(0.0)  # the law misses both arms alike: the gap is exact
    diff = paired_extrapolation(bt(0.04, 0.02), bt(0.0, 0.0), sizes, sizes)
    assert diff.per_decade == pytest.approx(math.sqrt((0.02**2 + 0.01**2) / 2), rel=1e-6)  # per decade, d = 1


# --- fits, the loop and the ledger --------------------------------------------------------------


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    """A study whose arms differ 2x: its design, the round `sweep next` writes (decisive at once),
    the ledger's entry before the runs, then the runs of the round (the truth at the target)."""
    sd = tmp_path_factory.mktemp("study") / "s"
    launch_synthetic(_spec(), sd, LAWS, noise_std=0.003)
    no_truth = decision_accuracy(sd)
    p = propose_study_round(sd, log=_quiet)
    (before,) = ledger.read_ledger(sd)["studies"]
    launch_synthetic(p.spec_path, sd, LAWS, noise_std=0.003)
    return sd, p, before, no_truth


def test_each_arm_is_fitted_the_loops_way_and_the_multiplier_recovered(decided):
    sf = decided[1].study_fit  # the fit the round was proposed from
    assert set(sf.arms) == {"a", "b"} and all(a.n_runs == 15 and a.passed for a in sf.arms.values())
    assert all(len(a.fit.draws) == 8 and a.fit.backtest for a in sf.arms.values())
    cmp = sf.comparison("b")
    assert cmp.budgets == BUDGETS
    for m, (lo, hi) in zip(cmp.multipliers, cmp.intervals):  # the truth is 2 at every budget
        assert 1.7 < m < 2.3 and lo <= m <= hi
    assert cmp.winner == "b" and cmp.gap.point < 0
    text = format_study(sf)
    assert "b over a: multiplier" in text and "(target)" in text and cmp.verdict in text


def test_the_study_loop_writes_its_prediction_before_the_runs_and_scores_it(decided):
    sd, p, before, _ = decided
    assert p.kind == "decisive" and p.passed  # a 2x multiplier is told apart at once
    assert sorted(r.run.labels["arm"] for r in p.runs) == ["a", "b"]
    assert all(r.budget == 3e13 for r in p.runs)
    # the gap is predicted at the runs as resolved, each arm's at its N*(C*) by the shape rule
    cmp = p.study_fit.comparison("b")
    assert cmp.runs == {r.run.labels["arm"]: (r.run.params, r.run.num_tokens) for r in p.runs}
    # the round's spec expands to exactly these runs (the arm's overrides travel with its point)
    assert [r.run_id for r in load_sweep(p.spec_path).runs] == [r.run_id for r in p.runs]
    b_run = next(r for r in p.runs if r.run.labels["arm"] == "b")
    assert b_run.run.config["optim"]["beta2"] == 0.99
    # recorded before the runs existed
    assert before["measured_gap"] is None and before["predicted_winner"] == "b" and before["decided"]
    assert before["interval"][0] <= before["predicted_gap"] <= before["interval"][1] < 0
    assert before["run_ids"] == {r.run.labels["arm"]: r.run_id for r in p.runs}
    ledger.score(sd)
    (entry,) = ledger.read_ledger(sd)["studies"]
    assert entry["measured_gap"] < 0 and entry["measured_winner"] == "b" and entry["winner_right"] is True
    assert entry["covered"] == (entry["interval"][0] <= entry["measured_gap"] <= entry["interval"][1])
    assert "studies (gap = L_arm - L_baseline at the target)" in ledger.format_ledger(ledger.read_ledger(sd))


def test_decision_accuracy_of_single_scale_ranking_and_of_the_law(decided):
    sd, _, _, no_truth = decided
    assert no_truth.notes and not no_truth.truth  # before the target runs: nothing to score against
    table = decision_accuracy(sd)
    ledger.score(sd)  # as the scoring test does: an xdist worker may not have run that one first
    (entry,) = ledger.read_ledger(sd)["studies"]
    assert table.truth["b"][0] == pytest.approx(entry["measured_gap"])
    assert table.budgets == BUDGETS
    smallest, largest = BUDGETS[0], BUDGETS[-1]
    assert table.cell(smallest, "each size").total == 5 and table.cell(smallest, "best run").total == 1
    assert table.cell(smallest, "law").total == 0  # one budget does not identify the law
    assert table.cell(largest, "law").total == 1 and table.cell(largest, "law").correct == 1
    assert table.cell(largest, "each size").correct == 5  # a 2x multiplier shows at every size
    text = format_decisions(pool([table, table]))
    assert "#3" in text and "2/2 (100%)" in text


def test_the_study_loop_narrows_the_multiplier_while_the_arms_are_not_told_apart(tmp_path):
    sd = tmp_path / "s"
    close = {"a": SyntheticLaw(), "b": SyntheticLaw(efficiency=1.03)}
    launch_synthetic(_spec(), sd, close, noise_std=0.003)
    p = propose_study_round(sd, replicates=4, log=_quiet)
    assert p.kind == "narrow" and not p.passed and not p.study_fit.comparison("b").decided
    # runs that narrow m's interval at the target, each labelled with its arm, within the round's budget
    assert p.runs and all(r.kind == "narrow_multiplier" for r in p.runs)
    assert {r.run.labels["arm"] for r in p.runs} <= {"a", "b"}
    assert sum(r.flops for r in p.runs) <= p.budget_flops
    assert set(p.width_reductions) == {r.run_id for r in p.runs} and min(p.width_reductions.values()) > 0
    assert not ledger.read_ledger(sd)["studies"]  # no gap is predicted for runs that do not decide
    assert [r.run_id for r in load_sweep(p.spec_path).runs] == [r.run_id for r in p.runs]


def test_sweep_study_prints_the_study_and_next_decide_needs_a_study(decided, tmp_path, capsys):
    sd = decided[0]
    assert main(["sweep", "study", str(sd), "--replicates", "4", "--no-decisions"]) == 0
    out = capsys.readouterr().out
    assert "b over a: multiplier" in out and "studies (gap = L_arm - L_baseline" in out
    plain = tmp_path / "plain"
    launch_synthetic({k: v for k, v in _spec().items() if k != "study"}, plain, LAWS["a"], noise_std=0.003)
    assert main(["sweep", "next", str(plain), "--decide"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--decide" in err and "not a study" in err


def test_the_report_of_a_study_has_its_section(decided, tmp_path):
    sd = decided[0]
    text = build_report(sd, n_boot=4)
    for what in (
        "(study)",
        "<h2>Study</h2>",
        "b over a",
        "Ledger: predicted against measured gaps",
        "Decision accuracy",
    ):
        assert what in text, what
    assert "<h2>Fit:" not in text  # no single law over both arms
    assert text.count("data:image/png;base64,") >= 2  # the frontiers per arm, m(C)
