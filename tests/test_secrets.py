"""Credentials never travel in a Ray runtime env, and never in clear text to another machine (issues 30, 51).

Ray writes every runtime env whole to each node's `runtime_env_agent.log` (mode 644, kept after
the cluster ends) and shows a job's on its dashboard. So WANDB_API_KEY, HF_TOKEN and the AWS keys
are in none: a private cluster's workers inherit the driver's environment; on a joined cluster a
credential named with `--pass-env` is held by the driver's actor (scalelab.sweeps.execution.ray_secrets) and
refused for an http:// dashboard or a plain Ray address that is not loopback; a detached driver's
Ray Job gets none. The Ray clients are replaced by recorders in the unit tests (nothing is sent);
the canary test runs a sweep on its own Ray into a moto bucket and greps everything it wrote.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from scalelab.cli.main import main
from scalelab.errors import UsageError
from scalelab.sweeps.execution import ray_cluster


class _Trial:
    pass


class _OtherTrial:
    pass


def _trial_env(cls) -> dict:
    """The env vars Ray Tune puts in a trial actor's runtime env (its actor-class cache, as the
    trial runner calls it), read without starting anything."""
    from ray.tune.execution.class_cache import _ActorClassCache

    return _ActorClassCache().get(cls)._default_options["runtime_env"]["env_vars"]


@pytest.fixture
def secrets(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_HOME", "/data/hf")


@pytest.fixture
def submitted(monkeypatch):
    sent = []

    class Recorder:
        def __init__(self, address):
            self.address = address

        def submit_job(self, **kw):
            sent.append(dict(kw, address=self.address))
            return "raysubmit_1"

    monkeypatch.setattr("ray.job_submission.JobSubmissionClient", Recorder)
    return sent


@pytest.fixture
def joined(monkeypatch):
    """ray.init and the holder actor replaced by recorders: (the inits' kwargs, the secrets shared)."""
    import ray

    inits, shared = [], []
    monkeypatch.setattr(ray, "init", lambda **kw: inits.append(kw))
    monkeypatch.setattr(ray_cluster, "share_secrets", shared.append)
    monkeypatch.setattr(ray_cluster.ray_reaper, "start_reaper", lambda **kw: None)
    return inits, shared


def test_a_detached_driver_gets_no_secret_in_its_job(secrets, submitted, tmp_path):
    ray_cluster.submit_driver("http://10.1.2.3:8265", tmp_path, ["sweep", "status", "x"], pass_env=["HF_HOME"])
    env = submitted[-1]["runtime_env"]["env_vars"]
    assert "WANDB_API_KEY" not in env and "HF_TOKEN" not in env
    assert env["WANDB_MODE"] == "offline" and env["HF_HOME"] == "/data/hf"
    for address in ("https://head.example:8265", "http://127.0.0.1:8265", "http://10.1.2.3:8265"):
        with pytest.raises(UsageError, match="WANDB_API_KEY with --detach: a Ray Job's environment is written"):
            ray_cluster.submit_driver(address, tmp_path, ["x"], pass_env=["WANDB_API_KEY"])
    assert len(submitted) == 1


def test_joining_a_cluster_puts_no_secret_in_its_runtime_env(secrets, joined, monkeypatch):
    inits, shared = joined
    ray_cluster.start_ray("10.1.2.3:6379", None)
    env = inits[-1]["runtime_env"]["env_vars"]
    assert "WANDB_API_KEY" not in env and "HF_TOKEN" not in env and env["WANDB_MODE"] == "offline"
    assert shared[-1] == {}
    with pytest.raises(UsageError, match="HF_TOKEN"):
        ray_cluster.start_ray("10.1.2.3:6379", None, pass_env=["HF_TOKEN"])
    monkeypatch.setenv("RAY_USE_TLS", "1")
    ray_cluster.start_ray("10.1.2.3:6379", None, pass_env=["HF_TOKEN", "HF_HOME"])
    assert "HF_TOKEN" not in inits[-1]["runtime_env"]["env_vars"] and shared[-1] == {"HF_TOKEN": "hf-secret"}


def test_tune_copies_no_aws_key_into_a_trial_on_any_cluster(joined, monkeypatch):
    """Ray Tune's own copying of the driver's AWS keys into every trial actor is off, on a private
    cluster (its workers inherit them) and on a joined one (named keys go to the holder actor)."""
    _, shared = joined
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, f"{name.lower()}-value")
    ray_cluster.start_ray(None, 1)
    assert not {k for k in _trial_env(_Trial) if k.startswith("AWS_")}
    ray_cluster.start_ray("127.0.0.1:6379", None, pass_env=["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
    assert not {k for k in _trial_env(_OtherTrial) if k.startswith("AWS_")}
    assert shared[-1] == {
        "AWS_ACCESS_KEY_ID": "aws_access_key_id-value",
        "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key-value",
    }


@pytest.mark.parametrize(
    "address",
    ["http://127.0.0.1@10.0.0.5:8265", "http://127.0.0.1.nip.io:8265", "ray://127.evil.example", "127.1.example:6379",
     "http://user@localhost:8265", "10.0.0.5:6379", "http://[fe80::1]:8265"],
)  # fmt: skip
def test_an_address_that_only_looks_like_loopback_is_remote(address):
    with pytest.raises(UsageError, match="clear text"):
        ray_cluster.check_secret_transport(address, ["WANDB_API_KEY"])


@pytest.mark.parametrize(
    "address",
    ["http://127.0.0.1:8265", "127.0.0.1:6379", "http://[::1]:8265", "ray://localhost:10001", "127.0.0.2:6379"],
)
def test_a_loopback_address_is_allowed(address):
    ray_cluster.check_secret_transport(address, ["WANDB_API_KEY"])


def test_the_cli_refuses_a_secret_for_a_job_or_in_clear_text_before_anything_is_written(
    secrets, submitted, tmp_path, capsys
):
    spec = tmp_path / "s.yaml"
    base = {
        "model": {"preset": "debug"},
        "data": {"seq_len": 64},
        "train": {"num_tokens": 1024, "global_batch_tokens": 256},
    }
    spec.write_text(yaml.safe_dump({"name": "s", "base": base, "grid": {"optim.lr": [1e-3]}}))
    out = tmp_path / "root" / "s"
    launch = ["sweep", "launch", str(spec), "--out", str(out)]
    detach = [*launch, "--detach", "--address", "https://head.example:8265"]
    for argv, words in (
        ([*detach, "--pass-env", "WANDB_API_KEY"], "with --detach"),
        ([*launch, "--address", "ray://10.1.2.3:10001", "--pass-env", "WANDB_API_KEY"], "clear text"),
        ([*detach, "--pass-env", "NOT_SET_ANYWHERE"], "NOT_SET_ANYWHERE"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert not out.exists() and submitted == []


CANARY = {
    "AWS_ACCESS_KEY_ID": "AKIACANARY51ACCESSKEY",
    "AWS_SECRET_ACCESS_KEY": "canary51-aws-secret-access-key",
    "AWS_SESSION_TOKEN": "canary51-aws-session-token",
    "WANDB_API_KEY": "canary51wandbapikey000000000000000000000",  # 40 characters, as W&B's keys
    "HF_TOKEN": "hf_canary51huggingfacetoken",
}


def _holding(files: dict[str, bytes]) -> list[str]:
    """'name: [variables]' for each file whose bytes hold a canary value."""
    found = [(name, [k for k, v in CANARY.items() if v.encode() in data]) for name, data in files.items()]
    return [f"{name}: {hits}" for name, hits in found if hits]


def _files_under(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():  # sockets and links left out
                out[str(path)] = path.read_bytes()
    return out


@pytest.mark.serial  # starts a Ray cluster (tests/conftest.py)
@pytest.mark.timeout(1200)
def test_no_credential_reaches_a_log_a_record_or_the_bucket(tmp_path):
    """The canaries (AWS keys and session token, WANDB_API_KEY, HF_TOKEN) are in the environment of
    `sweep launch` on its own Ray into a moto bucket, with W&B offline. The trial reaches the bucket
    (the keys arrived, by inheritance); then no file under the launch's temporary directory (Ray's
    session directory: every log, runtime_env_agent.log included; anything scalelab leaves there,
    which is nothing), no object of the bucket (records, checkpoints, the offline W&B logs) and
    nothing the command printed holds any of them."""
    from s3_local import serve

    from scalelab.store import objects

    temp = Path(tempfile.mkdtemp(prefix="c51-", dir="/tmp"))  # short: Ray's socket paths live under it
    spec = tmp_path / "canary.yaml"
    run = {
        "model": {"preset": "debug"},
        "data": {"seq_len": 64, "val_sequences": 8},
        "train": {"global_batch_tokens": 256, "num_tokens": 1024},
        "eval": {"interval_steps": 0, "val_batch_sequences": 8},
        "checkpoint": {"interval_steps": 2},
        "logging": {"wandb": "offline", "progress": "off"},
    }
    spec.write_text(yaml.safe_dump({"name": "canary", "base": run, "grid": {"optim.lr": [1e-3]}}))
    with serve("canary51") as aws:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # what a user's shell has
        env |= aws | CANARY | {"TMPDIR": str(temp), "WANDB_MODE": "offline", "RAY_AUTH_MODE": "disabled"}
        cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "launch", str(spec), "--out", "s3://canary51/root/c"]
        r = subprocess.run([*cmd, "--num-cpus", "1"], env=env, capture_output=True, text=True, timeout=1100)
        assert r.returncode == 0 and "states: done=1" in r.stdout, r.stdout + r.stderr[-3000:]
        keys = objects.list_objects("s3://canary51")
        bucket = {f"s3://canary51/{k}": objects.read_bytes(f"s3://canary51/{k}") for k in keys}
    local = _files_under(temp)
    try:
        assert any("/wandb/" in k and k.endswith(".wandb") for k in bucket), sorted(bucket)  # the offline W&B run
        assert any(k.endswith("/logs/runtime_env_agent.log") for k in local), sorted(local)[:20]
        assert not _holding(local | bucket | {"stdout": r.stdout.encode(), "stderr": r.stderr.encode()})
        assert not list(temp.glob("scalelab-*")), list(temp.iterdir())  # the run's copy, Tune's state: removed
    finally:
        shutil.rmtree(temp, ignore_errors=True)
