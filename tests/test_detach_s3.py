"""`sweep launch --detach` into an s3:// store: the driver runs as a Ray Job and reads the bucket.

The client submits the driver as a Ray Job and exits; the sweep finishes without it, and a process
elsewhere (another working directory, only the store's URL) reads its status and resumes it. The Ray
cluster (`ray.cluster_utils.Cluster` with its dashboard) is started with the AWS keys in its
environment (the nodes' own credentials: a Ray Job's runtime env, which Ray logs, carries none) and
no other AWS variable, so the job reaches moto's S3 server (tests/s3_local.py) only through what the
client forwarded: AWS_ENDPOINT_URL and the region. The spec copy the job's driver launches is an
object of the sweep (`<out>/driver/<spec>`).
"""

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from scalelab import store
from scalelab.store import objects

pytest.importorskip("moto.server")
pytest.importorskip("boto3")
from s3_local import AWS_ENV, free_port, serve  # noqa: E402

pytestmark = pytest.mark.serial  # starts a Ray cluster (tests/conftest.py)
BUCKET = "scalelab-detach"
SPEC = {
    "name": "det",
    "base": {
        "model": {"preset": "debug"},
        "data": {"seq_len": 64, "val_sequences": 8},
        "train": {"global_batch_tokens": 256, "num_tokens": 256 * 10},
        "eval": {"interval_steps": 0, "val_batch_sequences": 8},
        "checkpoint": {"interval_steps": 5},
        "logging": {"wandb": "disabled", "progress": "off"},
    },
    "grid": {"optim.lr": [1e-3, 2e-3]},
}
WAIT_S = 600


@pytest.fixture(scope="module")
def cluster_with_keys_only():
    """A local Ray cluster with a dashboard, its processes started with the AWS keys and no other
    AWS_* variable: its dashboard's URL (for jobs) and its GCS address (for drivers)."""
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    os.environ.update({k: v for k, v in AWS_ENV.items() if k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    try:
        ports = {"dashboard_port": free_port(), "dashboard_agent_listen_port": free_port()}
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": True} | ports)
    finally:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.pop(k, None)
        os.environ.update(saved)
    try:
        yield "http://" + c.head_node.address_info["webui_url"], c.address
    finally:
        c.shutdown()


def test_detached_driver_runs_a_sweep_into_the_bucket(cluster_with_keys_only, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    dashboard, address = cluster_with_keys_only
    spec = tmp_path / "det.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    with serve(BUCKET) as env:
        out = f"s3://{BUCKET}/root/det"
        cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "launch", str(spec), "--out", out,
               "--address", dashboard, "--detach"]  # fmt: skip
        launched = subprocess.run(cmd, env=dict(os.environ, **env), capture_output=True, text=True, timeout=WAIT_S)
        assert launched.returncode == 0, launched.stderr[-3000:]
        job_id = json.loads(objects.read_bytes(f"{out}/driver.json"))["job_id"]
        assert f"Ray job {job_id}" in launched.stdout
        assert objects.read_bytes(f"{out}/driver/det.yaml") == spec.read_bytes()  # what the job's driver reads
        assert store.read_resolved(out)["runs"]  # recorded before the job's driver starts
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        status = _cli("sweep", "status", out, cwd=elsewhere)
        assert status.returncode == 0 and f"driver: Ray job {job_id}" in status.stdout and "2 runs" in status.stdout
        client = JobSubmissionClient(dashboard)
        deadline = time.time() + WAIT_S
        while client.get_job_status(job_id) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            assert time.time() < deadline, "the detached driver never finished"
            time.sleep(0.5)
        assert client.get_job_status(job_id) == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-3000:]
        runs = store.load_runs(out)
        assert runs.height == 2 and set(runs["status"]) == {"done"}
        status = _cli("sweep", "status", out, "--json", cwd=elsewhere)
        assert json.loads(status.stdout)["counts"] == {"done": 2}
        resumed = _cli("sweep", "resume", out, "--address", address, cwd=elsewhere)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        starts = [e for e in store.read_events(out) if e["event"] == "start"]
        assert len(starts) == 2  # each run trained once, by the job's driver; the resume found them done


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    """A scalelab command in another working directory, with this process's (moto) AWS environment."""
    cmd = [sys.executable, "-m", "scalelab.cli", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=WAIT_S)
