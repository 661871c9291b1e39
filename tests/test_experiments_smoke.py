"""Smoke tests of experiments/ that need no training: each experiment's `main` on its smallest
configuration, in this process (experiments is an installed package: no sys.path edit, no subprocess),
so a package change that breaks an experiment fails here. The experiments' full runs and their results
are in docs/; these check that the protocol's code path still runs end to end and prints its table.
An experiment that launches runs takes a `trainer` in place of Ray's launcher: here
scalelab.analysis.synthetic.synthetic_trainer, with a known law or a truth of the whole run (an LR
optimum for the LR experiments), so its own analysis runs without Ray and has something to find; the
curve experiments take scalelab.analysis.synthetic_curves.curve_trainer, whose runs log whole loss
curves from the lr_annealing law (and stop early where their spec says), so the curve laws' errors
and the fitted annealing term have a known answer.
The experiments with training or a store have their own test modules (test_first_round_protocol,
test_frontier_benches, test_gap_power, test_bench_studies)."""

import contextlib
import io
import json
import math
import re
import sys

import pytest

from experiments import (
    candidate_synthetic,
    closed_loop,
    curve_sweeps,
    curve_sweeps_mup,
    design_distance,
    e_from_curves,
    extrapolation_scale,
    extrapolation_variants,
    fit_calibration,
    fit_public,
    fit_public_auto,
    fit_public_sensitivity,
    fit_public_weighted,
    forms_position,
    frontier_synthetic,
    interval_calibration,
    isoflop_shape,
    loop_coverage,
    lr_sweep,
    lr_transfer,
    moe_aux_loss,
    plan_public,
    planner_activation,
    planner_calibrate,
    planner_published,
    planner_sanity,
    seed_noise,
    stack_bagging,
    stacked_coverage,
    transfer_gate,
)
from scalelab import store
from scalelab.analysis.synthetic import (
    SyntheticLaw,
    isoflop_design,
    launch_synthetic,
    synthetic_trainer,
    write_synthetic_sweep,
)
from scalelab.analysis.synthetic_curves import CURVE_PARAMS, CurveTruth, curve_trainer
from scalelab.errors import UsageError, run_script
from scalelab.fitting.allocation.allocate import chinchilla_optimum

pytestmark = pytest.mark.usefixtures("one_thread")


def test_planner_checks_rank_the_published_layouts(capsys):
    assert planner_sanity.main([]) == 0
    out = capsys.readouterr().out
    assert "published layout ranks" in out and "planner's best is" in out
    planner_published.main(["--no-search"])
    assert "MoE 0.70T / 33B active" in capsys.readouterr().out


def test_planner_activation_compares_the_formula_with_saved_bytes(tmp_path, capsys):
    assert planner_activation.main(["--quick", "--no-spawn", "--json", str(tmp_path / "rows.json")]) == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert rows and all(abs(r["rel_error"]) <= 0.10 for r in rows) and "wall time" in capsys.readouterr().out


def test_isoflop_shape_measures_both_shapes(capsys):
    isoflop_shape.main(["--trials", "2"])
    out = capsys.readouterr().out
    assert "parabola: exponent bias" in out and "power: exponent bias" in out


def test_frontier_synthetic_scores_one_truth(capsys):
    assert frontier_synthetic.main(["--trials", "1", "--kinds", "chinchilla"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("chinchilla")]
    assert len(rows) == 2  # one row per target (1e21, 3e21)


def test_stacked_coverage_scores_every_distance(capsys):
    stacked_coverage.main(["--trials", "1", "--bootstrap", "2", "--kinds", "chinchilla"])
    out = capsys.readouterr().out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("chinchilla")] == ["3x", "10x", "30x"]


def test_candidate_synthetic_scores_the_ends_interval_where_the_law_is_right(tmp_path, capsys):
    """The tests' synthetic holdout store (a true Chinchilla law): the loop's interval covers its 12 far
    runs; the ends widened by run noise do not, because the measured runs lie above both ends
    (docs/first-round.md, protocol 2's amendment)."""
    candidate_synthetic.main(["--json", str(tmp_path / "rows.json")])
    out = json.loads((tmp_path / "rows.json").read_text())
    assert out["runs"] == 12 and out["covered"] == 12
    assert out["candidate_covered"] <= 3 and out["candidate_floor_covered"] <= 9 and out["above_both_ends"] >= 10
    assert "covered: the loop's interval 12/12" in capsys.readouterr().out


def test_interval_calibration_scores_both_intervals(capsys):
    interval_calibration.main(["--trials", "1", "--bootstrap", "2", "--kinds", "chinchilla"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("chinchilla")]
    assert [r[1] for r in rows] == ["3x", "10x", "30x"] and all(len(r) == 7 for r in rows)


def test_loop_coverage_runs_one_trial_through_run_rounds(capsys):
    """One synthetic trial: the 3x gate rounds, then the 30x round, driven by run_rounds' hooks."""
    loop_coverage.main(["--trials", "1"])
    out = capsys.readouterr().out
    assert "(3x) predicted" in out and "(30x) predicted" in out and "3x: coverage 1/1" in out


def test_forms_position_places_far_runs_between_the_forms(capsys):
    forms_position.main(["--synthetic", "1"])
    out = capsys.readouterr().out
    assert "30.0x  chinchilla" in out and "receding 30x: 1 runs" in out


def test_extrapolation_variants_scores_a_synthetic_store(tmp_path, capsys):
    """A first round finished from a known law, and a point at 10x its largest budget (--extra)."""
    law = SyntheticLaw()
    spec = {
        "name": "sim",
        "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
        "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5}, "span": 3},
    }
    launch_synthetic(spec, tmp_path / "loop", law, noise_std=0.003)
    n, d, loss = chinchilla_optimum(law.params_dict(), 3e13)
    extra = f"{n},{d},{loss},3e13,{n},{n}"
    argv = ["--laws", "chinchilla", "--accounting", "total", "--bootstrap", "2", "--extra", extra]
    assert extrapolation_variants.main([str(tmp_path / "loop"), *argv]) == 0
    out = capsys.readouterr().out
    assert "scored runs: 10x extra" in out and "total      chinchilla  round 0" in out


def test_fit_calibration_reports_coverage(tmp_path, capsys):
    fit_calibration.main(["--datasets", "2", "--n-boot", "10", "--out", str(tmp_path / "c.json")])
    summary = json.loads((tmp_path / "c.json").read_text())
    assert summary["datasets"] == 2 and set(summary["mc_sd"]) == {"alpha", "beta", "a_opt"}


def test_moe_aux_loss_trains_every_weight(capsys):
    assert moe_aux_loss.main(["--steps", "2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith(("0.0 ", "0.1"))]
    assert len(rows) == 4  # aux weights 0.0 and 0.1, dropless and capacity 1.0


def test_plan_public_writes_the_run_and_recipe_tables(tmp_path, capsys):
    assert plan_public.main(["--out", str(tmp_path)]) == 0
    assert "175B held out" in capsys.readouterr().out
    assert (tmp_path / "gpt3_runs.csv").exists() and (tmp_path / "gpt3_recipe.csv").exists()


def test_an_experiments_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """Every experiment's __main__ is run_script(main, __file__): a UsageError is one line naming the
    value and the fix, exit 2, no traceback; a finished main's return code is the exit code."""
    monkeypatch.setattr(sys, "argv", ["e_from_curves.py", str(tmp_path / "missing")])
    with pytest.raises(SystemExit) as e:
        run_script(e_from_curves.main, e_from_curves.__file__)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"e_from_curves.py: error: {tmp_path / 'missing'} does not exist\n"
    with pytest.raises(SystemExit) as e:
        run_script(lambda: 3, "x.py")
    assert e.value.code == 3


def test_fit_public_scores_one_family_held_out(capsys):
    """The Hitchhiker's-guide split on GPT-3's curves (its largest model held out), Approach 3 only."""
    assert fit_public.main(["--families", "GPT-3", "--no-curves"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("GPT-3")]
    assert len(rows) == 1 and rows[0][1] == "7" and rows[0][4].endswith("%")  # 7 models fitted, 175B scored


def test_planner_calibrate_fits_the_constants_on_measured_steps(capsys):
    assert planner_calibrate.main(["--steps", "1", "--models", "tiny-1m"]) == 0
    out = capsys.readouterr().out
    assert out.count("tiny-1m ") == 2 and "held-out mean |error|: default mfu=" in out and "calibrated mfu=" in out


def test_seed_noise_pools_the_sd_of_each_point(tmp_path, capsys):
    """The demo's two points under two seeds each, trained by the synthetic law instead of Ray."""
    trainer = synthetic_trainer(SyntheticLaw(), noise_std=0.003)
    seed_noise.main(["--out", str(tmp_path / "store"), "--seeds", "2"], trainer=trainer)
    out = capsys.readouterr().out
    assert "N= 47,264:" in out and "N= 86,256:" in out and "pooled sd(log loss) = " in out


def test_e_from_curves_fits_the_curve_law_on_every_checkpoint(tmp_path, capsys):
    write_synthetic_sweep(tmp_path / "store", isoflop_design([1e12, 3e12, 1e13]), SyntheticLaw(), seeds=[0])
    e_from_curves.main([str(tmp_path / "store"), "--boot", "2", "--max-flops", "3e12"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("runs at or below 3e+12 FLOPs (4 runs): E = ") and lines[1].startswith("every run (7")


def test_stack_bagging_scores_every_weighting_of_one_trial(capsys):
    """One synthetic trial: the round-0 fit, its 3x pair, the refit and each weighting at 10x and 30x."""
    stack_bagging.main(["--trials", "1", "--kinds", "chinchilla"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("chinchilla", "all"))]
    assert [r[1] for r in rows] == ["10x", "30x", "10x", "30x"] and all(r[-1].endswith("%") for r in rows)


def test_fit_public_sensitivity_scores_both_splits_of_each_setting(tmp_path, capsys):
    """QUICK_GRID's two settings on LM-1: each fitted held-out and nested, the default among them."""
    assert fit_public_sensitivity.main(["--families", "LM-1", "--quick", "--json", str(tmp_path / "s.json")]) == 0
    (summary,) = json.loads((tmp_path / "s.json").read_text()).values()
    scores = [summary[k][s] for k in ("default", "nested_pick", "best_heldout") for s in ("heldout", "nested")]
    assert all(0 < x < 0.5 for x in scores) and "Spearman(nested, held-out)" in capsys.readouterr().out


def test_fit_public_weighted_fits_both_weightings_through_the_cli(capsys):
    """OPT (the smallest table) through `scalelab fit --weight-col` and `scalelab predict`, as a user runs them."""
    assert fit_public_weighted.main(["--families", "OPT", "--starts", "4"]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("OPT")]
    assert row[1].endswith("%") and row[2].endswith("%") and row[1] != row[2]  # the weights change the fit


def test_fit_public_auto_scores_chinchilla_and_the_stacked_law(tmp_path):
    """OPT through `scalelab fit --law chinchilla` and `--law auto` (2 replicates, 4 starts) and `scalelab predict`."""
    argv = ["--families", "OPT", "--bootstrap", "2", "--starts", "4", "--json", str(tmp_path / "a.json")]
    assert fit_public_auto.main(argv) == 0
    (row,) = json.loads((tmp_path / "a.json").read_text())
    assert row["family"] == "OPT" and all(0 < row[law]["are"] < 0.5 for law in ("chinchilla", "auto"))
    assert 0 < row["auto"]["width"] < 1 and abs(sum(row["weights"].values()) - 1) < 1e-9


def test_extrapolation_scale_calibrates_on_one_trial_and_scores_another(tmp_path, capsys):
    """One chinchilla trial calibrates each variant's scale, a second is scored (both fitted in this process);
    truths without a calibration truth among them are refused before anything is fitted."""
    with pytest.raises(UsageError, match="name at least one calibration truth"):
        extrapolation_scale.main(["--kinds", "farseer"])
    argv = ["--trials", "1", "--bootstrap", "2", "--kinds", "chinchilla", "--out", str(tmp_path / "t.json")]
    extrapolation_scale.main(argv)
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("chinchilla")]
    assert [r[1] for r in rows] == ["3x", "10x", "30x"] * 2 and out.count("<- chosen") == 1
    trials = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert [(t["kind"], t["seed"]) for t in trials] == [("chinchilla", 0), ("chinchilla", 1)]
    assert all(t["targets"]["30"]["extrapolation"] > 0 for t in trials)


# a truth whose compute-optimal tokens per parameter (~20) sit at the demo design's centre, so that the
# first round's gates pass and the smoke runs fit twice (round 0 -> 3x, 3x -> 10x)
CENTRED = SyntheticLaw(B=120.0)
TRAIN = synthetic_trainer(CENTRED, noise_std=0.003)


@pytest.fixture(scope="module")
def closed_loop_store(tmp_path_factory, one_thread):
    """experiments/closed_loop.py at two distances (3x, 10x), 2 bootstrap replicates per fit, trained by
    the synthetic law: (the store root, what it printed). design_distance's test reuses the store."""
    root = tmp_path_factory.mktemp("closed_loop")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        closed_loop.main(["--out", str(root), "--multiples", "3,10", "--bootstrap", "2"], trainer=TRAIN)
    return root, out.getvalue()


def test_closed_loop_scores_every_rounds_prediction_of_the_far_runs(closed_loop_store, tmp_path):
    """Round 0's fit proposes the 3x pair, the 3x round's the 10x pair; every fit predicts every later run.
    Distances that do not start at 3 and grow are refused before anything runs."""
    with pytest.raises(UsageError, match="--multiples 10,3: give increasing distances from 3"):
        closed_loop.main(["--out", str(tmp_path), "--multiples", "10,3"], trainer=TRAIN)
    assert not any(tmp_path.iterdir())
    _, out = closed_loop_store
    assert "round 1: 12 runs fitted" in out and "round 2: 14 runs fitted" in out
    cells = [line for line in out.splitlines() if line.startswith("  round ") and " fit -> " in line]
    assert [c.split("->")[1].split()[0] for c in cells] == ["3x", "10x", "10x"]  # round 1's fit, then the 3x round's
    assert re.search(r"coverage: \d of 4 scored predictions", out)  # the 3x and 10x pairs, each as proposed


def test_design_distance_links_the_loops_first_round_and_scores_its_far_runs(closed_loop_store, capsys):
    """up4 in the closed-loop store's root: its 12 demo-budget runs linked, the 4 at 6.3e12 trained."""
    root, _ = closed_loop_store
    design_distance.main(["--root", str(root), "--seed", "1", "--bootstrap", "2"], trainer=TRAIN)
    out = capsys.readouterr().out
    assert "12 of them the store's round-0 runs" in out and "simulated 4 run(s) of 16" in out
    assert "2.0e+13 (3.2x / 10x): up4 " in out and "first round " in out and "ladder " in out


def lr_penalty(run, best: float) -> float:
    """exp(0.05 ln(lr / best)^2): the loss factor of a run trained off the best LR."""
    return math.exp(0.05 * math.log(run.config["optim"]["lr"] / best) ** 2)


def sp_moves_best_lr(run) -> float:
    """A best LR that falls as 1/width under sp and stays at 8e-3 under mup and completep."""
    m = run.config["model"]
    return 8e-3 * (16 / m["d_model"] if m["parametrization"] == "sp" else 1.0)


def lr_truth(best_lr):
    """A run's loss: the synthetic law's at its (N, D) times lr_penalty(run, best_lr(run)), so that an
    LR experiment's analysis has an optimum to find (0.3% noise on top)."""

    def loss(run) -> float:
        return float(SyntheticLaw().loss(run.params, run.num_tokens)) * lr_penalty(run, best_lr(run))

    return synthetic_trainer(loss, noise_std=0.003)


def test_lr_sweep_finds_the_truths_lr_law(tmp_path, capsys):
    """The truth's best LR falls as N^-0.44 through the grid's three sizes: the sweep's law finds it."""
    truth = lr_truth(lambda run: 7e-3 * (run.params / 2.9e4) ** -0.44)
    lr_sweep.main(["--out", str(tmp_path / "lr_sweep")], trainer=truth)
    out = capsys.readouterr().out
    exponent = float(re.search(r"fitted law: lr = \S+ \(N / \S+\)\^(\S+) ", out).group(1))
    assert abs(exponent + 0.44) < 0.05 and "(best at the grid's edge" not in out and "LR sweep (14 runs" in out


def test_lr_transfer_sees_sp_move_and_mup_stay(tmp_path, capsys):
    """Under sp the truth's best LR falls as 1/width, under mup and completep it stays: the table says so."""

    lr_transfer.main(["--out", str(tmp_path / "lr_transfer")], trainer=lr_truth(sp_moves_best_lr))
    out = capsys.readouterr().out
    moved = {p: float(w) for p, w in re.findall(r"^(\w+): best LR moves by at most (\S+) grid", out, re.M)}
    assert (
        set(moved) == {"sp", "mup", "completep"} and moved["sp"] > 1.5 and max(moved["mup"], moved["completep"]) < 0.5
    )


def test_transfer_gate_refuses_sp_and_passes_mup(tmp_path, capsys):
    """The truth's best LR falls as 1/width under sp (off the grid's low edge at d_model 128) and stays
    under mup: the gate refuses sp's ladder before it is written and trains mup's at the base's best LR."""

    assert transfer_gate.main(["--out", str(tmp_path)], trainer=lr_truth(sp_moves_best_lr)) == 0
    out = capsys.readouterr().out
    assert "sp refused (exit 2) and mup passed (exit 0): as expected" in out
    assert "no bracketed minimum for d_model 128 x 1 layers" in out and "; the ladder takes lr " in out
    assert not (tmp_path / "ladder-sp").exists()  # a refused ladder writes nothing
    ladder = store.load_runs(tmp_path / "ladder-mup")
    (lr,) = set(ladder["lr"])
    assert ladder.height == 3 and set(ladder["status"]) == {"done"} and abs(math.log2(lr / 8e-3)) < 0.5


def _tables(out: str) -> dict[str, str]:
    """curve_sweeps' printed tables by number ("## 1. ..." up to the next)."""
    return dict(re.findall(r"^## (\d)\. (.*?)(?=^## \d\.|\Z)", out, re.M | re.S))


def _mean_abs_err(table: str, law: str, label: str = "") -> float:
    """A table's `[label: ]law: mean |err| X%` summary, as a fraction."""
    return float(re.search(rf"{label}\s*{law}: mean \|err\| (\S+)%", table).group(1)) / 100


def test_curve_sweeps_prints_every_table_on_simulated_curves(tmp_path, capsys):
    """--quick: 4 IsoFLOP runs (and again with early stopping), 3 WSD runs, 6 schedule runs, whose validation
    curves follow lr_annealing: the law fits them to their noise, predicts the WSD branches and the cosine
    runs, the annealing bonus C comes out near the truth's, and early stopping stops a run near its loss."""
    argv = ["--quick", "--out", str(tmp_path), "--bootstrap", "2", "--replay-boot", "2", "--replay-backtests", "0"]
    assert curve_sweeps.main([*argv, "--tolerances", "0.01"], trainer=curve_trainer()) == 0
    out = capsys.readouterr().out
    assert [line.split()[3] for line in out.splitlines() if line.startswith("# sweep")] == ["4", "4", "3", "6"]
    tables = _tables(out)
    assert _mean_abs_err(tables["1"], "lr_annealing", "in-sample:") < 0.005
    assert _mean_abs_err(tables["1"], "lr_annealing", "others complete:") < 0.015
    assert _mean_abs_err(tables["2"], "lr_annealing") < 0.01  # the branches from their stable run alone
    c = float(re.search(r"constant \+ wsd: fitted C = (\S+) ", tables["3"]).group(1))
    assert abs(c / CURVE_PARAMS["C"] - 1) < 0.3
    assert "runs stopped: 1 of 4;" in tables["4"] and "tolerance 1%: 1 of 4 runs stopped" in tables["4"]
    (stopped,) = [line.split() for line in tables["4"].splitlines() if re.match(r"[0-9a-f]{12} .* \[", line)]
    assert abs(float(stopped[-1].rstrip("%"))) < 1  # its predicted final loss against the full sweep's run


def test_curve_sweeps_mup_tunes_the_base_lr_then_scores_the_sweep(tmp_path, capsys):
    """The base model's LR sweep finds the truth's optimum (6e-3, a loss factor exp(0.05 ln(lr/6e-3)^2) on
    the lr_annealing curves), the --quick IsoFLOP sweep trains at it, table 1 scores it."""
    truth = CurveTruth(factor=lambda run: lr_penalty(run, 6e-3))
    trainer = curve_trainer(truth)
    assert curve_sweeps_mup.main(["--quick", "--out", str(tmp_path)], trainer=trainer) == 0
    out = capsys.readouterr().out
    best = float(re.search(r"best LR (\S+) \[.*\] \(bracketed: True\)", out).group(1))
    assert abs(math.log(best / 6e-3)) < 0.1 and "# base LR sweep (12 runs" in out
    assert set(store.load_runs(tmp_path / "full" / "iso_completep")["lr"]) == {best}
    assert _mean_abs_err(_tables(out)["1"], "lr_annealing", "in-sample:") < 0.005
