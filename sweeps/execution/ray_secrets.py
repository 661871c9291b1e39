"""How credentials reach a sweep's workers: never through a Ray runtime env, which Ray's logs record.

    no_tune_credentials()            # Ray Tune copies none of the driver's AWS keys into trial actors
    share_secrets({"HF_TOKEN": ...}) # a joined cluster, --pass-env: the driver's holder actor keeps them
    receive_secrets()                # in a trial or a Ray Train worker: set them in os.environ (if any)

Every runtime env Ray sets up is written whole to the node's `runtime_env_agent.log` (mode 644, in
Ray's session directory under the system temp dir, kept after the cluster ends) and a job's is
shown on the dashboard; Ray Tune puts the driver's AWS keys into every trial actor's runtime env
unless told otherwise. So no credential travels that way:

- a private local cluster: its processes inherit the environment of the driver that started them,
  credentials included; nothing is copied.
- a joined cluster: each node's own environment (the one `ray start` ran in, or an instance role);
  and a credential named with `--pass-env` is handed to the driver's named actor by a method call
  (its argument travels inside the task, in no runtime env and no log), from which each trial and
  each Ray Train worker reads it into its own environment before it touches the store. The actor
  lives as long as the driver. check_secret_transport (scalelab.sweeps.execution.ray_cluster) refuses a
  `--pass-env` credential for an address where this would cross the network in clear text.
- a detached driver (a Ray Job): only by the nodes' environment; its job's runtime env may carry
  no credential (submit_driver refuses one).
"""

from __future__ import annotations

import os

SECRETS_ACTOR = "scalelab-secrets"  # named in the driver's job namespace, which trials and workers share
# The credentials Ray Tune copies from the driver's environment into every trial actor's runtime env
# (ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE).
_TUNE_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")
_held = []  # the driver's holder actor: a handle kept for the driver's life


class _Holder:
    """The credentials named with --pass-env, held in the driver's actor for its trials."""

    def __init__(self) -> None:
        self._env: dict[str, str] = {}

    def put(self, env: dict[str, str]) -> None:
        self._env = dict(env)

    def get(self) -> dict[str, str]:
        return dict(self._env)


def no_tune_credentials() -> None:
    """Ray Tune copies none of the driver's AWS keys into its trial actors' runtime envs (a process
    global of Tune's, so set by every start_ray)."""
    from ray.tune.execution import class_cache

    for name in _TUNE_CREDENTIALS:
        class_cache.ENV_VARS_TO_PROPAGATE.discard(name)


def share_secrets(env: dict[str, str]) -> None:
    """In the driver, connected to a joined cluster: hold `env` in the named actor for its workers."""
    import ray

    if not env:
        return
    holder = ray.remote(num_cpus=0)(_Holder).options(name=SECRETS_ACTOR, get_if_exists=True).remote()
    ray.get(holder.put.remote(env))  # a method's argument: not in the actor's creation record
    _held[:] = [holder]


def receive_secrets() -> None:
    """In a trial or a Ray Train worker: set the credentials the driver holds (none on a private
    cluster, whose processes inherited them) in this process's environment."""
    import ray

    try:
        holder = ray.get_actor(SECRETS_ACTOR)
    except ValueError:  # no such actor: nothing was named with --pass-env
        return
    os.environ.update(ray.get(holder.get.remote()))
