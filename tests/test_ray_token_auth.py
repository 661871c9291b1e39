"""Ray's token authentication on the private cluster of a shared machine (issue 30, item 9).

Loopback is not private where other people log in: `RAY_AUTH_MODE=token` makes scalelab's local
cluster require a token, which scalelab keeps in a file only its owner can read. Runs in its own
process (the test session's Ray has authentication off): a task runs on the cluster, and a process
without the token is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, stat, subprocess, sys
    from pathlib import Path
    from scalelab.sweeps.execution.ray_cluster import local_ray_on_loopback, ray_session
    local_ray_on_loopback()
    import ray
    with ray_session(None, 1):
        token = Path.home() / ".ray" / "auth_token"
        print("mode", oct(stat.S_IMODE(token.stat().st_mode)))
        print("task", ray.get(ray.remote(lambda: 6 * 7).remote()))
        gcs = ray.get_runtime_context().gcs_address
        probe = "import ray, sys\\ntry:\\n    ray.init(address=sys.argv[1])\\n    print('connected')\\n"
        probe += "except Exception as e:\\n    print('refused', type(e).__name__)\\n"
        # The stranger's ray.init tries the GCS once a second, 20 times by default, before it gives
        # up; the cluster is up and answering (the task ran), so 5 tries tell a refusal just as well.
        env = dict(os.environ, HOME=sys.argv[1], RAY_AUTH_MODE="disabled", RAY_gcs_server_port_wait_time_s="5")
        r = subprocess.run([sys.executable, "-c", probe, gcs], env=env, capture_output=True, text=True, timeout=120)
        print("stranger", r.stdout.strip().splitlines()[-1])
    """
)


@pytest.mark.serial  # starts a Ray cluster (tests/conftest.py)
def test_the_local_cluster_under_token_auth_runs_tasks_and_refuses_strangers(tmp_path):
    home, other = tmp_path / "home", tmp_path / "other"
    home.mkdir()
    other.mkdir()
    env = dict(os.environ, HOME=str(home), RAY_AUTH_MODE="token", RAY_ADDRESS="local")
    env.pop("RAY_AUTH_TOKEN", None)
    r = subprocess.run(
        [sys.executable, "-P", "-c", SCRIPT, str(other)], env=env, capture_output=True, text=True, timeout=300
    )
    out = r.stdout.splitlines()
    assert r.returncode == 0, r.stderr[-3000:]
    assert "mode 0o600" in out and "task 42" in out, r.stdout
    assert "stranger refused ConnectionError" in out, r.stdout
