"""The Ray a sweep command runs on: an existing cluster joined, or a private one on loopback.

    with ray_session(address, num_cpus):      # joined / started here, shut down after
        ...
    local_ray_on_loopback(); reaper = start_ray(None, 2)   # the launch loop starts Ray lazily
    job_id = submit_driver("http://HEAD:8265", sweep_dir, ["sweep", "launch", ...])   # --detach

A private cluster listens on 127.0.0.1 only and gets a reaper process that kills its Ray processes
if the driver dies (scalelab.sweeps.execution.ray_reaper); its token authentication follows RAY_AUTH_MODE
(off unless set: `RAY_AUTH_MODE=token` on a shared machine, see the README). Joining a cluster
hands the workers the environment variables runs read; a credential never travels in a runtime
env (Ray's logs record those), but in the nodes' own environment, or named with `--pass-env`
through the driver's holder actor, never in clear text to another machine (scalelab.sweeps.execution.ray_secrets).
`sweep launch --detach` submits the driver itself as a Ray Job (through the cluster's dashboard),
so the sweep outlives the client that launched it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import shlex
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError
from scalelab.store import files
from scalelab.store.atomic import atomic_write_json
from scalelab.sweeps.execution import ray_reaper
from scalelab.sweeps.execution.ray_secrets import no_tune_credentials, share_secrets

# AWS_: where an s3:// store is (AWS_ENDPOINT_URL, AWS_DEFAULT_REGION); its keys are credentials
_FORWARDED_ENV = ("SCALELAB_", "WANDB_", "HF_", "TRITON_", "RAY_TRAIN_", "AWS_")
_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in the driver process of a Ray Job
DRIVER_FILE = "driver.json"  # <sweep>/driver.json: the Ray Job running a detached sweep's driver


# Variables that hold credentials: never in a runtime env; handed over only when named (--pass-env).
_SECRET_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def is_secret(name: str) -> bool:
    return name in _SECRET_ENV or any(w in name.upper() for w in _SECRET_WORDS)


def forwarded_env(allow: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The variables runs read (SCALELAB_CACHE, WANDB_MODE, HF_HOME, Ray Train settings, an s3://
    store's AWS_ENDPOINT_URL and region), which the processes of an existing cluster (other nodes
    included) do not inherit from this shell: a runtime env's, so never a credential
    (WANDB_API_KEY, HF_TOKEN, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, any *TOKEN*, *KEY*,
    *SECRET*, *PASSWORD*: named_secrets). A name in `allow` (`--pass-env NAME`) is forwarded
    whatever its prefix."""
    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_ENV) and not is_secret(k)}
    for name in allow:
        if name not in os.environ:
            raise UsageError(f"--pass-env {name}: not set in this environment; export it or drop the flag")
        if not is_secret(name):
            env[name] = os.environ[name]
    return env


def named_secrets(allow: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The credentials named with --pass-env and their values (handed over by share_secrets)."""
    return {name: os.environ[name] for name in allow if is_secret(name) and name in os.environ}


def check_pass_env(address: str | None, pass_env: list[str] | tuple[str, ...], *, detach: bool = False) -> None:
    """The credentials named with --pass-env are set, would not travel in clear text to `address`
    (RAY_ADDRESS when None), and are not asked of a detached driver (whose Ray Job's runtime env
    is logged); UsageError otherwise, before anything is written."""
    forwarded_env(pass_env)
    if detach:
        check_no_secret_for_a_job(pass_env)
    check_secret_transport(address or os.environ.get("RAY_ADDRESS") or "", pass_env)


def check_no_secret_for_a_job(pass_env: list[str] | tuple[str, ...]) -> None:
    """A Ray Job's runtime env is written to the cluster's logs and shown on its dashboard: no credential in it."""
    if named := [n for n in pass_env if is_secret(n)]:
        raise UsageError(
            f"--pass-env {', '.join(named)} with --detach: a Ray Job's environment is written to the cluster's "
            "logs and dashboard; set it in the environment the nodes' `ray start` ran in (or use an instance "
            "role), or launch without --detach"
        )


def is_loopback_host(host: str) -> bool:
    """An IP literal of the loopback range (127.0.0.0/8, ::1), or `localhost`; no name that merely
    starts with 127. (`127.0.0.1.nip.io`, `127.evil.example` resolve wherever their owner says)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_secret_transport(address: str, allow: list[str] | tuple[str, ...]) -> None:
    """Secrets never travel in clear text to another machine: refused (UsageError) for an http:// or
    plain Ray (GCS, ray://) address that is not loopback, unless Ray's TLS is on (RAY_USE_TLS=1).
    Loopback is an IP literal (or localhost) with no user part: `http://127.0.0.1@10.0.0.5:8265`
    goes to 10.0.0.5."""
    secrets = [n for n in allow if is_secret(n)]
    if not secrets or not address:
        return
    scheme = address.partition("://")[0].lower() if "://" in address else ""
    try:
        parts = urllib.parse.urlsplit(address if scheme else f"//{address}")
        host, user = parts.hostname or "", parts.username
    except ValueError:  # an unparseable address (a bad port, a bracket): treated as remote
        host, user = "", None
    loopback = user is None and "@" not in address and is_loopback_host(host)
    encrypted = scheme == "https" or (scheme in ("", "ray") and os.environ.get("RAY_USE_TLS") in ("1", "true"))
    if not (loopback or encrypted or address in ("auto", "local")):
        raise UsageError(
            f"--pass-env {', '.join(secrets)}: would travel in clear text to {address}; use an https:// "
            "dashboard (a TLS proxy), RAY_USE_TLS=1, or an SSH tunnel to 127.0.0.1, or set it on the nodes"
        )


def local_ray_on_loopback() -> None:
    """Make the Ray cluster this process starts listen on 127.0.0.1 only.

    Ray binds its servers (GCS, raylet, object manager, workers, agents) to the node's IP, which
    for a new local cluster is the machine's outward address unless Ray's cluster mode is off:
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes the node IP 127.0.0.1 (what Ray does on macOS and
    Windows). It is read when ray is imported, so it is set before the import and, if ray was
    imported earlier in this process, on the module too.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def start_ray(
    address: str | None, num_cpus: int | None, pass_env: list[str] | tuple[str, ...] = ()
) -> subprocess.Popen | None:
    """Connect to `address` or start a local Ray; returns the local cluster's reaper (ray_reaper).

    Without `address`, RAY_ADDRESS names the cluster as it does for Ray's own tools ("local" or
    unset: a private cluster of this process, whatever other cluster runs on the machine).
    pass_env: variables to hand the cluster's workers (forwarded_env; credentials: share_secrets,
    check_secret_transport)."""
    import ray

    kw: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    address = address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        check_secret_transport(address, pass_env)
        # Authentication is the cluster's (RAY_AUTH_MODE / RAY_AUTH_TOKEN from this environment).
        # A detached driver (a Ray Job) already runs in the runtime env its submitter forwarded,
        # which Ray refuses to merge with a second one naming the same variables.
        env = {} if _JOB_CONFIG_ENV in os.environ else forwarded_env(pass_env)
        no_tune_credentials()
        ray.init(address=address, runtime_env={"env_vars": env} if env else None, **kw)
        share_secrets(named_secrets(pass_env))
        return None
    no_tune_credentials()  # the cluster's processes inherit this environment, credentials included
    # A private cluster that listens on loopback only (local_ray_on_loopback, called before ray
    # was imported): token authentication is off unless RAY_AUTH_MODE says otherwise.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if os.environ["RAY_AUTH_MODE"].lower() == "token":
        private_token_file()
    before = ray_reaper.children(os.getpid()) if sys.platform.startswith("linux") else set()
    # address="local": a private cluster even when another one (`ray start`) runs on this machine
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kw)
    return ray_reaper.start_reaper(exclude=before)


def private_token_file() -> Path | None:
    """Under RAY_AUTH_MODE=token with no RAY_AUTH_TOKEN: make sure ~/.ray/auth_token exists and only
    its owner can read it (Ray creates it with the process's umask, often world-readable: on a
    shared machine that would hand the token to every other user). Returns the file."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = Path.home() / ".ray" / "auth_token"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    elif path.stat().st_mode & 0o077:
        print(f"warning: {path} is readable by other users; chmod 600 it", file=sys.stderr, flush=True)
    return path


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int | None) -> Iterator[None]:
    """Ray for the block: `address` joined, or a private loopback cluster started and shut down after.

    An already initialised Ray (a test's session cluster, a caller's) is used as it is.
    """
    if not address:
        local_ray_on_loopback()
    import ray

    if ray.is_initialized():
        yield
        return
    reaper = start_ray(address, num_cpus)
    try:
        yield
    finally:
        ray_reaper.stop_reaper(reaper)
        ray.shutdown()


SUBMIT_WAIT_S = 120.0  # how long a submission waits for the head's job agent


def check_dashboard_address(address: str | None) -> None:
    """A Ray Job is submitted through the cluster's dashboard: its http(s) URL, checked before anything is written."""
    if not address or not address.startswith(("http://", "https://")):
        raise UsageError(
            f"--detach --address {address}: a Ray Job is submitted through the cluster's dashboard; "
            "give its URL, e.g. --address http://HEAD:8265"
        )


def submit_driver(
    address: str, sweep_dir: str | Path, argv: list[str], pass_env: list[str] | tuple[str, ...] = ()
) -> str:
    """Run `python -m scalelab.cli <argv>` as a Ray Job on the cluster whose dashboard is `address`.

    The job's driver runs on the head node and keeps going when this client disconnects; the sweep
    directory (which every node and the client see) gets driver.json naming the job. Returns the job id.
    pass_env: variables the job's runtime env carries beside forwarded_env's; no credential
    (check_no_secret_for_a_job: the job's credentials come from the nodes' environment).
    """
    check_dashboard_address(address)
    check_no_secret_for_a_job(pass_env)
    from ray.job_submission import JobSubmissionClient

    env = forwarded_env(pass_env)
    entrypoint = shlex.join(["python", "-m", "scalelab.cli", *argv])
    client = JobSubmissionClient(address)
    deadline = time.monotonic() + SUBMIT_WAIT_S
    while True:
        try:
            job_id = client.submit_job(
                entrypoint=entrypoint,
                runtime_env={"env_vars": env} if env else None,
                metadata={"scalelab_sweep": str(sweep_dir)},
            )
            break
        except RuntimeError as err:
            # A cluster that has just started may not have its head's job agent up yet; Ray answers
            # 500 "No available agent to submit job, please try again later".
            if "No available agent" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(2.0)
    record = dict(job_id=job_id, address=address, entrypoint=entrypoint, submitted_at=time.time())
    atomic_write_json(files.join(sweep_dir, DRIVER_FILE), record)
    return job_id
