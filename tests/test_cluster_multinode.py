"""Sweeps on a multi-node Ray cluster simulated on this machine (`ray.cluster_utils.Cluster`).

One cluster for the module: a head with no CPUs (the drivers attach there) and worker nodes of one
CPU each, so a dp=2 run's two workers sit on two nodes. Each test drives a sweep into it with
`scalelab sweep launch --address` in a subprocess and removes or adds nodes while it runs:

- a node lost mid-run: its trial is retried on another node from its latest checkpoint, ends bit
  for bit as an uninterrupted run, and the runs that had finished are not trained again;
- a hang injected in one rank of a dp=2 run over two nodes: the step watchdog ends the workers, the
  retry finishes the run, and its numbers equal the same run on one node (`scalelab run`'s processes).

The elastic case (a dp=2 run loses a node and continues at dp=1) is test_cluster_multinode_s3.py's:
the same run on a cluster of the same shape, its checkpoints reaching the surviving node through a
bucket. `sweep launch --detach` is test_detach_s3.py's. The cluster is shut down at the end of the
module; this process never connects to it, so the session's `ray_local` cluster of later tests is
untouched. Runs: the debug model, 64-token sequences.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from ray.cluster_utils import Cluster

from scalelab import store
from scalelab.store.checkpoint_files import latest_checkpoint
from scalelab.store.records import read_status
from scalelab.sweeps.specs.spec import expand_sweep
from scalelab.train.config import build_run_config
from scalelab.train.launch import launch_local
from scalelab.train.loop import train_run

BASE = {
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"global_batch_tokens": 256, "num_tokens": 256 * 40},
    "eval": {"interval_steps": 0, "val_batch_sequences": 8},
    "checkpoint": {"interval_steps": 5},
    "logging": {"wandb": "disabled", "progress": "off"},
}
DP2 = {**BASE, "parallel": {"dp_shard": 2}}
WAIT_S = 600  # how long a state may take before a test calls it a hang (a loaded 2-core machine is slow)
METRIC_COLS = ["step", "tokens", "flops", "loss", "lr", "grad_norm"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimCluster:
    """The module's cluster and the worker nodes it has now (one CPU each)."""

    def __init__(self):
        # A node that vanished silently is declared dead after ~4 missed 0.5 s health checks (Ray's
        # default: ~15 s); a killed simulated node closes its connections and is noticed sooner.
        health = {"health_check_period_ms": 500, "health_check_timeout_ms": 500, "health_check_failure_threshold": 4}
        # No dashboard (`sweep launch --detach` is tests/test_detach_s3.py's); its agent on a free
        # port, not Ray's fixed default (52365), which another cluster on the machine may hold.
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "dashboard_agent_listen_port": _free_port(),
                "_system_config": health,
            },
        )
        self.workers = []

    @property
    def address(self) -> str:
        return self.cluster.address

    def ensure_workers(self, n: int) -> None:
        while len(self.workers) < n:
            self.workers.append(self.cluster.add_node(num_cpus=1))
        self.cluster.wait_for_nodes()

    def remove(self, node_id: str) -> float:
        """Kill the worker node with that id (no graceful shutdown); returns the time it died."""
        node = next(n for n in self.workers if n.node_id == node_id)
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)
        return time.time()


@pytest.fixture(scope="module")
def sim():
    c = SimCluster()
    try:
        yield c
    finally:
        c.cluster.shutdown()


_DP2_REFERENCE: list[tuple[str, pl.DataFrame, dict]] = []  # trained at most once per session


def dp2_reference_run(tmp_path_factory) -> tuple[str, pl.DataFrame, dict]:
    """The dp=2 run (lr 3e-3) on one node, uninterrupted: `scalelab run`'s two local processes (no
    Ray). Its run id, metrics and status. Trained once and shared with test_cluster_multinode_s3,
    whose elastic run is the same run (the run id does not depend on the sweep's name)."""
    if not _DP2_REFERENCE:
        run = expand_sweep({"name": "ref", "base": DP2, "grid": {"optim.lr": [3e-3]}}).runs[0]
        out = tmp_path_factory.mktemp("dp2ref") / run.run_id
        assert launch_local(build_run_config(run.config), out) == 0
        metrics = pl.read_parquet(out / "metrics.parquet").select(METRIC_COLS)
        _DP2_REFERENCE.append((run.run_id, metrics, read_status(out)))
    return _DP2_REFERENCE[0]


@pytest.fixture(scope="module")
def dp2_reference(tmp_path_factory):
    return dp2_reference_run(tmp_path_factory)


def _driver(spec: dict, out: Path, address: str, tmp: Path, **env: str) -> subprocess.Popen:
    spec_path = tmp / f"{spec['name']}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "launch", str(spec_path), "--out", str(out)]
    log = open(tmp / f"{spec['name']}.log", "w")  # noqa: SIM115  (closed with the process)
    return subprocess.Popen(
        cmd + ["--address", address], env=dict(os.environ, **env), stdout=log, stderr=subprocess.STDOUT
    )


def _finish(proc: subprocess.Popen, log: Path) -> None:
    try:
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()  # only the driver this test started
    assert proc.returncode == 0, log.read_text()[-4000:]


def _wait_for(what: str, cond, proc: subprocess.Popen, log: Path):
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        assert proc.poll() is None, f"the driver ended before {what}:\n" + log.read_text()[-4000:]
        time.sleep(0.5)  # a poll of the bucket costs ~20 ms of CPU (client and moto) on a busy machine
    proc.kill()
    pytest.fail(f"never reached: {what}")


def _events(sweep_dir: Path, run_id: str) -> list[dict]:
    return [e for e in store.read_events(sweep_dir) if e["run_id"] == run_id] if sweep_dir.exists() else []


def _metrics(run_dir: Path) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "metrics.parquet").select(METRIC_COLS)


def _print_losses(title: str, ref: pl.DataFrame, got: pl.DataFrame, resumed_at: int, layouts: list[dict]) -> None:
    """The loss table of a resumed run against its uninterrupted reference (pytest -s shows it)."""
    print(f"\n{title}; attempt 2 resumed from the step-{resumed_at} checkpoint")
    print(f"{'step':>5} {'attempt':>8} {'layout':>12} {'uninterrupted':>14} {'this run':>14} {'|diff|':>9}")
    last = int(ref["step"].max())
    for step in sorted({1, resumed_at - 1, resumed_at, resumed_at + 1, resumed_at + 5, last} & set(range(1, last + 1))):
        a = ref.filter(pl.col("step") == step)["loss"][0]
        b = got.filter(pl.col("step") == step)["loss"][0]
        lay = next(x for x in reversed(layouts) if x["from_step"] < step)
        label = "dp{} x acc{}".format(lay["dp"], lay["accumulation"])
        print(f"{step:>5} {lay['attempt']:>8} {label:>12} {a:>14.8f} {b:>14.8f} {abs(a - b):>9.2e}")


@pytest.mark.serial  # starts a Ray cluster (tests/conftest.py)
def test_node_loss_retries_the_trial_on_another_node_from_its_checkpoint(sim, tmp_path):
    """Three one-process runs on two nodes; the node training the long run is killed once a short
    run is done and the long run (held at step 15 while a file exists; the short runs have 10 steps)
    holds a checkpoint."""
    sim.ensure_workers(2)
    spec = {
        "name": "loss",
        "base": BASE,
        "points": [
            {"optim.lr": 1e-3, "train.num_tokens": 256 * 10},  # short runs end before the hold step
            {"optim.lr": 2e-3, "train.num_tokens": 256 * 10},
            {"optim.lr": 3e-3, "train.num_tokens": 256 * 30},
        ],
        "execution": {"max_failures": 2},
    }
    runs = expand_sweep(spec).runs
    long_id = runs[-1].run_id
    out = tmp_path / "root" / "loss"
    long_dir = store.run_path(out, long_id)
    hold = tmp_path / "hold"
    hold.touch()
    log = tmp_path / "loss.log"
    proc = _driver(spec, out, sim.address, tmp_path, SCALELAB_TEST_HOLD=f"15:{hold}")

    def ready():
        done = {r.run_id for r in runs[:2] if store.run_state(store.run_path(out, r.run_id)) == "done"}
        ckpt = latest_checkpoint(long_dir / "checkpoints") if long_dir.exists() else None
        return done if done and ckpt is not None else None

    done_before = _wait_for("a finished run and a checkpointed long run", ready, proc, log)
    lost_node = [e for e in _events(out, long_id) if e["event"] == "start"][-1]["node"]
    killed_at = sim.remove(lost_node)
    sim.ensure_workers(2)  # a replacement node, as an autoscaler would add
    hold.unlink()
    _finish(proc, log)

    events = _events(out, long_id)
    assert [e["event"] for e in events] == ["start", "retry", "start", "end"], events
    assert events[0]["node"] == lost_node and events[2]["node"] != lost_node
    status = read_status(long_dir)
    assert status["status"] == "done" and status["attempts"] == 2
    loaded = status["loaded_steps"]
    assert loaded[0] is None and loaded[1] is not None, loaded  # the retry loaded a checkpoint
    assert 5 <= loaded[1] <= 15 and events[3]["loaded_step"] == loaded[1]
    for run_id in done_before:  # finished before the loss: never started again
        assert [e["event"] for e in _events(out, run_id)] == ["start", "end"]

    # the uninterrupted run (one process, no Ray): the resumed one ends bit for bit the same
    ref_dir = tmp_path / "ref"
    train_run(build_run_config(runs[-1].config), ref_dir)
    got, ref = _metrics(long_dir), _metrics(ref_dir)
    title = "node loss: one-process run, its node killed, the trial retried on another node"
    _print_losses(title, ref, got, loaded[1], status["layouts"])
    assert got.equals(ref)
    assert read_status(long_dir)["final_val_loss"] == read_status(ref_dir)["final_val_loss"]
    detect_s, restart_s = events[1]["time"] - killed_at, events[2]["time"] - killed_at
    print(f"node loss: retry seen {detect_s:.1f} s after the kill, restarted on another node after {restart_s:.1f} s")
    assert 0 < detect_s <= restart_s


@pytest.mark.serial  # starts a Ray cluster (tests/conftest.py)
def test_dp2_over_two_nodes_equals_one_node_through_a_hang_ended_by_the_watchdog(sim, dp2_reference, tmp_path):
    """A dp=2 run whose two Ray Train workers sit on two nodes. Rank 1 sleeps forever inside step 12
    (once); rank 0 blocks in that step's collective. Both watchdogs end their processes, the trainer
    restarts the group from step 10, and the run's numbers are the one-node run's, bit for bit."""
    sim.ensure_workers(2)
    run_id, ref, _ = dp2_reference
    spec = {
        "name": "hang",
        "base": DP2,
        "grid": {"optim.lr": [3e-3]},
        "execution": {"hang_factor": 10.0, "hang_min_s": 3.0, "max_failures": 1},
    }
    out = tmp_path / "root" / "hang"
    marker = tmp_path / "hung"
    proc = _driver(spec, out, sim.address, tmp_path, SCALELAB_TEST_HANG=f"12:1:{marker}")
    _finish(proc, tmp_path / "hang.log")
    assert marker.exists()  # the hang happened
    status = read_status(store.run_path(out, run_id))
    assert status["status"] == "done" and status["loaded_steps"] == [None, 10]
    [hang] = status["hangs"]
    assert hang["step"] == 12 and hang["elapsed_s"] >= 3.0
    worker_ids = {n.node_id for n in sim.workers}
    for layout in status["layouts"]:  # both attempts: dp=2 with one worker on each of two nodes
        assert layout["dp"] == 2 and not layout["elastic"], layout
        assert len(set(layout["nodes"])) == 2 and set(layout["nodes"]) <= worker_ids, layout["nodes"]
    assert _metrics(store.run_path(out, run_id)).equals(ref)


def test_readme_cluster_section_names_real_keys_and_flags():
    """The README's "Running on a cluster" names execution keys and flags that exist."""
    from dataclasses import fields

    from scalelab.cli.main import build_parser
    from scalelab.sweeps.specs.spec import ExecutionConfig

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Running on a cluster", 1)[1].split("\n## ", 1)[0]
    keys = {"max_failures", "elastic", "hang_factor", "hang_min_s", "cpus_per_run", "gpus_per_run"}
    assert keys <= {f.name for f in fields(ExecutionConfig)}
    assert all(k in section for k in keys), [k for k in keys if k not in section]
    args = build_parser().parse_args(
        ["sweep", "launch", "s.yaml", "--out", "o", "--address", "http://h:8265", "--detach"]
    )
    assert args.detach and "--detach" in section and "sweep resume" in section
