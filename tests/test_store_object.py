"""The sweep store on object storage (`--out s3://bucket/prefix`), against a local S3 server.

The server is moto's server mode (a real HTTP S3 endpoint, tests/s3_local.py) on 127.0.0.1 and
a free port; scalelab reaches it through the AWS environment (AWS_ENDPOINT_URL, keys) as it would
reach S3 or an S3-compatible store (MinIO, Ceph). Covered: bad store URLs (exit 2, nothing
written), the lease (conditional puts: one taker wins, a dead holder's lease is taken over, the old
holder finds out), whole-object writes seen whole by a concurrent reader, a checkpoint upload cut
before its manifest never resumed from, and a debug sweep launched into s3:// with a crash that
resumes from the checkpoint in the bucket, then `sweep status`, `fit` and `report` reading it.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from scalelab import store
from scalelab.cli.main import main
from scalelab.store import checkpoint_files, objects
from scalelab.store.lease import Lease, LeaseLost, RunMirror, lease_url
from scalelab.train.config import build_run_config
from scalelab.train.loop import train_run

pytest.importorskip("moto.server")
pytest.importorskip("boto3")
from s3_local import reset_client as _reset_client  # noqa: E402
from s3_local import serve  # noqa: E402

BUCKET = "scalelab-test"
SWEEP = {
    "name": "objstore",
    "base": {
        "model": {"preset": "debug"},
        "data": {"seq_len": 64, "val_sequences": 8},
        "train": {"global_batch_tokens": 256},  # 10 or 20 steps
        "eval": {"interval_steps": 0, "val_batch_sequences": 8},
        "checkpoint": {"interval_steps": 5, "keep_last": 2},
        "logging": {"wandb": "disabled", "progress": "off"},
    },
    "grid": {"model.d_model": [32, 48, 64], "train.num_tokens": [2560, 5120]},  # 6 runs: the report's minimum
    "execution": {"max_failures": 2},
}
OUT_DIR = Path(os.environ.get("SCALELAB_TEST_OUTPUTS", "")) if os.environ.get("SCALELAB_TEST_OUTPUTS") else None


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on loopback with one bucket; the AWS environment pointing at it."""
    with serve(BUCKET) as env:
        yield env


def _objects(prefix: str) -> dict:
    return objects.list_objects(f"s3://{BUCKET}/{prefix}")


def test_bad_store_urls_exit_2_before_anything_is_written(s3, tmp_path, capsys, monkeypatch):
    # The bucket is the module's: on this xdist worker the sweep test may have filled it already.
    before = _objects("")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    cases = {
        "ftp://host/x": "unknown scheme 'ftp://'",
        "s3:///x": "no bucket",
        "s3://no-such-bucket/x": "bucket 'no-such-bucket' does not exist",
        f"s3://{BUCKET}": "a sweep needs a prefix below the bucket",  # it wrote the bucket's root first (issue 51)
        f"s3://{BUCKET}/": "a sweep needs a prefix below the bucket",
    }
    for url, why in cases.items():
        assert main(["sweep", "launch", str(spec), "--out", url]) == 2
        err = capsys.readouterr().err.strip()
        assert why in err and url in err and len(err.splitlines()) == 1, err
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(dict(SWEEP["base"], train={"global_batch_tokens": 256, "num_tokens": 2560})))
    assert main(["run", str(run), "--out", f"s3://{BUCKET}/one"]) == 2
    assert "object storage is for sweeps" in capsys.readouterr().err
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    _reset_client()
    try:
        assert main(["sweep", "launch", str(spec), "--out", f"s3://{BUCKET}/bad/x"]) == 2
        err = capsys.readouterr().err.strip()
        assert "no AWS credentials" in err and "AWS_ACCESS_KEY_ID" in err and len(err.splitlines()) == 1
        assert main(["sweep", "status", f"s3://{BUCKET}/bad/x"]) == 2
        assert "no AWS credentials" in capsys.readouterr().err
    finally:
        monkeypatch.undo()
        _reset_client()
    assert _objects("") == before  # nothing written by any of them


def test_lease_one_taker_wins_a_dead_holder_is_taken_over(s3):
    url = f"s3://{BUCKET}/leases/run.json"
    takers = [Lease(url, ttl_s=60, holder=f"t{i}") for i in range(8)]
    won = []
    barrier = threading.Barrier(len(takers))

    def take(lease):
        barrier.wait()
        if lease.try_acquire():
            won.append(lease.holder)

    threads = [threading.Thread(target=take, args=(t,)) for t in takers]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(won) == 1, won
    holder = next(t for t in takers if t.holder == won[0])
    holder.renew()  # the holder renews its own lease
    holder.release()

    dead = Lease(url, ttl_s=1.5, holder="dead")
    dead.acquire(wait_s=5)  # then never renews: its process died
    heir = Lease(url, ttl_s=30, holder="heir")
    assert not heir.try_acquire()  # not before expiry
    t0 = time.monotonic()
    heir.acquire(wait_s=20)
    waited = time.monotonic() - t0
    assert 0.3 < waited < 10 and heir.current()["holder"] == "heir"
    with pytest.raises(LeaseLost):  # the old holder comes back: it learns it lost, overwrites nothing
        dead.renew()
    assert heir.current()["holder"] == "heir"
    heir.release()
    assert objects.read(url) is None


def test_objects_are_seen_whole_by_a_concurrent_reader(s3, tmp_path):
    from scalelab.store.atomic import atomic_write_bytes

    url = f"s3://{BUCKET}/whole/metrics.bin"
    versions = [hashlib.sha256(bytes([i])).digest() * (1 << 15) for i in range(6)]  # 1 MiB each
    known = {hashlib.sha256(v).hexdigest() for v in versions}
    atomic_write_bytes(url, versions[0])
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            seen.append(hashlib.sha256(objects.read_bytes(url)).hexdigest())

    t = threading.Thread(target=reader)
    t.start()
    deadline, i = time.monotonic() + 60, 0
    while (len(seen) < 30 or i < 10) and time.monotonic() < deadline:  # reads overlap many writes
        i += 1
        atomic_write_bytes(url, versions[i % len(versions)])
    stop.set()
    t.join()
    assert len(seen) >= 30 and set(seen) <= known, f"{sum(s not in known for s in seen)} partial reads"


def test_checkpoint_upload_cut_before_its_manifest_is_never_resumed(s3, tmp_path, monkeypatch):
    url = f"s3://{BUCKET}/ckpt/runs/r1"
    local = tmp_path / "r1"
    for step in (5, 10):
        d = local / "checkpoints" / f"step_{step}"
        d.mkdir(parents=True)
        for name in ("__0_0.distcp", ".metadata", "train_state.json", "manifest.json"):
            (d / name).write_bytes(f"{step}{name}".encode())
    (local / "status.json").write_text(json.dumps({"status": "running"}))
    real = objects.put_file

    def cut(u, path, **condition):
        if "step_10" in u and path.name == "manifest.json":
            raise ConnectionError("killed mid-upload")
        return real(u, path, **condition)

    monkeypatch.setattr(objects, "put_file", cut)
    mirror = RunMirror(url, local)
    with pytest.raises(ConnectionError):
        mirror.push()  # step_10's upload stops before its manifest
    assert objects.read(f"{url}/status.json") is None  # status.json goes last
    assert "checkpoints/step_10/__0_0.distcp" in _objects("ckpt/runs/r1")
    assert set(checkpoint_files.remote_checkpoints(f"{url}/checkpoints")) == {"step_5"}
    fresh = tmp_path / "fresh" / "r1"
    RunMirror(url, fresh).pull()
    assert [p.name for _, p in checkpoint_files.list_checkpoints(fresh / "checkpoints")] == ["step_5"]
    monkeypatch.setattr(objects, "put_file", real)
    mirror.push()
    assert set(checkpoint_files.remote_checkpoints(f"{url}/checkpoints")) == {"step_5", "step_10"}
    assert json.loads(objects.read_bytes(f"{url}/status.json")) == {"status": "running"}
    lease = Lease(f"s3://{BUCKET}/ckpt/.leases/r1.json", ttl_s=60, holder="taken")
    lease.acquire(wait_s=0)
    fenced = RunMirror(url, local, lease=lease)  # a holder whose lease was taken writes nothing more
    (local / "status.json").write_text(json.dumps({"status": "done"}))
    lease.lost.set()
    with pytest.raises(LeaseLost):
        fenced.push()
    assert json.loads(objects.read_bytes(f"{url}/status.json")) == {"status": "running"}


def _cli(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "scalelab.cli", *args]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.mark.timeout(900)
def test_debug_sweep_into_s3_with_a_crash_then_status_fit_report(s3, ray_local, tmp_path, capsys):
    """The must-show: a sweep whose store is the bucket, read back by status, fit and report.

    The launch is a `scalelab` process of its own that joins the session's Ray (`--address`): the
    driver forwards the endpoint and the region in the job's runtime env, and the keys as a user
    names them (--pass-env), through the driver's holder actor, never a runtime env: no file of the
    session's Ray (its logs, runtime_env_agent.log included) holds them afterwards (issue 51; the
    keys here are canaries, which moto accepts). The commands that read the bucket after it run
    here, through the same CLI entry point."""
    spec = tmp_path / "objstore.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    out = f"s3://{BUCKET}/sweeps/objstore"
    canaries = {"AWS_ACCESS_KEY_ID": "AKIACANARY51JOINED", "AWS_SECRET_ACCESS_KEY": "canary51-joined-secret-key"}
    env = dict(os.environ, **s3) | canaries
    from scalelab.sweeps.specs.spec import expand_sweep

    runs = [r.to_dict() for r in expand_sweep(SWEEP).runs]
    # d_model=48, 20 steps: crashes once at step 12, its retry resumes from step_10 in the bucket
    crash_id = next(
        r["run_id"]
        for r in runs
        if r["config"]["model"]["d_model"] == 48 and r["config"]["train"]["num_tokens"] == 5120
    )
    shown = []

    def step(args):
        r = _cli(args, env, tmp_path)
        shown.append(f"$ scalelab {' '.join(args)}\n{r.stdout}{r.stderr if r.returncode else ''}")
        assert r.returncode == 0, "\n".join(shown) + r.stderr
        return r.stdout

    def step_here(args):  # the environment is the fixture's (os.environ); the working directory tmp_path
        capsys.readouterr()
        code = main(args)
        r = capsys.readouterr()
        shown.append(f"$ scalelab {' '.join(args)}\n{r.out}{r.err if code else ''}")
        assert code == 0, "\n".join(shown) + r.err
        return r.out

    # Another run's lease held by a node that died: its trial waits for the expiry, then takes over.
    orphan_id = next(r["run_id"] for r in runs if r["run_id"] != crash_id)
    dead = Lease(lease_url(out, orphan_id), ttl_s=15, holder="dead-node:1:x")
    dead.acquire(wait_s=0)
    expires_at = dead.current()["expires_at"]
    keys = ["--pass-env", "AWS_ACCESS_KEY_ID", "--pass-env", "AWS_SECRET_ACCESS_KEY"]
    launch = step(
        ["sweep", "launch", str(spec), "--out", out, "--address", ray_local, *keys, "--inject-fault", f"{crash_id}:12"]
    )
    assert "states: done=6" in launch
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    logs = [p for p in session.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name == "runtime_env_agent.log" for p in logs)  # the joined job's runtime env was set up
    leaked = [str(p) for p in logs if any(v.encode() in p.read_bytes() for v in canaries.values())]
    assert not leaked, leaked
    status = step_here(["sweep", "status", out])
    fit = step_here(["fit", out, "--law", "power_law_no_e", "--no-backtest"])
    report = tmp_path / "report.html"
    step_here(["report", out, "-o", str(report), "--bootstrap", "20"])
    again = step_here(["sweep", "launch", str(spec), "--out", out, "--num-cpus", "2"])
    resumed = step_here(["sweep", "resume", out, "--num-cpus", "2"])
    text = "\n".join(shown)
    print(text)
    if OUT_DIR is not None:
        (OUT_DIR / "objstore_must_show.txt").write_text(text)
        (OUT_DIR / "objstore_report.html").write_bytes(report.read_bytes())

    assert "6 runs: done 6" in status and "law power_law_no_e" in fit and "points 6" in fit
    assert report.stat().st_size > 10_000 and out in report.read_text()  # the report names the s3:// store
    assert "6 of 6 run(s) already finished" in again and "6 of 6 run(s) already finished" in resumed
    df = store.load_runs(out)
    assert df.height == 6 and (df["status"] == "done").all() and df["final_val_loss"].is_not_null().all()
    stored = _objects("sweeps/objstore")
    for r in runs:  # records and the newest checkpoints (keep_last=2) are objects in the bucket
        keys = {k for k in stored if k.startswith(f"runs/{r['run_id']}/")}
        ckpts = {k.split("/")[3] for k in keys if k.endswith("manifest.json")}
        steps = r["config"]["train"]["num_tokens"] // 256
        assert ckpts == {f"step_{steps - 5}", f"step_{steps}"}, keys
        assert {f"runs/{r['run_id']}/{f}" for f in ("metrics.parquet", "status.json", "config.json")} <= keys
    assert not [k for k in stored if k.endswith(".tmp")]
    assert not _objects("sweeps/.leases")  # every lease released
    events = store.read_events(out)
    orphan_start = next(e["time"] for e in events if e["run_id"] == orphan_id and e["event"] == "start")
    assert orphan_start >= expires_at  # not before the dead holder's lease expired
    crash = [e for e in events if e["run_id"] == crash_id]
    assert [e["event"] for e in crash] == ["start", "fail", "retry", "start", "end"]  # retry: the driver saw it
    assert crash[-1]["loaded_step"] == 10  # the retry pulled step_10 from the bucket
    # The crashed run resumed from the bucket's checkpoint ends where an uninterrupted run does.
    crashed = pl.read_parquet(objects.local_view(out) / "runs" / crash_id / "metrics.parquet")
    config = next(r["config"] for r in runs if r["run_id"] == crash_id)
    train_run(build_run_config(config), tmp_path / "reference")
    reference = pl.read_parquet(tmp_path / "reference" / "metrics.parquet")
    assert crashed["step"].to_list() == reference["step"].to_list()
    assert crashed["loss"].to_list() == reference["loss"].to_list()  # bit for bit
