"""Credentials reach jobs only when asked, and never in clear text to another machine (issue 30, item 9).

WANDB_API_KEY and HF tokens are left out of the runtime env a job or a joined cluster receives
unless named with `--pass-env`; named, they are refused for an http:// dashboard or a plain Ray
address that is not loopback. The AWS keys Ray Tune itself copies into every trial actor follow
the same rule on a joined cluster. (The Ray clients are replaced by recorders: nothing is sent.)
"""

from __future__ import annotations

import pytest
import yaml

from scalelab.cli.main import main
from scalelab.errors import UsageError
from scalelab.sweeps import ray_cluster


@pytest.fixture(autouse=True)
def tune_default():
    """start_ray sets Ray Tune's process-wide list of credentials it hands to trials; later tests
    in this process run sweeps on private clusters, where Tune's default holds."""
    yield
    ray_cluster.tune_credentials(None)


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


def test_secrets_go_to_a_job_only_when_named_and_never_over_plain_http(secrets, submitted, tmp_path):
    ray_cluster.submit_driver("http://10.1.2.3:8265", tmp_path, ["sweep", "status", "x"])
    env = submitted[-1]["runtime_env"]["env_vars"]
    assert "WANDB_API_KEY" not in env and "HF_TOKEN" not in env
    assert env["WANDB_MODE"] == "offline" and env["HF_HOME"] == "/data/hf"
    with pytest.raises(UsageError, match="WANDB_API_KEY.*clear text to http://10.1.2.3:8265"):
        ray_cluster.submit_driver("http://10.1.2.3:8265", tmp_path, ["x"], pass_env=["WANDB_API_KEY"])
    for address in ("https://head.example:8265", "http://127.0.0.1:8265"):
        ray_cluster.submit_driver(address, tmp_path, ["x"], pass_env=["WANDB_API_KEY"])
        env = submitted[-1]["runtime_env"]["env_vars"]
        assert env["WANDB_API_KEY"] == "wandb-secret" and "HF_TOKEN" not in env


def test_joining_a_cluster_forwards_no_secret_unless_named(secrets, monkeypatch):
    import ray

    inits = []
    monkeypatch.setattr(ray, "init", lambda **kw: inits.append(kw))
    ray_cluster.start_ray("10.1.2.3:6379", None)
    env = inits[-1]["runtime_env"]["env_vars"]
    assert "WANDB_API_KEY" not in env and "HF_TOKEN" not in env and env["WANDB_MODE"] == "offline"
    with pytest.raises(UsageError, match="HF_TOKEN"):
        ray_cluster.start_ray("10.1.2.3:6379", None, pass_env=["HF_TOKEN"])
    monkeypatch.setenv("RAY_USE_TLS", "1")
    ray_cluster.start_ray("10.1.2.3:6379", None, pass_env=["HF_TOKEN"])
    assert inits[-1]["runtime_env"]["env_vars"]["HF_TOKEN"] == "hf-secret"


def test_tune_hands_trials_only_the_named_aws_keys_on_a_joined_cluster(monkeypatch):
    import ray

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, f"{name.lower()}-value")
    monkeypatch.setattr(ray, "init", lambda **kw: None)
    ray_cluster.start_ray("127.0.0.1:6379", None)
    assert not {k for k in _trial_env(_Trial) if k.startswith("AWS_")}
    ray_cluster.start_ray("127.0.0.1:6379", None, pass_env=["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
    env = _trial_env(_OtherTrial)
    assert env["AWS_SECRET_ACCESS_KEY"] == "aws_secret_access_key-value" and "AWS_SESSION_TOKEN" not in env
    ray_cluster.tune_credentials(None)  # a private cluster of this machine: Tune's own default
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} <= set(_trial_env(type("T", (), {})))


def test_the_cli_refuses_a_secret_in_clear_text_before_anything_is_written(secrets, submitted, tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    base = {
        "model": {"preset": "debug"},
        "data": {"seq_len": 64},
        "train": {"num_tokens": 1024, "global_batch_tokens": 256},
    }
    spec.write_text(yaml.safe_dump({"name": "s", "base": base, "grid": {"optim.lr": [1e-3]}}))
    out = tmp_path / "root" / "s"
    argv = ["sweep", "launch", str(spec), "--out", str(out), "--detach", "--address", "http://10.1.2.3:8265"]
    assert main([*argv, "--pass-env", "WANDB_API_KEY"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "clear text" in err, err
    assert not out.exists() and submitted == []
    assert main([*argv, "--pass-env", "NOT_SET_ANYWHERE"]) == 2
    assert "NOT_SET_ANYWHERE" in capsys.readouterr().err
