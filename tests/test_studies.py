"""Choice studies on synthetic stores (no training): the study spec and its checks, per-arm fits and
the multiplier, the gap at the target, the study loop's rounds and ledger, decision accuracy."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from scalelab.analysis.decision_accuracy import decision_accuracy, format_decisions, pool, wilson_interval
from scalelab.analysis.report import build_report
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.cli.main import main
from scalelab.errors import ConfigError
from scalelab.fitting.comparisons.gap import gap_interval, paired_extrapolation
from scalelab.fitting.uncertainty.predictive import ExtrapolationError
from scalelab.store import ledger, load_runs
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.preview.dry_run import dry_run_table, format_dry_run
from scalelab.sweeps.specs.spec import expand_sweep, load_sweep
from scalelab.sweeps.studies.study_fit import fit_study, read_study
from scalelab.sweeps.studies.study_propose import open_study_round, propose_study_round
from scalelab.sweeps.studies.study_text import format_study
from scalelab.sweeps.tracking.wandb_runs import run_tags

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
    rows, totals = dry_run_table(sweep, measure=False)
    assert {a: t["num_runs"] for a, t in totals["arms"].items()} == {"a": 15, "b": 15, "c": 15}
    assert "  arm b: 15 runs" in format_dry_run(rows, totals)


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
    ({"estimator": "pooled"}, r"study\.estimator: 'pooled' is not an estimator"),
    ({"decisive": {"sizes": 0}}, r"study\.decisive\.sizes: 0 is not a whole number from 1 to 5"),
    ({"decisive": {"seed": 2}}, r"study\.decisive\.seed: "),
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


def test_a_study_is_read_back_with_the_specs_own_generator_registry(tmp_path):
    """read_study finds the generator through sweeps.specs.spec's registry: every generator, `audit` too."""
    audit = {"sizes": [2e4, 5e4], "tokens_per_param": [10], "lr_multipliers": [0.5, 1.0, 2.0]}
    raw = {k: v for k, v in _spec().items() if k != "isoflop"} | {"audit": audit}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(raw))
    _, study = read_study(tmp_path)
    assert study.names == ["a", "b"] and study.target_flops == 3e13


@pytest.mark.parametrize("key, value", [("model.d_model", 64), ("train.num_tokens", 10**6), ("optim.lr", 1e-3)])
def test_an_audit_designs_sizes_and_lr_are_not_an_arms(key, value):
    """The audit generator sets every run's size, tokens and LR (a multiple of the recipe's): an arm that
    set one would be overwritten by the design, so it is refused, as under the other sized generators."""
    audit = {"sizes": [2e4, 5e4], "tokens_per_param": [10], "lr_multipliers": [0.5, 1.0, 2.0]}
    raw = {k: v for k, v in _spec(arms={"a": {}, "b": {key: value}}).items() if k != "isoflop"}
    spec = raw | {"audit": audit, "recipe": demo_spec()["recipe"]}
    with pytest.raises(ConfigError, match=rf"study\.arms\.b\.{re.escape(key)}: the design sets {re.escape(key)}"):
        expand_sweep(spec)


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
    reopened = open_study_round(sd)  # a loop stopped here launches this round again, not a new one
    assert reopened.round == p.round and reopened.passed
    assert [r.run_id for r in reopened.sweep.runs] == [r.run_id for r in p.runs]
    launch_synthetic(p.spec_path, sd, LAWS, noise_std=0.003)
    assert open_study_round(sd) is None  # every run of it done: the next round is proposed afresh
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


def test_the_study_loop_writes_a_matched_decisive_measurement_and_scores_it(decided):
    sd, p, before, _ = decided
    assert p.kind == "decisive" and p.passed  # a 2x multiplier is told apart at once
    assert all(r.budget == 3e13 and r.kind == "decisive" for r in p.runs)
    # every arm at the same 3 sizes around N* and the same 2 seeds: the same N, D, shape and seed
    by_point: dict = {}
    for r in p.runs:
        key = (r.run.labels["size_index"], r.run.config["train"]["seed"])
        by_point.setdefault(key, {})[r.run.labels["arm"]] = r.run
    assert sorted(by_point) == [(i, s) for i in range(3) for s in (0, 1)]
    shape = lambda run: {k: run.config["model"][k] for k in ("num_layers", "d_model", "num_heads", "d_ff")}  # noqa: E731
    for pair in by_point.values():
        a, b = pair["a"], pair["b"]
        assert (a.params, a.num_tokens, shape(a)) == (b.params, b.num_tokens, shape(b))
        assert b.config["optim"]["beta2"] == 0.99 and a.config["optim"]["beta2"] != 0.99
    sizes = sorted({pair["a"].params for pair in by_point.values()})
    assert 1.6 < sizes[1] / sizes[0] < 2.5 and 1.6 < sizes[2] / sizes[1] < 2.5  # a factor 2 apart, around N*
    # the gap is predicted at the runs as resolved
    cmp = p.study_fit.comparison("b")
    for arm in "ab":
        runs = [r.run for r in p.runs if r.run.labels["arm"] == arm]
        assert cmp.runs[arm] == [(r.params, r.num_tokens) for r in runs]
    # the round's spec expands to exactly these runs (the arm's overrides and the seeds travel with them)
    assert [r.run_id for r in load_sweep(p.spec_path).runs] == [r.run_id for r in p.runs]
    # recorded before the runs existed: the pairs' ids aligned, the estimator, every view's gap
    assert before["measured_gap"] is None and before["predicted_winner"] == "b" and before["decided"]
    assert before["estimator"] == "paired" and before["interval_parts"].keys() >= {"bootstrap", "drift", "scatter"}
    assert before["interval"][0] <= before["predicted_gap"] <= before["interval"][1] < 0
    ids = before["run_ids"]
    assert set(zip(ids["a"], ids["b"])) == {(pair["a"].run_id, pair["b"].run_id) for pair in by_point.values()}
    assert set(before["views"]) == {"separate", "paired", "paired_frontier", "joint", "joint_frontier"}
    ledger.score(sd)
    (entry,) = ledger.read_ledger(sd)["studies"]
    runs = load_runs(sd)
    measured = dict(zip(runs["run_id"].to_list(), runs["final_val_loss"].to_list()))
    diffs = [measured[b] - measured[a] for a, b in zip(ids["a"], ids["b"])]
    assert entry["n_pairs"] == 6 and entry["measured_gap"] == pytest.approx(np.mean(diffs))
    assert entry["measured_se"] == pytest.approx(np.std(diffs, ddof=1) / math.sqrt(6))
    assert entry["measured_winner"] == "b" and entry["winner_right"] is True and entry["decision"] == "right"
    assert entry["covered"] == (entry["interval"][0] <= entry["measured_gap"] <= entry["interval"][1])
    assert all("covered" in v and v["decision"] in ("right", "wrong", "none") for v in entry["views"].values())
    text = ledger.format_ledger(ledger.read_ledger(sd))
    assert "measured: mean over the matched pairs" in text and " +- " in text and "separate:" in text


def test_the_verdict_names_its_estimator_and_the_parts_of_its_interval(decided):
    sf = decided[1].study_fit
    cmp = sf.comparison("b")
    assert cmp.estimator == "paired" and cmp.gap.estimator == "paired" and cmp.separate_gap.estimator == "separate"
    assert "by the paired gap model" in cmp.verdict
    text = format_study(sf)
    assert "verdicts by the paired gap model" in text
    for part in ("bootstrap", "drift", "scatter", "baseline", "noise", "extrapolation", "shared-exponent law"):
        assert part in text, part
    out = sf.to_dict()["comparisons"][0]
    assert out["estimator"] == "paired" and out["gap"]["estimator"] == "paired"
    assert out["paired"]["gap_model"]["model"] in ("constant", "drift") and out["paired"]["joint"]["params"]
    assert set(out["gap"]["parts"]) == {"bootstrap", "drift", "scatter", "baseline", "decades"}
    assert set(out["gap_parts"]) == {"bootstrap", "drift", "scatter", "baseline"}  # and what each one is


STEADY = {"a": SyntheticLaw(), "b": SyntheticLaw(E=1.7 * 1.03, A=60.0 * 1.03, B=80.0 * 1.03)}  # b: 3% above a


@pytest.fixture(scope="module")
def steady(tmp_path_factory):
    """A study whose gap is a constant 3% of the loss."""
    sd = tmp_path_factory.mktemp("steady") / "s"
    launch_synthetic(_spec(), sd, STEADY, noise_std=0.003)
    return sd


def test_the_paired_gap_is_far_narrower_than_each_arms_laws_on_the_same_runs(steady):
    sf = fit_study(steady, joint=False)
    cmp = sf.comparison("b")
    at = [(n, d) for n, d in cmp.runs["a"]]
    truth = float(np.mean([STEADY["b"].loss(n, d) - STEADY["a"].loss(n, d) for n, d in at]))
    paired, separate = cmp.gap, cmp.separate_gap
    assert paired.lo <= truth <= paired.hi and separate.lo <= truth <= separate.hi
    assert paired.hi - paired.lo < 0.4 * (separate.hi - separate.lo), (paired, separate)
    assert paired.decided and cmp.paired.estimate.model == "constant"
    old = fit_study(steady, joint=False, estimator="separate").comparison("b")  # the old estimator, on request
    assert old.estimator == "separate" and old.gap.point == pytest.approx(separate.point)
    assert (old.gap.lo, old.gap.hi) == pytest.approx((separate.lo, separate.hi))


def test_decision_accuracy_of_single_scale_ranking_of_each_arms_law_and_of_the_paired_gap(decided):
    sd, _, _, no_truth = decided
    assert no_truth.notes and not no_truth.truth  # before the target runs: nothing to score against
    table = decision_accuracy(sd)
    ledger.score(sd)  # as the scoring test does: an xdist worker may not have run that one first
    (entry,) = ledger.read_ledger(sd)["studies"]
    # the truth: the matched decisive measurement's mean gap, and its se over the 6 pairs
    assert table.truth_gap("b") == pytest.approx(entry["measured_gap"])
    assert table.truth_se["b"] == pytest.approx(entry["measured_se"])
    assert table.budgets == BUDGETS
    smallest, largest = BUDGETS[0], BUDGETS[-1]
    assert table.cell(smallest, "each size").total == 5 and table.cell(smallest, "best run").total == 1
    for method in ("law", "paired"):  # one budget does not identify a law
        assert table.cell(smallest, method).total == 0 and table.cell(smallest, method).note
        cell = table.cell(largest, method)
        assert (cell.total, cell.correct, cell.wrong) == (1, 1, 0)
    assert table.cell(largest, "paired").decided == 1  # a 2x multiplier: the paired gap decides
    assert table.cell(largest, "each size").correct == 5  # and shows at every size
    assert table.cell(largest, "each size").interval() == pytest.approx((0.566, 1.0), abs=1e-3)  # Wilson, 5/5
    pooled = pool([table, table])
    assert pooled.cell(2, "paired").total == 2
    assert pooled.cell(2, "paired").interval()[0] == pytest.approx(0.342, abs=1e-3)
    text = format_decisions(pooled)
    assert "#3" in text and "2/2 (100%) [34%, 100%]" in text and "paired gap model" in text


def test_wilson_intervals_of_a_few_decisions():
    assert wilson_interval(4, 6) == pytest.approx((0.300, 0.903), abs=1e-3)  # 4 of 6 settles little
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    lo, hi = wilson_interval(90, 100)
    assert lo < 0.9 < hi and hi - lo < 0.13


def test_the_study_loop_narrows_the_multiplier_while_the_arms_are_not_told_apart(tmp_path):
    sd = tmp_path / "s"
    close = {"a": SyntheticLaw(), "b": SyntheticLaw()}  # no difference: nothing tells them apart
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
    argv = ["sweep", "study", str(sd), "--replicates", "4", "--no-decisions", "--estimator", "separate", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    (cmp,) = out["fit"]["comparisons"]
    assert cmp["estimator"] == "separate" and out["fit"]["study"]["estimator"] == "separate"  # the old one, asked
    assert set(cmp["gap"]["parts"]) == {"bootstrap", "noise", "extrapolation", "decades"}
    assert cmp["paired"]["matched"]["estimator"] == "paired" and out["ledger"][0]["measured_se"] > 0
    plain = tmp_path / "plain"
    launch_synthetic({k: v for k, v in _spec().items() if k != "study"}, plain, LAWS["a"], noise_std=0.003)
    for flag in (["--decide"], ["--estimator", "paired"]):
        assert main(["sweep", "next", str(plain), *flag]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and flag[0] in err and "not a study" in err


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
    assert "paired gap model" in text and "shared-exponent law" in text and "drift" in text  # the parts, named
    assert "<h2>Fit:" not in text  # no single law over both arms
    assert text.count("data:image/png;base64,") >= 2  # the frontiers per arm, m(C)
