"""W&B: what a run, a sweep and a round log, read back from the offline files (no network, ever).

The loop's W&B record (group, tags, job type, summary, a live prediction, a stopped run closed);
WANDB_MODE winning over the config; an online run whose server (a closed port on 127.0.0.1) is not
reached logging offline after one warning line; the spec's `wandb:` section; a sweep's tags and
job types; a run trained as a sweep trial trains it, with the live predicted final loss from its
sweep's finished runs; `sweep wandb` on a finished store with its fit run (parameter, gate,
proposal and ledger tables, three plots), the ledger table updated when the proposed run finishes;
and a sweep launched online against a closed port (slow: a driver of its own on the session's Ray).
"""

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalelab import store
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.analysis.wandb_offline import read_offline_run, read_offline_runs
from scalelab.cli.main import main
from scalelab.errors import ConfigError
from scalelab.store import ledger
from scalelab.store.records import read_status
from scalelab.sweeps.closed_loop.propose import propose_next
from scalelab.sweeps.specs.spec import expand_sweep, load_sweep
from scalelab.sweeps.tracking import wandb_runs
from scalelab.sweeps.tracking.wandb_export import log_evals
from scalelab.sweeps.tracking.wandb_fit import fit_run_id, update_ledger
from scalelab.sweeps.tracking.wandb_live import LivePrediction
from scalelab.sweeps.tracking.wandb_runs import parse_wandb_section, run_tags, trial_context
from scalelab.train import loggers
from scalelab.train.config import build_run_config
from scalelab.train.loggers import WandbRun, start_wandb, wandb_mode
from scalelab.train.loop import StopRun, train_run

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = {
    "name": "w",
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"num_tokens": 12 * 256, "global_batch_tokens": 256, "seed": 1},
    "eval": {"interval_steps": 0, "val_batch_sequences": 8},
    "checkpoint": {"interval_steps": 0},
    "logging": {"wandb": "offline", "progress": "off"},
}


@pytest.fixture
def offline(monkeypatch):
    """W&B offline for this test (CI and conftest set WANDB_MODE=disabled), no server anywhere."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runs(path: Path):
    """The offline runs under `path`, once wandb's service has written them out (it writes behind)."""
    return read_offline_runs(path, wait_s=60)


def _one_run(path: Path):
    runs = _runs(path)
    assert len(runs) == 1, [r.path for r in runs]
    return runs[0]


def test_the_loop_logs_group_tags_summary_and_what_predict_returns(offline, tmp_path):
    seen = []

    def predict(kind, record):
        seen.append(kind)
        return {"predict/final_loss": 40.0 + record["step"]} if kind == "step" and record["step"] == 6 else None

    ctx = WandbRun(
        group="g", tags=["budget:1e+12", "round:0"], job_type="cooldown", summary={"N": 123}, predict=predict
    )
    summary = train_run(build_run_config(RUN), tmp_path / "a", wandb=ctx)
    run = _one_run(tmp_path / "a")
    assert (run.id, run.group, run.tags, run.job_type, run.exit_code) == (
        summary["run_id"], "g", ["budget:1e+12", "round:0"], "cooldown", 0,
    )  # fmt: skip
    assert [s for s, _ in run.series("train/loss")] == list(range(1, 13))
    assert run.series("predict/final_loss") == [(6, 46.0)]
    assert run.summary["N"] == 123 and run.summary["status"] == "done"
    assert run.summary["final_train_loss"] == pytest.approx(summary["final_train_loss"])
    assert {"step", "checkpoint"} <= set(seen)

    def stop_at_4(kind, record):
        if kind == "step" and record["step"] == 4:
            raise StopRun("stopped_early", {"predicted_loss": 3.0})

    train_run(build_run_config(RUN), tmp_path / "b", callbacks=[stop_at_4], wandb=WandbRun(group="g"))
    stopped = _one_run(tmp_path / "b")  # a run that ends early still closes its W&B record
    assert stopped.exit_code == 0 and stopped.summary["status"] == "stopped_early"
    assert stopped.summary["predicted_loss"] == 3.0


def test_wandb_mode_from_the_environment_wins(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_mode("online") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("offline") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_mode("online") == "offline"


def test_online_with_a_closed_port_logs_offline_after_one_warning(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # never sent: nothing listens
    lines = []
    run = start_wandb(mode="online", project="p", run_id="abc", directory=tmp_path, warn=lines.append)
    run.log({"x": 1.0}, step=1)
    run.finish()
    # the health check answers at once (wandb.init would retry for INIT_TIMEOUT_S): "Connection refused"
    assert len(lines) == 1 and "W&B was not reached" in lines[0] and "127.0.0.1" in lines[0]
    assert "Connection refused" in lines[0]
    assert read_offline_run(next((tmp_path / "wandb").glob("offline-run-*-abc")), wait_s=60).series("x") == [(1, 1)]


def test_a_server_that_answers_but_fails_init_still_leaves_an_offline_record(monkeypatch, tmp_path):
    """Past the health check, wandb.init itself fails (here: nothing behind the port, the check
    skipped): after INIT_TIMEOUT_S the run logs offline, one warning line."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setattr(loggers, "unreachable", lambda *a, **k: None)
    monkeypatch.setattr(loggers, "INIT_TIMEOUT_S", 3.0)
    lines = []
    run = start_wandb(mode="online", project="p", run_id="abd", directory=tmp_path, warn=lines.append)
    run.log({"x": 2.0}, step=1)
    run.finish()
    assert len(lines) == 1 and "W&B was not reached" in lines[0], lines
    assert read_offline_run(next((tmp_path / "wandb").glob("offline-run-*-abd")), wait_s=60).series("x") == [(1, 2)]


def test_a_log_read_while_it_is_written_never_raises(offline, tmp_path):
    """The service appends behind the run: a reader polling (`wait_s`) sees every prefix of the file
    and tails whose bytes are not final. Each prefix reads as the whole records it holds; a record
    that fails its CRC ends the read there (CI once failed on a torn record parsed as protobuf)."""
    run = start_wandb(mode="offline", project="p", run_id="torn", directory=tmp_path, warn=print)
    for step in range(1, 41):
        run.log({"x": float(step)}, step=step)
    run.finish()
    folder = next((tmp_path / "wandb").glob("offline-run-*-torn"))
    whole = read_offline_run(folder, wait_s=60)
    assert whole.exit_code == 0 and len(whole.series("x")) == 40
    log = next(folder.glob("run-*.wandb"))
    data = log.read_bytes()
    copy = tmp_path / "copy"
    copy.mkdir()
    seen = 0
    for cut in range(0, len(data) + 1, 7):
        (copy / log.name).write_bytes(data[:cut])
        rows = len(read_offline_run(copy).series("x"))
        assert seen <= rows <= 40
        seen = rows
    middle = len(data) // 2  # a byte not yet final in the middle of the log: the read stops before it
    (copy / log.name).write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :])
    assert 0 < len(read_offline_run(copy).series("x")) < 40


def test_spec_section_is_checked_before_anything_runs(tmp_path, capsys):
    assert parse_wandb_section(None).predict.every == 0.1
    assert parse_wandb_section({"predict": False}).predict is None
    with pytest.raises(ConfigError, match="wandb.grup: unknown key"):
        parse_wandb_section({"grup": "x"})
    with pytest.raises(ConfigError, match="wandb.predict.every"):
        parse_wandb_section({"predict": {"every": 0}})
    with pytest.raises(ConfigError, match="wandb.tags"):
        parse_wandb_section({"tags": "baseline"})
    spec = {"name": "x", "base": RUN, "grid": {"optim.lr": [1e-3]}, "wandb": {"predict": {"n_boot": 2}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", "plan", str(tmp_path / "s.yaml"), "--no-measure"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "wandb.predict.n_boot" in err[0]


LAW = SyntheticLaw()
ISO = {
    "name": "sim",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}, "tags": {"arch": "dense"}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5.0}, "span": 3},
    "fit": {"bootstrap": 8},
    "wandb": {"tags": ["v1"]},
}


def _quiet(_msg):
    pass


def test_design_tags_and_job_types():
    entries = [r.to_dict() for r in expand_sweep(ISO).runs]
    smallest = min((e for e in entries if e["labels"]["flops_budget"] == 1e12), key=lambda e: e["params"])
    assert run_tags(smallest, entries, ["v1"]) == [
        "budget:1e+12",
        "size:1/5",
        "round:0",
        "arch:dense",
        "v1",
    ]
    proposed = dict(smallest, labels={"flops_budget": 9e12, "round": 2, "proposal": "compute_optimal"})
    assert run_tags(proposed, entries)[:3] == ["budget:9e+12", "round:2", "proposal:compute_optimal"]
    branch = dict(smallest, labels={"cooldown": "branch", "branch_step": 40})
    assert wandb_runs.job_type(branch) == "cooldown" and wandb_runs.job_type(smallest) == "train"


def test_sweep_wandb_logs_a_finished_store_and_its_rounds(offline, tmp_path, capsys):
    sd = tmp_path / "root" / "sim"
    launch_synthetic(ISO, sd, LAW, noise_std=0.003)
    p = propose_next(sd, target_flops=1e13, budget_flops=9e12, replicates=8, log=_quiet)
    launch_synthetic(p["spec_path"], sd, LAW, noise_std=0.003)  # the proposed run, done (not yet scored)
    assert main(["sweep", "wandb", str(sd)]) == 0
    assert "16 run(s) and 1 fit run(s) logged" in capsys.readouterr().out
    runs = _runs(sd)
    assert {r.group for r in runs} == {"sim"} and len(runs) == 17
    train = [r for r in runs if r.job_type == "train"]
    assert sorted(t for r in train for t in r.tags if t.startswith("round:")) == ["round:0"] * 15 + ["round:1"]
    assert sorted(t for r in train for t in r.tags if t.startswith("budget:")) == sorted(
        ["budget:3e+11"] * 5 + ["budget:1e+12"] * 5 + ["budget:3e+12"] * 5 + ["budget:9e+12"]
    )
    proposed = next(r for r in train if "proposal:compute_optimal" in r.tags)
    assert proposed.summary["ledger/predicted_loss"] == pytest.approx(p["proposals"][0]["predicted_loss"])
    assert proposed.summary["N"] == p["proposals"][0]["params"] and proposed.summary["status"] == "done"
    (fit,) = [r for r in runs if r.job_type == "fit"]
    assert fit.id == fit_run_id("sim", 1) and {"round:1", "gates:pass", "v1"} <= set(fit.tags)
    cols, rows = fit.table("fit/parameters")
    assert cols == ["parameter", "estimate", "lo", "hi"]
    assert {r[0] for r in rows} >= {"alpha", "beta", "E", "A", "B", "a = beta/(alpha+beta)"}
    alpha = next(r for r in rows if r[0] == "alpha")
    assert alpha[1] == pytest.approx(p["params"]["alpha"]) and alpha[2] <= alpha[1] <= alpha[3]
    assert [r[:2] for r in fit.table("fit/gates")[1]] == [
        ["bracketed", "pass"], ["exponents", "pass"], ["starts_agree", "pass"], ["approaches_agree", "pass"],
        ["law_holds", "pass"],
    ]  # fmt: skip
    assert fit.table("proposals")[1][0][1] == p["proposals"][0]["run_id"]
    (row,) = fit.table("ledger")[1]
    assert row[1] == p["proposals"][0]["run_id"] and row[9] is None  # not scored when the round was fitted
    images = fit.images()
    assert set(images) == {"plots/isoflop", "plots/frontier", "plots/ledger"}
    assert all(path.stat().st_size > 10_000 for path in images.values())
    assert fit.summary["gates_passed"] is True and fit.summary["fit/alpha"] == pytest.approx(p["params"]["alpha"])

    # the proposed run is scored: its round's fit run logs the ledger again, at the next step
    scored = ledger.score(sd)
    assert update_ledger(sd, scored, log=_quiet) == [fit_run_id("sim", 1)]
    resumed = [r for r in _runs(sd / "wandb") if r.id == fit_run_id("sim", 1)]
    assert len(resumed) == 2  # the fit run's second offline folder (`wandb sync` both)
    later = max(resumed, key=lambda r: r.history[-1]["_step"])
    assert later.tags == fit.tags and later.group == "sim" and later.config["round"] == 1
    (row,) = later.table("ledger")[1]
    assert row[9] == pytest.approx(scored[0]["measured"]) and row[11] == scored[0]["covered"]
    assert later.summary["ledger/n_scored"] == 1

    assert main(["sweep", "wandb", str(sd)]) == 0  # everything has a W&B record: nothing twice
    assert "0 run(s) and 0 fit run(s) logged; 16 run(s) already logged" in capsys.readouterr().out


def test_sweep_eval_scores_become_an_eval_run_in_the_group(offline, tmp_path):
    sd = tmp_path / "root" / "sim"
    run_ids = launch_synthetic(ISO, sd, LAW, noise_std=0.003)
    rows = [
        {"step": step, "task": "stdlib_completion", "metric": "acc", "value": acc, "tokens": 0, "flops": 0.0}
        for step, acc in ((100, 0.31), (200, 0.35))
    ]
    (wandb_id,) = log_evals(sd, {store.run_path(sd, run_ids[0]): rows}, log=_quiet)
    run = _one_run(store.run_path(sd, run_ids[0]))
    assert run.id == wandb_id and run.job_type == "eval" and run.group == "sim"
    assert {"round:0", "v1"} <= set(run.tags) and run.summary["N"] > 0
    assert run.series("stdlib_completion/acc") == [(100, 0.31), (200, 0.35)]


SWEEP = {
    "name": "live",
    "base": {**RUN, "train": {"global_batch_tokens": 256, "num_tokens": 30 * 256}},
    "grid": {"model.d_model": [32, 48, 64]},
    "wandb": {"predict": {"min_runs": 2, "every": 0.4, "min_fraction": 0.3, "n_boot": 8, "backtest_runs": 0}},
}


def test_a_trial_logs_its_predicted_final_loss_while_it_trains(offline, tmp_path):
    """The trial's path without Ray: the sweep's first two runs finish, then the third trains with
    trial_context(), whose live prediction fits the finished runs' curves and its own prefix."""
    sd = tmp_path / "root" / "live"
    sweep = expand_sweep(SWEEP)
    store.init_sweep(sd, yaml.safe_dump(SWEEP), "live", [r.to_dict() for r in sweep.runs], sweep.name)
    *first, last = sweep.runs
    for r in first:
        train_run(build_run_config(r.config), store.run_path(sd, r.run_id))
    ctx = trial_context(sd, last.run_id, last.config)
    assert isinstance(ctx.predict, LivePrediction) and ctx.group == "live" and ctx.mode == "offline"
    assert pickle.loads(pickle.dumps(ctx)).predict.run_id == last.run_id  # travels to Ray Train workers
    train_run(build_run_config(last.config), store.run_path(sd, last.run_id), wandb=ctx)
    run = _one_run(store.run_path(sd, last.run_id))
    preds = run.series("predict/final_loss")
    assert [s for s, _ in preds] == [9, 21]  # 30% and 70% of its 30 steps
    fractions = [f for _, f in run.series("predict/fraction")]
    assert fractions == pytest.approx([0.3, 0.7])
    lo, hi = dict(run.series("predict/final_loss_lo")), dict(run.series("predict/final_loss_hi"))
    assert all(lo[s] < v < hi[s] for s, v in preds)
    measured = read_status(store.run_path(sd, last.run_id))["final_val_loss"]
    assert abs(preds[0][1] / measured - 1) < 0.25  # 30% in: the right neighbourhood (a 30-step run)
    assert run.summary["predict/final_loss"] == preds[-1][1] and run.summary["final_val_loss"] == measured
    first_run = _one_run(store.run_path(sd, first[0].run_id))
    assert first_run.series("predict/final_loss") == []  # no finished runs to fit when it trained


@pytest.mark.slow
def test_an_online_sweep_whose_server_is_a_closed_port_completes(ray_local, tmp_path):
    """`sweep launch` (a process of its own on the session's Ray) with logging.wandb online and
    WANDB_BASE_URL on a closed port of 127.0.0.1: the runs finish with their records, one warning
    line says W&B was not reached, and the runs' W&B records wait offline for `wandb sync`. The
    driver forwards WANDB_MODE and WANDB_BASE_URL to the trials (the cluster's processes started
    under the suite's WANDB_MODE=disabled); the API key, a secret, stays with the driver."""
    spec = {**SWEEP, "base": {**SWEEP["base"], "logging": {"wandb": "online", "progress": "off"}}}
    spec["grid"] = {"model.d_model": [32, 48]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = os.environ | {"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}"}
    env |= {"WANDB_API_KEY": "k" * 40}
    out = tmp_path / "root" / "live"
    cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "launch", str(tmp_path / "s.yaml"), "--out", str(out)]
    proc = subprocess.run([*cmd, "--address", ray_local], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "W&B" in line]
    assert len(warnings) == 1 and "not reached" in warnings[0] and "Connection refused" in warnings[0]
    df = store.load_runs(out)
    assert df["status"].to_list() == ["done", "done"] and df["final_val_loss"].is_finite().all()
    runs = _runs(out)
    assert sorted(r.id for r in runs) == sorted(df["run_id"].to_list()) and {r.exit_code for r in runs} == {0}
    assert {r.group for r in runs} == {"live"}  # the trials' W&B context: the sweep's group
    assert load_sweep(tmp_path / "s.yaml").runs[0].config["logging"]["wandb"] == "online"
