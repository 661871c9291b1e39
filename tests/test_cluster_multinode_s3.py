"""A dp=2 run on an `s3://` store over a multi-node Ray cluster simulated on this machine, a node lost.

moto's S3 server is the store and the cluster's nodes reach it through the AWS environment they
inherit (no shared file system is used: each rank trains in a directory of its own,
scalelab.store.rank_copy). An elastic dp=2 run whose two workers sit on two nodes loses the node
that does not hold its trial once the bucket holds a complete checkpoint at step >= 10; the run
continues at dp=1 (accumulation 2: the same global batch) from the bucket's newest complete
checkpoint (resharded on load; its `loaded_steps` says which). Up to that step it equals the
uninterrupted dp=2 run trained on one local disk bit for bit, after it within 1e-5 (the gradient
sums may run in another order), under the same run id. This is the suite's end-to-end elastic test:
the layout logic does not depend on the store, and the bucket adds what a local disk cannot show.
"""

import polars as pl
import pytest
from test_cluster_multinode import (
    DP2,
    METRIC_COLS,
    SimCluster,
    _driver,
    _finish,
    _print_losses,
    _wait_for,
    dp2_reference_run,
)

from scalelab import store
from scalelab.store import checkpoint_files, objects
from scalelab.store.records import read_status
from scalelab.sweeps.specs.spec import expand_sweep

pytest.importorskip("moto.server")
from s3_local import serve  # noqa: E402

BUCKET = "scalelab-cluster"


@pytest.fixture(scope="module")
def sim():
    with serve(BUCKET):  # first: the cluster's nodes inherit the AWS environment pointing at it
        c = SimCluster()
        try:
            yield c
        finally:
            c.cluster.shutdown()


def _newest_complete(run_url: str) -> int:
    steps = [int(d.split("_")[1]) for d in checkpoint_files.remote_checkpoints(objects.join(run_url, "checkpoints"))]
    return max(steps, default=0)


@pytest.fixture(scope="module")
def dp2_reference(tmp_path_factory):
    """The uninterrupted dp=2 run on one local disk (trained once for both multinode modules)."""
    return dp2_reference_run(tmp_path_factory)


@pytest.mark.serial  # starts a Ray cluster (tests/conftest.py)
def test_dp2_on_s3_loses_a_node_and_resumes_from_the_bucket(sim, dp2_reference, tmp_path):
    sim.ensure_workers(2)
    spec = {
        "name": "elastic",
        "base": DP2,
        "grid": {"optim.lr": [3e-3]},
        "execution": {"elastic": True, "max_failures": 2},
    }
    run_id = expand_sweep(spec).runs[0].run_id
    out = f"s3://{BUCKET}/root/elastic"
    run_url = objects.join(out, "runs", run_id)
    log = tmp_path / "elastic.log"
    # After the loss Ray Train asks for the group of two again until its view of the cluster drops
    # the dead node: Ray's autoscaling coordinator refreshes that view every 20 s (0-20 s after the
    # loss). Each try waits this long for its placement group (never placed: one node is gone);
    # only placement is timed (ready in under a second on live nodes; a try that times out before
    # the loss is tried again at the same size), so a short one only ends the last try sooner.
    timeout = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "2"}
    proc = _driver(spec, out, sim.address, tmp_path, SCALELAB_TEST_STEP_DELAY_S="0.15", **timeout)
    _wait_for("a complete checkpoint >= 10 in the bucket", lambda: _newest_complete(run_url) >= 10, proc, log)
    trial_node = [e for e in store.read_events(out) if e["event"] == "start"][-1]["node"]
    other = next(n.node_id for n in sim.workers if n.node_id != trial_node)
    killed_at = sim.remove(other)
    print(f"\nkilled {other[:8]} at step >= {_newest_complete(run_url)} (newest complete checkpoint in the bucket)")
    _finish(proc, log)
    sim.ensure_workers(2)

    status = read_status(run_url)
    print("events:", [(e["event"], round(e["time"] - killed_at, 1)) for e in store.read_events(out)])
    print("layouts:", status["layouts"], "loaded_steps:", status["loaded_steps"])
    assert status["status"] == "done" and status["run_id"] == run_id
    first, *_, last = status["layouts"]
    assert (first["dp"], first["accumulation"], first["from_step"]) == (2, 1, 0), status["layouts"]
    assert len(set(first["nodes"])) == 2 and other in first["nodes"]
    assert (last["dp"], last["accumulation"], last["elastic"]) == (1, 2, True), status["layouts"]
    assert last["at"] > killed_at and last["nodes"] == [trial_node], status["layouts"]
    resumed_at = status["loaded_steps"][-1]
    assert resumed_at >= 10 and last["from_step"] == resumed_at, status["loaded_steps"]

    # the uninterrupted dp=2 run: `scalelab run`'s two processes, one local disk
    ref_id, ref, ref_status = dp2_reference
    objects.download(objects.join(run_url, "metrics.parquet"), tmp_path / "got.parquet")
    got = pl.read_parquet(tmp_path / "got.parquet").select(METRIC_COLS)
    _print_losses("s3:// dp=2 over two nodes, one lost, resumed at dp=1 from the bucket", ref, got, resumed_at,
                  status["layouts"])  # fmt: skip
    before, after = (pl.col("step") <= resumed_at), (pl.col("step") > resumed_at)
    assert got.filter(before).equals(ref.filter(before))  # trained at dp=2, over two nodes
    diff = (got.filter(after)["loss"] - ref.filter(after)["loss"]).abs().max()
    assert got["step"].to_list() == ref["step"].to_list() and diff <= 1e-5, diff
    final, ref_final = status["final_train_loss"], ref_status["final_train_loss"]
    print(f"final train loss: s3 {final:.8f} vs local {ref_final:.8f}")
    assert abs(final - ref_final) <= 1e-5 and ref_status["run_id"] == ref_id == run_id
