"""Early stopping: the spec section, the decision on simulated curves, the train-loop stop at a checkpoint,
an early-stopping sweep on the session's local Ray, and fits over stores with stopped runs (include /
exclude), plus `scalelab fit STORE --law auto`."""

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from scalelab import store
from scalelab.cli.main import main
from scalelab.errors import ConfigError
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.selection.simulate import simulate_curve
from scalelab.store.records import read_status
from scalelab.sweeps.closed_loop.store_fit import fit_frame
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.specs.spec import expand_sweep
from scalelab.sweeps.tracking.early_stop import EarlyStopConfig, decide, parse_early_stop
from scalelab.sweeps.tracking.run_curves import planned_lr, run_curve
from scalelab.train.config import build_run_config, to_dict
from scalelab.train.loop import StopRun, train_run
from scalelab.train.schedule import lr_at

TRUE = {"E": 1.0, "A": 60.0, "B": 80.0, "C": 0.25, "alpha": 0.3, "beta": 0.3}
RUN = {
    "name": "t",
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 8},
    "train": {"num_tokens": 12 * 256, "global_batch_tokens": 256, "seed": 3},
    "eval": {"interval_steps": 4, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 4, "keep_last": 2},
    "logging": {"wandb": "disabled", "progress": "off"},
}


def test_parse_early_stop_names_the_bad_key():
    assert parse_early_stop(None) is None and parse_early_stop(False) is None
    assert parse_early_stop(True) == EarlyStopConfig()
    assert parse_early_stop({"tolerance": 0.02}).tolerance == 0.02
    with pytest.raises(ConfigError, match="early_stop.tolerence: unknown key"):
        parse_early_stop({"tolerence": 0.02})
    with pytest.raises(ConfigError, match="early_stop.min_fraction"):
        parse_early_stop({"min_fraction": 1.5})
    with pytest.raises(ConfigError, match="early_stop.law"):
        parse_early_stop({"law": "chinchilla"})
    with pytest.raises(ConfigError, match="early_stop"):
        expand_sweep({"name": "x", "base": {}, "grid": {"optim.lr": [1e-3]}, "early_stop": {"n_boot": 2}})


def _cosine(steps: int) -> np.ndarray:
    kw = dict(name="cosine", peak_lr=3e-3, total_tokens=steps * 1024, warmup_tokens=20 * 1024)
    return np.array([lr_at((s - 1) * 1024, **kw) for s in range(1, steps + 1)])


def test_decide_stops_a_run_whose_final_loss_is_known():
    finished = [
        simulate_curve(TRUE, run_id=f"r{i}", params=n, lr=_cosine(t), seed=i, noise_sigma=0.002, decay=0.99)
        for i, (n, t) in enumerate([(2e4, 800), (5e4, 800), (1.2e5, 800), (2e4, 1600), (5e4, 1600)])
    ]
    target = simulate_curve(TRUE, run_id="t", params=1.2e5, lr=_cosine(1600), seed=9, noise_sigma=0.002, decay=0.99)
    losses = np.array([c.final_loss for c in finished])
    cfg = EarlyStopConfig(tolerance=0.01, n_boot=16)
    step = int(0.4 * target.num_steps)
    d = decide(target.prefix(max_step=step), finished, losses, step, cfg)
    assert d.stop, d.reason
    assert abs(d.predicted_loss / target.final_loss - 1) < 0.01
    assert d.interval[0] < d.predicted_loss < d.interval[1] and d.half_width <= 0.01
    too_few = decide(target.prefix(max_step=step), finished[:2], losses[:2], step, cfg)
    assert not too_few.stop and "min_runs" in too_few.reason
    strict = decide(target.prefix(max_step=step), finished, losses, step, EarlyStopConfig(tolerance=1e-5, n_boot=16))
    assert not strict.stop and "half-width" in strict.reason


def test_misspecification_from_backtests_widens_the_interval():
    """Finished runs whose recorded losses the law misses by ~3% (as on the CPU sweeps): the backtest
    of the prefix prediction measures the miss and keeps the interval from claiming 1%."""
    runs = [(2e4, 800), (5e4, 800), (1.2e5, 800), (2e4, 1600), (5e4, 1600)]
    finished = [
        simulate_curve(TRUE, run_id=f"r{i}", params=n, lr=_cosine(t), seed=i, noise_sigma=0.002, decay=0.99)
        for i, (n, t) in enumerate(runs)
    ]
    miss = np.array([0.03, -0.03, 0.03, -0.03, 0.03])  # the law's error on each run's recorded loss
    losses = np.array([c.final_loss for c in finished]) * np.exp(miss)
    target = simulate_curve(TRUE, run_id="t", params=1.2e5, lr=_cosine(1600), seed=9, noise_sigma=0.002, decay=0.99)
    step = int(0.4 * target.num_steps)
    cache: dict = {}
    honest = decide(target.prefix(max_step=step), finished, losses, step, EarlyStopConfig(n_boot=16), cache)
    assert honest.n_backtest == len(finished) and 0.02 < honest.misspecification < 0.06, honest.reason
    assert not honest.stop and honest.half_width > 0.04, honest.reason
    lo_b, hi_b = honest.interval_bootstrap
    assert honest.interval[0] < lo_b and honest.interval[1] > hi_b
    assert len(cache) == 1  # a second check at the same fraction reuses the backtests
    blind = decide(target.prefix(max_step=step), finished, losses, step, EarlyStopConfig(n_boot=16, backtest_runs=0))
    assert blind.n_backtest == 0 and blind.half_width < 0.02


def test_train_run_stops_at_a_checkpoint_with_records_flushed(tmp_path):
    cfg = build_run_config(RUN)

    def stop_at_8(kind, record):
        if kind == "checkpoint" and record["step"] == 8:
            raise StopRun("stopped_early", {"predicted_loss": 3.0, "stopped_step": 8})

    summary = train_run(cfg, tmp_path, callbacks=[stop_at_8])
    assert summary["status"] == "stopped_early" and summary["predicted_loss"] == 3.0
    status = read_status(tmp_path)
    assert status["status"] == "stopped_early" and status["stopped_step"] == 8 and "traceback" not in status
    assert pl.read_parquet(tmp_path / "metrics.parquet")["step"].max() == 8
    assert (tmp_path / "checkpoints" / "step_8").is_dir()
    assert store.run_state(tmp_path) in store.TERMINAL
    lr, tps = planned_lr(to_dict(cfg))
    logged = pl.read_parquet(tmp_path / "metrics.parquet")["lr"].to_numpy()
    np.testing.assert_allclose(lr[:8], logged)  # the planned schedule is the one the loop used
    curve = run_curve(tmp_path, source="val")
    assert curve.num_steps == 12 and curve.steps.tolist() == [4, 8] and tps == 256


SWEEP = {
    "name": "es",
    "base": {
        "model": {"preset": "debug"},
        "data": {"seq_len": 64, "val_sequences": 8},
        "train": {"global_batch_tokens": 256, "num_tokens": 8192},
        "eval": {"interval_steps": 0, "val_batch_sequences": 8},
        "checkpoint": {"interval_steps": 8},
        "logging": {"wandb": "disabled", "progress": "off"},
    },
    "grid": {"model.d_model": [32, 48, 64, 96]},
    "execution": {"max_failures": 1, "max_concurrent": 1},
    "early_stop": {"tolerance": 0.5, "min_fraction": 0.3, "min_runs": 2, "n_boot": 8, "source": "train"},
}


def test_early_stopping_sweep_and_fits_with_and_without_stopped_runs(ray_local, tmp_path, capsys):
    out = tmp_path / "root" / "es"
    result = launch(expand_sweep(SWEEP), out, spec_text=yaml.safe_dump(SWEEP), log=lambda m: None)
    states = result["states"]
    assert set(states.values()) <= {"done", "stopped_early"}
    assert list(states.values()).count("done") >= 2 and "stopped_early" in states.values()
    runs = store.load_runs(out)
    stopped = runs.filter(pl.col("status") == "stopped_early")
    assert stopped["predicted_loss"].is_not_null().all() and (stopped["stopped_fraction"] < 1).all()
    status = read_status(store.run_path(out, stopped["run_id"][0]))
    lo, hi = status["predicted_loss_interval"]
    assert lo < status["predicted_loss"] < hi and status["saved_flops"] > 0
    checks = [e for e in store.read_events(out) if e["event"] == "early_stop_check"]
    assert checks and all("reason" in e for e in checks)

    inc = fit_frame(runs, FitOptions(stopped="include"), store_path=out)
    exc = fit_frame(runs, FitOptions(stopped="exclude"), store_path=out)
    assert inc.height == len(states) and exc.height == list(states.values()).count("done")
    w = inc.filter(pl.col("status") == "stopped_early")["weight"]
    assert ((w > 0) & (w <= 1)).all() and (inc.filter(pl.col("status") == "done")["weight"] == 1).all()

    # a stopped run is terminal: launching the spec again trains nothing
    again = launch(expand_sweep(SWEEP), out, spec_text=yaml.safe_dump(SWEEP), log=lambda m: None)
    assert again["trained"] == []

    capsys.readouterr()
    assert main(["fit", str(out), "--law", "power_law", "--stopped", "include", "--no-backtest", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_points"] == inc.height
    if exc.height <= 3:  # without the stopped runs too few remain for 3 parameters: one line, exit 2
        assert main(["fit", str(out), "--law", "power_law", "--stopped", "exclude", "--no-backtest"]) == 2
        assert "too few" in capsys.readouterr().err


def test_fit_store_law_select_reports_every_candidate(tmp_path, capsys):
    from scalelab.analysis.synthetic import SyntheticLaw, isoflop_design, write_synthetic_sweep

    sweep = tmp_path / "syn"
    write_synthetic_sweep(sweep, isoflop_design([1e13, 3e13, 1e14]), SyntheticLaw(), num_evals=6)
    capsys.readouterr()
    # One selection (it fits every candidate law, the slow part) gives both the printed table and,
    # with --out, the whole report as JSON: the object `--json` prints, plus the samples.
    saved = tmp_path / "fit.json"
    assert main(["fit", str(sweep), "--law", "select", "--out", str(saved)]) == 0
    text = capsys.readouterr().out
    assert "law selection: held-out largest FLOP budget" in text and "chosen" in text
    report = json.loads(saved.read_text())
    names = {c["name"]: c for c in report["selection"]["candidates"]}
    assert set(names) == {"chinchilla", "kaplan", "data_constrained", "lr_annealing", "lr_area", "average"}
    assert "skipped" in names["data_constrained"] and "mare" in names["lr_annealing"]
    assert report["law"] == report["selection"]["chosen"]


def test_predict_task_on_a_table(tmp_path, capsys):
    from scalelab.analysis.synthetic import SyntheticLaw, isoflop_design, write_synthetic_sweep

    sweep = tmp_path / "syn"
    law = SyntheticLaw()
    write_synthetic_sweep(sweep, isoflop_design([1e13, 3e13, 1e14]), law, seeds=[0, 1], num_evals=6)
    rows = []  # what another framework's export looks like: one row per checkpoint
    for run_dir in sorted((sweep / "runs").iterdir()):
        status = json.loads((run_dir / "status.json").read_text())
        ev = pl.read_parquet(run_dir / "evals.parquet").filter(pl.col("task") == "synthetic/mc")
        wide = ev.pivot(on="metric", index=["step", "tokens"], values="value").sort("step")
        for r in wide.iter_rows(named=True):
            rows.append(
                {
                    "run_id": run_dir.name,
                    "params": status["params"],
                    "tokens": r["tokens"],
                    "step": r["step"],
                    "mc/bpb": r["bpb"],
                    "mc/acc": r["acc"],
                }
            )
    table = tmp_path / "ladder.csv"
    pl.DataFrame(rows).write_csv(table)
    capsys.readouterr()
    args = ["predict-task", str(table), "--task", "mc", "--params", "2e6", "--tokens", "1e8", "--bootstrap", "20"]
    assert main([*args, "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["n_runs"] == len({r["run_id"] for r in rows}) and 0.0 <= pred["acc"] <= 1.0
    assert pred["bpb_interval"][0] < pred["bpb"] < pred["bpb_interval"][1]
    assert main(["predict-task", str(table), "--task", "nope", "--params", "1e6", "--tokens", "1e8"]) == 2
    assert "tasks in this table: mc" in capsys.readouterr().err
    assert Path(table).exists()
