"""`scalelab plan-run` on synthetic stores and fits (no training): the plan reproduces `sweep next`'s run and
interval, the CPU calibration, the GPU layout and what-ifs, the HP parts, bad input, the planning page."""

import base64
import io
import json
import math
import re
import shutil

import matplotlib.image as mpimg
import numpy as np
import polars as pl
import pytest
import yaml
from chromium_check import render_and_check

from scalelab import store
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.cli.main import main
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.estimate.io import read_runs
from scalelab.models.config import ModelConfig
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.planner import CostConstants, Hardware, estimate, plan_layouts
from scalelab.planning import whatif
from scalelab.planning.cluster import cpu_cluster, gpu_cluster
from scalelab.planning.design import fit_design
from scalelab.planning.hparams import HParam, read_hp_sweep, table_hparams, transfer_hparams
from scalelab.planning.loss_model import load_loss_model
from scalelab.planning.plan_layout import gpu_overrides
from scalelab.planning.whatif import scale_what_ifs
from scalelab.sweeps.closed_loop.propose import propose_next
from scalelab.sweeps.recipes.recipe import parse_recipe, peak_lr
from scalelab.sweeps.recipes.transfer import evaluate_gate, plan_transfer
from scalelab.sweeps.specs.spec import expand_sweep
from scalelab.train.config import build_run_config
from scalelab.train.identity import config_hash

LAW = SyntheticLaw()
SPEC = {
    "name": "fake",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "recipe": {"min_steps": 50, "shape": {"min_layers": 2, "width_per_layer": 16, "min_width": 16}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5}, "span": 3},
    "fit": {"bootstrap": 8},
}
RATE, PER_STEP = 2e10, 0.02  # the synthetic CPU: FLOP/s and seconds of fixed cost per step


def _quiet(_):
    pass


def _steps_and_flops(config: dict) -> tuple[int, float]:
    """(optimizer steps, the planner's FLOPs per step) of a run config: one process, peak 1, mfu 1."""
    c = build_run_config(config)
    seqs = c.tokens_per_step // c.seq_len
    unit = estimate(c.model, ParallelConfig(), micro_batch_sequences=seqs, seq_len=c.seq_len,
                    global_batch_sequences=seqs, hw=Hardware(peak_flops=1.0, host_runs_ahead=False,
                    compute_dtype_bytes=4), consts=CostConstants(mfu=1.0))  # fmt: skip
    return c.num_steps, unit.step_time_s


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A finished synthetic IsoFLOP sweep with its `sweep next` round and timed runs."""
    sd = tmp_path_factory.mktemp("plan") / "fake"
    ids = launch_synthetic(SPEC, sd, LAW, noise_std=0.003)
    for run_id in ids:  # each run "took" steps x (its FLOPs per step / RATE + PER_STEP) seconds
        steps, flops = _steps_and_flops(json.loads((store.run_path(sd, run_id) / "config.json").read_text()))
        store.append_event(sd, "end", run_id, status="done", train_s=steps * (flops / RATE + PER_STEP))
    proposal = propose_next(sd, target_flops=1e13, budget_flops=9.5e12, replicates=8, log=_quiet)
    return sd, proposal


def test_plan_at_the_next_budget_is_the_run_sweep_next_proposed_with_its_interval(sweep, tmp_path, capsys):
    sd, proposal = sweep
    first = proposal["proposals"][0]
    assert first["kind"] == "compute_optimal"
    out = tmp_path / "plan"
    assert main(["plan-run", str(sd), "--flops", str(first["budget"]), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    # the same run (shape rule, recipe, whole steps: the id is the config's hash) and the same interval
    assert plan["run"]["run_id"] == first["run_id"]
    assert plan["loss"]["point"] == pytest.approx(first["predicted_loss"], rel=1e-9)
    assert [plan["loss"]["lo"], plan["loss"]["hi"]] == pytest.approx(first["predicted_interval"], rel=1e-9)
    assert "predicted loss" in text and "wall time" in text and first["run_id"] in text
    # the written config trains exactly that run
    assert config_hash(build_run_config(yaml.safe_load((out / "run.yaml").read_text()))) == first["run_id"]
    assert expand_sweep(yaml.safe_load((out / "sweep.yaml").read_text())).runs[0].run_id == first["run_id"]
    # rounding: the chosen shape has the lowest law loss among those listed, and the point carries its cost
    chosen = [s for s in plan["shapes"] if [s["num_layers"], s["d_model"]] == plan["run"]["chosen_shape"]]
    assert chosen and chosen[0]["loss"] == min(s["loss"] for s in plan["shapes"])
    assert math.exp(plan["shifts"]["rounding"]) * plan["optimum"]["loss"]["point"] == pytest.approx(
        plan["loss"]["point"], rel=1e-3
    )


def test_cpu_cluster_recovers_the_machine_from_the_sweep_runs(sweep):
    sd, _ = sweep
    c = cpu_cluster(sd)
    assert c.hw.peak_flops == pytest.approx(RATE, rel=1e-3)
    assert c.step_overhead_s == pytest.approx(PER_STEP, rel=1e-3)
    assert c.band.lo == pytest.approx(1.0, abs=1e-3) and c.band.hi == pytest.approx(1.0, abs=1e-3)
    assert c.band.n == 15 and c.band.within_15 == 15


def _retimed(sd, dest, cpu_of):
    """A copy of the sweep's runs (their configs) in `dest` whose end events carry the wall time of
    a loaded machine (each run at its own share of a core) and the CPU time cpu_of(run id, seconds)."""
    for i, run_id in enumerate(sorted({e["run_id"] for e in store.read_events(sd)})):
        config = json.loads((store.run_path(sd, run_id) / "config.json").read_text())
        run_dir = store.run_path(dest, run_id)
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps(config))
        steps, flops = _steps_and_flops(config)
        cpu = steps * (flops / RATE + PER_STEP)
        share = (0.2, 0.35, 0.5, 0.9)[i % 4]  # what the other processes left this run
        store.append_event(dest, "end", run_id, status="done", train_s=cpu / share, **cpu_of(run_id, cpu))
    return dest


def test_cpu_cluster_fits_cpu_seconds_when_every_run_has_them(sweep, tmp_path):
    sd, _ = sweep
    c = cpu_cluster(_retimed(sd, tmp_path / "cpu", lambda _, cpu: {"train_cpu_s": cpu}))
    assert c.hw.peak_flops == pytest.approx(RATE, rel=1e-3)  # the load's wall time does not enter
    assert c.step_overhead_s == pytest.approx(PER_STEP, rel=1e-3)
    assert c.band.clock == "CPU" and "CPU seconds" in c.band.source and "idle core" in c.label
    assert c.band.lo == pytest.approx(1.0, abs=1e-3) and c.band.hi == pytest.approx(1.0, abs=1e-3)
    # one run without CPU time (a store written before it was recorded): the whole fit is on wall time
    missing = sorted({e["run_id"] for e in store.read_events(sd)})[3]
    old = _retimed(sd, tmp_path / "old", lambda run_id, cpu: {} if run_id == missing else {"train_cpu_s": cpu})
    w = cpu_cluster(old)
    assert w.band.clock == "wall" and "wall seconds" in w.band.source and "sweep's load" in w.label
    assert w.hw.peak_flops < 0.9 * RATE and w.band.hi / w.band.lo > 2  # the load is in the wall time


def test_wall_time_is_steps_times_the_calibrated_step(sweep, tmp_path):
    sd, _ = sweep
    out = tmp_path / "p"
    assert main(["plan-run", str(sd), "--flops", "3e13", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    steps, flops = _steps_and_flops(plan["config"])
    assert plan["cost"]["steps"] == steps
    assert plan["cost"]["wall_s"] == pytest.approx(steps * (flops / RATE + PER_STEP), rel=1e-6)
    assert plan["layout"]["mfu"] is None  # a fitted CPU rate has no meaningful peak
    assert plan["what_if"] is None


def test_a_plan_fitted_on_cpu_seconds_times_the_run_alone_and_says_so(sweep, tmp_path, capsys):
    sd, _ = sweep
    copy = tmp_path / "fake"
    shutil.copytree(sd, copy)
    events = store.read_events(copy)
    (copy / "events.jsonl").unlink()
    for e in events:  # the same runs timed on a loaded machine: a third of a core each, CPU time as before
        fields = {k: v for k, v in e.items() if k not in ("event", "run_id", "time", "pid")}
        cpu = fields.pop("train_s")
        store.append_event(copy, e["event"], e["run_id"], **fields, train_s=3 * cpu, train_cpu_s=cpu)
    out = tmp_path / "p"
    assert main(["plan-run", str(copy), "--flops", "3e13", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    steps, flops = _steps_and_flops(plan["config"])
    assert plan["cost"]["wall_s"] == pytest.approx(steps * (flops / RATE + PER_STEP), rel=1e-6)
    assert plan["cost"]["band"]["clock"] == "CPU"
    assert "measured / planned CPU time" in text and "the run alone on one idle core" in text
    assert "its wall time is that over the share of a core the run gets" in text


def test_hp_sweep_gives_the_lr_interval_and_its_cost_enters_the_loss_interval(sweep, tmp_path):
    sd, _ = sweep
    # an LR sweep at two sizes whose loss is exactly a parabola in log2 LR with curvature 0.02, best at 2x
    # and at 0.5x the recipe's LR: the interval is x/÷2, its edge costs 0.02 (log2 2)^2 in log loss

    recipe = parse_recipe(SPEC["recipe"])
    rows = ["params,lr,loss"]
    for n, best in ((3e4, 2 * peak_lr(recipe, 3e4)), (1e5, 0.5 * peak_lr(recipe, 1e5))):
        for k in (-2, -1, 0, 1, 2):
            lr = best * 2.0**k
            rows.append(f"{n},{lr},{1.5 * math.exp(0.02 * k * k)}")
    table = tmp_path / "hp.csv"
    table.write_text("\n".join(rows) + "\n")
    hp = read_hp_sweep(table)
    assert hp.k("lr") == pytest.approx(0.02, rel=1e-6)
    out = tmp_path / "p"
    assert main(["plan-run", str(sd), "--flops", "3e13", "--hp-sweep", str(table), "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    lr = plan["hparams"]["lr"]
    assert lr["interval"] == pytest.approx([lr["value"] / 2, lr["value"] * 2], rel=1e-9)
    assert lr["edge_cost"] == pytest.approx(0.02, rel=1e-6)
    z = 1.959963984540054
    assert plan["loss"]["parts"]["lr"] == pytest.approx(0.02 / z, rel=1e-6)
    without = {k: v for k, v in plan["loss"]["parts"].items() if k not in ("decades",)}
    sd_total = math.sqrt(sum(v * v for v in without.values()))
    assert plan["loss"]["hi"] == pytest.approx(plan["loss"]["point"] * math.exp(z * sd_total), rel=1e-9)
    lr_row = next(s for s in plan["sensitivity"] if s["what"].startswith("LR at the edge"))
    assert lr_row["change"] == pytest.approx(math.expm1(0.02), rel=1e-6)


def test_recipe_table_laws_recover_a_power_law():
    n = np.array([1e8, 1e9, 1e10, 1e11])
    table = pl.DataFrame({"params": n, "lr": 3e-2 * n**-0.25, "batch_tokens": 2e3 * n**0.3, "warmup_tokens": [1e8] * 4})
    hp = table_hparams(table, params=1e12, source="t", sweep=None)
    assert hp.lr.value == pytest.approx(3e-2 * 1e12**-0.25, rel=1e-6)
    assert hp.batch_tokens.value == pytest.approx(2e3 * 1e12**0.3, rel=1e-6)
    assert hp.warmup_tokens == 100_000_000
    assert hp.lr.edge_cost() is None and any("decades out" in n for n in hp.notes)
    assert HParam(value=1.0, interval=(0.25, 2.0), source="", curvature=0.01).edge_cost() == pytest.approx(0.04)


@pytest.fixture(scope="module")
def fit_files(tmp_path_factory):
    """A saved Approach-3 fit (with samples and a hold-out) and an Approach-2 one of a synthetic table."""
    root = tmp_path_factory.mktemp("fits")
    rng = np.random.default_rng(0)
    n, d = [], []
    for c in (1e17, 1e18, 1e19, 1e20):
        for nn in np.geomspace(np.sqrt(c / 120) / 4, np.sqrt(c / 120) * 4, 5):
            n.append(nn)
            d.append(c / (6 * nn))
    n, d = np.array(n), np.array(d)
    loss = LAW.loss(n, d) * np.exp(rng.normal(0, 0.003, n.size))
    data = {"params": n, "tokens": d, "loss": loss}
    table = read_runs(data)
    a3 = fit_runs(table, FitOptions(law="chinchilla", bootstrap=0, starts=60)).to_report(keep_samples=True)
    a2 = fit_runs(table, FitOptions(approach=2)).to_report(keep_samples=True)
    (root / "a3.json").write_text(json.dumps(a3))
    (root / "a2.json").write_text(json.dumps(a2))
    return root / "a3.json", root / "a2.json"


def test_gpu_plan_layout_cost_and_what_ifs(fit_files, tmp_path, capsys):
    a3, _ = fit_files
    out = tmp_path / "gpu"
    args = ["plan-run", str(a3), "--flops", "1e21", "--gpu", "H100-SXM", "--gpus", "64", "--vocab-size", "32000",
            "--seq-len", "2048", "--scale", "16,64,256", "--out", str(out),
            "--html", str(tmp_path / "plan.html")]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    lay, cost = plan["layout"], plan["cost"]
    assert lay["memory_gib"]["total"] <= 80 and 0 < lay["mfu"] < 0.6
    assert cost["wall_s"] == pytest.approx(cost["steps"] * lay["step_time_s"], rel=1e-9)
    assert cost["gpu_hours"] == pytest.approx(cost["wall_s"] * 64 / 3600, rel=1e-9)
    band = cost["band"]
    assert band["n"] == 17 and band["within_15"] == 11  # the published-results check (docs/planner-at-scale.md)
    assert cost["wall_band_s"] == pytest.approx([cost["wall_s"] * band["lo"], cost["wall_s"] * band["hi"]])
    # the written config is the planned layout on 64 GPUs, in bf16 on CUDA

    cfg = build_run_config(yaml.safe_load((out / "run.yaml").read_text()))
    assert cfg.parallel.world_size == 64 and cfg.train.dtype == "bf16"
    assert cfg.optim.lr == pytest.approx(plan["hparams"]["lr"]["value"], rel=1e-3)
    w = plan["what_if"]
    assert [r["num_gpus"] for r in w["rows"]] == [16, 64, 256]
    planned = next(r for r in w["rows"] if r["num_gpus"] == 64)
    assert planned["wall_s"] == pytest.approx(cost["wall_s"], rel=1e-9)  # the what-if at the planned size is the plan
    assert w["ceiling"] == min((r for r in w["rows"] if r["wall_s"]), key=lambda r: r["wall_s"])["num_gpus"]
    assert "DeepSeek" in plan["hparams"]["lr"]["source"]  # no recipe table: the published laws, no interval
    assert "scale what-ifs" in text and "system ceiling" in text
    page = (tmp_path / "plan.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 4
    for b64 in images:
        img = mpimg.imread(io.BytesIO(base64.b64decode(b64)), format="png")
        assert img.shape[0] > 100 and (img[..., :3] < 0.9).mean() > 0.01
    for heading in ("The loss interval, part by part", "Rounding to a concrete model", "Sensitivity", "Cost",
                    "Scale what-ifs"):  # fmt: skip
        assert f">{heading}<" in page


def test_knee_is_where_a_doubling_stops_paying():
    rows = [
        whatif.WhatIfRow(num_gpus=g, layout="x", wall_s=w) for g, w in ((8, 100.0), (16, 51.0), (32, 40.0), (64, 38.0))
    ]
    assert whatif.knee_and_ceiling(rows)[0] == 16  # 16 -> 32 buys x1.28 < x1.41
    assert whatif.knee_and_ceiling(rows)[1].num_gpus == 64
    assert whatif.knee_and_ceiling(rows[:2])[0] is None


@pytest.mark.parametrize(
    "case",
    [
        "approach2",  # a fit without a law of N and D
        "cannot_hold",  # a cluster that cannot hold the model
        "below",  # a budget below the sweep's
        "cpu_fit_file",  # --gpu cpu needs a sweep's runs
    ],
)
def test_bad_input_exits_2_with_one_line_before_anything_is_written(case, fit_files, sweep, tmp_path, capsys):
    a3, a2 = fit_files
    sd, _ = sweep
    out = tmp_path / "out"
    gpu = ["--vocab-size", "32000", "--seq-len", "2048", "--gpu", "A100-80GB"]
    args = {
        "approach2": ["plan-run", str(a2), "--flops", "1e22", *gpu, "--gpus", "8"],
        "cannot_hold": ["plan-run", str(a3), "--flops", "1e25", *gpu, "--gpus", "1", "--scale", "none"],
        "below": ["plan-run", str(sd), "--flops", "1e12"],
        "cpu_fit_file": ["plan-run", str(a3), "--flops", "1e22", "--vocab-size", "32000", "--seq-len", "2048"],
    }[case]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scalelab plan-run: error:")
    assert {"approach2": "law of N and D", "cannot_hold": "no layout holds", "below": "not above the largest budget",
            "cpu_fit_file": "sweep's runs"}[case] in err[0]  # fmt: skip
    assert not out.exists()


def test_what_ifs_of_a_tiny_cluster_say_when_nothing_fits():
    cfg = ModelConfig(vocab_size=32000, num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, d_ff=14336,
                      max_seq_len=2048)  # fmt: skip
    w = scale_what_ifs(cfg, seq_len=2048, batch_tokens=2**21, steps=1000, cluster=gpu_cluster("A100-80GB", 8),
                       sizes=[1, 8])  # fmt: skip
    assert w.rows[0].layout is None and w.rows[1].layout is not None
    assert w.ceiling is w.rows[1] and w.knee is None


def test_a_fit_report_reads_as_the_loop_fit_does(fit_files):
    """A saved fit: its largest budget from the hold-out, its samples as draws, the interval's parts;
    its compute frontier plans the optimum, the surface's L*(C) beside it; its four budgets leave the
    frontier uncalibrated, so a run beyond them is the bracket's, as the loop predicts it."""
    model = load_loss_model(fit_files[0])
    surface = model.surface
    assert model.max_flops == surface.max_flops == pytest.approx(1e20, rel=0.05)
    assert model.min_flops == pytest.approx(1e17, rel=0.05)  # from the budgets' minima the report keeps
    assert len(surface.draws) == 1000 and surface.law == "chinchilla"
    pi = surface.predict(1e9, 2e10)
    assert pi.lo < pi.point < pi.hi and {"bootstrap", "noise"} <= set(pi.parts)
    opt, frontier_opt = model.optimum(1e21), model.inner.optimum(1e21)
    assert opt.n_interval[0] < opt.n < opt.n_interval[1] and opt.n == frontier_opt.n
    assert frontier_opt.loss.parts["decades"] == pytest.approx(1.0, abs=0.03)
    assert opt.beside.startswith("L*(1e+21) frontier") and "surface" in opt.beside
    # the bracket: the surface's prediction and the power law through the budgets' best losses
    low, high = opt.loss.ends
    assert set(opt.loss.parts) == {"surface", "sides"} and opt.loss.point == pytest.approx((low * high) ** 0.5)
    assert surface.predict(opt.n, opt.d, 1e21).point in (low, high)
    run = model.predict(opt.n, opt.d, 1e21)
    assert (run.point, run.lo, run.hi) == (opt.loss.point, opt.loss.lo, opt.loss.hi)


def test_predict_gives_a_far_run_the_bracket_as_plan_run_and_sweep_next_do(fit_files, capsys):
    """`scalelab predict` from the same saved fit: a run beyond its budgets by the bracket (plan-run's
    model), one inside them by the law itself; at another level the same point, the parts rebuilt."""
    a3, _ = fit_files
    model = load_loss_model(a3)
    far, inside = model.optimum(1e21), model.inner.optimum(1e19)
    ns, ds = ["--params", f"{far.n:.6g}", f"{inside.n:.6g}"], ["--tokens", f"{far.d:.6g}", f"{inside.d:.6g}"]
    assert main(["predict", str(a3), *ns, *ds, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    n, d = out["params"][0], out["tokens"][0]
    pi = model.predict(n, d, 6 * n * d)
    assert out["loss"][0] == pytest.approx(pi.point, rel=1e-12) and out["loss_ends"][0] == list(pi.ends)
    assert out["loss_prediction_interval"][0] == pytest.approx([pi.lo, pi.hi], rel=1e-12)
    assert out["loss_interval"][0] is None and out["loss_ends"][1] is None  # inside: the law's own
    assert out["loss_interval"][1] is not None
    law = main(["predict", str(a3), "--params", ns[2], "--tokens", ds[2], "--json"])
    assert law == 0 and json.loads(capsys.readouterr().out)["loss"] == out["loss"][1:]
    assert main(["predict", str(a3), *ns, *ds, "--level", "0.8", "--json"]) == 0
    narrow = json.loads(capsys.readouterr().out)
    lo, hi = narrow["loss_prediction_interval"][0]
    assert narrow["loss"][0] == out["loss"][0] and pi.lo < lo < pi.point < hi < pi.hi
    assert main(["predict", str(a3), *ns, *ds]) == 0
    assert "row 1: beyond the fitted budgets, the bracket" in capsys.readouterr().out
    # allocations: L* past the budgets is the bracket's at the row's (N*, D*), plan-run's optimum
    for cmd in ("predict", "allocate"):
        assert main([cmd, str(a3), "--flops", "1e21", "1e19", "--json"]) == 0
        far_row, inside_row = json.loads(capsys.readouterr().out)["allocations"]
        assert far_row["n_opt"] == pytest.approx(far.n, rel=1e-9)
        assert far_row["loss_opt"] == pytest.approx(far.loss.point, rel=1e-12)
        assert far_row["loss_opt_interval"] == pytest.approx([far.loss.lo, far.loss.hi], rel=1e-12)
        assert far_row["loss_opt_ends"] == list(far.loss.ends) and "loss_opt_ends" not in inside_row
    assert main(["allocate", str(a3), "--flops", "1e21"]) == 0
    assert "L* beyond the fitted budgets by the bracket" in capsys.readouterr().out


@pytest.mark.chromium
def test_plan_page_renders_in_headless_chromium(fit_files, tmp_path):
    page = tmp_path / "plan.html"
    args = ["plan-run", str(fit_files[0]), "--flops", "1e21", "--gpu", "H100-SXM", "--gpus", "64", "--vocab-size",
            "32000", "--seq-len", "2048", "--scale", "16,64", "--out", str(tmp_path / "p"),
            "--html", str(page)]  # fmt: skip
    assert main(args) == 0
    render_and_check(page, tmp_path, min_images=4)


def test_report_shows_the_plans_under_the_sweep(sweep, tmp_path):
    sd, _ = sweep
    assert main(["plan-run", str(sd), "--flops", "2e13"]) == 0  # default --out: the sweep's plans/
    assert (sd / "plans" / "plan-C2e13" / "plan.json").is_file()
    out = tmp_path / "report.html"
    assert main(["report", str(sd), "-o", str(out), "--bootstrap", "0"]) == 0
    text = out.read_text()
    assert ">Plan: C = 2e+13 FLOPs on 1 x cpu" in text and ">The loss interval, part by part<" in text


def test_a_pipeline_layout_becomes_a_config_that_builds():
    """The planner's micro-batch under a pipeline is the pipeline's (pp_microbatches of them per step):
    the run config must not also accumulate over it in the loop."""
    design = fit_design(vocab_size=32000, seq_len=2048)
    shape = design.shape(7e9)

    plans = plan_layouts(ModelConfig(**shape), num_gpus=16, seq_len=2048, global_batch_tokens=2**21,
                         hw=gpu_cluster("H100-SXM", 16).hw)  # fmt: skip
    piped = next(p for p in plans if p.parallel.pp > 1 and p.micro_batch_sequences == 1)
    extra = {**gpu_overrides(piped), "optim.lr": 3e-4, "train.global_batch_tokens": 2**21}
    run = design.resolve(shape, 2**21 * 100, extra, {})
    assert run.config["parallel"]["pp"] == piped.parallel.pp and run.config["train"]["micro_batch_sequences"] == 0


def test_days_solve_for_the_budget_the_cluster_affords(sweep, tmp_path):
    sd, _ = sweep
    out = tmp_path / "d"
    assert main(["plan-run", str(sd), "--days", "0.02", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["cost"]["wall_s"] == pytest.approx(0.02 * 86400, rel=0.01)
    assert plan["flops_note"].startswith("solved") and plan["flops"] > 3e12


def test_a_transfer_check_gives_the_transferred_lr_its_interval_and_curvature():
    """µP: every run takes the base size's best LR; the check's base losses give its interval and cost."""
    lrs = [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]
    raw = {
        "name": "lad",
        "base": {"model": {"parametrization": "mup"}, "data": {"seq_len": 32}, "train": {"global_batch_tokens": 128}},
        "ladder": {"sizes": [3.4e4, 1.3e5], "tokens_per_param": [1]},
        "transfer": {"check": True, "lrs": lrs, "tokens_per_param": 0.5, "widths": [32, 256]},
    }
    check = plan_transfer(raw, expand_sweep(raw))
    rows = [dict(d_model=w, num_layers=1, lr=lr, params=w * 1000, status="done", seed=s,
                 final_val_loss=3.0 * math.exp(0.03 * (i - 2) ** 2 + 0.002 * (s - 0.5)))
            for w in (32, 256) for i, lr in enumerate(lrs) for s in (0, 1)]  # fmt: skip
    gate = evaluate_gate(check, pl.DataFrame(rows))
    hp = transfer_hparams(gate, lr=gate.base_lr, batch_tokens=128, sweep=None)
    assert hp.lr.value == pytest.approx(8e-3) and hp.lr.interval[0] < 8e-3 < hp.lr.interval[1]
    assert hp.lr.curvature == pytest.approx(0.03, rel=1e-6)  # log loss = 0.03 (log2 lr/lr*)^2 exactly
    assert "mup transfer" in hp.lr.source and not hp.notes


def test_a_stacked_fit_plans_with_the_stacked_law_and_its_interval(tmp_path):
    """law "auto": the surface's losses are the stacked law's with its parts (the weights' spread among
    them), its optimum the incumbent's N* with the stacked loss there; the plan's optimum is the
    compute frontier's N*, and its runs beyond the fit's four budgets (no calibrated frontier) are
    the bracket's, as `sweep next` reads the fit."""
    rng = np.random.default_rng(0)
    n, d, budgets = [], [], []
    for c in (1e17, 1e18, 1e19, 1e20):
        for nn in np.geomspace(np.sqrt(c / 120) / 4, np.sqrt(c / 120) * 4, 5):
            n, d, budgets = [*n, nn], [*d, c / (6 * nn)], [*budgets, c]
    n, d = np.array(n), np.array(d)
    data = {"params": n, "tokens": d, "loss": LAW.loss(n, d) * np.exp(rng.normal(0, 0.003, n.size)), "budget": budgets}
    sf = fit_runs(read_runs(data), FitOptions(law="auto", bootstrap=10, starts=20))
    assert sf.stacked is not None
    (tmp_path / "round.json").write_text(json.dumps({"fit": sf.to_record()}))
    (tmp_path / "fit.json").write_text(json.dumps(sf.to_report(keep_samples=True)))
    assert sf.brackets(1e22) and not sf.frontier_calibrated  # 4 budgets: beyond them, the bracket
    for path in (tmp_path / "round.json", tmp_path / "fit.json"):
        plan_model = load_loss_model(path)
        model = plan_model.surface  # the surface
        assert model.law.startswith("stacked") and plan_model.law.startswith("stacked")
        got, want = model.predict(1e10, 2e11, 1e22), sf.predict_interval(1e10, 2e11, 1e22)
        assert "weights" in got.parts
        assert [got.point, got.lo, got.hi] == pytest.approx([want.point, want.lo, want.hi], rel=1e-9)
        opt, want_opt = model.optimum(1e22), sf.optimum_interval(1e22)
        assert opt.n == pytest.approx(sf.optimum(1e22)[0], rel=1e-9)
        assert [opt.loss.point, opt.loss.lo, opt.loss.hi] == pytest.approx(
            [want_opt.point, want_opt.lo, want_opt.hi], rel=1e-9
        )
        got, want = plan_model.inner.predict(1e10, 2e11, 1e22), sf.optimal_run_interval(1e10, 2e11, 1e22)
        assert [got.point, got.lo, got.hi] == pytest.approx([want.point, want.lo, want.hi], rel=1e-9)
        got, want = plan_model.predict(1e10, 2e11, 1e22), sf.run_interval(1e10, 2e11, 1e22, optimal=True)
        assert [got.point, got.lo, got.hi, *got.ends] == pytest.approx(
            [want.point, want.lo, want.hi, *want.ends], rel=1e-9
        )
        opt, want_co = plan_model.optimum(1e22), sf.compute_optimal(1e22)
        want_run = sf.run_interval(want_co.n_opt, want_co.d_opt, 1e22, optimal=True)
        assert [opt.n, opt.loss.point, opt.loss.lo, opt.loss.hi] == pytest.approx(
            [want_co.n_opt, want_run.point, want_run.lo, want_run.hi], rel=1e-9
        )
