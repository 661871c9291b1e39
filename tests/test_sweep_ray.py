"""Sweeps on a local Ray (the session's `ray_local` cluster): completion, dedupe, fault injection with
bit-exact resume, and a SIGKILLed driver followed by `sweep resume`.

A multi-process run (a Ray Train TorchTrainer inside its trial) is tested on the simulated cluster of
test_cluster_multinode.py (dp=2 over two nodes, equal to one node's run bit for bit) and
test_cluster_multinode_s3.py (elastic).

Runs are the debug model on 64-token sequences, a few thousand tokens each (~0.5-2 s of training).
"""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE

import polars as pl
import pytest
import yaml

from scalelab import store
from scalelab.cli.main import main
from scalelab.store.checkpoint_files import latest_checkpoint, list_checkpoints
from scalelab.store.records import read_status
from scalelab.sweeps.execution.execute import launch, resume
from scalelab.sweeps.specs.spec import expand_sweep
from scalelab.train.config import build_run_config
from scalelab.train.loop import train_run

BASE = {
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"global_batch_tokens": 256, "num_tokens": 5120},
    "eval": {"interval_steps": 0, "val_batch_sequences": 8},
    "checkpoint": {"interval_steps": 5},
    "logging": {"wandb": "disabled", "progress": "off"},
}
# How long a state may take before a test calls it a hang (a loaded 2-core machine is slow, not stuck).
STATE_WAIT_S = 900
GRID = {
    "name": "six",
    "base": BASE,
    "grid": {"optim.lr": [1e-3, 3e-3, 1e-2], "model.d_model": [32, 64]},
    "execution": {"max_failures": 2},
}


def _launch(spec: dict, out: Path, **kw):
    text = yaml.safe_dump(spec)
    return launch(expand_sweep(spec), out, spec_text=text, log=lambda m: None, **kw)


def _starts(sweep_dir: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in store.read_events(sweep_dir):
        if e["event"] == "start":
            counts[e["run_id"]] = counts.get(e["run_id"], 0) + 1
    return counts


def test_six_runs_dedupe_and_fault_resume_bit_exact(ray_local, tmp_path, capsys):
    """Six runs on the session's Ray, one of them crashing once; dedupe; the crashed run's numbers."""
    a = tmp_path / "root" / "a"
    # Fault injection: one of the six raises at step 12 (checkpoint at 10); Tune retries it, it
    # resumes from step 10 and ends bit for bit where an uninterrupted run ends (checked below).
    runs = expand_sweep(GRID).runs
    faulty = next(r for r in runs if r.config["optim"]["lr"] == 3e-3 and r.config["model"]["d_model"] == 64)
    result = _launch(GRID, a, fault_steps={faulty.run_id: 12})
    assert len(result["states"]) == 6 and set(result["states"].values()) == {"done"}
    df = store.load_runs(a)
    assert isinstance(df, pl.DataFrame) and df.height == 6
    assert df["status"].to_list() == ["done"] * 6
    assert df["loss"].is_finite().all() and (df["tokens"] == 5120).all()
    assert set(df["d_model"].to_list()) == {32, 64} and df["flops"].min() > 0
    assert not list(a.rglob("*.tmp")), "a temp file survived"
    starts = {i: 2 if i == faulty.run_id else 1 for i in result["states"]}
    assert _starts(a) == starts
    assert main(["sweep", "status", str(a)]) == 0
    assert "6 runs: done 6" in capsys.readouterr().out
    assert main(["sweep", "export", str(a), "--csv", str(tmp_path / "runs.csv")]) == 0
    exported = pl.read_csv(tmp_path / "runs.csv")
    assert exported.height == 6 and {"params", "tokens", "flops", "loss", "lr"} <= set(exported.columns)

    # Dedupe: the same spec again (same sweep, and a sibling sweep of the same store root) trains nothing.
    again = _launch(GRID, a)
    assert again["trained"] == [] and _starts(a) == starts
    b = tmp_path / "root" / "b"
    other = _launch(GRID, b)
    assert other["trained"] == [] and _starts(b) == {}
    assert all(store.run_path(b, i).is_symlink() for i in other["states"])
    assert store.load_runs(b)["status"].to_list() == ["done"] * 6

    events = [e for e in store.read_events(a) if e["run_id"] == faulty.run_id]
    # the trial's own `fail`, then the driver's `retry` (Tune's recovery), then the retried trial
    assert [e["event"] for e in events] == ["start", "fail", "retry", "start", "end"]
    assert "InjectedFault" in events[1]["error"]
    # the retry loaded the step-10 checkpoint (a retry from step 0 would log the same losses)
    assert events[1]["loaded_step"] is None and events[4]["loaded_step"] == 10
    # each attempt's time: wall, and the trial process's CPU seconds over the same interval (one
    # thread of torch: no more than the wall time, but for Ray's own threads in the worker)
    for e in (e for e in store.read_events(a) if e["event"] in ("end", "fail")):
        assert 0 < e["train_cpu_s"] <= e["train_s"] * 1.05 + 0.2, e
    # the uninterrupted run, trained here as one process (a trial runs the same train_run)
    clean, resumed = tmp_path / "clean", store.run_path(a, faulty.run_id)
    train_run(build_run_config(faulty.config), clean)
    s_clean, s_resumed = (json.loads((d / "status.json").read_text()) for d in (clean, resumed))
    for key in ("final_train_loss", "final_val_loss", "best_val_loss"):
        assert s_resumed[key] == s_clean[key], key  # bit for bit
    m_clean, m_resumed = (pl.read_parquet(d / "metrics.parquet").drop("tokens_per_s") for d in (clean, resumed))
    assert m_resumed.equals(m_clean)
    assert s_resumed["attempts"] == 2 and s_resumed["loaded_steps"] == [None, 10]


def _lock_free(run_dir: Path) -> bool:
    """Whether no process holds the run's lock (the OS drops it when its holder dies)."""
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.mark.timeout(3 * STATE_WAIT_S)
def test_driver_sigkill_then_resume(ray_local, tmp_path):
    """Three short runs and one long run, two at a time; the driver is SIGKILLed once a short run is
    done and the long one holds a checkpoint. The long run is held at step 25 of 50 while a hold
    file exists (SCALELAB_TEST_HOLD), so it is still mid-way when the driver dies however loaded
    the machine is; the test waits for each state it needs instead of racing the clock."""
    spec = {
        "name": "kill",
        "base": {**BASE, "train": {"global_batch_tokens": 256, "num_tokens": 5120}},
        "points": [
            {"optim.lr": 1e-3},
            {"optim.lr": 2e-3},
            {"optim.lr": 3e-3},
            {"optim.lr": 4e-3, "train.num_tokens": 12800},
        ],
        "execution": {"max_concurrent": 2},
    }
    long_run = next(r for r in expand_sweep(spec).runs if r.config["train"]["num_tokens"] == 12800)
    long_id = long_run.run_id
    spec_path = tmp_path / "kill.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "root" / "kill"
    long_dir = store.run_path(out, long_id)
    hold = tmp_path / "hold"
    hold.touch()
    # Slow steps (0.05 s; the driver forwards SCALELAB_* to the cluster's workers) for the short runs.
    env = dict(os.environ, RAY_AUTH_MODE="disabled", SCALELAB_TEST_STEP_DELAY_S="0.05", SCALELAB_TEST_HOLD=f"25:{hold}")
    cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "launch", str(spec_path), "--out", str(out)]
    proc = subprocess.Popen(
        cmd + ["--address", ray_local], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.time() + STATE_WAIT_S
        done_before: set[str] = set()
        while time.time() < deadline:
            assert proc.poll() is None, "the driver ended before it was killed"
            states = {p.name: store.run_state(p) for p in store.runs_dir(out).glob("*")} if out.exists() else {}
            done_before = {i for i, s in states.items() if s == "done"}
            if done_before and latest_checkpoint(long_dir / "checkpoints") is not None:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the sweep never reached a state with a finished run and a checkpointed long run")
    finally:
        proc.send_signal(signal.SIGKILL)  # only the driver we started, by its pid
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    deadline = time.time() + STATE_WAIT_S
    while not _lock_free(long_dir):  # Ray ends the dead driver's trials; the held one lets go of its lock
        assert time.time() < deadline, "the killed driver's trial of the long run never ended"
        time.sleep(0.2)
    assert store.run_state(long_dir) == "running"  # held: it could not have finished
    ckpt_before = list_checkpoints(long_dir / "checkpoints")[-1][0]
    hold.unlink()
    starts_before = _starts(out)
    result = resume(out, log=lambda m: None)
    assert set(result["states"].values()) == {"done"} and len(result["states"]) == 4
    starts = _starts(out)
    for run_id in done_before:
        assert starts[run_id] == 1, f"finished run {run_id} was trained again"
        # trained by the killed driver's trials: the forwarded step delay reached the Ray workers
        tps = pl.read_parquet(store.run_path(out, run_id) / "metrics.parquet")["tokens_per_s"].median()
        assert tps <= 256 / 0.05 * 1.05, tps
    assert all(starts[i] >= starts_before.get(i, 0) for i in starts)
    assert starts[long_id] == 2
    # the resumed attempt loaded the killed one's newest checkpoint (at or before the hold step)
    assert read_status(long_dir)["loaded_steps"] == [None, ckpt_before]
    assert 5 <= ckpt_before <= 25
    df = store.load_runs(out)
    assert df.height == 4 and df["status"].to_list() == ["done"] * 4 and df["loss"].is_finite().all()
    assert not list(out.rglob("*.tmp"))

    # the numbers of the interrupted-and-resumed run are those of an uninterrupted one, bit for bit
    # (trained here, as one process: a trial runs the same train_run, test_cluster_multinode.py)
    ref_dir = tmp_path / "ref"
    train_run(build_run_config(long_run.config), ref_dir)
    assert read_status(ref_dir)["loaded_steps"] == [None]
    m_ref, m_got = (pl.read_parquet(d / "metrics.parquet").drop("tokens_per_s") for d in (ref_dir, long_dir))
    assert m_got.height == 50 and m_got.equals(m_ref)
    s_ref, s_got = read_status(ref_dir), read_status(long_dir)
    for key in ("final_train_loss", "final_val_loss", "best_val_loss"):
        assert s_got[key] == s_ref[key], key


@pytest.mark.timeout(2 * STATE_WAIT_S)
def test_sibling_sweeps_launched_together_train_each_run_once(ray_local, tmp_path):
    """Two specs with the same four runs, launched 0.5 s apart into two sweep directories of one
    store root: every run is trained by exactly one of them and linked into the other."""
    spec = {
        "name": "twin",
        "base": BASE,
        "grid": {"optim.lr": [1e-3, 2e-3, 3e-3, 4e-3]},
    }
    spec_path = tmp_path / "twin.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    root = tmp_path / "root"
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    procs = []
    for name in ("a", "b"):
        cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "launch", str(spec_path), "--out", str(root / name)]
        procs.append(subprocess.Popen(cmd + ["--address", ray_local], env=env, stdout=PIPE, stderr=PIPE, text=True))
        time.sleep(0.5)
    for p in procs:
        out, err = p.communicate(timeout=STATE_WAIT_S)
        assert p.returncode == 0, err[-3000:]
    run_ids = [r.run_id for r in expand_sweep(spec).runs]
    starts = {i: _starts(root / "a").get(i, 0) + _starts(root / "b").get(i, 0) for i in run_ids}
    assert starts == {i: 1 for i in run_ids}, starts
    for i in run_ids:  # one physical directory per run, linked into the other sweep
        paths = [store.run_path(root / name, i) for name in ("a", "b")]
        assert sorted(p.is_symlink() for p in paths) == [False, True]
        assert paths[0].resolve() == paths[1].resolve()
    for name in ("a", "b"):
        assert store.load_runs(root / name)["status"].to_list() == ["done"] * 4
    assert store.load_runs(root).height == 4
