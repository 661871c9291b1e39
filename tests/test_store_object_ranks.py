"""A multi-process run on object storage, rank by rank: real gloo ranks on CPU, moto's S3 server.

Each rank trains in a directory of its own (as on a node of its own) under a lease this test holds
as a trial would (scalelab.store.rank_copy, scalelab.train.rank_copy):
- a dp=2 run stopped after step 7 left step_5 in the bucket: both ranks' shards, `.metadata`,
  train_state.json and manifest.json; nothing of a rank's directory is needed to resume;
- the run resumed by ONE process (an elastic resume at dp=1, resharded from the bucket's newest
  complete checkpoint, which a cut upload of a later step does not hide) ends within 1e-5 of the
  uninterrupted dp=2 run trained on one local disk, with `loaded_steps` [None, 5];
- fencing: a rank handed an older generation of the lease writes nothing, and a shard key a newer
  holder wrote is not overwritten by a fenced-out rank;
- a leftover shard re-uploaded with the same bytes is not pruned before its manifest; a complete
  checkpoint is saved again only if it failed verification; a hang the step watchdog ends is
  recorded in the bucket, not only on the node.
"""

import json

import polars as pl
import pytest
import torch.multiprocessing as mp

from scalelab.parallel.backend import spawn
from scalelab.store import objects
from scalelab.store.lease import LeaseLost, held_lease
from scalelab.store.rank_copy import LeaseView, RankMirror
from scalelab.store.records import read_status
from scalelab.train.config import build_run_config
from scalelab.train.elastic import WorkerLayout, shrink_layout
from scalelab.train.launch import launch_local
from scalelab.train.loop import train_run
from scalelab.train.rank_copy import rank_copy
from scalelab.train.watchdog import HangPolicy

pytest.importorskip("moto.server")
from s3_local import serve  # noqa: E402

BUCKET = "scalelab-ranks"
CONFIG = {
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 8},
    "train": {"global_batch_tokens": 256, "num_tokens": 256 * 12, "device": "cpu"},
    "eval": {"interval_steps": 0, "val_batch_sequences": 8},
    "checkpoint": {"interval_steps": 5, "keep_last": 2},
    "logging": {"wandb": "disabled", "progress": "off"},
    "optim": {"lr": 3e-3},
    "parallel": {"dp_shard": 2, "backend": "gloo"},
}
TOL = 1e-5


@pytest.fixture(scope="module")
def s3():
    with serve(BUCKET) as env:
        yield env


def _store_cfg(sweep: str, run_id: str, lease) -> dict:
    return {
        "run_url": objects.join(sweep, "runs", run_id),
        "lease_url": lease.url,
        "holder": lease.holder,
        "generation": lease.generation,
        "ttl_s": lease.ttl_s,
    }


def _rank(cfg, store_cfg: dict, stop_after: int | None) -> None:
    """What each Ray Train worker of the run does (scalelab.train.launch.ray_train_fn), minus Ray."""
    with rank_copy(store_cfg) as (run_dir, publish):
        train_run(cfg, run_dir, resume=True, stop_after_steps=stop_after, publish=publish)


def test_dp2_run_in_the_bucket_resumes_at_dp1_within_tolerance(s3, tmp_path):
    cfg = build_run_config(CONFIG)
    run_id = "r0"
    sweep = f"s3://{BUCKET}/iso"
    run_url = objects.join(sweep, "runs", run_id)
    with held_lease(sweep, run_id, wait_s=5) as lease:
        spawn(_rank, 2, (cfg, _store_cfg(sweep, run_id, lease), 7), backend="gloo")
        listing = objects.list_objects(run_url)
        step5 = sorted(k.split("/")[-1] for k in listing if k.startswith("checkpoints/step_5/"))
        assert step5 == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
            "manifest.json",
            "rng_rank0.pt",
            "rng_rank1.pt",
            "train_state.json",
        ], sorted(listing)
        manifest = json.loads(objects.read_bytes(objects.join(run_url, "checkpoints/step_5/manifest.json")))
        assert set(manifest["files"]) == set(step5) - {"manifest.json"}
        assert read_status(run_url)["loaded_steps"] == [None]
        # an upload of a later checkpoint cut before its manifest: never the one resumed from
        objects.write_bytes(objects.join(run_url, "checkpoints/step_10/__0_0.distcp"), b"cut")
        # the elastic resume: one process, dp=1 with twice the accumulation, from the bucket alone
        store_cfg = _store_cfg(sweep, run_id, lease)
        with rank_copy(store_cfg) as (run_dir, publish):
            small = shrink_layout(cfg.parallel, 1, global_batch_sequences=cfg.global_batch_sequences,
                                  micro_batch_sequences=cfg.train.micro_batch_sequences)  # fmt: skip
            train_run(cfg, run_dir, resume=True, layout=WorkerLayout(parallel=small), publish=publish)
    status = read_status(run_url)
    assert status["status"] == "done" and status["loaded_steps"] == [None, 5], status
    assert [(x["dp"], x["from_step"]) for x in status["layouts"]] == [(2, 0), (1, 5)]
    ref_dir = tmp_path / "ref"
    assert launch_local(cfg, ref_dir) == 0  # the uninterrupted dp=2 run on one local disk
    ref = pl.read_parquet(ref_dir / "metrics.parquet")
    local = tmp_path / "got"
    objects.download(objects.join(run_url, "metrics.parquet"), local)
    got = pl.read_parquet(local)
    assert got["step"].to_list() == ref["step"].to_list()
    diff = (got["loss"] - ref["loss"]).abs().max()
    print(f"\ndp=2 in the bucket, resumed at dp=1 from step 5: max |loss diff| vs uninterrupted dp=2 = {diff:.2e}")
    assert diff <= TOL
    assert abs(status["final_train_loss"] - read_status(ref_dir)["final_train_loss"]) <= TOL
    assert status["run_id"] == read_status(ref_dir)["run_id"]


def test_a_fenced_out_rank_writes_nothing(s3, tmp_path):
    """An older generation is refused at once; a rank that still thinks its lease valid (a write
    delayed past a takeover) finds a newer holder's shard key taken and does not overwrite it."""
    sweep = f"s3://{BUCKET}/fence"
    run_url = objects.join(sweep, "runs", "r1")
    key = objects.join(run_url, "checkpoints/step_5/__1_0.distcp")
    shard = tmp_path / "__1_0.distcp"
    shard.write_bytes(b"the fenced-out rank's shard")
    with held_lease(sweep, "r1", wait_s=5) as lease:
        with pytest.raises(LeaseLost):
            LeaseView(lease.url, lease.holder, lease.generation - 1, lease.ttl_s).confirm()
        view = LeaseView(lease.url, lease.holder, lease.generation, lease.ttl_s)
        view.confirm()  # valid for ~ttl by its clock
        taken = {"holder": "newer", "generation": lease.generation + 1, "ttl_s": lease.ttl_s}
        objects.write_bytes(lease.url, json.dumps(taken).encode())  # the takeover, then the newer's shard
        newer = objects.write_bytes(key, b"the newer holder's shard")
        with pytest.raises(LeaseLost):
            RankMirror(run_url, tmp_path / "copy", lease=view).upload_shards(5, [shard])
    assert objects.head(key) == newer
    assert objects.read_bytes(key) == b"the newer holder's shard"


def test_a_leftover_rewritten_with_the_same_bytes_is_not_pruned(s3, tmp_path):
    """A cut upload of step 10 left a shard; this attempt's rank 1 uploads the same bytes again (a
    deterministic run: same ETag). Rank 0's periodic push between that upload and the manifest
    must not prune it as the leftover it took over at its pull."""
    sweep = f"s3://{BUCKET}/leftover"
    run_url = objects.join(sweep, "runs", "r2")
    key = objects.join(run_url, "checkpoints/step_10/__1_0.distcp")
    objects.write_bytes(key, b"rank 1's shard of step 10")
    with held_lease(sweep, "r2", wait_s=5) as lease:
        rank0 = RankMirror(run_url, tmp_path / "rank0", lease=LeaseView(**_view(lease)))
        rank1 = RankMirror(run_url, tmp_path / "rank1", lease=LeaseView(**_view(lease)))
        listing = objects.list_objects(run_url)
        rank0.pull(listing)
        rank1.pull(listing, records=False)
        assert not rank0.published(10)
        shard = tmp_path / "__1_0.distcp"
        shard.write_bytes(b"rank 1's shard of step 10")
        shards = rank1.upload_shards(10, [shard])
        rank0.push(checkpoints=False)  # step_10 is not complete on rank 0's disk yet
        assert objects.head(key) == shards[f"checkpoints/step_10/{shard.name}"]


def _view(lease) -> dict:
    return {"url": lease.url, "holder": lease.holder, "generation": lease.generation, "ttl_s": lease.ttl_s}


def test_a_complete_checkpoint_is_saved_again_only_if_it_failed_verification(s3, tmp_path):
    sweep = f"s3://{BUCKET}/again"
    run_url = objects.join(sweep, "runs", "r3")
    objects.write_bytes(objects.join(run_url, "checkpoints/step_5/manifest.json"), b"{}")
    with held_lease(sweep, "r3", wait_s=5) as lease:
        rank0 = RankMirror(run_url, tmp_path / "rank0", lease=LeaseView(**_view(lease)))
        rank0.pull()
        assert rank0.published(5) and not rank0.published(10)
        (tmp_path / "rank0" / "checkpoints" / "step_5").rename(tmp_path / "rank0" / "checkpoints" / "step_5.corrupt")
        assert not rank0.published(5)  # moved aside by this attempt's resume: rewritten


def _hanging_rank(cfg, store_cfg: dict) -> None:
    with rank_copy(store_cfg) as (run_dir, publish):
        train_run(cfg, run_dir, resume=True, hang=HangPolicy(factor=10.0, min_s=1.0), publish=publish)


def test_a_hang_ended_by_the_watchdog_is_recorded_in_the_bucket(s3, tmp_path, monkeypatch):
    """Rank 0's watchdog ends its process after recording the hang in its node-local status.json;
    the record reaches the bucket before the process ends."""
    cfg = build_run_config(dict(CONFIG, parallel={"backend": "gloo"}))
    sweep = f"s3://{BUCKET}/hang"
    monkeypatch.setenv("SCALELAB_TEST_HANG", f"4:0:{tmp_path / 'hung'}")
    with held_lease(sweep, "r4", wait_s=5) as lease:
        with pytest.raises(mp.ProcessExitedException):
            spawn(_hanging_rank, 1, (cfg, _store_cfg(sweep, "r4", lease)), backend="gloo")
    status = read_status(objects.join(sweep, "runs", "r4"))
    assert status["status"] == "failed" and [h["step"] for h in status["hangs"]] == [4], status
