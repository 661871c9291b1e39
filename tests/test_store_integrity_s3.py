"""The store on object storage against what a hostile bucket or a lost lease can do (issue 30, items 1-4).

Against a local S3 server (tests/s3_local.py). Covered: keys that try `..`, absolute paths and
empty segments are refused before anything is written, by every reader (local_view, the run
mirror's pull); a holder that stalled past its lease cannot overwrite or delete what the next
holder wrote (fenced by the lease and by each object's ETag); the lease is renewed during the pull
and the final upload; expiry is the store's clock, not a comparison of two machines' clocks; a run
none of whose checkpoints verifies keeps them in the bucket; two sweeps of one store root share a
run instead of blocking each other.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from scalelab import store
from scalelab.cli.main import main
from scalelab.errors import UsageError
from scalelab.store import checkpoint_files, objects
from scalelab.store import lease as lease_module
from scalelab.store.lease import Lease, LeaseLost, RunMirror, lease_url, remote_run
from scalelab.store.run_lock import run_lock
from scalelab.train.checkpoint_verify import CheckpointError
from scalelab.train.config import build_run_config
from scalelab.train.loop import train_run

pytest.importorskip("moto.server")
pytest.importorskip("boto3")
from s3_local import serve  # noqa: E402

BUCKET = "integrity"
RUN = {
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 4},
    "train": {"num_tokens": 10 * 128, "global_batch_tokens": 128, "num_threads": 1},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 5, "keep_last": 2},
    "logging": {"wandb": "disabled", "progress": "off"},
}


@pytest.fixture(scope="module")
def s3():
    with serve(BUCKET) as env:
        yield env


def _url(*parts: str) -> str:
    return "/".join([f"s3://{BUCKET}", *parts])


def _put(key: str, data: bytes = b"x") -> None:
    objects._client().put_object(Bucket=BUCKET, Key=key, Body=data)


def _fake_checkpoint(run: Path, step: int, tag: str) -> None:
    """A checkpoint directory as the store sees it (files and a manifest; not loadable)."""
    d = run / "checkpoints" / f"step_{step}"
    d.mkdir(parents=True)
    for name in ("__0_0.distcp", ".metadata", "train_state.json", "manifest.json"):
        (d / name).write_bytes(f"{tag}:{step}:{name}".encode())


def _slowed(fn, delay_s: float):
    def slow(*a, **k):
        time.sleep(delay_s)
        return fn(*a, **k)

    return slow


def _status(url: str) -> dict:
    return json.loads(objects.read_bytes(f"{url}/status.json"))


# ---------------------------------------------------------------------------------------------
# 1. keys read from the bucket are confined to the view
# ---------------------------------------------------------------------------------------------


def test_crafted_keys_are_refused_and_nothing_lands_outside_the_view(s3, tmp_path, capsys, monkeypatch):
    victim = tmp_path / "victim"
    victim.mkdir()
    _put("crafted/sweep.yaml", b"name: crafted\n")
    _put("crafted/runs/r1/status.json", json.dumps({"status": "done"}).encode())
    _put(f"crafted/{victim}/abs_pwned")  # crafted//tmp/...: an absolute path below the prefix
    _put(f"crafted/{str(victim).lstrip('/')}/abs_pwned")  # its twin: what the absolute one downloads
    _put("crafted/runs/" + "../" * 16 + f"{str(victim).lstrip('/')}/dots_pwned")
    destinations = []
    real = objects.download

    def recorded(url, path, mtime=None):
        destinations.append(Path(path))
        return real(url, path, mtime)

    monkeypatch.setattr(objects, "download", recorded)
    assert main(["sweep", "status", _url("crafted")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pwned" in err, err
    assert sorted(p.name for p in victim.iterdir()) == []  # nothing written outside the view
    view_roots = {p for d in destinations for p in d.parents if p.name.startswith("scalelab-view-")}
    assert all(any(d.resolve().is_relative_to(r) for r in view_roots) for d in destinations), destinations

    # the run mirror (what a trial pulls) refuses the same: a top-level `..` and a checkpoint file `..`
    _put("crafted2/runs/r1/status.json", json.dumps({"status": "running"}).encode())
    _put("crafted2/runs/r1/checkpoints/step_5/manifest.json")
    _put("crafted2/runs/r1/checkpoints/step_5/..")
    local = tmp_path / "mirror" / "r1"
    with pytest.raises(UsageError, match=r"step_5/\.\."):
        RunMirror(_url("crafted2", "runs", "r1"), local).pull()
    assert not (tmp_path / "mirror" / "r1" / "checkpoints" / "step_5").exists()


def _odd_sweep(prefix: str, *keys: tuple[str, bytes]) -> None:
    _put(f"{prefix}/sweep.yaml", b"name: odd\n")
    _put(f"{prefix}/runs/r1/status.json", json.dumps({"status": "done"}).encode())
    for key, data in keys:
        _put(f"{prefix}/{key}", data)


def test_odd_keys_and_huge_objects_are_one_line_or_left_out(s3, capsys, monkeypatch):
    """Issue 51: zero-byte "folder" objects (an S3 console's) are ignored; a name over 255 bytes, or an
    object beside a folder of its name, is one line (they crashed readers with a traceback); an object
    larger than any record is left out of a reader's copy with a warning (readers fetched every object
    whole) and refused when read as a record."""
    _odd_sweep("odd0", ("runs/", b""), ("runs/r1/", b""))
    assert main(["sweep", "status", _url("odd0")]) == 0, capsys.readouterr().err
    for prefix, key, words in [
        ("odd1", f"runs/r1/{'x' * 256}", "longer than 255 bytes"),
        ("odd2", "runs/r1/status.json/inner", "an object and a folder of that name"),
    ]:
        _odd_sweep(prefix, (key, b"x"))
        capsys.readouterr()
        assert main(["sweep", "status", _url(prefix)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    monkeypatch.setattr(objects, "MAX_RECORD_BYTES", 4096)
    _odd_sweep("big", ("runs/r1/huge.bin", b"x" * 5000))
    fetched, real = [], objects.download
    monkeypatch.setattr(objects, "download", lambda u, path, mtime=None: fetched.append(u) or real(u, path, mtime))
    capsys.readouterr()
    assert main(["sweep", "status", _url("big")]) == 0
    assert not [u for u in fetched if u.endswith("huge.bin")] and "huge.bin (5,000 bytes)" in capsys.readouterr().err
    with pytest.raises(UsageError, match="larger than any record"):
        objects.read_bytes(_url("big", "runs", "r1", "huge.bin"))


def test_a_killed_attempts_node_local_copy_goes_with_the_next_attempt(s3):
    """Issue 51: a copy an attempt left in the temp dir (killed before its clean-up) is removed by the
    next attempt of that run on the node, which holds the lease; the next one's own copy goes at its end."""
    import tempfile

    dead = Path(tempfile.mkdtemp(prefix="scalelab-run-rk1-"))
    (dead / "rk1" / "metrics.parquet").parent.mkdir()
    (dead / "rk1" / "metrics.parquet").write_bytes(b"x")
    with remote_run(_url("kill", "s"), "rk1", wait_s=5, ttl_s=10) as run_dir:
        assert not dead.exists() and run_dir.is_dir()
    assert not run_dir.exists() and not list(Path(tempfile.gettempdir()).glob("scalelab-run-rk1-*"))


def test_run_ids_read_from_records_are_refused_before_they_name_a_path(tmp_path, capsys, monkeypatch):
    from scalelab.sweeps.execution import execute

    sweep = tmp_path / "root" / "s"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({"name": "s"}))
    entry = {"run_id": "../../escaped", "config": {"model": {"preset": "debug"}}, "labels": {}}
    (sweep / store.RESOLVED).write_text(json.dumps({"name": "s", "runs": [entry]}))

    def no_ray(*a, **k):
        raise AssertionError("Ray started for a sweep whose records name a path outside it")

    monkeypatch.setattr(execute, "start_ray", no_ray)
    assert main(["sweep", "resume", str(sweep)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "../../escaped" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    (sweep / store.RESOLVED).write_text(json.dumps({"name": "s", "runs": []}))
    prediction = {"round": 1, "run_id": "../x", "interval": [1, 2], "predicted": 1.5}
    (sweep / "ledger.json").write_text(json.dumps({"fits": [], "predictions": [prediction]}))
    assert main(["sweep", "ledger", str(sweep)]) == 2
    assert "../x" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 2. fenced writers
# ---------------------------------------------------------------------------------------------


def test_a_stalled_holder_leaves_the_new_holders_checkpoint_in_place(s3, tmp_path):
    run_url, lease_u = _url("stall", "runs", "r1"), _url("stall", ".leases", "r1.json")
    a = Lease(lease_u, ttl_s=6, holder="a")
    a.acquire(wait_s=0)
    mine = RunMirror(run_url, tmp_path / "a" / "r1", lease=a)
    mine.pull()
    _fake_checkpoint(mine.local, 5, "a")
    (mine.local / "metrics.parquet").write_bytes(b"a-metrics-5")
    (mine.local / "status.json").write_text(json.dumps({"status": "running", "holder": "a"}))
    a.renew()  # its last renewal: from here on a stalls
    mine.push()
    # a stalls (no renewal); b takes the run over once the lease has expired and trains on
    b = Lease(lease_u, ttl_s=30, holder="b")
    b.acquire(wait_s=20)
    theirs = RunMirror(run_url, tmp_path / "b" / "r1", lease=b)
    theirs.pull()
    _fake_checkpoint(theirs.local, 10, "b")
    (theirs.local / "metrics.parquet").write_bytes(b"b-metrics-10")
    (theirs.local / "status.json").write_text(json.dumps({"status": "running", "holder": "b"}))
    theirs.push()
    # a wakes up: its upload pass runs (it never learnt of the takeover from a renewal)
    (mine.local / "status.json").write_text(json.dumps({"status": "done", "holder": "a"}))
    try:
        mine.push()
    except LeaseLost:
        pass
    assert set(checkpoint_files.remote_checkpoints(f"{run_url}/checkpoints")) == {"step_5", "step_10"}
    assert _status(run_url) == {"status": "running", "holder": "b"}
    assert objects.read_bytes(f"{run_url}/metrics.parquet") == b"b-metrics-10"
    # fenced by the objects too: a holder that believes its lease is still valid (a process paused
    # between its check and its request) finds each object changed under it and stops
    a.remaining_s = lambda: 1e9  # type: ignore[method-assign]
    a.lost.clear()
    (mine.local / "metrics.parquet").write_bytes(b"a-metrics-15")
    with pytest.raises(LeaseLost):
        mine.push()
    assert objects.read_bytes(f"{run_url}/metrics.parquet") == b"b-metrics-10"
    assert set(checkpoint_files.remote_checkpoints(f"{run_url}/checkpoints")) == {"step_5", "step_10"}
    b.release()


def test_renewals_cover_the_pull_and_the_final_upload(s3, tmp_path, monkeypatch):
    sweep = _url("cover")
    seed = tmp_path / "seed" / "rc1"
    _fake_checkpoint(seed, 5, "seed")
    (seed / "status.json").write_text(json.dumps({"status": "running"}))
    RunMirror(f"{sweep}/runs/rc1", seed).push()
    for name in ("download", "put_file", "upload_file"):  # every transfer: the pull and the final upload
        real = getattr(objects, name, None)
        if real is not None:
            # 5 objects down (10 s), 4 up (8 s): each phase outlasts the 6 s lease. The lease is long
            # enough that a renewal may stall for seconds on a loaded machine and still land in time.
            monkeypatch.setattr(objects, name, _slowed(real, 2.0))
    taken, stop, released = [], threading.Event(), threading.Event()
    real_release = Lease.release

    def release(self):
        released.set()  # the holder is done: from here on a taker may have the lease
        return real_release(self)

    monkeypatch.setattr(Lease, "release", release)

    def taker():
        other = Lease(lease_url(sweep, "rc1"), ttl_s=30, holder="taker")
        # Only a takeover is under test: a taker that started first would simply take the free lease.
        while not stop.is_set() and other.current() is None:
            time.sleep(0.05)
        while not stop.is_set() and not released.is_set():
            if other.try_acquire() and not released.is_set():
                taken.append(time.monotonic())
            time.sleep(0.2)

    t = threading.Thread(target=taker)
    t.start()
    outcome = None
    try:
        with remote_run(sweep, "rc1", wait_s=10, ttl_s=6.0) as run_dir:
            _fake_checkpoint(run_dir, 10, "holder")  # the final upload: 4 files, > the lease
    except Exception as e:  # noqa: BLE001 - asserted below, after what matters most
        outcome = e
    finally:
        stop.set()
        t.join()
    assert taken == []  # nobody took the lease while its holder pulled or uploaded
    assert outcome is None, outcome
    assert set(checkpoint_files.remote_checkpoints(f"{sweep}/runs/rc1/checkpoints")) == {"step_5", "step_10"}


class _SkewedClock:
    """The `time` module as seen by a machine whose wall clock is off by skew_s (monotonic unchanged)."""

    def __init__(self, skew_s: float):
        self.skew_s = skew_s

    def time(self) -> float:
        return time.time() + self.skew_s

    def __getattr__(self, name):
        return getattr(time, name)


def test_expiry_does_not_compare_two_clocks(s3, monkeypatch):
    url = _url("clocks", ".leases", "r1.json")
    holder = Lease(url, ttl_s=30, holder="holder")
    holder.acquire(wait_s=0)
    monkeypatch.setattr(lease_module, "time", _SkewedClock(3600))  # the taker's clock runs an hour ahead
    taker = Lease(url, ttl_s=30, holder="taker")
    assert not taker.try_acquire()
    monkeypatch.undo()
    holder.renew()
    assert holder.current()["holder"] == "holder"
    holder.release()


# ---------------------------------------------------------------------------------------------
# 3. no checkpoint verifies: kept in the bucket, the run fails
# ---------------------------------------------------------------------------------------------


def test_no_checkpoint_that_verifies_keeps_them_in_the_bucket(s3, tmp_path):
    cfg = build_run_config(RUN)
    ref = tmp_path / "ref"
    assert train_run(cfg, ref)["status"] == "done"
    for _, ckpt in checkpoint_files.list_checkpoints(ref / "checkpoints"):
        (ckpt / ".metadata").write_bytes(b"")  # every checkpoint fails verification
    (ref / "status.json").write_text(json.dumps({"status": "running"}))
    sweep = _url("noverify")
    RunMirror(f"{sweep}/runs/rn1", ref).push()
    before = set(objects.list_objects(f"{sweep}/runs/rn1/checkpoints"))
    with pytest.raises(CheckpointError, match="no checkpoint verifies"):
        with remote_run(sweep, "rn1", wait_s=5, ttl_s=10) as run_dir:
            train_run(cfg, run_dir, resume=True)
    assert set(objects.list_objects(f"{sweep}/runs/rn1/checkpoints")) == before  # kept, every object
    status = _status(f"{sweep}/runs/rn1")
    assert status["status"] == "failed" and "no checkpoint verifies" in status["error"]


# ---------------------------------------------------------------------------------------------
# 4. two sweeps of one root share a run
# ---------------------------------------------------------------------------------------------


def test_two_s3_sweeps_that_share_a_run_link_it_instead_of_blocking(s3, tmp_path):
    root = _url("shared")
    entry = {"run_id": "r0000000000a", "config": RUN, "labels": {}}
    for name in ("a", "b"):
        store.init_sweep(f"{root}/{name}", f"name: {name}\n", name, [entry], name)
    holding, release = threading.Event(), threading.Event()

    def train_in_a():
        with run_lock(f"{root}/a", entry["run_id"]) as run_dir:
            holding.set()
            release.wait(30)
            (run_dir / "status.json").write_text(json.dumps({"status": "done", "final_val_loss": 1.5}))

    t = threading.Thread(target=train_in_a)
    t.start()
    try:
        assert holding.wait(30)
        threading.Timer(3.0, release.set).start()  # a trains for 3 s more; b's wait is 1 s
        t0 = time.monotonic()
        with run_lock(f"{root}/b", entry["run_id"], wait_s=1.0) as run_dir:
            waited = time.monotonic() - t0
            state = store.run_state(run_dir)
    finally:
        release.set()
        t.join()
    assert state == "done" and waited > 1.0  # b waited for a's trainer, then found the run done
    assert store.attach_runs(f"{root}/b", [entry["run_id"]], current_id=None) == {entry["run_id"]: "done"}
    assert not objects.list_objects(f"{root}/b/runs")  # one copy of the run, in a
    df = store.load_runs(f"{root}/b")
    assert df["status"].to_list() == ["done"] and df["final_val_loss"].to_list() == [1.5]
