"""The closed loop's rules on synthetic stores from a known law (no training): IsoFLOP designs that
centre and bracket, the small-scale recipe, every identification gate, and the ledger."""

import math

import pytest

from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic, simulate_runs
from scalelab.errors import ConfigError, UsageError
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.fitting.entry.gates import BudgetBracket, approaches_gate, exponents_gate, starts_gate
from scalelab.fitting.forms.laws import get_law
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.propose import propose_next
from scalelab.sweeps.specs.spec import expand_sweep, load_sweep

LAW = SyntheticLaw()  # E 1.7, A 60, B 80, alpha 0.30, beta 0.28: N* ~ 1.8e5 at 1e12 FLOPs (D/N ~ 5)
BUDGETS = [3e11, 1e12, 3e12]
BASE = {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}}


def _spec(center_tpp: float, **iso) -> dict:
    return {
        "name": "sim",
        "base": BASE,
        "isoflop": {"budgets": BUDGETS, "num_sizes": 5, "center": {"tokens_per_param": center_tpp}, "span": 3, **iso},
        "fit": {"bootstrap": 8},
    }


def _quiet(_msg):
    pass


def test_isoflop_centres_sizes_and_keeps_them_distinct():
    sweep = expand_sweep(_spec(5.0))
    for c in BUDGETS:
        runs = [r for r in sweep.runs if r.labels["flops_budget"] == c]
        sizes = sorted(r.params for r in runs)
        shapes = {(r.config["model"]["num_layers"], r.config["model"]["d_model"]) for r in runs}
        assert len(sizes) == len(set(sizes)) == len(shapes) == 5
        centre = math.sqrt(c / (6 * 5.0))
        # N*/3 .. 3 N*, each size within the shape rule's reach of its target (tiny sizes are coarse)
        assert sizes[0] / centre < 1 / 3 * 1.4 and sizes[-1] / centre > 3 / 1.4
        assert all(abs(r.flops_6n / c - 1) <= 0.05 for r in runs)


def test_isoflop_distinct_even_where_the_rule_maps_targets_to_one_shape():
    # 5 sizes in a factor 1.5: the plain rule gives fewer shapes; the design takes neighbours instead
    sweep = expand_sweep({"base": BASE, "isoflop": {"budgets": [1e12], "num_sizes": 5, "params": [1.0e5, 1.5e5]}})
    assert len({r.params for r in sweep.runs}) == 5


def test_recipe_sets_batch_steps_warmup_and_lr():
    recipe = {
        "min_steps": 200,
        "warmup": {"fraction": 0.05, "max_steps": 20},
        "batch": {"by": "flops", "ref": 1e12, "ref_tokens": 1024, "exponent": 0.0, "min_sequences": 2},
        "lr": {"ref_params": 1e5, "ref_lr": 4e-3, "exponent": -0.5},
    }
    sweep = expand_sweep({**_spec(5.0), "recipe": recipe})
    for r in sweep.runs:
        cfg = r.config
        steps = r.num_tokens // cfg["train"]["global_batch_tokens"]
        assert steps >= 200
        assert (
            cfg["schedule"]["warmup_tokens"]
            == min(max(round(0.05 * steps), 1), 20) * cfg["train"]["global_batch_tokens"]
        )
        assert cfg["optim"]["lr"] == pytest.approx(4e-3 * (r.params / 1e5) ** -0.5, rel=1e-3)
    # the largest size at the smallest budget gets a smaller batch to reach min_steps; the rest keep 1024
    small = [r for r in sweep.runs if r.labels["flops_budget"] == 3e11]
    batches = {r.params: r.config["train"]["global_batch_tokens"] for r in small}
    assert batches[max(batches)] < 1024 and batches[min(batches)] == 1024


def test_recipe_rejects_a_design_below_min_steps_at_plan_time():
    recipe = {"min_steps": 5000, "batch": {"ref_tokens": 512, "min_sequences": 8}}
    with pytest.raises(ConfigError, match="recipe.min_steps=5000"):
        expand_sweep({**_spec(5.0), "recipe": recipe})


def test_recipe_keeps_an_lr_axis():
    spec = {**_spec(5.0), "recipe": {"min_steps": 10}, "axes": {"optim.lr": [1e-3, 2e-3]}}
    lrs = sorted({r.config["optim"]["lr"] for r in expand_sweep(spec).runs})
    assert lrs == [1e-3, 2e-3]


@pytest.fixture(scope="module")
def well_designed(tmp_path_factory):
    sd = tmp_path_factory.mktemp("good") / "sim"
    launch_synthetic(_spec(5.0), sd, LAW, noise_std=0.003)
    p = propose_next(sd, target_flops=1e13, budget_flops=9e12, replicates=8, log=_quiet)
    return sd, p


def test_well_designed_sweep_passes_every_gate_and_proposes_the_compute_optimal_run(well_designed):
    sd, p = well_designed
    assert p["gates"]["passed"], p["gates"]
    assert [g["name"] for g in p["gates"]["gates"]] == [
        "bracketed",
        "exponents",
        "starts_agree",
        "approaches_agree",
        "law_holds",
    ]
    first = p["proposals"][0]
    assert first["kind"] == "compute_optimal" and first["flops"] == pytest.approx(9e12, rel=0.05)
    n_true = chinchilla_optimum(LAW.params_dict(), 9e12)[0]
    assert 0.5 < first["params"] / n_true < 2.0
    true_loss = float(LAW.loss(first["params"], first["tokens"]))
    lo, hi = first["predicted_interval"]
    assert lo <= true_loss <= hi
    # the written round expands to exactly the predicted run
    sweep = load_sweep(p["spec_path"])
    assert sweep.runs[0].run_id == first["run_id"]


def test_law_auto_stacks_by_forward_evidence_and_the_ledger_keeps_the_weights(tmp_path):
    sd = tmp_path / "sim"
    spec = _spec(5.0)
    spec["fit"] = {"bootstrap": 4, "law": "auto"}
    launch_synthetic(spec, sd, LAW, noise_std=0.003)
    p = propose_next(sd, target_flops=1e13, budget_flops=9e12, replicates=4, max_runs=1, log=_quiet)
    st = p["fit"]["stacked"]
    # the data come from a Chinchilla law (and this design's three budgets give one forward group, no
    # growth to test): the incumbent predicts
    assert st["weights"] == {"chinchilla": 1.0, "kaplan": 0.0}
    assert not st["stack"]["adopted"] and "too few or at one distance" in st["stack"]["reason"]
    assert p["law"] == "chinchilla" and p["fit"]["selection"]["chosen"] == "chinchilla"
    first = p["proposals"][0]
    # three budgets leave the frontier uncalibrated: the run, 3x past them, is predicted by the
    # bracket (the surface and the power side through the budgets' best losses), its two sides kept
    assert set(first["interval_parts"]) == {"surface", "sides"}
    low, high = first["predicted_ends"]
    assert first["predicted_interval"][0] < low < first["predicted_loss"] < high < first["predicted_interval"][1]
    assert first["predicted_loss"] == pytest.approx((low * high) ** 0.5, rel=1e-12)
    assert ledger.read_ledger(sd)["predictions"][-1]["ends"] == [low, high]
    assert ledger.read_ledger(sd)["fits"][-1]["stacked"]["weights"] == st["weights"]
    with pytest.raises(ConfigError, match="fit.law"):
        expand_sweep({**_spec(5.0), "fit": {"law": "lr_annealing"}})
    with pytest.raises(ConfigError, match="fit.candidates"):
        expand_sweep({**_spec(5.0), "fit": {"law": "auto", "candidates": ["chinchilla@flops", "kaplan"]}})
    with pytest.raises(ConfigError, match="fit.stack_point"):
        expand_sweep({**_spec(5.0), "fit": {"law": "auto", "stack_point": "mean"}})


def test_unbracketed_design_gets_bracketing_runs_not_a_compute_optimal_run(tmp_path):
    sd = tmp_path / "sim"
    launch_synthetic(_spec(0.5), sd, LAW, noise_std=0.003)  # centred ~3x above N*: best runs at the low edge
    p = propose_next(sd, target_flops=1e13, replicates=8, log=_quiet)
    assert not p["gates"]["passed"] and "bracketed" in p["gates"]["failed"]
    kinds = {q["kind"] for q in p["proposals"]}
    assert kinds == {"bracket"}
    edges = {b["flops"]: b for b in p["gates"]["brackets"]}
    for q in p["proposals"]:
        b = edges[q["budget"]]
        assert b["edge"] == "low" and q["params"] < min(b["sizes"])
    # after the bracketing round the same budgets are bracketed
    launch_synthetic(p["spec_path"], sd, LAW, noise_std=0.003)
    p2 = propose_next(sd, target_flops=1e13, replicates=8, log=_quiet)
    assert all(b["bracketed"] for b in p2["gates"]["brackets"])


def test_exponents_gate_fails_outside_the_plausible_range_and_on_a_bound():
    law = get_law("chinchilla")
    ok = {"E": 1.7, "A": 60.0, "B": 80.0, "alpha": 0.3, "beta": 0.28}
    assert exponents_gate(law, ok, law.to_fit(ok)).passed
    steep = dict(ok, alpha=1.25)
    assert not exponents_gate(law, steep, law.to_fit(steep)).passed
    on_bound = dict(ok, E=math.exp(-5.0))  # e = ln E on its lower fit bound
    gate = exponents_gate(law, on_bound, law.to_fit(on_bound))
    assert not gate.passed and "E" in gate.detail["at_bound"]


def test_starts_gate_fails_when_near_best_end_points_disagree():
    law = get_law("chinchilla")
    a = {"E": 1.7, "A": 60.0, "B": 80.0, "alpha": 0.3, "beta": 0.28}
    b = {"E": 1.2, "A": 20.0, "B": 400.0, "alpha": 0.2, "beta": 0.4}  # another basin, same objective
    opt = chinchilla_optimum
    assert starts_gate(law, [law.to_fit(a), law.to_fit(a)], [1.0, 1.0], opt, 1e13).passed
    gate = starts_gate(law, [law.to_fit(a), law.to_fit(b)], [1.0, 1.0005], opt, 1e13)
    assert not gate.passed and gate.detail["n_ratio"] > 1.25
    # an end point far worse than the best does not count
    assert starts_gate(law, [law.to_fit(a), law.to_fit(b)], [1.0, 2.0], opt, 1e13).passed


def test_approaches_gate_fails_when_approach_3_leaves_the_vertex_interval():
    params = LAW.params_dict()
    n3 = chinchilla_optimum(params, 1e12)[0]

    def bracket(lo, hi):
        return BudgetBracket(
            flops=1e12, sizes=[n3 / 3, n3, 3 * n3], best_size=n3, edge=None, vertex=(lo * hi) ** 0.5,
            vertex_interval=(lo, hi), flat=False, boundary=False,
        )  # fmt: skip

    assert approaches_gate([bracket(n3 / 1.2, n3 * 1.2)], params, chinchilla_optimum).passed
    gate = approaches_gate([bracket(n3 * 1.5, n3 * 2.0)], params, chinchilla_optimum)
    assert not gate.passed and gate.detail["disagree"] == [1e12]


def test_ledger_scores_a_proposed_run_when_it_finishes(tmp_path):
    sd = tmp_path / "sim"
    launch_synthetic(_spec(5.0), sd, LAW, noise_std=0.003)
    p = propose_next(sd, target_flops=1e13, budget_flops=9e12, replicates=8, log=_quiet)
    book = ledger.read_ledger(sd)
    assert len(book["fits"]) == 1 and book["fits"][0]["gates"]["passed"]
    pred = book["predictions"][0]
    assert pred["run_id"] == p["proposals"][0]["run_id"] and pred["measured"] is None
    assert ledger.score(sd) == []  # not run yet: nothing to score
    runs = [r for r in load_sweep(p["spec_path"]).runs if r.run_id == pred["run_id"]]
    simulate_runs(sd, runs, LAW, noise_std=0.0)
    scored = ledger.score(sd)
    assert [s["run_id"] for s in scored] == [pred["run_id"]]
    book = ledger.read_ledger(sd)
    measured = float(LAW.loss(runs[0].params, runs[0].num_tokens))
    assert book["predictions"][0]["measured"] == pytest.approx(measured)
    assert book["predictions"][0]["covered"] == (pred["interval"][0] <= measured <= pred["interval"][1])
    assert "coverage: " in ledger.format_ledger(book)
    # a second round's fit records drift against the first round's intervals
    launch_synthetic(p["spec_path"], sd, LAW, noise_std=0.003)
    propose_next(sd, target_flops=1e13, budget_flops=9e12, replicates=8, log=_quiet)
    assert len(ledger.read_ledger(sd)["fits"]) == 2


def test_ledger_drift_flags_constants_outside_the_previous_interval():
    prev = {"params": {"alpha": 0.3}, "intervals": {"alpha": [0.28, 0.32]}}
    assert ledger.drift(prev, {"alpha": 0.31}) == {}
    assert set(ledger.drift(prev, {"alpha": 0.4})) == {"alpha"}


def test_isoflop_centres_on_the_sweeps_current_fit(well_designed):
    sd, p = well_designed
    fitted = chinchilla_optimum(p["params"], 1e13)[0]
    spec = {"base": BASE, "isoflop": {"budgets": [1e13], "num_sizes": 5, "center": {"fit": str(sd)}, "span": 3}}
    sizes = sorted(r.params for r in expand_sweep(spec).runs)
    assert sizes[0] < fitted / 2 and sizes[-1] > fitted * 2
    assert min(sizes, key=lambda n: abs(math.log(n / fitted))) == sizes[2]
    with pytest.raises(ConfigError, match="center.fit"):
        expand_sweep({**spec, "isoflop": {**spec["isoflop"], "center": {"fit": str(sd / "runs")}}})


def test_recipe_batch_grows_with_the_runs_tokens():
    recipe = {"min_steps": 10, "batch": {"by": "tokens", "ref": 1e6, "ref_tokens": 512, "exponent": 0.5}}
    sweep = expand_sweep({**_spec(5.0), "recipe": recipe})
    runs = sorted(sweep.runs, key=lambda r: r.num_tokens)
    batches = [r.config["train"]["global_batch_tokens"] for r in runs]
    assert batches == sorted(batches) and batches[0] < batches[-1]
    for r in runs:  # the nearest power of two (in log2) to 512 (D / 1e6)^0.5 tokens, in sequences of 64
        want = 2 ** round(math.log2(512 * (r.num_tokens / 1e6) ** 0.5 / 64)) * 64
        assert r.config["train"]["global_batch_tokens"] == pytest.approx(want, rel=1.01)


def test_noise_term_takes_seed_replicates_and_the_stated_floor():
    from scalelab.fitting.uncertainty.predictive import replicate_noise

    n = [1e5, 1e5, 2e5, 2e5, 3e5]
    d = [1e6, 1e6, 2e6, 2e6, 3e6]
    loss = [2.0, 2.0 * math.exp(0.02), 1.5, 1.5 * math.exp(-0.02), 1.2]
    # two pairs, each with log difference 0.02: pooled sd = 0.02 / sqrt(2)
    assert replicate_noise(n, d, loss) == pytest.approx(0.02 / math.sqrt(2))
    assert replicate_noise(n[:3], [1e6, 2e6, 3e6], loss[:3]) == 0.0
    with pytest.raises(ConfigError, match="fit.noise_floor"):
        expand_sweep({**_spec(5.0), "fit": {"noise_floor": -0.1}})


def test_prediction_interval_carries_the_noise_floor():
    from scalelab.fitting.entry.fit_options import FitOptions
    from scalelab.fitting.entry.fit_runs import fit_runs
    from scalelab.fitting.estimate.io import read_runs

    sweep = expand_sweep(_spec(5.0))
    n = [r.params for r in sweep.runs]
    d = [r.num_tokens for r in sweep.runs]
    c = [r.labels["flops_budget"] for r in sweep.runs]
    loss = LAW.loss(n, d)  # noiseless: the fit's own residuals are ~0
    table = read_runs({"params": n, "tokens": d, "loss": loss, "flops": c})
    bare = fit_runs(table, FitOptions(starts=200, draw_starts=True))
    floored = fit_runs(table, FitOptions(starts=200, draw_starts=True, noise_floor=0.013))
    assert bare.residual_scale < 0.005 and floored.residual_scale == pytest.approx(0.013)
    wide, tight = floored.predict_interval(2e5, 5e6), bare.predict_interval(2e5, 5e6)
    assert wide.parts["noise"] == pytest.approx(0.013) and wide.hi - wide.lo > tight.hi - tight.lo


def test_seeds_repeat_the_compute_optimal_run_and_every_seed_is_predicted_and_scored(tmp_path):
    sd = tmp_path / "sim"
    launch_synthetic(_spec(5.0), sd, LAW, noise_std=0.003)
    p = propose_next(sd, target_flops=1e13, replicates=4, max_runs=2, seeds=2, log=_quiet)
    opt = [q for q in p["proposals"] if q["kind"] == "compute_optimal"]
    assert len(opt) == 2 and len({q["run_id"] for q in opt}) == 2
    assert opt[0]["params"] == opt[1]["params"] and opt[0]["tokens"] == opt[1]["tokens"]
    assert opt[0]["predicted_loss"] == opt[1]["predicted_loss"]
    sweep = load_sweep(p["spec_path"])
    assert sorted(r.config["train"]["seed"] for r in sweep.runs) == [0, 1]
    assert len(sweep.runs) == 2  # max_runs counts the seeds: no narrowing run fits beside them
    launch_synthetic(p["spec_path"], sd, LAW, noise_std=0.003)
    scored = [q for q in ledger.score(sd) if q["measured"] is not None]
    assert {q["run_id"] for q in scored} == {q["run_id"] for q in opt}
    with pytest.raises(UsageError, match="--seeds"):
        propose_next(sd, target_flops=1e13, seeds=0, log=_quiet)
