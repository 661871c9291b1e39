"""A local store's records survive power loss and concurrent writers (issue 30, items 5 and 8).

Durability: every record, manifest, RNG file and Parquet file is fsynced, and its directory after
the rename; an older checkpoint is pruned only after the newer one's manifest is durable; a
zero-length status.json, metrics.parquet or manifest (what a power loss leaves where nothing was
fsynced) is recovered from. Concurrency: `scalelab run --resume` takes the run's lock (the one a
sweep trial holds); the step watchdog's hang record cannot overwrite the final status; two writers
of status.json never lose each other's fields.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from scalelab.cli.main import main
from scalelab.errors import UsageError
from scalelab.store import records
from scalelab.store.atomic import atomic_write_parquet
from scalelab.store.checkpoint_files import list_checkpoints
from scalelab.store.records import read_status, write_status
from scalelab.store.run_lock import fcntl_lock
from scalelab.train.config import build_run_config
from scalelab.train.loop import train_run
from scalelab.train.watchdog import HangPolicy, StepWatchdog

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: restores the thread count after the module

RUN = {
    "name": "dur",
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 4},
    "train": {"num_tokens": 6 * 128, "global_batch_tokens": 128, "seed": 3, "num_threads": 1},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 2, "keep_last": 1},
    "logging": {"wandb": "disabled", "progress": "off"},
}


@pytest.fixture
def fs_events(monkeypatch):
    """Every fsync (by the path of its file descriptor) and every rmtree, in order."""
    events: list[tuple[str, str]] = []
    real_fsync, real_rmtree = os.fsync, shutil.rmtree

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rmtree(path, *a, **k):
        events.append(("rmtree", str(path)))
        return real_rmtree(path, *a, **k)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    return events


def test_parquet_records_are_fsynced_with_their_directory(tmp_path, fs_events):
    target = tmp_path / "run" / "metrics.parquet"
    atomic_write_parquet(target, pl.DataFrame({"step": [1, 2], "loss": [3.0, 2.5]}))
    synced = [p for kind, p in fs_events if kind == "fsync"]
    assert any(Path(p).parent == target.parent and Path(p).name.startswith(".metrics.parquet.") for p in synced)
    assert str(target.parent) in synced  # the rename itself is durable
    assert pl.read_parquet(target)["step"].to_list() == [1, 2]


def test_an_older_checkpoint_is_pruned_only_after_the_newer_one_is_durable(tmp_path, fs_events):
    run = tmp_path / "run"
    assert train_run(build_run_config(RUN), run)["status"] == "done"
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [6]
    pruned = [i for i, (kind, p) in enumerate(fs_events) if kind == "rmtree" and re.search(r"/step_\d+$", p)]
    assert len(pruned) == 2  # step_2 and step_4
    for i, step in zip(pruned, (4, 6), strict=True):
        before = [p for kind, p in fs_events[:i] if kind == "fsync"]
        for name in ("manifest.json", "train_state.json", "rng_rank0.pt", ".metadata"):  # or its temp name
            written = [Path(p) for p in before if Path(p).parent.name == f"step_{step}.tmp"]
            assert any(p.name == name or p.name.startswith(f".{name}.") for p in written), (step, name)
        assert str(run / "checkpoints") in before  # the rename to step_<N> is durable too
    synced = [p for kind, p in fs_events if kind == "fsync"]
    assert any(Path(p).name.startswith(".status.json.") for p in synced)
    assert any(Path(p).name.startswith(".metrics.parquet.") for p in synced)


def test_zero_length_records_are_recovered_from(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_run(build_run_config(dict(RUN, checkpoint={"interval_steps": 2, "keep_last": 2})), run)
    reference = pl.read_parquet(run / "metrics.parquet")
    (run / "status.json").write_bytes(b"")  # what a power loss leaves of files never fsynced
    (run / "metrics.parquet").write_bytes(b"")
    (run / "checkpoints" / "step_6" / "manifest.json").write_bytes(b"")
    assert main(["run", str(run / "config.json"), "--out", str(run), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"resume: from {run / 'checkpoints' / 'step_4'}" in err and "metrics.parquet" in err, err
    assert read_status(run)["status"] == "done"
    after = pl.read_parquet(run / "metrics.parquet")
    assert after["step"].to_list() == [5, 6]  # the steps redone; the lost rows are not invented
    assert after["loss"].to_list() == reference["loss"].to_list()[4:]  # bit for bit
    assert (run / "metrics.parquet.corrupt").exists()  # the unreadable file is kept aside
    # and the loss is recorded, not silent (issue 51): in status.json and by `sweep status`
    assert read_status(run)["records_lost"] == [{"file": "metrics.parquet", "before_step": 4, "attempt": 1}]
    from scalelab.sweeps.execution.status import format_status

    info = {"name": "s", "sweep": "s", "counts": {"done": 1}, "runs": [dict(
        run_id="r1", status="done", step=6, num_steps=6, params=1, tokens=1, final_train_loss=1.0, final_val_loss=1.0,
        trial_failures=0, design="", error=None, linked=False, age_s=0, records_lost=read_status(run)["records_lost"],
    )]}  # fmt: skip
    assert "r1: its metrics.parquet rows before step 4 are lost" in format_status(info)


def test_cli_resume_takes_the_run_lock_a_trial_holds(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_run(build_run_config(RUN), run, stop_after_steps=2)["status"] == "running"
    before = pl.read_parquet(run / "metrics.parquet")["step"].to_list()
    with fcntl_lock(run, wait_s=0):  # a sweep trial (or another `scalelab run`) is training it
        assert main(["run", str(run / "config.json"), "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another process" in err, err
    assert pl.read_parquet(run / "metrics.parquet")["step"].to_list() == before  # untouched
    assert main(["run", str(run / "config.json"), "--out", str(run), "--resume"]) == 0  # lock free: it runs


def test_two_runs_into_one_new_out_train_it_once(tmp_path, capsys):
    """Two `scalelab run` into one new --out: the one that made the directory holds its lock from
    the start, so the other is refused (issue 51: both trained); a refusal of a new --out leaves
    nothing behind."""
    import yaml

    from scalelab.cli.run_cmd import _run_lock

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(RUN))
    out = tmp_path / "new"
    with _run_lock(out):  # the first, past its checks, before its first write
        assert main(["run", str(cfg), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "another process is training" in err, err
        assert [p.name for p in out.iterdir()] == [".lock"]  # nothing of the second's
    with pytest.raises(UsageError), _run_lock(tmp_path / "third"):
        raise UsageError("a check after the lock refuses the run")
    assert not (tmp_path / "third").exists()


@pytest.mark.parametrize("code, words", [(28, "No space left on device; free some space"), (30, "read-only")])
def test_a_store_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch, code, words):
    """Issue 51: a full disk or a read-only store was a traceback; it is one line naming the file."""
    import yaml

    from scalelab.store import sweep_dir

    def fails(path, data):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(sweep_dir, "atomic_write_bytes", fails)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "base": RUN, "grid": {"optim.lr": [1e-3]}}))
    assert main(["sweep", "launch", str(spec), "--out", str(tmp_path / "root" / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sweep.yaml: " in err and words in err, err


def test_the_watchdogs_hang_record_never_overwrites_the_final_status(tmp_path, monkeypatch):
    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    write_status(tmp_path, "running")
    with StepWatchdog(HangPolicy(factor=10.0, min_s=0.0, min_steps=1), tmp_path, rank=0, poll_s=60) as wd:
        for step in (1, 2):
            wd.step_begin(step)
            wd.step_end()
        write_status(tmp_path, "done", final_val_loss=1.0)
        # the watchdog thread judged step 2 a hang just before it ended, and fires only now
        wd._fire(2, elapsed_s=5.0, median_s=0.1, limit_s=1.0)
    assert read_status(tmp_path)["status"] == "done" and exits == []


def test_concurrent_status_writers_keep_each_others_fields(tmp_path, monkeypatch):
    write_status(tmp_path, "running")
    real = records.read_status

    def slow_read(run_dir):
        got = real(run_dir)
        time.sleep(0.02)  # widen the read-modify-write window
        return got

    monkeypatch.setattr(records, "read_status", slow_read)
    threads = [threading.Thread(target=write_status, args=(tmp_path, "running"), kwargs={f"k{i}": i}) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    status = json.loads((tmp_path / "status.json").read_text())
    assert {f"k{i}" for i in range(8)} <= set(status), sorted(status)
