"""Servers bind to loopback: a local multi-process job (rendezvous store, gloo) and a local sweep (Ray,
and its multi-process run's Ray Train group: rank 0's store, gloo); a SIGKILLed sweep driver leaves
no Ray process behind (the same held sweep as the loopback check).

The listening sockets are read from /proc while the job or the sweep is up (tests/netcheck.py). The
sweep's one run is held at step 4 while a hold file exists (SCALELAB_TEST_HOLD), so the test looks
at the cluster while it trains, whatever the machine's load.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from netcheck import LOOPBACK, listening_sockets, process_tree

from scalelab.parallel.backend import spawn

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
# How long a state may take before the test calls it a hang: on a 2-core machine at load ~45, a
# local sweep took 5 minutes from launch to its run's first step (~20 s when the machine is quiet).
STATE_WAIT_S = 900


def _wait_for(predicate, timeout_s: float = 120.0, what: str = "") -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _held_job(flag_dir: str) -> None:
    """Every rank: one collective (the group's sockets are open), report the pid, wait for `go`."""
    t = torch.ones(2)
    dist.all_reduce(t)
    Path(flag_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    while not Path(flag_dir, "go").exists():
        time.sleep(0.05)
    dist.barrier()


def test_local_job_listens_only_on_loopback(tmp_path):
    before = listening_sockets([os.getpid()])
    errors: list[BaseException] = []

    def run():
        try:
            spawn(_held_job, 2, (str(tmp_path),), backend="gloo")
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    job = threading.Thread(target=run)
    job.start()
    try:
        _wait_for(lambda: all((tmp_path / f"rank{r}.pid").exists() for r in range(2)) or errors, what="the ranks")
        assert not errors, errors
        ranks = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
        ours = {pid for r in ranks for pid in process_tree(r)}
        # the launcher's new sockets (the store it serves) and everything the ranks hold
        sockets = (listening_sockets([os.getpid()]) - before) | listening_sockets(ours)
    finally:
        (tmp_path / "go").touch()
        job.join(timeout=120)
    assert not errors, errors
    assert any(pid == os.getpid() for _, _, pid in sockets), "the launcher serves the store"
    assert any(pid in ranks for _, _, pid in sockets), "gloo listens in every rank"
    assert {ip for ip, _, _ in sockets} <= set(LOOPBACK), sockets


SPEC = {
    "name": "lo",
    "base": {
        "model": {"preset": "debug"},
        "data": {"seq_len": 64, "val_sequences": 8},
        "train": {"global_batch_tokens": 256, "num_tokens": 2560},
        "eval": {"interval_steps": 0, "val_batch_sequences": 8},
        "checkpoint": {"interval_steps": 2},
        "logging": {"wandb": "disabled", "progress": "off"},
        "parallel": {"dp_shard": 2},  # a Ray Train worker group of two (issue 51: rank 0's store was on :::PORT)
    },
    "grid": {"optim.lr": [1e-3]},
}


def _held_local_sweep(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """`scalelab sweep launch` with its own local Ray (no --address), its run held at step 4."""
    spec = tmp_path / "lo.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    hold = tmp_path / "hold"
    hold.touch()
    out = tmp_path / "root" / "lo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # what a user's shell has
    env["SCALELAB_TEST_HOLD"] = f"4:{hold}"
    cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "launch", str(spec), "--out", str(out), "--num-cpus", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        started = lambda: list(out.glob("runs/*/checkpoints/step_2")) or proc.poll() is not None
        _wait_for(started, STATE_WAIT_S, "the run")
    except BaseException:
        proc.kill()
        raise
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    return proc, hold, out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.serial  # starts a Ray cluster (tests/conftest.py)
@pytest.mark.timeout(2 * STATE_WAIT_S + 300)
def test_local_sweep_listens_only_on_loopback_and_its_ray_ends_with_a_driver_sigkill(tmp_path):
    """One held local sweep serves both checks (starting its cluster is most of the time): while its
    run trains (two Ray Train workers), every listening socket of the driver's process tree (the GCS,
    the raylet, the agents, the workers and their process group, the driver) is on loopback; then
    the driver is SIGKILLed and every process of its cluster ends within 30 s. That such a sweep
    also finishes with exit 0 is asserted by the CLI sweeps on their own local Ray in test_wandb.py
    and test_store_object.py."""
    proc, hold, _ = _held_local_sweep(tmp_path)

    def cluster():
        tree = [p for p in process_tree(proc.pid) if p != proc.pid]
        return tree, {p: Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ") for p in tree}

    def agents() -> int:  # the raylet and the agents it starts (they used to outlive the driver by minutes)
        return sum(b"Agent" in n or b"/raylet " in n for n in cluster()[1].values())

    try:
        _wait_for(lambda: agents() >= 3, STATE_WAIT_S, "agents")
        sockets = listening_sockets(process_tree(proc.pid))
        tree, names = cluster()
    finally:
        proc.send_signal(signal.SIGKILL)  # only the driver we started, by its pid
        proc.wait()
    t0 = time.time()
    while any(_alive(p) for p in tree) and time.time() - t0 < 30:
        time.sleep(0.2)
    left = {p: (names.get(p) or b"")[:120] for p in tree if _alive(p)}
    hold.unlink()
    assert len({pid for _, _, pid in sockets}) >= 3, sockets  # the GCS, the raylet, workers, the driver
    ranks = {p for p, n in names.items() if b"RayTrainWorker" in n}
    assert len(ranks) == 2 and len({pid for _, _, pid in sockets} & ranks) == 2, (names, sockets)  # gloo, the store
    assert {ip for ip, _, _ in sockets} <= set(LOOPBACK), sockets
    assert not left, f"still running {time.time() - t0:.0f} s after the driver's SIGKILL: {left}"
