"""Node-loss latency on a simulated multi-node Ray cluster: how long until a lost run trains again.

    python bench/cluster_failover.py [--kills 3] [--health-period-ms 500] [--health-threshold 4]

A `ray.cluster_utils.Cluster` on this machine (a head with no CPUs, three worker nodes of one CPU) runs
a sweep (`scalelab sweep launch --address`) of one-process debug runs, each held at step 20 while a
file exists. For each of --kills runs in turn, the node training it is killed (no graceful shutdown)
once the run holds a checkpoint, and a replacement node is added. Printed per kill, in seconds after
the kill:

- detect:  the driver's Tune retries the trial (the `retry` event): Ray declared the node dead after
           about health-period x threshold, and the trial's actor with it;
- restart: the retried trial starts on another node (its `start` event);
- resumed: the new attempt has loaded the checkpoint and begins training (its `layouts[-1].at`).

Ray's defaults are a 3000 ms health-check period and a threshold of 5 (~15 s to declare a silent node
dead); pass --health-period-ms 3000 --health-threshold 5 to measure them. A simulated node's killed
processes close their connections, so Ray notices the loss before any health check fails.

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from ray.cluster_utils import Cluster

from scalelab import store
from scalelab.store.checkpoint_files import latest_checkpoint
from scalelab.store.records import read_status
from scalelab.sweeps.specs.spec import expand_sweep

BASE = {
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"global_batch_tokens": 256, "num_tokens": 256 * 40},
    "eval": {"interval_steps": 0, "val_batch_sequences": 8},
    "checkpoint": {"interval_steps": 5},
    "logging": {"wandb": "disabled", "progress": "off"},
}


def _events(out: Path, run_id: str) -> list[dict]:
    return [e for e in store.read_events(out) if e["run_id"] == run_id] if out.exists() else []


def _wait(cond, what: str, proc: subprocess.Popen, timeout_s: float = 600.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        if proc.poll() is not None:
            raise SystemExit(f"the driver ended before {what}")
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def _one_kill(k: int, cluster: Cluster, workers: list, tmp: Path) -> dict:
    """One sweep of one run held at step 20; its node killed once it holds a checkpoint."""
    lr = 1e-3 * (k + 1)
    spec = {"name": f"failover{k}", "base": BASE, "grid": {"optim.lr": [lr]}, "execution": {"max_failures": 2}}
    run_id = expand_sweep(spec).runs[0].run_id
    spec_path = tmp / f"failover{k}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = tmp / "root" / f"failover{k}"
    run_dir = store.run_path(out, run_id)
    hold = tmp / f"hold{k}"
    hold.touch()
    env = dict(os.environ, SCALELAB_TEST_HOLD=f"20:{hold}")
    cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "launch", str(spec_path), "--out", str(out)]
    log = open(tmp / f"failover{k}.log", "w")  # noqa: SIM115  (closed with the process)
    proc = subprocess.Popen(cmd + ["--address", cluster.address], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: run_dir.exists() and latest_checkpoint(run_dir / "checkpoints"), "a checkpoint", proc)
        node_id = [e for e in _events(out, run_id) if e["event"] == "start"][-1]["node"]
        node = next(n for n in workers if n.node_id == node_id)
        cluster.remove_node(node, allow_graceful=False)
        killed_at = time.time()
        workers.remove(node)
        workers.append(cluster.add_node(num_cpus=1))
        hold.unlink()

        def resumed():
            layouts = (read_status(run_dir) or {}).get("layouts") or []
            return layouts[-1] if len(layouts) >= 2 else None

        layout = _wait(resumed, "the resumed attempt", proc)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    ev = _events(out, run_id)
    retry = next(e for e in ev if e["event"] == "retry")
    start = [e for e in ev if e["event"] == "start"][-1]
    return dict(
        run=run_id,
        detect=retry["time"] - killed_at,
        restart=start["time"] - killed_at,
        resumed=layout["at"] - killed_at,
        from_step=layout["from_step"],
        other_node=start["node"] != node_id,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--health-period-ms", type=int, default=500)
    ap.add_argument("--health-threshold", type=int, default=4)
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    tmp = Path(tempfile.mkdtemp(prefix="failover-"))
    health = {
        "health_check_period_ms": args.health_period_ms,
        "health_check_timeout_ms": args.health_period_ms,
        "health_check_failure_threshold": args.health_threshold,
    }
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": health}
    )
    workers = [cluster.add_node(num_cpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    rows, states = [], {}
    try:
        for k in range(args.kills):
            rows.append(_one_kill(k, cluster, workers, tmp))
            states[rows[-1]["run"]] = store.run_state(store.run_path(tmp / "root" / f"failover{k}", rows[-1]["run"]))
    finally:
        cluster.shutdown()
    period, threshold = args.health_period_ms, args.health_threshold
    print(f"node loss latency (health check {period} ms x {threshold}), seconds after the node was killed")
    print(f"{'run':>14} {'detect':>7} {'restart':>8} {'resumed':>8} {'from step':>10} {'other node':>11}")
    for r in rows:
        print(
            f"{r['run']:>14} {r['detect']:>7.1f} {r['restart']:>8.1f} {r['resumed']:>8.1f} "
            f"{r['from_step']:>10} {str(r['other_node']):>11}"
        )
    for key in ("detect", "restart", "resumed"):
        vals = [r[key] for r in rows]
        print(f"median {key}: {statistics.median(vals):.1f} s  (min {min(vals):.1f}, max {max(vals):.1f})")
    print("final states:", states)


if __name__ == "__main__":
    main()
