"""The Ray a sweep command runs on: an existing cluster joined, or a private one on loopback.

    with ray_session(address, num_cpus):      # joined / started here, shut down after
        ...
    local_ray_on_loopback(); reaper = start_ray(None, 2)   # the launch loop starts Ray lazily
    job_id = submit_driver("http://HEAD:8265", sweep_dir, ["sweep", "launch", ...])   # --detach

A private cluster listens on 127.0.0.1 only and gets a reaper process that kills its Ray processes
if the driver dies (scalelab.sweeps.ray_reaper); its token authentication follows RAY_AUTH_MODE
(off unless set: `RAY_AUTH_MODE=token` on a shared machine, see the README). Joining a cluster
hands the workers the environment variables runs read, credentials only when named with
`--pass-env` and never in clear text to another machine. `sweep launch --detach` submits the
driver itself as a Ray Job (through the cluster's dashboard), so the sweep outlives the client
that launched it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError
from scalelab.store import files
from scalelab.store.atomic import atomic_write_json
from scalelab.sweeps import ray_reaper

# AWS_: where an s3:// store is (AWS_ENDPOINT_URL, AWS_DEFAULT_REGION); its keys are credentials
_FORWARDED_ENV = ("SCALELAB_", "WANDB_", "HF_", "TRITON_", "RAY_TRAIN_", "AWS_")
_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in the driver process of a Ray Job
DRIVER_FILE = "driver.json"  # <sweep>/driver.json: the Ray Job running a detached sweep's driver


# Variables that hold credentials: forwarded only when named in the allow-list (--pass-env).
_SECRET_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")
# The credentials Ray Tune itself copies from the driver's environment into every trial actor's
# runtime env (ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE), whatever the job's env says.
_TUNE_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def is_secret(name: str) -> bool:
    return name in _SECRET_ENV or any(w in name.upper() for w in _SECRET_WORDS)


def forwarded_env(allow: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The variables runs read (SCALELAB_CACHE, WANDB_MODE, HF_HOME, Ray Train settings, an s3://
    store's AWS_ENDPOINT_URL and region), which the processes of an existing cluster (other nodes
    included) do not inherit from this shell.

    Credentials (WANDB_API_KEY, HF_TOKEN, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, any *TOKEN*,
    *KEY*, *SECRET*, *PASSWORD*) travel only when
    named in `allow` (`--pass-env NAME`); a name in `allow` is forwarded whatever its prefix."""
    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_ENV) and not is_secret(k)}
    for name in allow:
        if name not in os.environ:
            raise UsageError(f"--pass-env {name}: not set in this environment; export it or drop the flag")
        env[name] = os.environ[name]
    return env


def tune_credentials(allow: list[str] | tuple[str, ...] | None) -> None:
    """Which of the driver's AWS keys Ray Tune may copy into its trial actors: those named in
    `allow` on a joined cluster (--pass-env; they also travel in the job's env), all of them for a
    private cluster of this machine (None: Tune's own default). Tune's list is a process global, so
    every start_ray sets it for the cluster it connects to."""
    from ray.tune.execution import class_cache

    for name in _TUNE_CREDENTIALS:
        if allow is None or name in allow:
            class_cache.ENV_VARS_TO_PROPAGATE.add(name)
        else:
            class_cache.ENV_VARS_TO_PROPAGATE.discard(name)


def check_pass_env(address: str | None, pass_env: list[str] | tuple[str, ...]) -> None:
    """The credentials named with --pass-env are set and would not travel in clear text to
    `address` (RAY_ADDRESS when None); UsageError otherwise, before anything is written."""
    forwarded_env(pass_env)
    check_secret_transport(address or os.environ.get("RAY_ADDRESS") or "", pass_env)


def check_secret_transport(address: str, allow: list[str] | tuple[str, ...]) -> None:
    """Secrets never travel in clear text to another machine: refused (UsageError) for an http:// or
    plain Ray (GCS, ray://) address that is not loopback, unless Ray's TLS is on (RAY_USE_TLS=1)."""
    secrets = [n for n in allow if is_secret(n)]
    if not secrets or not address:
        return
    scheme, _, rest = address.partition("://") if "://" in address else ("", "", address)
    host = rest.split("/")[0].rsplit(":", 1)[0].strip("[]") if rest else ""
    loopback = host in ("localhost", "::1") or host.startswith("127.")
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
    pass_env: credentials to forward to the cluster's workers (forwarded_env, check_secret_transport)."""
    import ray

    kw: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    address = address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        check_secret_transport(address, pass_env)
        # Authentication is the cluster's (RAY_AUTH_MODE / RAY_AUTH_TOKEN from this environment).
        # A detached driver (a Ray Job) already runs in the runtime env its submitter forwarded,
        # which Ray refuses to merge with a second one naming the same variables.
        env = {} if _JOB_CONFIG_ENV in os.environ else forwarded_env(pass_env)
        tune_credentials(tuple(pass_env))
        ray.init(address=address, runtime_env={"env_vars": env} if env else None, **kw)
        return None
    tune_credentials(None)
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
    pass_env: credentials the job's runtime env may carry (never over http:// to another machine).
    """
    check_dashboard_address(address)
    check_secret_transport(address, pass_env)
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
